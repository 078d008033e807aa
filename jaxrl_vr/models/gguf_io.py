"""Load llama.cpp GGUF checkpoints (Llama / SmolLM2, Qwen2, Qwen3) into the Flax NNX Decoder.

The file's metadata becomes a `DecoderConfig`, its tensors are dequantised to float32 numpy
with the block formats of ggml (`ggml-common.h`: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K),
renamed to Hugging Face names and handed to `hf_io.from_hf_state_dict`; the tokenizer comes
from the same metadata (`tokenizers.tokenizer_from_gguf`).

llama.cpp's converter (`convert_hf_to_gguf.py`, `LlamaModel.permute`) reorders the rows of
q_proj / k_proj of *llama* checkpoints from HF's rotate-half RoPE layout to GGML's interleaved
one; `unpermute_qk` undoes it. Qwen2 / Qwen3 are stored unpermuted.
"""

from __future__ import annotations

import dataclasses
import os
import re
import struct
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from flax import nnx

from jaxrl_vr import parallel
from jaxrl_vr.host_memory import release_free_heap
from jaxrl_vr.models.config import DecoderConfig
from jaxrl_vr.models.hf_io import from_hf_state_dict
from jaxrl_vr.models.tokenizers import GGUFTokenizer, tokenizer_from_gguf

__all__ = [
    "from_gguf",
    "read_gguf",
    "check_gguf_header",
    "GGUFCheckpoint",
    "dequantize",
    "unpermute_qk",
    "permute_qk",
    "gguf_to_hf_name",
    "SUPPORTED_ARCHITECTURES",
    "SUPPORTED_TYPES",
]

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3")

# ----------------------------------------------------------------------------- dequantisation
# Each block format: (elements per block, bytes per block, decode(blocks_nb) -> values_ne).
# `blocks_nb` is a uint8 array [num_blocks, bytes per block]; outputs are float32.


def _f16(blocks_nb: np.ndarray, start: int) -> np.ndarray:
    """The little-endian float16 at byte `start` of every block, as float32 [N, 1]."""
    return np.ascontiguousarray(blocks_nb[:, start : start + 2]).view("<f2").astype(np.float32)


def _nibbles(qs_nb: np.ndarray) -> np.ndarray:
    """[N, 16] packed bytes -> [N, 32]: low nibbles are elements 0..15, high ones 16..31."""
    return np.concatenate([qs_nb & 0x0F, qs_nb >> 4], axis=-1)


def _decode_q8_0(blocks: np.ndarray) -> np.ndarray:
    """block_q8_0 (34 B / 32): f16 d, int8 q[32]; x = d * q."""
    d = _f16(blocks, 0)
    q = blocks[:, 2:34].view(np.int8).astype(np.float32)
    return d * q


def _decode_q4_0(blocks: np.ndarray) -> np.ndarray:
    """block_q4_0 (18 B / 32): f16 d, 16 bytes of nibbles; x = d * (q - 8)."""
    d = _f16(blocks, 0)
    q = _nibbles(blocks[:, 2:18]).astype(np.float32) - 8.0
    return d * q


def _decode_q4_1(blocks: np.ndarray) -> np.ndarray:
    """block_q4_1 (20 B / 32): f16 d, f16 m, 16 bytes of nibbles; x = d * q + m."""
    d, m = _f16(blocks, 0), _f16(blocks, 2)
    q = _nibbles(blocks[:, 4:20]).astype(np.float32)
    return d * q + m


