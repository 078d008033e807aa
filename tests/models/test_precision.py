"""Mixed-precision policy: bf16 matmul operands with float32 accumulation, float32 master weights.

Checks (1) `ratios.mixed_einsum` against hand-computed bf16-rounded products and gradients,
(2) that the compiled forward + backward of a bf16-compute decoder holds only bf16·bf16 ->
f32 dots (the fast path on CPUs with AVX512-BF16/AMX; XLA would otherwise upcast to f32),
(3) held-out logit parity against float32: the torch fp32 references of tests/fixtures and,
when `make smollm2` fetched it, real SmolLM2-135M.

Stated tolerances (measured at the time of writing in brackets):
  tiny fixtures: max |logit error| <= 2% of max |logit| [1.0%];
  SmolLM2-135M: max |logit error| <= 1.0 on logits up to ~39 [0.56], mean <= 0.15 [0.07],
    KL(fp32 || bf16) per position mean <= 1e-3 nats [3e-4], max <= 1e-2 [2.9e-3],
    argmax agreement >= 95% [98.4%].
"""

import collections
import importlib.util
import os
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from flax import nnx

from jaxrl_vr import ratios
from jaxrl_vr.models import Decoder, DecoderConfig, from_pretrained, set_compute_dtype

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures")


def bf16_round(x):
    return np.asarray(jnp.asarray(x, jnp.float32).astype(jnp.bfloat16).astype(jnp.float32), np.float64)


def dot_types(hlo_text: str) -> collections.Counter:
    """(lhs dtype, rhs dtype, result dtype) of every dot in an optimized HLO module's text."""
    types = dict(re.findall(r"%([\w.\-]+) = (\w+)\[", hlo_text))
    found = re.findall(r"= (\w+)\[[^\]]*\](?:\{[^}]*\})? dot\(%([\w.\-]+), %([\w.\-]+)\)", hlo_text)
    return collections.Counter((types[lhs], types[rhs], out) for out, lhs, rhs in found)


# ---- mixed_einsum ---------------------------------------------------------------------------

# Hand-checkable operands of "td,dv->tv" that bf16 cannot hold exactly, so a missing cast shows.
X_TD = np.array([[1.001, -2.003, 0.5007], [3.0009, 0.2501, -1.0003]], np.float32)
Y_DV = np.array([[0.3333, 1.0], [-0.7777, 2.0001], [1.0039, -0.125]], np.float32)
G_TV = np.array([[1.0017, -0.5], [0.25, 3.0011]], np.float32)  # cotangent


class MixedEinsumTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_float32_is_plain_einsum(self):
        x = jax.random.normal(jax.random.key(0), (3, 4, 5))
        y = jax.random.normal(jax.random.key(1), (5, 6))
        got = self.variant(lambda a, b: ratios.mixed_einsum("btd,dv->btv", a, b))(x, y)
        np.testing.assert_allclose(got, jnp.einsum("btd,dv->btv", x, y), rtol=1e-6, atol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_float32_grads_hand_computed(self):
        """float32 also goes through the written-out backward pass (perf13): dx = g·yᵀ, dy = xᵀ·g."""
        x, y, g = X_TD, Y_DV, G_TV
        out, vjp = jax.vjp(self.variant(lambda a, b: ratios.mixed_einsum("td,dv->tv", a, b)),
                           jnp.asarray(x), jnp.asarray(y))
        dx, dy = vjp(jnp.asarray(g))
        x64, y64, g64 = (a.astype(np.float64) for a in (x, y, g))
        assert out.dtype == dx.dtype == dy.dtype == jnp.float32
        np.testing.assert_allclose(out, x64 @ y64, rtol=1e-6)
        np.testing.assert_allclose(dx, g64 @ y64.T, rtol=1e-6)
        np.testing.assert_allclose(dy, x64.T @ g64, rtol=1e-6)

    def test_bf16_residuals_of_a_layer_scan_are_stacked_without_widening(self):
        """bf16 copies kept for the backward pass are stacked as uint16 bits: XLA:CPU widened a
        bf16 dynamic-update-slice of the whole [L, ...] residual to float32 on every layer (perf13).
        Values are unchanged: the grads equal those with the float32 input kept and cast again."""
        layers, width = 4, 256
        w_ldf = jax.random.normal(jax.random.key(0), (layers, width, width)) / 16
        x_td = jax.random.normal(jax.random.key(1), (4, width))

        def grad_fn(save_inputs):
            def total(w):
                def body(h, w_df):
                    return jnp.tanh(ratios.mixed_einsum("td,df->tf", h, w_df, dtype=jnp.bfloat16,
                                                        save_inputs=save_inputs)), None
                return jnp.sum(jax.lax.scan(body, x_td, w)[0])
            return jax.jit(jax.grad(total))

        hlo = grad_fn("y").lower(w_ldf).compile().as_text()  # x's bf16 copy is the residual
        assert re.search(rf"u16\[{layers},4,{width}\]", hlo)
        widened = re.findall(rf"= f32\[{layers},4,{width}\][^\n]* convert\(", hlo)
        assert not widened, widened
        np.testing.assert_array_equal(grad_fn("y")(w_ldf), grad_fn("xy")(w_ldf))

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters("", "x", "y", "xy")
    def test_bf16_forward_and_grads_hand_computed(self, save_inputs):
        x, y, g = X_TD, Y_DV, G_TV

        def f(a, b):
            return ratios.mixed_einsum("td,dv->tv", a, b, dtype=jnp.bfloat16, save_inputs=save_inputs)

        out, vjp = jax.vjp(self.variant(f), jnp.asarray(x), jnp.asarray(y))
        dx, dy = vjp(jnp.asarray(g))
        xr, yr, gr = bf16_round(x), bf16_round(y), bf16_round(g)
        assert out.dtype == dx.dtype == dy.dtype == jnp.float32  # f32 in -> f32 grads, not bf16-rounded
        np.testing.assert_allclose(out, xr @ yr, rtol=1e-6)
        np.testing.assert_allclose(dx, gr @ yr.T, rtol=1e-6)
        np.testing.assert_allclose(dy, xr.T @ gr, rtol=1e-6)
        assert not np.allclose(np.asarray(out), x.astype(np.float64) @ y, rtol=1e-6)  # really bf16 operands

    def test_bf16_grad_dtype_follows_operand(self):
        x = jnp.ones((2, 3), jnp.bfloat16)
        y = jnp.ones((3, 4), jnp.float32)
        dx, dy = jax.grad(lambda a, b: ratios.mixed_einsum("td,dv->tv", a, b, dtype=jnp.bfloat16).sum(),
                          argnums=(0, 1))(x, y)
        assert (dx.dtype, dy.dtype) == (jnp.bfloat16, jnp.float32)
        np.testing.assert_array_equal(dy, np.full((3, 4), 2.0))

    def test_saving_a_scanned_weight_avoids_its_stacked_bf16_copy(self):
        """save_inputs="y" on a layer scan's weight slice: the backward pass reads the float32
        slice (forwarded by the scan), so the [L, d, f] bf16 copy is no longer stacked."""
        layers, width = 4, 256
        w_ldf = jax.random.normal(jax.random.key(0), (layers, width, width)) / 16
        x_td = jax.random.normal(jax.random.key(1), (4, width))

        def loss(save_inputs):
            def total(w):
                def body(h, w_df):
                    return jnp.tanh(ratios.mixed_einsum("td,df->tf", h, w_df, dtype=jnp.bfloat16,
                                                        save_inputs=save_inputs)), None
                return jnp.sum(jax.lax.scan(body, x_td, w)[0])
            return jax.jit(jax.grad(total))

        temp = {s: loss(s).lower(w_ldf).compile().memory_analysis().temp_size_in_bytes for s in ("", "y")}
        stacked_bf16_bytes = layers * width * width * 2
        assert temp["y"] + 0.9 * stacked_bf16_bytes <= temp[""], temp
        np.testing.assert_array_equal(loss("y")(w_ldf), loss("")(w_ldf))

    def test_rejects_specs_it_cannot_transpose(self):
        x = jnp.ones((2, 3))
        for spec in ("td,dv->v", "...d,dv->...v"):
            with pytest.raises(ValueError, match="mixed_einsum"):
                ratios.mixed_einsum(spec, x, jnp.ones((3, 4)), dtype=jnp.bfloat16)
        with pytest.raises(ValueError, match="save_inputs"):
            ratios.mixed_einsum("td,dv->tv", x, jnp.ones((3, 4)), dtype=jnp.bfloat16, save_inputs="w")

    def test_narrower_float(self):
        assert ratios.narrower_float(jnp.float32, jnp.bfloat16) == jnp.bfloat16
        assert ratios.narrower_float(jnp.float32, jnp.float32) == jnp.float32


# ---- the decoder under the policy ------------------------------------------------------------


def _loss_fn(graphdef, rest, tokens_bt, chunk_size=8):
    def loss(params):
        model = nnx.merge(graphdef, params, rest)
        hidden_btd = model.hidden_states(tokens_bt)
        logp_bt, _ = ratios.token_logprobs_from_hidden(hidden_btd, model.unembed_matrix(), tokens_bt,
                                                       chunk_size=chunk_size)
        return jnp.sum(logp_bt)
    return loss


def _split(compute_dtype):
    model = Decoder(DecoderConfig.tiny(vocab_size=96), rngs=nnx.Rngs(0))
    return nnx.split(set_compute_dtype(model, compute_dtype), nnx.Param, ...)


@pytest.mark.parametrize("compute_dtype,expected", [("bfloat16", ("bf16", "bf16", "f32")),
                                                    (None, ("f32", "f32", "f32"))])
def test_compiled_train_dots_take_the_policy_dtype(compute_dtype, expected):
    """Forward, backward and LM head of the train loss: every dot is `expected` after XLA's passes."""
    graphdef, params, rest = _split(compute_dtype)
    tokens_bt = jnp.ones((2, 20), jnp.int32)
    hlo = jax.jit(jax.grad(_loss_fn(graphdef, rest, tokens_bt))).lower(params).compile().as_text()
    types = dot_types(hlo)
    # 7 block matmuls + 2 attention dots, x3 (forward, two gradients) + LM head (forward, its
    # recompute is CSE'd, two gradients): at least 27 dots, all of one kind.
    assert sum(types.values()) >= 27, types
    assert set(types) == {expected}, types


@pytest.mark.parametrize("chunk_size", [8, None])
def test_policy_keeps_float32_master_params_and_grads(chunk_size):
    """Also runs: with one LM-head chunk (None) XLA once folded the tied embedding's gradient
    transpose into a bf16 dot that XLA:CPU cannot execute (see `ratios._mixed_einsum_bwd`)."""
    graphdef, params, rest = _split("bfloat16")
    tokens_bt = jnp.arange(24, dtype=jnp.int32).reshape(2, 12) % 96
    grads = jax.jit(jax.grad(_loss_fn(graphdef, rest, tokens_bt, chunk_size)))(params)
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
    assert {x.dtype for x in jax.tree.leaves(grads)} == {jnp.dtype(jnp.float32)}
    graphdef32, _, rest32 = _split(None)
    grads32 = jax.jit(jax.grad(_loss_fn(graphdef32, rest32, tokens_bt, chunk_size)))(params)
    flat16 = np.concatenate([np.ravel(x) for x in jax.tree.leaves(grads)])
    flat32 = np.concatenate([np.ravel(x) for x in jax.tree.leaves(grads32)])
    cosine = flat16 @ flat32 / np.linalg.norm(flat16) / np.linalg.norm(flat32)
    assert 0.999 < cosine < 1.0, cosine  # Close to, but not, the float32 gradient.


@pytest.mark.parametrize("jit", [True, False])
def test_saved_float32_inputs_keep_the_gradients(monkeypatch, jit):
    """The decoder's `save_inputs` choices change what the backward pass keeps alive, not the
    gradients: equal to those with every bf16 copy saved (the previous residuals)."""
    from jaxrl_vr.models import decoder

    graphdef, params, rest = _split("bfloat16")
    tokens_bt = jnp.arange(24, dtype=jnp.int32).reshape(2, 12) % 96

    def grads():
        fn = jax.grad(_loss_fn(graphdef, rest, tokens_bt))
        return (jax.jit(fn) if jit else fn)(params)

    new = grads()
    original = ratios.mixed_einsum
    copies_only = lambda *args, save_inputs="", **kwargs: original(*args, **kwargs)  # noqa: E731
    monkeypatch.setattr(decoder, "mixed_einsum", copies_only)
    monkeypatch.setattr(ratios, "mixed_einsum", copies_only)
    old = grads()
    assert {x.dtype for x in jax.tree.leaves(new)} == {jnp.dtype(jnp.float32)}
    chex.assert_trees_all_close(new, old, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("chunk_size,forward_dots", [(16, 1), (8, 2)])
def test_single_lm_head_chunk_is_not_recomputed_in_the_train_step(chunk_size, forward_dots):
    """bf16 train step with 2 micro-batches: a single LM-head chunk (chunk = T) runs its
    [B·T, V] dot once; checkpointed chunks (chunk < T) run theirs again in the backward pass.
    (A checkpointed single chunk also did: XLA removed that recompute only without a scan.)"""
    from jaxrl_vr.train import (LossConfig, OptimConfig, RolloutBatch, StepHyper, init_train_state,
                                make_optimizer, make_train_step, split_model)

    vocab, batch, prompt_len, length, micro = 96, 4, 8, 16, 2
    model = set_compute_dtype(Decoder(DecoderConfig.tiny(vocab_size=vocab, hidden_size=48), rngs=nnx.Rngs(0)),
                              "bfloat16")
    graphdef, params, rest = split_model(model)
    optim = make_optimizer(OptimConfig(learning_rate=1e-6))
    loss_cfg = LossConfig(num_microbatches=micro, logprob_chunk_size=chunk_size, detach_behaviour=True)
    step = make_train_step(graphdef, rest, optim, loss_cfg)
    batch_ = RolloutBatch(jnp.ones((batch, prompt_len), jnp.int32), jnp.ones((batch, prompt_len), bool),
                          jnp.ones((batch, length), jnp.int32), jnp.ones((batch, length), bool),
                          jnp.ones((batch, length), bool), jnp.zeros((batch, length)),
                          jnp.zeros((batch, length)), jnp.zeros((batch, length)), jnp.zeros((batch,)))
    state = init_train_state(params, optim, loss_cfg)
    hlo = step.jitted.lower(state, batch_, StepHyper.create(), rest).compile().as_text()
    rows = batch // micro
    lm_head = re.findall(rf"= f32\[({rows},{chunk_size}|{rows * chunk_size}),{vocab}\]\S* dot\(", hlo)
    assert len(lm_head) == forward_dots, lm_head


def test_set_compute_dtype_validates_and_defaults_unchanged():
    model = Decoder(DecoderConfig.tiny(), rngs=nnx.Rngs(0))
    assert model.config.compute_dtype is None and model.config.matmul_dtype == "float32"
    with pytest.raises(ValueError, match="compute_dtype"):
        set_compute_dtype(model, "float16")
    with pytest.raises(ValueError, match="compute_dtype"):
        DecoderConfig.tiny(compute_dtype="fp8")
    assert set_compute_dtype(model, "bfloat16").config.matmul_dtype == "bfloat16"
    assert model.init_cache(1, 4).keys_bkem[0].dtype == jnp.bfloat16
    assert model.embed[...].dtype == jnp.float32


@nnx.jit
def _forward(model, tokens_bt, mask_bt):
    return model(tokens_bt, mask_bt=mask_bt)


@pytest.mark.parametrize("name", ("tiny_llama", "tiny_qwen2", "tiny_qwen3"))
def test_mixed_precision_logits_close_to_torch_fp32(name):
    path = os.path.join(FIXTURES, name)
    ref = dict(np.load(os.path.join(path, "reference.npz")))
    model = set_compute_dtype(from_pretrained(path), "bfloat16")
    logits = _forward(model, jnp.asarray(ref["input_ids"]), jnp.asarray(ref["attention_mask"]))
    assert logits.dtype == jnp.float32
    real = ref["attention_mask"].astype(bool)
    err = np.abs(np.asarray(logits) - ref["logits"])[real]
    scale = np.abs(ref["logits"][real]).max()
    assert err.max() <= 0.02 * scale, (err.max(), scale)
    assert err.max() > 1e-4  # Really bf16 (float32 agrees to ~3e-6).


def test_mixed_precision_decode_matches_its_full_forward():
    """Prefill + one-token decode steps with a bf16 cache == the bf16-compute full forward."""
    path = os.path.join(FIXTURES, "tiny_llama")
    model = set_compute_dtype(from_pretrained(path), "bfloat16")
    tokens_bt = jnp.asarray(np.arange(1, 13, dtype=np.int32).reshape(2, 6) * 7 % model.config.vocab_size)
    full = np.asarray(_forward(model, tokens_bt, jnp.ones(tokens_bt.shape, bool)))
    cache = model.init_cache(2, 8)
    assert {k.dtype for k in cache.keys_bkem + cache.values_bkme} == {jnp.dtype(jnp.bfloat16)}
    step = nnx.jit(lambda m, t, p, c: m.decode_step(t, p, c))
    positions_bt = jnp.broadcast_to(jnp.arange(6, dtype=jnp.int32), (2, 6))
    logits, cache = step(model, tokens_bt[:, :4], positions_bt[:, :4], cache)
    pieces = [np.asarray(logits)]
    for t in (4, 5):
        logits, cache = step(model, tokens_bt[:, t:t + 1], positions_bt[:, t:t + 1], cache)
        pieces.append(np.asarray(logits))
    # Same bf16 operands; only float32 accumulation order differs.
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, atol=2e-3, rtol=0)


# ---- real SmolLM2 (skipped unless `make smollm2` fetched it) --------------------------------

_SPEC = importlib.util.spec_from_file_location(
    "get_smollm2", os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "get_smollm2.py"))
