"""experiments.sim_vs_study: the verdict rule and the scaling, on hand-made intervals."""

import pytest

from experiments import sim_vs_study as svs

I = svs.Interval


@pytest.mark.parametrize("sim, scaled, real, want", [
    # Study excludes 0 on the predicted side and meets the scaled prediction.
    (I(-100, -120, -80), I(-8, -12, -5), I(-10, -15, -4), "agrees"),
    # ... on the predicted side but wholly short of the scaled prediction.
    (I(-100, -120, -80), I(-30, -40, -25), I(-3, -5, -1), "agrees in sign, not in size"),
    # Study excludes 0 on the other side.
    (I(-100, -120, -80), I(-8, -12, -5), I(7, 4.5, 9.5), "disagrees"),
    # Study includes 0 and meets the scaled range: not detected.
    (I(-100, -120, -80), I(-8, -18, -3), I(-0.3, -7.9, 7.3), "not detected"),
    # Study includes 0 but rules the scaled range out.
    (I(-100, -120, -80), I(-20, -30, -15), I(-0.3, -7.9, 7.3), "disagrees"),
    # Simulator predicts no difference; the study detects one far from it.
    (I(0.1, -1, 1.2), I(0.01, -0.1, 0.1), I(5, 3, 7), "disagrees"),
    (I(0.1, -1, 1.2), I(0.01, -0.1, 0.1), I(0.0, -1, 1), "not detected"),
])
def test_verdict(sim, scaled, real, want):
    assert svs.verdict(sim, scaled, real) == want


def test_c1_is_judged_by_sign_only():
    sim, scaled, real = I(-0.08, -0.09, -0.07), I(-0.05, -0.06, -0.04), I(-0.5, -0.6, -0.3)
    assert svs.verdict(sim, scaled, real) == "agrees in sign, not in size"
    assert svs.verdict(sim, scaled, real, sign_only=True) == "agrees"


def test_scale_factor_is_the_ratio_of_the_grpo_changes():
    sims = {"study_budget": {"methods": {"grpo": {"final": {
        "lost": {"overall": {"per_seed": [200.0, 220.0, 210.0, 230.0]}}}}}}}
    study = {"per_run": {"grpo": {"0": {"lost": 20, "lost_expected_by_chance": 5.0},
                                  "1": {"lost": 22, "lost_expected_by_chance": 6.0},
                                  "2": {"lost": 23, "lost_expected_by_chance": 5.0}}}}
    factor = svs.scale_factor(sims, study, "lost")
    assert factor.mean == pytest.approx((15 + 16 + 18) / 3 / 215.0)
    assert factor.low < factor.mean < factor.high