def _k_scales_mins(scales_n12: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The eight 6-bit (scale, min) pairs packed in 12 bytes (ggml's get_scale_min_k4).

    j < 4: scale = s[j] & 63, min = s[j+4] & 63; j >= 4: the low 4 bits come from s[j+4]
    (scale: low nibble, min: high nibble) and the top 2 from the top bits of s[j-4] / s[j].
    """
    s = scales_n12
    scale = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)], axis=-1)
    minimum = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=-1)
    return scale.astype(np.float32), minimum.astype(np.float32)


def _decode_q4_k(blocks: np.ndarray) -> np.ndarray:
    """block_q4_K (144 B / 256): f16 d, f16 dmin, 12 B of 6-bit scales/mins, 128 B nibbles.

    Eight sub-blocks of 32: x = d * scale_j * q - dmin * min_j. Each 32-byte chunk c of the
    nibbles holds sub-block 2c in its low nibbles and 2c + 1 in its high ones.
    """
    n = blocks.shape[0]
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)
    scale_nj, min_nj = _k_scales_mins(blocks[:, 4:16])
    qs = blocks[:, 16:144].reshape(n, 4, 1, 32)
    q_njl = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(n, 8, 32).astype(np.float32)
    x = (d * scale_nj)[:, :, None] * q_njl - (dmin * min_nj)[:, :, None]
    return x.reshape(n, 256)


def _decode_q6_k(blocks: np.ndarray) -> np.ndarray:
    """block_q6_K (210 B / 256): ql[128] low nibbles, qh[64] 2-bit highs, int8 scales[16], f16 d.

    Two halves of 128; in half h, for l < 32 and k = 0..3 the element at 128h + 32k + l is
    q = (nibble | ((qh[32h + l] >> 2k) & 3) << 4) - 32, with nibble = low (k even) / high (k odd)
    nibble of ql[64h + l + 32 (k % 2)], and x = d * scales[8h + 2k + l // 16] * q.
    """
    n = blocks.shape[0]
    ql = blocks[:, 0:128].reshape(n, 2, 2, 32)  # [half, +32?, l]
    qh = blocks[:, 128:192].reshape(n, 2, 1, 32)  # [half, ., l]
    scales = blocks[:, 192:208].view(np.int8).astype(np.float32).reshape(n, 2, 4, 2, 1)
    d = _f16(blocks, 208)
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=2)  # k = 0..3 -> ql[l]&F, ql[l+32]&F, ql[l]>>4, ql[l+32]>>4
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    high = (qh >> shifts) & 3
    q = (low | (high << 4)).astype(np.float32) - 32.0  # [n, 2, 4, 32]
    scale = np.broadcast_to(scales, (n, 2, 4, 2, 16)).reshape(n, 2, 4, 32)
    return (d.reshape(n, 1, 1, 1) * scale * q).reshape(n, 256)


_BLOCK_FORMATS: dict[str, tuple[int, int, Callable[[np.ndarray], np.ndarray]]] = {
    "Q8_0": (32, 34, _decode_q8_0),
    "Q4_0": (32, 18, _decode_q4_0),
    "Q4_1": (32, 20, _decode_q4_1),
    "Q4_K": (256, 144, _decode_q4_k),
    "Q6_K": (256, 210, _decode_q6_k),
}
SUPPORTED_TYPES = ("F32", "F16", "BF16", *_BLOCK_FORMATS)


def dequantize(data: np.ndarray, type_name: str, shape: tuple[int, ...], *, name: str = "?") -> np.ndarray:
    """Raw GGUF tensor bytes/values -> float32 array of numpy `shape` (row-major, HF order).

    Args:
      data: the tensor as `GGUFReader` exposes it (float32/float16 values, or uint8 bytes).
      type_name: the GGML type's name, e.g. "Q4_K".
      shape: the logical numpy shape (GGUF's `ne` reversed).
      name: the tensor's name, for error messages.
    Raises:
      NotImplementedError: for a quantisation type not in `SUPPORTED_TYPES`, naming the tensor.
    """
    count = int(np.prod(shape))
    if type_name == "F32":
        values = np.asarray(data).view(np.float32) if np.asarray(data).dtype == np.uint8 else data
        return np.asarray(values, dtype=np.float32).reshape(shape)
    if type_name == "F16":
        values = np.asarray(data).view("<f2") if np.asarray(data).dtype == np.uint8 else data
        return np.asarray(values, dtype=np.float32).reshape(shape)
    if type_name == "BF16":
        bits = np.ascontiguousarray(data).view(np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).reshape(shape)
    if type_name not in _BLOCK_FORMATS:
        raise NotImplementedError(
            f"GGUF tensor {name!r} has quantisation type {type_name}, which jaxrl_vr cannot "
            f"dequantise (supported: {', '.join(SUPPORTED_TYPES)}). Re-quantise the model with "
            "llama-quantize to one of those, or load the original HF safetensors."
        )
    per_block, block_bytes, decode = _BLOCK_FORMATS[type_name]
    if count % per_block:
        raise ValueError(f"GGUF tensor {name!r}: {count} elements is not a multiple of {per_block}.")
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    if raw.size != count // per_block * block_bytes:
        raise ValueError(
            f"GGUF tensor {name!r} ({type_name}, shape {shape}) has {raw.size} bytes; "
            f"expected {count // per_block * block_bytes}. The file is truncated or mislabelled."
        )
    return decode(raw.reshape(-1, block_bytes)).reshape(shape)


# ----------------------------------------------------------------------------- RoPE row order


def permute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """HF rotate-half rows -> GGML interleaved rows, per head (convert_hf_to_gguf's permute).

    Within each head of `head_dim` rows, row (i, half) with i < head_dim/2 moves to 2i + half.
    Works for weights [H*hd, D] and biases [H*hd].
    """
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def unpermute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Inverse of `permute_qk`: GGML interleaved rows (2i + half) -> HF rows (half, i)."""
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


# ----------------------------------------------------------------------------- names

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")
# Tensors llama.cpp stores that the model does not use (precomputed RoPE tables).
_IGNORED = ("rope_freqs.weight",)


def gguf_to_hf_name(name: str) -> str:
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.weight', etc.

    Raises:
      KeyError: for a tensor with no Hugging Face counterpart in the supported architectures.
    """
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    match = _BLOCK_RE.match(name)
    if match and match.group(2) in _BLOCK_NAMES:
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{_BLOCK_NAMES[part]}.{kind}"
    raise KeyError(
        f"GGUF tensor {name!r} has no counterpart in jaxrl_vr's Decoder (Llama/Qwen2/Qwen3); "
        "the file is another architecture or carries extra modules."
    )


# ----------------------------------------------------------------------------- reading


@dataclasses.dataclass
class GGUFCheckpoint:
    """What a GGUF file holds, in jaxrl_vr's terms."""

    config: DecoderConfig
    tensors: dict[str, np.ndarray]  # HF names -> float32 arrays (HF layout, q/k unpermuted)
    tokenizer: GGUFTokenizer | None
    source_types: dict[str, str]  # HF name -> GGML type it was stored as


def _field(reader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _float32_value(value: float) -> float:
    """A float32 metadata value as the shortest decimal that round-trips (1e-5, not 9.99e-06):
    the value the original HF config held before llama.cpp stored it as float32."""
    return float(np.format_float_scientific(np.float32(value), unique=True))


def _config_from_metadata(reader, arch: str, tensor_shapes: Mapping[str, tuple[int, ...]], dtype: str):
    """DecoderConfig from `{arch}.*` metadata and the tensors' shapes."""

    def need(key):
        value = _field(reader, f"{arch}.{key}")
        if value is None:
            raise ValueError(f"GGUF metadata lacks {arch}.{key}; the file is incomplete.")
        return value

    if "token_embd.weight" not in tensor_shapes:
        raise ValueError("GGUF file has no token_embd.weight tensor; it is not a decoder LM.")
    vocab_size, hidden = tensor_shapes["token_embd.weight"]
    if int(need("embedding_length")) != hidden:
        raise ValueError(
            f"{arch}.embedding_length={need('embedding_length')} but token_embd.weight is {hidden} wide."
        )
    num_heads = int(need("attention.head_count"))
    num_kv_heads = int(_field(reader, f"{arch}.attention.head_count_kv", num_heads))
    head_dim = int(_field(reader, f"{arch}.attention.key_length", hidden // num_heads))
    value_dim = int(_field(reader, f"{arch}.attention.value_length", head_dim))
    if value_dim != head_dim:
        raise ValueError(f"key_length={head_dim} != value_length={value_dim} is not supported.")
    rope_dim = _field(reader, f"{arch}.rope.dimension_count")
    if rope_dim is not None and int(rope_dim) != head_dim:
        raise ValueError(
            f"{arch}.rope.dimension_count={rope_dim} != head_dim={head_dim}: partial rotary "
            "embeddings are not supported by jaxrl_vr's Decoder."
        )
    scaling_type = _field(reader, f"{arch}.rope.scaling.type")
    if scaling_type not in (None, "none") or "rope_freqs.weight" in tensor_shapes:
        raise NotImplementedError(
            f"GGUF RoPE scaling ({scaling_type or 'rope_freqs table'}) is not supported: llama.cpp "
            "stores Llama-3 scaling as a precomputed table without its parameters. Load the model "
            "from its HF directory (from_pretrained) instead."
        )
    has = lambda suffix: f"blk.0.{suffix}" in tensor_shapes  # noqa: E731
    qkv_bias = has("attn_q.bias")
    out_bias = has("attn_output.bias")
    if arch == "qwen2" and not qkv_bias:
        raise ValueError("A qwen2 GGUF must carry q/k/v biases (blk.N.attn_q.bias); this one has none.")
    qk_norm = has("attn_q_norm.weight")
    if qk_norm != (arch == "qwen3"):
        raise ValueError(f"{arch} GGUF with qk-norm tensors present={qk_norm} is not a supported layout.")

    def token_id(key):
        value = _field(reader, f"tokenizer.ggml.{key}")
        return None if value is None else int(value)

    return DecoderConfig(
        vocab_size=int(vocab_size),
        hidden_size=int(hidden),
        intermediate_size=int(need("feed_forward_length")),
        num_layers=int(need("block_count")),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        rope_theta=_float32_value(_field(reader, f"{arch}.rope.freq_base", 10_000.0)),
        rope_scaling=None,
        rms_norm_eps=_float32_value(need("attention.layer_norm_rms_epsilon")),
        tie_word_embeddings="output.weight" not in tensor_shapes,
        attention_bias=qkv_bias,
        attention_out_bias=out_bias,
        qk_norm=qk_norm,
        max_position_embeddings=int(_field(reader, f"{arch}.context_length", 2048)),
        param_dtype=dtype,
        bos_token_id=token_id("bos_token_id"),
        eos_token_id=token_id("eos_token_id"),
        pad_token_id=token_id("padding_token_id"),
        model_type=arch,
    )


GGUF_VERSIONS = (2, 3)  # what the gguf package reads


def check_gguf_header(path: str | os.PathLike) -> int:
    """The GGUF version of ``path``; ValueError naming the file and the fix when its first
    bytes are not a GGUF header (read in microseconds, before the file is parsed)."""
    with open(path, "rb") as f:
        head = f.read(8)
    if head[:4] != b"GGUF":
        raise ValueError(f"{os.fspath(path)!r} is not a GGUF file (it starts with {head[:4]!r}, not "
                         "b'GGUF'); pass a llama.cpp .gguf model file.")
    version = struct.unpack("<I", head[4:8])[0] if len(head) == 8 else -1
    if version not in GGUF_VERSIONS:
        raise ValueError(f"{os.fspath(path)!r} has a GGUF header of version {version}, not one of "
                         f"{GGUF_VERSIONS}: the file is damaged or not a GGUF model; download it again.")
    return version


def read_gguf(path: str | os.PathLike, *, dtype: str = "float32", with_tokenizer: bool = True) -> GGUFCheckpoint:
    """Parse a GGUF file into (DecoderConfig, float32 HF-named tensors, tokenizer).

    Checks architecture, tensor names and quantisation types before dequantising anything.
    """
    import gguf  # Deferred: only GGUF users need it.

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF file {path!r} does not exist.")
    check_gguf_header(path)
    try:
        reader = gguf.GGUFReader(path, "r")
    except (ValueError, IndexError, struct.error) as err:  # a truncated or damaged file
        raise ValueError(f"GGUF file {path!r} is damaged or truncated ({err}); download it again.") from None
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported; jaxrl_vr loads {SUPPORTED_ARCHITECTURES}."
        )
    shapes = {t.name: tuple(int(n) for n in reversed(t.shape)) for t in reader.tensors}
    config = _config_from_metadata(reader, arch, shapes, dtype)

    plan = []  # Validate every name and type before the expensive part.
    for tensor in reader.tensors:
        if tensor.name in _IGNORED:
            continue
        hf_name = gguf_to_hf_name(tensor.name)
        type_name = tensor.tensor_type.name
        if type_name not in SUPPORTED_TYPES:
            dequantize(tensor.data, type_name, shapes[tensor.name], name=tensor.name)  # raises
        plan.append((tensor, hf_name, type_name))

    tensors, source_types = {}, {}
    for tensor, hf_name, type_name in plan:
        weight = dequantize(tensor.data, type_name, shapes[tensor.name], name=tensor.name)
        if arch == "llama" and (".q_proj." in hf_name or ".k_proj." in hf_name):
            heads = config.num_heads if ".q_proj." in hf_name else config.num_kv_heads
            weight = unpermute_qk(weight, heads)
        tensors[hf_name] = weight
        source_types[hf_name] = type_name
    tokenizer = tokenizer_from_gguf(reader) if with_tokenizer else None
    return GGUFCheckpoint(config=config, tensors=tensors, tokenizer=tokenizer, source_types=source_types)


def from_gguf(path: str | os.PathLike, *, dtype: str = "float32", mesh: Any = None):
    """Load a GGUF checkpoint as `(Decoder, Tokenizer)`.

    Args:
      path: a llama.cpp GGUF file of a llama / qwen2 / qwen3 model (e.g. SmolLM2-135M Q4_1).
      dtype: parameter dtype of the returned Decoder, "float32" or "bfloat16".
      mesh: optional `jax.sharding.Mesh`; the parameters are then placed with
        `jaxrl_vr.parallel.shard_model`.
    Returns:
      (decoder, tokenizer); the weights are the dequantised values (Q4 stays Q4-accurate).
    """
    checkpoint = read_gguf(path, dtype=dtype)
    model = from_hf_state_dict(checkpoint.config, checkpoint.tensors, dtype=dtype)
    tokenizer = checkpoint.tokenizer
    del checkpoint  # its dequantised tensors, so that the heap trim below can return them
    if mesh is not None:
        model = parallel.shard_model(model, mesh)
    jax.block_until_ready(nnx.state(model))
    release_free_heap()
    return model, tokenizer
