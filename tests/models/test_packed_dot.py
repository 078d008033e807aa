"""The packed-dot decode kernel: layout, arithmetic, the decode step and rollouts on it, the
choice of path, and the build."""

import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_vr.models import packed_dot as pd
from jaxrl_vr.models.config import DecoderConfig
from jaxrl_vr.models.decoder import Decoder, cast_matmul_weights, pack_layer_params, packed_unembed, set_compute_dtype
from jaxrl_vr.models.lora import add_lora, lora_names, lora_targets
from jaxrl_vr.sampling import generate
from jaxrl_vr.sampling import sampler as sampler_lib

REASON = pd.unavailable_reason()
needs_kernel = pytest.mark.skipif(REASON is not None, reason=f"packed-dot kernel unavailable: {REASON}")
REASON_BF16 = pd.unavailable_reason("bfloat16")
needs_bf16_kernel = pytest.mark.skipif(REASON_BF16 is not None, reason=f"bf16 packed kernel unavailable: {REASON_BF16}")

# Every block matrix packable except wk / wv (Hkv·Dh = 8 columns: kept as XLA dots), the
# vocabulary a multiple of 16 (the tied head packed).
CONFIG = DecoderConfig.tiny(48, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=2,
                            num_kv_heads=1, head_dim=8, eos_token_id=2)


def test_pack_layout_hand_computed():
    w = jnp.arange(2 * 32, dtype=jnp.float32).reshape(2, 32)  # w[k, n] = 32k + n
    panels = pd.pack(w).panels
    chex.assert_shape(panels, (2, 2, 16))
    assert float(panels[1, 0, 3]) == 19.0  # column 16 + 3 of row 0
    assert float(panels[0, 1, 0]) == 32.0  # column 0 of row 1
    np.testing.assert_array_equal(pd.pack_transposed(w.T).panels, panels)


def test_bf16_pack_layout_hand_computed():
    """bf16 panels [N / 32, K / 2, 64]: entry [j, p, 2c + e] is W[2p + e, 32j + c]."""
    w = (jnp.arange(32)[:, None] * 4 + jnp.arange(64)[None] % 4).astype(jnp.bfloat16)  # w[k, n] = 4k + n % 4
    packed = pd.pack(w)
    chex.assert_shape(packed.panels, (2, 16, 64))
    assert packed.in_dim == 32 and packed.out_dims == (64,)
    assert float(packed.panels[0, 0, 1]) == 4.0  # W[1, 0]: row pair 0, column 0, second of the pair
    assert float(packed.panels[1, 1, 2 * 3]) == 4 * 2 + 35 % 4  # W[2, 35]
    np.testing.assert_array_equal(pd.pack_transposed(w.T).panels, packed.panels)


def test_pack_refuses_what_the_kernel_cannot_run():
    with pytest.raises(ValueError, match="multiple of 16"):
        pd.pack(jnp.zeros((4, 24)))
    with pytest.raises(ValueError, match="bf16 one with multiples of 32 columns and rows"):
        pd.pack(jnp.zeros((32, 16), jnp.bfloat16))
    with pytest.raises(ValueError, match="multiples of 32 columns and rows"):
        pd.pack(jnp.zeros((48, 32), jnp.bfloat16))
    with pytest.raises(ValueError, match="multiple of 16"):
        pd.pack_transposed(jnp.zeros((20, 4)))
    assert pd.packable(jnp.zeros((4, 2, 8))) and not pd.packable(jnp.zeros((4, 2, 4)))
    assert pd.packable(jnp.zeros((64, 2, 16), jnp.bfloat16)) and not pd.packable(jnp.zeros((4, 32), jnp.bfloat16))
    assert not pd.packable(jnp.zeros((32, 16), jnp.bfloat16)) and not pd.packable(jnp.zeros((4, 16), jnp.float16))


@needs_kernel
def test_packed_dot_hand_computed():
    x = jnp.asarray([[1.0, 2.0]])
    w = jnp.stack([jnp.arange(16.0), jnp.full((16,), 0.5)])  # y[n] = n + 2 * 0.5
    np.testing.assert_array_equal(pd.packed_dot(x, pd.pack(w)), (jnp.arange(16.0) + 1.0)[None])


@needs_kernel
@pytest.mark.parametrize("lead, k, n", [((1,), 1, 16), ((3,), 0, 16), ((3,), 5, 48), ((5,), 64, 160), ((2, 3), 33, 32),
                                        ((9,), 17, 16), ((37,), 8, 64)])
