"""The hook interface: how a method plugs into the RL driver without the driver knowing it.

Methods (PBA's anchoring, positive–negative pairing), batch strategies with state (DAPO's
re-check schedule), the per-prompt tracker and the verifier monitor are ``Hook``s. The
driver calls every hook at the same points of every step, in order:

    wrap_source(source)      once: a method may choose prompts (pairing)
    begin_step(step)         the step starts
    observe(sampled)         every sample the step generated (filtered rounds and probes too)
    annotate(batch)          the training batch, before advantages (per-prompt KL weights,
                             prompt pairs)
    metrics(batch)           scalars to log
    state_dict()             its state in the checkpoint, under ``state_key``
    after_step(step)         the step is saved: a hook may stop the run here (raise), and
                             nothing written is lost

and, before RL, ``calibration`` / ``calibrated`` when the hook needs base samples of every
training prompt. Every method has a do-nothing default, so a hook overrides only what it uses.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from jaxrl_vr.trajectory import Trajectory

__all__ = ["Calibration", "Hook"]


class Calibration(NamedTuple):
    """A request for ``samples`` base samples of every training prompt before RL.

    ``file`` names the workdir cache of the counts; ``seed_offset`` keeps its samples
    independent of every other evaluation of the run.
    """

    file: str
    samples: int
    seed_offset: int


class Hook:
    """Base class of a part the driver calls at fixed points (module docstring)."""

    state_key: str = ""  # key of state_dict() in the checkpoint; "" = no state
    calibration: Calibration | None = None
    sets_kl_weights: bool = False  # annotate() sets kl_weight_p: the loss needs its KL term

    def calibrated(self, samples_p: np.ndarray, successes_p: np.ndarray) -> None:
        """The counts of ``calibration`` (one entry per training prompt)."""

    def wrap_source(self, source: Any) -> Any:
        return source

    def begin_step(self, step: int) -> None:
        pass

    def observe(self, sampled: Trajectory) -> None:
        pass

    def annotate(self, batch: Trajectory) -> Trajectory:
        return batch

    def metrics(self, batch: Trajectory) -> dict[str, float]:
        return {}

    def after_step(self, step: int) -> None:
        pass

    def state_dict(self) -> Any:
        return None

    def load_state_dict(self, state: Any) -> None:
        pass
