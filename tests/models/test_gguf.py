"""GGUF loading on synthetic files: block formats, q/k row order, names, config, tokenizer, errors."""

import json

import gguf
import gguf.quants as gq
import jax.numpy as jnp
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from jaxrl_vr.models import gguf_io
from jaxrl_vr.models.config import DecoderConfig
from jaxrl_vr.models.hf_io import expected_hf_shapes, from_hf_state_dict, to_hf_state_dict
from jaxrl_vr.models.tokenizers import byte_to_unicode

# ----------------------------------------------------------------------------- block formats by hand


def _f16_bytes(value):
    return np.array([value], "<f2").view(np.uint8)


def test_q8_0_block_by_hand():
    # d = 0.5, q = -16..15 -> x = q / 2.
    q = np.arange(-16, 16, dtype=np.int8)
    block = np.concatenate([_f16_bytes(0.5), q.view(np.uint8)])
    x = gguf_io.dequantize(block, "Q8_0", (32,))
    np.testing.assert_array_equal(x, np.arange(-16, 16) * 0.5)


def test_q4_0_and_q4_1_blocks_by_hand():
    # qs[j] = (hi << 4) | lo with lo = j, hi = 15 - j: elements 0..15 are the low nibbles,
    # 16..31 the high ones, so q = [0..15, 15..0].
    j = np.arange(16, dtype=np.uint8)
    qs = ((15 - j) << 4) | j
    q = np.concatenate([np.arange(16), np.arange(15, -1, -1)]).astype(np.float32)
    block0 = np.concatenate([_f16_bytes(2.0), qs])  # x = 2 * (q - 8)
    np.testing.assert_array_equal(gguf_io.dequantize(block0, "Q4_0", (32,)), 2.0 * (q - 8))
    block1 = np.concatenate([_f16_bytes(0.25), _f16_bytes(-1.0), qs])  # x = 0.25 q - 1
    np.testing.assert_array_equal(gguf_io.dequantize(block1, "Q4_1", (32,)), 0.25 * q - 1.0)


def test_bf16_and_f16():
    x = np.array([1.0, -2.5, 3.140625, 0.0], np.float32)
    bf16_bits = (x.view(np.uint32) >> 16).astype(np.uint16)  # exact: these need <= 8 mantissa bits
    np.testing.assert_array_equal(gguf_io.dequantize(bf16_bits.view(np.uint8), "BF16", (2, 2)), x.reshape(2, 2))
    np.testing.assert_array_equal(gguf_io.dequantize(x.astype(np.float16), "F16", (4,)), x)


