"""The regime table under shifted boundary cutoffs and in p_base bins."""

import numpy as np
import pytest

from jaxrl_vr import passk
from jaxrl_vr.eval import PolicyResult, build_evaluation, evaluation_markdown, regime_sensitivity, shifted_regime

NAMES = passk.REGIMES
P_LO = -np.expm1(np.log(0.6) / 256)  # 1 − (1 − p)^256 = 0.4


def _names(codes):
    return [NAMES[c] for c in codes]


def test_scale_one_is_the_standard_regime():
    p = np.concatenate([np.linspace(0, 1, 2001), [0.1, 0.6, P_LO, P_LO * 1.001, P_LO * 0.999, np.nextafter(0.1, 0)]])
    np.testing.assert_array_equal(shifted_regime(p, scale=1.0), passk.regime(p))


def test_scaled_cutoffs_by_hand():
    # s = 2: boundary 2·p_lo < p < 0.2, reachable 0.2 ≤ p ≤ 0.6.
    assert _names(shifted_regime([0.15, 0.2, 0.003, 0.005, 0.5, 0.7], scale=2.0)) == [
        "boundary", "reachable", "out_of_reach", "boundary", "reachable", "solved_easy"]
    # s = 0.5: boundary p_lo/2 < p < 0.05; solved_easy still p > 0.6 only.
    assert _names(shifted_regime([0.06, 0.04, 0.0015, 0.0009, 0.4, 0.61], scale=0.5)) == [
        "reachable", "boundary", "boundary", "out_of_reach", "reachable", "solved_easy"]
    with pytest.raises(ValueError, match="scale"):
        shifted_regime([0.1], scale=0.0)


def test_regime_sensitivity_by_hand():
    sens = regime_sensitivity([0, 1, 2, 4], 4, [1, 0, 3, 4], 4, [0.0, 0.15, 0.5, 0.9])
    assert sens["ks"] == [1, 2, 4]
    standard = sens["cutoff_scales"]["by_scale"]["1"]["regimes"]
    assert {name: cell["count"] for name, cell in standard.items()} == {
        "out_of_reach": 1, "boundary": 0, "reachable": 2, "solved_easy": 1}
    reachable = standard["reachable"]  # prompts 1 and 2: base c = 1, 2 -> 0, 3 of 4
    assert reachable["pass_at_k_base"]["1"] == pytest.approx(0.375)
    assert reachable["pass_at_k_final"]["1"] == pytest.approx(0.375) and reachable["lost"] == 1
    # pass@2: base 1 − C(3,2)/C(4,2) = 0.5 and 1 − 1/6; final 0 and 1.
    assert reachable["delta"]["2"] == pytest.approx((0 + 1) / 2 - (0.5 + 5 / 6) / 2)
    assert standard["boundary"]["pass_at_k_base"] is None and standard["boundary"]["lost"] == 0
    doubled = sens["cutoff_scales"]["by_scale"]["2"]
    assert doubled["regimes"]["boundary"]["count"] == 1 and doubled["regimes"]["boundary"]["lost"] == 1
    assert doubled["boundary_band"] == pytest.approx([2 * P_LO, 0.2])
    bins = {b["label"]: b for b in sens["p_base_bins"]["bins"]}
    assert [label for label, b in bins.items() if b["count"]] == ["0", "(0.1, 0.2]", "(0.4, 0.6]", "(0.8, 1]"]
    assert bins["0"]["pass_at_k_final"]["4"] == 1.0 and bins["0"]["pass_at_k_base"]["4"] == 0.0
    assert sum(b["count"] for b in bins.values()) == 4


def test_evaluation_json_and_its_report_carry_the_sensitivity_tables():
    rng = np.random.default_rng(0)
    cal = rng.integers(0, 257, 30)
    base, final = rng.binomial(16, cal / 256), rng.binomial(16, cal / 256)
    ev = build_evaluation(PolicyResult(final, 16), base=PolicyResult(base, 16), calibration_counts_p=cal,
                          calibration_n=256)
    sens = ev["regime_sensitivity"]
    standard = sens["cutoff_scales"]["by_scale"]["1"]["regimes"]
    assert {k: v["count"] for k, v in standard.items()} == {k: v["count"] for k, v in ev["regimes"].items()}
    for scale in ("0.5", "2"):
        assert sum(c["count"] for c in sens["cutoff_scales"]["by_scale"][scale]["regimes"].values()) == 30
    assert standard["reachable"]["pass_at_k_final"] == ev["regimes"]["reachable"]["pass_at_k"]
    text = evaluation_markdown(ev)
    assert "Regimes under shifted boundary cutoffs" in text and "By base pass rate" in text
