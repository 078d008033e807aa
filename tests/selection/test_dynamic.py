"""DAPO dynamic sampling: keep mask, batcher fill/budget/filtered fraction, re-check."""

import itertools

import chex
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_vr.selection import (
    DynamicBatcher,
    RecheckSchedule,
    informative_groups,
    prob_all_wrong,
    prob_uninformative,
)
from jaxrl_vr.selection.dynamic import _informative_np


class InformativeGroupsTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_case(self):
        rewards = jnp.array([[1, 1, 1], [0, 1, 0], [0, 0, 0], [1, 0, 1], [1, 0, 0]], jnp.float32)
        valid = jnp.array([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 0, 1], [1, 0, 0]], bool)
        keep = self.variant(informative_groups)(rewards, valid)
        # all-1 drop; mixed keep; all-0 drop; valid {1, 1} drop; a single valid sample drop.
        np.testing.assert_array_equal(keep, [False, True, False, False, False])
        assert keep.dtype == jnp.bool_

    @chex.variants(with_jit=True, without_jit=True)
    def test_atol(self):
        rewards = jnp.array([[0.5, 0.5004], [0.0, 1.0]], jnp.float32)
        keep = self.variant(lambda r: informative_groups(r, atol=1e-3))(rewards)
        np.testing.assert_array_equal(keep, [False, True])

    @chex.variants(with_jit=True, without_jit=True)
    def test_all_invalid_no_nan(self):
        keep = self.variant(informative_groups)(jnp.zeros((2, 3)), jnp.zeros((2, 3), bool))
        np.testing.assert_array_equal(keep, [False, False])


def test_numpy_twin_agrees():
    rng = np.random.default_rng(1)
    for _ in range(20):
        rewards = rng.integers(0, 3, size=(6, 4)).astype(np.float32) / 2
        valid = rng.random((6, 4)) < 0.7
        np.testing.assert_array_equal(
            np.asarray(informative_groups(rewards, valid)),
            _informative_np(rewards, valid, atol=0.0, min_valid=2),
        )


def test_filter_probability_p02_g4_is_41_percent():
    # All wrong on G = 4 samples at p = 0.2: 0.8^4 = 0.4096; all right: 0.2^4 = 0.0016.
    assert prob_all_wrong(0.2, 4) == pytest.approx(0.4096)
    assert prob_uninformative(0.2, 4) == pytest.approx(0.4096 + 0.0016)
    # Cross-check by enumerating all 2^4 outcomes through the actual filter.
    outcomes = np.array(list(itertools.product([0.0, 1.0], repeat=4)), np.float32)
    probs = np.prod(np.where(outcomes == 1.0, 0.2, 0.8), axis=1)
    dropped = ~np.asarray(informative_groups(outcomes))
    assert probs[dropped].sum() == pytest.approx(0.4112)


def _payload(idx, g):
    """Per-group leaf [P'] and per-response leaf [P'*G, 2] that encode their origin."""
    idx = np.asarray(idx)
    return {"pid": idx * 10, "tok": np.repeat(idx, g)[:, None] * 100 + np.arange(2)[None, :]}


def test_batcher_fills_across_rounds():
    b = DynamicBatcher(3, max_rounds=3)
    keep1 = b.add([10, 11, 12, 13], np.array([[1, 0], [1, 1], [0, 1], [0, 0]], np.float32),
                  payload=_payload([10, 11, 12, 13], 2))
    np.testing.assert_array_equal(keep1, [True, False, True, False])
    assert b.num_kept == 2 and not b.done
    b.add([20, 21], np.array([[1, 1], [1, 0]], np.float32), payload=_payload([20, 21], 2))
    assert b.full and b.done and b.rounds == 2
    # 6 generated, 3 kept: filtered fraction 3/6.
    assert b.filtered_fraction == 0.5
    with pytest.raises(RuntimeError, match="done"):
        b.add([1], np.array([[1, 0]], np.float32), payload=_payload([1], 2))
    out = b.result()
    np.testing.assert_array_equal(out.prompt_idx_p, [10, 12, 21])
    np.testing.assert_array_equal(out.rewards_pg, [[1, 0], [0, 1], [1, 0]])
    np.testing.assert_array_equal(out.group_mask_p, [True, True, True])
    np.testing.assert_array_equal(out.payload["pid"], [100, 120, 210])
    # Per-response rows stay prompt-major: two rows per kept group.
    np.testing.assert_array_equal(out.payload["tok"][:, 0], [1000, 1000, 1200, 1200, 2100, 2100])
    np.testing.assert_array_equal(np.sort(out.filtered_idx), [11, 13, 20])
    assert out.stats.filtered_fraction == 0.5
    # Filtered groups: [1,1] twice solved, [0,0] not -> 2/3.
    assert out.stats.filtered_solved_fraction == pytest.approx(2 / 3)
    assert out.stats.batch_fill == 1.0
    b.reset()
    assert b.rounds == 0 and b.num_kept == 0 and not b.done


