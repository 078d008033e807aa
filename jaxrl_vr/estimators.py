"""Advantage estimators as optax-style ``(init, update)`` pairs, from one registry.

Every estimator has the same functions, so neither the trainer nor the simulator
branches on its name::

    estimator = make_estimator("curverl", num_prompts=P, window=10)
    state = estimator.init()
    adv_pg, state = estimator.update(rewards_pg, valid_pg, success_pg, state)

``rewards_pg`` are the shaped rewards (verifier score minus penalties), ``success_pg`` the
verifier's own success in [0, 1] (what pass rates are made of), ``valid_pg`` marks the
real samples of ragged groups, and the keyword ``paired_p`` (bool [P], optional) marks
rows that form (q⁺, q⁻) prompt pairs in rows (2i, 2i + 1) (only Weighted GRPO reads it).
``diagnostics(state)`` gives scalars to log (CurveRL's window fill, the k of the pass@k
objectives). The formulas live in
``jaxrl_vr.advantages``; this module only adapts them to the one signature.

Adding an estimator is one function, its settings dataclass and one registry line::

    @dataclasses.dataclass(frozen=True)
    class ScaledLooSettings:
        scale: float = 1.0

    def scaled_loo(settings: ScaledLooSettings, context: EstimatorContext) -> Estimator:
        return stateless(lambda rewards_pg, valid_pg, success_pg:
                         settings.scale * advantages.loo(rewards_pg, valid_pg))

    ESTIMATORS["scaled_loo"] = Entry(scaled_loo, ScaledLooSettings)

after which ``--config.rl.estimator.name=scaled_loo --config.rl.estimator.scale=2`` selects it.
A settings dataclass may define ``check(rl_config)`` for checks against the rest of the RL
config (it raises ValueError naming the keys and the fix).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_vr import advantages, passk
from jaxrl_vr.registry import Entry, NoSettings, Registry
from jaxrl_vr.selection.pairing import PAIRED_SELECTIONS

__all__ = ["ESTIMATORS", "Entry", "Estimator", "EstimatorContext", "make_estimator",
           "needs_groups", "stateless"]


class EstimatorContext(NamedTuple):
    """What the run tells every estimator: prompts per batch and the success threshold."""

    num_prompts: int = 0  # P of a training batch (CurveRL's window width)
    success_threshold: float = 0.5


def _no_diagnostics(state) -> dict:
    del state
    return {}


class Estimator(NamedTuple):
    """``init() -> state``;
    ``update(rewards_pg, valid_pg, success_pg, state, *, paired_p=None) -> (adv_pg, state)``;
    ``diagnostics(state) -> {name: float}``."""

    init: Callable[[], Any]
    update: Callable[..., tuple[jnp.ndarray, Any]]
    diagnostics: Callable[[Any], dict] = _no_diagnostics


def stateless(fn: Callable[[jnp.ndarray, jnp.ndarray, jnp.ndarray], jnp.ndarray]) -> Estimator:
    """An Estimator with empty state around ``fn(rewards_pg, valid_pg, success_pg) -> adv_pg``."""

    def update(rewards_pg, valid_pg, success_pg, state, *, paired_p=None):
        del paired_p
        return fn(rewards_pg, valid_pg, success_pg), state

    return Estimator(init=lambda: (), update=update)


def _grpo(settings: NoSettings, context: EstimatorContext) -> Estimator:
    """GRPO (DeepSeekMath, arXiv 2402.03300): (R − R̄)/(std + eps)."""
    return stateless(lambda r, v, s: advantages.grpo(r, v, scale="std"))


def _dr_grpo(settings: NoSettings, context: EstimatorContext) -> Estimator:
    """Dr.GRPO (arXiv 2503.20783): GRPO without the std division, R − R̄."""
    return stateless(lambda r, v, s: advantages.grpo(r, v, scale="none"))


def _loo(settings: NoSettings, context: EstimatorContext) -> Estimator:
    """RLOO (arXiv 2402.14740): leave-one-out baseline."""
    return stateless(lambda r, v, s: advantages.loo(r, v))


@dataclasses.dataclass(frozen=True)
class ReinforceSettings:
    """baseline: "mean" (R − R̄; a lone sample keeps R) or "none" (R)."""

    baseline: str = "mean"

    def __post_init__(self):
        if self.baseline not in advantages.REINFORCE_BASELINES:
            raise ValueError(f"baseline={self.baseline!r} is not one of {advantages.REINFORCE_BASELINES}.")


def _reinforce(settings: ReinforceSettings, context: EstimatorContext) -> Estimator:
    """REINFORCE (w(p) = 1): R − R̄ with the group-mean baseline where a group has two or more
    samples, R where it has one (so G = 1 trains); ``baseline="none"``: R."""
    return stateless(lambda r, v, s: advantages.reinforce(r, v, baseline=settings.baseline))


@dataclasses.dataclass(frozen=True)
class MaxRLSettings:
    """eps: added to the mean success in MaxRL's denominator.
    num_samples: T of MaxRL's truncated weight (1 − (1−p)^T)/p; None = 1/p."""

    eps: float = 1e-6
    num_samples: int | None = None

    def __post_init__(self):
        if self.num_samples is not None and self.num_samples < 1:
            raise ValueError(f"num_samples (T) must be >= 1 or None (untruncated), got {self.num_samples}.")


