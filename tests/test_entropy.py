"""Tests for jaxrl_vr.entropy: per-token entropy and the entropy-feedback controller."""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_vr import entropy, ratios


class EntropyFromLogitsTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_computed(self):
        # Uniform over 4: ln 4 = 1.3862944.
        # [0, ln 3, -big, -big]: p = [1/4, 3/4, 0, 0]:
        #   -(¼ ln ¼ + ¾ ln ¾) = 0.3465736 + 0.2157616 = 0.5623351.
        # One-hot by finfo.min masking: 0.
        neg = float(jnp.finfo(jnp.float32).min)
        logits_btv = jnp.array([[[1.0, 1.0, 1.0, 1.0], [0.0, math.log(3.0), neg, neg],
                                 [5.0, neg, neg, neg]]])
        fn = self.variant(entropy.entropy_from_logits, static_argnames="chunk_size")
        for chunk_size in (None, 2):
            entropy_bt = fn(logits_btv, chunk_size=chunk_size)
            self.assertEqual(entropy_bt.dtype, jnp.float32)
            np.testing.assert_allclose(entropy_bt, [[math.log(4.0), 0.5623351, 0.0]], atol=1e-6)

    def test_matches_naive_f32_bf16_and_from_hidden(self):
        rng = np.random.default_rng(0)
        hidden_btd = jnp.asarray(rng.standard_normal((2, 5, 4)), jnp.float32)
        unembed_dv = jnp.asarray(rng.standard_normal((4, 9)), jnp.float32)
        tokens_bt = jnp.asarray(rng.integers(0, 9, (2, 5)), jnp.int32)
        logits_btv = hidden_btd @ unembed_dv

        def naive(logits):
            logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
            return -jnp.sum(jnp.exp(logp) * logp, axis=-1)

        @jax.jit
        def pairs():  # (got, want) pairs, compiled once
            bf16_logits = logits_btv.astype(jnp.bfloat16)
            _, from_hidden_bt = ratios.token_logprobs_from_hidden(hidden_btd, unembed_dv, tokens_bt,
                                                                  with_entropy=True)
            return [(entropy.entropy_from_logits(logits_btv, chunk_size=2), naive(logits_btv)),
                    (entropy.entropy_from_logits(bf16_logits, chunk_size=2), naive(bf16_logits)),
                    (entropy.entropy_from_logits(logits_btv), from_hidden_bt)]

        for got, want in pairs():
            np.testing.assert_allclose(got, want, atol=1e-5)

    def test_gradient_matches_naive(self):
        rng = np.random.default_rng(1)
        logits_btv = jnp.asarray(rng.standard_normal((2, 5, 6)), jnp.float32)
        weights_bt = jnp.asarray(rng.standard_normal((2, 5)), jnp.float32)

        def chunked(x):
            return jnp.sum(weights_bt * entropy.entropy_from_logits(x, chunk_size=2))

        def naive(x):
            logp = jax.nn.log_softmax(x, axis=-1)
            return jnp.sum(weights_bt * -jnp.sum(jnp.exp(logp) * logp, axis=-1))

        np.testing.assert_allclose(jax.jit(jax.grad(chunked))(logits_btv),
                                   jax.jit(jax.grad(naive))(logits_btv), atol=1e-6)

    def test_neg_inf_logits_no_nan_value_or_grad(self):
        logits_btv = jnp.array([[[0.0, -jnp.inf, 1.0]]])
        value, grad = jax.jit(jax.value_and_grad(
            lambda x: jnp.sum(entropy.entropy_from_logits(x))))(logits_btv)
        # p = [1, e]/(1 + e) = [0.2689414, 0.7310586]: H = 0.5822031.
        np.testing.assert_allclose(value, 0.5822031, rtol=1e-6)
        self.assertTrue(np.isfinite(grad).all())
        self.assertEqual(float(grad[0, 0, 1]), 0.0)

    def test_bad_chunk_size(self):
        with pytest.raises(ValueError, match="chunk_size"):
            entropy.entropy_from_logits(jnp.zeros((1, 2, 3)), chunk_size=-1)


class EntropyControllerTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_integral_steps_and_bounds(self):
        update = self.variant(entropy.entropy_controller_update)
        state = entropy.entropy_controller_init()
        self.assertEqual(float(state.k), 0.0)
        kwargs = dict(target=jnp.float32(1.0), step_size=jnp.float32(0.1), k_max=jnp.float32(0.25))
        # Entropy 0.5 < target 1.0: k = 0.1, 0.2, then clip(0.3) = 0.25.
        trace = []
        for _ in range(3):
            state = update(state, jnp.float32(0.5), **kwargs)
            trace.append(float(state.k))
        np.testing.assert_allclose(trace, [0.1, 0.2, 0.25], rtol=1e-6)
        # Exactly at target: sign(0) = 0, unchanged.
        state = update(state, jnp.float32(1.0), **kwargs)
        np.testing.assert_allclose(state.k, 0.25, rtol=1e-6)
        # Entropy 2.0 > target: 0.15, 0.05, then clip(-0.05) = 0.
        trace = []
        for _ in range(3):
            state = update(state, jnp.float32(2.0), **kwargs)
            trace.append(float(state.k))
        np.testing.assert_allclose(trace, [0.15, 0.05, 0.0], atol=1e-6)
        self.assertEqual(int(state.count), 7)

    @chex.variants(with_jit=True, without_jit=True)
    def test_upper_clip_and_eps_high(self):
        upper = self.variant(entropy.controlled_upper_clip)
        eps_high = self.variant(entropy.controlled_eps_high)
        # k = 0 is exactly the plain clip: eps_high unchanged, bound 1 + 0.28 = 1.28.
        neutral = entropy.entropy_controller_init()
        self.assertEqual(float(eps_high(neutral, jnp.float32(0.28))), float(jnp.float32(0.28)))
        np.testing.assert_allclose(upper(neutral, jnp.float32(0.28)), 1.28, rtol=1e-7)
        # k = 0.5 (relative), eps = 0.2: eps_high for the surrogate 0.2·1.5 = 0.3, bound 1.3.
        state = entropy.entropy_controller_init(k_init=0.5)
        np.testing.assert_allclose(upper(state, jnp.float32(0.2)), 1.3, rtol=1e-6)
        np.testing.assert_allclose(eps_high(state, jnp.float32(0.2)), 0.3, rtol=1e-6)
        self.assertEqual(eps_high(state, jnp.float32(0.2)).dtype, jnp.float32)

    def test_one_step_moves_the_clip_by_a_fraction_of_eps_high_on_every_ratio_scale(self):
        # With the loss defaults, one step below target widens GSPO's ε_high = 4e-4 by δ·4e-4
        # (not by an absolute 0.01, ~26×), and a token ratio's 0.28 by δ·0.28.
        from jaxrl_vr.train.step import LossConfig
        for ratio, eps in (("sequence", 4e-4), ("token", 0.28)):
            hyper = LossConfig(ratio=ratio, entropy="feedback").hyper()
            state = entropy.entropy_controller_update(
                entropy.entropy_controller_init(), jnp.float32(0.0), target=hyper.entropy_target,
                step_size=hyper.entropy_step_size, k_max=hyper.entropy_k_max)
            widened = float(entropy.controlled_eps_high(state, hyper.eps_high))
            np.testing.assert_allclose(widened, eps * (1 + float(hyper.entropy_step_size)), rtol=1e-5)
            self.assertLessEqual(widened, 1.1 * eps)

    @chex.variants(with_jit=True, without_jit=True)
    def test_bounded_tightening_below_eps_high(self):
        update = self.variant(functools.partial(entropy.entropy_controller_update, target=jnp.float32(1.0),
                                                step_size=jnp.float32(0.2), k_max=jnp.float32(1.0),
                                                k_min=jnp.float32(-0.5)))
        state, trace = entropy.entropy_controller_init(), []
        for _ in range(4):  # entropy above target: k = -0.2, -0.4, then the bound -0.5
            state = update(state, jnp.float32(2.0))
            trace.append(float(entropy.controlled_eps_high(state, jnp.float32(4e-4))))
        np.testing.assert_allclose(trace, [3.2e-4, 2.4e-4, 2e-4, 2e-4], rtol=1e-5)
        from jaxrl_vr.train.step import LossConfig
        with pytest.raises(ValueError, match="entropy_k_min"):
            LossConfig(entropy="feedback", entropy_k_min=-1.5)

    def test_neutral_controller_leaves_the_surrogate_unchanged(self):
        from jaxrl_vr import losses
        log_ratio = jnp.log(jnp.array([0.5, 0.9, 1.1, 1.25, 1.5, 2.0]))
        adv = jnp.array([1.0, -1.0, 1.0, 1.0, 1.0, -1.0])
        plain, _ = losses.clipped_surrogate(log_ratio, adv, eps_low=0.2, eps_high=0.28)
        controlled, _ = losses.clipped_surrogate(
            log_ratio, adv, eps_low=0.2,
            eps_high=entropy.controlled_eps_high(entropy.entropy_controller_init(), 0.28))
        chex.assert_trees_all_equal(controlled, plain)

    def test_no_recompile_when_target_changes(self):
        update = jax.jit(entropy.entropy_controller_update)
        state = entropy.entropy_controller_init()
        state = update(state, jnp.float32(0.5), target=jnp.float32(1.0), step_size=jnp.float32(0.1),
                       k_max=jnp.float32(1.0))
        state = update(state, jnp.float32(0.5), target=jnp.float32(0.2),
                       step_size=jnp.float32(0.05), k_max=jnp.float32(1.0))
        self.assertEqual(update._cache_size(), 1)  # pylint: disable=protected-access
        np.testing.assert_allclose(state.k, 0.05, rtol=1e-6)  # +0.1 then -0.05

    def test_rejects_non_scalar_entropy(self):
        with pytest.raises(AssertionError):
            entropy.entropy_controller_update(entropy.entropy_controller_init(), jnp.ones(3),
                                              target=1.0, step_size=0.1, k_max=1.0)
