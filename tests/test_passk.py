"""Tests for jaxrl_vr.passk: the unbiased pass@k estimator and PBA regimes."""

import itertools
import math
from fractions import Fraction

import chex
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxrl_vr import passk

SETTINGS = hypothesis.settings(max_examples=25, deadline=None, derandomize=True)


def exact_pass_at_k(n, c, k):
    """1 - C(n-c, k)/C(n, k) with exact integers (math.comb is 0 when n - c < k)."""
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def test_hand_computed_values():
    # n=4, c=2, k=1: 1 - C(2,1)/C(4,1) = 1 - 2/4 = .5
    # n=4, c=2, k=2: 1 - C(2,2)/C(4,2) = 1 - 1/6 = 5/6
    # n=5, c=1, k=2: 1 - C(4,2)/C(5,2) = 1 - 6/10 = .4
    # n=5, c=0, k=3: 1 - C(5,3)/C(5,3) = 0
    # n=4, c=3, k=2: n - c = 1 < k -> 1
    # n=10, c=3, k=10: n - c = 7 < 10 -> 1
    got = passk.pass_at_k([4, 4, 5, 5, 4, 10], [2, 2, 1, 0, 3, 3], [1, 2, 2, 3, 2, 10])
    np.testing.assert_allclose(got, [0.5, 5 / 6, 0.4, 0.0, 1.0, 1.0], rtol=1e-14, atol=0)
    assert got.dtype == np.float64


def test_matches_math_comb_up_to_1024():
    rng = np.random.default_rng(0)
    n = rng.integers(1, 1025, size=400)
    # Half the counts small (product branch), half anywhere (log-gamma branch too).
    c = np.where(rng.random(400) < 0.5, rng.integers(0, 65, 400), rng.integers(0, 1025, 400))
    c = np.minimum(c, n)
    k = np.where(rng.random(400) < 0.5, rng.integers(1, 65, 400), rng.integers(1, 1025, 400))
    k = np.minimum(k, n)
    got = passk.pass_at_k(n, c, k)
    expected = np.array([exact_pass_at_k(*map(int, t)) for t in zip(n, c, k)])
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=0)
    assert np.any((np.minimum(c, k) > 64) & (n - c >= k))  # log-gamma branch was exercised


def test_large_n_precision():
    # c = 1: pass@k = k/n exactly; tiny values must keep full relative precision.
    np.testing.assert_allclose(passk.pass_at_k(4096, 1, [1, 7]), [1 / 4096, 7 / 4096],
                               rtol=1e-14)
    for c, k in [(100, 100), (2000, 3), (70, 70), (4000, 90)]:
        np.testing.assert_allclose(passk.pass_at_k(4096, c, k), exact_pass_at_k(4096, c, k),
                                   rtol=1e-10)


def test_broadcasting_and_curve():
    n = np.array([[8], [16]])
    c = np.array([[0, 2, 8]])
    got = passk.pass_at_k(n, c, 4)
    assert got.shape == (2, 3)
    # n=8, c=2, k=4: 1 - C(6,4)/C(8,4) = 1 - 15/70 = 11/14.
    np.testing.assert_allclose(got[0], [0.0, 11 / 14, 1.0], rtol=1e-14)
    curve = passk.pass_at_k_curve(np.array([8, 8]), np.array([2, 5]), [1, 2, 4, 8])
    assert curve.shape == (2, 4)
    # c=2, k=1: 2/8; k=2: 1 - C(6,2)/C(8,2) = 1 - 15/28 = 13/28; k=4: 11/14; k=8: 1.
    np.testing.assert_allclose(curve[0], [0.25, 13 / 28, 11 / 14, 1.0], rtol=1e-14)
    assert np.all(np.diff(curve, axis=-1) >= 0)


@hypothesis.given(st.integers(1, 300), st.data())
@SETTINGS
def test_properties(n, data):
    c = data.draw(st.integers(0, n))
    ks = np.arange(1, n + 1)
    curve = passk.pass_at_k_curve(n, c, ks)
    assert np.all((curve >= 0) & (curve <= 1))
    assert np.all(np.diff(curve) >= -1e-15)  # non-decreasing in k
    np.testing.assert_allclose(curve[0], c / n, rtol=1e-12)  # pass@1 = c/n
    assert curve[-1] == (1.0 if c > 0 else 0.0)  # pass@n = 1[c > 0]
    k = data.draw(st.integers(1, n))
    np.testing.assert_allclose(curve[k - 1], exact_pass_at_k(n, c, k), rtol=1e-10)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="c <= n"):
        passk.pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match="k <= n"):
        passk.pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="k <= n"):
        passk.pass_at_k(4, 1, 0)
    with pytest.raises(ValueError, match="whole numbers"):
        passk.pass_at_k(4.5, 1, 1)
    with pytest.raises(TypeError, match="host-side"):
        jax.jit(lambda c: passk.pass_at_k(4, c, 1))(jnp.array(2))


