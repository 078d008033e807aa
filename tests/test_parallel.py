"""Mesh construction, partition rules and sharded == single-device numerics (8 fake CPU devices)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_vr import parallel
from jaxrl_vr.models.config import DecoderConfig
from jaxrl_vr.models.decoder import Decoder
from jaxrl_vr.sampling import generate

CONFIG = DecoderConfig.tiny(vocab_size=128, tie_word_embeddings=False, eos_token_id=2)  # H=4, Hkv=2, D=64, F=128


def test_make_mesh_sizes():
    assert jax.device_count() == 8, "tests/conftest.py must provide 8 CPU devices"
    assert dict(parallel.make_mesh(2, 2, 2).shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert dict(parallel.make_mesh().shape) == {"data": 8, "fsdp": 1, "tensor": 1}
    assert dict(parallel.make_mesh(data=2, fsdp=-1).shape) == {"data": 2, "fsdp": 4, "tensor": 1}
    assert parallel.make_mesh(1, 1, 1, devices=jax.devices()[:1]).devices.size == 1
    with pytest.raises(ValueError, match="4 devices"):
        parallel.make_mesh(2, 2, 1, devices=jax.devices()[:6])
    with pytest.raises(ValueError, match="at most one -1"):
        parallel.make_mesh(-1, -1)
    with pytest.raises(ValueError, match="cannot be split"):
        parallel.make_mesh(-1, 3)


def test_partition_rules_by_hand():
    mesh = parallel.make_mesh(2, 2, 2)
    L, D, H, K, E, F, V = 2, 64, 4, 2, 16, 128, 128
    spec = lambda *path_and_shape: parallel.param_partition_spec(*path_and_shape, mesh)  # noqa: E731
    assert spec(("embed",), (V, D)) == P("tensor", "fsdp")
    assert spec(("lm_head",), (D, V)) == P("fsdp", "tensor")
    assert spec(("layers", "wq"), (L, D, H, E)) == P(None, "fsdp", "tensor")
    assert spec(("layers", "wk"), (L, D, K, E)) == P(None, "fsdp", "tensor")
    assert spec(("layers", "wo"), (L, H, E, D)) == P(None, "tensor", None, "fsdp")
    assert spec(("layers", "w_gate"), (L, D, F)) == P(None, "fsdp", "tensor")
    assert spec(("layers", "w_down"), (L, F, D)) == P(None, "tensor", "fsdp")
    assert spec(("layers", "attn_norm"), (L, D)) == P()
    assert spec(("final_norm",), (D,)) == P()
    # 9 heads / 3 kv heads (SmolLM2) cannot split over tensor=2: that axis is dropped, fsdp kept.
    assert spec(("layers", "wq"), (30, 576, 9, 64)) == P(None, "fsdp")
    assert parallel.fit_spec(P(("data", "fsdp")), (6,), mesh) == P()  # 6 % (2*2) != 0
    assert parallel.fit_spec(P(("data", "fsdp")), (8,), mesh) == P(("data", "fsdp"))


def test_data_sharding_and_shard_batch():
    mesh = parallel.make_mesh(2, 2, 2)
    assert parallel.data_sharding(mesh, 2).spec == P(("data", "fsdp"), None)
    batch = {"tokens": np.arange(24).reshape(8, 3), "step": np.int32(3)}
    placed = parallel.shard_batch(batch, mesh)
    assert placed["tokens"].sharding.spec == P(("data", "fsdp"), None)
    # Rows 0-1 on the first (data, fsdp) shard: 8 rows / 4 batch shards.
    shard_rows = {tuple(s.data[:, 0].tolist()) for s in placed["tokens"].addressable_shards}
    assert shard_rows == {(0, 3), (6, 9), (12, 15), (18, 21)}
    np.testing.assert_array_equal(np.asarray(placed["tokens"]), batch["tokens"])
    with pytest.raises(ValueError, match="not divisible"):
        parallel.shard_batch(np.zeros((6, 2)), mesh)


@pytest.fixture(scope="module")
def reference_model():
    return Decoder(CONFIG, rngs=nnx.Rngs(0))


def _prompts():
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, CONFIG.vocab_size, size=(8, 6)).astype(np.int32)
    mask = np.ones((8, 6), bool)
    mask[1, :2] = False  # left padding
    mask[5, :4] = False
    return tokens, mask


def _logits(model, tokens, mask, mesh=None):
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda s, t, m: nnx.merge(graphdef, s)(t, mask_bt=m))
    if mesh is not None:
        tokens, mask = parallel.shard_batch((tokens, mask), mesh)
    return np.asarray(forward(state, tokens, mask))


@pytest.mark.parametrize("shape", [(2, 2, 2), (8, 1, 1)])
def test_sharded_model_matches_single_device(reference_model, shape):
    mesh = parallel.make_mesh(*shape)
    sharded = parallel.shard_model(reference_model, mesh)
    wq = sharded.layers.wq[...]
    assert isinstance(wq.sharding, NamedSharding)
    assert wq.sharding.spec == P(None, "fsdp", "tensor")  # size-1 axes divide everything
    if shape == (2, 2, 2):  # [L, D, H, E] split D/2 over fsdp and H/2 over tensor
        assert wq.addressable_shards[0].data.shape == (2, 32, 2, 16)
    tokens, mask = _prompts()
    want = _logits(reference_model, tokens, mask)
    got = _logits(sharded, tokens, mask, mesh)
    np.testing.assert_allclose(got[mask], want[mask], atol=1e-5, rtol=1e-5)

    kwargs = dict(max_new_tokens=5, greedy=True, stop_token_ids=(), pad_id=0)
    want_tokens = generate(jax.random.key(0), reference_model, tokens, mask, **kwargs).tokens_bt
    got_tokens = generate(jax.random.key(0), sharded, tokens, mask, **kwargs).tokens_bt
    np.testing.assert_array_equal(np.asarray(got_tokens), np.asarray(want_tokens))


def test_init_sharded_equals_plain_init(reference_model):
    mesh = parallel.make_mesh(2, 2, 2)
    model = parallel.init_sharded(lambda: Decoder(CONFIG, rngs=nnx.Rngs(0)), mesh)
    assert model.embed[...].sharding.spec == P("tensor", "fsdp")
    assert model.layers.w_down[...].sharding.spec == P(None, "tensor", "fsdp")
    want = jax.tree.leaves(nnx.state(reference_model))
    got = jax.tree.leaves(nnx.state(model))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-7)


def test_initialize_distributed_passes_env(monkeypatch):
    calls = {}
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.update(kw))
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:1234")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "4")
    monkeypatch.setenv("JAX_PROCESS_ID", "3")
    assert parallel.initialize_distributed() is True
    assert calls == {"coordinator_address": "10.0.0.1:1234", "num_processes": 4, "process_id": 3}
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: True)
    assert parallel.initialize_distributed() is False


def test_sharded_jit_does_not_need_pmap(reference_model):
    """The sharded forward is one jitted program whose output is sharded over the batch axes."""
    mesh = parallel.make_mesh(2, 2, 2)
    sharded = parallel.shard_model(reference_model, mesh)
    graphdef, state = nnx.split(sharded)
    tokens, mask = parallel.shard_batch(_prompts(), mesh)
    out = jax.jit(lambda s, t, m: nnx.merge(graphdef, s)(t, mask_bt=m))(state, tokens, mask)
    assert out.shape == (8, 6, CONFIG.vocab_size) and bool(jnp.isfinite(out).all())
    assert len(out.sharding.device_set) == 8