def test_packed_dot_matches_numpy_on_ragged_shapes(lead, k, n):
    """Rows not a multiple of the 4-row register block, odd K, K = 0, one to ten panels."""
    rng = np.random.default_rng(k * n)
    x = rng.standard_normal(lead + (k,), np.float32)
    w = rng.standard_normal((k, n), np.float32)
    want = x.astype(np.float64) @ w
    for fn in (pd.packed_dot, jax.jit(pd.packed_dot)):
        got = fn(jnp.asarray(x), pd.pack(jnp.asarray(w)))
        chex.assert_shape(got, lead + (n,))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.sqrt(k))


@needs_bf16_kernel
@pytest.mark.parametrize("lead, k, n", [((1,), 32, 32), ((3,), 64, 96), ((9,), 96, 160), ((2, 5), 32, 32),
                                        ((17,), 896, 64), ((32,), 64, 64), ((45,), 128, 96), ((70,), 32, 32)])
def test_bf16_packed_dot_matches_a_bf16_dot_with_float32_sums(lead, k, n):
    """Rows fewer than, equal to and past the 32-row group, one to five panels, K one to 28
    tile steps: x is rounded to bf16 as XLA's
    mixed-precision dot rounds it, the bf16 products are exact in float32 and summed there."""
    rng = np.random.default_rng(k * n)
    x = jnp.asarray(rng.standard_normal(lead + (k,), np.float32))
    w = jnp.asarray(rng.standard_normal((k, n), np.float32)).astype(jnp.bfloat16)
    want = np.asarray(x.astype(jnp.bfloat16), np.float64) @ np.asarray(w, np.float64)
    for fn in (pd.packed_dot, jax.jit(pd.packed_dot)):
        got = fn(x, pd.pack(w))
        assert got.dtype == jnp.float32
        chex.assert_shape(got, lead + (n,))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.sqrt(k))


@needs_kernel
def test_packed_dot_splits_the_output_axes_and_checks_k():
    w = pd.pack(jnp.ones((8, 2, 16)), (2, 16))
    chex.assert_shape(pd.packed_dot(jnp.ones((3, 8)), w), (3, 2, 16))
    with pytest.raises(ValueError, match="9 features, the packed matrix 8"):
        pd.packed_dot(jnp.ones((3, 9)), w)


@needs_kernel
def test_packed_dot_inside_a_loop_matches_the_xla_dot():
    """Many calls in a compiled loop (the decode loop's use), threads and all."""
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((96, 96), np.float32) / 10)
    x = jnp.asarray(rng.standard_normal((6, 96), np.float32))
    packed = pd.pack(w)
    loop = lambda dot: jax.jit(lambda x: jax.lax.fori_loop(0, 20, lambda _, x: jnp.tanh(dot(x)), x))  # noqa: E731
    np.testing.assert_allclose(loop(lambda x: pd.packed_dot(x, packed))(x), loop(lambda x: x @ w)(x), atol=1e-5)


# For the bf16 kernel (32-column panels): wq, wo, w_gate, w_up, w_down and the tied head packable.
CONFIG_BF16 = DecoderConfig.tiny(64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                                 num_kv_heads=1, head_dim=8, eos_token_id=2)


def _model(lora=False, tied=True, bf16=False):
    model = Decoder((CONFIG_BF16 if bf16 else CONFIG).replace(tie_word_embeddings=tied), rngs=nnx.Rngs(0))
    if bf16:
        set_compute_dtype(model, "bfloat16")
    if lora:
        add_lora(model, rank=4, alpha=8.0, key=jax.random.key(1))
        for i, target in enumerate(lora_targets(model)):  # nonzero B: the adapters change the model
            b = getattr(model.layers, lora_names(target)[1])
            b.set_value(0.2 * jax.random.normal(jax.random.key(i), b.shape))
    return model


def test_pack_layer_params_packs_the_packable_block_matrices_only():
    model = _model(lora=True)
    layer = model.layers.unstacked()[0]
    packed = pack_layer_params([layer], model.layers.lora_scale)[0]
    assert {name for name, w in packed.items() if isinstance(w, pd.PackedMatrix)} == {
        "wq", "wo", "w_gate", "w_up", "w_down"}
    assert packed["wq"].out_dims == (2, 8) and packed["wo"].in_dim == 16
    # The packed matrices carry their adapters merged (W + scale·A·B) and drop them; wk and wv
    # (4 output columns: not packable) keep theirs for the activation path.
    assert {name for name in packed if "lora" in name} == {*lora_names("wk"), *lora_names("wv")}
    a, b = layer["wo_lora_a"], layer["wo_lora_b"]
    merged_wo = layer["wo"].reshape(16, -1) + model.layers.lora_scale * np.asarray(a) @ np.asarray(b)
    np.testing.assert_allclose(packed["wo"].panels, pd.pack(merged_wo).panels, rtol=1e-6, atol=1e-6)
    assert model.layers.lora_scale == 2.0 and float(jnp.abs(b).max()) > 0.1  # the merge changes wo
    assert isinstance(packed_unembed(model), pd.PackedMatrix)
    assert packed_unembed(_model(tied=False)).in_dim == 32


