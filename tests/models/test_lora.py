"""LoRA adapters on the Decoder: exact base at init, merge, adapters off, gradients, sampler."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_vr.models import decoder as decoder_lib
from jaxrl_vr.models.config import DecoderConfig
from jaxrl_vr.models.decoder import Decoder, lora_names
from jaxrl_vr.models.hf_io import to_hf_state_dict
from jaxrl_vr.models.lora import LORA_TARGETS, add_lora, has_lora, lora_off, lora_targets, merge_lora
from jaxrl_vr.sampling import generate
from jaxrl_vr.train import step as step_lib

import hlo_testlib

# Distinct sizes, so a weight gradient's shape is recognisable in compiled code:
# D = 24, F = 40, H·Dh = 16, Hkv·Dh = 8, V = 36; rows × positions = 2 × 7.
CONFIG = DecoderConfig.tiny(36, hidden_size=24, intermediate_size=40, num_layers=2, num_heads=2,
                            num_kv_heads=1, head_dim=8, eos_token_id=2)
TOKENS = jnp.asarray(np.random.default_rng(0).integers(3, 36, (2, 7)), jnp.int32)
MASK = jnp.asarray(np.arange(7)[None] >= np.array([[0], [2]]))  # row 1 left-padded


def _model(seed=0, remat=False, **config):
    return Decoder(CONFIG.replace(**config), rngs=nnx.Rngs(seed), remat=remat)


def _randomise_b(model, seed=1, scale=0.2):
    """Nonzero B (as after training), so the adapters change the model."""
    for target in lora_targets(model):
        b = getattr(model.layers, lora_names(target)[1])
        b.set_value(scale * jax.random.normal(jax.random.fold_in(jax.random.key(seed), hash(target) % 1000),
                                              b.shape))
    return model


@functools.partial(jax.jit, static_argnums=0)
def _jitted_logits(graphdef, state):
    return nnx.merge(graphdef, state)(TOKENS, mask_bt=MASK)


def _logits(model):
    """The model's logits of TOKENS, compiled (the eager forward is the slow part of a test)."""
    return _jitted_logits(*nnx.split(model))


class ExactBaseAtInitTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_zero_b_gives_the_base_logits_bitwise(self):
        model = _model()
        graphdef, state = nnx.split(model)
        base = self.variant(lambda s: nnx.merge(graphdef, s)(TOKENS, mask_bt=MASK))(state)
        add_lora(model, rank=4, alpha=8.0, key=jax.random.key(1))
        graphdef, state = nnx.split(model)
        adapted = self.variant(lambda s: nnx.merge(graphdef, s)(TOKENS, mask_bt=MASK))(state)
        np.testing.assert_array_equal(np.asarray(adapted), np.asarray(base))
        # A is random (PEFT's kaiming-uniform bound 1/sqrt(D_in)), B is zero.
        a = np.asarray(model.layers.wq_lora_a[...])
        assert a.std() > 0 and np.abs(a).max() <= 1 / np.sqrt(24)
        assert not np.asarray(model.layers.wq_lora_b[...]).any()

    def test_adapters_are_stacked_lora_params_with_merged_head_axes(self):
        model = add_lora(_model(), rank=3, alpha=6.0, key=jax.random.key(0))
        shapes = {k: v.shape for k, v in nnx.to_pure_dict(nnx.state(model, nnx.LoRAParam))["layers"].items()}
        assert shapes == {
            "wq_lora_a": (2, 24, 3), "wq_lora_b": (2, 3, 16), "wk_lora_a": (2, 24, 3), "wk_lora_b": (2, 3, 8),
            "wv_lora_a": (2, 24, 3), "wv_lora_b": (2, 3, 8), "wo_lora_a": (2, 16, 3), "wo_lora_b": (2, 3, 24),
            "w_gate_lora_a": (2, 24, 3), "w_gate_lora_b": (2, 3, 40), "w_up_lora_a": (2, 24, 3),
            "w_up_lora_b": (2, 3, 40), "w_down_lora_a": (2, 40, 3), "w_down_lora_b": (2, 3, 24)}
        assert model.layers.lora_scale == 2.0 and lora_targets(model) == LORA_TARGETS
        assert {x.dtype for x in jax.tree.leaves(nnx.state(model, nnx.LoRAParam))} == {jnp.dtype(jnp.float32)}

    def test_prefix_and_decode_paths_also_give_the_base_at_init(self):
        model = _model()
        base_kv = model.prefix_kv(TOKENS, mask_bs=MASK)
        cache = model.init_cache(2, 8)
        base_step, _ = model.decode_step(TOKENS, decoder_lib.default_positions(MASK), cache, mask_bt=MASK)
        add_lora(model, rank=2, alpha=4.0, key=jax.random.key(3))
        chex.assert_trees_all_equal(model.prefix_kv(TOKENS, mask_bs=MASK), base_kv)
        step, _ = model.decode_step(TOKENS, decoder_lib.default_positions(MASK), cache, mask_bt=MASK)
        np.testing.assert_array_equal(np.asarray(step), np.asarray(base_step))


class MergeTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_merged_model_computes_the_adapted_logits(self):
        model = _randomise_b(add_lora(_model(), rank=4, alpha=8.0, key=jax.random.key(1)))
        base = _logits(_model())
        graphdef, state = nnx.split(model)
        adapted = self.variant(lambda s: nnx.merge(graphdef, s)(TOKENS, mask_bt=MASK))(state)
        merged = merge_lora(model)
        assert not has_lora(merged) and has_lora(model)  # the adapted model is left as it was
        assert merged.layers.lora_scale == 0.0 and merged.layers.wq[...].shape == (2, 24, 2, 8)
        assert float(jnp.max(jnp.abs(adapted - base))) > 0.1  # the adapters do change the logits
        np.testing.assert_allclose(np.asarray(_logits(merged)), np.asarray(adapted), atol=2e-5, rtol=1e-5)

    def test_a_subset_of_targets_merges_only_those(self):
        model = _randomise_b(add_lora(_model(), rank=2, alpha=2.0, key=jax.random.key(1), targets=("wo", "w_up")))
        assert lora_targets(model) == ("wo", "w_up")
        merged, plain = merge_lora(model), _model()
        for name in ("wq", "wk", "wv", "w_gate", "w_down"):
            np.testing.assert_array_equal(np.asarray(getattr(merged.layers, name)[...]),
                                          np.asarray(getattr(plain.layers, name)[...]))
        np.testing.assert_allclose(np.asarray(_logits(merged)), np.asarray(_logits(model)), atol=2e-5, rtol=1e-5)

    def test_bf16_base_keeps_float32_adapters_and_merges_into_float32(self):
        model = _randomise_b(add_lora(_model(), rank=4, alpha=8.0, key=jax.random.key(1), base_dtype="bfloat16"))
        assert model.config.param_dtype == "bfloat16"
        assert {x.dtype for x in jax.tree.leaves(step_lib.split_model(model)[2])} == {jnp.dtype(jnp.bfloat16)}
        assert {x.dtype for x in jax.tree.leaves(nnx.state(model, nnx.LoRAParam))} == {jnp.dtype(jnp.float32)}
        merged = merge_lora(model, param_dtype="float32")
        assert merged.config.param_dtype == "float32"
        assert {x.dtype for x in jax.tree.leaves(nnx.state(merged, nnx.Param))} == {jnp.dtype(jnp.float32)}
        # bf16 matmuls on both sides: the same logits up to bf16 rounding, far closer than the base.
        merged.config = merged.config.replace(compute_dtype="bfloat16")
        gap = float(jnp.max(jnp.abs(_logits(merged) - _logits(model))))
        base = _logits(_model(param_dtype="bfloat16"))
        assert gap < 0.1 * float(jnp.max(jnp.abs(_logits(model) - base))), gap

    def test_adding_twice_and_bad_arguments_fail_naming_the_fix(self):
        model = add_lora(_model(), rank=2, alpha=2.0, key=jax.random.key(0))
        with pytest.raises(ValueError, match="merge them first"):
            add_lora(model, rank=2, alpha=2.0, key=jax.random.key(0))
        with pytest.raises(ValueError, match=r"rank=0 must be >= 1"):
            add_lora(_model(), rank=0, alpha=2.0, key=jax.random.key(0))
        with pytest.raises(ValueError, match=r"non-empty subset"):
            add_lora(_model(), rank=2, alpha=2.0, key=jax.random.key(0), targets=("wqq",))