get_smollm2 = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(get_smollm2)
GGUF_PATH = get_smollm2.default_path()


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isfile(GGUF_PATH), reason=f"SmolLM2 GGUF not at {GGUF_PATH}; run `make smollm2`.")
def test_smollm2_mixed_precision_logits_close_to_fp32():
    from jaxrl_vr.models.gguf_io import from_gguf

    reference = dict(np.load(os.path.join(FIXTURES, "smollm2_reference.npz")))
    lengths = reference["len_p"]
    width = int(lengths.max())
    tokens_ps = np.zeros((len(lengths), width), np.int32)
    mask_ps = np.zeros((len(lengths), width), bool)
    for p, length in enumerate(lengths):
        tokens_ps[p, width - length:] = reference["ids_ps"][p, :length]
        mask_ps[p, width - length:] = True
    model, _ = from_gguf(GGUF_PATH)
    logits32 = np.asarray(_forward(model, tokens_ps, mask_ps))[mask_ps]
    logits16 = np.asarray(_forward(set_compute_dtype(model, "bfloat16"), tokens_ps, mask_ps))[mask_ps]
    err = np.abs(logits16 - logits32)
    assert err.max() <= 1.0 and err.mean() <= 0.15, (err.max(), err.mean())
    logp32, logp16 = jax.nn.log_softmax(logits32), jax.nn.log_softmax(logits16)
    kl = np.asarray(jnp.sum(jnp.exp(logp32) * (logp32 - logp16), axis=-1))
    assert kl.mean() <= 1e-3 and kl.max() <= 1e-2, (kl.mean(), kl.max())
    assert (logits16.argmax(-1) == logits32.argmax(-1)).mean() >= 0.95