class RegimeTest(parameterized.TestCase):

    def test_names(self):
        self.assertEqual(passk.REGIMES, ("out_of_reach", "boundary", "reachable", "solved_easy"))

    def test_boundaries_numpy(self):
        p = np.array([0.0, 0.001, 0.002, 0.0999, 0.1, 0.6, 0.6000001, 1.0])
        # n = 256: 1 - (1 - .001)^256 = 1 - e^{256 log .999} = .2260 <= .4 -> out_of_reach
        #          1 - (1 - .002)^256 = .4011 > .4 -> boundary
        # .0999 < .1 and reach ~1 -> boundary; .1 and .6 -> reachable; > .6 -> solved_easy.
        expected = [0, 0, 1, 1, 2, 2, 3, 3]
        np.testing.assert_array_equal(passk.regime(p), expected)
        self.assertEqual(passk.regime(p).dtype, np.int32)
        names = [passk.REGIMES[i] for i in passk.regime(p)]
        self.assertEqual(names[2], "boundary")

    def test_n_changes_reach(self):
        # p = .05, n = 8: 1 - .95^8 = .3366 <= .4 -> out_of_reach; n = 16: .5599 -> boundary.
        np.testing.assert_array_equal(passk.regime(np.array([0.05, 0.05]), n=8), [0, 0])
        np.testing.assert_array_equal(passk.regime(np.array([0.05]), n=16), [1])
        # p thresholds win over reach for small n: p = .3, n = 1 -> reachable.
        np.testing.assert_array_equal(passk.regime(np.array([0.3]), n=1), [2])

    def test_float32_thresholds(self):
        # float32(0.6) is not > float32(0.6): reachable, even though it exceeds 0.6 in f64.
        np.testing.assert_array_equal(passk.regime(np.float32([0.6, 0.1])), [2, 2])

    @chex.variants(with_jit=True, without_jit=True)
    def test_jax_arrays(self):
        p = jnp.array([0.0, 0.002, 0.1, 0.6, 0.7])
        got = self.variant(passk.regime)(p)
        chex.assert_trees_all_equal(got, jnp.array([0, 1, 2, 2, 3], jnp.int32))


# ------------------------------------------------------------- binomial ratios, objectives


def brute_force_weights(g, k, loo_minus_one):
    """C(n,k)⁻¹ Σ_{|I|=k, I ∋ i} (max_I g − [max of I∖i]) by enumerating the subsets."""
    n = len(g)
    out = np.zeros(n)
    for subset in itertools.combinations(range(n), k):
        best = max(g[j] for j in subset)
        for i in subset:
            rest = [g[j] for j in subset if j != i]
            out[i] += best - (max(rest) if loo_minus_one and rest else 0.0)
    return out / math.comb(n, k)


def test_log_comb_ratio_matches_math_comb():
    # C(a, m)/C(b, m): C(3,2)/C(5,2) = 3/10; C(1,2)/C(5,2) = 0; m = 0 -> 1; C(7,3)/C(9,3) = 35/84.
    a, b, m = np.array([3, 1, 4, 7]), np.array([5, 5, 4, 9]), np.array([2, 2, 0, 3])
    expected = np.array([3 / 10, 0.0, 1.0, 35 / 84])
    np.testing.assert_allclose(np.exp(passk.log_comb_ratio(a, b, m)), expected, rtol=1e-14)
    got = jax.jit(lambda a, b, m: jnp.exp(passk.log_comb_ratio(a, b, m, max_terms=3)))(
        jnp.asarray(a), jnp.asarray(b), jnp.asarray(m))
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-6)
    # Large counts, no factorial: C(3000, 200)/C(4000, 200) stays finite and accurate.
    exact = float(Fraction(math.comb(3000, 200), math.comb(4000, 200)))
    np.testing.assert_allclose(np.exp(passk.log_comb_ratio(3000, 4000, 200)), exact, rtol=1e-11)
    with pytest.raises(TypeError, match="max_terms"):
        jax.jit(lambda m: passk.log_comb_ratio(5, 6, m))(jnp.int32(2))


