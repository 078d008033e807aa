"""Equal-generation-budget comparison."""

import json

import numpy as np
import pytest

from jaxrl_vr.eval import compare_at_equal_budget, metric_at_budget, metric_vs_tokens


def test_metric_at_budget():
    # tokens 0, 100, 300 with metric 0, 1, 2: at 200 -> 1.5; outside the range -> NaN.
    out = metric_at_budget([0, 100, 300], [0.0, 1.0, 2.0], [50, 200, 400])
    np.testing.assert_allclose(out[:2], [0.5, 1.5])
    assert np.isnan(out[2])
    with pytest.raises(ValueError, match="non-decreasing"):
        metric_at_budget([0, 100, 50], [0, 1, 2], [10])


def test_metric_vs_tokens_cumsum_and_resume():
    records = [{"step": 0, "generated_tokens": 100, "acc": 0.1},
               {"step": 1, "generated_tokens": 100, "acc": 0.2},
               {"step": 1, "generated_tokens": 50, "acc": 0.3},  # re-logged after a resume: wins
               {"step": 2, "generated_tokens": 200, "acc": 0.4}]
    tokens, values = metric_vs_tokens(records, metric="acc")
    np.testing.assert_array_equal(tokens, [100, 150, 350])
    np.testing.assert_array_equal(values, [0.1, 0.3, 0.4])


def test_compare_at_equal_budget(tmp_path):
    # Run a: 100 tokens/step, acc = 0.1 * step; run b: 200 tokens/step (e.g. dynamic sampling),
    # acc = 0.15 * step. At 400 cumulative tokens: a is at step 3 (cum 400) -> 0.3; b between
    # steps 1 (cum 400) -> 0.15. b is ahead per step but behind per token.
    a = [{"step": s, "generated_tokens": 100, "acc": 0.1 * s} for s in range(6)]
    b = [{"step": s, "generated_tokens": 200, "acc": 0.15 * s} for s in range(4)]
    path_b = tmp_path / "b.jsonl"
    path_b.write_text("\n".join(json.dumps(r) for r in b))
    out = compare_at_equal_budget(a, path_b, metric="acc", budgets=[400])
    np.testing.assert_allclose([out["a"][0], out["b"][0], out["delta"][0]], [0.3, 0.15, -0.15])
    grid = compare_at_equal_budget(a, b, metric="acc", num_points=3)
    # Overlap: a covers [100, 600], b [200, 800] -> grid 200, 400, 600.
    assert grid["budgets"] == [200.0, 400.0, 600.0] and grid["max_common_budget"] == 600.0
    assert None not in grid["a"] + grid["b"]
    with pytest.raises(ValueError, match="metric name"):
        compare_at_equal_budget(a, b, metric="nope")