@needs_kernel
@pytest.mark.parametrize("bf16", [False, pytest.param(True, marks=needs_bf16_kernel)])
@pytest.mark.parametrize("lora, tied", [(False, True), (True, True), (False, False)])
def test_decode_step_on_packed_weights_matches_the_xla_dots(lora, tied, bf16):
    """Prefill (several rows and positions) then one decode step: same logits and cache. In
    mixed precision the operands are the same bf16 values and the sums float32, as in XLA's
    dots, so they agree to float32 rounding of the sums (and the rare bf16 rounding flip it
    causes in a later layer's input)."""
    model = cast_matmul_weights(_model(lora, tied, bf16))  # as the samplers do; float32: a no-op
    tokens = jnp.asarray(np.random.default_rng(1).integers(3, 48, (3, 5)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(5), (3, 5))

    def run(packed: bool):
        layers, unembed = sampler_lib.decode_weights(model, model.layers.unstacked(), packed)
        assert (unembed is not None) is packed
        cache = model.init_cache(3, 8)
        first, cache = model.decode_step(tokens, positions, cache, layer_params=layers, unembed=unembed)
        second, cache = model.decode_step(tokens[:, :1], positions[:, :1] + 5, cache, layer_params=layers,
                                          unembed=unembed)
        return first, second, cache.keys_bkem

    run = jax.jit(run, static_argnums=0)
    tolerance = 2e-2 if bf16 else 1e-5
    for got, want in zip(jax.tree.leaves(run(True)), jax.tree.leaves(run(False))):
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=tolerance,
                                   atol=tolerance)


@needs_kernel
@pytest.mark.parametrize("bf16", [False, pytest.param(True, marks=needs_bf16_kernel)])
@pytest.mark.parametrize("max_new_tokens", [12, 70])  # one jitted loop; compacting chunks (> 64 slots)
def test_rollout_on_packed_dots_equals_the_xla_rollout(monkeypatch, max_new_tokens, bf16):
    model = _model(lora=True, bf16=bf16)
    prompts = jnp.asarray(np.random.default_rng(2).integers(3, 48, (2, 4)), jnp.int32)
    mask = jnp.ones((2, 4), bool)
    rollouts = {}
    for mode in ("xla", "packed"):
        monkeypatch.setenv("JAXRL_VR_DECODE_DOTS", mode)
        _, kwargs = sampler_lib.generate_core_call(
            jax.random.key(0), model, prompts, mask, num_samples=3, max_new_tokens=max_new_tokens, temperature=1.0,
            top_p=1.0, top_k=0, greedy=True, stop_token_ids=(), pad_id=0, bucket=8, cache_dtype=None)
        assert kwargs["packed_dots"] is (mode == "packed")
        rollouts[mode] = generate(jax.random.key(0), model, prompts, mask, num_samples=3,
                                  max_new_tokens=max_new_tokens, greedy=True, stop_token_ids=())
    np.testing.assert_array_equal(rollouts["packed"].tokens_bt, rollouts["xla"].tokens_bt)
    np.testing.assert_allclose(rollouts["packed"].logp_bt, rollouts["xla"].logp_bt, atol=2e-2 if bf16 else 1e-5)


def test_bf16_packing_keeps_the_adapters_unmerged():
    """A bf16 sum W + scale·A·B would round a small adapter update away: bf16 matrices are
    packed as they are and keep their adapters; the LM head is the compute-dtype copy."""
    model = cast_matmul_weights(_model(lora=True, bf16=True))
    packed = pack_layer_params(model.layers.unstacked(), model.layers.lora_scale)[0]
    assert {name for name, w in packed.items() if isinstance(w, pd.PackedMatrix)} == {
        "wq", "wo", "w_gate", "w_up", "w_down"}
    assert all(w.panels.dtype == jnp.bfloat16 for w in packed.values() if isinstance(w, pd.PackedMatrix))
    assert {name for name in packed if "lora" in name} == {n for t in lora_targets(model) for n in lora_names(t)}
    head = packed_unembed(model)
    assert head.panels.dtype == jnp.bfloat16 and head.in_dim == 32 and head.out_dims == (64,)
    for uncast in (_model(bf16=True), _model(tied=False, bf16=True)):  # no copy: the head cast to bf16 first
        assert packed_unembed(uncast).panels.dtype == jnp.bfloat16


