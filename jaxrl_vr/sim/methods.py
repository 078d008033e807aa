"""Methods of the simulator: estimators, prompt-selection rules and PBA, by name.

A method name is one or more tokens joined by "+": at most one estimator, one selection
rule and one PBA regulariser, e.g. ``grpo``, ``maxrl``, ``curverl+pba_trainer``,
``dapo``, ``two_stage+loo``, ``pairing``. Missing parts default to the GRPO estimator
and uniform selection (``pairing`` defaults to Weighted GRPO, ``pair_weighted``). The
estimators are the trainer's own (``jaxrl_vr.estimators``: one registry, one set of
names) and every selection rule calls into ``jaxrl_vr.selection`` where a jittable
version exists; nothing here restates their formulas. Adding a selection rule is one
function and one registry line.

PBA comes in two kinds (``PBA_KINDS``):

* ``pba_trainer``: as the trainer does it (``jaxrl_vr.train.methods.Anchor``). Before RL,
  ``sim.pba_calibration_samples`` = n base rollouts per prompt give c ~ Binomial(n,
  p_base) and p̂ = c/n (``PromptTracker.p_base``); a prompt is anchored when
  τ_low <= p̂ <= τ_high with the trainer's band [0.03, 0.6] and λ = 0.1
  (``sim.pba_trainer_*``). With ``sim.pba_charge_calibration`` the P·n calibration
  rollouts count against ``sim.sample_budget``.
* ``pba`` (alias ``pba_oracle``): an **oracle** no trainer can run. It anchors on the
  exact p_base with its own band (default [0, 0.1]: the out-of-reach and boundary
  prompts, the ones "lost" counts) and λ = ``sim.pba_coef`` = 1, and pays nothing.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp

from jaxrl_vr.estimators import ESTIMATORS, Estimator, EstimatorContext, make_estimator
from jaxrl_vr.selection import anchor, dynamic, two_stage

# Tolerance on band edges of tracked rates (the same role as selection.pairing's _EPS).
_BAND_EPS = 1e-6


PBA_KINDS = ("oracle", "trainer")


class MethodSpec(NamedTuple):
    """What a method name means."""

    estimator: str
    selection: str
    pba: bool
    pba_kind: str = "oracle"  # one of PBA_KINDS; meaningful only when pba


class Tracker(NamedTuple):
    """Per-prompt success counts of the current policy (calibrated, then refreshed)."""

    successes_p: jnp.ndarray  # float32 [P]
    counts_p: jnp.ndarray  # float32 [P]


class Batch(NamedTuple):
    """One training batch of groups (fixed shape; ragged groups through valid_pg)."""

    prompt_idx_p: jnp.ndarray  # int32 [Pb]
    modes_pg: jnp.ndarray  # int32 [Pb, G]: sampled mode of each rollout
    rewards_pg: jnp.ndarray  # float32 [Pb, G]: 1 if the mode is correct
    valid_pg: jnp.ndarray  # bool [Pb, G]
    samples: jnp.ndarray  # int32 []: rollouts generated for this batch (budget)
    paired: jnp.ndarray  # bool []: the batch is made of (q+, q-) pairs


# sample_fn(key, prompt_idx_n, num_samples) -> (modes_ng int32, rewards_ng float32)
SampleFn = Callable[[jax.Array, jnp.ndarray, int], tuple[jnp.ndarray, jnp.ndarray]]


# ------------------------------------------------------------------------ estimators


def estimator_settings(name: str, cfg):
    """The settings of estimator ``name`` from the simulator config's values."""
    values = {
        "maxrl": {"eps": cfg.maxrl_eps},
        "curverl": {"window": cfg.curverl_window},
        "pair_weighted": {"neg_weight": cfg.pairing_neg_weight, "scope": cfg.pairing_scope},
        "pkpo": {"k": cfg.passk_k},
        "passk_training": {"k": cfg.passk_k},
    }.get(name, {})
    return ESTIMATORS.settings(name, values)


def make_sim_estimator(name: str, cfg) -> Estimator:
    """``jaxrl_vr.estimators``' estimator ``name`` for the simulator's batches (binary
    rewards: the rewards are the successes)."""
    return make_estimator(name, estimator_settings(name, cfg),
                          context=EstimatorContext(cfg.batch_prompts, 0.5))


# ------------------------------------------------------------------------------- PBA


def calibration_successes(key: jax.Array, p_base_p: jnp.ndarray, num_samples: int) -> jnp.ndarray:
    """Successes of ``num_samples`` base rollouts per prompt, c ~ Binomial(n, p_base).

    Args:
      key: PRNG key.
      p_base_p: float32 [P] exact base pass rates.
      num_samples: n >= 1 calibration rollouts per prompt.

    Returns:
      float32 [P] counts in {0, ..., n}.
    """
    chex.assert_rank(p_base_p, 1)
    p_base_p = jnp.clip(jnp.asarray(p_base_p, jnp.float32), 0.0, 1.0)
    counts_p = jax.random.binomial(key, jnp.float32(num_samples), p_base_p)
    return jnp.clip(jnp.round(counts_p), 0.0, num_samples).astype(jnp.float32)


