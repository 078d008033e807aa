"""DAPO overlong penalty and the combined reward."""

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxrl_vr import rewards


class OverlongTest(parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_computed(self):
        # max_len = 10, cache_len = 4: free up to 6; ramp (6 − L)/4 for 6 < L ≤ 10; −1 beyond.
        length_b = jnp.array([0, 6, 7, 8, 10, 11, 100], jnp.int32)
        expected = [0.0, 0.0, (6 - 7) / 4, (6 - 8) / 4, (6 - 10) / 4, -1.0, -1.0]  # −0.25, −0.5, −1
        fn = self.variant(lambda l: rewards.overlong_penalty(l, max_len=10, cache_len=4))
        penalty_b = fn(length_b)
        assert penalty_b.dtype == jnp.float32
        np.testing.assert_allclose(penalty_b, expected, rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_hard_cutoff_and_monotone(self):
        fn = self.variant(lambda l: rewards.overlong_penalty(l, max_len=5, cache_len=0))
        np.testing.assert_array_equal(fn(jnp.array([4, 5, 6])), [0.0, 0.0, -1.0])
        ramp = self.variant(lambda l: rewards.overlong_penalty(l, max_len=64, cache_len=16))(jnp.arange(80))
        assert np.all(np.diff(np.asarray(ramp)) <= 0) and np.all((ramp >= -1) & (ramp <= 0))

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="cache_len"):
            rewards.overlong_penalty(jnp.array([1]), max_len=4, cache_len=5)


class TotalRewardTest(parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_computed_terms(self):
        verifier_b = jnp.array([1.0, 1.0, 0.0, 1.0])
        overlong_b = jnp.array([0.0, -0.5, -1.0, 0.0])
        hack_b = jnp.array([False, False, True, True])
        fn = self.variant(lambda v, o, h: rewards.total_reward(v, overlong_b=o, hack_b=h, len_coef=0.5, hack_coef=2.0))
        reward_b, terms = fn(verifier_b, overlong_b, hack_b)
        # R = v − 0.5·P_len − 2·P_hack, P_len = −overlong: [1, 1 − 0.25, 0 − 0.5 − 2, 1 − 2]
        np.testing.assert_allclose(reward_b, [1.0, 0.75, -2.5, -1.0])
        np.testing.assert_allclose(terms["overlong"], [0.0, -0.25, -0.5, 0.0])
        np.testing.assert_allclose(terms["hack"], [0.0, 0.0, -2.0, -2.0])
        np.testing.assert_allclose(terms["verifier"] + terms["overlong"] + terms["hack"], reward_b)

    def test_terms_switch_off(self):
        reward_b, terms = rewards.total_reward(jnp.array([1.0, 0.0]))
        np.testing.assert_array_equal(reward_b, [1.0, 0.0])
        np.testing.assert_array_equal(terms["overlong"], [0.0, 0.0])
        np.testing.assert_array_equal(terms["hack"], [0.0, 0.0])

    def test_shape_mismatch_raises(self):
        with pytest.raises(AssertionError):
            rewards.total_reward(jnp.array([1.0, 0.0]), hack_b=jnp.array([1.0]))
