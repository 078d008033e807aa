"""PromptTracker: hand-computed counts, recency models, base cache, checkpoints."""

import numpy as np
import pytest

from jaxrl_vr.selection import PromptTracker, success_counts


def test_success_counts_threshold_and_valid():
    rewards = np.array([[1.0, 0.7, 0.2, 0.0], [1.0, 1.0, 0.0, 0.0]])
    valid = np.array([[True, True, True, False], [True, False, True, False]])
    n, c = success_counts(rewards, valid, success_threshold=0.5)
    # row 0: valid {1.0, 0.7, 0.2} -> 3 samples, 2 >= 0.5; row 1: valid {1.0, 0.0} -> 2, 1.
    np.testing.assert_array_equal(n, [3, 2])
    np.testing.assert_array_equal(c, [2, 1])


def test_update_all_history_and_prior():
    tr = PromptTracker(3)
    tr.update([0, 2], np.array([[1, 0, 1, 0], [1, 1, 1, 1]], np.float32), step=0)
    n, c = tr.counts()
    np.testing.assert_array_equal(n, [4, 0, 4])
    np.testing.assert_array_equal(c, [2, 0, 4])
    # No prior: 2/4, unseen -> fill 0, 4/4.
    np.testing.assert_allclose(tr.pass_rate(), [0.5, 0.0, 1.0])
    # Beta(1, 1): (2+1)/(4+2) = 0.5, (0+1)/(0+2) = 0.5, (4+1)/(4+2) = 5/6.
    np.testing.assert_allclose(tr.pass_rate(prior=(1, 1)), [0.5, 0.5, 5 / 6])
    np.testing.assert_array_equal(tr.seen(), [True, False, True])
    tr.update([0], np.array([[1, 1, 1, 1]], np.float32), step=1)
    # prompt 0: (2 + 4) / (4 + 4) = 0.75
    np.testing.assert_allclose(tr.pass_rate([0]), [0.75])
    np.testing.assert_array_equal(tr.visits(), [2, 0, 1])
    np.testing.assert_array_equal(tr.last_step(), [1, -1, 0])


def test_repeated_prompt_in_batch_is_one_visit():
    tr = PromptTracker(2, recency="window", window=1)
    tr.update([1, 1], np.array([[1, 0], [1, 1]], np.float32), step=0)
    # Both rows merge into one visit: n = 4, c = 3 (a window of 1 keeps the whole visit).
    n, c = tr.counts([1])
    assert (n[0], c[0]) == (4, 3)
    assert tr.visits([1])[0] == 1


def test_ema_decay_per_step():
    tr = PromptTracker(2, recency="ema", decay=0.5)
    tr.update([0], np.array([[1, 0]], np.float32), step=0)  # n0 = 2, c0 = 1
    tr.update([0], np.array([[1, 1]], np.float32), step=2)  # n0 = 2*0.25 + 2 = 2.5, c0 = 0.25 + 2 = 2.25
    n, c = tr.counts([0])
    np.testing.assert_allclose([n[0], c[0]], [2.5, 2.25])
    np.testing.assert_allclose(tr.pass_rate([0]), [0.9])
    tr.update([1], np.array([[0, 0]], np.float32), step=3)
    # Read at step 3: prompt 0 aged one step: n = 1.25, c = 1.125; the bare rate stays 0.9,
    # with Beta(1, 1): (1.125 + 1) / (1.25 + 2) = 2.125 / 3.25.
    n, c = tr.counts([0])
    np.testing.assert_allclose([n[0], c[0]], [1.25, 1.125])
    np.testing.assert_allclose(tr.pass_rate([0]), [0.9])
    np.testing.assert_allclose(tr.pass_rate([0], prior=(1, 1)), [2.125 / 3.25])
    # Lifetime totals never decay.
    np.testing.assert_array_equal(tr.totals()[0], [4, 2])


def test_window_keeps_last_visits():
    tr = PromptTracker(1, recency="window", window=2)
    for step, row in enumerate([[1, 1], [0, 0], [1, 0]]):
        tr.update([0], np.array([row], np.float32), step=step)
    # Last two visits: (2, 0) and (2, 1) -> n = 4, c = 1.
    n, c = tr.counts()
    assert (n[0], c[0]) == (4, 1)
    np.testing.assert_allclose(tr.pass_rate(), [0.25])
    np.testing.assert_array_equal(tr.totals()[1], [3])


def test_base_cache_chunks_and_freeze():
    tr = PromptTracker(3)
    tr.record_base([0, 1], np.array([[1, 0, 0, 0], [1, 1, 1, 0]], np.float32))
    tr.record_base([0], np.array([[1, 1, 0, 0]], np.float32))
    n, c = tr.base_counts()
    np.testing.assert_array_equal(n, [8, 4, 0])
    np.testing.assert_array_equal(c, [3, 3, 0])
    np.testing.assert_allclose(tr.p_base(), [3 / 8, 0.75, 0.0])
    assert np.isnan(tr.p_base(fill=np.nan)[2])
    np.testing.assert_array_equal(tr.has_base(), [True, True, False])
    tr.freeze_base()
    with pytest.raises(RuntimeError, match="frozen"):
        tr.record_base([2], np.ones((1, 4), np.float32))
    # Training updates never touch the base cache.
    tr.update([0], np.ones((1, 4), np.float32))
    np.testing.assert_array_equal(tr.base_counts()[1], [3, 3, 0])