def anchor_weights(kind: str, p_base_p: jnp.ndarray, successes_p: jnp.ndarray | None,
                   cfg) -> jnp.ndarray:
    """PBA's frozen per-prompt KL weight λ·1[anchor(x)], float32 [P].

    ``"trainer"``: ``selection.anchor.anchored_kl_weight`` of p̂ = c/n (n =
    ``cfg.pba_calibration_samples``, c = ``successes_p``) with the trainer's band and λ
    (``cfg.pba_trainer_*``). ``"oracle"``: the same function of the exact ``p_base_p``
    with ``cfg.pba_tau_*`` and ``cfg.pba_coef`` (``successes_p`` unused).
    """
    chex.assert_rank(p_base_p, 1)
    if kind == "oracle":
        return anchor.anchored_kl_weight(p_base_p, coef=cfg.pba_coef, tau_low=cfg.pba_tau_low,
                                         tau_high=cfg.pba_tau_high, polarity=cfg.pba_polarity)
    if kind != "trainer":
        raise ValueError(f"PBA kind must be one of {PBA_KINDS}, got {kind!r}.")
    chex.assert_equal_shape([p_base_p, successes_p])
    p_hat_p = successes_p / jnp.float32(cfg.pba_calibration_samples)
    return anchor.anchored_kl_weight(p_hat_p, coef=cfg.pba_trainer_coef,
                                     tau_low=cfg.pba_trainer_tau_low,
                                     tau_high=cfg.pba_trainer_tau_high, polarity=cfg.pba_polarity)


# ------------------------------------------------------------------------- selection


def _uniform_idx(key: jax.Array, cfg, num: int) -> jnp.ndarray:
    """Prompt indices drawn uniformly with replacement (duplicates are rare and harmless)."""
    return jax.random.randint(key, (num,), 0, cfg.num_prompts, dtype=jnp.int32)


def _full_batch(idx_p, modes_pg, rewards_pg, valid_pg, samples, paired=False) -> Batch:
    return Batch(idx_p.astype(jnp.int32), modes_pg.astype(jnp.int32),
                 rewards_pg.astype(jnp.float32), valid_pg, jnp.asarray(samples, jnp.int32),
                 jnp.asarray(paired))


def select_uniform(key, sample_fn: SampleFn, tracker: Tracker, cfg) -> Batch:
    """Pb prompts uniformly at random, G rollouts each."""
    del tracker
    key_idx, key_sample = jax.random.split(key)
    idx_p = _uniform_idx(key_idx, cfg, cfg.batch_prompts)
    modes_pg, rewards_pg = sample_fn(key_sample, idx_p, cfg.group_size)
    valid_pg = jnp.ones(rewards_pg.shape, bool)
    return _full_batch(idx_p, modes_pg, rewards_pg, valid_pg, idx_p.size * cfg.group_size)


