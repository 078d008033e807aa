"""The trajectory type: group operations keep every field aligned, masks zero where invalid."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxrl_vr import trajectory as traj_lib
from jaxrl_vr.trajectory import RolloutStats

from trajectory_testlib import T, scripted


def test_group_helpers_keep_fields_aligned():
    sample = scripted(lambda p, g, c: float(g == p % 2))
    a = sample(np.array([0, 1]), 2)
    wide = traj_lib.widen(a, 3)
    assert wide.valid_pg.tolist() == [[True, True, False], [True, True, False]]
    assert wide.tokens_bt.shape == (6, T) and not wide.loss_mask_bt[[2, 5]].any()
    more = sample(np.array([1]), 1)
    placed = traj_lib.place_samples(wide, more, np.array([1]), 2)
    assert placed.valid_pg[1].all() and placed.stats.generated_samples == 5
    picked = traj_lib.select_groups(placed, np.array([False, True]))
    assert picked.prompt_idx_p.tolist() == [1] and picked.scores_b.shape == (3,)
    padded = traj_lib.pad_groups(picked, 3)
    assert padded.valid_pg.sum() == 3 and padded.prompt_idx_p.tolist() == [1, 1, 1]
    assert padded.kl_weight_p.shape == (3,) and padded.paired_p.shape == (3,)
    with pytest.raises(ValueError, match="fit"):
        traj_lib.place_samples(wide, more, np.array([1]), 3)


def test_single_turn_responses_are_one_sampled_segment():
    traj = scripted(lambda p, g, c: 1.0)(np.array([4]), 2)
    np.testing.assert_array_equal(traj.token_mask_bt, traj.loss_mask_bt)
    assert traj.adv_bt is None and traj.behaviour_logp_bt is None
    assert traj.kl_weight_p.tolist() == [0.0] and traj.paired_p.tolist() == [False]
    np.testing.assert_allclose(traj.per_group(traj.scores_b), [[1.0, 1.0]])


def test_rollout_stats_add_field_by_field_and_merge_detector_counts():
    a = RolloutStats(generated_tokens=3, generated_samples=2, rounds=1, detector_counts=(("x", 1.0),))
    b = RolloutStats(generated_tokens=5, generated_samples=4, rounds=1, verifier_errors=2,
                     detector_counts=(("x", 2.0), ("y", 1.0)), strategy="last")
    total = a + b
    assert (total.generated_tokens, total.generated_samples, total.rounds, total.verifier_errors) == (8, 6, 2, 2)
    assert total.detector_counts == (("x", 3.0), ("y", 1.0)) and total.strategy == "last"


@given(valid=st.lists(st.lists(st.booleans(), min_size=3, max_size=3), min_size=1, max_size=4),
       width=st.integers(3, 5))
def test_invalid_samples_carry_no_tokens_rewards_or_scores(valid, width):
    traj = scripted(lambda p, g, c: 1.0)(np.arange(len(valid)), 3)
    traj = traj_lib.widen(traj_lib.invalidate(traj, np.asarray(valid)), width)
    invalid_b = ~traj.valid_b
    for name in ("token_mask_bt", "loss_mask_bt", "scores_b", "rewards_b", "overlong_b", "length_b",
                 "tests_total_b"):
        assert not np.asarray(getattr(traj, name))[invalid_b].any(), name
    padded = traj_lib.pad_groups(traj, len(valid) + 2)
    assert not padded.valid_pg[len(valid):].any() and not padded.loss_mask_bt[len(valid) * width:].any()


def test_per_test_counts_follow_their_samples_through_group_operations():
    traj = scripted(lambda p, g, c: 1.0)(np.array([0, 1]), 2)
    assert traj.tests_total_b.tolist() == [0, 0, 0, 0]  # no test-based verifier: 0 / 0
    traj = traj._replace(tests_passed_b=np.array([1, 2, 3, 4], np.int32),
                         tests_total_b=np.array([5, 5, 5, 5], np.int32))
    picked = traj_lib.select_groups(traj_lib.widen(traj, 3), np.array([1]))
    assert picked.tests_passed_b.tolist() == [3, 4, 0] and picked.tests_total_b.tolist() == [5, 5, 0]
    dropped = traj_lib.invalidate(traj, np.array([[True, False], [True, True]]))
    assert dropped.tests_passed_b.tolist() == [1, 0, 3, 4]


def test_turn_and_signal_fields_follow_every_group_op_with_no_turn_no_signal_where_invalid():
    def with_signals(traj):
        num_b = traj.tokens_bt.shape[0]
        turn_bt = np.where(traj.loss_mask_bt, 0, -1).astype(np.int32)
        signals_bkn = np.arange(num_b * 2, dtype=np.float32).reshape(num_b, 1, 2) / 10
        return traj._replace(turn_bt=turn_bt, signals_bkn=signals_bkn)

    sample = scripted(lambda p, g, c: 1.0)
    a = with_signals(sample(np.array([0, 1]), 2))
    wide = traj_lib.widen(a, 3)
    assert wide.signals_bkn.shape == (6, 1, 2) and wide.turn_bt.shape == (6, T)
    assert np.isnan(wide.signals_bkn[[2, 5]]).all() and (wide.turn_bt[[2, 5]] == -1).all()
    np.testing.assert_array_equal(wide.signals_bkn[[0, 1, 3, 4]], a.signals_bkn)
    more = with_signals(sample(np.array([1]), 1))
    placed = traj_lib.place_samples(wide, more, np.array([1]), 2)
    np.testing.assert_array_equal(placed.signals_bkn[5], more.signals_bkn[0])
    np.testing.assert_array_equal(placed.turn_bt[5], more.turn_bt[0])
    picked = traj_lib.select_groups(placed, np.array([1]))
    np.testing.assert_array_equal(picked.signals_bkn, placed.signals_bkn[3:])
    joined = traj_lib.concat_groups([placed, picked])
    assert joined.signals_bkn.shape == (9, 1, 2) and joined.turn_bt.shape == (9, T)
    cut = traj_lib.invalidate(placed, np.array([[True, False, True], [True, True, True]]))
    assert np.isnan(cut.signals_bkn[1]).all() and (cut.turn_bt[1] == -1).all()
    np.testing.assert_array_equal(cut.signals_bkn[0], placed.signals_bkn[0])
    padded = traj_lib.pad_groups(picked, 3)
    assert np.isnan(padded.signals_bkn[3:]).all() and (padded.turn_bt[3:] == -1).all()
    with pytest.raises(ValueError, match="only some have turn_bt"):
        traj_lib.concat_groups([a, sample(np.array([2]), 2)])
    with pytest.raises(ValueError, match="only some have"):
        traj_lib.place_samples(wide, sample(np.array([1]), 1), np.array([1]), 2)
