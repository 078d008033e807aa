"""Prompt-distribution methods as hooks: PBA's anchoring and positive–negative pairing.

Each method is a ``jaxrl_vr.hooks.Hook`` built from its settings by a registry entry, and
is on when its config section is present (``rl.anchor``, ``rl.pairing``; absent = off). The
driver calls every hook the same way and never names one. Adding a method is a hook
class, its settings dataclass, one ``METHODS`` line and the optional ``RLConfig`` section of
the same name.

* ``anchor`` (PBA, arXiv 2607.20543; SPEC §4): before RL, base samples of every training
  prompt give p_base; each batch's prompts in the band get the KL weight λ.
* ``pairing`` (Weighted GRPO, arXiv 2602.03452; SPEC §3.3): before RL, a rate calibration
  of the pool; each step draws (q⁺, q⁻) pairs from the tracked rates and marks their rows
  (or, as switches, a fixed tiny set chosen once, or the paper's variance-selection baseline).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np

from jaxrl_vr.hooks import Calibration, Hook
from jaxrl_vr.registry import Entry, Registry
from jaxrl_vr.selection.anchor import POLARITIES, anchor_mask
from jaxrl_vr.selection.pairing import PAIRED_SELECTIONS, PAIRING_SELECTIONS, PairedPromptSource, PairedSource, tracker_rates
from jaxrl_vr.selection.tracker import PromptTracker
from jaxrl_vr.trajectory import Trajectory

__all__ = ["METHODS", "AnchorSettings", "MethodContext", "PairingSettings", "make_methods"]


class MethodContext(NamedTuple):
    """What the run tells every method."""

    num_items: int  # training prompts
    prompts_per_step: int  # P
    samples_per_prompt: int  # G
    seed: int  # the RL seed
    tracker: PromptTracker  # per-prompt rates of the run (one for all hooks)


@dataclasses.dataclass(frozen=True)
class AnchorSettings:
    """PBA: L = L_policy + λ·1[anchor(x)]·KL(π‖π₀) (arXiv 2607.20543).

    Attributes:
      polarity: "above" anchors prompts with tau_low <= p_base <= tau_high, "below" the rest.
      weight: λ_PBA, the anchored KL's own coefficient (separate from loss.kl_beta).
      tau_low, tau_high: the band on the base pass rate (the paper's values are not known).
      calibration_samples: base samples per training prompt that measure p_base.
    """

    polarity: str = "above"
    weight: float = 0.1
    tau_low: float = 0.03
    tau_high: float = 0.6
    calibration_samples: int = 64

    def __post_init__(self):
        if self.polarity not in POLARITIES:
            raise ValueError(f"polarity={self.polarity!r} is not one of {POLARITIES}.")
        if self.weight <= 0:
            raise ValueError(f"weight (λ_PBA) must be > 0, got {self.weight}; switch the section off "
                             "with rl.anchor=None instead.")
        if not 0.0 <= self.tau_low <= self.tau_high <= 1.0:
            raise ValueError(f"tau_low, tau_high need 0 <= tau_low <= tau_high <= 1, got {self.tau_low}, "
                             f"{self.tau_high}.")
        if self.calibration_samples < 1:
            raise ValueError("calibration_samples must be >= 1 base samples per prompt.")


class Anchor(Hook):
    """PBA's per-prompt KL weight from the frozen base pass rates."""

    sets_kl_weights = True

    def __init__(self, settings: AnchorSettings, context: MethodContext):
        self.settings, self.tracker = settings, context.tracker
        self.calibration = Calibration("base_train_calibration.json", settings.calibration_samples, 3)

    def calibrated(self, samples_p: np.ndarray, successes_p: np.ndarray) -> None:
        self.tracker.set_base_counts(samples_p, successes_p)
        self.tracker.freeze_base()

    def annotate(self, batch: Trajectory) -> Trajectory:
        s, idx = self.settings, batch.prompt_idx_p
        anchored_p = np.asarray(anchor_mask(
            self.tracker.p_base(idx), tau_low=s.tau_low, tau_high=s.tau_high, polarity=s.polarity,
            calibrated_p=self.tracker.has_base(idx)))
        return batch._replace(kl_weight_p=batch.kl_weight_p + s.weight * anchored_p.astype(np.float32))

    def metrics(self, batch: Trajectory) -> dict[str, float]:
        return {"anchored_frac": float(np.mean(batch.kl_weight_p > 0))}


PAIRING_STRATEGIES = ("random", "extreme")


@dataclasses.dataclass(frozen=True)
class PairingSettings:
    """Positive–negative pairs from tracked success rates (SPEC §3.3).

    Attributes:
      neg_c: c of the q⁻ band [1 − c/G, 1 − 1/G].
      pos_min, pos_max: the q⁺ band (pos_min, pos_max].
      min_count: tracked samples a prompt needs to enter a pool.
      strategy: "random" or "extreme" (hardest q⁺ with the most-solved q⁻).
      calibration_samples: samples per training prompt of the initial rate pass.
      calibration_cap: the calibration counts weigh at most this many samples against
        training rollouts (newer evidence preferred).
      explore_frac: share of each batch drawn from the data order, so prompts without a
        rate keep entering and the data position advances.
      select: "pairs" (q⁺, q⁻ pairs) or "variance": the prompts of highest tracked reward
        variance p(1 − p), unpaired (the selection the paper compares against; train it with
        a plain estimator such as grpo), or "random_pairs": data-order prompts marked as
        pairs without the q⁺/q⁻ bands (Weighted GRPO's weights without the pairing).
      fixed_prompts: n > 0 = the paper's tiny fixed set: n prompts (n/2 pairs, or the n of
        highest variance) chosen once from the calibrated rates and repeated every step
        (rl.prompts_per_step a multiple of n); 0 = choose every step.
    """

    neg_c: int = 2
    pos_max: float = 0.25
    pos_min: float = 0.0
    min_count: int = 4
    strategy: str = "random"
    calibration_samples: int = 8
    calibration_cap: float = 8.0
    explore_frac: float = 0.25
    select: str = "pairs"
    fixed_prompts: int = 0

    def __post_init__(self):
        if self.strategy not in PAIRING_STRATEGIES:
            raise ValueError(f"strategy={self.strategy!r} is not one of {PAIRING_STRATEGIES}.")
        if self.select not in PAIRING_SELECTIONS:
            raise ValueError(f"select={self.select!r} is not one of {PAIRING_SELECTIONS}.")
        if self.fixed_prompts < 0 or (self.select in PAIRED_SELECTIONS and self.fixed_prompts % 2):
            raise ValueError(f"fixed_prompts={self.fixed_prompts} must be 0 (off) or a positive number of "
                             "prompts (even unless select='variance': whole pairs).")
        if not 0.0 <= self.pos_min < self.pos_max <= 1.0:
            raise ValueError(f"pos_min, pos_max need 0 <= pos_min < pos_max <= 1, got {self.pos_min}, "
                             f"{self.pos_max}.")
        if not 0.0 <= self.explore_frac <= 1.0:
            raise ValueError(f"explore_frac must lie in [0, 1], got {self.explore_frac}.")
        if self.calibration_samples < 1:
            raise ValueError("calibration_samples must be >= 1 (the initial rate pass).")

    def check(self, rl) -> None:
        if rl.prompts_per_step % 2:
            raise ValueError(f"rl.pairing needs an even rl.prompts_per_step (P/2 pairs), got "
                             f"{rl.prompts_per_step}.")
        if not (rl.samples_per_prompt >= 2 and 1 <= self.neg_c <= rl.samples_per_prompt):
            raise ValueError(f"rl.pairing needs rl.samples_per_prompt >= 2 and 1 <= rl.pairing.neg_c <= "
                             f"rl.samples_per_prompt; got {rl.samples_per_prompt}, {self.neg_c}.")
        if self.select == "random_pairs" and rl.estimator.name != "pair_weighted":
            raise ValueError(f"rl.pairing.select='random_pairs' marks pairs that only Weighted GRPO reads; with "
                             f"rl.estimator={rl.estimator.name!r} the batch is the plain data order. Use "
                             "rl.estimator=pair_weighted (with rl.estimator.neg_weight != 1).")
        if rl.batch_strategy.name != "plain":
            raise ValueError(f"rl.pairing chooses both prompts of a pair; it cannot be combined with "
                             f"rl.batch_strategy={rl.batch_strategy.name!r}, which drops or shrinks "
                             "groups. Use rl.batch_strategy=plain.")
        num_p = rl.prompts_per_step
        if self.fixed_prompts:
            if num_p % self.fixed_prompts:
                raise ValueError(f"rl.pairing.fixed_prompts={self.fixed_prompts} repeats its set to fill "
                                 f"each batch, so rl.prompts_per_step={num_p} must be a multiple of it.")
            return
        need = 2 if self.select in PAIRED_SELECTIONS else 1  # rows a pair (or a variance pick) needs
        explore = int(np.ceil(self.explore_frac * num_p - 1e-9))
        if num_p - explore < need:
            fits = [p for p in range(num_p, 8 * num_p + 8, 2)  # P stays even (pairing's check)
                    if p - int(np.ceil(self.explore_frac * p - 1e-9)) >= need]
            raise_p = f"raise rl.prompts_per_step to >= {fits[0]} or " if fits else ""
            raise ValueError(
                f"rl.pairing selects no prompt: rl.prompts_per_step={num_p} with rl.pairing.explore_frac="
                f"{self.explore_frac} leaves {num_p - explore} row(s) beside the {explore} data-order "
                f"row(s), and {'a pair needs 2' if need == 2 else 'the selection needs 1'}, so the run "
                f"would be plain training on the data order; {raise_p}lower rl.pairing.explore_frac to "
                f"<= {(num_p - need) / num_p:.3g}.")


class Pairing(Hook):
    """Draws each step's (q⁺, q⁻) pairs from the tracked rates and marks their rows."""

    def __init__(self, settings: PairingSettings, context: MethodContext):
        self.settings, self.context, self.source = settings, context, None
        self.calibration = Calibration("pairing_calibration.json", settings.calibration_samples, 5)

    def calibrated(self, samples_p: np.ndarray, successes_p: np.ndarray) -> None:
        self.context.tracker.set_calibration_counts(samples_p, successes_p)

    def wrap_source(self, source: Any) -> PairedSource:
        """The pairs' own source (its data-order rows use the same seeded order)."""
        s, c = self.settings, self.context
        self.source = PairedSource(PairedPromptSource(
            c.num_items, tracker_rates(c.tracker, calibration_cap=s.calibration_cap,
                                       min_count=s.min_count),
            prompts_per_step=c.prompts_per_step, group_size=c.samples_per_prompt, seed=c.seed,
            neg_c=s.neg_c, pos_max=s.pos_max, pos_min=s.pos_min, explore_frac=s.explore_frac,
            strategy=s.strategy, select=s.select, fixed_prompts=s.fixed_prompts))
        return self.source

    def annotate(self, batch: Trajectory) -> Trajectory:
        return batch._replace(paired_p=self.source.is_pair_p.copy())

    def metrics(self, batch: Trajectory) -> dict[str, float]:
        return {"pairing/pairs": float(batch.paired_p.sum() // 2)}


METHODS = Registry("method", {
    "anchor": Entry(Anchor, AnchorSettings),
    "pairing": Entry(Pairing, PairingSettings),
})


def make_methods(rl, context: MethodContext) -> list[Hook]:
    """A hook for every method whose section of ``rl`` is present (``rl.<name>`` not None)."""
    return [entry.fn(getattr(rl, name), context) for name, entry in METHODS.items()
            if getattr(rl, name, None) is not None]
