"""Across-seed statistics for comparing training methods (issue 10: compare).

Each method is run with several seeds; a metric is summarised by its mean ± standard
error over seeds, and two methods are compared by the paired difference (same seed =
same base model and data order) with a Student-t confidence interval. An interval that
contains 0 is reported as "no difference detected", never as a finding.
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple

import numpy as np

__all__ = ["SeedSummary", "PairedDifference", "seed_summary", "paired_difference"]


class SeedSummary(NamedTuple):
    """mean, standard error (s/√n, NaN for one seed) and number of seeds with a value."""

    mean: float
    stderr: float
    count: int


class PairedDifference(NamedTuple):
    """Mean of (method − baseline) over shared seeds, with a two-sided t-interval.

    ``verdict`` is "higher" / "lower" when the interval excludes 0,
    "no difference detected" when it contains 0, and "n/a (…)" with fewer than 2 seeds.
    """

    mean: float
    stderr: float
    low: float
    high: float
    count: int
    verdict: str


def _finite(values: Any) -> np.ndarray:
    arr = np.asarray([np.nan if v is None else v for v in np.ravel(values)], np.float64)
    return arr[np.isfinite(arr)]


def seed_summary(values: Any) -> SeedSummary:
    """Mean ± standard error of the finite values (None/NaN skipped)."""
    arr = _finite(values)
    if arr.size == 0:
        return SeedSummary(float("nan"), float("nan"), 0)
    stderr = float(arr.std(ddof=1) / np.sqrt(arr.size)) if arr.size > 1 else float("nan")
    return SeedSummary(float(arr.mean()), stderr, int(arr.size))


def paired_difference(
    method_by_seed: Mapping[Any, float | None],
    baseline_by_seed: Mapping[Any, float | None],
    *,
    confidence: float = 0.95,
) -> PairedDifference:
    """Paired difference over the seeds both runs have (finite values only).

      d_s = method_s − baseline_s;  mean d̄;  se = sd(d)/√n;
      interval d̄ ± t_{(1+confidence)/2, n−1} · se.

    Args:
      method_by_seed, baseline_by_seed: {seed: value}.
      confidence: two-sided coverage of the interval.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}.")
    diffs = []
    for seed in sorted(set(method_by_seed) & set(baseline_by_seed), key=str):
        a, b = method_by_seed[seed], baseline_by_seed[seed]
        if a is not None and b is not None and np.isfinite(a) and np.isfinite(b):
            diffs.append(float(a) - float(b))
    d = np.asarray(diffs, np.float64)
    nan = float("nan")
    if d.size == 0:
        return PairedDifference(nan, nan, nan, nan, 0, "n/a (no shared seed)")
    mean = float(d.mean())
    if d.size < 2:
        return PairedDifference(mean, nan, nan, nan, 1, "n/a (one seed: no interval)")
    stderr = float(d.std(ddof=1) / np.sqrt(d.size))
    from scipy import stats  # noqa: PLC0415 (here: scipy.stats takes over a second to import)

    half = float(stats.t.ppf(0.5 + confidence / 2.0, d.size - 1)) * stderr
    low, high = mean - half, mean + half
    if low > 0.0:
        verdict = "higher"
    elif high < 0.0:
        verdict = "lower"
    else:
        verdict = "no difference detected"
    return PairedDifference(mean, stderr, low, high, int(d.size), verdict)
