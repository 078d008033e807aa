"""Tests for jaxrl_vr.weighting: prompt weights w(p) and CurveRL histogram weights."""

import functools

import chex
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxrl_vr import advantages, weighting

SETTINGS = hypothesis.settings(max_examples=25, deadline=None, derandomize=True)


class WeightFunctionsTest(parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_reinforce_weight_is_one(self):
        p = jnp.array([0.0, 0.3, 1.0])
        w = self.variant(weighting.reinforce_weight)(p)
        chex.assert_trees_all_equal(w, jnp.ones(3, jnp.float32))
        self.assertEqual(w.dtype, jnp.float32)

    @chex.variants(with_jit=True, without_jit=True)
    def test_grpo_weight_hand_values(self):
        p = jnp.array([0.0, 0.5, 0.2, 0.9, 1.0])
        w = self.variant(weighting.grpo_weight)(p)
        # 0.5: 1/sqrt(0.25) = 2;  0.2: 1/sqrt(0.16) = 2.5;  0.9: 1/sqrt(0.09) = 1/0.3
        # endpoints: 0 by convention.
        np.testing.assert_allclose(w, [0.0, 2.0, 2.5, 1 / 0.3, 0.0], rtol=1e-6)
        self.assertEqual(w.dtype, jnp.float32)

    @chex.variants(with_jit=True, without_jit=True)
    def test_maxrl_weight_untruncated(self):
        p = jnp.array([0.0, 0.25, 0.5, 1.0])
        w = self.variant(weighting.maxrl_weight)(p)
        # 1/p: 4, 2, 1; and 0 at p = 0.
        np.testing.assert_allclose(w, [0.0, 4.0, 2.0, 1.0], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_maxrl_weight_truncated(self):
        p = jnp.array([0.0, 0.5, 0.25, 1.0])
        w = self.variant(functools.partial(weighting.maxrl_weight, num_samples=4))(p)
        # (1 - (1-p)^4)/p:
        #   p=0.5:  (1 - 0.0625)/0.5 = 1.875
        #   p=0.25: (1 - 0.31640625)/0.25 = 2.734375
        #   p=1:    1;  p -> 0: limit T = 4.
        np.testing.assert_allclose(w, [4.0, 1.875, 2.734375, 1.0], rtol=1e-6)

    def test_maxrl_weight_truncated_is_geometric_sum(self):
        p = np.linspace(0.0, 1.0, 21)
        for t in (1, 2, 8, 64):
            expected = sum((1.0 - p) ** j for j in range(t))  # Σ_{j<T} (1-p)^j
            got = weighting.maxrl_weight(jnp.asarray(p), num_samples=t)
            np.testing.assert_allclose(got, expected, rtol=2e-5)

    def test_maxrl_weight_rejects_bad_truncation(self):
        with pytest.raises(ValueError, match="num_samples"):
            weighting.maxrl_weight(jnp.array([0.5]), num_samples=0)
        with pytest.raises(ValueError, match="num_samples"):
            weighting.maxrl_weight(jnp.array([0.5]), num_samples=2.5)


@jax.jit
def _all_weights(p):
    return (weighting.grpo_weight(p), weighting.maxrl_weight(p),
            weighting.maxrl_weight(p, num_samples=8))


@hypothesis.given(st.lists(st.floats(0.0, 1.0, width=32), min_size=8, max_size=8))
@hypothesis.example([0.0] * 7 + [1.401298464324817e-45])  # subnormal: flushed to 0 by XLA
@SETTINGS
def test_weights_are_finite_and_ordered(ps):
    grpo_w, full, trunc = map(np.asarray, _all_weights(jnp.asarray(ps, jnp.float32)))
    for w in (grpo_w, full, trunc):
        assert np.all(np.isfinite(w)) and np.all(w >= 0)
    # Truncation only lowers the weight: Σ_{j<T}(1-p)^j <= 1/p for p > 0. Subnormal p are
    # excluded: XLA on CPU flushes them to zero, where the weights take their p = 0 values.
    inner = np.asarray(ps, np.float32) >= np.finfo(np.float32).tiny
    assert np.all(trunc[inner] <= full[inner] * (1 + 1e-6))


def test_grpo_weight_matches_grpo_advantage_on_binary_rewards():
    # For binary rewards the population std is sqrt(p(1-p)); grpo() uses the unbiased
    # std sqrt(p(1-p) K/(K-1)), so grpo = w(p)·(R - p)·sqrt((K-1)/K) with eps = 0.
    rewards = jnp.array([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 1.0, 0.0]])
    p_hat = rewards.mean(axis=1)
    weighted = advantages.prompt_weighted(rewards, weighting.grpo_weight(p_hat))
    np.testing.assert_allclose(
        advantages.grpo(rewards, eps=0.0), weighted * np.sqrt(3.0 / 4.0), rtol=1e-5)


class CurveRLWeightsTest(parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_bin_weights_hand_computed(self):
        ref = jnp.array([0.1, 0.3, 0.3, 0.7])
        bw = self.variant(functools.partial(weighting.curverl_bin_weights, num_bins=5))(ref)
        # bins: floor(0.5)=0, floor(1.5)=1, 1, floor(3.5)=3 -> counts [1, 2, 0, 1, 0]
        # mass [.25, .5, 0, .25, 0]; cdf [.25, .75, .75, 1, 1]
        # weight = mass/cdf = [1, 2/3, 0, .25, 0]
        np.testing.assert_allclose(bw, [1.0, 2 / 3, 0.0, 0.25, 0.0], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_bin_weights_ignore_invalid_and_endpoints(self):
        ref = jnp.array([[0.25, 0.75, 0.0], [1.0, 0.5, 0.9]])
        valid = jnp.array([[True, True, True], [True, False, False]])
        bw = self.variant(functools.partial(weighting.curverl_bin_weights, num_bins=5))(
            ref, valid)
        # Counted: 0.25 (bin 1) and 0.75 (bin 3); 0.0 and 1.0 are outside (0,1);
        # 0.5, 0.9 are invalid. mass [0, .5, 0, .5, 0], cdf [0, .5, .5, 1, 1]
        # weights [0/1e-6 = 0, 1, 0, .5, 0]  (the authors' two-bin example).
        np.testing.assert_allclose(bw, [0.0, 1.0, 0.0, 0.5, 0.0], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_empty_reference_gives_zero_weights(self):
        fn = self.variant(functools.partial(weighting.curverl_bin_weights, num_bins=3))
        bw = fn(jnp.array([0.0, 1.0, 0.4]), jnp.array([True, True, False]))
        chex.assert_trees_all_equal(bw, jnp.zeros(3, jnp.float32))

    @chex.variants(with_jit=True, without_jit=True)
    def test_prompt_weights_lookup(self):
        bw = jnp.array([1.0, 2 / 3, 0.0, 0.25, 0.0])
        p_hat = jnp.array([0.0, 0.25, 0.5, 0.75, 1.0, 0.1])
        w = self.variant(weighting.curverl_prompt_weights)(p_hat, bw)
        # bins (5 bins): .25 -> 1 (2/3), .5 -> 2 (0), .75 -> 3 (.25), .1 -> 0 (1);
        # p in {0, 1} -> 0.
        np.testing.assert_allclose(w, [0.0, 2 / 3, 0.0, 0.25, 0.0, 1.0], rtol=1e-6)

    def test_prompt_weights_num_bins_mismatch(self):
        with pytest.raises(ValueError, match="num_bins"):
            weighting.curverl_prompt_weights(jnp.array([0.5]), jnp.ones(5), num_bins=4)

    def test_bin_index_clips(self):
        idx = weighting.curverl_bin_index(jnp.array([-0.1, 0.0, 0.199, 0.2, 0.99, 1.0, 1.5]),
                                          num_bins=5)
        # floor(v*5) clipped to [0, 4]; v clipped to [0, 1] first.
        chex.assert_trees_all_equal(idx, jnp.array([0, 0, 0, 1, 4, 4, 4], jnp.int32))

    def test_num_bins(self):
        self.assertEqual(weighting.curverl_num_bins(8), 9)
        self.assertEqual(weighting.curverl_num_bins(1), 2)
        self.assertEqual(weighting.curverl_num_bins(0), 2)


def _numpy_bin_weights(values, num_bins, eps=1e-6):
    """Independent reference: histogram with a Python loop."""
    counts = np.zeros(num_bins)
    for v in values:
        if 0.0 < v < 1.0:
            counts[min(max(int(np.floor(np.float32(v) * np.float32(num_bins))), 0),
                       num_bins - 1)] += 1
    mass = counts / max(counts.sum(), eps)
    cdf = np.cumsum(mass)
    return mass / np.maximum(cdf, eps)


_bin_weights_9 = jax.jit(functools.partial(weighting.curverl_bin_weights, num_bins=9))


@hypothesis.given(
    st.lists(st.sampled_from([k / 8 for k in range(9)]) | st.floats(0.0, 1.0, width=32),
             min_size=0, max_size=12),
    st.randoms(use_true_random=False))
@SETTINGS
def test_bin_weights_match_reference_and_properties(values, rnd):
    num_bins, size = 9, 12
    ref = np.zeros(size, np.float32)  # fixed shape: pad with invalid entries
    ref[:len(values)] = values
    valid = np.arange(size) < len(values)
    bw = np.asarray(_bin_weights_9(jnp.asarray(ref), jnp.asarray(valid)))
    np.testing.assert_allclose(bw, _numpy_bin_weights(ref[valid], num_bins), rtol=1e-5,
                               atol=1e-7)
    assert np.all(bw >= 0) and np.all(bw <= 1 + 1e-6)
    occupied = np.flatnonzero(bw > 0)
    if occupied.size:  # lowest occupied bin has mass = cdf, weight 1
        np.testing.assert_allclose(bw[occupied[0]], 1.0, rtol=1e-6)
    order = list(range(size))
    rnd.shuffle(order)
    np.testing.assert_allclose(_bin_weights_9(jnp.asarray(ref[order]), jnp.asarray(valid[order])),
                               bw, rtol=1e-6)
