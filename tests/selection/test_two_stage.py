"""Two-stage probing and adaptive G under a fixed total."""

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxrl_vr.selection import (
    adaptive_group_sizes,
    continuation_counts,
    group_valid_mask,
    merge_probe_and_continuation,
    probe_continue,
    probe_pass_rate,
)


class ProbeTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_pass_rate_ragged(self):
        rewards = jnp.array([[1, 0, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1]], jnp.float32)
        valid = jnp.array([[1, 1, 1, 1], [1, 0, 1, 0], [0, 0, 0, 0]], bool)
        # 3/4; valid {1, 0} -> 1/2; no valid samples -> 0 (not NaN).
        np.testing.assert_allclose(self.variant(probe_pass_rate)(rewards, valid), [0.75, 0.5, 0.0])

    @chex.variants(with_jit=True, without_jit=True)
    def test_continue_band_inclusive(self):
        rewards = jnp.array([[1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], jnp.float32)
        go = self.variant(lambda r: probe_continue(r, lo=0.25, hi=0.75))(rewards)
        # rates 0.75, 0, 0.5, 1, 0.25 with band [0.25, 0.75] inclusive.
        np.testing.assert_array_equal(go, [True, False, True, False, True])

    @chex.variants(with_jit=True, without_jit=True)
    def test_no_valid_never_continues(self):
        go = self.variant(lambda r, v: probe_continue(r, v, lo=0.0, hi=1.0))(
            jnp.zeros((2, 2)), jnp.array([[False, False], [True, False]]))
        np.testing.assert_array_equal(go, [False, True])


def test_continuation_and_merge():
    go = np.array([True, False, True])
    np.testing.assert_array_equal(continuation_counts(go, g_probe=2, g_full=5), [3, 0, 3])
    probe = np.array([[1, 0], [1, 1], [0, 1]], np.float32)
    extra = np.array([[1, 1, 0], [1, 1, 1], [0, 0, 1]], np.float32)
    rewards, valid = merge_probe_and_continuation(probe, extra, go)
    np.testing.assert_array_equal(rewards, [[1, 0, 1, 1, 0], [1, 1, 0, 0, 0], [0, 1, 0, 0, 1]])
    np.testing.assert_array_equal(valid.sum(axis=1), [5, 2, 5])
    # Continued rows only (prompts 0 and 2), scattered back in order.
    r2, v2 = merge_probe_and_continuation(probe, extra[[0, 2]], go)
    np.testing.assert_array_equal(r2, rewards)
    np.testing.assert_array_equal(v2, valid)
    with pytest.raises(ValueError, match="continued prompts"):
        merge_probe_and_continuation(probe, extra[:1], go)
    with pytest.raises(ValueError, match="g_probe"):
        continuation_counts(go, g_probe=4, g_full=2)
    with pytest.raises(ValueError, match="lo <= hi"):
        probe_continue(jnp.zeros((1, 2)), lo=0.8, hi=0.2)


def test_adaptive_hand_cases():
    p = [0.5, 0.0, 1.0, 0.5]
    # total 16, g_min 2: base 8, the other 8 split equally over the two in-band prompts.
    np.testing.assert_array_equal(
        adaptive_group_sizes(p, total=16, g_min=2, g_max=8, lo=0.1, hi=0.9, weight="uniform"), [6, 2, 2, 6])
    # total 24: in-band prompts absorb 6 each (cap 8); leftover 4 goes 2/2 to the others.
    np.testing.assert_array_equal(
        adaptive_group_sizes(p, total=24, g_min=2, g_max=8, lo=0.1, hi=0.9, weight="uniform"), [8, 4, 4, 8])
    # Variance weights 0.25 and 0.16 for budget 9: shares 5.4878, 3.5122 -> floors 5, 3;
    # the last sample goes to the larger remainder (0.5122, prompt 1): [2+5, 2+4].
    np.testing.assert_array_equal(
        adaptive_group_sizes([0.5, 0.2], total=13, g_min=2, g_max=8, lo=0.1, hi=0.9), [7, 6])
    # Unknown prompts are in-band with the maximal variance weight 1/4.
    np.testing.assert_array_equal(
        adaptive_group_sizes([0.0, 0.0], total=6, g_min=1, g_max=8, lo=0.1, hi=0.9,
                             known_p=[False, True]), [5, 1])


def test_adaptive_errors():
    with pytest.raises(ValueError, match="total"):
        adaptive_group_sizes([0.5, 0.5], total=20, g_min=2, g_max=8)
    with pytest.raises(ValueError, match="weight"):
        adaptive_group_sizes([0.5], total=4, g_min=2, g_max=8, weight="nope")


@settings(max_examples=60, deadline=None)
@given(
    p=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=12),
    g_min=st.integers(1, 4),
    extra=st.integers(0, 8),
    frac=st.floats(0.0, 1.0),
    weight=st.sampled_from(["uniform", "variance"]),
)
def test_adaptive_total_conserved(p, g_min, extra, frac, weight):
    g_max = g_min + extra
    lo_total, hi_total = len(p) * g_min, len(p) * g_max
    total = lo_total + int(round(frac * (hi_total - lo_total)))
    g = adaptive_group_sizes(p, total=total, g_min=g_min, g_max=g_max, lo=0.1, hi=0.9, weight=weight)
    assert int(g.sum()) == total
    assert g.min() >= g_min and g.max() <= g_max
    # Out-of-band prompts only get more than g_min once every in-band prompt is full.
    p = np.asarray(p)
    in_band = (p >= 0.1) & (p <= 0.9)
    if np.any(g[~in_band] > g_min):
        assert np.all(g[in_band] == g_max)
    # Deterministic.
    np.testing.assert_array_equal(
        g, adaptive_group_sizes(p, total=total, g_min=g_min, g_max=g_max, lo=0.1, hi=0.9, weight=weight))


def test_group_valid_mask():
    np.testing.assert_array_equal(group_valid_mask([2, 0, 3], 3),
                                  [[1, 1, 0], [0, 0, 0], [1, 1, 1]])
    with pytest.raises(ValueError, match="group sizes"):
        group_valid_mask([4], 3)
