"""Tests for jaxrl_vr.ratios: token log-probs (chunked, from hidden) and log-ratios."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_vr import ratios


def _naive_logprobs(logits_btv, tokens_bt):
    logp_btv = jax.nn.log_softmax(logits_btv.astype(jnp.float32), axis=-1)
    return jnp.take_along_axis(logp_btv, tokens_bt[..., None], axis=-1)[..., 0]


def _random_problem(seed, batch=2, length=7, vocab=11, width=5):
    # numpy data: no per-shape XLA compilations just to build test inputs.
    rng = np.random.default_rng(seed)
    logits_btv = jnp.asarray(3.0 * rng.standard_normal((batch, length, vocab)), jnp.float32)
    tokens_bt = jnp.asarray(rng.integers(0, vocab, (batch, length)), jnp.int32)
    hidden_btd = jnp.asarray(rng.standard_normal((batch, length, width)), jnp.float32)
    unembed_dv = jnp.asarray(rng.standard_normal((width, vocab)), jnp.float32)
    return logits_btv, tokens_bt, hidden_btd, unembed_dv


def _normal(seed, shape):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _uniform(seed, shape):
    return jnp.asarray(np.random.default_rng(seed).uniform(size=shape), jnp.float32)


class TokenLogprobsTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_computed(self):
        # Row 0: logits [0, ln 3] -> softmax [1/4, 3/4]; token 1 -> log(3/4) = -0.2876821.
        # Row 1: logits [1, 1] -> softmax [1/2, 1/2]; token 0 -> log(1/2) = -0.6931472.
        logits_btv = jnp.array([[[0.0, math.log(3.0)], [1.0, 1.0]]])
        tokens_bt = jnp.array([[1, 0]])
        logp_bt = self.variant(ratios.token_logprobs, static_argnames="chunk_size")(
            logits_btv, tokens_bt, chunk_size=1)
        self.assertEqual(logp_bt.dtype, jnp.float32)
        np.testing.assert_allclose(logp_bt, [[math.log(0.75), math.log(0.5)]], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_log_softmax_f32_and_bf16_any_chunk(self):
        logits_btv, tokens_bt, _, _ = _random_problem(0)
        fn = self.variant(ratios.token_logprobs, static_argnames="chunk_size")
        for dtype in (jnp.float32, jnp.bfloat16):
            logits = logits_btv.astype(dtype)
            expected = _naive_logprobs(logits, tokens_bt)  # upcast of the same bf16 values
            for chunk_size in (None, 3):  # 3 does not divide T = 7
                logp_bt = fn(logits, tokens_bt, chunk_size=chunk_size)
                self.assertEqual(logp_bt.dtype, jnp.float32)
                np.testing.assert_allclose(logp_bt, expected, atol=1e-5,
                                           err_msg=f"{dtype} {chunk_size}")

    def test_chunked_gradient_matches_naive(self):
        logits_btv, tokens_bt, _, _ = _random_problem(1)
        weights_bt = _normal(7, tokens_bt.shape)

        def chunked(logits):
            return jnp.sum(weights_bt * ratios.token_logprobs(logits, tokens_bt, chunk_size=3))

        def naive(logits):
            return jnp.sum(weights_bt * _naive_logprobs(logits, tokens_bt))

        np.testing.assert_allclose(jax.jit(jax.grad(chunked))(logits_btv),
                                   jax.jit(jax.grad(naive))(logits_btv), atol=1e-6)
        # bf16 logits: the gradient comes back in bf16, equal to the naive one up to rounding.
        logits_bf16 = logits_btv.astype(jnp.bfloat16)
        grad_bf16 = jax.jit(jax.grad(chunked))(logits_bf16)
        self.assertEqual(grad_bf16.dtype, jnp.bfloat16)
        np.testing.assert_allclose(grad_bf16.astype(jnp.float32),
                                   jax.jit(jax.grad(naive))(logits_bf16).astype(jnp.float32),
                                   atol=1e-2)

    def test_chunked_logprobs_memory(self):
        # float32 logits [2, 64, 2048] = 1 MiB. The naive log_softmax keeps a 1 MiB temporary;
        # chunks of 8 need one [2, 8, 2048] chunk (128 KiB) forward and about two backward.
        tokens_bt = jnp.zeros((2, 64), jnp.int32)
        logits_btv = jnp.zeros((2, 64, 2048))
        full_bytes = logits_btv.size * 4

        def temp_bytes(fn):
            return jax.jit(fn).lower(logits_btv).compile().memory_analysis().temp_size_in_bytes

        def chunked(x):
            return jnp.sum(ratios.token_logprobs(x, tokens_bt, chunk_size=8))

        def naive(x):
            return jnp.sum(_naive_logprobs(x, tokens_bt))

        self.assertGreaterEqual(temp_bytes(naive), full_bytes)
        self.assertLess(temp_bytes(chunked), full_bytes // 4)
        self.assertLess(temp_bytes(jax.grad(chunked)), full_bytes // 2)

    def test_out_of_range_tokens_are_finite(self):
        logits_btv, tokens_bt, _, _ = _random_problem(2)
        tokens_bt = tokens_bt.at[0, 0].set(-1).at[1, 2].set(10_000)
        self.assertTrue(np.isfinite(ratios.token_logprobs(logits_btv, tokens_bt)).all())

    def test_bad_input_raises(self):
        logits_btv, tokens_bt, _, _ = _random_problem(3)
        with pytest.raises(ValueError, match="tokens_bt has shape"):
            ratios.token_logprobs(logits_btv, tokens_bt[:, :3])
        with pytest.raises(TypeError, match="integer"):
            ratios.token_logprobs(logits_btv, tokens_bt.astype(jnp.float32))
        with pytest.raises(ValueError, match="chunk_size"):
            ratios.token_logprobs(logits_btv, tokens_bt, chunk_size=0)

    def test_auto_chunk_size(self):
        # budget 100_000 // (2 * 1000) = 50 -> rounded down to a multiple of 8 -> 48.
        self.assertEqual(ratios.auto_chunk_size(2, 100, 1000, budget_elements=100_000), 48)
        # 50 >= T = 40: no chunking.
        self.assertEqual(ratios.auto_chunk_size(2, 40, 1000, budget_elements=100_000), 40)
        # 5_000 // 2_000 = 2 (< 8, kept as is); a budget below one row still gives 1.
        self.assertEqual(ratios.auto_chunk_size(2, 40, 1000, budget_elements=5_000), 2)
        self.assertEqual(ratios.auto_chunk_size(2, 40, 1000, budget_elements=10), 1)


class FromHiddenTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_naive_value_and_entropy(self):
        _, tokens_bt, hidden_btd, unembed_dv = _random_problem(4)
        logits_btv = hidden_btd @ unembed_dv
        expected_logp = _naive_logprobs(logits_btv, tokens_bt)
        p_btv = jax.nn.softmax(logits_btv, axis=-1)
        expected_entropy = -jnp.sum(p_btv * jax.nn.log_softmax(logits_btv, axis=-1), axis=-1)
        fn = self.variant(ratios.token_logprobs_from_hidden,
                          static_argnames=("chunk_size", "with_entropy"))
        for chunk_size in (None, 3):  # 3 does not divide T = 7
            logp_bt, entropy_bt = fn(hidden_btd, unembed_dv, tokens_bt, chunk_size=chunk_size,
                                     with_entropy=True)
            np.testing.assert_allclose(logp_bt, expected_logp, atol=1e-5)
            np.testing.assert_allclose(entropy_bt, expected_entropy, atol=1e-5)
        logp_bt, entropy_bt = fn(hidden_btd, unembed_dv, tokens_bt, chunk_size=3)
        self.assertIsNone(entropy_bt)
        np.testing.assert_allclose(logp_bt, expected_logp, atol=1e-5)

    def test_gradient_matches_naive(self):
        _, tokens_bt, hidden_btd, unembed_dv = _random_problem(5)
        weights_bt = _normal(8, tokens_bt.shape)

        def chunked(hidden, unembed):
            logp_bt, entropy_bt = ratios.token_logprobs_from_hidden(
                hidden, unembed, tokens_bt, chunk_size=3, with_entropy=True)
            return jnp.sum(weights_bt * logp_bt) + 0.1 * jnp.sum(entropy_bt)

        def naive(hidden, unembed):
            logits_btv = hidden @ unembed
            logp_btv = jax.nn.log_softmax(logits_btv, axis=-1)
            entropy_bt = -jnp.sum(jnp.exp(logp_btv) * logp_btv, axis=-1)
            logp_bt = _naive_logprobs(logits_btv, tokens_bt)
            return jnp.sum(weights_bt * logp_bt) + 0.1 * jnp.sum(entropy_bt)

        got = jax.jit(jax.grad(chunked, argnums=(0, 1)))(hidden_btd, unembed_dv)
        want = jax.jit(jax.grad(naive, argnums=(0, 1)))(hidden_btd, unembed_dv)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, atol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_single_chunk_equals_chunked_value_and_gradient(self):
        """One chunk (no jax.checkpoint) and three checkpointed chunks: same values and
        gradients, in float32 and with bf16 hidden states (the mixed-precision LM head)."""
        _, tokens_bt, hidden_btd, unembed_dv = _random_problem(12)
        weights_bt = _normal(13, tokens_bt.shape)

        def loss(chunk_size):
            def total(hidden, unembed):
                logp_bt, entropy_bt = ratios.token_logprobs_from_hidden(
                    hidden, unembed, tokens_bt, chunk_size=chunk_size, with_entropy=True)
                return jnp.sum(weights_bt * logp_bt) + 0.1 * jnp.sum(entropy_bt)
            return self.variant(jax.value_and_grad(total, argnums=(0, 1)))

        for hidden in (hidden_btd, hidden_btd.astype(jnp.bfloat16)):
            single = loss(7)(hidden, unembed_dv)
            chunked = loss(3)(hidden, unembed_dv)
            chex.assert_trees_all_close(single, chunked, rtol=1e-5, atol=1e-5)
            self.assertEqual(single[1][0].dtype, hidden.dtype)

    def test_bf16_inputs_give_f32_close_to_reference(self):
        _, tokens_bt, hidden_btd, unembed_dv = _random_problem(6)
        hidden_bf16, unembed_bf16 = hidden_btd.astype(jnp.bfloat16), unembed_dv.astype(jnp.bfloat16)
        logp_bt, _ = ratios.token_logprobs_from_hidden(hidden_bf16, unembed_bf16, tokens_bt,
                                                       chunk_size=3)
        self.assertEqual(logp_bt.dtype, jnp.float32)
        # Reference: same bf16 values, exact float32 matmul.
        logits_btv = hidden_bf16.astype(jnp.float32) @ unembed_bf16.astype(jnp.float32)
        expected = _naive_logprobs(logits_btv, tokens_bt)
        np.testing.assert_allclose(logp_bt, expected, atol=1e-4)

    def test_never_materialises_full_logits(self):
        # Full f32 logits would be B*T*V*4 = 2*64*2048*4 bytes = 1 MiB; one chunk of 8 is 128 KiB.
        batch, length, vocab, width = 2, 64, 2048, 8
        full_logits_bytes = batch * length * vocab * 4
        hidden_btd = jnp.zeros((batch, length, width))
        unembed_dv = jnp.zeros((width, vocab))
        tokens_bt = jnp.zeros((batch, length), jnp.int32)

        def loss(fn):
            return lambda h, w: jnp.sum(fn(h, w))

        chunked = loss(lambda h, w: ratios.token_logprobs_from_hidden(
            h, w, tokens_bt, chunk_size=8, with_entropy=True)[0])
        naive = loss(lambda h, w: _naive_logprobs(h @ w, tokens_bt))

        def temp_bytes(fn):
            grad_fn = jax.jit(jax.value_and_grad(fn, argnums=(0, 1)))
            compiled = grad_fn.lower(hidden_btd, unembed_dv).compile()
            return compiled.memory_analysis().temp_size_in_bytes

        # The naive measurement proves the probe sees [B, T, V] buffers at all.
        self.assertGreaterEqual(temp_bytes(naive), full_logits_bytes)
        self.assertLess(temp_bytes(chunked), full_logits_bytes // 2)

    def test_batch_sharded_matches_unsharded(self):
        # The trainer shards responses over a data axis (jaxrl_vr.parallel builds Auto meshes).
        devices = np.array(jax.devices()[:2])
        if devices.size < 2:
            self.skipTest("needs 2 devices (tests/conftest.py forces 8 CPU devices)")
        sharding = jax.sharding.NamedSharding(jax.sharding.Mesh(devices, ("data",)),
                                              jax.sharding.PartitionSpec("data"))
        _, tokens_bt, hidden_btd, unembed_dv = _random_problem(11, batch=4)

        @jax.jit
        def value_and_grads(hidden, tokens):
            def total(h, w):
                logp_bt, entropy_bt = ratios.token_logprobs_from_hidden(
                    h, w, tokens, chunk_size=3, with_entropy=True)
                return jnp.sum(logp_bt) + jnp.sum(entropy_bt)
            return jax.value_and_grad(total, argnums=(0, 1))(hidden, unembed_dv)

        sharded = value_and_grads(jax.device_put(hidden_btd, sharding),
                                  jax.device_put(tokens_bt, sharding))
        unsharded = value_and_grads(hidden_btd, tokens_bt)
        for got, want in zip(jax.tree.leaves(sharded), jax.tree.leaves(unsharded)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    def test_width_mismatch_raises(self):
        _, tokens_bt, hidden_btd, unembed_dv = _random_problem(7)
        with pytest.raises(ValueError, match="unembed_dv rows"):
            ratios.token_logprobs_from_hidden(hidden_btd, unembed_dv.T, tokens_bt)


def _autodiff_logprob_and_entropy(logits_bcv, tokens_bc):
    """The textbook formulas, differentiated by JAX (reference for the written-out VJP)."""
    logsumexp_bc = jax.nn.logsumexp(logits_bcv, axis=-1)
    token_logit_bc = jnp.take_along_axis(logits_bcv, tokens_bc[..., None], axis=-1)[..., 0]
    logp_bcv = logits_bcv - logsumexp_bc[..., None]
    p_bcv = jnp.exp(logp_bcv)
    entropy_bc = -jnp.sum(p_bcv * jnp.where(p_bcv > 0, logp_bcv, 0.0), axis=-1)  # 0·log 0 = 0
    return token_logit_bc - logsumexp_bc, entropy_bc


class FusedLogSoftmaxEntropyTest(chex.TestCase):
    """`logprob_and_entropy`: the written-out backward pass of log π(y) and H."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_gradient_by_hand(self):
        # z = (0, log 3): p = (1/4, 3/4), y = 1. d log p_y / dz = onehot − p = (−1/4, 1/4);
        # dH/dz_v = −p_v (log p_v + H), H = −(1/4) log(1/4) − (3/4) log(3/4).
        z = jnp.array([[[0.0, math.log(3.0)]]])
        y = jnp.array([[1]])
        h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
        fn = self.variant(jax.grad(
            lambda z, a, b: a * ratios.logprob_and_entropy(z, y, True)[0].sum()
            + b * ratios.logprob_and_entropy(z, y, True)[1].sum()))
        np.testing.assert_allclose(fn(z, 1.0, 0.0), [[[-0.25, 0.25]]], rtol=1e-6)
        d_entropy = [-0.25 * (math.log(0.25) + h), -0.75 * (math.log(0.75) + h)]
        np.testing.assert_allclose(fn(z, 0.0, 1.0), [[d_entropy]], rtol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_autodiff_with_minus_inf_logits_and_padding_ids(self):
        logits_bcv, tokens_bc, _, _ = _random_problem(5, batch=3, length=4, vocab=9)
        logits_bcv = logits_bcv.at[0, 1, 2].set(-jnp.inf).at[2, 0, :4].set(-jnp.inf)
        tokens_bc = tokens_bc.at[1, 2].set(-1).at[2, 3].set(99)  # clipped, maskable ids
        tokens_bc = tokens_bc.at[0, 0].set(2)
        weights_logp, weights_entropy = _normal(1, (3, 4)), _normal(2, (3, 4))

        def objective(fn):
            def total(z):
                logp_bc, entropy_bc = fn(z, jnp.clip(tokens_bc, 0, 8))
                return jnp.sum(weights_logp * logp_bc) + jnp.sum(weights_entropy * entropy_bc), (
                    logp_bc, entropy_bc)
            return self.variant(jax.value_and_grad(total, has_aux=True))

        (_, (logp, entropy)), grad = objective(
            lambda z, y: ratios.logprob_and_entropy(z, y, True))(logits_bcv)
        (_, (want_logp, want_entropy)), want_grad = objective(_autodiff_logprob_and_entropy)(logits_bcv)
        np.testing.assert_allclose(logp, want_logp, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(entropy, want_entropy, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-6)
        self.assertTrue(np.all(np.isfinite(grad)))
        self.assertEqual(float(grad[0, 1, 2]), 0.0)  # a −inf logit gets no gradient

    def test_backward_keeps_fewer_vocabulary_sized_buffers_than_autodiff(self):
        # One [B, c, V] float32 array is 4 MiB here; JAX's derivative of logsumexp + entropy
        # keeps several alive between the passes, the written-out VJP only the logits.
        batch, length, vocab = 4, 16, 16384
        tokens_bc = jnp.zeros((batch, length), jnp.int32)
        logits_bcv = jnp.zeros((batch, length, vocab))
        one_array = batch * length * vocab * 4

        def temp_bytes(fn):
            def total(z):
                logp_bc, entropy_bc = fn(z, tokens_bc)
                return jnp.sum(logp_bc) + jnp.sum(entropy_bc)
            compiled = jax.jit(jax.grad(total)).lower(logits_bcv).compile()
            return compiled.memory_analysis().temp_size_in_bytes

        fused = temp_bytes(lambda z, y: ratios.logprob_and_entropy(z, y, True))
        autodiff = temp_bytes(_autodiff_logprob_and_entropy)
        self.assertLessEqual(fused + one_array, autodiff)


class LogRatioTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_token_log_ratio_clipped(self):
        logp_bt = jnp.array([[-1.0, 0.0, -100.0]])
        old_logp_bt = jnp.array([[-1.5, -100.0, 0.0]])
        # Differences 0.5, 100 -> 20, -100 -> -20.
        np.testing.assert_allclose(self.variant(ratios.token_log_ratio)(logp_bt, old_logp_bt),
                                   [[0.5, 20.0, -20.0]])
        np.testing.assert_allclose(ratios.clip_log_ratio(jnp.array([-3.0, 3.0]), bound=2.0),
                                   [-2.0, 2.0])

    @chex.variants(with_jit=True, without_jit=True)
    def test_sequence_log_ratio_hand_computed(self):
        logp_bt = jnp.array([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0], [0.0, 0.0, 0.0]])
        old_logp_bt = jnp.array([[-1.5, -2.0, -2.0], [-2.0, -2.0, -2.0], [jnp.inf, jnp.nan, 0.0]])
        mask_bt = jnp.array([[True, True, False], [False, False, False], [False, False, True]])
        # Row 0: (0.5 + 0.0) / 2 = 0.25 (the masked -1.0 is ignored).
        # Row 1: empty mask -> 0.  Row 2: only t=2 counts: 0 - 0 = 0 (inf/NaN masked out).
        seq_b = self.variant(ratios.sequence_log_ratio)(logp_bt, old_logp_bt, mask_bt)
        np.testing.assert_allclose(seq_b, [0.25, 0.0, 0.0])
        # Clipped: mean difference 1e4 -> 20.
        np.testing.assert_allclose(
            ratios.sequence_log_ratio(jnp.full((1, 2), 0.0), jnp.full((1, 2), -1e4),
                                      jnp.ones((1, 2), bool)), [20.0])

    @chex.variants(with_jit=True, without_jit=True)
    def test_gspo_value_is_sequence_gradient_is_token(self):
        logp_bt = -_uniform(90, (3, 5))
        old_logp_bt = -_uniform(91, (3, 5))
        mask_bt = jnp.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], bool)
        gspo = self.variant(ratios.gspo_token_log_ratio)
        value_bt = gspo(logp_bt, old_logp_bt, mask_bt)
        seq_b = ratios.sequence_log_ratio(logp_bt, old_logp_bt, mask_bt)
        np.testing.assert_allclose(value_bt, jnp.where(mask_bt, seq_b[:, None], 0.0), atol=1e-7)
        # Gradient: d Σ w·value / d logp = w·mask, the gradient of the masked token ratio.
        weights_bt = _normal(92, (3, 5))
        grad = jax.grad(lambda lp: jnp.sum(weights_bt * gspo(lp, old_logp_bt, mask_bt)))(logp_bt)
        token_grad = jax.grad(lambda lp: jnp.sum(weights_bt * jnp.where(
            mask_bt, ratios.token_log_ratio(lp, old_logp_bt), 0.0)))(logp_bt)
        np.testing.assert_array_equal(grad, token_grad)
        np.testing.assert_array_equal(grad, jnp.where(mask_bt, weights_bt, 0.0))

    def test_gspo_token_mean_reproduces_sequence_gradient(self):
        # GSPO: J = mean_i A_i s_i with s_i = exp(seq_i); GSPO-token with a per-sequence
        # token mean of A_i s_{i,t} has the same value and gradient (arXiv 2507.18071).
        logp_bt = -_uniform(100, (2, 4))
        old_logp_bt = -_uniform(101, (2, 4))
        adv_b = jnp.array([1.5, -0.5])
        mask_bt = jnp.array([[1, 1, 0, 0], [1, 1, 1, 1]], bool)

        def sequence_objective(lp):
            return jnp.mean(adv_b * jnp.exp(ratios.sequence_log_ratio(lp, old_logp_bt, mask_bt)))

        def token_objective(lp):
            s_bt = jnp.exp(ratios.gspo_token_log_ratio(lp, old_logp_bt, mask_bt))
            per_seq = jnp.sum(jnp.where(mask_bt, adv_b[:, None] * s_bt, 0.0), axis=1)
            return jnp.mean(per_seq / jnp.sum(mask_bt, axis=1))

        token_value, token_grad = jax.jit(jax.value_and_grad(token_objective))(logp_bt)
        seq_value, seq_grad = jax.jit(jax.value_and_grad(sequence_objective))(logp_bt)
        np.testing.assert_allclose(token_value, seq_value, rtol=1e-6)
        np.testing.assert_allclose(token_grad, seq_grad, rtol=1e-5, atol=1e-7)
