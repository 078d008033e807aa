"""Two-stage sampling and adaptive group sizes (MAI-Thinking-1; SPEC §4).

Two-stage: probe every prompt with G_probe samples; continue to G_full samples only
for prompts whose probe pass rate lies in [lo, hi] (the informative band), so compute
is not spent on prompts that are already solved or hopeless.

Adaptive G: under a fixed total number of samples, every prompt gets g_min and the rest
goes to prompts in the informative band (uniformly or ∝ p(1−p), the Bernoulli variance),
capped at g_max; the allocation is deterministic and its total is exactly ``total``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import chex
import jax.numpy as jnp
import numpy as np

from jaxrl_vr import trajectory as traj_lib

__all__ = [
    "probe_pass_rate",
    "probe_continue",
    "continuation_counts",
    "merge_probe_and_continuation",
    "adaptive_group_sizes",
    "group_valid_mask",
    "TwoStageStats",
    "two_stage_batch",
]


def probe_pass_rate(rewards_pg: chex.Array, valid_pg: chex.Array | None = None) -> chex.Array:
    """Mean valid reward per prompt, p̂_x = Σ_i v_i R_i / max(K_x, 1); 0 when K_x = 0.

    Args:
      rewards_pg: [P, G_probe] rewards in [0, 1].
      valid_pg: optional [P, G_probe] bool.

    Returns:
      [P] float32.
    """
    chex.assert_rank(rewards_pg, 2)
    rewards_pg = jnp.asarray(rewards_pg, jnp.float32)
    if valid_pg is None:
        valid_pg = jnp.ones(rewards_pg.shape, jnp.bool_)
    chex.assert_equal_shape([rewards_pg, valid_pg])
    chex.assert_type(valid_pg, bool)
    num_p = jnp.sum(valid_pg, axis=1).astype(jnp.float32)
    total_p = jnp.sum(jnp.where(valid_pg, rewards_pg, 0.0), axis=1)
    return total_p / jnp.maximum(num_p, 1.0)


def probe_continue(
    rewards_pg: chex.Array,
    valid_pg: chex.Array | None = None,
    *,
    lo: float,
    hi: float,
) -> chex.Array:
    """Two-stage decision: continue_x = (K_x > 0) and lo <= p̂_x <= hi (bool [P]).

    MAI-Thinking-1 probes with G_probe samples and spends G_full only on prompts whose
    probe pass rate is in [lo, hi]; e.g. lo = 0, hi = 0.75 with G_probe = 4 skips
    prompts solved 4/4.
    """
    if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and not 0.0 <= lo <= hi <= 1.0:
        raise ValueError(f"need 0 <= lo <= hi <= 1, got lo={lo}, hi={hi}.")
    rate_p = probe_pass_rate(rewards_pg, valid_pg)
    if valid_pg is None:
        has_p = jnp.ones(rate_p.shape, jnp.bool_)
    else:
        has_p = jnp.any(valid_pg, axis=1)
    return has_p & (rate_p >= lo) & (rate_p <= hi)


def continuation_counts(continue_p: Any, *, g_probe: int, g_full: int) -> np.ndarray:
    """Extra samples per prompt for stage two: g_full − g_probe where continued, else 0."""
    if not 1 <= g_probe <= g_full:
        raise ValueError(f"need 1 <= g_probe <= g_full, got g_probe={g_probe}, g_full={g_full}.")
    return np.where(np.asarray(continue_p, bool), g_full - g_probe, 0).astype(np.int64)


def merge_probe_and_continuation(
    probe_rewards_pg: Any,
    extra_rewards_pg: Any,
    continue_p: Any,
    *,
    probe_valid_pg: Any | None = None,
    extra_valid_pg: Any | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Joins probe and stage-two samples into [P, G_full] groups (host numpy).

    Row x holds its G_probe probe samples followed by its G_full − G_probe stage-two
    samples; the stage-two part is valid only where ``continue_p`` (stopped prompts keep
    their probe samples as a ragged group).

    Args:
      probe_rewards_pg: [P, G_probe].
      extra_rewards_pg: [P, G_full − G_probe] (rows of stopped prompts are ignored), or
        [P_cont, G_full − G_probe] holding only the continued prompts' rows, in order.
      continue_p: [P] bool from ``probe_continue``.
      probe_valid_pg, extra_valid_pg: optional bool masks of the same shapes.

    Returns:
      (rewards_pg [P, G_full] float32, valid_pg [P, G_full] bool).
    """
    probe = np.asarray(probe_rewards_pg, np.float32)
    extra = np.asarray(extra_rewards_pg, np.float32)
    cont = np.asarray(continue_p, bool)
    if probe.ndim != 2 or extra.ndim != 2 or cont.shape != probe.shape[:1]:
        raise ValueError(
            f"need probe [P, G_probe], extra [P or P_cont, G_extra], continue [P]; got "
            f"{probe.shape}, {extra.shape}, {cont.shape}."
        )
    pv = np.ones(probe.shape, bool) if probe_valid_pg is None else np.asarray(probe_valid_pg, bool)
    ev = np.ones(extra.shape, bool) if extra_valid_pg is None else np.asarray(extra_valid_pg, bool)
    if extra.shape[0] != probe.shape[0]:
        if extra.shape[0] != int(cont.sum()):
            raise ValueError(
                f"extra_rewards_pg has {extra.shape[0]} rows; expected P={probe.shape[0]} or "
                f"the {int(cont.sum())} continued prompts."
            )
        full = np.zeros((probe.shape[0], extra.shape[1]), np.float32)
        full_valid = np.zeros((probe.shape[0], extra.shape[1]), bool)
        full[cont], full_valid[cont] = extra, ev
        extra, ev = full, full_valid
    ev = ev & cont[:, None]
    rewards = np.concatenate([probe, np.where(ev, extra, 0.0).astype(np.float32)], axis=1)
    return rewards, np.concatenate([pv, ev], axis=1)


