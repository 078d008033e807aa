"""Step-level credit: per-turn intermediate signals on top of the outcome advantage (SPEC §6b).

An episode's outcome advantage A_b is broadcast over its policy tokens; a step-level term
adds, on the tokens of each model turn k, a group-relative bonus for each intermediate
signal n of that turn (a tool call parsed, ran without error, its code compiled, the
fraction of tests passed):

    adv_{b,t} = A_b + Σ_n c_n · (s_{b,k(t),n} − s̄_{p(b),n})      for loss-mask tokens t
    s̄_{p,n}   = mean of s_{b',k',n} over the valid samples b' of group p and their turns k'
                where signal n applies

with s ∈ [0, 1] and NaN where a signal does not apply (a turn without a tool call has no
"tool ran" signal): such terms are 0, so is every term of a group whose applicable values
are all equal. It is MT-GRPO's turn-level advantage (Zeng et al., arXiv 2505.11821) with
the turn rewards' group mean as baseline and no std scaling (Dr.GRPO, arXiv 2503.20783),
and DeepSeekMath's process supervision (arXiv 2402.03300 §4.1.3) at the grain of turns.

``signal_stats`` gives what the run logs per signal: its mean over the turns where it
applies and its Pearson correlation with the final verdict over the episodes that have it.
"""

from __future__ import annotations

import chex
import jax.numpy as jnp
import numpy as np

__all__ = ["signal_stats", "step_credit"]


def step_credit(signals_bkn, turn_bt, loss_mask_bt, valid_pg, coef_n):
    """The step-level term of the per-token advantage (add it to the outcome's broadcast).

    Args:
      signals_bkn: float [B, K, N] signal n of model turn k of sample b, in [0, 1]; NaN
        where it does not apply or the turn does not exist.
      turn_bt: int [B, T] the model turn of each token (−1 for environment tokens and padding).
      loss_mask_bt: bool [B, T] the policy's tokens (credit lands only there).
      valid_pg: bool [P, G] real samples (B = P·G, prompt-major); others give and get nothing.
      coef_n: float [N] c_n per signal (0 = that signal ablated).

    Returns:
      credit_bt float32 [B, T]: Σ_n c_n·(s_{b,k(t),n} − s̄_{p,n}), 0 off the loss mask, on
      invalid samples and where the signal does not apply.
    """
    chex.assert_rank([signals_bkn, turn_bt, loss_mask_bt, valid_pg, coef_n], [3, 2, 2, 2, 1])
    chex.assert_equal_shape([turn_bt, loss_mask_bt])
    num_p, num_g = valid_pg.shape
    num_b, num_k, num_n = signals_bkn.shape
    chex.assert_axis_dimension(turn_bt, 0, num_b)
    chex.assert_axis_dimension(coef_n, 0, num_n)
    chex.assert_equal(num_b, num_p * num_g)
    signals_pgkn = jnp.asarray(signals_bkn, jnp.float32).reshape(num_p, num_g, num_k, num_n)
    applies_pgkn = ~jnp.isnan(signals_pgkn) & jnp.asarray(valid_pg, bool)[:, :, None, None]
    values_pgkn = jnp.where(applies_pgkn, signals_pgkn, 0.0)
    count_pn = applies_pgkn.sum(axis=(1, 2))
    baseline_pn = values_pgkn.sum(axis=(1, 2)) / jnp.maximum(count_pn, 1)
    centred_pgkn = jnp.where(applies_pgkn, values_pgkn - baseline_pn[:, None, None, :], 0.0)
    turn_credit_bk = jnp.einsum("pgkn,n->pgk", centred_pgkn, jnp.asarray(coef_n, jnp.float32)).reshape(num_b, num_k)
    turn_bt = jnp.asarray(turn_bt, jnp.int32)
    on_turn_bt = jnp.asarray(loss_mask_bt, bool) & (turn_bt >= 0) & (turn_bt < num_k)
    credit_bt = jnp.take_along_axis(turn_credit_bk, jnp.clip(turn_bt, 0, num_k - 1), axis=1)
    return jnp.where(on_turn_bt, credit_bt, 0.0).astype(jnp.float32)


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson's r of paired samples; NaN with fewer than 2 pairs or a constant side."""
    if x.size < 2:
        return float("nan")
    dx, dy = x - x.mean(), y - y.mean()
    denom = np.sqrt((dx * dx).sum() * (dy * dy).sum())
    return float((dx * dy).sum() / denom) if denom > 0 else float("nan")


def signal_stats(signals_bkn, verdict_b, valid_b) -> tuple[np.ndarray, np.ndarray]:
    """Per signal: the mean over turns where it applies, and its correlation with the verdict.

    Args:
      signals_bkn: float [B, K, N] as in ``step_credit`` (NaN = does not apply).
      verdict_b: bool [B] the episode succeeded (score >= the success threshold).
      valid_b: bool [B] real samples.

    Returns:
      (mean_n, corr_n) float64 [N]: mean_n over valid turns where signal n applies;
      corr_n Pearson's r between an episode's signal (its mean over the turns where it
      applies) and its verdict, over valid episodes with the signal. NaN where undefined
      (no such turn; fewer than two episodes; a constant signal or verdict).
    """
    signals_bkn = np.asarray(signals_bkn, np.float64)
    valid_b, verdict_b = np.asarray(valid_b, bool), np.asarray(verdict_b, np.float64)
    applies_bkn = ~np.isnan(signals_bkn) & valid_b[:, None, None]
    values_bkn = np.where(applies_bkn, signals_bkn, 0.0)
    turns_n, episodes_bn = applies_bkn.sum(axis=(0, 1)), applies_bkn.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_n = np.where(turns_n > 0, values_bkn.sum(axis=(0, 1)) / np.maximum(turns_n, 1), np.nan)
        episode_bn = values_bkn.sum(axis=1) / np.maximum(episodes_bn, 1)
    corr_n = np.array([_pearson(episode_bn[episodes_bn[:, n] > 0, n], verdict_b[episodes_bn[:, n] > 0])
                       for n in range(signals_bkn.shape[2])])
    return mean_n, corr_n
