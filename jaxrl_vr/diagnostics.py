"""Per-step diagnostics of a training batch (host NumPy): prompt weights, the prompt
distribution that reached the update, groups with exactly one positive sample.

- Prompt weight w_x: the least-squares slope of a group's advantages on its centred
  rewards, w_x = Σ_i A_{x,i}(R_{x,i} − R̄_x) / Σ_i (R_{x,i} − R̄_x)² over the valid samples
  (defined where the rewards vary). Every estimator of the form A = w(p)·(R − R̄)
  (``jaxrl_vr.weighting``: REINFORCE w = 1, GRPO 1/√(p(1−p)), MaxRL 1/p, CurveRL's
  reverse hazard, arXiv 2605.24331) gives back its own w exactly; others give the w of
  the best such fit. Effective sample size ESS = (Σ|w|)² / Σw² over those prompts (= their
  count when all weights are equal, → 1 when one prompt takes all the weight: CurveRL's
  weight collapse), and max|w| / mean|w|.
- Success bins: fractions of the batch's prompts whose success rate lies in each of
  ``SUCCESS_BINS``: exactly 0, (0, 0.25], (0.25, 0.5], (0.5, 0.75], (0.75, 1), exactly 1
  (the two ends are the groups without a learning signal).
- One-positive fraction: groups with exactly one successful valid sample, over the groups
  with a valid sample.

``Histogram`` marks values a metrics writer logs as a histogram (TensorBoard), not a scalar.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["Histogram", "SUCCESS_BINS", "one_positive_frac", "prompt_weights", "success_bins",
           "weight_stats"]

# (name, low, high, low included, high included): the ends are exactly 0 and exactly 1.
_BINS = (("0", 0.0, 0.0, True, True), ("0-0.25", 0.0, 0.25, False, True),
         ("0.25-0.5", 0.25, 0.5, False, True), ("0.5-0.75", 0.5, 0.75, False, True),
         ("0.75-1", 0.75, 1.0, False, False), ("1", 1.0, 1.0, True, True))
SUCCESS_BINS = tuple(name for name, *_ in _BINS)


class Histogram(NamedTuple):
    """Values (1-D) to log as a histogram (``MetricsWriter``); not written to metrics.jsonl."""

    values: np.ndarray


def prompt_weights(adv_pg, rewards_pg, valid_pg) -> tuple[np.ndarray, np.ndarray]:
    """Each prompt's weight w_x (module docstring) and where it is defined.

    Args:
      adv_pg: float [P, G] per-sample advantages (e.g. the mean of a sample's token advantages).
      rewards_pg: float [P, G] the rewards the advantages were built from.
      valid_pg: bool [P, G] real samples.

    Returns:
      (weight_p float64 [P] (0 where undefined), defined_p bool [P]: the group's valid
      rewards vary).
    """
    adv_pg, rewards_pg = np.asarray(adv_pg, np.float64), np.asarray(rewards_pg, np.float64)
    valid_pg = np.asarray(valid_pg, bool)
    if not adv_pg.shape == rewards_pg.shape == valid_pg.shape or adv_pg.ndim != 2:
        raise ValueError(f"adv_pg, rewards_pg and valid_pg must share one [P, G] shape, got "
                         f"{adv_pg.shape}, {rewards_pg.shape}, {valid_pg.shape}.")
    count_p = valid_pg.sum(axis=1)
    mean_p = np.where(valid_pg, rewards_pg, 0.0).sum(axis=1) / np.maximum(count_p, 1)
    centred_pg = np.where(valid_pg, rewards_pg - mean_p[:, None], 0.0)
    spread_p = np.square(centred_pg).sum(axis=1)
    defined_p = spread_p > 1e-12
    covariance_p = (np.where(valid_pg, adv_pg, 0.0) * centred_pg).sum(axis=1)
    weight_p = np.where(defined_p, covariance_p / np.where(defined_p, spread_p, 1.0), 0.0)
    return weight_p, defined_p


def weight_stats(weight_p, defined_p, prefix: str = "prompt_weights") -> dict[str, float]:
    """``{prefix}/ess``, ``/ess_frac`` (ESS over the prompts with a weight), ``/max_over_mean``
    and ``/prompts`` (how many have one) of |w| (NaN where undefined; ESS 0 when every
    weight is 0)."""
    w = np.abs(np.asarray(weight_p, np.float64)[np.asarray(defined_p, bool)])
    count = int(w.size)
    square = float(np.square(w).sum())
    ess = float(w.sum()) ** 2 / square if square > 0 else 0.0
    mean = float(w.mean()) if count else 0.0
    return {f"{prefix}/ess": ess,
            f"{prefix}/ess_frac": ess / count if count else float("nan"),
            f"{prefix}/max_over_mean": float(w.max()) / mean if mean > 0 else float("nan"),
            f"{prefix}/prompts": float(count)}


def success_bins(rate_p, keep_p, prefix: str) -> dict[str, object]:
    """``{prefix}/<bin>``: the fraction of kept prompts whose rate lies in each bin of
    ``SUCCESS_BINS`` (0 when none is kept), and ``{prefix}`` itself: their rates as a
    ``Histogram``."""
    rate = np.asarray(rate_p, np.float64)[np.asarray(keep_p, bool)]
    out: dict[str, object] = {}
    for name, low, high, low_in, high_in in _BINS:
        above = rate >= low if low_in else rate > low
        below = rate <= high if high_in else rate < high
        out[f"{prefix}/{name}"] = float((above & below).sum()) / rate.size if rate.size else 0.0
    out[prefix] = Histogram(rate)
    return out


def one_positive_frac(success_pg, valid_pg) -> float:
    """Groups with exactly one successful valid sample / groups with a valid sample (0 if none)."""
    success_pg, valid_pg = np.asarray(success_pg, bool), np.asarray(valid_pg, bool)
    groups_p = valid_pg.any(axis=1)
    positives_p = (success_pg & valid_pg).sum(axis=1)
    return float((groups_p & (positives_p == 1)).sum()) / max(int(groups_p.sum()), 1)