def _maxrl(settings: MaxRLSettings, context: EstimatorContext) -> Estimator:
    """MaxRL (arXiv 2602.02710): the verifier-success part gets (s − s̄)/(s̄ + eps), or with
    ``num_samples`` T the truncated weight (1 − (1−s̄)^T)/s̄ times (s − s̄); the shaping part
    (rewards − success) a plain baseline (``advantages.maxrl``)."""
    return stateless(lambda r, v, s: advantages.maxrl(r, v, success_pg=s, eps=settings.eps,
                                                      num_samples=settings.num_samples))


@dataclasses.dataclass(frozen=True)
class CurveRLSettings:
    """window: t₀ of CurveRL's lagged reference window, in batches (SPEC §3.2)."""

    window: int = 10

    def __post_init__(self):
        if self.window < 1:
            raise ValueError(f"window must be >= 1 batch, got {self.window}.")


def _curverl(settings: CurveRLSettings, context: EstimatorContext) -> Estimator:
    """CurveRL (arXiv 2605.24331): lagged-window reverse-hazard prompt weights (SPEC §3.2)."""
    if context.num_prompts < 1:
        raise ValueError("curverl needs EstimatorContext.num_prompts (P of a batch) for its window.")

    def update(rewards_pg, valid_pg, success_pg, state, *, paired_p=None):
        del paired_p
        return advantages.curverl(rewards_pg, state, valid_pg, success_pg=success_pg)

    def diagnostics(state) -> dict:
        return {"window_fill": float(np.asarray(state.window_valid_wn).mean())}

    return Estimator(init=lambda: advantages.curverl_init(context.num_prompts, window=settings.window),
                     update=update, diagnostics=diagnostics)


PAIR_SCOPES = ("group", "pair", "mean")


@dataclasses.dataclass(frozen=True)
class PairWeightedSettings:
    """Weighted GRPO (arXiv 2602.03452) for (q⁺, q⁻) pairs.

    Attributes:
      neg_weight: λ_neg, the weight of q⁻ rows.
      pos_weight: the weight of q⁺ rows.
      scope: normalisation: "group" (the paper), "pair" or "mean" (``advantages.pair_weighted``).
    """

    neg_weight: float = 1.0
    pos_weight: float = 1.0
    scope: str = "group"

    def __post_init__(self):
        if self.scope not in PAIR_SCOPES:
            raise ValueError(f"scope={self.scope!r} is not one of {PAIR_SCOPES}.")
        if self.neg_weight < 0 or self.pos_weight < 0:
            raise ValueError(f"neg_weight and pos_weight must be >= 0, got {self.neg_weight}, "
                             f"{self.pos_weight}.")

    def check(self, rl) -> None:
        if getattr(rl, "pairing", None) is None:
            raise ValueError("rl.estimator.name='pair_weighted' normalises (q+, q-) prompt pairs: "
                             "switch pairing on (set a key of rl.pairing, e.g. rl.pairing.neg_c=2).")
        if getattr(rl.pairing, "select", "pairs") not in PAIRED_SELECTIONS:
            raise ValueError(f"rl.estimator.name='pair_weighted' weights (q+, q-) pairs, but "
                             f"rl.pairing.select={rl.pairing.select!r} forms none (every row would get plain "
                             "GRPO); use rl.estimator=grpo for the variance baseline, or rl.pairing.select=pairs "
                             "(or random_pairs).")
        if (getattr(rl.pairing, "select", "pairs") == "random_pairs" and self.scope == "group"
                and self.neg_weight == self.pos_weight == 1.0):
            raise ValueError("rl.pairing.select='random_pairs' with unit pair weights and scope='group' is GRPO on "
                             "the data order (every row gets its group's z-score); set rl.estimator.neg_weight "
                             "(or pos_weight) != 1 for the ablation of Weighted GRPO without the pairing.")


