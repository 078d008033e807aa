"""Decoder numerics: HF parity (torch reference logits stored in tests/fixtures), RoPE, RMSNorm,
KV-cache consistency, padding invariance, bf16."""

import contextlib
import functools
import io
import math
import os
import re
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from flax import nnx

from jaxrl_vr.models import Decoder, DecoderConfig, from_pretrained, set_compute_dtype
from jaxrl_vr.models import decoder as decoder_lib
from jaxrl_vr.ratios import mixed_einsum

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures")
FIXTURE_NAMES = ("tiny_llama", "tiny_qwen2", "tiny_qwen3")


@nnx.jit
def forward(model, tokens_bt, mask_bt):
    return model(tokens_bt, mask_bt=mask_bt)


def load_fixture(name, dtype="float32"):
    path = os.path.join(FIXTURES, name)
    return from_pretrained(path, dtype=dtype), dict(np.load(os.path.join(path, "reference.npz")))


def full_config(**overrides):
    """Every switch on: q/k/v + o bias, q/k norm, untied, Llama-3 RoPE scaling."""
    fields = dict(attention_bias=True, attention_out_bias=True, qk_norm=True, tie_word_embeddings=False,
                  rope_scaling=dict(rope_type="llama3", factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                    original_max_position_embeddings=32))
    fields.update(overrides)
    return DecoderConfig.tiny(vocab_size=64, hidden_size=32, intermediate_size=48, head_dim=8, **fields)


def randomized(model, seed=0, scale=0.3):
    """Perturbs every parameter (norms away from 1, biases away from 0) so mapping bugs show."""
    nnx.update(model, _perturb(jax.random.key(seed), nnx.state(model, nnx.Param), scale))
    return model


@jax.jit
def _perturb(key, state, scale):
    leaves, treedef = jax.tree.flatten(state)
    noise = jax.random.normal(key, (sum(x.size for x in leaves),), jnp.float32)
    offsets = np.cumsum([0] + [x.size for x in leaves])
    return jax.tree.unflatten(treedef, [x + scale * noise[o:o + x.size].reshape(x.shape).astype(x.dtype)
                                        for x, o in zip(leaves, offsets)])


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_logits_match_transformers(name):
    model, ref = load_fixture(name)
    logits = forward(model, jnp.asarray(ref["input_ids"]), jnp.asarray(ref["attention_mask"]))
    assert logits.dtype == jnp.float32
    real = ref["attention_mask"]
    np.testing.assert_allclose(np.asarray(logits)[real], ref["logits"][real], atol=1e-4, rtol=1e-4)


def test_bf16_params_give_float32_logits_close_to_fp32():
    model32, ref = load_fixture("tiny_qwen3")
    model16, _ = load_fixture("tiny_qwen3", dtype="bfloat16")
    assert model16.embed[...].dtype == jnp.bfloat16
    tokens, mask = jnp.asarray(ref["input_ids"]), jnp.asarray(ref["attention_mask"])
    logits32, logits16 = forward(model32, tokens, mask), forward(model16, tokens, mask)
    assert logits16.dtype == jnp.float32
    real = ref["attention_mask"]
    err = np.abs(np.asarray(logits16 - logits32))[real]
    scale = np.abs(np.asarray(logits32))[real].max()
    # bf16 keeps 8 mantissa bits (rel. 2^-8 ≈ 0.4%) per op; two layers stay within ~5% of the range.
    assert err.max() < 0.05 * scale, (err.max(), scale)
    assert err.max() > 0  # Really computed in bf16.


def test_rms_norm_hand_computed():
    # x = [3, 4]: mean(x²) = (9 + 16)/2 = 12.5, 1/√12.5 = 0.28284; times w = [1, 2].
    out = decoder_lib.rms_norm(jnp.array([3.0, 4.0]), jnp.array([1.0, 2.0]), 0.0)
    np.testing.assert_allclose(out, [3 * 0.2828427, 2 * 4 * 0.2828427], rtol=1e-6)


