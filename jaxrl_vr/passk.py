"""Unbiased pass@k, the pass@k objectives and the PBA prompt regimes (SPEC §3.6, §6a).

``pass_at_k`` is host-side NumPy (float64): evaluation counts live on the host, and a
float32 log-gamma under jit would lose the precision the estimator needs. The binomial
ratios C(a, m)/C(b, m) of every formula here come from one helper, ``log_comb_ratio``
(products of ratios, no factorials; NumPy or jax, traced values included). ``pkpo``
(PKPO, arXiv 2505.15201) and ``passk_training`` (Pass@k Training, arXiv 2508.10751) turn
a group's rewards into pass@k advantages (jittable, registered as estimators in
``jaxrl_vr.estimators``). ``regime`` works on NumPy arrays and also on jax arrays under jit.
"""

from __future__ import annotations

from collections.abc import Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_vr import advantages

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


def _is_jax(*values) -> bool:
    return any(isinstance(v, jax.Array) for v in values)


def log_comb_ratio(a, b, m, *, max_terms: int | None = None):
    """log(C(a, m)/C(b, m)) for counts a ≤ b and 0 ≤ m ≤ b, broadcasting; no factorials.

      C(a, m)/C(b, m) = Π_{j<m} (a − j)/(b − j) = Π_{j<m} (1 − (b − a)/(b − j)),

    summed one factor at a time as log1p terms, so a ratio close to 1 keeps its relative
    precision (1 − ratio = −expm1(log ratio)) and a tiny one never overflows or
    underflows before the end. A factor a − j ≤ 0 makes the ratio 0 (log −inf): C(a, m)
    = 0 for a < m. m = 0 gives 0 (ratio 1). ``pass_at_k``, the PKPO and Pass@k Training
    advantages all read their binomial ratios from here (SPEC §6a).

    Args:
      a, b, m: integer-valued arrays (NumPy, or jax arrays, traced ones included).
      max_terms: static bound on m, required when m is a traced jax value (default: the
        largest m).

    Returns:
      float64 (NumPy inputs) or float32 (jax inputs) array of the broadcast shape.
    """
    if _is_jax(a, b, m):
        if max_terms is None:
            try:
                max_terms = int(np.max(np.asarray(m), initial=0))
            except jax.errors.TracerArrayConversionError as err:
                raise TypeError("log_comb_ratio: m is a traced jax value; pass max_terms, a "
                                "static bound on it.") from err
        a, b, m = (jnp.asarray(v, jnp.float32) for v in (a, b, m))

        def add_factor(j, total):
            active = j < m
            positive = active & (a - j > 0.0)
            x = jnp.where(positive, (b - a) / jnp.where(active, b - j, 1.0), 0.0)
            return total + jnp.where(active & ~positive, -jnp.inf, jnp.log1p(-x))

        shape = jnp.broadcast_shapes(a.shape, b.shape, m.shape)
        return jax.lax.fori_loop(0, int(max_terms), add_factor, jnp.zeros(shape, jnp.float32))
    a, b, m = (np.asarray(v, np.float64) for v in (a, b, m))
    if max_terms is None:
        max_terms = int(np.max(m, initial=0))
    total = np.zeros(np.broadcast_shapes(a.shape, b.shape, m.shape), np.float64)
    for j in range(int(max_terms)):
        active = j < m
        positive = active & (a - j > 0)
        x = np.where(positive, (b - a) / np.where(active, b - j, 1.0), 0.0)
        total += np.where(active & ~positive, -np.inf, np.log1p(-x))
    return total


