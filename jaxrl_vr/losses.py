"""Clipped policy-gradient surrogate and exact loss aggregation (SPEC §3.5).

`clipped_surrogate` returns an unreduced loss plus elementwise clip indicators;
`aggregate` turns it into a (numerator, denominator) pair. Sum numerators and
denominators over micro-batches, gradient-accumulation steps and devices, then divide
once (`finalize`): the result equals the full-batch loss exactly for every mode.

References: PPO (Schulman et al. 2017, arXiv 1707.06347); dual-clip PPO (Ye et al. 2020,
arXiv 1912.09729); DAPO (arXiv 2503.14476); GRPO (arXiv 2402.03300); Dr.GRPO
(arXiv 2503.20783); GSPO (arXiv 2507.18071).
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from jaxrl_vr import ratios

AGGREGATION_MODES = (
    "token_mean",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_sum_norm",
    "seq_mean",
)


class ClipInfo(NamedTuple):
    """Elementwise float32 {0, 1} indicators (shape of the loss) plus the ratio used.

    Reduce with `clip_fractions(info, mask)` to (numerator, denominator) pairs.

    Attributes:
        is_clipped_low: A < 0 and r < 1 − eps_low: the lower clip branch is active (no grad).
        is_clipped_high: A > 0 and r > 1 + eps_high: the upper clip branch is active (no grad).
        is_dual_clipped: dual clip active: A < 0 and the PPO loss exceeded −c·A (capped).
        is_truncated: the raw log-ratio lay outside `log_ratio_bounds` and was truncated.
        ratio: r = exp(log-ratio) after truncation and the ±20 cap.
    """

    is_clipped_low: jax.Array
    is_clipped_high: jax.Array
    is_dual_clipped: jax.Array
    is_truncated: jax.Array
    ratio: jax.Array


def clipped_surrogate(
    log_ratio: jax.Array,
    adv: jax.Array,
    *,
    eps_low: float | jax.Array,
    eps_high: float | jax.Array,
    dual_clip: float | jax.Array | None = None,
    log_ratio_bounds: tuple[float | jax.Array, float | jax.Array] | None = None,
) -> tuple[jax.Array, ClipInfo]:
    """Asymmetric clipped surrogate loss, elementwise (SPEC §3.5, **contract**).

        x = clip(log_ratio, lo, hi)                 (only with log_ratio_bounds)
        r = exp(clip(x, −20, 20))
        ℓ = −min(r·A, clip(r, 1 − eps_low, 1 + eps_high)·A)
        ℓ = min(ℓ, −c·A)  where A < 0               (only with dual_clip = c > 1)

    PPO (arXiv 1707.06347) with DAPO's decoupled eps_low/eps_high (arXiv 2503.14476) and
    dual-clip PPO (Ye et al., arXiv 1912.09729): a huge ratio on a negative-advantage
    sample gives loss −c·A with zero gradient instead of an unbounded loss. The outer
    truncation bounds the log-ratio on all branches before the surrogate (truncated
    elements get zero gradient).

    The advantage is data: it is stop-gradiented here. The hyperparameters may be arrays
    (changing them never recompiles); `dual_clip` and `log_ratio_bounds` being None or
    not is static.

    Args:
        log_ratio: log π_θ − log π_old (token or GSPO sequence level), any shape.
        adv: advantages, same rank as log_ratio and broadcastable to it (e.g. adv_b[:, None]
          against log_ratio_bt).
        eps_low, eps_high: clip range [1 − eps_low, 1 + eps_high] of the ratio.
        dual_clip: c > 1 or None.
        log_ratio_bounds: (lo, hi) or None.

    Returns:
        (loss float32 of the broadcast shape, ClipInfo of the same shape).
    """
    log_ratio = jnp.asarray(log_ratio, jnp.float32)
    adv = jax.lax.stop_gradient(jnp.asarray(adv, jnp.float32))
    if log_ratio.ndim != adv.ndim and adv.ndim != 0:
        raise ValueError(
            f"log_ratio has shape {log_ratio.shape} but adv has shape {adv.shape}: give them "
            "the same rank, e.g. adv_b[:, None] against log_ratio_bt.")
    shape = jnp.broadcast_shapes(log_ratio.shape, adv.shape)
    if isinstance(dual_clip, (int, float)) and dual_clip <= 1:
        raise ValueError(f"dual_clip must be > 1 (or None), got {dual_clip}.")

    if log_ratio_bounds is None:
        is_truncated = jnp.zeros(log_ratio.shape, bool)
    else:
        if len(log_ratio_bounds) != 2:
            raise ValueError(f"log_ratio_bounds must be a (lo, hi) pair, got {log_ratio_bounds!r}.")
        low_bound, high_bound = log_ratio_bounds
        is_truncated = (log_ratio < low_bound) | (log_ratio > high_bound)
        log_ratio = jnp.clip(log_ratio, low_bound, high_bound)
    ratio = jnp.exp(ratios.clip_log_ratio(log_ratio))

    clipped_ratio = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    loss = -jnp.minimum(ratio * adv, clipped_ratio * adv)
    is_clipped_low = (adv < 0) & (ratio < 1.0 - eps_low)
    is_clipped_high = (adv > 0) & (ratio > 1.0 + eps_high)

    if dual_clip is None:
        is_dual_clipped = jnp.zeros(shape, bool)
    else:
        cap = -dual_clip * adv
        is_dual_clipped = (adv < 0) & (loss > cap)
        loss = jnp.where(adv < 0, jnp.minimum(loss, cap), loss)

    def indicator(x):
        return jnp.broadcast_to(x, shape).astype(jnp.float32)

    info = ClipInfo(
        is_clipped_low=indicator(is_clipped_low),
        is_clipped_high=indicator(is_clipped_high),
        is_dual_clipped=indicator(is_dual_clipped),
        is_truncated=indicator(is_truncated),
        ratio=jnp.broadcast_to(ratio, shape),
    )
    return jnp.broadcast_to(loss, shape), info


def clip_fractions(info: ClipInfo, mask: jax.Array) -> dict[str, tuple[jax.Array, jax.Array]]:
    """Masked (numerator, denominator) of each clip indicator, for exact micro-batch sums.

    fraction = Σ indicator·mask / Σ mask once numerators and denominators are summed over
    micro-batches and devices.

    Args:
        info: a ClipInfo from `clipped_surrogate`.
        mask: bool, broadcastable (same rank) to the indicators, True = counts.

    Returns:
        {"clipped_low", "clipped_high", "dual_clipped", "truncated"} -> (num, den) float32.
    """
    chex.assert_type(mask, bool)
    mask = jnp.broadcast_to(mask, info.is_clipped_low.shape)
    denominator = jnp.sum(mask, dtype=jnp.float32)

    def numerator(indicator):
        return jnp.sum(jnp.where(mask, indicator, 0.0))

    return {
        "clipped_low": (numerator(info.is_clipped_low), denominator),
        "clipped_high": (numerator(info.is_clipped_high), denominator),
        "dual_clipped": (numerator(info.is_dual_clipped), denominator),
        "truncated": (numerator(info.is_truncated), denominator),
    }


def aggregate(
    loss_bt: jax.Array,
    mask_bt: jax.Array,
    mode: str = "token_mean",
    *,
    max_len: int | float | jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Reduces an unreduced loss to (numerator, denominator) (SPEC §3.5, **contract**).

    The loss is numerator / denominator. Summing numerators and denominators over
    micro-batches or devices before the single division gives exactly the full-batch
    value, for every mode. With T_i = Σ_t mask_it and V = {i : T_i ≥ 1}:

    | mode                      | numerator                             | denominator |
    |---------------------------|---------------------------------------|-------------|
    | `token_mean` (DAPO)       | Σ_i Σ_t m·ℓ                           | Σ_i T_i     |
    | `seq_mean_token_mean`     | Σ_{i∈V} (1/T_i) Σ_t m·ℓ   (GRPO)      | |V|         |
    | `seq_mean_token_sum`      | Σ_{i∈V} Σ_t m·ℓ                       | |V|         |
    | `seq_mean_token_sum_norm` | Σ_{i∈V} (1/max_len) Σ_t m·ℓ (Dr.GRPO) | |V|         |
    | `seq_mean` (GSPO)         | Σ_{i∈V} ℓ_i                           | |V|         |

    `seq_mean` takes per-response losses loss_b [B] (with mask_bt [B, T] or valid_b [B]);
    given loss_bt [B, T] it uses each response's masked token mean as ℓ_i (equal to ℓ_i
    when the response loss is broadcast to its tokens), i.e. it equals
    `seq_mean_token_mean`. With a per-response loss broadcast to tokens, `token_mean`
    gives Σ T_i ℓ_i / Σ T_i (SPEC §5). `seq_mean_token_sum_norm` divides by the constant
    `max_len` (default T = mask_bt.shape[1]; pass it explicitly when micro-batches have
    different padded lengths). Masked positions contribute exactly zero loss and zero
    gradient (also when they hold inf/NaN). With no valid token at all the denominator is
    0; divide with `finalize`.

    Args:
        loss_bt: [B, T] per-token loss ([B] for `seq_mean`).
        mask_bt: [B, T] bool, True = valid response token ([B] allowed for `seq_mean`).
        mode: one of AGGREGATION_MODES (static).
        max_len: Dr.GRPO normaliser for `seq_mean_token_sum_norm`.

    Returns:
        (numerator, denominator): float32 scalars.
    """
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"Unknown aggregation mode {mode!r}; valid modes: "
                         f"{', '.join(AGGREGATION_MODES)}.")
    chex.assert_type(mask_bt, bool)
    loss_bt = jnp.asarray(loss_bt, jnp.float32)

    if mode == "seq_mean" and loss_bt.ndim == 1:
        chex.assert_rank(mask_bt, {1, 2})
        valid_b = mask_bt if mask_bt.ndim == 1 else jnp.any(mask_bt, axis=1)
        chex.assert_equal_shape([loss_bt, valid_b])
        return (jnp.sum(jnp.where(valid_b, loss_bt, 0.0)),
                jnp.sum(valid_b, dtype=jnp.float32))

    chex.assert_rank([loss_bt, mask_bt], 2)
    chex.assert_equal_shape([loss_bt, mask_bt])
    masked_loss_bt = jnp.where(mask_bt, loss_bt, 0.0)
    if mode == "token_mean":
        return jnp.sum(masked_loss_bt), jnp.sum(mask_bt, dtype=jnp.float32)

    length_b = jnp.sum(mask_bt, axis=1, dtype=jnp.float32)
    valid_b = length_b > 0
    token_sum_b = jnp.sum(masked_loss_bt, axis=1)
    if mode in ("seq_mean_token_mean", "seq_mean"):
        seq_loss_b = token_sum_b / jnp.maximum(length_b, 1.0)
    elif mode == "seq_mean_token_sum":
        seq_loss_b = token_sum_b
    else:  # seq_mean_token_sum_norm
        if max_len is None:
            max_len = loss_bt.shape[1]
        seq_loss_b = token_sum_b / jnp.asarray(max_len, jnp.float32)
    return (jnp.sum(jnp.where(valid_b, seq_loss_b, 0.0)),
            jnp.sum(valid_b, dtype=jnp.float32))


def finalize(numerator: jax.Array, denominator: jax.Array) -> jax.Array:
    """numerator / denominator, or 0 when the denominator is 0 (no valid token)."""
    safe_denominator = jnp.where(denominator > 0, denominator, 1.0)
    return jnp.where(denominator > 0, numerator / safe_denominator, 0.0)