def test_rope_rotate_half_hand_computed():
    # head_dim 4: pairs (x0, x2) rotate by p·f0, (x1, x3) by p·f1 (HF rotate_half convention).
    x = jnp.array([1.0, 2.0, 3.0, 4.0]).reshape(1, 1, 1, 4)
    inv_freq = np.array([1.0, 0.01], np.float32)
    cos, sin = decoder_lib.rope_cos_sin(jnp.array([[3]]), inv_freq)
    out = decoder_lib.apply_rope(x, cos, sin).reshape(4)
    a, b = 3.0, 0.03
    expected = [1 * math.cos(a) - 3 * math.sin(a), 2 * math.cos(b) - 4 * math.sin(b),
                3 * math.cos(a) + 1 * math.sin(a), 4 * math.cos(b) + 2 * math.sin(b)]
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_llama3_rope_scaling_hand_computed():
    # head_dim 6, θ = 1000: f = [1, 0.1, 0.01], wavelengths 2π/f = [6.28, 62.83, 628.3].
    # L_orig = 128, low = 1, high = 4: keep λ < 128/4 = 32, divide by factor 8 when λ > 128,
    # blend in between: s = (128/62.83 − 1)/(4 − 1) = 0.345741, f' = (1 − s)·0.1/8 + s·0.1.
    config = DecoderConfig.tiny(head_dim=6, num_heads=2, num_kv_heads=2, rope_theta=1000.0, rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=128))
    s = (128 / (2 * math.pi / 0.1) - 1) / 3
    expected = [1.0, (1 - s) * 0.1 / 8 + s * 0.1, 0.01 / 8]
    np.testing.assert_allclose(decoder_lib.rope_inv_freq(config), expected, rtol=1e-5)
    plain = decoder_lib.rope_inv_freq(config.replace(rope_scaling=None))
    np.testing.assert_allclose(plain, [1.0, 0.1, 0.01], rtol=1e-5)


# One shared model and batch so the jitted forward compiles once for most tests.
# Rows: 0 unpadded; 1 = three pads (id 0) + row 0's first four tokens; 2 = the same with pad ids
# 17, 3, 9; 3 fully padded.
TOKENS = np.array([[11, 12, 13, 14, 15, 16, 17], [0, 0, 0, 11, 12, 13, 14],
                   [17, 3, 9, 11, 12, 13, 14], [0] * 7], np.int32)
MASK = np.array([[True] * 7, [False] * 3 + [True] * 4, [False] * 3 + [True] * 4, [False] * 7])


@pytest.fixture(scope="module")
def model():
    return randomized(Decoder(full_config(), rngs=nnx.Rngs(0)))


def test_padding_invariance_and_masked_rows_finite(model):
    """Left padding (whatever the pad ids) gives the unpadded logits; fully masked rows stay finite."""
    logits = np.asarray(forward(model, TOKENS, MASK))
    assert np.isfinite(logits).all()
    for row in (1, 2):
        np.testing.assert_allclose(logits[row, 3:], logits[0, :4], atol=1e-5, rtol=1e-5)
    assert np.abs(logits[1, 3:] - logits[0, 3:]).max() > 1e-3  # Positions matter (not a vacuous check).


def test_logits_are_hidden_times_unembed_and_causal(model):
    hidden, unembed, logits = nnx.jit(lambda m, t, k: (m.hidden_states(t, mask_bt=k), m.unembed_matrix(),
                                                       m(t, mask_bt=k)))(model, TOKENS, MASK)
    assert unembed.shape == (32, 64) and hidden.shape == (4, 7, 32)
    np.testing.assert_allclose(logits, np.einsum("btd,dv->btv", hidden, unembed), atol=1e-5, rtol=1e-5)
    # Causality: changing the last token leaves earlier real positions' logits unchanged (padded
    # queries see no valid key, average over everything, and are meaningless).
    changed = TOKENS.copy()
    changed[:, -1] = 5
    changed_logits = forward(model, changed, MASK)
    earlier = MASK.copy()
    earlier[:, -1] = False
    np.testing.assert_allclose(np.asarray(changed_logits)[earlier], np.asarray(logits)[earlier], atol=1e-6)
    assert np.abs(np.asarray(changed_logits[0, -1] - logits[0, -1])).max() > 1e-3
    tied = Decoder(DecoderConfig.tiny(vocab_size=32), rngs=nnx.Rngs(1))
    np.testing.assert_array_equal(tied.unembed_matrix(), tied.embed[...].T)


