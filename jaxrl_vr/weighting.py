"""Prompt weights w(p): how much gradient a prompt with pass rate p receives.

Prompt reweighting is the functional derivative of a utility E_x[u(p(x))]: the policy
update is E_x[w(p) ∇p] with w = u'(p) (SPEC §3.2; CurveRL, Sun, Zhao et al.,
arXiv 2605.24331). Every function here is pure, float32 and jit-compatible; pass rates
p are expected in [0, 1] (no value checks inside jit).

| utility u(p)              | weight w(p)                 | function              |
|---------------------------|-----------------------------|-----------------------|
| p                         | 1                           | `reinforce_weight`    |
| 2·arcsin √p               | 1/√(p(1−p))                 | `grpo_weight`         |
| log p                     | 1/p  or (1−(1−p)^T)/p       | `maxrl_weight`        |
| log F_ref(p)              | f_ref(p)/F_ref(p), binned   | `curverl_bin_weights`,|
|                           |                             | `curverl_prompt_weights` |
"""

from __future__ import annotations

import chex
import jax.numpy as jnp

Array = chex.Array

# Floor of the histogram mass sum and of the CDF in CurveRL (the authors' epsilon).
CURVERL_EPS = 1e-6


def _as_f32(p: Array) -> jnp.ndarray:
    return jnp.asarray(p, dtype=jnp.float32)


def reinforce_weight(p: Array) -> jnp.ndarray:
    """REINFORCE prompt weight w(p) = 1 (utility u(p) = p).

    Args:
        p: pass rates, any shape.

    Returns:
        float32 ones of p's shape.
    """
    return jnp.ones_like(_as_f32(p))


def grpo_weight(p: Array) -> jnp.ndarray:
    """GRPO prompt weight in population form, w(p) = 1/√(p(1−p)).

    GRPO's std normalisation divides (R − p) by √(p(1−p)) for binary rewards, which is
    the gradient of u(p) = 2·arcsin √p (Davis & Recht, arXiv 2510.13651).

    The weight diverges at p ∈ {0, 1}; there every sample has R = p, so the advantage is
    zero whatever the weight. We return 0 at (and beyond) those endpoints so products
    stay finite: w(p) = 1/√(p(1−p)) for 0 < p < 1, else 0.

    Args:
        p: pass rates, any shape.

    Returns:
        float32 weights of p's shape.
    """
    p = _as_f32(p)
    interior = (p > 0.0) & (p < 1.0)
    safe_p = jnp.where(interior, p, 0.5)
    return jnp.where(interior, 1.0 / jnp.sqrt(safe_p * (1.0 - safe_p)), 0.0)


def maxrl_weight(p: Array, *, num_samples: int | None = None) -> jnp.ndarray:
    """MaxRL prompt weight: the gradient of u(p) = log p (Tajwar et al., arXiv 2602.02710).

    - ``num_samples=None``: w(p) = 1/p for p > 0, and 0 at p = 0 (a prompt never solved
        has R_i = p = 0 for all samples, so its advantage is zero anyway; 0 keeps the
        product finite).
    - ``num_samples=T``: the T-sample truncation w(p) = (1 − (1−p)^T)/p = Σ_{j<T} (1−p)^j,
        computed as −expm1(T·log1p(−p))/p; at p = 0 it takes its limit T (finite, no
        special case needed for the advantage).

    Args:
        p: pass rates in [0, 1], any shape.
        num_samples: truncation level T ≥ 1, or None for the untruncated 1/p.

    Returns:
        float32 weights of p's shape.
    """
    p = _as_f32(p)
    if num_samples is None:
        positive = p > 0.0
        return jnp.where(positive, 1.0 / jnp.where(positive, p, 1.0), 0.0)
    if int(num_samples) != num_samples or num_samples < 1:
        raise ValueError(
                f"maxrl_weight: num_samples must be a positive integer T (or None), got "
                f"{num_samples!r}; pass the number of samples per prompt.")
    t = float(num_samples)
    positive = p > 0.0
    safe_p = jnp.where(positive, p, 0.5)
    truncated = -jnp.expm1(t * jnp.log1p(-safe_p)) / safe_p
    return jnp.where(positive, truncated, jnp.float32(t))


