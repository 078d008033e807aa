"""Positive–negative prompt pairing for Weighted GRPO (Sheng/Pang et al., arXiv 2602.03452).

Each update uses pairs (q⁺, q⁻) chosen from the tracker's per-prompt success rates:

* q⁺ hard-but-solvable: pos_min < rate <= pos_max (a low, non-zero success rate);
* q⁻ easy-but-brittle: 1 − c/G <= rate <= 1 − 1/G (solved often, but not always).

Both need at least ``min_count`` tracked samples. The thresholds, c and λ_neg are
configurable; the published values are not known (SPEC §3.3). The advantage side is
``jaxrl_vr.advantages.pair_weighted``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

__all__ = ["PairPools", "pairing_pools", "select_pairs", "pairs_from_tracker"]

_EPS = 1e-9  # rates are ratios of counts; compare band edges with a tiny tolerance


class PairPools(NamedTuple):
    """Candidate masks (bool [P]) for the two sides of a pair."""

    positive_p: np.ndarray
    negative_p: np.ndarray


def pairing_pools(
    rate_p: Any,
    count_p: Any,
    *,
    group_size: int,
    neg_c: int = 2,
    pos_max: float = 0.25,
    pos_min: float = 0.0,
    min_count: int = 1,
    eligible_p: Any | None = None,
) -> PairPools:
    """Candidate pools from per-prompt success rates.

    Args:
      rate_p: [P] success rates (``PromptTracker.pass_rate``).
      count_p: [P] samples behind each rate (``PromptTracker.counts()[0]``).
      group_size: G, the samples per prompt in an update.
      neg_c: c in the q⁻ band [1 − c/G, 1 − 1/G] (1 <= c <= G).
      pos_max: q⁺ needs rate <= pos_max.
      pos_min: q⁺ needs rate > pos_min (default 0: "solvable", at least one success).
      min_count: prompts with fewer tracked samples are in neither pool.
      eligible_p: optional [P] bool restricting both pools.

    Returns:
      PairPools(positive_p, negative_p); a prompt may be in at most one of them
      whenever pos_max < 1 − neg_c/G.
    """
    rate = np.asarray(rate_p, np.float64).reshape(-1)
    count = np.asarray(count_p, np.float64).reshape(-1)
    if rate.shape != count.shape:
        raise ValueError(f"rate_p {rate.shape} and count_p {count.shape} must have the same shape.")
    if group_size < 2:
        raise ValueError(f"group_size must be >= 2 for a brittle band, got {group_size}.")
    if not 1 <= neg_c <= group_size:
        raise ValueError(f"neg_c must be in [1, G={group_size}], got {neg_c}.")
    if not 0.0 <= pos_min < pos_max <= 1.0:
        raise ValueError(f"need 0 <= pos_min < pos_max <= 1, got {pos_min}, {pos_max}.")
    ok = count >= min_count
    if eligible_p is not None:
        ok &= np.asarray(eligible_p, bool).reshape(-1)
    positive = ok & (rate > pos_min + _EPS) & (rate <= pos_max + _EPS)
    neg_lo, neg_hi = 1.0 - neg_c / group_size, 1.0 - 1.0 / group_size
    negative = ok & (rate >= neg_lo - _EPS) & (rate <= neg_hi + _EPS)
    return PairPools(positive, negative)


def _pick(rng: np.random.Generator, pool: np.ndarray, rate: np.ndarray, num: int,
          strategy: str, hardest_first: bool) -> np.ndarray:
    idx = np.flatnonzero(pool)
    if strategy == "random":
        return rng.choice(idx, size=num, replace=idx.size < num)
    # "extreme": q⁺ lowest rates first, q⁻ highest rates first; ties by index; cycle if short.
    key = rate[idx] if hardest_first else -rate[idx]
    ordered = idx[np.lexsort((idx, key))]
    return ordered[np.arange(num) % ordered.size]


def select_pairs(
    rng: np.random.Generator,
    pools: PairPools,
    rate_p: Any,
    num_pairs: int,
    *,
    strategy: str = "random",
) -> np.ndarray:
    """Draws ``num_pairs`` (q⁺, q⁻) index pairs: int64 [num_pairs, 2].

    ``"random"``: uniform over each pool, without replacement when the pool is large
    enough, with replacement otherwise. ``"extreme"``: the hardest q⁺ (lowest rate)
    with the most brittle-yet-easy q⁻ (highest rate in band), ties by index.
    Deterministic given ``rng``. If either pool is empty the result is [0, 2]: the
    caller falls back to an unpaired batch.
    """
    if strategy not in ("random", "extreme"):
        raise ValueError(f"strategy must be 'random' or 'extreme', got {strategy!r}.")
    if num_pairs < 0:
        raise ValueError(f"num_pairs must be >= 0, got {num_pairs}.")
    rate = np.asarray(rate_p, np.float64).reshape(-1)
    if not pools.positive_p.any() or not pools.negative_p.any() or num_pairs == 0:
        return np.zeros((0, 2), np.int64)
    pos = _pick(rng, pools.positive_p, rate, num_pairs, strategy, hardest_first=True)
    neg = _pick(rng, pools.negative_p, rate, num_pairs, strategy, hardest_first=False)
    return np.stack([pos, neg], axis=1).astype(np.int64)


def pairs_from_tracker(
    tracker: Any,
    rng: np.random.Generator,
    num_pairs: int,
    *,
    group_size: int,
    neg_c: int = 2,
    pos_max: float = 0.25,
    pos_min: float = 0.0,
    min_count: int = 1,
    eligible_p: Any | None = None,
    strategy: str = "random",
) -> np.ndarray:
    """``select_pairs`` over a ``PromptTracker``'s recency-weighted rates (no prior)."""
    count_p, _ = tracker.counts()
    rate_p = tracker.pass_rate(prior=(0.0, 0.0))
    pools = pairing_pools(rate_p, count_p, group_size=group_size, neg_c=neg_c, pos_max=pos_max,
                          pos_min=pos_min, min_count=min_count, eligible_p=eligible_p)
    return select_pairs(rng, pools, rate_p, num_pairs, strategy=strategy)