def test_decode_steps_match_full_forward(model):
    """Prefill a left-padded chunk, then T=1 steps: logits equal one full forward pass."""
    positions = decoder_lib.default_positions(jnp.asarray(MASK))
    full = np.asarray(forward(model, TOKENS, MASK))
    step = nnx.jit(lambda m, t, p, c, k: m.decode_step(t, p, c, mask_bt=k))
    cache = model.init_cache(4, 16)
    logits, cache = step(model, TOKENS[:, :4], positions[:, :4], cache, MASK[:, :4])
    pieces = [logits]
    for t in range(4, 7):
        logits, cache = step(model, TOKENS[:, t:t + 1], positions[:, t:t + 1], cache, MASK[:, t:t + 1])
        pieces.append(logits)
    assert int(cache.index) == 7
    np.testing.assert_array_equal(cache.valid_bm[:, :7], MASK)
    assert not cache.valid_bm[:, 7:].any()
    np.testing.assert_allclose(np.asarray(jnp.concatenate(pieces, 1))[MASK], full[MASK], atol=1e-5)
    last, _ = nnx.jit(lambda m: m.decode_step(TOKENS, positions, m.init_cache(4, 8), mask_bt=jnp.asarray(MASK),
                                              last_only=True))(model)
    np.testing.assert_allclose(last[:3, 0], full[:3, -1], atol=1e-5)


def test_grown_cache_keeps_its_slots_and_decodes_as_the_longer_one(model):
    """`KVCache.grown` appends empty slots: the kept slots, index and validity are unchanged,
    the new ones are zero and invalid, and decoding on into them gives the logits of a cache
    that had all its slots from the start (the grown slots hold nothing a query may see)."""
    positions = decoder_lib.default_positions(jnp.asarray(MASK))
    step = nnx.jit(lambda m, t, p, c, k: m.decode_step(t, p, c, mask_bt=k))
    short = step(model, TOKENS[:, :5], positions[:, :5], model.init_cache(4, 5), MASK[:, :5])[1]
    grown = short.grown(9)
    assert grown.valid_bm.shape == (4, 9) and int(grown.index) == 5
    np.testing.assert_array_equal(grown.valid_bm[:, :5], short.valid_bm)
    assert not grown.valid_bm[:, 5:].any()
    np.testing.assert_array_equal(grown.keys_bkem[1][..., :5], short.keys_bkem[1])
    np.testing.assert_array_equal(grown.values_bkme[1][:, :, :5], short.values_bkme[1])
    assert float(jnp.abs(grown.keys_bkem[1][..., 5:]).max()) == 0.0
    assert float(jnp.abs(grown.values_bkme[1][:, :, 5:]).max()) == 0.0
    long = step(model, TOKENS[:, :5], positions[:, :5], model.init_cache(4, 9), MASK[:, :5])[1]
    for t in range(5, 7):
        from_grown, grown = step(model, TOKENS[:, t:t + 1], positions[:, t:t + 1], grown, MASK[:, t:t + 1])
        from_long, long = step(model, TOKENS[:, t:t + 1], positions[:, t:t + 1], long, MASK[:, t:t + 1])
        real = MASK[:, t]  # Row 3 is all padding: no slot it may see, its logits mean nothing.
        np.testing.assert_allclose(from_grown[real], from_long[real], atol=1e-5)
    with pytest.raises(ValueError, match="would drop slots"):
        short.grown(4)


def test_grads_finite_zero_through_padding_and_remat_equal(model):
    def loss(m):
        return jnp.sum(jnp.where(jnp.asarray(MASK)[..., None], m(TOKENS, mask_bt=jnp.asarray(MASK)), 0.0) ** 2)

    grad_fn = nnx.jit(nnx.grad(loss))
    grads = grad_fn(model)
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))
    # Token 0 appears only at padded positions; the untied input embedding row gets no gradient.
    assert float(jnp.abs(grads.embed[...][0]).max()) == 0.0
    assert float(jnp.abs(grads.embed[...][11]).max()) > 0.0
    remat = nnx.merge(*nnx.split(Decoder(full_config(), rngs=nnx.Rngs(0), remat=True)))
    nnx.update(remat, nnx.state(model))
    chex.assert_trees_all_close(grad_fn(remat), grads, atol=1e-3, rtol=1e-3)  # Sums reassociate.


