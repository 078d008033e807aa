"""HF checkpoint I/O: exact tensor round trips, sharded checkpoints, bf16, and clear errors."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from flax import nnx
from safetensors.numpy import load_file, save_file

from jaxrl_vr.models import Decoder, DecoderConfig, from_hf_state_dict, from_pretrained, save_pretrained
from jaxrl_vr.models import hf_io

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures")


def fixture_dir(name):
    return os.path.join(FIXTURES, name)


def params_of(model):
    return {"/".join(map(str, k)): np.asarray(v) for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_qwen2", "tiny_qwen3"])
def test_to_hf_state_dict_reproduces_checkpoint_exactly(name):
    """Load then export gives back the very tensors transformers wrote (names, shapes, values)."""
    original = load_file(os.path.join(fixture_dir(name), "model.safetensors"))
    exported = hf_io.to_hf_state_dict(from_pretrained(fixture_dir(name)))
    assert sorted(exported) == sorted(original)
    for key, value in original.items():
        np.testing.assert_array_equal(exported[key], value, err_msg=key)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_save_pretrained_round_trip(tmp_path, dtype):
    model = from_pretrained(fixture_dir("tiny_qwen3"), dtype=dtype)
    save_pretrained(model, str(tmp_path))
    hf_config = transformers.AutoConfig.from_pretrained(str(tmp_path), local_files_only=True)
    assert hf_config.model_type == "qwen3" and hf_config.head_dim == 16
    loaded = from_pretrained(str(tmp_path), dtype=dtype)
    assert loaded.config == model.config.replace(param_dtype=dtype)
    before, after = params_of(model), params_of(loaded)
    assert sorted(before) == sorted(after)
    for key in before:
        assert after[key].dtype == jnp.dtype(dtype)
        np.testing.assert_array_equal(after[key], before[key], err_msg=key)


def test_sharded_checkpoint_and_tied_duplicate(tmp_path):
    """model.safetensors.index.json shards load; a tied model's saved lm_head copy is accepted."""
    tensors = load_file(os.path.join(fixture_dir("tiny_qwen2"), "model.safetensors"))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(tmp_path / shard))
    weight_map = {k: shard for shard, keys in shards.items() for k in keys}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    shutil.copy(os.path.join(fixture_dir("tiny_qwen2"), "config.json"), tmp_path / "config.json")
    sharded = from_pretrained(str(tmp_path))
    reference = from_pretrained(fixture_dir("tiny_qwen2"))
    assert sharded.config.tie_word_embeddings
    for key, value in params_of(reference).items():
        np.testing.assert_array_equal(params_of(sharded)[key], value)
    with_head = dict(tensors, **{"lm_head.weight": tensors["model.embed_tokens.weight"]})
    tied = from_hf_state_dict(reference.config, with_head)
    np.testing.assert_array_equal(tied.unembed_matrix(), reference.unembed_matrix())


def test_bad_tensors_raise_clear_errors():
    config = from_pretrained(fixture_dir("tiny_llama")).config
    tensors = load_file(os.path.join(fixture_dir("tiny_llama"), "model.safetensors"))
    missing = {k: v for k, v in tensors.items() if k != "model.layers.1.mlp.up_proj.weight"}
    with pytest.raises(KeyError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        from_hf_state_dict(config, missing)
    wrong = dict(tensors, **{"model.layers.0.self_attn.k_proj.weight": np.zeros((8, 32), np.float32)})
    with pytest.raises(ValueError, match=r"k_proj\.weight has shape \(8, 32\), expected \(16, 32\)"):
        from_hf_state_dict(config, wrong)
    extra = dict(tensors, **{"model.layers.0.self_attn.q_norm.weight": np.ones(8, np.float32)})
    with pytest.raises(ValueError, match=r"unexpected tensor\(s\) \['model\.layers\.0\.self_attn\.q_norm"):
        from_hf_state_dict(config, extra)


def test_bad_directories_raise_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="No config.json"):
        from_pretrained(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="Unsupported architecture model_type='gpt2'"):
        from_pretrained(str(tmp_path))
    shutil.copy(os.path.join(fixture_dir("tiny_llama"), "config.json"), tmp_path / "config.json")
    with pytest.raises(FileNotFoundError, match="No model.safetensors"):
        from_pretrained(str(tmp_path))


def test_fresh_model_save_load_logits_identical(tmp_path):
    """A randomly initialised Llama-3-scaled model survives save -> load with identical logits."""
    config = DecoderConfig.tiny(vocab_size=48, hidden_size=32, intermediate_size=64, head_dim=8,
                                tie_word_embeddings=False, eos_token_id=(2, 3), rope_scaling=dict(
                                    rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                    original_max_position_embeddings=64))
    model = Decoder(config, rngs=nnx.Rngs(7))
    save_pretrained(model, str(tmp_path))
    loaded = from_pretrained(str(tmp_path))
    assert loaded.config == config
    tokens = jax.random.randint(jax.random.key(0), (2, 5), 0, 48)
    forward = nnx.jit(lambda m, t: m(t))
    np.testing.assert_array_equal(forward(loaded, tokens), forward(model, tokens))


def test_legacy_rope_scaling_config_json(tmp_path):
    """Checkpoints written by transformers 4.x keep rope_theta / rope_scaling at the top level."""
    config = json.loads(open(os.path.join(fixture_dir("tiny_llama"), "config.json")).read())
    rope = config.pop("rope_parameters")
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = rope
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert hf_io.load_config(str(tmp_path)) == hf_io.load_config(fixture_dir("tiny_llama"))
    assert hf_io.load_config(str(tmp_path)).rope_scaling_dict["factor"] == 8.0


@pytest.mark.slow
def test_from_pretrained_with_mesh_shards_and_matches():
    """mesh= places parameters with jaxrl_vr.parallel.shard_model; logits and greedy samples agree."""
    from jaxrl_vr import parallel
    from jaxrl_vr.sampling import generate

    mesh = parallel.make_mesh(data=2, fsdp=2, tensor=2)
    sharded = from_pretrained(fixture_dir("tiny_qwen3"), mesh=mesh)
    plain = from_pretrained(fixture_dir("tiny_qwen3"))
    assert len(sharded.layers.wq[...].sharding.device_set) == 8
    ref = np.load(os.path.join(fixture_dir("tiny_qwen3"), "reference.npz"))
    forward = nnx.jit(lambda m, t, k: m(t, mask_bt=k))
    real = ref["attention_mask"]
    np.testing.assert_allclose(np.asarray(forward(sharded, ref["input_ids"], real))[real],
                               np.asarray(forward(plain, ref["input_ids"], real))[real], atol=1e-5)
    rollout = generate(jax.random.key(0), sharded, ref["input_ids"], real, max_new_tokens=8, greedy=True,
                       stop_token_ids=(-1,))
    np.testing.assert_array_equal(rollout.tokens_bt, ref["greedy_tokens"])


def test_from_pretrained_trims_the_heap_once(monkeypatch):
    # The checkpoint's staging copies are freed by then; the trim hands their pages back
    # (perf18: 730 MB for SmolLM2-135M).
    seen = []
    monkeypatch.setattr(hf_io, "release_free_heap", lambda: seen.append("trim"))
    from_pretrained(fixture_dir("tiny_qwen3"))
    assert seen == ["trim"]