def pass_at_k(n, c, k) -> np.ndarray:
    """Unbiased pass@k estimator (Chen et al., arXiv 2107.03374), broadcasting.

      pass@k = 1 − C(n−c, k) / C(n, k),   and 1 when n − c < k.

    The ratio is evaluated as Π_{i=n−c+1}^{n} (1 − k/i) = Π_{j=0}^{k−1} (1 − c/(n−j)),
    summing log1p over the shorter of the two products when it has ≤ 64 factors
    (``log_comb_ratio``), and with log-gamma otherwise; then pass@k = −expm1(log ratio). Accurate to ~1e-11
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
    # Product form over min(c, k) factors: C(n−c, k)/C(n, k) = C(n−k, c)/C(n, c), so
    # c ≤ k takes the c factors (1 − k/(n − j)), c > k the k factors (1 − c/(n − j)).
    c_le_k = c <= k
    log_ratio = log_comb_ratio(np.where(c_le_k, n - k, n - c), n, np.where(use_product, terms, 0))
    nf, cf, kf = (a.astype(np.float64) for a in (n, c, k))

    use_gamma = ~certain & ~use_product
    if np.any(use_gamma):
        from scipy import special  # noqa: PLC0415 (here: scipy takes a second to import)

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


# ------------------------------------------------------ pass@k objectives (SPEC §6a)

PKPO_BASELINES = ("loo_minus_one", "none")


def _objective_inputs(rewards_pg, valid_pg, success_pg, name: str):
    """(values the objective reads, bool mask, shaping advantage) of a [P, G] batch."""
    chex.assert_rank(rewards_pg, 2)
    rewards_pg = jnp.asarray(rewards_pg, jnp.float32)
    if valid_pg is None:
        valid_pg = jnp.ones(rewards_pg.shape, bool)
    valid_pg = jnp.asarray(valid_pg)
    if valid_pg.dtype != jnp.bool_:
        raise TypeError(f"{name}: valid_pg must be a bool mask (True = counts), got dtype "
                        f"{valid_pg.dtype}; pass `valid_pg.astype(bool)`.")
    chex.assert_equal_shape([rewards_pg, valid_pg])
    if success_pg is None:
        return rewards_pg, valid_pg, jnp.zeros(rewards_pg.shape, jnp.float32)
    chex.assert_equal_shape([rewards_pg, success_pg])
    success_pg = jnp.clip(jnp.asarray(success_pg, jnp.float32), 0.0, 1.0)
    shaping_pg = advantages.group_stats(rewards_pg - success_pg, valid_pg).centred_pg
    return success_pg, valid_pg, shaping_pg


def _group_k(k, count_p: jnp.ndarray, max_k: int | None, group_size: int, name: str):
    """(k of each group = min(k, its valid samples), at least 1; static bound on k)."""
    if max_k is None:
        try:
            max_k = int(np.asarray(k))
        except jax.errors.TracerArrayConversionError as err:
            raise TypeError(f"{name}: k is a traced value; pass max_k, a static bound on it.") from err
    k_p = jnp.clip(jnp.minimum(jnp.asarray(k, jnp.int32), count_p), 1, None)
    return k_p.astype(jnp.float32), max(1, min(int(max_k), group_size))


def pkpo(
    rewards_pg: chex.Array,
    valid_pg: chex.Array | None = None,
    *,
    k,
    success_pg: chex.Array | None = None,
    baseline: str = "loo_minus_one",
    max_k: int | None = None,
) -> jnp.ndarray:
    """PKPO advantage: per-sample weights of an unbiased pass@k gradient (Walder &
    Karkhanis, arXiv 2505.15201).

    Each group's n valid values g (binary or continuous) are sorted ascending,
    g_(1) ≤ … ≤ g_(n). maxg@k (pass@k for binary g) is estimated without bias by
    ρ^(g) = C(n,k)⁻¹ Σ_{i≥k} C(i−1, k−1) g_(i), the mean of max g over the C(n, k)
    size-k subsets, and its gradient by Σ_i s_i ∇log π(x_i) with
    s_i = C(n,k)⁻¹ Σ_{subsets I ∋ i} max_I g:

      s_(i) = a_i g_(i) + Σ_{j>i} C(j−2, k−2)/C(n,k) · g_(j),   a_i = C(i−1, k−1)/C(n,k).

    For binary g with c correct that is r_i = k/n for a correct sample and
    (k/n)·ρ(n−1, c, k−1) for a wrong one, Σ_i r_i = k·ρ(n, c, k) (``baseline="none"``).

    ``baseline="loo_minus_one"`` (default) is the paper's s^(loo−1), the form it reports
    with the lowest variance and the only one defined at k = n: in every subset, sample
    i's baseline is the max of the subset's other k − 1 members, which does not depend
    on x_i (unbiased), i.e. s_i − (k/n)·ρ^(g)(n−1, k−1) of the other n − 1 samples. The
    terms of the samples above i cancel, leaving i's marginal contribution to the max:

      A_(i) = Σ_{m≤i} a_m (g_(m) − g_(m−1)),   g_(0) = 0,

    a sum of non-negative terms for k ≥ 2 (a_1 = 0), so there is no cancellation. Binary g:
    a correct sample gets (k/n)·C(n−c, k−1)/C(n−1, k−1), a wrong one 0. At k = 1 both
    forms are g_i/n: REINFORCE without a baseline, scaled by 1/n (a (k−1) = 0-sample
    subset gives no baseline).

    Binomial ratios come from ``log_comb_ratio`` (products of ratios, no factorials).
    Ties give equal values (permutation invariant). A group with n < k valid samples
    uses k = n; invalid samples and empty groups get 0. The scale is the paper's (the
    weights sum to k·ρ for "none"), not normalised.

    Args:
      rewards_pg: float [P, G] rewards (the values g unless ``success_pg`` is given).
      valid_pg: optional bool [P, G].
      k: the k of pass@k, a Python int or an int32 scalar (traced is fine: annealing).
      success_pg: optional float [P, G] verifier outcomes in [0, 1]: then g = success and
        the shaping part rewards − success gets a plain group-mean baseline (as
        ``advantages.maxrl``), so penalties keep their effect.
      baseline: "loo_minus_one" or "none" (static).
      max_k: static bound on k (default: k itself, when k is concrete).

    Returns:
      float32 [P, G], 0 where invalid.
    """
    if baseline not in PKPO_BASELINES:
        raise ValueError(f"pkpo: baseline must be one of {PKPO_BASELINES}, got {baseline!r}.")
    values_pg, valid_pg, shaping_pg = _objective_inputs(rewards_pg, valid_pg, success_pg, "pkpo")
    num_g = values_pg.shape[1]
    count_p = jnp.sum(valid_pg, axis=1).astype(jnp.int32)
    k_p, max_k = _group_k(k, count_p, max_k, num_g, "pkpo")
    order_pg = jnp.argsort(jnp.where(valid_pg, values_pg, -jnp.inf), axis=1, stable=True)
    sorted_pg = jnp.take_along_axis(values_pg, order_pg, axis=1)  # invalid samples first
    rank_pg = jnp.arange(1, num_g + 1)[None, :] - (num_g - count_p)[:, None]  # 1..n when valid
    n_p = jnp.maximum(count_p, 1).astype(jnp.float32)
    n_1, k_1 = n_p[:, None], k_p[:, None]
    # a_i = C(i−1, k−1)/C(n, k) = (k/n)·C(i−1, k−1)/C(n−1, k−1).
    a_pg = (k_1 / n_1) * jnp.exp(log_comb_ratio(
        jnp.maximum(rank_pg - 1, 0), n_1 - 1.0, k_1 - 1.0, max_terms=max_k - 1))
    a_pg = jnp.where(rank_pg >= 1, a_pg, 0.0)
    if baseline == "loo_minus_one":
        below_pg = jnp.pad(sorted_pg[:, :-1], ((0, 0), (1, 0)))
        rise_pg = sorted_pg - jnp.where(rank_pg >= 2, below_pg, 0.0)
        adv_sorted_pg = jnp.cumsum(jnp.where(rank_pg >= 1, a_pg * rise_pg, 0.0), axis=1)
    else:
        # C(j−2, k−2)/C(n, k) = (k/n)·(k−1)/(n−k+1)·C(j−2, k−2)/C(n−1, k−2), j ≥ 2.
        above_pg = (k_1 / n_1) * ((k_1 - 1.0) / (n_1 - k_1 + 1.0)) * jnp.exp(log_comb_ratio(
            jnp.maximum(rank_pg - 2, 0), n_1 - 1.0, jnp.maximum(k_1 - 2.0, 0.0),
            max_terms=max(max_k - 2, 0)))
        weighted_pg = jnp.where(rank_pg >= 2, above_pg * sorted_pg, 0.0)
        suffix_pg = jnp.cumsum(weighted_pg[:, ::-1], axis=1)[:, ::-1]
        later_pg = jnp.pad(suffix_pg[:, 1:], ((0, 0), (0, 1)))  # Σ over j > i
        adv_sorted_pg = a_pg * sorted_pg + later_pg
    adv_pg = jnp.take_along_axis(adv_sorted_pg, jnp.argsort(order_pg, axis=1), axis=1)
    return jnp.where(valid_pg, adv_pg + shaping_pg, 0.0)


def passk_training(
    rewards_pg: chex.Array,
    valid_pg: chex.Array | None = None,
    *,
    k,
    success_pg: chex.Array | None = None,
    success_threshold: float = 0.5,
    max_k: int | None = None,
) -> jnp.ndarray:
    """Pass@k Training's analytical group advantage (Chen et al., arXiv 2508.10751).

    With n valid samples of a prompt, c of them correct (value ≥ ``success_threshold``):

      R̄ = ρ(n, c, k) = 1 − C(n−c, k)/C(n, k),   σ = √(R̄(1 − R̄)),
      Â_pos = (1 − R̄)/σ,   Â_neg = (1 − R̄ − C(n−c−1, k−1)/C(n−1, k−1))/σ,

    and every advantage is 0 when c = 0 or n − c < k (R̄ ∈ {0, 1}). Evaluated with
    q = C(n−c−1, k−1)/C(n−1, k−1) from ``log_comb_ratio``: 1 − R̄ = ((n−c)/n)·q and
    Â_neg = −(c/n)·q/σ, so nothing cancels. At k = 1 this is GRPO with the population
    std, (R − p̂)/√(p̂(1−p̂)); at k = n every group gets 0. A group with n < k valid
    samples uses k = n.

    Args:
      rewards_pg: float [P, G] rewards (binarised at the threshold unless ``success_pg``).
      valid_pg: optional bool [P, G].
      k: the k of pass@k, a Python int or an int32 scalar (traced is fine).
      success_pg: optional float [P, G] verifier outcomes: c counts success ≥ threshold
        and the shaping part rewards − success gets a plain group-mean baseline.
      success_threshold: a value ≥ this is correct.
      max_k: static bound on k (default: k itself, when k is concrete).

    Returns:
      float32 [P, G], 0 where invalid.
    """
    values_pg, valid_pg, shaping_pg = _objective_inputs(
        rewards_pg, valid_pg, success_pg, "passk_training")
    correct_pg = valid_pg & (values_pg >= success_threshold)
    count_p = jnp.sum(valid_pg, axis=1).astype(jnp.int32)
    k_p, max_k = _group_k(k, count_p, max_k, values_pg.shape[1], "passk_training")
    n_p = count_p.astype(jnp.float32)
    c_p = jnp.sum(correct_pg, axis=1).astype(jnp.float32)
    q_p = jnp.exp(log_comb_ratio(jnp.maximum(n_p - 1.0 - c_p, 0.0), jnp.maximum(n_p - 1.0, 0.0),
                                 k_p - 1.0, max_terms=max_k - 1))
    n_safe_p = jnp.maximum(n_p, 1.0)
    miss_p = (n_p - c_p) / n_safe_p * q_p  # 1 − R̄
    informative_p = (c_p > 0.0) & (n_p - c_p >= k_p)
    std_p = jnp.sqrt(jnp.where(informative_p, (1.0 - miss_p) * miss_p, 1.0))
    pos_p = miss_p / std_p
    neg_p = -(c_p / n_safe_p) * q_p / std_p
    adv_pg = jnp.where(correct_pg, pos_p[:, None], neg_p[:, None])
    adv_pg = jnp.where(informative_p[:, None], adv_pg, 0.0)
    return jnp.where(valid_pg, adv_pg + shaping_pg, 0.0)


def annealed_k(step, *, k: int, k_end: int | None = None, anneal_steps: int = 0) -> jnp.ndarray:
    """The k of an annealed pass@k objective at batch ``step`` (PKPO anneals k; arXiv 2505.15201).

      k_t = k + round((k_end − k) · min(t, anneal_steps)/anneal_steps)   (halves round up),

    k throughout when ``k_end`` is None or ``anneal_steps`` is 0, then k_end from step
    ``anneal_steps`` on. Jittable: ``step`` may be traced.

    Returns:
      int32 scalar.
    """
    step = jnp.asarray(step, jnp.int32)
    if k_end is None or k_end == k or anneal_steps < 1:
        return jnp.full((), k, jnp.int32)
    progress = jnp.clip(step, 0, anneal_steps).astype(jnp.float32) / float(anneal_steps)
    return (k + jnp.floor((k_end - k) * progress + 0.5)).astype(jnp.int32)


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