def _capped_proportional(weight_p: np.ndarray, budget: int, room_p: np.ndarray) -> np.ndarray:
    """Integer split of ``budget`` ∝ weight with per-item caps ``room`` (water-filling).

    Items whose proportional share reaches their cap are fixed at the cap and the rest is
    re-split among the others; once no cap binds, Hamilton's largest-remainder method
    rounds the shares (ties to the lower index). Returns the allocation; its sum is
    min(budget, Σ room over weight > 0).
    """
    alloc = np.zeros_like(room_p)
    active = (weight_p > 0) & (room_p > 0)
    while budget > 0 and active.any():
        w = np.where(active, weight_p, 0.0)
        share = budget * w / w.sum()
        left = room_p - alloc
        over = active & (share >= left)
        if over.any():
            give = np.where(over, left, 0)
            alloc += give
            budget -= int(give.sum())
            active &= ~over
            continue
        base = np.where(active, np.floor(share).astype(np.int64), 0)
        alloc += base
        budget -= int(base.sum())
        frac = share - np.floor(share)
        order = np.lexsort((np.arange(share.size), -frac))
        order = order[(active & (alloc < room_p))[order]][:budget]
        alloc[order] += 1
        budget -= order.size
        active &= alloc < room_p
    return alloc


def adaptive_group_sizes(
    p_hat_p: Any,
    *,
    total: int,
    g_min: int,
    g_max: int,
    lo: float = 0.0,
    hi: float = 1.0,
    weight: str = "variance",
    known_p: Any | None = None,
) -> np.ndarray:
    """Adaptive G under a fixed total (MAI-Thinking-1 style budget allocation).

    1. Every prompt gets g_min.
    2. The remaining total − P·g_min goes to in-band prompts (lo <= p̂ <= hi, and
       ``known``), ∝ the band weight: ``"uniform"`` (1) or ``"variance"`` (p̂(1−p̂),
       floored at 1/(4·g_max²) so p̂ = 0 or 1 inside the band still receives samples),
       capped at g_max (water-filling), rounded by largest remainder, ties to the
       lower index.
    3. Whatever the in-band prompts cannot absorb goes uniformly to the other prompts.

    Args:
      p_hat_p: [P] pass-rate estimates (e.g. ``PromptTracker.pass_rate``).
      total: exact number of samples to allocate; needs P·g_min <= total <= P·g_max.
      g_min, g_max: per-prompt bounds.
      lo, hi: the informative band.
      weight: ``"uniform"`` or ``"variance"``.
      known_p: optional [P] bool; unknown prompts (e.g. never seen) count as in-band
        with weight 1/4, the maximum of p(1−p).

    Returns:
      g_p: int64 [P] with sum exactly ``total``.
    """
    p_hat = np.asarray(p_hat_p, np.float64).reshape(-1)
    num = p_hat.shape[0]
    if not 1 <= g_min <= g_max:
        raise ValueError(f"need 1 <= g_min <= g_max, got g_min={g_min}, g_max={g_max}.")
    if not num * g_min <= total <= num * g_max:
        raise ValueError(
            f"total={total} samples cannot be split over {num} prompts with {g_min} <= G <= "
            f"{g_max}; choose total in [{num * g_min}, {num * g_max}]."
        )
    if weight not in ("uniform", "variance"):
        raise ValueError(f"weight must be 'uniform' or 'variance', got {weight!r}.")
    known = np.ones(num, bool) if known_p is None else np.asarray(known_p, bool).reshape(-1)
    in_band = ~known | ((p_hat >= lo) & (p_hat <= hi))
    if weight == "uniform":
        w = np.ones(num)
    else:
        w = np.maximum(p_hat * (1.0 - p_hat), 1.0 / (4.0 * g_max**2))
        w = np.where(known, w, 0.25)
    g_p = np.full(num, g_min, np.int64)
    room = np.full(num, g_max - g_min, np.int64)
    budget = total - num * g_min
    first = _capped_proportional(np.where(in_band, w, 0.0), budget, room)
    g_p += first
    budget -= int(first.sum())
    second = _capped_proportional(np.where(in_band, 0.0, 1.0), budget, room - first)
    g_p += second
    assert int(g_p.sum()) == total, (g_p.sum(), total)  # guaranteed by the bounds check
    return g_p