def test_adapters_off_give_the_base_exactly():
    model = _randomise_b(add_lora(_model(), rank=4, alpha=8.0, key=jax.random.key(1)))
    graphdef, adapters, rest = step_lib.split_model(model)
    off = nnx.merge(graphdef, lora_off(adapters), rest)
    np.testing.assert_array_equal(np.asarray(_logits(off)), np.asarray(_logits(_model())))
    assert not np.array_equal(np.asarray(_logits(model)), np.asarray(_logits(_model())))


def _loss(graphdef, rest):
    def loss(params):
        logits = nnx.merge(graphdef, params, rest)(TOKENS, mask_bt=MASK)
        return jnp.mean(jax.nn.log_softmax(logits)[..., 5] * MASK)
    return loss


@pytest.mark.parametrize("remat", [False, True])
def test_adapter_gradients_are_those_of_the_merged_weights(remat):
    """dL/dA = s·G·Bᵀ and dL/dB = s·Aᵀ·G with G = dL/dW of the merged model at W + s·A·B: the
    activation-path adapters (including `swiglu_down_lora`'s backward pass) differentiate LoRA."""
    model = _randomise_b(add_lora(_model(remat=remat), rank=3, alpha=6.0, key=jax.random.key(2)))
    graphdef, adapters, rest = step_lib.split_model(model)
    grads = nnx.to_pure_dict(jax.grad(_loss(graphdef, rest))(adapters))["layers"]
    merged = merge_lora(model)
    merged.remat = remat
    m_graphdef, m_params, m_rest = step_lib.split_model(merged)
    weight_grads = nnx.to_pure_dict(jax.grad(_loss(m_graphdef, m_rest))(m_params))["layers"]
    scale = model.layers.lora_scale
    for target in LORA_TARGETS:
        a_name, b_name = lora_names(target)
        a, b = getattr(model.layers, a_name)[...], getattr(model.layers, b_name)[...]
        g = weight_grads[target].reshape(a.shape[0], a.shape[1], b.shape[2])
        np.testing.assert_allclose(grads[a_name], scale * jnp.einsum("lio,lro->lir", g, b), rtol=2e-4, atol=1e-6,
                                   err_msg=target)
        np.testing.assert_allclose(grads[b_name], scale * jnp.einsum("lir,lio->lro", a, g), rtol=2e-4, atol=1e-6,
                                   err_msg=target)


def _weight_gradient_dots(hlo: str) -> list[str]:
    """Dots of compiled code whose output has the shape of a block matrix (weight gradients)."""
    shapes = {f"f32[{s}]" for s in ("24,16", "24,8", "16,24", "24,40", "40,24", "36,24", "24,36")}
    return [shape for shape in hlo_testlib.dot_output_shapes(hlo).elements() if shape in shapes]