def _random_blocks(rng, qtype, num_blocks):
    """Random block bytes with small finite float16 scale fields (positions from ggml-common.h)."""
    per_block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(num_blocks, block_bytes), dtype=np.uint8)
    scale_offsets = {Q.Q8_0: [0], Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q4_K: [0, 2], Q.Q6_K: [208]}[qtype]
    for offset in scale_offsets:
        scale = (0.01 * rng.normal(size=num_blocks)).astype("<f2")
        raw[:, offset : offset + 2] = scale.view(np.uint8).reshape(num_blocks, 2)
    return raw, num_blocks * per_block


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q6_K])
def test_dequantize_equals_gguf_reference(qtype):
    raw, count = _random_blocks(np.random.default_rng(int(qtype)), qtype, 24)
    ours = gguf_io.dequantize(raw, qtype.name, (count // 64, 64) if count % 64 == 0 else (count,))
    reference = gq.dequantize(raw.reshape(-1), qtype).reshape(ours.shape)
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(ours, reference)


def test_dequantize_errors_name_the_tensor():
    with pytest.raises(NotImplementedError, match=r"'blk\.0\.ffn_up\.weight'.*Q5_0"):
        gguf_io.dequantize(np.zeros(22, np.uint8), "Q5_0", (32,), name="blk.0.ffn_up.weight")
    with pytest.raises(ValueError, match="truncated"):
        gguf_io.dequantize(np.zeros(33, np.uint8), "Q8_0", (32,), name="x")


# ----------------------------------------------------------------------------- q/k row order


def test_permute_qk_by_hand():
    # One head of head_dim 4 (rows r0..r3, HF rotate-half: pairs (r0, r2), (r1, r3)) ->
    # GGML interleaved order r0, r2, r1, r3; two heads permute independently.
    w = np.arange(8)[:, None] * np.ones((1, 3))
    np.testing.assert_array_equal(gguf_io.permute_qk(w, 2)[:, 0], [0, 2, 1, 3, 4, 6, 5, 7])
    np.testing.assert_array_equal(gguf_io.unpermute_qk(w, 2)[:, 0], [0, 2, 1, 3, 4, 6, 5, 7])
    # head_dim 6: rotate-half pairs (0,3), (1,4), (2,5) -> interleaved 0,3,1,4,2,5.
    np.testing.assert_array_equal(gguf_io.permute_qk(np.arange(6), 1), [0, 3, 1, 4, 2, 5])
    np.testing.assert_array_equal(gguf_io.unpermute_qk(np.array([0, 3, 1, 4, 2, 5]), 1), np.arange(6))


def test_unpermute_inverts_permute():
    w = np.random.default_rng(0).normal(size=(3 * 16, 5))
    np.testing.assert_array_equal(gguf_io.unpermute_qk(gguf_io.permute_qk(w, 3), 3), w)
    assert not np.array_equal(gguf_io.permute_qk(w, 3), w)


def test_names():
    assert gguf_io.gguf_to_hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert gguf_io.gguf_to_hf_name("output.weight") == "lm_head.weight"
    assert gguf_io.gguf_to_hf_name("blk.12.attn_k_norm.weight") == "model.layers.12.self_attn.k_norm.weight"
    assert gguf_io.gguf_to_hf_name("blk.3.attn_q.bias") == "model.layers.3.self_attn.q_proj.bias"
    assert gguf_io.gguf_to_hf_name("blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    with pytest.raises(KeyError, match="ffn_gate_exps"):
        gguf_io.gguf_to_hf_name("blk.0.ffn_gate_exps.weight")


# ----------------------------------------------------------------------------- synthetic files

BYTE_TOKENS = [byte_to_unicode()[b] for b in range(256)]  # id of byte b is b
MERGES = ["h e", "l l", "he ll", "Ġ w", "o r", "1 2"]  # -> ids 256..261
SPECIALS = ["<|endoftext|>", "<think>"]  # 262 control, 263 user-defined
TOKENS = BYTE_TOKENS + [m.replace(" ", "") for m in MERGES] + SPECIALS
TOKEN_TYPES = [1] * (len(TOKENS) - 2) + [3, 4]
CHAT_TEMPLATE = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"

_HF_TO_GGUF = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
}


def _gguf_name(hf_name):
    fixed = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    if hf_name in fixed:
        return fixed[hf_name]
    _, _, layer, *module, kind = hf_name.split(".")
    return f"blk.{layer}.{_HF_TO_GGUF['.'.join(module)]}.{kind}"


def _tiny_config(arch, tied):
    return DecoderConfig(
        vocab_size=len(TOKENS), hidden_size=64, intermediate_size=256, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=16, rope_theta=5000.0, rms_norm_eps=1e-5, tie_word_embeddings=tied,
        attention_bias=arch == "qwen2", qk_norm=arch == "qwen3", max_position_embeddings=128,
        bos_token_id=262, eos_token_id=262, pad_token_id=0, model_type=arch,
    )


def write_gguf(path, config, types, *, pre="default", extra_tensors=(), rng=None):
    """Write random weights for `config` as llama.cpp would (q/k permuted for llama).

    Returns the HF-named float32 tensors the file decodes to (via gguf's own dequantize), so a
    loader must reproduce them exactly. `types` maps a module suffix (e.g. 'q_proj') to a type.
    """
    rng = rng or np.random.default_rng(0)
    arch = config.model_type
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(TOKENS)
    writer.add_token_types(TOKEN_TYPES)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(262)
    writer.add_eos_token_id(262)
    writer.add_pad_token_id(0)
    writer.add_chat_template(CHAT_TEMPLATE)
    expected = {}
    for hf_name, shape in expected_hf_shapes(config).items():
        module = hf_name.rsplit(".", 2)[-2]
        qtype = types.get(module, Q.F32) if len(shape) == 2 else Q.F32
        permute = arch == "llama" and module in ("q_proj", "k_proj")
        heads = config.num_heads if module == "q_proj" else config.num_kv_heads
        if qtype in (Q.Q4_K, Q.Q6_K):  # gguf-py cannot quantise these: write random blocks.
            raw, _ = _random_blocks(rng, qtype, int(np.prod(shape)) // 256)
            stored = raw.reshape(shape[0], -1)
            decoded = gq.dequantize(stored, qtype).reshape(shape)
            assert not permute, "K-quant test tensors must not be q/k"
        else:
            weight = (0.1 * rng.normal(size=shape)).astype(np.float32)
            if module.endswith("norm"):
                weight += 1.0
            if qtype == Q.F32:
                stored, decoded = weight, weight
            elif qtype == Q.F16:
                stored = weight.astype(np.float16)
                decoded = stored.astype(np.float32)
            else:
                stored = gq.quantize(weight, qtype)
                # Quantisation is per row, so it commutes with llama.cpp's row permutation.
                decoded = gq.dequantize(stored, qtype).reshape(shape)
            if permute:
                stored = gguf_io.permute_qk(stored, heads)
        raw_dtype = None if qtype in (Q.F32, Q.F16) else qtype
        writer.add_tensor(_gguf_name(hf_name), np.ascontiguousarray(stored), raw_dtype=raw_dtype)
        expected[hf_name] = decoded
    for name, array in extra_tensors:
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


CASES = {
    "llama": (False, {"embed_tokens": Q.Q8_0, "lm_head": Q.Q8_0, "q_proj": Q.Q4_0, "k_proj": Q.Q4_1,
                      "v_proj": Q.BF16, "o_proj": Q.F16, "gate_proj": Q.Q8_0, "down_proj": Q.Q6_K}),
    "qwen2": (True, {"embed_tokens": Q.F16, "q_proj": Q.Q8_0, "k_proj": Q.Q8_0, "v_proj": Q.Q4_0,
                     "down_proj": Q.Q4_K, "up_proj": Q.Q4_1}),
    "qwen3": (True, {"embed_tokens": Q.Q4_0, "q_proj": Q.Q4_1, "k_proj": Q.Q8_0, "gate_proj": Q.BF16}),
}


@pytest.mark.parametrize("arch", sorted(CASES))
def test_from_gguf_reproduces_the_file(tmp_path, arch):
    tied, types = CASES[arch]
    config = _tiny_config(arch, tied)
    path = tmp_path / f"{arch}.gguf"
    expected = write_gguf(path, config, types)

    model, tokenizer = gguf_io.from_gguf(path)
    assert model.config == config
    assert tokenizer.eos_id == 262 and tokenizer.vocab_size == len(TOKENS)
    loaded = to_hf_state_dict(model)
    assert set(loaded) == set(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(loaded[name], value, err_msg=name)

    # Forward pass equals the one from the decoded HF tensors (and is finite).
    tokens = jnp.asarray([[1, 5, 9, 200, 7]], jnp.int32)
    logits = np.asarray(model(tokens))
    assert np.isfinite(logits).all()
    np.testing.assert_allclose(logits, np.asarray(from_hf_state_dict(config, expected)(tokens)), atol=1e-5)


def test_from_gguf_bfloat16(tmp_path):
    config = _tiny_config("qwen3", True)
    expected = write_gguf(tmp_path / "m.gguf", config, CASES["qwen3"][1])
    model, _ = gguf_io.from_gguf(tmp_path / "m.gguf", dtype="bfloat16")
    assert model.config.param_dtype == "bfloat16" and model.embed[...].dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        np.asarray(model.embed[...], np.float32),
        np.asarray(jnp.asarray(expected["model.embed_tokens.weight"]).astype(jnp.bfloat16), np.float32),
    )


def test_from_gguf_onto_a_mesh(tmp_path):
    from jax.sharding import PartitionSpec as P

    from jaxrl_vr import parallel

    config = _tiny_config("qwen3", True)
    expected = write_gguf(tmp_path / "m.gguf", config, {})
    model, _ = gguf_io.from_gguf(tmp_path / "m.gguf", mesh=parallel.make_mesh(2, 2, 2))
    wq = model.layers.wq[...]
    assert wq.sharding.spec == P(None, "fsdp", "tensor")  # [L, D, H, E] column-parallel over heads
    np.testing.assert_array_equal(to_hf_state_dict(model)["model.layers.1.self_attn.q_proj.weight"],
                                  expected["model.layers.1.self_attn.q_proj.weight"])


def test_gguf_tokenizer_from_metadata(tmp_path):
    config = _tiny_config("qwen3", True)
    write_gguf(tmp_path / "m.gguf", config, {})
    tok = gguf_io.read_gguf(tmp_path / "m.gguf").tokenizer
    # 'hello' -> h e l l o -> (h e) (l l) -> (he ll) -> [hell=258, o=111]; <think> = 263 whole;
    # 'world' -> w (o r) l d -> [119, 260, 108, 100]; ' world' -> (Ġ w) (o r) l d.
    assert tok.encode("hello<think>world<|endoftext|>") == [258, 111, 263, 119, 260, 108, 100, 262]
    assert tok.encode(" world") == [259, 260, 108, 100]
    assert tok.encode("hi", add_bos=True) == [262, 104, 105]
    assert tok.decode([258, 111, 262]) == "hello"
    assert tok.decode([258, 111, 262], skip_special_tokens=False) == "hello<|endoftext|>"
    assert tok.decode(tok.encode("é 🙂\n")) == "é 🙂\n"  # bytes round-trip through the byte alphabet
    # GPT-2 split keeps "123" one pre-token, so the '1 2' merge applies.
    assert tok.encode("123") == [261, ord("3")]
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "[user]hi"


@pytest.mark.parametrize(
    "pre, expected",
    [
        ("smollm", [ord("1"), ord("2"), ord("3")]),  # llama.cpp: \p{N} split first
        ("qwen2", [ord("1"), ord("2"), ord("3")]),  # Qwen2 regex: single \p{N}
        ("llama-bpe", [261, ord("3")]),  # Llama-3 regex: \p{N}{1,3} keeps "123", '1 2' merges
    ],
)
def test_gguf_tokenizer_pre_tokenizer_by_pre_type(tmp_path, pre, expected):
    write_gguf(tmp_path / "m.gguf", _tiny_config("llama", True), {}, pre=pre)
    tok = gguf_io.read_gguf(tmp_path / "m.gguf").tokenizer
    assert tok.encode("123") == expected
    assert tok.decode(tok.encode("a 1234 b")) == "a 1234 b"


# ----------------------------------------------------------------------------- errors


def test_unsupported_quantisation_names_tensor_and_type(tmp_path):
    config = _tiny_config("llama", True)
    write_gguf(tmp_path / "m.gguf", config, {"up_proj": Q.Q5_0})
    with pytest.raises(NotImplementedError, match=r"blk\.0\.ffn_up\.weight.*Q5_0"):
        gguf_io.from_gguf(tmp_path / "m.gguf")


def test_unsupported_architecture_and_rope_table(tmp_path):
    config = _tiny_config("llama", True)
    write_gguf(tmp_path / "rope.gguf", config, {}, extra_tensors=[("rope_freqs.weight", np.ones(8, np.float32))])
    with pytest.raises(NotImplementedError, match="rope_freqs"):
        gguf_io.read_gguf(tmp_path / "rope.gguf")
    writer = gguf.GGUFWriter(str(tmp_path / "gemma.gguf"), "gemma")
    writer.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="'gemma' is not supported"):
        gguf_io.read_gguf(tmp_path / "gemma.gguf")
    with pytest.raises(FileNotFoundError):
        gguf_io.read_gguf(tmp_path / "missing.gguf")


def test_metadata_json_roundtrip_of_config(tmp_path):
    """The config read back is exactly the one written (field by field, incl. token ids)."""
    config = _tiny_config("qwen2", True)
    write_gguf(tmp_path / "m.gguf", config, {})
    read = gguf_io.read_gguf(tmp_path / "m.gguf", with_tokenizer=False)
    assert read.tokenizer is None
    assert json.dumps(read.config.__dict__, sort_keys=True, default=str) == json.dumps(
        config.__dict__, sort_keys=True, default=str
    )
    assert read.source_types["model.layers.1.self_attn.q_proj.bias"] == "F32"


def test_from_gguf_trims_the_heap_once(tmp_path, monkeypatch):
    # After the dequantised tensors are dropped, so the trim can hand their pages back.
    tied, types = CASES["llama"]
    path = tmp_path / "llama.gguf"
    write_gguf(path, _tiny_config("llama", tied), types)
    seen = []
    monkeypatch.setattr(gguf_io, "release_free_heap", lambda: seen.append("trim"))
    gguf_io.from_gguf(path)
    assert seen == ["trim"]
