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
    for query in ("pass_rate", "p_base", "seen", "visits", "last_step"):
        np.testing.assert_array_equal(getattr(dst, query)(), getattr(src, query)())
    np.testing.assert_array_equal(dst.counts()[0], src.counts()[0])
    assert dst.step == src.step and dst.base_frozen
    # Both continue identically after the resume.
    for t in (src, dst):
        t.update([1, 4], np.array([[1, 0, 0, 0], [1, 1, 1, 0]], np.float32), step=20)
    np.testing.assert_array_equal(dst.pass_rate(), src.pass_rate())


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