def test_no_gradient_of_a_frozen_base_weight_is_computed():
    """The base sits in `rest`: the compiled backward pass has no dot producing a [D_in, D_out]
    weight gradient (full fine-tuning's has them, so the check can fail)."""
    model = _randomise_b(add_lora(_model(), rank=4, alpha=8.0, key=jax.random.key(1)))
    graphdef, adapters, rest = step_lib.split_model(model)
    assert set(nnx.to_pure_dict(adapters)["layers"]) == {n for t in LORA_TARGETS for n in lora_names(t)}
    assert "embed" not in adapters and "wq" in rest["layers"]
    lora_hlo = jax.jit(jax.grad(_loss(graphdef, rest))).lower(adapters).compile().as_text()
    assert _weight_gradient_dots(lora_hlo) == []
    full = _model()
    graphdef, params, rest = step_lib.split_model(full)
    full_hlo = jax.jit(jax.grad(_loss(graphdef, rest))).lower(params).compile().as_text()
    assert len(_weight_gradient_dots(full_hlo)) >= 5


def test_sampler_with_adapters_equals_the_sampler_of_the_merged_model():
    """Greedy decoding through the adapters (prefill, KV cache, decode loop) picks the tokens of
    the merged model, with the same log-probs up to float32 rounding."""
    model = _randomise_b(add_lora(_model(), rank=4, alpha=8.0, key=jax.random.key(1)), scale=0.3)
    merged = merge_lora(model)
    kwargs = dict(num_samples=1, max_new_tokens=6, greedy=True, stop_token_ids=())
    adapted = generate(jax.random.key(0), model, TOKENS, MASK, **kwargs)
    plain = generate(jax.random.key(0), merged, TOKENS, MASK, **kwargs)
    base = generate(jax.random.key(0), _model(), TOKENS, MASK, **kwargs)
    np.testing.assert_array_equal(np.asarray(adapted.tokens_bt), np.asarray(plain.tokens_bt))
    np.testing.assert_allclose(np.asarray(adapted.logp_bt), np.asarray(plain.logp_bt), atol=1e-4)
    assert not np.array_equal(np.asarray(adapted.tokens_bt), np.asarray(base.tokens_bt))


def test_compute_copies_for_the_sampler_cast_the_adapters_too():
    model = add_lora(_model(compute_dtype="bfloat16"), rank=2, alpha=4.0, key=jax.random.key(0))
    decoder_lib.cast_matmul_weights(model)
    assert {x.dtype for x in jax.tree.leaves(nnx.state(model, nnx.LoRAParam))} == {jnp.dtype(jnp.bfloat16)}


def test_swiglu_down_lora_matches_autodiff_of_its_formula():
    rng = np.random.default_rng(0)
    gate, up = (jnp.asarray(rng.normal(size=(2, 3, 5)), jnp.float32) for _ in range(2))
    w, a, b = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in ((5, 4), (5, 2), (2, 4)))

    def plain(gate, up, w, a, b):
        product = jax.nn.silu(gate) * up
        return product @ w + 0.5 * (product @ a) @ b

    def custom(gate, up, w, a, b):
        return decoder_lib.swiglu_down_lora(gate, up, w, a, b, jnp.float32, 0.5)

    out, vjp = jax.vjp(custom, gate, up, w, a, b)
    want, want_vjp = jax.vjp(plain, gate, up, w, a, b)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    g = jnp.asarray(rng.normal(size=out.shape), jnp.float32)
    chex.assert_trees_all_close(vjp(g), want_vjp(g), rtol=1e-5, atol=1e-5)


def test_hf_export_of_an_adapted_model_is_the_merged_model():
    model = _randomise_b(add_lora(_model(), rank=4, alpha=8.0, key=jax.random.key(1)))
    exported = to_hf_state_dict(model)
    merged = to_hf_state_dict(merge_lora(model, param_dtype="float32"))
    assert set(exported) == set(merged) == set(to_hf_state_dict(_model()))
    chex.assert_trees_all_equal(exported, merged)
    base = to_hf_state_dict(_model())
    assert not np.array_equal(exported["model.layers.0.self_attn.q_proj.weight"],
                              base["model.layers.0.self_attn.q_proj.weight"])
