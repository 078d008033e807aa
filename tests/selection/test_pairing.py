"""Positive–negative pairing (Weighted GRPO, arXiv 2602.03452)."""

import numpy as np
import pytest

from jaxrl_vr.selection import (
    PairedPromptSource,
    PromptTracker,
    pairing_pools,
    pairs_from_tracker,
    select_pairs,
    tracker_rates,
)
from jaxrl_vr.selection.pairing import variance_order

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


def test_pairs_from_tracker_uses_calibration_counts():
    tr = PromptTracker(4)
    # Calibration only (no training yet): 1/16 -> q+, 14/16 = 0.875 -> q-, others out.
    tr.set_calibration_counts([16, 16, 16, 0], [1, 14, 8, 0])
    pairs = pairs_from_tracker(tr, np.random.default_rng(0), 2, group_size=8, neg_c=2)
    np.testing.assert_array_equal(pairs, [[0, 1]] * 2)


# --------------------------------------------------------------- PairedPromptSource

G = 8  # q+ band (0, 0.25], q- band [0.75, 0.875] with neg_c = 2
CAL_N = 64


def _scripted_pool(num_prompts):
    # Fixed true pass rates, cycling through out-of-band and in-band values.
    cycle = np.array([0.0, 0.125, 0.5, 0.75, 0.875, 1.0, 0.25, 0.625])
    return cycle[np.arange(num_prompts) % cycle.size]


def _scripted_rollouts(rate_p, idx):
    # Deterministic outcomes: round(p·G) successes of G per visit (no model).
    successes = np.round(rate_p[idx] * G).astype(int)
    return (np.arange(G)[None, :] < successes[:, None]).astype(np.float32)


def _source_and_tracker(num_prompts, *, seed=5, calibrate=True, recency="ema", **kwargs):
    tracker = PromptTracker(num_prompts, recency=recency, decay=0.9 if recency == "ema" else None)
    if calibrate:
        rate = _scripted_pool(num_prompts)
        tracker.set_calibration_counts(np.full(num_prompts, CAL_N), np.round(rate * CAL_N))
    kwargs.setdefault("prompts_per_step", 64)
    source = PairedPromptSource(num_prompts, tracker_rates(tracker), group_size=G, seed=seed,
                                **kwargs)
    return source, tracker


def _run(source, tracker, rate_p, steps, start=0):
    choices = []
    for step in range(start, start + steps):
        choice = source.next_prompts(step)
        tracker.update(choice.idx_p, _scripted_rollouts(rate_p, choice.idx_p))
        tracker.advance()
        choices.append(choice)
    return choices


def test_source_visits_every_band_prompt_of_the_whole_pool_and_advances():
    num = 1500
    rate = _scripted_pool(num)
    source, tracker = _source_and_tracker(num)
    choices = _run(source, tracker, rate, 300)
    positive_band = np.flatnonzero((rate > 0) & (rate <= 0.25))
    negative_band = np.flatnonzero((rate >= 0.75) & (rate <= 0.875))
    assert positive_band.size == 375 and negative_band.size == 375
    paired_pos = np.zeros(num, bool)
    paired_neg = np.zeros(num, bool)
    for choice in choices:
        idx = choice.idx_p
        assert idx.shape == (64,) and idx.dtype == np.int64
        assert np.unique(idx).size == 64  # no prompt twice in a batch
        assert choice.num_pairs == 24  # ceil(0.25·64) = 16 rows from the data order
        np.testing.assert_array_equal(choice.is_pair_p, np.arange(64) < 48)
        pairs = idx[:48].reshape(24, 2)
        assert np.all((rate[pairs[:, 0]] > 0) & (rate[pairs[:, 0]] <= 0.25))
        assert np.all((rate[pairs[:, 1]] >= 0.75) & (rate[pairs[:, 1]] <= 0.875))
        paired_pos[pairs[:, 0]] = True
        paired_neg[pairs[:, 1]] = True
    # Every prompt of both bands, anywhere in the pool, was paired at least once.
    assert paired_pos[positive_band].all() and paired_neg[negative_band].all()
    # The data order keeps moving (>= 16 per step) and reached every prompt.
    assert source.data_position >= 300 * 16
    assert tracker.seen().all()


def test_unmeasured_prompts_enter_through_the_data_order():
    num = 200
    rate = _scripted_pool(num)
    source, tracker = _source_and_tracker(num, calibrate=False, prompts_per_step=16)
    first = source.next_prompts(0)
    # Nothing measured: the whole batch is the data order (epoch 0's permutation).
    assert first.num_pairs == 0 and not first.is_pair_p.any()
    np.testing.assert_array_equal(first.idx_p, source.data_order(0)[:16])
    assert source.data_position == 16
    tracker.update(first.idx_p, _scripted_rollouts(rate, first.idx_p))
    tracker.advance()
    choices = _run(source, tracker, rate, 50, start=1)
    # Once measured prompts fill both bands, pairs appear; measurement keeps spreading:
    # >= 4 data-order rows per step reach all 200 prompts by step 50 (16 + 4·50 >= 200).
    assert choices[0].num_pairs > 0 and max(c.num_pairs for c in choices) == 6  # (16 - 4)//2
    assert source.data_position >= 16 + 4 * 50
    assert tracker.measured().all()


