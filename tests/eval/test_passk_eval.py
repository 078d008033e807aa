"""passk_report on hand-made cases."""

import json

import numpy as np
import pytest

from jaxrl_vr.eval import headline_ks, mean_passk_curve, passk_report


def test_two_prompts_n4():
    # Base c = [1, 0], trained c = [2, 1], n = 4.
    rep = passk_report([1, 0], [2, 1], 4)
    assert rep["ks"] == [1, 2, 3, 4] and rep["num_prompts"] == 2
    # pass@1 = mean(c / n): base (1/4 + 0)/2 = 0.125, trained (2/4 + 1/4)/2 = 0.375.
    # pass@2 = 1 − C(n−c, 2)/C(4, 2): c=1 -> 1 − 3/6 = 0.5; c=2 -> 1 − 1/6; c=0 -> 0.
    #   base (0.5 + 0)/2 = 0.25; trained (5/6 + 1/2)/2 = 2/3.
    # pass@4: any c > 0 -> 1: base 0.5, trained 1.
    np.testing.assert_allclose(rep["pass_at_k"]["base"], [0.125, 0.25, 0.375, 0.5])
    np.testing.assert_allclose(rep["pass_at_k"]["final"][:2], [0.375, 2 / 3])
    np.testing.assert_allclose(rep["pass_at_k"]["final"][3], 1.0)
    np.testing.assert_allclose(rep["pass_at_k"]["delta"][0], 0.25)
    assert rep["mean_pass_rate"] == {"base": 0.125, "final": 0.375}
    # Regimes from p_base = c/n = [0.25, 0]: reachable (0.1 <= p <= 0.6) and out_of_reach.
    assert rep["regime_counts"] == {"out_of_reach": 1, "boundary": 0, "reachable": 1, "solved_easy": 0}
    reach = rep["regimes"]["reachable"]
    np.testing.assert_allclose(reach["pass_at_k_base"][:2], [0.25, 0.5])
    np.testing.assert_allclose(reach["delta"][:2], [0.25, 5 / 6 - 0.5])
    assert rep["regimes"]["boundary"]["pass_at_k_base"] is None
    assert rep["lost"] == 0 and rep["gained"] == 1
    json.dumps(rep, allow_nan=False)


def test_lost_and_external_p_base():
    # Base c = [3, 2, 0, 5], trained c = [0, 2, 0, 0] out of n = 5: prompts 0 and 3 lost.
    # p_base from a 256-sample calibration cache: [0.7, 0.05, 0.001, 0.3]
    #   -> solved_easy, boundary (1 − 0.95^256 > 0.4), out_of_reach (1 − 0.999^256 = 0.226), reachable.
    rep = passk_report([3, 2, 0, 5], [0, 2, 0, 0], 5, p_base=[0.7, 0.05, 0.001, 0.3])
    assert rep["lost"] == 2
    assert rep["regime_counts"] == {"out_of_reach": 1, "boundary": 1, "reachable": 1, "solved_easy": 1}
    assert rep["regimes"]["solved_easy"]["lost"] == 1 and rep["regimes"]["reachable"]["lost"] == 1
    # Reachable prompt: base pass@1 = 5/5 = 1, trained 0 -> Δ = −1.
    assert rep["regimes"]["reachable"]["delta"][0] == pytest.approx(-1.0)


def test_different_final_n_and_ks():
    rep = passk_report([2, 4], [1, 2], 8, final_n=4, ks=[1, 4])
    assert rep["ks"] == [1, 4] and rep["headline_ks"] == [1, 4]
    # base pass@1 = (2/8 + 4/8)/2 = 0.375; trained pass@1 = (1/4 + 2/4)/2 = 0.375.
    np.testing.assert_allclose(rep["pass_at_k"]["base"][0], 0.375)
    np.testing.assert_allclose(rep["pass_at_k"]["final"][0], 0.375)
    # trained pass@4 with n = 4: both c > 0 -> 1.
    np.testing.assert_allclose(rep["pass_at_k"]["final"][1], 1.0)
    with pytest.raises(ValueError, match="ks"):
        passk_report([2, 4], [1, 2], 8, final_n=4, ks=[8])


def test_input_errors():
    with pytest.raises(ValueError, match="final_counts has 1 prompts"):
        passk_report([1, 2], [1], 4)
    with pytest.raises(ValueError, match="base_counts must lie"):
        passk_report([5], [1], 4)
    with pytest.raises(ValueError, match="1-D"):
        passk_report([[1]], [[1]], 4)


def test_helpers():
    assert headline_ks(256) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert headline_ks(6) == [1, 2, 4, 6]
    assert headline_ks(1) == [1]
    np.testing.assert_allclose(mean_passk_curve(4, [1, 0], [1, 2]), [0.125, 0.25])
    np.testing.assert_array_equal(mean_passk_curve(4, [], [1, 2]), [0.0, 0.0])
