"""Lost / newly-solved counts and their chance baselines (jaxrl_vr.eval.inversion)."""

import numpy as np
import pytest
from scipy import special

from jaxrl_vr.eval import (
    fit_beta_prior,
    inversion_counts,
    inversion_report,
    poisson_binomial_pmf,
    survival_estimate,
)
from jaxrl_vr.eval.inversion import survival_posterior


def test_survival_estimate_hand_values():
    # C(n−c, m)/C(n, m): n=4, c=1, m=2 -> C(3,2)/C(4,2) = 3/6; c=0 -> 1; c=3, m=2 -> 0.
    np.testing.assert_allclose(survival_estimate(4, [1, 0, 3], 2), [0.5, 1.0, 0.0])
    with pytest.raises(ValueError, match="m <= n"):
        survival_estimate(4, [1], 5)


def test_survival_estimate_is_unbiased():
    # E over c ~ Binomial(8, p) of C(8−c, 3)/C(8, 3) equals (1 − p)^3 exactly.
    p, n, m = 0.3, 8, 3
    c = np.arange(n + 1)
    weights = special.comb(n, c) * p**c * (1 - p) ** (n - c)
    assert np.sum(weights * survival_estimate(n, c, m)) == pytest.approx((1 - p) ** m, rel=1e-12)


def test_survival_posterior_hand_values():
    # Beta(1, 1) prior, no data: E[(1 − p)] = 1/2, E[(1 − p)^2] = 1/3.
    np.testing.assert_allclose(survival_posterior(0, [0], 1, prior=(1.0, 1.0)), [0.5])
    np.testing.assert_allclose(survival_posterior(0, [0], 2, prior=(1.0, 1.0)), [1 / 3])
    # One failure out of one sample: posterior Beta(1, 2), E[1 − p] = 2/3.
    np.testing.assert_allclose(survival_posterior(1, [0], 1, prior=(1.0, 1.0)), [2 / 3])


def test_poisson_binomial_pmf():
    np.testing.assert_allclose(poisson_binomial_pmf([0.5, 0.5]), [0.25, 0.5, 0.25])
    np.testing.assert_allclose(poisson_binomial_pmf([1.0, 0.0, 0.2]), [0.0, 0.8, 0.2, 0.0])
    np.testing.assert_allclose(poisson_binomial_pmf([]), [1.0])


def test_fit_beta_prior_recovers_the_population():
    rng = np.random.default_rng(0)
    p = rng.beta(0.5, 3.0, 4000)
    a, b = fit_beta_prior(64, rng.binomial(64, p))
    assert a == pytest.approx(0.5, rel=0.15) and b == pytest.approx(3.0, rel=0.15)


def test_counts_and_report_on_a_hand_case():
    # base [2, 0, 1, 0] of 4, trained [0, 1, 1, 0] of 4: prompt 0 lost, prompt 1 newly solved.
    counts = inversion_counts([2, 0, 1, 0], 4, [0, 1, 1, 0], 4)
    np.testing.assert_array_equal(counts.lost_p, [True, False, False, False])
    np.testing.assert_array_equal(counts.newly_solved_p, [False, True, False, False])
    # Chance terms live only on their own set; probabilities in [0, 1].
    assert counts.lost_chance_p[1] == 0 and counts.lost_chance_p[3] == 0
    assert counts.newly_solved_chance_p[0] == 0 and counts.newly_solved_chance_p[2] == 0
    assert np.all((counts.lost_chance_p >= 0) & (counts.lost_chance_p <= 1))
    report = inversion_report([2, 0, 1, 0], 4, [0, 1, 1, 0], 4, reference_counts=[5, 1, 2, 0], reference_n=8)
    assert report["lost"] == 1 and report["newly_solved"] == 1
    assert report["lost_prompts"] == [0] and report["newly_solved_prompts"] == [1]
    assert report["base_solvable"] == 2 and report["base_unsolved"] == 2
    # n_t = 4 <= 8 calibration samples: the prior-free cross-check is C(8−c, 4)/C(8, 4).
    expected = special.comb(3, 4) / special.comb(8, 4) + special.comb(6, 4) / special.comb(8, 4)
    assert report["lost_expected_unbiased"] == pytest.approx(expected)
    assert 0.0 <= report["lost_chance_p_value"] <= 1.0 and len(report["verdict"]) == 2
    assert inversion_report([1], 4, [0], 8, reference_counts=[1], reference_n=4)["lost_expected_unbiased"] is None


def test_a_policy_equal_to_the_base_loses_about_the_chance_number():
    """Noise floor: trained = base (independent samples) -> lost ≈ expected by chance and
    the chance test rarely fires (about its 5 % level), at the smoke and the default n."""
    rng = np.random.default_rng(1)
    for n, n_cal in ((32, 8), (256, 256)):
        lost, expected_lost, new, expected_new, fired = [], [], [], [], 0
        for _ in range(150):
            p = rng.beta(0.3, 2.0, 120)
            base, trained, cal = rng.binomial(n, p), rng.binomial(n, p), rng.binomial(n_cal, p)
            rep = inversion_report(base, n, trained, n, reference_counts=cal, reference_n=n_cal)
            lost.append(rep["lost"])
            expected_lost.append(rep["lost_expected_by_chance"])
            new.append(rep["newly_solved"])
            expected_new.append(rep["newly_solved_expected_by_chance"])
            fired += rep["lost_chance_p_value"] < 0.05
        assert np.mean(lost) == pytest.approx(np.mean(expected_lost), rel=0.1)
        assert np.mean(new) == pytest.approx(np.mean(expected_new), rel=0.1)
        assert fired / 150 < 0.12


def test_a_policy_that_forgets_is_flagged():
    # Trained policy fails every prompt: lost = base-solvable count, far above chance.
    rng = np.random.default_rng(2)
    p = rng.uniform(0.2, 0.8, 50)
    base, cal = rng.binomial(16, p), rng.binomial(64, p)
    rep = inversion_report(base, 16, np.zeros(50, int), 16, reference_counts=cal, reference_n=64)
    assert rep["lost"] == 50 and rep["lost_expected_by_chance"] < 1.0
    assert rep["lost_chance_p_value"] < 1e-6 and "more than chance" in rep["verdict"][0]


def test_shape_errors():
    with pytest.raises(ValueError, match="equal-length"):
        inversion_counts([1, 2], 4, [1], 4)
    with pytest.raises(ValueError, match="reference"):
        inversion_counts([1, 2], 4, [1, 0], 4, reference_counts=[1], reference_n=8)
