"""Unbiased pass@k and the PBA prompt regimes (SPEC §3.6).

``pass_at_k`` is host-side NumPy (float64): evaluation counts live on the host, and a
float32 log-gamma under jit would lose the precision the estimator needs. ``regime``
works on NumPy arrays and also on jax arrays under jit.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from scipy import special

# Regime names, indexed by the int codes ``regime`` returns.
REGIMES = ("out_of_reach", "boundary", "reachable", "solved_easy")
OUT_OF_REACH, BOUNDARY, REACHABLE, SOLVED_EASY = range(4)

# Below this many factors the exact product form is used; above it the log-gamma form
# (there both c and k exceed it, so pass@k ≥ 1 − exp(−c·k/n) is far from 0 and the
# log-gamma cancellation error, ~1e-11 absolute in the log, stays ~1e-11 relative).
_PRODUCT_TERMS = 64


def _as_int_array(x, name: str) -> np.ndarray:
    try:
        arr = np.asarray(x)
    except jax.errors.TracerArrayConversionError as err:
        raise TypeError(
            f"pass_at_k: {name} is a traced jax value; pass_at_k is host-side NumPy "
            "(call it outside jit, on concrete counts).") from err
    if arr.dtype.kind == "f":
        if not np.all(arr == np.round(arr)):
            raise ValueError(f"pass_at_k: {name} must hold whole numbers, got {arr}.")
    elif arr.dtype.kind not in "iub":
        raise TypeError(f"pass_at_k: {name} must be integer counts, got dtype {arr.dtype}.")
    return arr.astype(np.int64)


def pass_at_k(n, c, k) -> np.ndarray:
    """Unbiased pass@k estimator (Chen et al., arXiv 2107.03374), broadcasting.

      pass@k = 1 − C(n−c, k) / C(n, k),   and 1 when n − c < k.

    The ratio is evaluated as Π_{i=n−c+1}^{n} (1 − k/i) = Π_{j=0}^{k−1} (1 − c/(n−j)),
    summing log1p over the shorter of the two products when it has ≤ 64 factors, and
    with log-gamma otherwise; then pass@k = −expm1(log ratio). Accurate to ~1e-11
    relative for n up to 4096 and beyond; no overflow.

    Args:
      n: samples per prompt (int array-like).
      c: correct samples, 0 ≤ c ≤ n.
      k: 1 ≤ k ≤ n.

    Returns:
      float64 array of the broadcast shape.
    """
    n, c, k = np.broadcast_arrays(
        _as_int_array(n, "n"), _as_int_array(c, "c"), _as_int_array(k, "k"))
    if np.any(c < 0) or np.any(c > n):
        raise ValueError("pass_at_k: need 0 <= c <= n for every entry.")
    if np.any(k < 1) or np.any(k > n):
        raise ValueError("pass_at_k: need 1 <= k <= n for every entry; clip ks to n.")
    certain = n - c < k  # every size-k subset holds a correct sample
    terms = np.minimum(c, k)
    use_product = ~certain & (terms <= _PRODUCT_TERMS)
    log_ratio = np.zeros(n.shape, np.float64)

    # Product form over min(c, k) factors, accumulated one factor index at a time.
    c_le_k = c <= k
    nf, cf, kf = (a.astype(np.float64) for a in (n, c, k))
    for j in range(int(np.max(np.where(use_product, terms, 0), initial=0))):
        active = use_product & (j < terms)
        # c ≤ k: factor (1 − k/i) for i = n − j, j < c (i.e. i in (n−c, n]).
        # c > k: factor (1 − c/(n − j)) for j < k.
        numer = np.where(c_le_k, kf, cf)
        denom = np.where(active, nf - j, 1.0)
        factor = np.where(active, -numer / denom, 0.0)
        log_ratio += np.where(active, np.log1p(factor), 0.0)

    use_gamma = ~certain & ~use_product
    if np.any(use_gamma):
        g = special.gammaln
        log_ratio_gamma = (g(nf - cf + 1) - g(nf - cf - kf + 1)) - (g(nf + 1) - g(nf - kf + 1))
        log_ratio = np.where(use_gamma, log_ratio_gamma, log_ratio)

    return np.where(certain, 1.0, -np.expm1(log_ratio))


def pass_at_k_curve(n, c, ks: Sequence[int]) -> np.ndarray:
    """pass@k for every k in ``ks``: shape broadcast(n, c).shape + (len(ks),).

    Args:
      n: samples per prompt (int array-like).
      c: correct samples.
      ks: the k values, each in [1, min(n)].

    Returns:
      float64 [..., len(ks)].
    """
    n = _as_int_array(n, "n")
    c = _as_int_array(c, "c")
    ks_arr = _as_int_array(ks, "ks")
    if ks_arr.ndim != 1:
        raise ValueError(f"pass_at_k_curve: ks must be a 1-D sequence, got shape {ks_arr.shape}.")
    return pass_at_k(n[..., None], c[..., None], ks_arr)


def regime(p_base, n: int = 256):
    """PBA regime codes (index into ``REGIMES``) from the base model's pass rate.

      solved_easy:   p > 0.6
      reachable:     0.10 ≤ p ≤ 0.6
      boundary:      p < 0.10 and 1 − (1−p)^n > 0.4
      out_of_reach:  p < 0.10 and 1 − (1−p)^n ≤ 0.4

    (PBA, arXiv 2607.20543.) The pass-rate thresholds are checked first, so the regimes
    partition [0, 1] for every n. Comparisons happen in p's own float dtype (a float32
    0.6 is reachable, not solved_easy).

    Args:
      p_base: pass rates in [0, 1], NumPy or jax array (jit-compatible for jax arrays).
      n: samples per prompt for the reach probability 1 − (1−p)^n.

    Returns:
      int32 codes, same shape and array type as p_base.
    """
    xp = jnp if isinstance(p_base, jax.Array) else np
    p = xp.asarray(p_base)
    if not xp.issubdtype(p.dtype, xp.floating):
        p = p.astype(xp.float32 if xp is jnp else np.float64)
    dtype = p.dtype
    low_p = xp.where(p < xp.asarray(0.10, dtype), p, xp.zeros_like(p))  # reach is used only here
    reach = -xp.expm1(n * xp.log1p(-low_p))
    code = xp.where(
        p > xp.asarray(0.6, dtype),
        SOLVED_EASY,
        xp.where(
            p >= xp.asarray(0.10, dtype),
            REACHABLE,
            xp.where(reach > xp.asarray(0.4, dtype), BOUNDARY, OUT_OF_REACH),
        ),
    )
    return code.astype(xp.int32)
