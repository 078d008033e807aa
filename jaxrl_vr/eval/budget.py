"""Equal-generation-budget comparisons (SPEC §5: comparisons hold the rollout-token
budget fixed).

Runs that filter or probe prompts (dynamic sampling, two-stage) generate more tokens per
step, so runs are compared at equal cumulative generated tokens, not at equal steps:
each run's metric is linearly interpolated on a common token grid inside the range
both runs cover.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from jaxrl_vr.eval.plots import read_metrics_jsonl

__all__ = ["metric_vs_tokens", "metric_at_budget", "compare_at_equal_budget"]


def _records(run: Any) -> list[dict]:
    if isinstance(run, (str, os.PathLike)):
        return read_metrics_jsonl(run)
    return list(run)


def _number(value: Any) -> float:
    """A finite number, else 0 (missing, NaN logged as a string, bools)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value):
        return float(value)
    return 0.0


def metric_vs_tokens(
    run: Any,
    *,
    metric: str,
    tokens: str = "generated_tokens",
    cumulative: bool = False,
    x: str = "step",
) -> tuple[np.ndarray, np.ndarray]:
    """(cumulative tokens [N], metric [N]) from a run's metric records.

    Args:
      run: a JSON-lines path or a list of metric dicts.
      metric: the metric field.
      tokens: the generated-token field.
      cumulative: True if ``tokens`` is already a running total; False (default) if it
        is per step, then it is summed over steps (records without a finite value count
        0 tokens).
      x: the step field; a step logged twice (resume) keeps its last record.
    """
    by_step: dict[Any, dict] = {}
    for record in _records(run):
        if x in record:
            by_step[record[x]] = record
    ordered = [by_step[s] for s in sorted(by_step)]
    step_tokens = np.asarray([_number(r.get(tokens)) for r in ordered], np.float64)
    total = step_tokens if cumulative else np.cumsum(step_tokens)
    keep = [i for i, r in enumerate(ordered) if isinstance(r.get(metric), (int, float))
            and not isinstance(r.get(metric), bool) and np.isfinite(r[metric])]
    if not keep:
        raise ValueError(f"no finite '{metric}' values in the run; check the metric name.")
    total = total[keep]
    values = np.asarray([ordered[i][metric] for i in keep], np.float64)
    if np.any(np.diff(total) < 0):
        raise ValueError(f"'{tokens}' decreases over steps; pass cumulative=False for per-step counts.")
    return total, values


def metric_at_budget(tokens_n: Any, values_n: Any, budgets: Any) -> np.ndarray:
    """Linear interpolation of a metric at token budgets; NaN outside [tokens[0], tokens[-1]]."""
    tokens_n = np.asarray(tokens_n, np.float64)
    values_n = np.asarray(values_n, np.float64)
    budgets = np.asarray(budgets, np.float64)
    if tokens_n.ndim != 1 or tokens_n.shape != values_n.shape or tokens_n.size == 0:
        raise ValueError(f"tokens and values must be equal-length 1-D, got {tokens_n.shape}, {values_n.shape}.")
    if np.any(np.diff(tokens_n) < 0):
        raise ValueError("tokens must be non-decreasing (cumulative generated tokens).")
    out = np.interp(budgets, tokens_n, values_n)
    return np.where((budgets < tokens_n[0]) | (budgets > tokens_n[-1]), np.nan, out)


def compare_at_equal_budget(
    run_a: Any,
    run_b: Any,
    *,
    metric: str,
    tokens: str = "generated_tokens",
    cumulative: bool = False,
    num_points: int = 20,
    budgets: Sequence[float] | None = None,
) -> dict[str, Any]:
    """Both runs' metric at the same cumulative generated-token budgets.

    Default grid: ``num_points`` budgets evenly spaced over the overlap of both runs'
    token ranges. Returns a JSON-able dict {"metric", "budgets", "a", "b", "delta"
    (= b − a), "max_common_budget"}.
    """
    ta, va = metric_vs_tokens(run_a, metric=metric, tokens=tokens, cumulative=cumulative)
    tb, vb = metric_vs_tokens(run_b, metric=metric, tokens=tokens, cumulative=cumulative)
    lo, hi = max(ta[0], tb[0]), min(ta[-1], tb[-1])
    if budgets is None:
        if hi < lo:
            raise ValueError(f"the runs' token ranges do not overlap: [{ta[0]}, {ta[-1]}] vs [{tb[0]}, {tb[-1]}].")
        grid = np.linspace(lo, hi, num_points)
    else:
        grid = np.asarray(budgets, np.float64)
    a, b = metric_at_budget(ta, va, grid), metric_at_budget(tb, vb, grid)

    def listed(x: np.ndarray) -> list[float | None]:
        return [float(v) if np.isfinite(v) else None for v in x]

    return {
        "metric": metric,
        "budgets": listed(grid),
        "a": listed(a),
        "b": listed(b),
        "delta": listed(b - a),
        "max_common_budget": float(hi),
    }
