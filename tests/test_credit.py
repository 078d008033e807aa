"""Step-level credit: the group-relative per-turn term, by hand; degenerate groups and signals
that do not apply give nothing; jit and no jit agree; the logged signal statistics."""

import chex
import jax
import numpy as np

from jaxrl_vr.credit import signal_stats, step_credit

NAN = np.nan


class StepCreditTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_computed_two_turns_two_signals(self):
        # One group of 3 samples, K = 2 turns, N = 2 signals (say tool_ok, compiles).
        signals_bkn = np.array([
            [[1.0, 1.0], [NAN, NAN]],   # b0: turn 0 a call that ran and compiled; turn 1 the answer
            [[0.0, 1.0], [0.0, NAN]],   # b1: turn 0 compiled but failed; turn 1 failed (no code)
            [[NAN, NAN], [NAN, NAN]],   # b2: answered at once, no call
        ], np.float32)
        # Tokens: b0 = turn 0 (2 tokens), env (1), turn 1 (1); b1 = turn 0, env, turn 1; b2 = turn 0.
        turn_bt = np.array([[0, 0, -1, 1], [0, -1, 1, 1], [0, 0, 0, -1]], np.int32)
        loss_mask_bt = turn_bt >= 0
        coef_n = np.array([0.5, 0.2], np.float32)
        credit = self.variant(step_credit)(signals_bkn, turn_bt, loss_mask_bt, np.ones((1, 3), bool), coef_n)
        # tool_ok applies on (b0,k0)=1, (b1,k0)=0, (b1,k1)=0: baseline 1/3.
        # compiles applies on (b0,k0)=1, (b1,k0)=1: baseline 1.
        b0k0 = 0.5 * (1 - 1 / 3) + 0.2 * (1 - 1)
        b1k0 = 0.5 * (0 - 1 / 3) + 0.2 * (1 - 1)
        b1k1 = 0.5 * (0 - 1 / 3)
        expected = np.array([[b0k0, b0k0, 0, 0], [b1k0, 0, b1k1, b1k1], [0, 0, 0, 0]], np.float32)
        np.testing.assert_allclose(np.asarray(credit), expected, atol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_groups_are_separate_and_invalid_samples_neither_give_nor_get(self):
        signals_bkn = np.array([[[1.0]], [[0.0]], [[1.0]], [[0.0]]], np.float32)
        turn_bt = np.zeros((4, 2), np.int32)
        loss_mask_bt = np.ones((4, 2), bool)
        valid_pg = np.array([[True, True], [True, False]])
        credit = np.asarray(self.variant(step_credit)(signals_bkn, turn_bt, loss_mask_bt, valid_pg,
                                                      np.ones(1, np.float32)))
        np.testing.assert_allclose(credit[:2], [[0.5, 0.5], [-0.5, -0.5]])
        np.testing.assert_allclose(credit[2:], 0.0)  # group 1: one valid sample is its own baseline

    @chex.variants(with_jit=True, without_jit=True)
    def test_all_equal_signal_and_nan_signals_and_zero_coefficients_give_nothing(self):
        turn_bt = np.array([[0, -1, 1], [0, 0, -1]], np.int32)
        loss_mask_bt = turn_bt >= 0
        same = np.array([[[0.7], [0.7]], [[0.7], [NAN]]], np.float32)
        none = np.full((2, 2, 1), NAN, np.float32)
        mixed = np.array([[[1.0], [NAN]], [[0.0], [NAN]]], np.float32)
        for signals_bkn, coef in ((same, 3.0), (none, 3.0), (mixed, 0.0)):
            credit = self.variant(step_credit)(signals_bkn, turn_bt, loss_mask_bt, np.ones((1, 2), bool),
                                               np.array([coef], np.float32))
            assert not np.isnan(np.asarray(credit)).any()
            np.testing.assert_array_equal(np.asarray(credit), 0.0)


def test_credit_never_lands_off_the_loss_mask_and_permuting_a_group_permutes_it():
    rng = np.random.default_rng(0)
    signals_bkn = rng.uniform(size=(6, 3, 2)).astype(np.float32)
    signals_bkn[rng.uniform(size=signals_bkn.shape) < 0.3] = NAN
    turn_bt = rng.integers(-1, 3, size=(6, 7)).astype(np.int32)
    loss_mask_bt = (turn_bt >= 0) & (rng.uniform(size=(6, 7)) < 0.8)
    coef_n = np.array([0.3, 0.1], np.float32)
    valid_pg = np.ones((2, 3), bool)
    credit = np.asarray(step_credit(signals_bkn, turn_bt, loss_mask_bt, valid_pg, coef_n))
    assert not credit[~loss_mask_bt].any() and np.abs(credit[loss_mask_bt]).sum() > 0
    perm = np.array([2, 0, 1, 3, 4, 5])
    permuted = np.asarray(step_credit(signals_bkn[perm], turn_bt[perm], loss_mask_bt[perm], valid_pg, coef_n))
    np.testing.assert_allclose(permuted, credit[perm], atol=1e-6)


def test_step_credit_does_not_recompile_for_new_values():
    fn = jax.jit(step_credit)
    args = (np.zeros((2, 1, 1), np.float32), np.zeros((2, 3), np.int32), np.ones((2, 3), bool),
            np.ones((1, 2), bool), np.ones(1, np.float32))
    fn(*args)
    size = fn._cache_size()
    fn(np.ones((2, 1, 1), np.float32), *args[1:4], np.full(1, 2.0, np.float32))
    assert fn._cache_size() == size


def test_signal_stats_mean_over_applicable_turns_and_pearson_with_the_verdict():
    signals_bkn = np.array([
        [[1.0, NAN], [1.0, NAN]],   # episode signal 1.0 (two turns), success
        [[0.0, NAN], [NAN, NAN]],   # 0.0, failure
        [[1.0, 0.5], [0.0, NAN]],   # 0.5, success; signal 1 applies here only
        [[NAN, NAN], [NAN, NAN]],   # no signal: left out
        [[0.0, 1.0], [NAN, NAN]],   # invalid: left out
    ], np.float32)
    verdict_b = np.array([True, False, True, False, True])
    valid_b = np.array([True, True, True, True, False])
    mean_n, corr_n = signal_stats(signals_bkn, verdict_b, valid_b)
    np.testing.assert_allclose(mean_n, [3 / 5, 0.5])
    x, y = np.array([1.0, 0.0, 0.5]), np.array([1.0, 0.0, 1.0])
    np.testing.assert_allclose(corr_n[0], np.corrcoef(x, y)[0, 1])
    assert np.isnan(corr_n[1])  # one episode
    _, corr_n = signal_stats(signals_bkn[:3], np.ones(3, bool), np.ones(3, bool))
    assert np.isnan(corr_n[0])  # constant verdict
    mean_n, _ = signal_stats(np.full((2, 1, 1), NAN, np.float32), np.ones(2, bool), np.ones(2, bool))
    assert np.isnan(mean_n[0])