def test_batcher_budget_exhausted_pads():
    b = DynamicBatcher(4, max_rounds=2)
    b.add([0, 1], np.array([[0, 0, 0], [1, 1, 1]], np.float32), payload=_payload([0, 1], 3))
    assert not b.done
    b.add([2, 3], np.array([[0, 1, 0], [0, 0, 0]], np.float32), payload=_payload([2, 3], 3))
    assert b.exhausted and not b.full and b.done
    out = b.result()
    assert out.rewards_pg.shape == (4, 3) and out.payload["tok"].shape == (12, 2)
    np.testing.assert_array_equal(out.group_mask_p, [True, False, False, False])
    np.testing.assert_array_equal(out.valid_pg.any(axis=1), [True, False, False, False])
    np.testing.assert_array_equal(out.payload["pid"], [20, 0, 0, 0])
    assert out.stats.batch_fill == 0.25
    assert out.stats.filtered_fraction == 0.75
    assert out.stats.rounds == 2


def test_batcher_surplus_and_no_pad():
    b = DynamicBatcher(2, max_rounds=1, pad=False)
    b.add([0, 1, 2], np.array([[0, 1], [1, 0], [0, 1]], np.float32))
    out = b.result()
    np.testing.assert_array_equal(out.prompt_idx_p, [0, 1])
    assert out.payload is None and out.stats.surplus_groups == 1
    b2 = DynamicBatcher(3, max_rounds=1, pad=False)
    b2.add([0, 1], np.array([[0, 1], [1, 1]], np.float32))
    assert b2.result().prompt_idx_p.shape == (1,)


def test_batcher_filters_on_correctness_not_shaped_reward():
    # Both samples correct, one penalised for length: rewards differ, correctness does not.
    b = DynamicBatcher(1, max_rounds=2)
    keep = b.add([0], np.array([[1.0, 0.6]], np.float32), filter_on_pg=np.array([[1.0, 1.0]]))
    np.testing.assert_array_equal(keep, [False])
    keep = b.add([1], np.array([[1.0, 0.0]], np.float32), filter_on_pg=np.array([[1.0, 0.0]]))
    np.testing.assert_array_equal(keep, [True])
    with pytest.raises(RuntimeError):
        b.add([2], np.array([[1.0, 0.0]], np.float32))
    assert DynamicBatcher(1, max_rounds=1).add([0], np.array([[1.0, 0.6]], np.float32))[0]


def test_batcher_errors():
    b = DynamicBatcher(2, max_rounds=3)
    with pytest.raises(RuntimeError, match="before any add"):
        b.result()
    b.add([0], np.array([[0, 0]], np.float32))
    with pytest.raises(ValueError, match="group size changed"):
        b.add([1], np.array([[0, 0, 1]], np.float32))
    with pytest.raises(ValueError, match="leading dim"):
        DynamicBatcher(2, max_rounds=1).add([0, 1], np.ones((2, 2)), payload={"x": np.ones(3)})


def test_recheck_schedule_backoff_and_readmit():
    s = RecheckSchedule(5, interval=2, backoff=2.0, max_interval=5)
    s.record([1, 2], [True, False], step=0)
    # Prompt 1 suspended for 2 steps: back at step 2.
    np.testing.assert_array_equal(s.admissible(1), [True, False, True, True, True])
    assert s.admissible(2)[1]
    s.record([1], [True], step=2)  # second strike: 2 * 2 = 4 steps -> until 6
    assert not s.admissible(5)[1] and s.admissible(6)[1]
    s.record([1], [True], step=6)  # third strike: 2 * 4 = 8 capped at 5 -> until 11
    assert s.suspended_until()[1] == 11
    s.record([1, 1], [True, False], step=11)  # kept in the same round wins: reset
    assert s.admissible(11)[1] and s.state_dict()["strikes_p"][1] == 0


def test_recheck_choose_and_state():
    s = RecheckSchedule(5, interval=3)
    s.record([0, 1], [True, True], step=0)  # until 3
    s.record([2], [True], step=1)  # until 4
    rng = np.random.default_rng(0)
    got = s.choose(rng, 2, step=2)
    assert set(got) <= {3, 4} and len(set(got)) == 2
    # 4 wanted, 2 admissible: complete with the soonest due (0 and 1, due at 3, before 2 at 4).
    np.testing.assert_array_equal(s.choose(rng, 4, step=2), [0, 1, 3, 4])
    again = RecheckSchedule(5, interval=3)
    again.load_state_dict(s.state_dict())
    np.testing.assert_array_equal(again.admissible(3), s.admissible(3))
    with pytest.raises(ValueError, match="eligible"):
        s.choose(rng, 6, step=0)


def test_keep_mask_permutation_and_padding_invariant():
    rng = np.random.default_rng(7)
    rewards = (rng.random((16, 4)) < 0.5).astype(np.float32)
    valid = rng.random((16, 4)) < 0.8
    keep = np.asarray(informative_groups(rewards, valid))
    perm = rng.permutation(4)
    np.testing.assert_array_equal(np.asarray(informative_groups(rewards[:, perm], valid[:, perm])), keep)
    # Extra invalid columns with arbitrary rewards change nothing.
    padded_r = np.concatenate([rewards, rng.random((16, 3)).astype(np.float32)], axis=1)
    padded_v = np.concatenate([valid, np.zeros((16, 3), bool)], axis=1)
    np.testing.assert_array_equal(np.asarray(informative_groups(padded_r, padded_v)), keep)
    assert keep.any() and not keep.all()  # the draw covers both outcomes