def _populated(tracker: PromptTracker) -> PromptTracker:
    rng = np.random.default_rng(0)
    for step in range(5):
        idx = rng.choice(tracker.num_prompts, size=3, replace=False)
        tracker.update(idx, (rng.random((3, 4)) < 0.5).astype(np.float32), step=2 * step)
    tracker.record_base(np.arange(tracker.num_prompts), (rng.random((tracker.num_prompts, 8)) < 0.3).astype(np.float32))
    tracker.freeze_base()
    tracker.set_calibration_counts(np.full(tracker.num_prompts, 16), rng.integers(0, 17, tracker.num_prompts))
    return tracker


@pytest.mark.parametrize("kwargs", [{}, {"recency": "ema", "decay": 0.9}, {"recency": "window", "window": 3}])
def test_state_dict_round_trip(kwargs, tmp_path):
    uids = [f"q{i}" for i in range(6)]
    src = _populated(PromptTracker(6, uids=uids, prior=(1.0, 1.0), **kwargs))
    state = src.state_dict()
    assert all(isinstance(v, np.ndarray) for v in state.values())
    np.savez(tmp_path / "t.npz", **state)
    loaded = dict(np.load(tmp_path / "t.npz"))
    dst = PromptTracker(**src.config_dict())
    dst.load_state_dict(loaded)
    for query in ("pass_rate", "p_base", "seen", "visits", "last_step", "policy_rate", "measured"):
        np.testing.assert_array_equal(getattr(dst, query)(), getattr(src, query)())
    np.testing.assert_array_equal(dst.counts()[0], src.counts()[0])
    assert dst.step == src.step and dst.base_frozen
    np.testing.assert_array_equal(dst.calibration_counts()[1], src.calibration_counts()[1])
    # Both continue identically after the resume.
    for t in (src, dst):
        t.advance(20)
        t.update([1, 4], np.array([[1, 0, 0, 0], [1, 1, 1, 0]], np.float32))
    np.testing.assert_array_equal(dst.pass_rate(), src.pass_rate())
    np.testing.assert_array_equal(dst.policy_rate(), src.policy_rate())


def test_state_dict_through_orbax(tmp_path):
    import orbax.checkpoint as ocp

    src = _populated(PromptTracker(4, recency="ema", decay=0.8))
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(tmp_path / "tracker", src.state_dict())
        ckpt.wait_until_finished()
        restored = ckpt.restore(tmp_path / "tracker")
    dst = PromptTracker(4, recency="ema", decay=0.8)
    dst.load_state_dict(restored)
    np.testing.assert_array_equal(dst.pass_rate(), src.pass_rate())
    np.testing.assert_array_equal(dst.base_counts()[1], src.base_counts()[1])


def test_load_rejects_mismatch():
    src = _populated(PromptTracker(3, uids=["a", "b", "c"]))
    state = src.state_dict()
    with pytest.raises(ValueError, match="different prompt set"):
        PromptTracker(3, uids=["a", "b", "d"]).load_state_dict(state)
    with pytest.raises(ValueError, match="recency"):
        PromptTracker(3, uids=["a", "b", "c"], recency="ema", decay=0.5).load_state_dict(state)
    with pytest.raises(ValueError, match="4 prompts|3 prompts"):
        PromptTracker(4).load_state_dict(state)
    partial = dict(state)
    del partial["base_c_p"]
    with pytest.raises(KeyError, match="base_c_p"):
        PromptTracker(3, uids=["a", "b", "c"]).load_state_dict(partial)


def test_errors_and_uids():
    tr = PromptTracker(3, uids=["x", "y", "z"])
    np.testing.assert_array_equal(tr.index_of(["z", "x"]), [2, 0])
    with pytest.raises(KeyError, match="nope"):
        tr.index_of(["nope"])
    with pytest.raises(TypeError, match="integers"):
        tr.update(np.array([0.0]), np.ones((1, 2)))
    with pytest.raises(IndexError, match="out of range"):
        tr.update([3], np.ones((1, 2)))
    with pytest.raises(ValueError, match="one index per row"):
        tr.update([0, 1], np.ones((1, 2)))
    tr.update([0], np.ones((1, 2)), step=5)
    with pytest.raises(ValueError, match="non-decreasing"):
        tr.update([0], np.ones((1, 2)), step=4)
    with pytest.raises(ValueError, match="distinct"):
        PromptTracker(2, uids=["a", "a"])
    with pytest.raises(ValueError, match="decay"):
        PromptTracker(2, recency="ema")
    with pytest.raises(ValueError, match="window"):
        PromptTracker(2, window=3)


def test_summary_is_jsonable():
    import json

    tr = PromptTracker(4)
    tr.update([0, 1], np.array([[1, 1], [0, 0]], np.float32))
    out = tr.summary()
    json.dumps(out)
    assert out["tracker/frac_seen"] == 0.5
    assert out["tracker/mean_pass_rate"] == 0.5
    assert out["tracker/frac_all_solved"] == 0.5 and out["tracker/frac_none_solved"] == 0.5