def test_pools_short_fill_from_data_order():
    tracker = PromptTracker(10)
    tracker.set_calibration_counts(np.full(10, 8), [1, 7, 4, 4, 4, 4, 4, 4, 4, 4])
    source = PairedPromptSource(10, tracker_rates(tracker), prompts_per_step=6, group_size=8,
                                seed=1, explore_frac=0.0)
    choice = source.next_prompts(0)
    # One q+ (prompt 0) and one q- (prompt 1): one pair, 4 rows from the data order.
    assert choice.num_pairs == 1
    np.testing.assert_array_equal(choice.idx_p[:2], [0, 1])
    assert np.unique(choice.idx_p).size == 6 and source.data_position >= 4


def test_same_seed_same_draws_also_after_resume():
    num = 300
    rate = _scripted_pool(num)
    src_a, tr_a = _source_and_tracker(num, seed=11, prompts_per_step=32)
    src_b, tr_b = _source_and_tracker(num, seed=11, prompts_per_step=32)
    draws_a = [c.idx_p for c in _run(src_a, tr_a, rate, 10)]
    draws_b = [c.idx_p for c in _run(src_b, tr_b, rate, 10)]
    np.testing.assert_array_equal(draws_a, draws_b)
    # Resume from step 10's state into fresh objects, then both continue.
    src_c, tr_c = _source_and_tracker(num, seed=11, prompts_per_step=32, calibrate=False)
    tr_c.load_state_dict(tr_a.state_dict())
    src_c.load_state_dict(src_a.state_dict())
    cont_a = [c.idx_p for c in _run(src_a, tr_a, rate, 5, start=10)]
    cont_c = [c.idx_p for c in _run(src_c, tr_c, rate, 5, start=10)]
    np.testing.assert_array_equal(cont_a, cont_c)
    # Another seed draws differently.
    src_d, tr_d = _source_and_tracker(num, seed=12, prompts_per_step=32)
    draws_d = [c.idx_p for c in _run(src_d, tr_d, rate, 10)]
    assert not np.array_equal(draws_a, draws_d)
    # Two draws within one step differ (e.g. a second dynamic-sampling round).
    again = src_a.next_prompts(15).idx_p[:2 * src_a.max_pairs]
    once_more = src_a.next_prompts(15).idx_p[:2 * src_a.max_pairs]
    assert not np.array_equal(again, once_more)


def test_source_checkpoint_validation():
    source, _ = _source_and_tracker(20, prompts_per_step=4)
    state = source.state_dict()
    assert all(isinstance(v, np.ndarray) for v in state.values())
    other, _ = _source_and_tracker(20, seed=6, prompts_per_step=4)
    with pytest.raises(ValueError, match="seed"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="prompts"):
        _source_and_tracker(21, prompts_per_step=4)[0].load_state_dict(state)
    with pytest.raises(ValueError, match="explore_frac"):
        _source_and_tracker(20, prompts_per_step=4, explore_frac=1.5)
    with pytest.raises(ValueError, match="shape"):
        PairedPromptSource(5, lambda: (np.zeros(4), np.ones(4, bool)), prompts_per_step=2,
                           group_size=8).next_prompts(0)


def test_bad_arguments():
    with pytest.raises(ValueError, match="neg_c"):
        pairing_pools(RATES, COUNTS, group_size=8, neg_c=9)
    with pytest.raises(ValueError, match="pos_min < pos_max"):
        pairing_pools(RATES, COUNTS, group_size=8, pos_max=0.0)
    with pytest.raises(ValueError, match="strategy"):
        select_pairs(np.random.default_rng(0), pairing_pools(RATES, COUNTS, group_size=8), RATES, 1, strategy="x")


# ------------------------------------------- the paper's fixed tiny set and variance baseline


def test_variance_order_ranks_measured_uncertain_prompts_by_p_times_one_minus_p():
    rate = np.array([0.5, 0.1, 0.9, 0.0, 1.0, 0.5, 0.3])
    measured = np.array([True, True, True, True, True, False, True])
    # p(1-p): .25, .09, .09, 0 (out), 0 (out), unmeasured (out), .21.
    order = variance_order(np.random.default_rng(0), rate, measured)
    assert order[0] == 0 and order[1] == 6 and set(order[2:].tolist()) == {1, 2} and order.size == 4
    ties = {tuple(variance_order(np.random.default_rng(s), rate, measured)[2:]) for s in range(8)}
    assert ties == {(1, 2), (2, 1)}  # equal variances take turns