class PassKObjectivesTest(parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_pkpo_binary_hand_computed(self):
        # n = 4, c = 2, k = 2. "none": correct k/n = 1/2, wrong (k/n)·ρ(3, 2, 1) = 1/2·2/3 = 1/3,
        # sum 5/3 = k·ρ(4, 2, 2) = 2·5/6. loo−1: correct (k/n)·C(2,1)/C(3,1) = 1/3, wrong 0.
        rewards = jnp.asarray([[1.0, 0.0, 0.0, 1.0]])
        none = self.variant(lambda r: passk.pkpo(r, k=2, baseline="none"))(rewards)
        np.testing.assert_allclose(np.asarray(none), [[0.5, 1 / 3, 1 / 3, 0.5]], rtol=1e-6)
        np.testing.assert_allclose(float(np.sum(none)), 2 * passk.pass_at_k(4, 2, 2), rtol=1e-6)
        loo = self.variant(lambda r: passk.pkpo(r, k=2))(rewards)
        np.testing.assert_allclose(np.asarray(loo), [[1 / 3, 0.0, 0.0, 1 / 3]], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_pkpo_continuous_hand_computed(self):
        # g = [.1, .4, .2, .8], k = 2: the six pairs have maxima .2 .4 .8 .4 .8 .8, so
        # ρ^(g) = 3.4/6 = (1·.2 + 2·.4 + 3·.8)/6. s_i = (sum of the maxima of i's pairs)/6:
        # [1.4, 1.6, 1.4, 2.4]/6; loo−1: Σ_j max(0, g_i − g_j)/6 = [0, .5, .1, 1.7]/6.
        rewards = jnp.asarray([[0.1, 0.4, 0.2, 0.8]])
        none = self.variant(lambda r: passk.pkpo(r, k=2, baseline="none"))(rewards)
        np.testing.assert_allclose(np.asarray(none), [[1.4 / 6, 1.6 / 6, 1.4 / 6, 2.4 / 6]], rtol=1e-6)
        loo = self.variant(lambda r: passk.pkpo(r, k=2))(rewards)
        np.testing.assert_allclose(np.asarray(loo), [[0.0, 0.5 / 6, 0.1 / 6, 1.7 / 6]], rtol=1e-5, atol=1e-7)

    def test_pkpo_matches_subset_enumeration(self):
        rng = np.random.default_rng(0)
        fns = {b: jax.jit(lambda r, v, k, b=b: passk.pkpo(r, v, k=k, baseline=b, max_k=8))
               for b in ("loo_minus_one", "none")}
        for trial in range(40):
            n = int(rng.integers(1, 8))
            g = (rng.random(n) < 0.4).astype(float) if trial % 2 else np.round(rng.random(n), 1)
            k = int(rng.integers(1, n + 1))
            values = np.zeros((1, 8), np.float32)
            values[0, :n] = g
            valid = np.arange(8)[None] < n
            perm = rng.permutation(8)  # invalid samples anywhere in the row
            for baseline, loo in (("loo_minus_one", True), ("none", False)):
                got = fns[baseline](jnp.asarray(values[:, perm]), jnp.asarray(valid[:, perm]),
                                    jnp.int32(k))
                expected = np.zeros((1, 8))
                expected[0, :n] = brute_force_weights(list(g), k, loo)
                np.testing.assert_allclose(np.asarray(got), expected[:, perm], atol=1e-6,
                                           err_msg=f"g={g} k={k} {baseline}")

    @chex.variants(with_jit=True, without_jit=True)
    def test_pkpo_k1_is_reinforce_over_n_and_k_equals_n(self):
        rewards = jnp.asarray([[1.0, 0.0, 0.0, 1.0], [0.3, 0.9, 0.0, 0.6]])
        for baseline in ("loo_minus_one", "none"):
            adv = self.variant(lambda r, b=baseline: passk.pkpo(r, k=1, baseline=b))(rewards)
            np.testing.assert_allclose(np.asarray(adv), np.asarray(rewards) / 4, rtol=1e-6)
        # k = n = 4, loo−1: only the best sample gets anything, its margin over the second
        # best (c = 2 correct: 0; continuous: .9 − .6 = .3); "none": every sample gets the max.
        adv = self.variant(lambda r: passk.pkpo(r, k=4))(rewards)
        np.testing.assert_allclose(np.asarray(adv), [[0, 0, 0, 0], [0, 0.3, 0, 0]], atol=1e-6)
        adv = self.variant(lambda r: passk.pkpo(r, k=4, baseline="none"))(rewards)
        np.testing.assert_allclose(np.asarray(adv), [[1.0] * 4, [0.9] * 4], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_passk_training_hand_computed(self):
        # n = 4, c = 1, k = 2: R̄ = 1 − C(3,2)/C(4,2) = 1/2, σ = 1/2, Â_pos = 1,
        # Â_neg = (1 − 1/2 − C(2,1)/C(3,1))/σ = −1/3.
        # n = 6, c = 2, k = 3: R̄ = 1 − C(4,3)/C(6,3) = 4/5, σ = 2/5, Â_pos = 1/2,
        # Â_neg = (1/5 − C(3,2)/C(5,2))/σ = (1/5 − 3/10)/(2/5) = −1/4.
        rewards = jnp.asarray([[1.0, 0, 0, 0, 0, 0], [0, 1.0, 0, 1.0, 0, 0]])
        valid = jnp.asarray([[True] * 4 + [False] * 2, [True] * 6])
        adv = self.variant(lambda r, v, k: passk.passk_training(r, v, k=k, max_k=3))(
            rewards, valid, jnp.asarray([2, 3])[0])
        np.testing.assert_allclose(np.asarray(adv)[0], [1, -1 / 3, -1 / 3, -1 / 3, 0, 0], rtol=1e-6)
        adv = self.variant(lambda r, v: passk.passk_training(r, v, k=3))(rewards, valid)
        np.testing.assert_allclose(np.asarray(adv)[1], [-0.25, 0.5, -0.25, 0.5, -0.25, -0.25], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_passk_training_k1_is_grpo_with_population_std_and_k_n_is_zero(self):
        rewards = jnp.asarray([[1.0, 0.0, 0.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0, 0.0]])
        adv = self.variant(lambda r: passk.passk_training(r, k=1))(rewards)
        r = np.asarray(rewards)
        expected = (r - r.mean(1, keepdims=True)) / r.std(1, keepdims=True)  # ddof 0
        np.testing.assert_allclose(np.asarray(adv), expected, rtol=1e-5)
        adv = self.variant(lambda r: passk.passk_training(r, k=5))(rewards)
        chex.assert_trees_all_equal(adv, jnp.zeros((2, 5), jnp.float32))

    @chex.variants(with_jit=True, without_jit=True)
    def test_degenerate_groups_give_zeros_never_nan(self):
        # all correct, all wrong, one valid sample, no valid sample.
        rewards = jnp.asarray([[1.0] * 4, [0.0] * 4, [1.0, 0, 0, 0], [1.0] * 4])
        valid = jnp.asarray([[True] * 4, [True] * 4, [True, False, False, False], [False] * 4])
        for fn in (lambda r, v: passk.pkpo(r, v, k=3), lambda r, v: passk.passk_training(r, v, k=3)):
            adv = np.asarray(self.variant(fn)(rewards, valid))
            assert np.all(np.isfinite(adv))
            np.testing.assert_array_equal(adv[[0, 1, 3]], 0.0)
        # A lone valid sample uses k = n = 1: PKPO gives its reward, Pass@k Training 0.
        np.testing.assert_allclose(np.asarray(passk.pkpo(rewards, valid, k=3))[2], [1, 0, 0, 0])
        np.testing.assert_array_equal(np.asarray(passk.passk_training(rewards, valid, k=3))[2], 0.0)

    def test_ragged_groups_equal_their_unpadded_rows(self):
        rewards = jnp.asarray([[0.0, 1.0, 7.0, 0.0, 1.0, 7.0]])
        valid = jnp.asarray([[True, True, False, True, True, False]])
        dense = jnp.asarray([[0.0, 1.0, 0.0, 1.0]])
        for fn in (lambda r, v: passk.pkpo(r, v, k=2), lambda r, v: passk.passk_training(r, v, k=2),
                   lambda r, v: passk.pkpo(r, v, k=2, baseline="none")):
            ragged = np.asarray(fn(rewards, valid))
            np.testing.assert_allclose(ragged[0, [0, 1, 3, 4]], np.asarray(fn(dense, None))[0], rtol=1e-6)
            np.testing.assert_array_equal(ragged[0, [2, 5]], 0.0)

    def test_shaping_keeps_a_plain_baseline(self):
        # success [1, 0, 0, 0], rewards [1, −1, 0, 0] (an overlong penalty on sample 1):
        # pass@k part on success, plus rewards − success centred: [0, −1, 0, 0] − (−1/4).
        success = jnp.asarray([[1.0, 0.0, 0.0, 0.0]])
        rewards = jnp.asarray([[1.0, -1.0, 0.0, 0.0]])
        shaping = np.asarray([[0.25, -0.75, 0.25, 0.25]])
        for fn in (passk.pkpo, passk.passk_training):
            got = fn(rewards, k=2, success_pg=success)
            np.testing.assert_allclose(np.asarray(got), np.asarray(fn(success, k=2)) + shaping, rtol=1e-6)

    def test_traced_k_needs_max_k_and_does_not_recompile(self):
        rewards = jnp.asarray([[1.0, 0.0, 0.0, 1.0]])
        with pytest.raises(TypeError, match="max_k"):
            jax.jit(lambda k: passk.pkpo(rewards, k=k))(jnp.int32(2))
        fn = jax.jit(lambda k: passk.pkpo(rewards, k=k, max_k=4))
        for k in (1, 2, 3, 4):
            np.testing.assert_allclose(np.asarray(fn(jnp.int32(k))), np.asarray(passk.pkpo(rewards, k=k)),
                                       rtol=1e-6)
        assert fn._cache_size() == 1