def test_input_validation():
    model = Decoder(DecoderConfig.tiny(vocab_size=32), rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match="mask_bt must be bool"):
        model(jnp.zeros((1, 3), jnp.int32), mask_bt=jnp.ones((1, 3), jnp.int32))
    with pytest.raises(AssertionError):
        model(jnp.zeros((3,), jnp.int32))
    with pytest.raises(ValueError, match="cache holds only 4 slots"):
        model.decode_step(jnp.zeros((1, 5), jnp.int32), jnp.zeros((1, 5), jnp.int32), model.init_cache(1, 4))


def test_config_from_hf_round_trip_and_errors():
    config = full_config(model_type="qwen3", attention_out_bias=True)
    assert DecoderConfig.from_hf(config.to_hf()) == config
    qwen2 = full_config(model_type="qwen2", attention_out_bias=False, qk_norm=False)
    assert DecoderConfig.from_hf(qwen2.to_hf()) == qwen2
    hash(config)  # Static-argument safe.
    with pytest.raises(ValueError, match="model_type='gpt2'"):
        DecoderConfig.from_hf(transformers.GPT2Config())
    yarn = transformers.LlamaConfig(rope_parameters=dict(rope_type="yarn", rope_theta=1e4, factor=2.0))
    with pytest.raises(ValueError, match="'yarn' is not supported"):
        DecoderConfig.from_hf(yarn)
    with pytest.raises(ValueError, match="cannot be expressed"):
        DecoderConfig.tiny(qk_norm=True).to_hf()  # qk_norm needs model_type qwen3.
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        DecoderConfig.tiny(num_heads=4, num_kv_heads=3)


class ChunkAttentionFormsTest(chex.TestCase):
    """`attend` over a chunk runs float32 in the kv-major layout and bf16 in the grouped one:
    both forms give the same outputs and gradients as repeat_kv attention written out."""

    def _inputs(self, seed=0, batch=2, t=3, slots=5, heads=6, kv_heads=2, dim=4):
        keys = jax.random.split(jax.random.key(seed), 4)
        q_bthe = jax.random.normal(keys[0], (batch, t, heads, dim))
        k_bske = jax.random.normal(keys[1], (batch, slots, kv_heads, dim))
        v_bske = jax.random.normal(keys[2], (batch, slots, kv_heads, dim))
        allowed = np.tril(np.ones((t, slots), bool), k=slots - t)[None].repeat(batch, 0)  # A 2-slot prefix, causal.
        allowed[1, :, 0] = False  # Row 1's first slot is padding.
        return q_bthe, k_bske, v_bske, jnp.asarray(allowed), jax.random.normal(keys[3], (batch, t, heads, dim))

    @staticmethod
    def _written_out(q_bthe, k_bske, v_bske, allowed_bts):
        groups = q_bthe.shape[2] // k_bske.shape[2]
        k_bshe, v_bshe = jnp.repeat(k_bske, groups, axis=2), jnp.repeat(v_bske, groups, axis=2)
        logits = jnp.einsum("bthe,bshe->bhts", q_bthe, k_bshe) / math.sqrt(q_bthe.shape[-1])
        logits = jnp.where(allowed_bts[:, None], logits, -jnp.inf)
        return jnp.einsum("bhts,bshe->bthe", jax.nn.softmax(logits, axis=-1), v_bshe)

    @chex.variants(with_jit=True, without_jit=True)
    def test_both_forms_match_the_written_out_attention_and_its_gradients(self):
        q, k, v, allowed, cotangent_bthe = self._inputs()

        def loss(form):
            return lambda q, k, v: jnp.sum(form(q, k, v, allowed) * cotangent_bthe)

        forms = {"kv_major": decoder_lib._attend_kv_major,
                 "grouped": lambda q, k, v, a: decoder_lib._attend_grouped(q, k, v, a, jnp.float32),
                 "attend": decoder_lib.attend}
        expected = self._written_out(q, k, v, allowed)
        expected_grads = jax.grad(loss(self._written_out), argnums=(0, 1, 2))(q, k, v)
        for name, form in forms.items():
            out = self.variant(form)(q, k, v, allowed)
            chex.assert_shape(out, q.shape)
            np.testing.assert_allclose(out, expected, atol=1e-5, rtol=1e-5, err_msg=name)
            grads = self.variant(jax.grad(loss(form), argnums=(0, 1, 2)))(q, k, v)
            for got, want in zip(grads, expected_grads):
                np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5, err_msg=name)

    def test_the_compute_dtype_picks_the_form(self):
        q, k, v, allowed, _ = self._inputs()
        np.testing.assert_array_equal(decoder_lib.attend(q, k, v, allowed), decoder_lib._attend_kv_major(q, k, v, allowed))
        bf16 = decoder_lib.attend(q, k, v, allowed, compute_dtype=jnp.bfloat16)
        np.testing.assert_array_equal(bf16, decoder_lib._attend_grouped(q, k, v, allowed, jnp.bfloat16))
        np.testing.assert_allclose(bf16, self._written_out(q, k, v, allowed), atol=5e-2)