def test_decode_mode_and_the_choice_of_path(monkeypatch):
    model_state = nnx.state(_model())
    monkeypatch.setenv("JAXRL_VR_DECODE_DOTS", "fast")
    with pytest.raises(ValueError, match="auto, packed, xla"):
        pd.use_packed(model_state, jnp.float32)
    monkeypatch.setenv("JAXRL_VR_DECODE_DOTS", "xla")
    assert not pd.use_packed(model_state, jnp.float32)
    monkeypatch.setenv("JAXRL_VR_DECODE_DOTS", "auto")
    assert pd.use_packed(model_state, jnp.bfloat16) is (REASON_BF16 is None)  # an AVX512-BF16 CPU
    assert pd.use_packed(model_state, jnp.float32) is (REASON is None)
    assert not pd.use_packed(model_state, jnp.float16)


@needs_kernel
def test_sharded_weights_keep_the_xla_dots(monkeypatch):
    if len(jax.devices()) < 2:
        pytest.skip("needs two devices (the suite's XLA_FLAGS give eight)")
    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
    sharded = {"w": jax.device_put(jnp.zeros((4, 16)), NamedSharding(mesh, PartitionSpec("x")))}
    monkeypatch.setenv("JAXRL_VR_DECODE_DOTS", "auto")
    assert not pd.use_packed(sharded, jnp.float32)
    monkeypatch.setenv("JAXRL_VR_DECODE_DOTS", "packed")
    with pytest.raises(RuntimeError, match="sharded"):
        pd.use_packed(sharded, jnp.float32)


def test_unavailable_kernel_falls_back_or_refuses(monkeypatch):
    monkeypatch.setattr(pd, "unavailable_reason", lambda dtype="float32": "the CPU lacks AVX2 or FMA")
    monkeypatch.setenv("JAXRL_VR_DECODE_DOTS", "auto")
    assert not pd.use_packed({}, jnp.float32)
    monkeypatch.setenv("JAXRL_VR_DECODE_DOTS", "packed")
    with pytest.raises(RuntimeError, match="lacks AVX2.*Unset it"):
        pd.use_packed({}, jnp.float32)


def test_unbuildable_kernel_is_a_reason_not_a_crash(monkeypatch):
    def no_build():
        raise RuntimeError("no C++ compiler (g++, or $CXX) on PATH")
    monkeypatch.setattr(pd, "register", no_build)
    reason = pd.unavailable_reason.__wrapped__()
    if REASON is None:  # on a CPU that can run it, the build is what fails
        assert "did not build" in reason and "no C++ compiler" in reason
    monkeypatch.setattr(pd, "_compiler", lambda: None)
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler"):
        pd.build()


@needs_kernel
def test_build_compiles_once_per_source_into_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("JAXRL_VR_CACHE_HOME", str(tmp_path))
    first = pd.build()
    assert os.path.dirname(first) == str(tmp_path / "kernels") and os.path.getsize(first) > 0
    stamp = os.path.getmtime(first)
    assert pd.build() == first and os.path.getmtime(first) == stamp
    assert os.listdir(tmp_path / "kernels") == [os.path.basename(first)]  # no temporary file left


@needs_kernel
@pytest.mark.parametrize("bf16", [False, pytest.param(True, marks=needs_bf16_kernel)])
def test_multiturn_session_on_packed_dots_equals_the_xla_session(monkeypatch, bf16):
    """Prefill, a turn, an appended observation, a second turn: the same tokens either way."""
    from jaxrl_vr.sampling import multiturn as mt

    model = _model(lora=True, bf16=bf16)
    prompts = np.random.default_rng(3).integers(3, 48, (2, 5)).astype(np.int32)
    turns = {}
    for mode in ("xla", "packed"):
        monkeypatch.setenv("JAXRL_VR_DECODE_DOTS", mode)
        session = mt.start(model, prompts, np.ones((2, 5), bool), num_samples=2, capacity=64)
        session, first = mt.decode_turn(jax.random.key(0), model, session, np.ones(4, bool), max_tokens=6,
                                        greedy=True)
        session = mt.append(model, session, [[5, 6], [], [7], [8, 9, 10]])
        session, second = mt.decode_turn(jax.random.key(1), model, session, np.ones(4, bool), max_tokens=5,
                                         greedy=True)
        turns[mode] = (first, second)
    for packed, xla in zip(turns["packed"], turns["xla"]):
        np.testing.assert_array_equal(packed.tokens_bw, xla.tokens_bw)
        np.testing.assert_allclose(packed.logp_bw, xla.logp_bw, atol=2e-2 if bf16 else 1e-5)