def _pair_weighted(settings: PairWeightedSettings, context: EstimatorContext) -> Estimator:
    """Weighted GRPO (arXiv 2602.03452): rows marked ``paired_p`` form (q⁺, q⁻) pairs in rows
    (2i, 2i + 1) (the pairing method lays them out so) and get ``advantages.pair_weighted``
    with row weights [pos_weight, neg_weight]; the other rows get the same group z-score of
    the verifier success without a pair weight (``advantages.grpo``). Both read the
    verifier success, binarised at the success threshold.
    """
    row_weights = jnp.asarray([settings.pos_weight, settings.neg_weight], jnp.float32)

    def update(rewards_pg, valid_pg, success_pg, state, *, paired_p=None):
        num_p, num_g = rewards_pg.shape
        success_pg = (success_pg >= context.success_threshold).astype(jnp.float32)
        plain_pg = advantages.grpo(success_pg, valid_pg)
        if paired_p is None:
            return plain_pg, state
        even = num_p + num_p % 2  # an odd last row has no partner: padded, then dropped
        pad = ((0, even - num_p), (0, 0))
        pairs_pg = advantages.pair_weighted(
            jnp.pad(success_pg, pad).reshape(even // 2, 2, num_g), neg_weight=row_weights,
            scope=settings.scope, valid_2g=jnp.pad(valid_pg, pad).reshape(even // 2, 2, num_g),
            success_threshold=0.5).reshape(even, num_g)[:num_p]
        return jnp.where(jnp.asarray(paired_p, bool)[:, None], pairs_pg, plain_pg), state

    return Estimator(init=lambda: (), update=update)


@dataclasses.dataclass(frozen=True)
class PassKSettings:
    """The k of a pass@k objective and its annealing schedule (``passk.annealed_k``).

    Attributes:
      k: the k of pass@k, at the start of the schedule (1 <= k <= rl.samples_per_prompt).
      k_end: the k the schedule ends at; None = k throughout.
      anneal_steps: batches over which k moves linearly (rounded) from k to k_end.
    """

    k: int = 4
    k_end: int | None = None
    anneal_steps: int = 0

    def __post_init__(self):
        if self.k < 1 or (self.k_end is not None and self.k_end < 1):
            raise ValueError(f"k and k_end must be >= 1, got {self.k}, {self.k_end}.")
        if self.anneal_steps < 0:
            raise ValueError(f"anneal_steps must be >= 0, got {self.anneal_steps}.")
        if self.k_end is not None and self.k_end != self.k and self.anneal_steps < 1:
            raise ValueError(f"k_end={self.k_end} needs anneal_steps >= 1: the batches over which k "
                             f"moves from {self.k} to {self.k_end}.")

    @property
    def max_k(self) -> int:
        return max(self.k, self.k if self.k_end is None else self.k_end)

    def _keys(self) -> str:
        return "rl.estimator.k" + ("" if self.k_end is None else " / rl.estimator.k_end")

    def check(self, rl) -> None:
        if self.max_k > rl.samples_per_prompt:
            raise ValueError(
                f"{self._keys()} = {self.max_k} exceeds rl.samples_per_prompt={rl.samples_per_prompt}: "
                f"pass@k is estimated from subsets of a prompt's samples; lower it to <= "
                f"{rl.samples_per_prompt} or raise rl.samples_per_prompt to >= {self.max_k}.")


@dataclasses.dataclass(frozen=True)
class PKPOSettings(PassKSettings):
    """PKPO's k schedule, and baseline: "loo_minus_one" (the paper's s^(loo−1)) or "none"."""

    baseline: str = "loo_minus_one"

    def __post_init__(self):
        super().__post_init__()
        if self.baseline not in passk.PKPO_BASELINES:
            raise ValueError(f"baseline={self.baseline!r} is not one of {passk.PKPO_BASELINES}.")


@dataclasses.dataclass(frozen=True)
class PassKTrainingSettings(PassKSettings):
    """Pass@k Training's k schedule; k must stay below G (at k = G every advantage is 0)."""

    def check(self, rl) -> None:
        super().check(rl)
        if self.max_k >= rl.samples_per_prompt:
            raise ValueError(
                f"rl.estimator.name='passk_training' with {self._keys()} = {self.max_k} = "
                f"rl.samples_per_prompt: every prompt with a correct sample has pass@k estimate 1 "
                f"and every advantage is 0; lower it to <= {rl.samples_per_prompt - 1} or raise "
                "rl.samples_per_prompt.")


class PassKState(NamedTuple):
    """The clock of a pass@k estimator's k schedule."""

    step: jnp.ndarray  # int32 []: batches seen


def _passk_estimator(settings: PassKSettings, advantage_fn) -> Estimator:
    """An Estimator around ``advantage_fn(rewards, valid, success, k) -> adv`` whose state
    counts the batches, so k follows ``passk.annealed_k`` (jittable, checkpointed). The
    advantage is jitted once (k is traced), so an eager caller such as the trainer's batch
    builder does not re-trace its loops every step."""
    schedule = functools.partial(passk.annealed_k, k=settings.k, k_end=settings.k_end,
                                 anneal_steps=settings.anneal_steps)
    advantage = jax.jit(advantage_fn)

    def update(rewards_pg, valid_pg, success_pg, state, *, paired_p=None):
        del paired_p
        adv_pg = advantage(rewards_pg, valid_pg, success_pg, schedule(state.step))
        return adv_pg, PassKState(step=(state.step + 1).astype(jnp.int32))

    def diagnostics(state) -> dict:  # the k of the last update
        return {"k": float(schedule(jnp.maximum(jnp.asarray(state.step) - 1, 0)))}

    return Estimator(init=lambda: PassKState(step=jnp.zeros((), jnp.int32)), update=update,
                     diagnostics=diagnostics)


def _pkpo(settings: PKPOSettings, context: EstimatorContext) -> Estimator:
    """PKPO (Walder & Karkhanis, arXiv 2505.15201): unbiased pass@k gradient weights of the
    verifier success (continuous scores through the sorted maxg@k form), the shaping part
    with a plain baseline (``passk.pkpo``)."""
    return _passk_estimator(settings, lambda r, v, s, k: passk.pkpo(
        r, v, k=k, success_pg=s, baseline=settings.baseline, max_k=settings.max_k))


def _passk_training(settings: PassKTrainingSettings, context: EstimatorContext) -> Estimator:
    """Pass@k Training (Chen et al., arXiv 2508.10751): the analytical pass@k group advantage
    of the success bits (success >= the run's threshold), shaping with a plain baseline."""
    return _passk_estimator(settings, lambda r, v, s, k: passk.passk_training(
        r, v, k=k, success_pg=s, success_threshold=context.success_threshold, max_k=settings.max_k))


ESTIMATORS = Registry("advantage estimator", {
    "grpo": _grpo,
    "dr_grpo": _dr_grpo,
    "loo": _loo,
    "reinforce": Entry(_reinforce, ReinforceSettings),
    "maxrl": Entry(_maxrl, MaxRLSettings),
    "curverl": Entry(_curverl, CurveRLSettings),
    "pair_weighted": Entry(_pair_weighted, PairWeightedSettings),
    "pkpo": Entry(_pkpo, PKPOSettings),
    "passk_training": Entry(_passk_training, PassKTrainingSettings),
})


def make_estimator(name: str, settings: Any = None, *, context: EstimatorContext | None = None,
                   num_prompts: int = 0, success_threshold: float = 0.5,
                   **setting_values) -> Estimator:
    """The registered estimator ``name``.

    Args:
      name: a key of ``ESTIMATORS``.
      settings: its settings dataclass; default: built from ``setting_values``.
      context: the EstimatorContext; default: from num_prompts and success_threshold.
      **setting_values: the entry's settings by name (e.g. ``window=10`` for curverl).
    """
    entry = ESTIMATORS[name]
    if settings is None:
        settings = entry.settings(**setting_values)
    elif setting_values:
        raise TypeError("pass either settings or setting values, not both.")
    if context is None:
        context = EstimatorContext(num_prompts, success_threshold)
    return entry.fn(settings, context)


@functools.lru_cache(maxsize=64)
def needs_groups(name: str, settings: Any = None) -> bool:
    """Whether the estimator's advantage is identically 0 with one sample per prompt (it
    subtracts a group baseline): measured on two one-sample groups with different rewards."""
    estimator = make_estimator(name, settings, context=EstimatorContext(2, 0.5))
    rewards_pg = jnp.asarray([[1.0], [0.0]], jnp.float32)
    valid_pg = jnp.ones((2, 1), bool)
    adv_pg, _ = estimator.update(rewards_pg, valid_pg, rewards_pg, estimator.init())
    return bool(np.all(np.asarray(adv_pg) == 0.0))
