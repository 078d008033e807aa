"""Tests for jaxrl_vr.losses: clipped surrogate, clip indicators, exact aggregation."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_vr import losses, ratios

EPS_LOW, EPS_HIGH = 0.2, 0.28


class ClippedSurrogateTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_computed(self):
        # eps_low = 0.2, eps_high = 0.28: clip range [0.8, 1.28].
        #   r = 1.5, A =  1: min(1.5, 1.28) = 1.28           -> loss -1.28, clipped high
        #   r = 0.5, A =  1: min(0.5, 0.8) = 0.5             -> loss -0.5
        #   r = 0.5, A = -1: min(-0.5, -0.8) = -0.8          -> loss  0.8, clipped low
        #   r = 1.5, A = -2: min(-3.0, -2.56) = -3.0         -> loss  3.0 (unclipped branch)
        #   r = 1.0, A = .5: min(0.5, 0.5)                   -> loss -0.5
        #   r = 1.1, A =  0: 0                               -> loss  0, nothing clipped
        log_ratio = jnp.log(jnp.array([1.5, 0.5, 0.5, 1.5, 1.0, 1.1]))
        adv = jnp.array([1.0, 1.0, -1.0, -2.0, 0.5, 0.0])
        fn = self.variant(losses.clipped_surrogate)
        loss, info = fn(log_ratio, adv, eps_low=jnp.float32(EPS_LOW),
                        eps_high=jnp.float32(EPS_HIGH))
        np.testing.assert_allclose(loss, [-1.28, -0.5, 0.8, 3.0, -0.5, 0.0], rtol=1e-6)
        np.testing.assert_array_equal(info.is_clipped_high, [1, 0, 0, 0, 0, 0])
        np.testing.assert_array_equal(info.is_clipped_low, [0, 0, 1, 0, 0, 0])
        np.testing.assert_array_equal(info.is_dual_clipped, np.zeros(6))
        np.testing.assert_array_equal(info.is_truncated, np.zeros(6))
        np.testing.assert_allclose(info.ratio, [1.5, 0.5, 0.5, 1.5, 1.0, 1.1], rtol=1e-6)
        self.assertEqual(info.is_clipped_low.dtype, jnp.float32)

    @chex.variants(with_jit=True, without_jit=True)
    def test_dual_clip_caps_negative_advantage_loss(self):
        # c = 2.5. r = 1.5, A = -2: PPO loss 3.0 (above), cap -c·A = 5.0 -> 3.0, not dual-clipped.
        #          r = 4.0, A = -2: PPO loss 8.0, cap 5.0 -> 5.0, dual-clipped.
        #          r = 4.0, A = +1: loss -1.28 (clipped high); dual clip ignores A > 0.
        #          r = e^1e4 (capped at e^20), A = -1: cap 2.5.
        log_ratio = jnp.array([math.log(1.5), math.log(4.0), math.log(4.0), 1e4])
        adv = jnp.array([-2.0, -2.0, 1.0, -1.0])
        fn = self.variant(losses.clipped_surrogate)
        loss, info = fn(log_ratio, adv, eps_low=EPS_LOW, eps_high=EPS_HIGH,
                        dual_clip=jnp.float32(2.5))
        np.testing.assert_allclose(loss, [3.0, 5.0, -1.28, 2.5], rtol=1e-6)
        np.testing.assert_array_equal(info.is_dual_clipped, [0, 1, 0, 1])
        # Without dual clip the huge ratio gives exp(20)·1 ≈ 4.85e8: finite but enormous.
        plain_loss, _ = fn(log_ratio, adv, eps_low=EPS_LOW, eps_high=EPS_HIGH)
        np.testing.assert_allclose(plain_loss[3], math.exp(20.0), rtol=1e-5)
        # The cap holds elementwise wherever A < 0.
        self.assertTrue(bool(jnp.all(jnp.where(adv < 0, loss <= -2.5 * adv + 1e-6, True))))

    @chex.variants(with_jit=True, without_jit=True)
    def test_log_ratio_bounds_truncate_all_branches(self):
        # bounds (-0.5, 0.5). log r = 2, A = -1: truncated to 0.5, r = e^0.5 = 1.6487213;
        #   min(-1.6487213, -1.28) = -1.6487213 -> loss 1.6487213.
        # log r = -3, A = 1: truncated to -0.5, r = e^-0.5 = 0.6065307 -> loss -0.6065307.
        # log r = 0.1, A = 1: untouched, r = 1.1051709 -> loss -1.1051709.
        log_ratio = jnp.array([2.0, -3.0, 0.1])
        adv = jnp.array([-1.0, 1.0, 1.0])
        fn = self.variant(losses.clipped_surrogate)
        loss, info = fn(log_ratio, adv, eps_low=EPS_LOW, eps_high=EPS_HIGH,
                        log_ratio_bounds=(jnp.float32(-0.5), jnp.float32(0.5)))
        np.testing.assert_allclose(loss, [math.exp(0.5), -math.exp(-0.5), -math.exp(0.1)],
                                   rtol=1e-6)
        np.testing.assert_array_equal(info.is_truncated, [1, 1, 0])

    def test_gradients(self):
        # d loss / d log r = -r·A on the active unclipped branch, 0 where clipped or dual-clipped.
        log_ratio = jnp.log(jnp.array([1.5, 0.5, 0.5, 1.5, 4.0]))
        adv = jnp.array([1.0, 1.0, -1.0, -2.0, -2.0])

        def total(lr):
            loss, _ = losses.clipped_surrogate(lr, adv, eps_low=EPS_LOW, eps_high=EPS_HIGH,
                                               dual_clip=2.5)
            return jnp.sum(loss)

        grad = jax.jit(jax.grad(total))(log_ratio)
        # [clipped high, -0.5·1, clipped low, -1.5·(-2) = 3, dual-clipped]
        np.testing.assert_allclose(grad, [0.0, -0.5, 0.0, 3.0, 0.0], rtol=1e-6)

    def test_broadcasts_sequence_advantage_and_rejects_rank_mismatch(self):
        log_ratio_bt = jnp.zeros((2, 3))
        adv_b = jnp.array([1.0, -1.0])
        loss_bt, info = losses.clipped_surrogate(log_ratio_bt, adv_b[:, None], eps_low=0.2,
                                                 eps_high=0.2)
        np.testing.assert_allclose(loss_bt, [[-1.0] * 3, [1.0] * 3])  # r = 1: loss = -A
        self.assertEqual(info.is_truncated.shape, (2, 3))
        with pytest.raises(ValueError, match=r"adv_b\[:, None\]"):
            losses.clipped_surrogate(log_ratio_bt, adv_b, eps_low=0.2, eps_high=0.2)
        with pytest.raises(ValueError, match="dual_clip must be > 1"):
            losses.clipped_surrogate(log_ratio_bt, adv_b[:, None], eps_low=0.2, eps_high=0.2,
                                     dual_clip=0.5)

    def test_huge_log_ratios_no_nan(self):
        log_ratio = jnp.array([1e4, -1e4, jnp.inf, -jnp.inf, 1e4, -1e4])
        adv = jnp.array([1.0, 1.0, -1.0, -1.0, -1.0, -1.0])

        def total(lr):
            loss, _ = losses.clipped_surrogate(lr, adv, eps_low=EPS_LOW, eps_high=EPS_HIGH,
                                               dual_clip=3.0, log_ratio_bounds=(-5.0, 5.0))
            return jnp.sum(loss)

        value, grad = jax.jit(jax.value_and_grad(total))(log_ratio)
        self.assertTrue(np.isfinite(value))
        self.assertTrue(np.isfinite(grad).all())

    def test_no_recompile_when_eps_changes(self):
        fn = jax.jit(lambda lr, a, lo, hi: losses.clipped_surrogate(
            lr, a, eps_low=lo, eps_high=hi)[0])
        log_ratio, adv = jnp.array([0.3]), jnp.array([1.0])
        first = fn(log_ratio, adv, jnp.float32(0.2), jnp.float32(0.2))
        second = fn(log_ratio, adv, jnp.float32(0.2), jnp.float32(0.5))
        self.assertEqual(fn._cache_size(), 1)  # pylint: disable=protected-access
        # r = e^0.3 = 1.3499: clipped at 1.2 first, unclipped under 1.5 second.
        np.testing.assert_allclose([first[0], second[0]], [-1.2, -math.exp(0.3)], rtol=1e-6)


class ClipFractionsTest(chex.TestCase):

    def test_masked_fractions_sum_over_micro_batches(self):
        log_ratio = jnp.log(jnp.array([[1.5, 0.5, 1.0], [0.5, 1.5, 1.5]]))
        adv = jnp.array([[1.0], [-1.0]])
        mask = jnp.array([[True, True, False], [True, True, False]])
        _, info = losses.clipped_surrogate(log_ratio, adv, eps_low=EPS_LOW, eps_high=EPS_HIGH)
        # Clipped high: (r=1.5, A=1) at [0,0]. Clipped low: (r=0.5, A=-1) at [1,0].
        # [1,2] would be neither (A<0, r>1); 4 valid elements.
        fractions = losses.clip_fractions(info, mask)
        self.assertEqual(set(fractions),
                         {"clipped_low", "clipped_high", "dual_clipped", "truncated"})
        np.testing.assert_allclose(fractions["clipped_high"], (1.0, 4.0))
        np.testing.assert_allclose(fractions["clipped_low"], (1.0, 4.0))
        np.testing.assert_allclose(fractions["dual_clipped"], (0.0, 4.0))
        # Split by rows: sums of the parts equal the whole.
        parts = [losses.clip_fractions(jax.tree.map(lambda x, i=i: x[i:i + 1], info), mask[i:i + 1])
                 for i in range(2)]
        for name, (num, den) in fractions.items():
            summed = (sum(p[name][0] for p in parts), sum(p[name][1] for p in parts))
            np.testing.assert_allclose(summed, (num, den))


LOSS_BT = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK_BT = jnp.array([[True, True, False], [True, False, False], [False, False, False]])


class AggregateTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_computed_every_mode(self):
        # Valid tokens: row 0 -> 1, 2 (T_0 = 2); row 1 -> 4 (T_1 = 1); row 2 empty (not counted).
        expected = {
            "token_mean": (1 + 2 + 4, 3),                  # 7 / 3
            "seq_mean_token_mean": ((1 + 2) / 2 + 4, 2),   # (1.5 + 4) / 2
            "seq_mean_token_sum": ((1 + 2) + 4, 2),        # 7 / 2
            "seq_mean_token_sum_norm": (3 / 3 + 4 / 3, 2),  # max_len defaults to T = 3
            "seq_mean": ((1 + 2) / 2 + 4, 2),              # loss_bt: per-response masked mean
        }
        for mode, want in expected.items():
            fn = self.variant(losses.aggregate, static_argnames="mode")
            np.testing.assert_allclose(fn(LOSS_BT, MASK_BT, mode=mode), want, rtol=1e-6,
                                       err_msg=mode)
        # Dr.GRPO with an explicit constant max_len = 4: (3 + 4) / 4.
        np.testing.assert_allclose(
            losses.aggregate(LOSS_BT, MASK_BT, "seq_mean_token_sum_norm", max_len=4), (7 / 4, 2))
        # seq_mean with per-response losses [10, 20, 30]: rows 0 and 1 valid -> (10 + 20, 2).
        loss_b = jnp.array([10.0, 20.0, 30.0])
        np.testing.assert_allclose(losses.aggregate(loss_b, MASK_BT, "seq_mean"), (30.0, 2.0))
        valid_b = jnp.array([True, False, True])
        np.testing.assert_allclose(losses.aggregate(loss_b, valid_b, "seq_mean"), (40.0, 2.0))

    def test_token_mean_of_broadcast_response_loss(self):
        # SPEC §5: ℓ_i broadcast to its tokens -> Σ T_i ℓ_i / Σ T_i = (2·1 + 1·3) / 3.
        loss_b = jnp.array([1.0, 3.0, 5.0])
        loss_bt = jnp.broadcast_to(loss_b[:, None], (3, 3))
        num, den = losses.aggregate(loss_bt, MASK_BT, "token_mean")
        np.testing.assert_allclose(num / den, 5.0 / 3.0, rtol=1e-6)

    def test_micro_batch_exactness_every_mode(self):
        rng = np.random.default_rng(0)
        loss_bt = jnp.asarray(rng.standard_normal((6, 5)), jnp.float32)
        mask = rng.uniform(size=(6, 5)) < 0.6
        mask[1] = False  # one empty row
        mask_bt = jnp.asarray(mask)
        loss_b = jnp.arange(6.0)
        labels = []

        @jax.jit
        def split_vs_full():  # one compilation for every (mode, input, split) case
            results = []
            for mode in losses.AGGREGATION_MODES:
                cases = [(loss_bt, mask_bt)] + ([(loss_b, mask_bt)] if mode == "seq_mean" else [])
                for loss, mask in cases:
                    full = losses.finalize(*losses.aggregate(loss, mask, mode, max_len=5))
                    for split in (1, 4):  # 4 gives uneven parts of 4 and 2
                        parts = [losses.aggregate(loss[i:i + split], mask[i:i + split], mode,
                                                  max_len=5) for i in range(0, 6, split)]
                        num = sum(p[0] for p in parts)
                        den = sum(p[1] for p in parts)
                        labels.append(f"{mode} rank={loss.ndim} split={split}")
                        results.append((num / den, full))
            return results

        for label, (split_value, full_value) in zip(labels, split_vs_full()):
            np.testing.assert_allclose(split_value, full_value, rtol=1e-6, err_msg=label)
        self.assertEqual(len(labels), 12)  # 5 modes + seq_mean's [B] input, 2 splits each

    def test_zero_gradient_through_masked_tokens(self):
        rng = np.random.default_rng(1)
        logp_bt = -jnp.asarray(rng.uniform(size=(3, 4)), jnp.float32)
        # Garbage at masked positions: huge old log-probs must not leak into the gradient.
        mask_bt = jnp.array([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], bool)
        old_logp_bt = jnp.where(mask_bt, -jnp.asarray(rng.uniform(size=(3, 4)), jnp.float32), -1e4)
        adv_b = jnp.array([1.0, -1.0, 2.0])

        ratio_fns = (lambda lp: ratios.token_log_ratio(lp, old_logp_bt),
                     lambda lp: ratios.gspo_token_log_ratio(lp, old_logp_bt, mask_bt))

        def objective(lp, ratio_fn, mode):
            loss_bt, _ = losses.clipped_surrogate(ratio_fn(lp), adv_b[:, None],
                                                  eps_low=0.2, eps_high=0.2, dual_clip=3.0)
            return losses.finalize(*losses.aggregate(loss_bt, mask_bt, mode))

        @jax.jit
        def all_grads(lp):  # one compilation for every (mode, ratio) pair
            return [jax.grad(objective)(lp, ratio_fn, mode)
                    for mode in losses.AGGREGATION_MODES for ratio_fn in ratio_fns]

        grads = all_grads(logp_bt)
        self.assertLen(grads, 2 * len(losses.AGGREGATION_MODES))
        for grad in grads:
            self.assertTrue(np.isfinite(grad).all())
            np.testing.assert_array_equal(np.asarray(grad)[~np.asarray(mask_bt)], 0.0)
            self.assertGreater(float(jnp.abs(grad).sum()), 0.0)  # valid tokens do get gradient

    def test_empty_mask_gives_zero_not_nan(self):
        mask_bt = jnp.zeros((2, 3), bool)
        loss_bt = jnp.full((2, 3), jnp.nan)
        @jax.jit
        def reductions(x):
            return [losses.aggregate(x, mask_bt, mode) for mode in losses.AGGREGATION_MODES]

        for num, den in reductions(loss_bt):
            np.testing.assert_array_equal((num, den), (0.0, 0.0))
            self.assertEqual(float(losses.finalize(num, den)), 0.0)
        grad = jax.jit(jax.grad(lambda x: losses.finalize(*losses.aggregate(x, mask_bt))))(
            jnp.ones((2, 3)))
        np.testing.assert_array_equal(grad, 0.0)

    def test_unknown_mode_lists_valid_modes(self):
        with pytest.raises(ValueError, match="valid modes: token_mean, seq_mean_token_mean"):
            losses.aggregate(LOSS_BT, MASK_BT, "token_sum")
        with pytest.raises(AssertionError):
            losses.aggregate(LOSS_BT, MASK_BT.astype(jnp.float32))  # masks must be bool