def select_dynamic(key, sample_fn: SampleFn, tracker: Tracker, cfg) -> Batch:
    """DAPO dynamic sampling (arXiv 2503.14476) with a budget of ``dynamic_rounds`` rounds.

    Rounds of Pb uniform prompts are generated until Pb informative groups
    (``selection.dynamic.informative_groups``) are collected; a batch still short after the
    last round keeps its uninformative groups as invalid rows. ``samples`` counts only
    the rounds actually needed.
    """
    del tracker
    num_b, group, rounds = cfg.batch_prompts, cfg.group_size, cfg.dynamic_rounds
    key_idx, key_sample = jax.random.split(key)
    idx_c = _uniform_idx(key_idx, cfg, rounds * num_b)
    modes_cg, rewards_cg = sample_fn(key_sample, idx_c, group)
    keep_c = dynamic.informative_groups(rewards_cg)
    order_c = jnp.argsort(~keep_c, stable=True)[:num_b]  # kept groups first, in round order
    kept_total = jnp.cumsum(keep_c)
    full = kept_total[-1] >= num_b
    position = jnp.argmax(kept_total >= num_b)  # candidate that completes the batch
    rounds_used = jnp.where(full, position // num_b + 1, rounds)
    valid_pg = jnp.broadcast_to(keep_c[order_c][:, None], (num_b, group))
    return _full_batch(idx_c[order_c], modes_cg[order_c], rewards_cg[order_c], valid_pg,
                       rounds_used * num_b * group)


def select_two_stage(key, sample_fn: SampleFn, tracker: Tracker, cfg) -> Batch:
    """MAI-Thinking-1 two-stage sampling: probe with G_probe, continue to G if informative.

    The continuation decision is ``selection.two_stage.probe_continue`` on the probe
    samples; the other prompts keep only their probe samples (ragged groups).
    """
    del tracker
    num_b, group, probe = cfg.batch_prompts, cfg.group_size, cfg.two_stage_probe
    key_idx, key_sample = jax.random.split(key)
    idx_p = _uniform_idx(key_idx, cfg, num_b)
    modes_pg, rewards_pg = sample_fn(key_sample, idx_p, group)
    continue_p = two_stage.probe_continue(rewards_pg[:, :probe], lo=cfg.two_stage_lo,
                                          hi=cfg.two_stage_hi)
    valid_pg = (jnp.arange(group) < probe)[None, :] | continue_p[:, None]
    samples = num_b * probe + jnp.sum(continue_p) * (group - probe)
    return _full_batch(idx_p, modes_pg, rewards_pg, valid_pg, samples)


def pairing_pools(tracker: Tracker, cfg) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Jittable (q+, q-) candidate masks, the bands of ``selection.pairing.pairing_pools``.

    q+: pos_min < rate <= pos_max; q-: 1 − c/G <= rate <= 1 − 1/G; both need
    ``pairing_min_count`` tracked samples. (The host version is NumPy; a test checks that
    both agree.)
    """
    rate_p = tracker.successes_p / jnp.maximum(tracker.counts_p, 1e-9)
    ok_p = tracker.counts_p >= cfg.pairing_min_count - _BAND_EPS
    positive_p = ok_p & (rate_p > cfg.pairing_pos_min + _BAND_EPS) & (
        rate_p <= cfg.pairing_pos_max + _BAND_EPS)
    neg_lo = 1.0 - cfg.pairing_neg_c / cfg.group_size
    neg_hi = 1.0 - 1.0 / cfg.group_size
    negative_p = ok_p & (rate_p >= neg_lo - _BAND_EPS) & (rate_p <= neg_hi + _BAND_EPS)
    return positive_p, negative_p


def _draw_from(key, mask_p, num):
    weight_p = jnp.where(jnp.any(mask_p), mask_p.astype(jnp.float32), 1.0)
    return jax.random.choice(key, mask_p.shape[0], (num,), p=weight_p / jnp.sum(weight_p))


def select_pairing(key, sample_fn: SampleFn, tracker: Tracker, cfg) -> Batch:
    """Positive–negative pairing (Weighted GRPO, arXiv 2602.03452) from tracked rates.

    Pb/2 q+ prompts and Pb/2 q- prompts, drawn uniformly (with replacement) from the
    pools, interleaved as rows (q+, q-, q+, q-, ...). If either pool is empty the batch
    falls back to uniform prompts (``paired`` False), as the trainer does.
    """
    num_pairs = cfg.batch_prompts // 2
    key_pos, key_neg, key_uniform, key_sample = jax.random.split(key, 4)
    positive_p, negative_p = pairing_pools(tracker, cfg)
    paired = jnp.any(positive_p) & jnp.any(negative_p)
    pairs_n2 = jnp.stack([_draw_from(key_pos, positive_p, num_pairs),
                          _draw_from(key_neg, negative_p, num_pairs)], axis=1)
    idx_p = jnp.where(paired, pairs_n2.reshape(-1), _uniform_idx(key_uniform, cfg,
                                                                 cfg.batch_prompts))
    modes_pg, rewards_pg = sample_fn(key_sample, idx_p, cfg.group_size)
    valid_pg = jnp.ones(rewards_pg.shape, bool)
    return _full_batch(idx_p, modes_pg, rewards_pg, valid_pg,
                       cfg.batch_prompts * cfg.group_size, paired)


SELECTIONS: dict[str, Callable[..., Batch]] = {
    "uniform": select_uniform,
    "dapo": select_dynamic,
    "two_stage": select_two_stage,
    "pairing": select_pairing,
}
_SELECTION_ALIASES = {"dynamic": "dapo"}
# Regulariser tokens -> PBA kind ("pba" is the oracle, kept under its old name).
REGULARISERS = {"pba": "oracle", "pba_oracle": "oracle", "pba_trainer": "trainer"}


def parse_method(name: str) -> MethodSpec:
    """Parses "estimator+selection+pba" tokens (any order, each optional) into a MethodSpec.

    Raises:
      ValueError naming the unknown token and the valid ones.
    """
    estimator = selection = None
    pba, pba_kind = False, "oracle"
    tokens = [t.strip() for t in name.split("+") if t.strip()]
    if not tokens:
        raise ValueError(f"empty method name {name!r}.")
    for token in tokens:
        token = _SELECTION_ALIASES.get(token, token)
        if token in ESTIMATORS and estimator is None:
            estimator = token
        elif token in SELECTIONS and selection is None:
            selection = token
        elif token in REGULARISERS and not pba:
            pba, pba_kind = True, REGULARISERS[token]
        else:
            raise ValueError(
                f"method {name!r}: token {token!r} is unknown or repeated; use at most one "
                f"estimator ({', '.join(ESTIMATORS)}), one selection "
                f"({', '.join(SELECTIONS)}, dynamic) and one of {', '.join(REGULARISERS)}, "
                "joined by '+'.")
    selection = selection or "uniform"
    if estimator is None:
        estimator = "pair_weighted" if selection == "pairing" else "grpo"
    if estimator == "pair_weighted" and selection != "pairing":
        raise ValueError(f"method {name!r}: pair_weighted needs the 'pairing' selection.")
    return MethodSpec(estimator=estimator, selection=selection, pba=pba, pba_kind=pba_kind)