class OneTokenAttentionTest(chex.TestCase):
    """A decode step's attention (one query per row) over a float32 cache of at most 512 slots
    is broadcast multiplies and sums in float32, not dots, whatever the compute dtype; bf16
    and long caches keep the dots (both forms checked for the same values here)."""

    def _inputs(self, seed=0, batch=3, heads=6, kv_heads=2, dim=8, slots=10):
        keys = jax.random.split(jax.random.key(seed), 3)
        q_bthe = jax.random.normal(keys[0], (batch, 1, heads, dim))
        k_bske = jax.random.normal(keys[1], (batch, slots, kv_heads, dim))
        v_bske = jax.random.normal(keys[2], (batch, slots, kv_heads, dim))
        valid_bs = np.ones((batch, slots), bool)
        valid_bs[0, :7] = False  # Left padding: 3 valid slots.
        valid_bs[1, :9] = False  # A single valid slot.
        valid_bs[2, 4:6] = False  # Holes in the middle.
        return q_bthe, k_bske, v_bske, jnp.asarray(valid_bs)[:, None, :]

    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_the_dot_form(self):
        # (compute dtype, cache dtype) -> the precision the attention runs in: a float32 cache
        # takes the float32 one-token form under bf16 compute too; a bf16 cache, the bf16 dots.
        cases = {(jnp.float32, jnp.float32): jnp.float32, (jnp.bfloat16, jnp.float32): jnp.float32,
                 (jnp.bfloat16, jnp.bfloat16): jnp.bfloat16}
        for (compute_dtype, cache_dtype), attention_dtype in cases.items():
            q, k_bske, v_bske, allowed_bts = self._inputs()
            k_bske, v_bske = k_bske.astype(cache_dtype), v_bske.astype(cache_dtype)
            cached = self.variant(functools.partial(decoder_lib.attend_cache, compute_dtype=compute_dtype))(
                q, jnp.transpose(k_bske, (0, 2, 3, 1)), jnp.transpose(v_bske, (0, 2, 1, 3)), allowed_bts)
            reference = decoder_lib.attend(q, k_bske, v_bske, allowed_bts, compute_dtype=attention_dtype)
            tolerance = 1e-5 if attention_dtype == jnp.float32 else 2e-2
            np.testing.assert_allclose(cached, reference, atol=tolerance, rtol=tolerance)
            # Row 1 sees one slot: its output is that slot's value for each query head's kv head,
            # rounded to bf16 only where the attention ran in bf16.
            expected = jnp.repeat(v_bske[1, 9], 3, axis=0).astype(attention_dtype).astype(jnp.float32)
            np.testing.assert_allclose(cached[1, 0], expected, atol=1e-6)
        # The multiply-and-sum form itself, called directly.
        q, k_bske, v_bske, allowed_bts = self._inputs()
        q_btkge = q.reshape(3, 1, 2, 3, 8)
        one_token = self.variant(decoder_lib._attend_one_token)(
            q_btkge, jnp.transpose(k_bske, (0, 2, 3, 1)), jnp.transpose(v_bske, (0, 2, 1, 3)), allowed_bts)
        np.testing.assert_allclose(jnp.transpose(one_token, (0, 2, 1, 3, 4)).reshape(q.shape),
                                   decoder_lib.attend(q, k_bske, v_bske, allowed_bts), atol=1e-5, rtol=1e-5)

    def test_form_choice_by_hand(self):
        pays = decoder_lib.one_token_form_pays
        f32, bf16 = jnp.float32, jnp.bfloat16
        assert pays(1, 96, (f32, f32)) and pays(1, 512, (f32, f32))
        assert not pays(1, 513, (f32, f32))   # Long cache: the dots win.
        assert not pays(2, 96, (f32, f32))    # A chunk (prefill).
        assert not pays(1, 96, (bf16, bf16)) and not pays(1, 96, (f32, bf16))  # A bf16 cache: the dots.

    def test_default_cache_dtype_by_hand(self):
        """float32 on CPU wherever the one-token form runs (bf16 compute too), else the compute dtype."""
        config = DecoderConfig.tiny(vocab_size=64)
        mixed = config.replace(compute_dtype="bfloat16")
        default = decoder_lib.default_cache_dtype
        assert default(mixed, 96, "cpu") == jnp.float32 and default(mixed, 512, "cpu") == jnp.float32
        assert default(mixed, 513, "cpu") == jnp.bfloat16   # The dots read a 16-bit cache.
        assert default(mixed, 96, "gpu") == jnp.bfloat16 and default(mixed, 96, "tpu") == jnp.bfloat16
        assert default(config, 96, "gpu") == jnp.float32 and default(config, 513, "cpu") == jnp.float32

    def test_hand_computed(self):
        """One head, two slots: logits q·k/√2 = (1, 0), weights e/(e+1), 1/(e+1)."""
        q = jnp.asarray([[[[1.0, 1.0]]]])
        half = math.sqrt(2.0) / 2.0
        keys_bkes = jnp.asarray([[[[half, 0.0], [half, 0.0]]]])  # Columns: k0 = (√2/2, √2/2), k1 = 0.
        values_bkse = jnp.asarray([[[[2.0, 0.0], [0.0, 4.0]]]])
        out = decoder_lib.attend_cache(q, keys_bkes, values_bkse, jnp.ones((1, 1, 2), bool))
        one_token = decoder_lib._attend_one_token(q[:, :, :, None], keys_bkes, values_bkse, jnp.ones((1, 1, 2), bool))
        w = math.e / (math.e + 1.0)
        np.testing.assert_allclose(out[0, 0, 0], [2.0 * w, 4.0 * (1.0 - w)], rtol=1e-6)
        np.testing.assert_allclose(one_token[0, 0, 0, 0], [2.0 * w, 4.0 * (1.0 - w)], rtol=1e-6)

    def test_compiled_decode_step_has_no_attention_dots(self):
        """A float32 cache of 8 slots: 7 dots per layer (q, k, v, o, gate, up, down) and the LM
        head at T = 1, under float32 and bf16 compute; the two attention dots per layer come
        back for a chunk of 2 tokens, for a bf16 cache and for a 520-slot cache."""
        model = Decoder(DecoderConfig.tiny(vocab_size=64), rngs=nnx.Rngs(0))
        layers = model.config.num_layers
        step = nnx.jit(lambda m, t, p, c: m.decode_step(t, p, c))
        counts = {}
        cases = (("float32", 2, 1, 8), ("float32", 2, 2, 8), ("bfloat16", 2, 1, 8),
                 ("float32", 2, 1, 520))
        for compute_dtype, rows, t, slots in cases:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # bf16 without bf16 units.
                set_compute_dtype(model, compute_dtype)
            for cache_dtype in ("float32", "bfloat16"):
                tokens = jnp.ones((rows, t), jnp.int32)
                cache = model.init_cache(rows, slots, cache_dtype)
                hlo = step.lower(model, tokens, tokens, cache).compile().as_text()
                counts[compute_dtype, cache_dtype, t, slots] = len(re.findall(r" dot\(", hlo))
        one_token, dots = 7 * layers + 1, 9 * layers + 1
        assert counts == {("float32", "float32", 1, 8): one_token, ("float32", "bfloat16", 1, 8): dots,
                          ("float32", "float32", 2, 8): dots, ("float32", "bfloat16", 2, 8): dots,
                          ("bfloat16", "float32", 1, 8): one_token, ("bfloat16", "bfloat16", 1, 8): dots,
                          ("float32", "float32", 1, 520): dots, ("float32", "bfloat16", 1, 520): dots}, counts