def curverl_num_bins(group_size: int) -> int:
    """CurveRL histogram resolution: max(G + 1, 2) bins for G samples per prompt."""
    return max(int(group_size) + 1, 2)


def curverl_bin_index(p: Array, *, num_bins: int) -> jnp.ndarray:
    """bin(v) = clip(floor(clip(v, 0, 1) · num_bins), 0, num_bins − 1) as int32."""
    v = jnp.clip(_as_f32(p), 0.0, 1.0)
    return jnp.clip(jnp.floor(v * num_bins), 0, num_bins - 1).astype(jnp.int32)


def curverl_bin_weights(
        reference_p: Array,
        reference_valid: Array | None = None,
        *,
        num_bins: int,
        eps: float = CURVERL_EPS,
) -> jnp.ndarray:
    """CurveRL histogram weights f_ref/F_ref per bin (SPEC §3.2 steps 2 and 4).

    The reference sample is every entry of ``reference_p`` with ``reference_valid`` True
    and 0 < p < 1 (CurveRL, Sun, Zhao et al., arXiv 2605.24331):

        counts[b]     = #{reference p with bin(p) = b}
        mass          = counts / max(Σ counts, eps)
        cdf           = cumsum(mass)                   (inclusive)
        bin_weight[b] = mass[b] / max(cdf[b], eps)     ∈ [0, 1]

    No smoothing, clipping or renormalisation. An empty reference gives all-zero weights.

    Args:
        reference_p: reference pass rates, any shape (e.g. [window, P]).
        reference_valid: bool mask of reference_p's shape (None = all entries valid).
        num_bins: static number of bins, normally ``curverl_num_bins(G)``.
        eps: floor of the mass sum and of the CDF.

    Returns:
        float32 [num_bins] bin weights.
    """
    reference_p = _as_f32(reference_p)
    if reference_valid is not None:
        chex.assert_equal_shape([reference_p, reference_valid])
        chex.assert_type(reference_valid, bool)
    if int(num_bins) < 1:
        raise ValueError(f"curverl_bin_weights: num_bins must be >= 1, got {num_bins}.")
    in_open_unit = (reference_p > 0.0) & (reference_p < 1.0)
    counted = in_open_unit if reference_valid is None else in_open_unit & reference_valid
    bins = curverl_bin_index(reference_p, num_bins=num_bins).reshape(-1)
    counts = jnp.zeros((num_bins,), jnp.float32).at[bins].add(
            counted.reshape(-1).astype(jnp.float32))
    mass = counts / jnp.maximum(jnp.sum(counts), eps)
    cdf = jnp.cumsum(mass)
    return mass / jnp.maximum(cdf, eps)


def curverl_prompt_weights(
        p_hat: Array, bin_weight: Array, *, num_bins: int | None = None
) -> jnp.ndarray:
    """CurveRL prompt weight w_x = bin_weight[bin(p̂_x)] if 0 < p̂_x < 1, else 0 (step 5).

    Args:
        p_hat: per-prompt pass rates, any shape (e.g. [P]).
        bin_weight: float [num_bins] from ``curverl_bin_weights``.
        num_bins: optional; must equal bin_weight's length when given.

    Returns:
        float32 weights of p_hat's shape.
    """
    chex.assert_rank(bin_weight, 1)
    size = bin_weight.shape[0]
    if num_bins is not None and int(num_bins) != size:
        raise ValueError(
                f"curverl_prompt_weights: num_bins={num_bins} but bin_weight has {size} bins; "
                "pass the same num_bins used by curverl_bin_weights.")
    p_hat = _as_f32(p_hat)
    interior = (p_hat > 0.0) & (p_hat < 1.0)
    looked_up = _as_f32(bin_weight)[curverl_bin_index(p_hat, num_bins=size)]
    return jnp.where(interior, looked_up, 0.0)
