"""Across-seed summaries and paired differences (jaxrl_vr.eval.seeds)."""

import math

import pytest
from scipy import stats

from jaxrl_vr.eval import paired_difference, seed_summary


def test_seed_summary_hand_values():
    s = seed_summary([1.0, 2.0, 3.0, None, float("nan")])
    # mean 2, sd 1, se 1/√3; None and NaN skipped.
    assert s.mean == 2.0 and s.stderr == pytest.approx(1 / math.sqrt(3)) and s.count == 3
    one = seed_summary([0.5])
    assert one.mean == 0.5 and math.isnan(one.stderr) and one.count == 1
    assert seed_summary([]).count == 0


def test_paired_difference_t_interval():
    method = {0: 2.0, 1: 4.0, 2: 6.0, 3: 9.0}
    baseline = {0: 1.0, 1: 2.0, 2: 3.0}  # seed 3 unpaired -> ignored
    d = paired_difference(method, baseline)
    # differences [1, 2, 3]: mean 2, se 1/√3, half-width t_{0.975, 2} · se = 4.3027 / √3.
    half = stats.t.ppf(0.975, 2) / math.sqrt(3)
    assert d.count == 3 and d.mean == pytest.approx(2.0)
    assert d.low == pytest.approx(2.0 - half) and d.high == pytest.approx(2.0 + half)
    assert d.low < 0 < d.high and d.verdict == "no difference detected"


def test_paired_difference_verdicts():
    assert paired_difference({0: 1.1, 1: 1.2, 2: 1.3}, {0: 1.0, 1: 1.1, 2: 1.2}).verdict == "higher"
    assert paired_difference({0: 0.9, 1: 1.0, 2: 1.1}, {0: 1.0, 1: 1.1, 2: 1.2}).verdict == "lower"
    assert paired_difference({0: 1.0}, {0: 0.0}).verdict.startswith("n/a")
    assert paired_difference({0: 1.0}, {1: 0.0}).verdict == "n/a (no shared seed)"
    with pytest.raises(ValueError, match="confidence"):
        paired_difference({0: 1.0}, {0: 1.0}, confidence=1.5)