def group_valid_mask(g_p: Any, g_max: int) -> np.ndarray:
    """[P, g_max] bool with the first g_x entries of row x True (ragged groups)."""
    g = np.asarray(g_p, np.int64).reshape(-1)
    if np.any(g < 0) or np.any(g > g_max):
        raise ValueError(f"group sizes must lie in [0, {g_max}], got min {g.min()}, max {g.max()}.")
    return np.arange(g_max)[None, :] < g[:, None]


class TwoStageStats(NamedTuple):
    """continued_frac: share of the probed prompts that got more samples."""

    continued_frac: float

    def metrics(self) -> dict[str, float]:
        return {"two_stage/continued_frac": float(self.continued_frac)}


def two_stage_batch(sample_round, next_prompts, *, num_prompts: int, g_probe: int, g_full: int,
                    lo: float, hi: float, adaptive_g_max: int | None = None) -> traj_lib.Trajectory:
    """Two-stage sampling as a batch strategy (``jaxrl_vr.selection.strategies``).

    Probe the next P prompts with G_probe samples each. Then either

    * fixed (``adaptive_g_max=None``): prompts whose probe pass rate (mean verifier score)
      lies in [lo, hi] get G_full − G_probe more samples; the batch is [P, G_full];
    * adaptive G: the fixed total P·G_full is split by ``adaptive_group_sizes`` over the
      probe pass rates (every prompt keeps G_probe, in-band prompts get more ∝ p̂(1−p̂), at
      most ``adaptive_g_max``); the batch is [P, adaptive_g_max].

    Samples a prompt did not get are invalid padding (ragged groups), so the train step's
    shapes never change. One continuation call per distinct extra count; every generated
    token of both stages is in the trajectory's stats.
    """
    probe = sample_round(next_prompts(num_prompts), g_probe)
    scores_pg = probe.per_group(probe.scores_b)
    rate_p = np.asarray(probe_pass_rate(scores_pg, probe.valid_pg))
    if adaptive_g_max is None:
        width = g_full
        continue_p = np.asarray(probe_continue(scores_pg, probe.valid_pg, lo=lo, hi=hi), bool)
        extra_p = continuation_counts(continue_p, g_probe=g_probe, g_full=g_full)
    else:
        width = adaptive_g_max
        g_p = adaptive_group_sizes(rate_p, total=num_prompts * g_full, g_min=g_probe,
                                   g_max=adaptive_g_max, lo=lo, hi=hi)
        extra_p = g_p - g_probe
    batch = traj_lib.widen(probe, width)
    for extra in np.unique(extra_p[extra_p > 0]):
        rows = np.flatnonzero(extra_p == extra)
        more = sample_round(probe.prompt_idx_p[rows], int(extra))
        batch = traj_lib.place_samples(batch, more, rows, g_probe)
    stats = dataclasses.replace(batch.stats, strategy=TwoStageStats(float((extra_p > 0).mean())))
    return batch._replace(stats=stats)
