"""Group-relative advantages for RLVR (SPEC §3.1-3.3).

Every function takes ``rewards_pg`` float [P, G] (P prompts, G samples each) and an
optional ``valid_pg`` bool [P, G] for ragged groups, and returns ``adv_pg`` float32
[P, G] that is exactly zero where invalid. Per prompt, K is the number of valid samples
and R̄ their mean. Degenerate groups (all rewards equal, K = 1, K = 0) give zeros, never
NaN. All functions are pure and jit-compatible; string/int options are static.

CurveRL keeps a sliding window of past pass rates; it is an (init, update) pair over the
fixed-shape NamedTuple ``CurveRLState`` (``curverl_init`` / ``curverl``).
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_vr import weighting

Array = chex.Array


class GroupStats(NamedTuple):
    """Per-prompt statistics over the valid samples of each group."""

    count_p: jnp.ndarray  # float32 [P]: K, the number of valid samples
    mean_p: jnp.ndarray  # float32 [P]: R̄ (0 when K = 0)
    centred_pg: jnp.ndarray  # float32 [P, G]: R_i − R̄; 0 where invalid or group constant
    std_p: jnp.ndarray  # float32 [P]: unbiased std √(Σ(R_i − R̄)²/(K − 1)); 0 when K < 2


def _prepare(rewards_pg: Array, valid_pg: Array | None, name: str):
    """Checks shapes statically; returns (float32 rewards, bool mask)."""
    chex.assert_rank(rewards_pg, 2)
    rewards_pg = jnp.asarray(rewards_pg, jnp.float32)
    if valid_pg is None:
        return rewards_pg, jnp.ones(rewards_pg.shape, bool)
    valid_pg = jnp.asarray(valid_pg)
    if valid_pg.dtype != jnp.bool_:
        raise TypeError(
            f"{name}: valid_pg must be a bool mask (True = counts), got dtype "
            f"{valid_pg.dtype}; pass `valid_pg.astype(bool)`.")
    chex.assert_equal_shape([rewards_pg, valid_pg])
    return rewards_pg, valid_pg


def group_stats(rewards_pg: Array, valid_pg: Array | None = None) -> GroupStats:
    """K, R̄, centred rewards and unbiased std per prompt over valid samples.

    A group whose valid rewards are all equal (including K ≤ 1) gets centred values of
    exactly 0 (no rounding residue), so every advantage built on them is 0 there.
    """
    rewards_pg, valid_pg = _prepare(rewards_pg, valid_pg, "group_stats")
    count_p = jnp.sum(valid_pg, axis=1).astype(jnp.float32)
    mean_p = jnp.sum(jnp.where(valid_pg, rewards_pg, 0.0), axis=1) / jnp.maximum(count_p, 1.0)
    high_p = jnp.max(jnp.where(valid_pg, rewards_pg, -jnp.inf), axis=1)
    low_p = jnp.min(jnp.where(valid_pg, rewards_pg, jnp.inf), axis=1)
    varying_p = high_p > low_p  # False for K = 0 (-inf > inf) and for K = 1
    keep_pg = valid_pg & varying_p[:, None]
    centred_pg = jnp.where(keep_pg, rewards_pg - mean_p[:, None], 0.0)
    var_p = jnp.sum(centred_pg * centred_pg, axis=1) / jnp.maximum(count_p - 1.0, 1.0)
    return GroupStats(count_p, mean_p, centred_pg, jnp.sqrt(var_p))


def _safe_divide(centred_pg: jnp.ndarray, denominator: jnp.ndarray) -> jnp.ndarray:
    """centred / denominator, and 0 where the denominator is 0 (e.g. eps=0, constant group)."""
    nonzero = denominator != 0.0
    return jnp.where(nonzero, centred_pg / jnp.where(nonzero, denominator, 1.0), 0.0)


REINFORCE_BASELINES = ("mean", "none")


def reinforce(rewards_pg: Array, valid_pg: Array | None = None, *,
              baseline: str = "mean") -> jnp.ndarray:
    """REINFORCE advantage: the prompt weight w(p) = 1 of SPEC §3.2.

      baseline="mean": A_i = R_i − R̄ over the group's valid samples (the same values as
                       Dr.GRPO); a lone valid sample (K = 1) has no baseline to subtract and
                       keeps R_i, so one sample per prompt still learns.
      baseline="none": A_i = R_i (textbook REINFORCE).

    Args:
      rewards_pg: float [P, G] rewards.
      valid_pg: optional bool [P, G].
      baseline: "mean" or "none" (static).

    Returns:
      float32 [P, G], zero where invalid (and for constant groups with "mean").
    """
    if baseline not in REINFORCE_BASELINES:
        raise ValueError(f"reinforce: baseline must be one of {REINFORCE_BASELINES}, got {baseline!r}.")
    rewards_pg, valid_pg = _prepare(rewards_pg, valid_pg, "reinforce")
    if baseline == "none":
        return jnp.where(valid_pg, rewards_pg, 0.0)
    stats = group_stats(rewards_pg, valid_pg)
    lone_p = stats.count_p < 2.0
    return jnp.where(valid_pg & lone_p[:, None], rewards_pg, stats.centred_pg)


def grpo(
    rewards_pg: Array,
    valid_pg: Array | None = None,
    *,
    scale: str = "std",
    eps: float = 1e-6,
) -> jnp.ndarray:
    """GRPO group-normalised advantage (DeepSeekMath, arXiv 2402.03300).

      scale="std":  A_i = (R_i − R̄) / (σ + eps),  σ = √(Σ_j (R_j − R̄)² / (K − 1))
                    (unbiased std, as verl and Tunix compute it)
      scale="none": A_i = R_i − R̄  (Dr.GRPO, arXiv 2503.20783)

    Args:
      rewards_pg: float [P, G] rewards.
      valid_pg: optional bool [P, G]; invalid samples are ignored and get 0.
      scale: "std" or "none" (static).
      eps: added to σ.

    Returns:
      float32 [P, G]; 0 for invalid samples and for constant / K ≤ 1 groups.
    """
    if scale not in ("std", "none"):
        raise ValueError(f"grpo: scale must be 'std' or 'none', got {scale!r}.")
    stats = group_stats(*_prepare(rewards_pg, valid_pg, "grpo"))
    if scale == "none":
        return stats.centred_pg
    return _safe_divide(stats.centred_pg, stats.std_p[:, None] + eps)


def loo(rewards_pg: Array, valid_pg: Array | None = None) -> jnp.ndarray:
    """Leave-one-out (RLOO) advantage (Ahmadian et al., arXiv 2402.14740).

      A_i = R_i − (1/(K−1)) Σ_{j≠i} R_j = K/(K−1) · (R_i − R̄),   0 when K < 2.

    Args:
      rewards_pg: float [P, G] rewards.
      valid_pg: optional bool [P, G].

    Returns:
      float32 [P, G].
    """
    stats = group_stats(*_prepare(rewards_pg, valid_pg, "loo"))
    factor_p = stats.count_p / jnp.maximum(stats.count_p - 1.0, 1.0)
    return jnp.where(stats.count_p[:, None] >= 2.0, factor_p[:, None] * stats.centred_pg, 0.0)


def maxrl(
    rewards_pg: Array,
    valid_pg: Array | None = None,
    *,
    success_pg: Array | None = None,
    eps: float = 1e-6,
    num_samples: int | None = None,
) -> jnp.ndarray:
    """MaxRL advantage (Tajwar et al., arXiv 2602.02710), safe under reward shaping.

    Without ``success_pg`` (rewards are the success values, in [0, 1]):

      A_i = (R_i − R̄)/(R̄ + eps)   if R̄ > 0,   else 0.

    This is the prompt weight w(p̂) = 1/p̂ (``weighting.maxrl_weight``) times R_i − R̄. A
    group whose mean reward is ≤ 0 (possible only with shaped or negative rewards) gets
    0: dividing by R̄ ≈ 0 there would give arbitrarily large advantages (e.g. ±5·10⁵ for
    [−0.5, 0.5, 0, 0]) and dividing by R̄ < 0 would flip their sign.

    With ``success_pg`` s (verifier outcomes in [0, 1]; the reward is s plus shaping
    terms such as an overlong or hack penalty), the two parts are kept apart:

      A_i = (s_i − s̄)/(s̄ + eps)  +  (h_i − h̄),     h = R − s  (the shaping part),

    i.e. MaxRL's 1/p̂ weight on the success part (0 for a group with no success, s̄ = 0)
    and a plain baseline-subtracted advantage on the shaping part, both centred over the
    group's valid samples. Rewards [−1, 0, 0, 0] with successes [0, 0, 0, 0] give
    [−0.75, 0.25, 0.25, 0.25]; nothing is ever divided by a shaped mean.

    ``num_samples=T`` replaces 1/p̂ by MaxRL's T-sample truncation
    w_T(p̂) = (1 − (1 − p̂)^T)/p̂ (``weighting.maxrl_weight``; the utility is the pass@T
    objective): T = 1 is Dr.GRPO's R − R̄, T → ∞ the untruncated weight. It is finite at
    every p̂, so ``eps`` is not used then.

    Args:
      rewards_pg: float [P, G] rewards (shaped, when ``success_pg`` is given).
      valid_pg: optional bool [P, G].
      success_pg: optional float [P, G] verifier outcomes in [0, 1] (clipped to it).
      eps: added to the mean success (or mean reward) in the denominator.
      num_samples: T ≥ 1 of the truncated weight, or None for 1/(p̂ + eps) (static).

    Returns:
      float32 [P, G]; 0 where invalid and for constant / K ≤ 1 groups.
    """
    rewards_pg, valid_pg = _prepare(rewards_pg, valid_pg, "maxrl")

    def weighted(stats: GroupStats) -> jnp.ndarray:
        positive_p = stats.mean_p > 0.0
        if num_samples is None:
            denominator_p = jnp.where(positive_p, stats.mean_p + eps, 0.0)
            return _safe_divide(stats.centred_pg, denominator_p[:, None])
        weight_p = weighting.maxrl_weight(jnp.clip(stats.mean_p, 0.0, 1.0), num_samples=num_samples)
        return jnp.where(positive_p, weight_p, 0.0)[:, None] * stats.centred_pg

    if success_pg is None:
        return weighted(group_stats(rewards_pg, valid_pg))
    chex.assert_equal_shape([rewards_pg, success_pg])
    success_pg = jnp.clip(jnp.asarray(success_pg, jnp.float32), 0.0, 1.0)
    success_adv_pg = weighted(group_stats(success_pg, valid_pg))
    shaping_adv_pg = group_stats(rewards_pg - success_pg, valid_pg).centred_pg
    return success_adv_pg + shaping_adv_pg


def prompt_weighted(
    rewards_pg: Array, weight_p: Array, valid_pg: Array | None = None
) -> jnp.ndarray:
    """Prompt-weighted advantage A_{x,i} = w_x · (R_{x,i} − R̄_x) (SPEC §3.2).

    With w from ``jaxrl_vr.weighting`` this gives REINFORCE-with-baseline (w = 1), GRPO in
    population form (w = 1/√(p(1−p))), MaxRL (w = 1/p) or any other utility's weight
    (CurveRL, Sun, Zhao et al., arXiv 2605.24331).

    Args:
      rewards_pg: float [P, G] rewards.
      weight_p: float [P] per-prompt weights.
      valid_pg: optional bool [P, G].

    Returns:
      float32 [P, G].
    """
    rewards_pg, valid_pg = _prepare(rewards_pg, valid_pg, "prompt_weighted")
    chex.assert_shape(weight_p, (rewards_pg.shape[0],))
    stats = group_stats(rewards_pg, valid_pg)
    weighted_pg = jnp.asarray(weight_p, jnp.float32)[:, None] * stats.centred_pg
    # Exactly 0 where the centred reward is (invalid or degenerate), even for w = inf.
    return jnp.where(stats.centred_pg != 0.0, weighted_pg, 0.0)


# ----------------------------------------------------------------------------- CurveRL


class CurveRLState(NamedTuple):
    """Sliding window of the last ``window`` batches' pass rates (a ring buffer).

    Row s holds one past batch; ``next_slot`` is the row the next batch overwrites (the
    oldest one). Only entries with 0 < p̂ < 1 are marked valid. Save it with checkpoints.
    """

    window_p_wn: jnp.ndarray  # float32 [window, num_prompts]: past p̂ (0 where invalid)
    window_valid_wn: jnp.ndarray  # bool [window, num_prompts]: entry is in the reference
    next_slot: jnp.ndarray  # int32 []: row written by the next update
    num_updates: jnp.ndarray  # int32 []: batches seen so far (diagnostic)


def curverl_init(num_prompts: int, *, window: int = 10) -> CurveRLState:
    """Empty CurveRL window for batches of up to ``num_prompts`` prompts.

    Args:
      num_prompts: static width; every batch must have P ≤ num_prompts.
      window: t₀, the number of past batches kept (≥ 0; 0 = reference is always the
        current batch, as in the authors' code).

    Returns:
      CurveRLState with all entries invalid.
    """
    if int(num_prompts) < 1:
        raise ValueError(f"curverl_init: num_prompts must be >= 1, got {num_prompts}.")
    if int(window) < 0:
        raise ValueError(f"curverl_init: window must be >= 0, got {window}.")
    shape = (int(window), int(num_prompts))
    return CurveRLState(
        window_p_wn=jnp.zeros(shape, jnp.float32),
        window_valid_wn=jnp.zeros(shape, bool),
        next_slot=jnp.zeros((), jnp.int32),
        num_updates=jnp.zeros((), jnp.int32),
    )


def _curverl_successes(rewards_pg: jnp.ndarray, valid_pg: jnp.ndarray) -> jnp.ndarray:
    """Rewards as success values: unchanged if all valid ones lie in [0, 1], else R > 0.

    This is the authors' mapping (decided once per batch).
    """
    in_unit = (rewards_pg >= 0.0) & (rewards_pg <= 1.0)
    batch_in_unit = jnp.all(in_unit | ~valid_pg)
    return jnp.where(batch_in_unit, rewards_pg, (rewards_pg > 0.0).astype(jnp.float32))


def curverl(
    rewards_pg: Array,
    state: CurveRLState,
    valid_pg: Array | None = None,
    *,
    success_pg: Array | None = None,
    num_bins: int | None = None,
    eps: float = weighting.CURVERL_EPS,
) -> tuple[jnp.ndarray, CurveRLState]:
    """CurveRL advantage with its lagged reference window (Sun, Zhao et al., arXiv 2605.24331).

    As in the authors' code (zhyzmath/CurveRL), for one training batch:
      1. p̂_x = mean of prompt x's valid rewards (rewards are used as success values
         when every valid reward lies in [0, 1], else binarised as R > 0).
      2. bin(v) = clip(floor(v · num_bins), 0, num_bins − 1), num_bins = max(G + 1, 2).
      3. Reference = valid p̂ ∈ (0, 1) of the previous ``window`` batches; if the window
         holds none, the current batch's p̂ ∈ (0, 1).
      4. bin_weight = mass / max(cdf, eps) of the reference histogram.
      5. w_x = bin_weight[bin(p̂_x)] if 0 < p̂_x < 1 else 0.
      6. A_{x,i} = w_x · (R_{x,i} − p̂_x).
      7. Write this batch's p̂ ∈ (0, 1) into the oldest window row (evicting it).

    The utility is u = log F_ref(p), so w = f_ref/F_ref, a reverse hazard rate.

    Ragged groups: the authors size the histogram by the largest valid group of the batch;
    here num_bins defaults to the static max(G + 1, 2) (the same whenever one prompt has
    all G samples valid); pass ``num_bins`` to override. A batch with P < num_prompts is
    padded with invalid prompts (they neither get weight nor enter the window).

    Args:
      rewards_pg: float [P, G] rewards, P ≤ the state's num_prompts.
      state: CurveRLState from ``curverl_init`` or a previous call.
      valid_pg: optional bool [P, G].
      success_pg: optional float [P, G] verifier outcomes in [0, 1] (e.g. the verifier
        score before an overlong or hack penalty is added to the reward). When given,
        p̂, the histogram and the window use it, and step 6 becomes w_x · (R − R̄) on the
        shaped rewards, so a penalty term keeps its effect. Default: derived from the
        rewards as in the authors' code (step 1).
      num_bins: static histogram size (default max(G + 1, 2)).
      eps: floor of the histogram mass sum and CDF.

    Returns:
      (adv_pg float32 [P, G], new_state).
    """
    rewards_pg, valid_pg = _prepare(rewards_pg, valid_pg, "curverl")
    if success_pg is not None:
        chex.assert_equal_shape([rewards_pg, success_pg])
    num_p, group = rewards_pg.shape
    chex.assert_rank([state.window_p_wn, state.window_valid_wn], 2)
    chex.assert_equal_shape([state.window_p_wn, state.window_valid_wn])
    window, width = state.window_p_wn.shape
    if num_p > width:
        raise ValueError(
            f"curverl: batch has {num_p} prompts but the state holds {width}; build the "
            f"state with curverl_init(num_prompts>={num_p}, window=...).")
    num_bins = weighting.curverl_num_bins(group) if num_bins is None else int(num_bins)

    if success_pg is None:
        successes_pg = _curverl_successes(rewards_pg, valid_pg)
    else:
        successes_pg = jnp.clip(jnp.asarray(success_pg, jnp.float32), 0.0, 1.0)
    stats = group_stats(successes_pg, valid_pg)
    p_hat_p = stats.mean_p  # sum / max(K, 1), as the authors compute it
    centred_pg = stats.centred_pg
    if success_pg is not None:  # step 6 on the shaped rewards
        centred_pg = group_stats(rewards_pg, valid_pg).centred_pg
    enters_p = (stats.count_p > 0.0) & (p_hat_p > 0.0) & (p_hat_p < 1.0)

    pad = width - num_p
    current_p_n = jnp.pad(p_hat_p, (0, pad))
    current_valid_n = jnp.pad(enters_p, (0, pad))

    current_weight_b = weighting.curverl_bin_weights(
        current_p_n, current_valid_n, num_bins=num_bins, eps=eps)
    if window > 0:
        window_weight_b = weighting.curverl_bin_weights(
            state.window_p_wn, state.window_valid_wn, num_bins=num_bins, eps=eps)
        has_reference = jnp.any(state.window_valid_wn)
        bin_weight_b = jnp.where(has_reference, window_weight_b, current_weight_b)
    else:
        bin_weight_b = current_weight_b

    weight_p = jnp.where(
        enters_p, weighting.curverl_prompt_weights(p_hat_p, bin_weight_b), 0.0)
    adv_pg = weight_p[:, None] * centred_pg

    if window > 0:
        slot = state.next_slot
        new_state = CurveRLState(
            window_p_wn=state.window_p_wn.at[slot].set(
                jnp.where(current_valid_n, current_p_n, 0.0)),
            window_valid_wn=state.window_valid_wn.at[slot].set(current_valid_n),
            next_slot=((slot + 1) % window).astype(jnp.int32),
            num_updates=(state.num_updates + 1).astype(jnp.int32),
        )
    else:
        new_state = state._replace(num_updates=(state.num_updates + 1).astype(jnp.int32))
    return adv_pg, new_state


# ------------------------------------------------------------------ Weighted GRPO pairs


def pair_weighted(
    rewards_2g: Array,
    *,
    neg_weight,
    scope: str = "group",
    valid_2g: Array | None = None,
    success_threshold: float = 0.5,
    eps: float = 1e-6,
) -> jnp.ndarray:
    """Weighted GRPO advantage for a positive/negative prompt pair (arXiv 2602.03452).

    Row 0 is the q⁺ group (hard but solvable), row 1 the q⁻ group (easy but brittle). A
    sample succeeds when R ≥ ``success_threshold``; s ∈ {0, 1} is its success bit.

      scope="group" (default, the paper's "group-normalized advantages"): z-score the
          success bits within each group with the unbiased (K − 1) std, then apply the
          pair-level row weights:  A = w_row · (s − s̄)/(σ + eps),  w = [1, λ] for a
          scalar λ, or w = [λ⁺, λ⁻] for a per-row λ. A lone success among 8 on q⁺ gets
          (7/8)/√(1/8) ≈ +2.47 (a sharp positive signal), a lone failure among 8 on q⁻
          gets λ·(−2.47) (a strong penalty); λ scales the q⁻ group's update.
      scope="pair": outcomes y = +1 (success) / −λ_row (failure), z-scored over both
          groups pooled: A = (y − ȳ)/(σ + eps).
      scope="mean": the same outcomes y, pooled mean only: A = y − ȳ.

    Caution for the pooled scopes: with one scalar λ, y = (1+λ)·s − λ is an increasing
    affine map of the success bit, so pooled z-scoring ("pair") cancels λ exactly, and
    "mean" only scales A by (1+λ). There, λ changes the direction of the update only
    through per-row values (λ⁺ ≠ λ⁻). That is why "group" with row weights is the default.

    Args:
      rewards_2g: float [2, G], or a batch of pairs [N, 2, G].
      neg_weight: λ ≥ 0: Python float, scalar array, or [2] array (per row). Arrays are
        traced, so changing them does not recompile.
      scope: "group", "pair" or "mean" (static).
      valid_2g: optional bool mask of rewards_2g's shape.
      success_threshold: a reward ≥ this counts as a success.
      eps: added to σ.

    Returns:
      float32 advantages of rewards_2g's shape; zero where invalid and for groups
      ("group") or pools ("pair", "mean") whose outcomes are all equal.
    """
    if scope not in ("pair", "group", "mean"):
        raise ValueError(f"pair_weighted: scope must be 'group', 'pair' or 'mean', got {scope!r}.")
    if not isinstance(neg_weight, jax.Array) and np.any(np.asarray(neg_weight) < 0):
        raise ValueError(f"pair_weighted: neg_weight must be >= 0, got {neg_weight}.")
    rewards = jnp.asarray(rewards_2g, jnp.float32)
    if rewards.ndim not in (2, 3) or rewards.shape[-2] != 2:
        raise ValueError(
            f"pair_weighted: rewards_2g must have shape [2, G] or [N, 2, G] (row 0 = q+ "
            f"group, row 1 = q- group), got {rewards.shape}.")
    valid = jnp.ones(rewards.shape, bool) if valid_2g is None else jnp.asarray(valid_2g)
    if valid.dtype != jnp.bool_:
        raise TypeError(f"pair_weighted: valid_2g must be bool, got {valid.dtype}.")
    chex.assert_equal_shape([rewards, valid])
    shape = rewards.shape
    group = shape[-1]
    neg = jnp.asarray(neg_weight, jnp.float32)
    if neg.shape not in ((), (2,)):
        raise ValueError(
            f"pair_weighted: neg_weight must be a scalar or shape [2] (q+ row, q- row), "
            f"got shape {neg.shape}.")
    success = (rewards >= success_threshold).astype(jnp.float32)

    if scope == "group":
        # Scalar λ weights only the q⁻ row; a [2] λ weights each row.
        row_weight = jnp.stack([jnp.float32(1.0), neg]) if neg.ndim == 0 else neg
        row_weight = row_weight[:, None] if rewards.ndim == 2 else row_weight[None, :, None]
        stats = group_stats(success.reshape(-1, group), valid.reshape(-1, group))
        adv = _safe_divide(stats.centred_pg, stats.std_p[:, None] + eps).reshape(shape)
        return row_weight * adv

    neg_row = jnp.broadcast_to(neg, (2,))[:, None]  # [2, 1]: λ per row
    if rewards.ndim == 3:
        neg_row = neg_row[None]
    outcome = jnp.where(success > 0.0, jnp.float32(1.0), -neg_row)
    stats = group_stats(outcome.reshape(-1, 2 * group), valid.reshape(-1, 2 * group))
    if scope == "mean":
        adv = stats.centred_pg
    else:
        adv = _safe_divide(stats.centred_pg, stats.std_p[:, None] + eps)
    return adv.reshape(shape)