def test_update_records_at_the_current_step_and_advance_moves_it():
    tr = PromptTracker(2, recency="ema", decay=0.5)
    assert tr.step == 0
    # Two sampling rounds of the same RL step (e.g. dynamic sampling): one step, no decay.
    tr.update([0], np.array([[1, 0]], np.float32))
    tr.update([0], np.array([[1, 1]], np.float32))
    assert tr.step == 0
    n, c = tr.counts([0])
    np.testing.assert_allclose([n[0], c[0]], [4.0, 3.0])
    assert tr.advance() == 1
    # One RL step later: decayed once, n = 2, c = 1.5, whatever the number of rounds.
    n, c = tr.counts([0])
    np.testing.assert_allclose([n[0], c[0]], [2.0, 1.5])
    assert tr.advance(3) == 3
    np.testing.assert_allclose(tr.counts([0])[0], [0.5])
    np.testing.assert_array_equal(tr.last_step(), [0, -1])
    with pytest.raises(ValueError, match="non-decreasing"):
        tr.advance(2)


def test_calibration_counts_seed_policy_rate_and_newer_evidence_wins():
    tr = PromptTracker(3)
    # Calibration pass: 64 samples each; prompt 2 not calibrated.
    tr.set_calibration_counts([64, 64, 0], [8, 56, 0])
    np.testing.assert_array_equal(tr.measured(), [True, True, False])
    # Unvisited prompts keep the calibrated rate exactly, whatever the cap.
    np.testing.assert_allclose(tr.policy_rate(calibration_cap=8.0), [0.125, 0.875, 0.0])
    np.testing.assert_allclose(tr.policy_rate(calibration_cap=None), [0.125, 0.875, 0.0])
    # The base cache (PBA) is separate: untouched by calibration counts and vice versa.
    np.testing.assert_array_equal(tr.has_base(), [False, False, False])
    tr.set_base_counts([4, 4, 4], [1, 2, 3])
    np.testing.assert_array_equal(tr.calibration_counts()[1], [8, 56, 0])
    # Prompt 0 is visited: 8 samples, 4 successes. The calibration pass is capped at 8
    # samples' worth (s = 8/64): n = 8 + 8 = 16, c = 4 + 1 = 5 -> 5/16 = 0.3125
    # (uncapped: (4 + 8)/(8 + 64) = 1/6, the old evidence would dominate).
    tr.update([0, 2], np.array([[1, 1, 1, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0]], np.float32))
    np.testing.assert_allclose(tr.policy_counts([0])[0], [16.0])
    np.testing.assert_allclose(tr.policy_rate(calibration_cap=8.0), [0.3125, 0.875, 0.125])
    np.testing.assert_allclose(tr.policy_rate(calibration_cap=None)[0], 1 / 6)
    np.testing.assert_array_equal(tr.measured(), [True, True, True])
    np.testing.assert_array_equal(tr.measured(min_count=65), [True, False, False])
    # The training-only pass rate ignores calibration.
    np.testing.assert_allclose(tr.pass_rate(), [0.5, 0.0, 0.125])


def test_calibration_decays_with_ema_from_its_step():
    tr = PromptTracker(1, recency="ema", decay=0.5)
    tr.set_calibration_counts([8], [2])  # at step 0
    tr.advance(2)
    tr.update([0], np.array([[1, 1, 1, 1]], np.float32))  # at step 2
    # Calibration aged 2 steps: 8·0.25 = 2 samples, 0.5 successes; training 4 and 4.
    n, c = tr.policy_counts(calibration_cap=8.0)
    np.testing.assert_allclose([n[0], c[0]], [6.0, 4.5])
    tr.advance()
    # One step later both halve; the rate is unchanged: 4.5/6 = 0.75.
    np.testing.assert_allclose(tr.policy_rate(), [0.75])
    np.testing.assert_allclose(tr.policy_counts()[0], [3.0])


def test_record_calibration_uses_the_success_threshold():
    tr = PromptTracker(2, success_threshold=0.9)
    tr.record_calibration([0, 1], np.array([[1.0, 0.8, 0.95, 0.0], [0.5, 0.5, 1.0, 1.0]]))
    np.testing.assert_array_equal(tr.calibration_counts()[1], [2, 2])
    with pytest.raises(ValueError, match="calibration counts need"):
        tr.set_calibration_counts([4, 4], [5, 0])


def test_loads_version_1_checkpoint_without_calibration():
    tr = PromptTracker(3)
    tr.update([0], np.ones((1, 4), np.float32))
    state = tr.state_dict()
    for key in ("cal_n_p", "cal_c_p", "cal_step"):
        del state[key]
    state["version"] = np.asarray(1, np.int64)
    dst = PromptTracker(3)
    dst.load_state_dict(state)
    np.testing.assert_array_equal(dst.pass_rate(), tr.pass_rate())
    np.testing.assert_array_equal(dst.calibration_counts()[0], [0, 0, 0])
