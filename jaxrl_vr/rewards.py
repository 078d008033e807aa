"""Reward shaping terms: DAPO's overlong penalty and the combined reward (SPEC §3.6, §5).

R = R_verifier − λ_len·P_overlong − λ_hack·P_hack, each term switchable and returned
separately for logging. `overlong_penalty` returns DAPO's soft length reward R_length ≤ 0
(SPEC §3.6), so P_overlong = −R_length ≥ 0. P_hack ∈ {0, 1} comes from the host-side
detectors in jaxrl_vr.verifiers.hacks.
"""

from __future__ import annotations

import chex
import jax.numpy as jnp

__all__ = ["overlong_penalty", "total_reward"]

Array = chex.Array


def overlong_penalty(length_b: Array, *, max_len: int, cache_len: int) -> jnp.ndarray:
    """DAPO soft overlong punishment R_length (Yu et al. 2025, arXiv 2503.14476, eq. 13).

    R_length(L) = 0                                  if L ≤ max_len − cache_len
                = ((max_len − cache_len) − L) / cache_len   if max_len − cache_len < L ≤ max_len
                = −1                                 if L > max_len

    Args:
      length_b: int or float [B], response lengths in tokens.
      max_len: L_max, the largest length before the full penalty.
      cache_len: L_cache, the width of the linear ramp (0 = a hard cutoff at max_len).

    Returns:
      float32 [B] in [−1, 0].
    """
    chex.assert_rank(length_b, 1)
    if not 0 <= cache_len <= max_len:
        raise ValueError(f"Need 0 <= cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}.")
    length_b = jnp.asarray(length_b, jnp.float32)
    free_len = float(max_len - cache_len)
    ramp_b = (free_len - length_b) / float(max(cache_len, 1))
    penalty_b = jnp.where(length_b <= free_len, 0.0, jnp.where(length_b <= max_len, ramp_b, -1.0))
    return jnp.clip(penalty_b, -1.0, 0.0).astype(jnp.float32)


def total_reward(verifier_b: Array, *, overlong_b: Array | None = None, hack_b: Array | None = None,
                 len_coef: float = 1.0, hack_coef: float = 1.0) -> tuple[jnp.ndarray, dict[str, jnp.ndarray]]:
    """R = R_verifier − λ_len·P_overlong − λ_hack·P_hack (SPEC §5), each term optional.

    Args:
      verifier_b: float [B], verifier scores.
      overlong_b: float [B] from `overlong_penalty` (R_length ≤ 0, P_overlong = −R_length), or
        None to switch the term off.
      hack_b: float or bool [B], P_hack ≥ 0 (1 where a hack detector fired), or None = off.
      len_coef: λ_len.
      hack_coef: λ_hack.

    Returns:
      (reward_b float32 [B], terms) with terms["verifier"], terms["overlong"] = −λ_len·P_overlong
      and terms["hack"] = −λ_hack·P_hack, each float32 [B] (zeros when switched off), so
      reward_b = verifier + overlong + hack.
    """
    chex.assert_rank(verifier_b, 1)
    verifier_b = jnp.asarray(verifier_b, jnp.float32)
    zeros_b = jnp.zeros_like(verifier_b)
    overlong_term_b = zeros_b
    if overlong_b is not None:
        chex.assert_equal_shape([verifier_b, overlong_b])
        overlong_term_b = -len_coef * -jnp.asarray(overlong_b, jnp.float32)
    hack_term_b = zeros_b
    if hack_b is not None:
        chex.assert_equal_shape([verifier_b, hack_b])
        hack_term_b = -hack_coef * jnp.asarray(hack_b, jnp.float32)
    reward_b = verifier_b + overlong_term_b + hack_term_b
    return reward_b, {"verifier": verifier_b, "overlong": overlong_term_b, "hack": hack_term_b}
