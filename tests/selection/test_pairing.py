"""Positive–negative pairing (Weighted GRPO, arXiv 2602.03452)."""

import numpy as np
import pytest

from jaxrl_vr.selection import PromptTracker, pairing_pools, pairs_from_tracker, select_pairs

# G = 8, neg_c = 2: the brittle band is [1 − 2/8, 1 − 1/8] = [0.75, 0.875].
RATES = np.array([0.0, 0.125, 0.25, 0.5, 0.75, 0.875, 1.0, 0.1, 0.8])
COUNTS = np.array([8, 8, 8, 8, 8, 8, 8, 2, 8])


def test_pools_hand_case():
    pools = pairing_pools(RATES, COUNTS, group_size=8, neg_c=2, pos_max=0.25, min_count=4)
    # q+: 0 < rate <= 0.25 with >= 4 samples -> prompts 1, 2 (prompt 7 has only 2 samples).
    np.testing.assert_array_equal(np.flatnonzero(pools.positive_p), [1, 2])
    # q-: 0.75 <= rate <= 0.875 -> prompts 4, 5, 8; never solved-always (6).
    np.testing.assert_array_equal(np.flatnonzero(pools.negative_p), [4, 5, 8])
    assert not np.any(pools.positive_p & pools.negative_p)
    eligible = np.ones(9, bool)
    eligible[2] = False
    restricted = pairing_pools(RATES, COUNTS, group_size=8, pos_max=0.25, min_count=4, eligible_p=eligible)
    np.testing.assert_array_equal(np.flatnonzero(restricted.positive_p), [1])


def test_select_random_deterministic_and_in_pools():
    pools = pairing_pools(RATES, COUNTS, group_size=8, pos_max=0.25, min_count=4)
    a = select_pairs(np.random.default_rng(3), pools, RATES, 5)
    b = select_pairs(np.random.default_rng(3), pools, RATES, 5)
    np.testing.assert_array_equal(a, b)
    assert a.shape == (5, 2) and a.dtype == np.int64
    assert set(a[:, 0]) <= {1, 2} and set(a[:, 1]) <= {4, 5, 8}
    # Without replacement when the pool is large enough.
    two = select_pairs(np.random.default_rng(0), pools, RATES, 2)
    assert sorted(two[:, 0]) == [1, 2]


def test_select_extreme():
    pools = pairing_pools(RATES, COUNTS, group_size=8, pos_max=0.25, min_count=4)
    pairs = select_pairs(np.random.default_rng(0), pools, RATES, 4, strategy="extreme")
    # q+ by rate ascending (0.125 -> 1, 0.25 -> 2), cycled; q- by rate descending (5, 8, 4), cycled.
    np.testing.assert_array_equal(pairs, [[1, 5], [2, 8], [1, 4], [2, 5]])


def test_empty_pool_returns_no_pairs():
    pools = pairing_pools(np.array([0.0, 1.0]), np.array([8, 8]), group_size=8)
    assert select_pairs(np.random.default_rng(0), pools, np.array([0.0, 1.0]), 3).shape == (0, 2)


def test_pairs_from_tracker():
    tr = PromptTracker(4)
    g = 8
    rows = np.zeros((4, g), np.float32)
    rows[0, :1] = 1  # 1/8: hard but solvable
    rows[1, :7] = 1  # 7/8: easy but brittle
    rows[2, :] = 1  # always solved
    tr.update(np.arange(4), rows)  # prompt 3 never solved
    pairs = pairs_from_tracker(tr, np.random.default_rng(0), 3, group_size=g, neg_c=2, pos_max=0.25)
    np.testing.assert_array_equal(pairs, [[0, 1]] * 3)


def test_bad_arguments():
    with pytest.raises(ValueError, match="neg_c"):
        pairing_pools(RATES, COUNTS, group_size=8, neg_c=9)
    with pytest.raises(ValueError, match="pos_min < pos_max"):
        pairing_pools(RATES, COUNTS, group_size=8, pos_max=0.0)
    with pytest.raises(ValueError, match="strategy"):
        select_pairs(np.random.default_rng(0), pairing_pools(RATES, COUNTS, group_size=8), RATES, 1, strategy="x")