def test_variance_selection_takes_the_uncertain_prompts_unpaired():
    source, tracker = _source_and_tracker(40, select="variance", prompts_per_step=8)
    rate = _scripted_pool(40)
    choice = source.next_prompts(0)
    # ceil(0.25·8) = 2 data-order rows; 6 selected: the five prompts at rate 0.5 (p(1-p) = .25),
    # then one at 0.625 (.234; ahead of 0.75 and 0.25 at .1875).
    assert choice.num_pairs == 0 and not choice.is_pair_p.any()
    np.testing.assert_array_equal(rate[choice.idx_p[:6]], [0.5] * 5 + [0.625])
    assert np.unique(choice.idx_p).size == 8
    assert source.data_position >= 2


def test_random_pairs_take_the_data_order_without_reading_the_rates():
    # The ablation of the q+/q- choice: the same rows are marked as pairs, from the data order.
    source, _ = _source_and_tracker(40, select="random_pairs", prompts_per_step=8)
    choice = source.next_prompts(0)
    # ceil(0.25·8) = 2 explore rows, 6 selected rows = 3 pairs, all from the epoch-0 order.
    assert choice.num_pairs == 3 and choice.is_pair_p.tolist() == [True] * 6 + [False] * 2
    np.testing.assert_array_equal(choice.idx_p, source.data_order(0)[:8])
    assert source.data_position == 8
    blind = PairedPromptSource(40, lambda: (np.zeros(40), np.zeros(40, bool)), prompts_per_step=8,
                               group_size=G, seed=5, select="random_pairs")
    np.testing.assert_array_equal(blind.next_prompts(0).idx_p, choice.idx_p)  # rates unread
    fixed = PairedPromptSource(40, tracker_rates(PromptTracker(40)), prompts_per_step=8, group_size=G,
                               select="random_pairs", fixed_prompts=4)
    first = fixed.next_prompts(0)
    assert first.is_pair_p.all() and first.num_pairs == 4 and np.unique(first.idx_p).size == 4
    np.testing.assert_array_equal(fixed.next_prompts(1).idx_p, first.idx_p)
    with pytest.raises(ValueError, match="even"):
        PairedPromptSource(40, tracker_rates(PromptTracker(40)), prompts_per_step=8, group_size=G,
                           select="random_pairs", fixed_prompts=1)


def test_fixed_pairs_are_chosen_once_and_repeated_every_step():
    source, tracker = _source_and_tracker(40, fixed_prompts=2, prompts_per_step=4)
    rate = _scripted_pool(40)
    choices = _run(source, tracker, rate, 3)
    first = choices[0].idx_p
    assert 0 < rate[first[0]] <= 0.25 and 0.75 <= rate[first[1]] <= 0.875
    for choice in choices:
        np.testing.assert_array_equal(choice.idx_p, np.tile(first[:2], 2))
        assert choice.is_pair_p.all() and choice.num_pairs == 2
    assert source.data_position == 0  # the data order is never read
    # The set is part of the checkpoint; a source with another set size refuses it.
    resumed, _ = _source_and_tracker(40, fixed_prompts=2, prompts_per_step=4, calibrate=False)
    resumed.load_state_dict(source.state_dict())
    np.testing.assert_array_equal(resumed.next_prompts(3).idx_p, choices[0].idx_p)
    other, _ = _source_and_tracker(40, fixed_prompts=4, prompts_per_step=4)
    with pytest.raises(ValueError, match="fixed_prompts"):
        other.load_state_dict(source.state_dict())
    legacy = {k: v for k, v in source.state_dict().items() if k != "fixed_idx"}
    _source_and_tracker(40, prompts_per_step=4)[0].load_state_dict(legacy)  # older checkpoints


def test_fixed_variance_set_and_too_few_candidates():
    source, _ = _source_and_tracker(40, fixed_prompts=2, prompts_per_step=4, select="variance")
    choice = source.next_prompts(0)
    assert np.all(_scripted_pool(40)[choice.idx_p] == 0.5) and not choice.is_pair_p.any()
    np.testing.assert_array_equal(choice.idx_p[:2], choice.idx_p[2:])
    tracker = PromptTracker(6)
    tracker.set_calibration_counts(np.full(6, 8), [1, 7, 8, 8, 0, 0])  # one q+, one q-
    short = PairedPromptSource(6, tracker_rates(tracker), prompts_per_step=4, group_size=8, fixed_prompts=4)
    with pytest.raises(ValueError, match=r"needs 2 q\+ and 2 q- prompts.*1 q\+ and 1 q-.*fixed_prompts"):
        short.next_prompts(0)
    with pytest.raises(ValueError, match="fixed_prompts"):
        PairedPromptSource(6, tracker_rates(tracker), prompts_per_step=4, group_size=8, fixed_prompts=3)
