"""Tests for jaxrl_vr.passk: the unbiased pass@k estimator and PBA regimes."""

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