def _plain_swiglu_down(gate, up, w_down, dtype):
    """`swiglu_down`'s formula, differentiated by JAX."""
    return mixed_einsum("btf,fd->btd", jax.nn.silu(gate) * up, w_down, dtype=dtype)


@contextlib.contextmanager
def _plain_autodiff():
    """The decoder's block differentiated by JAX alone: no checkpointed pieces, the SwiGLU and
    the softmax without their own VJPs."""
    plain = {"kept_inputs": lambda fn: fn, "swiglu_down": _plain_swiglu_down,
             "softmax_keeping_output": lambda x: jax.nn.softmax(x, axis=-1)}
    saved = {name: getattr(decoder_lib, name) for name in plain}
    try:
        for name, fn in plain.items():
            setattr(decoder_lib, name, fn)
        yield
    finally:
        for name, fn in saved.items():
            setattr(decoder_lib, name, fn)


# Two layers, D = 32, H = 4 heads of Dh = 8 on Hkv = 2, F = 48: small enough to list by hand.
_RESIDUALS_CONFIG = DecoderConfig.tiny(vocab_size=64, hidden_size=32, intermediate_size=48, head_dim=8)


def _stacked_scan_residuals(model) -> list[str]:
    """The dtype[shape] of every residual the layer scan stacks (leading axis L) for the backward
    pass of `hidden_states` on B = 3 rows of T = 5 tokens, sorted (`print_saved_residuals`)."""
    from jax.ad_checkpoint import print_saved_residuals

    graphdef, params = nnx.split(model)
    tokens = jnp.ones((3, 5), jnp.int32)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_saved_residuals(lambda p: nnx.merge(graphdef, p).hidden_states(tokens), params)
    assert model.config.num_layers == 2
    shapes = [line.split()[0] for line in out.getvalue().splitlines() if "output of scan" in line]
    return sorted(s for s in shapes if s.split("[", 1)[1].startswith("2,"))


