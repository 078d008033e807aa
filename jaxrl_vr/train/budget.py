"""The generation budget: its settings, the run's accounting, and the fractions kept.

``BudgetConfig`` (``rl.budget``) says when a run stops (tokens generated) and at which
fractions of the budget its state is kept for good; ``Budget`` is the cumulative
accounting of a run (checkpointed); ``due_fractions`` says which fractions a step has
just crossed. Comparisons at an equal budget (``experiments.compare``) read these.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from jaxrl_vr.trajectory import RolloutStats

__all__ = ["Budget", "BudgetConfig", "due_fractions"]


@dataclasses.dataclass(frozen=True)
class BudgetConfig:
    """When the run stops, and which fractions of the budget are kept.

    Attributes:
      tokens: stop once this many tokens were generated (every sampled token: probes,
        filtered groups, padding); 0 = no budget, ``rl.steps`` decides.
      include_calibration: charge the tokens of the training-prompt calibration passes
        (PBA's base calibration, pairing's rate calibration) against ``tokens`` too, so
        methods that need them get fewer RL tokens. Either way they are recorded as
        ``calibration_tokens``.
      fractions: fractions of ``tokens`` in (0, 1) at which the loop state is also kept
        for good in ``budget_checkpoints/`` (evaluate them with ``experiments.evaluate
        --checkpoint=STEP``); empty = none.
    """

    tokens: int = 0
    include_calibration: bool = False
    fractions: tuple[float, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "fractions", tuple(sorted(float(f) for f in self.fractions)))
        if self.tokens < 0:
            raise ValueError(f"tokens must be >= 0 (0 = none), got {self.tokens}.")
        if self.fractions and self.tokens <= 0:
            raise ValueError(f"fractions={list(self.fractions)} are fractions of the token budget: "
                             "set tokens > 0.")
        if not all(0.0 < f < 1.0 for f in self.fractions):
            raise ValueError(f"fractions={list(self.fractions)} must lie strictly between 0 and 1 "
                             "(the end of the budget is the final checkpoint).")


@dataclasses.dataclass
class Budget:
    """Cumulative accounting of a run: tokens and seconds per phase (checkpointed)."""

    generated_tokens: float = 0.0  # RL rollouts: every sampled token (probes, dropped groups, padding)
    calibration_tokens: float = 0.0  # training-prompt calibration passes before RL (PBA, pairing)
    generated_samples: float = 0.0
    env_tokens: float = 0.0  # tokens environments wrote into episodes (tool outputs, templates): not charged
    trained_tokens: float = 0.0
    sample_s: float = 0.0
    verify_s: float = 0.0
    logprob_s: float = 0.0
    update_s: float = 0.0
    total_s: float = 0.0
    verifier_errors: float = 0.0
    verifier_timeouts: float = 0.0

    def charged(self, include_calibration: bool) -> float:
        """Tokens counted against the budget: RL rollouts, plus calibration if so configured."""
        return self.generated_tokens + (self.calibration_tokens if include_calibration else 0.0)

    def spent(self, config: BudgetConfig) -> bool:
        """The budget is set and used up."""
        return bool(config.tokens) and self.charged(config.include_calibration) >= config.tokens

    def add(self, stats: RolloutStats, *, trained_tokens: float, logprob_s: float, update_s: float,
            total_s: float) -> None:
        """Accounts one RL step: what its rounds cost (``stats``) and its update."""
        self.generated_tokens += stats.generated_tokens
        self.generated_samples += stats.generated_samples
        self.env_tokens += stats.env_tokens
        self.trained_tokens += trained_tokens
        self.sample_s += stats.sample_s
        self.verify_s += stats.verify_s
        self.logprob_s += logprob_s
        self.update_s += update_s
        self.total_s += total_s
        self.verifier_errors += stats.verifier_errors
        self.verifier_timeouts += stats.verifier_timeouts

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "Budget":
        """A checkpointed or summarised Budget (unknown keys ignored, absent ones 0)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: float(v) for k, v in values.items() if k in names})


def due_fractions(config: BudgetConfig, budget: Budget, taken: Sequence[float]) -> list[float]:
    """The fractions not in ``taken`` whose share of the budget has been charged."""
    spent = budget.charged(config.include_calibration)
    return [f for f in config.fractions if f not in set(taken) and spent >= f * config.tokens]