@pytest.mark.parametrize("jit", [True, False])
@pytest.mark.parametrize("name", ["tiny_qwen2", "tiny_llama"])  # Tied and untied LM head.
def test_cast_matmul_weights_changes_dtypes_not_logits(name, jit):
    """The sampler's one-off cast of the matmul-only weights gives the same bf16-compute logits:
    block matrices and an untied lm_head become bf16; a tied embedding stays the float32 lookup
    table and the LM head reads a bf16 [D, V] copy of it."""
    from jaxrl_vr.models.decoder import MATMUL_WEIGHT_NAMES, cast_matmul_weights

    path = os.path.join(FIXTURES, name)
    model = set_compute_dtype(from_pretrained(path), "bfloat16")
    forward = _forward if jit else (lambda m, t, k: m(t, mask_bt=k))
    tokens_bt = jnp.asarray(np.arange(1, 11, dtype=np.int32).reshape(2, 5))
    mask_bt = jnp.ones(tokens_bt.shape, bool)
    before = forward(model, tokens_bt, mask_bt)
    embed = np.asarray(model.embed[...])
    cast_matmul_weights(model)
    assert {getattr(model.layers, n)[...].dtype for n in MATMUL_WEIGHT_NAMES} == {jnp.dtype(jnp.bfloat16)}
    assert model.embed[...].dtype == model.layers.attn_norm[...].dtype == jnp.float32
    np.testing.assert_array_equal(model.embed[...], embed)
    if model.lm_head is None:
        copy = model.unembed_compute[...]
        assert copy.dtype == jnp.bfloat16 and copy.shape == (model.config.hidden_size, model.config.vocab_size)
        np.testing.assert_array_equal(copy, jnp.asarray(embed.T).astype(jnp.bfloat16))
    else:
        assert model.lm_head[...].dtype == jnp.bfloat16 and not hasattr(model, "unembed_compute")
    # Same bf16 operands; the dot may accumulate in another order (bf16 kernel vs a float32 one).
    np.testing.assert_allclose(forward(model, tokens_bt, mask_bt), before, rtol=0, atol=1e-5)
    fp32 = from_pretrained(path)  # float32 compute: nothing to cast.
    assert cast_matmul_weights(fp32).layers.wq[...].dtype == jnp.float32 and not hasattr(fp32, "unembed_compute")