class BackwardPassResidualsTest(chex.TestCase):
    """What a block keeps for its backward pass (docs/performance.md, "perf31"): the pieces with
    their own VJPs give JAX's values and gradients, and the layer scan stacks exactly the
    residuals listed by hand."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_softmax_keeping_output_hand_computed_and_against_jax(self):
        # softmax([0, ln 3]) = [1/4, 3/4]; with g = [1, 0]: dx = p ⊙ (g − Σ g p) = [3/16, −3/16].
        p, vjp = self.variant(lambda x: jax.vjp(decoder_lib.softmax_keeping_output, x))(jnp.array([0.0, math.log(3.0)]))
        np.testing.assert_allclose(p, [0.25, 0.75], rtol=1e-6)
        np.testing.assert_allclose(vjp(jnp.array([1.0, 0.0]))[0], [0.1875, -0.1875], rtol=1e-6)
        low = float(jnp.finfo(jnp.float32).min)
        x = jnp.array([[1.0, 2.0, -1.0, 0.5], [0.0, low, low, 3.0], [low] * 4])  # masked slots, a masked row
        g = jax.random.normal(jax.random.key(0), x.shape)
        loss = lambda fn: lambda x: jnp.sum(fn(x) * g)  # noqa: E731
        np.testing.assert_allclose(self.variant(decoder_lib.softmax_keeping_output)(x), jax.nn.softmax(x, axis=-1),
                                   rtol=1e-6)
        np.testing.assert_allclose(self.variant(jax.grad(loss(decoder_lib.softmax_keeping_output)))(x),
                                   jax.grad(loss(lambda x: jax.nn.softmax(x, axis=-1)))(x), atol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_swiglu_down_hand_computed(self):
        # gate [0, 1], up [2, −1], w_down = [[1], [1]]: out = silu(0)·2 + silu(1)·(−1) = −σ(1);
        # d gate = up · σ(g)(1 + g(1 − σ(g))) = [1, −σ(1)(2 − σ(1))], d up = silu(gate) = [0, σ(1)],
        # d w_down = silu(gate) ⊙ up = [[0], [−σ(1)]].
        sig = 1.0 / (1.0 + math.exp(-1.0))
        gate, up, w = jnp.array([[[0.0, 1.0]]]), jnp.array([[[2.0, -1.0]]]), jnp.ones((2, 1))
        out, vjp = self.variant(lambda *a: jax.vjp(lambda g, u, w: decoder_lib.swiglu_down(g, u, w, jnp.float32), *a))(
            gate, up, w)
        np.testing.assert_allclose(out, [[[-sig]]], rtol=1e-6)
        d_gate, d_up, d_w = vjp(jnp.ones((1, 1, 1)))
        np.testing.assert_allclose(d_gate, [[[1.0, -sig * (2.0 - sig)]]], rtol=1e-6)
        np.testing.assert_allclose(d_up, [[[0.0, sig]]], rtol=1e-6)
        np.testing.assert_allclose(d_w, [[0.0], [-sig]], rtol=1e-6)

    def test_swiglu_down_matches_autodiff_of_the_formula(self):
        """Float32 and bf16 compute: the same values and gradients as differentiating
        mixed_einsum(silu(gate) ⊙ up, w_down) the usual way (the same dots in the same dtype)."""
        keys = jax.random.split(jax.random.key(1), 4)
        gate, up = jax.random.normal(keys[0], (2, 3, 6)), jax.random.normal(keys[1], (2, 3, 6))
        w, g = jax.random.normal(keys[2], (6, 4)), jax.random.normal(keys[3], (2, 3, 4))
        for dtype in (jnp.float32, jnp.bfloat16):
            def kept(gate, up, w, dtype=dtype):
                return decoder_lib.swiglu_down(gate, up, w, dtype)

            for fn in (kept, jax.jit(kept)):
                out, vjp = jax.vjp(fn, gate, up, w)
                want, want_vjp = jax.vjp(functools.partial(_plain_swiglu_down, dtype=dtype), gate, up, w)
                assert out.dtype == jnp.float32
                np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6, err_msg=str(dtype))
                for got, expected in zip(vjp(g), want_vjp(g)):
                    assert got.dtype == jnp.float32
                    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5, err_msg=str(dtype))

    def test_model_gradients_equal_plain_autodiff(self):
        """Every switch on (biases, q/k norms, untied): the gradients equal those of the same
        block differentiated by JAX alone (no checkpointed pieces, no custom VJPs)."""
        model = randomized(Decoder(full_config(), rngs=nnx.Rngs(0)))
        tokens, mask = jnp.asarray(TOKENS[:3]), jnp.asarray(MASK[:3])

        def loss(m):
            return jnp.sum(jnp.where(mask[..., None], m(tokens, mask_bt=mask), 0.0) ** 2)

        grads = nnx.grad(loss)(model)
        with _plain_autodiff():
            expected = nnx.grad(loss)(model)
        chex.assert_trees_all_close(grads, expected, atol=1e-4, rtol=1e-4)  # Sums reassociate (1.5e-5 seen).

    def test_the_layer_scan_stacks_only_the_listed_residuals(self):
        """Per layer (B = 3 rows, T = 5, D = 32, H = 4 of Dh = 8 on Hkv = 2, F = 48): the block's
        input x, the normed h, q (kv-major [B, Hkv, G·T, Dh]), k, v, the softmax's p (the one
        the p·V dot keeps too), the attention output, x after attention and its normed h, gate,
        up and their SwiGLU product: 12 arrays, stacked along L. Differentiated by JAX alone the
        block stacks 32: besides these, the norms' statistics, intermediates and [1, 1, D] copies
        of their weights, reshaped copies of wq, wk, wv and wo, the softmax's sums and a second
        [.., S] array beside p, silu(gate), its sigmoid and more."""
        model = Decoder(_RESIDUALS_CONFIG, rngs=nnx.Rngs(0))
        expected = sorted(["f32[2,3,5,32]"] * 4 + ["f32[2,3,5,4,8]"]
                          + ["f32[2,3,2,10,8]", "f32[2,3,2,5,8]", "f32[2,3,2,5,8]", "f32[2,3,2,10,5]"]
                          + ["f32[2,3,5,48]"] * 3)
        assert _stacked_scan_residuals(model) == expected
        with _plain_autodiff():
            assert len(_stacked_scan_residuals(model)) == 32

    def test_bf16_layer_scan_keeps_one_p(self):
        """Under bf16 compute the same 12 arrays, with q, k and v as the bf16 copies the q·K and
        p·V dots keep (u16 bits, [B, T, Hkv(, G), Dh]) and p once, in float32 ([B, Hkv, G, T, S]):
        the p·V dot keeps the softmax's p, not a bf16 copy of it beside (perf32)."""
        model = set_compute_dtype(Decoder(_RESIDUALS_CONFIG, rngs=nnx.Rngs(0)), "bfloat16")
        expected = sorted(["f32[2,3,5,32]"] * 4 + ["f32[2,3,5,4,8]", "f32[2,3,2,2,5,5]"] + ["f32[2,3,5,48]"] * 3
                          + ["u16[2,3,5,2,2,8]", "u16[2,3,5,2,8]", "u16[2,3,5,2,8]"])
        assert _stacked_scan_residuals(model) == expected

