"""Hugging Face checkpoint I/O: local directories with config.json + safetensors.

Tensor names follow transformers' Llama/Qwen2/Qwen3 modules (`model.layers.{i}.self_attn.q_proj.weight`, ...).
HF linear weights are [out, in]; the Decoder stores [in, out] split per head, so loading is a
transpose + reshape and saving the inverse. No RoPE permutation is needed: the Decoder uses
HF's rotate_half convention. Torch is never imported.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_vr import parallel
from jaxrl_vr.host_memory import release_free_heap
from jaxrl_vr.models.config import SUPPORTED_MODEL_TYPES, DecoderConfig
from jaxrl_vr.models.decoder import Decoder
from jaxrl_vr.models.lora import has_lora, merge_lora

_SAFETENSORS = "model.safetensors"
_SAFETENSORS_INDEX = "model.safetensors.index.json"
# Buffers some exporters write that carry no parameters.
_IGNORED = re.compile(r"^model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq$")

# Decoder layer parameter -> (HF suffix under model.layers.{i}., HF->ours, ours->HF).
# HF shapes: q_proj [H*Dh, D], k/v_proj [Hkv*Dh, D], o_proj [D, H*Dh], gate/up [F, D], down [D, F].


def _layer_specs(c: DecoderConfig) -> dict[str, tuple[str, Any, Any]]:
    d, h, k, e = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
    ident = lambda x: x  # noqa: E731
    specs = {
        "attn_norm": ("input_layernorm.weight", ident, ident),
        "wq": ("self_attn.q_proj.weight", lambda x: x.T.reshape(d, h, e), lambda x: x.reshape(d, h * e).T),
        "wk": ("self_attn.k_proj.weight", lambda x: x.T.reshape(d, k, e), lambda x: x.reshape(d, k * e).T),
        "wv": ("self_attn.v_proj.weight", lambda x: x.T.reshape(d, k, e), lambda x: x.reshape(d, k * e).T),
        "wo": ("self_attn.o_proj.weight", lambda x: x.T.reshape(h, e, d), lambda x: x.reshape(h * e, d).T),
        "mlp_norm": ("post_attention_layernorm.weight", ident, ident),
        "w_gate": ("mlp.gate_proj.weight", lambda x: x.T, lambda x: x.T),
        "w_up": ("mlp.up_proj.weight", lambda x: x.T, lambda x: x.T),
        "w_down": ("mlp.down_proj.weight", lambda x: x.T, lambda x: x.T),
    }
    if c.attention_bias:
        specs["bq"] = ("self_attn.q_proj.bias", lambda x: x.reshape(h, e), lambda x: x.reshape(h * e))
        specs["bk"] = ("self_attn.k_proj.bias", lambda x: x.reshape(k, e), lambda x: x.reshape(k * e))
        specs["bv"] = ("self_attn.v_proj.bias", lambda x: x.reshape(k, e), lambda x: x.reshape(k * e))
    if c.attention_out_bias:
        specs["bo"] = ("self_attn.o_proj.bias", ident, ident)
    if c.qk_norm:
        specs["q_norm"] = ("self_attn.q_norm.weight", ident, ident)
        specs["k_norm"] = ("self_attn.k_norm.weight", ident, ident)
    return specs


def expected_hf_shapes(config: DecoderConfig) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape for every tensor a checkpoint of `config` must hold."""
    c = config
    d, f, v, h, k, e = c.hidden_size, c.intermediate_size, c.vocab_size, c.num_heads, c.num_kv_heads, c.head_dim
    per_layer = {
        "input_layernorm.weight": (d,), "post_attention_layernorm.weight": (d,),
        "self_attn.q_proj.weight": (h * e, d), "self_attn.k_proj.weight": (k * e, d),
        "self_attn.v_proj.weight": (k * e, d), "self_attn.o_proj.weight": (d, h * e),
        "self_attn.q_proj.bias": (h * e,), "self_attn.k_proj.bias": (k * e,), "self_attn.v_proj.bias": (k * e,),
        "self_attn.o_proj.bias": (d,), "self_attn.q_norm.weight": (e,), "self_attn.k_norm.weight": (e,),
        "mlp.gate_proj.weight": (f, d), "mlp.up_proj.weight": (f, d), "mlp.down_proj.weight": (d, f),
    }
    used = {suffix for suffix, _, _ in _layer_specs(c).values()}
    shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (v, d)
    for i in range(c.num_layers):
        for suffix in used:
            shapes[f"model.layers.{i}.{suffix}"] = per_layer[suffix]
    return shapes


def from_hf_state_dict(config: DecoderConfig, tensors: Mapping[str, Any], *, dtype: str | None = None,
                       remat: bool = False) -> Decoder:
    """Builds a Decoder from HF-named tensors (numpy or jax arrays, any float dtype).

    Args:
      config: the architecture (e.g. `DecoderConfig.from_hf(AutoConfig...)`).
      tensors: HF name -> array.
      dtype: parameter dtype ("float32" / "bfloat16"); default `config.param_dtype`.

    Raises:
      KeyError: a required tensor is missing (named).
      ValueError: a tensor has the wrong shape (named, expected vs got) or unexpected tensors
        are present (listed: the checkpoint does not match the config).
    """
    if dtype is not None:
        config = config.replace(param_dtype=str(jnp.dtype(dtype)))
    expected = expected_hf_shapes(config)
    names = set(tensors)
    if config.tie_word_embeddings:
        names.discard("lm_head.weight")  # Some exporters save the tied copy; it is the embedding.
    missing = sorted(set(expected) - names)
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise KeyError(f"Checkpoint is missing tensor(s) {missing[:5]}{more} required by {config.model_type} "
                       f"config (attention_bias={config.attention_bias}, qk_norm={config.qk_norm}, "
                       f"tie_word_embeddings={config.tie_word_embeddings}).")
    unexpected = sorted(n for n in names - set(expected) if not _IGNORED.match(n))
    if unexpected:
        raise ValueError(f"Checkpoint has unexpected tensor(s) {unexpected[:8]} that the "
                         f"{config.model_type} config does not use: the config.json does not match the weights.")
    for name, shape in expected.items():
        got = tuple(tensors[name].shape)
        if got != shape:
            raise ValueError(f"Tensor {name} has shape {got}, expected {shape} from the config.")

    pdtype = jnp.dtype(config.param_dtype)

    def load(x):
        return jnp.asarray(jnp.asarray(x), dtype=pdtype)

    model = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0), remat=remat))
    model.embed.set_value(load(tensors["model.embed_tokens.weight"]))
    model.final_norm.set_value(load(tensors["model.norm.weight"]))
    if not config.tie_word_embeddings:
        model.lm_head.set_value(load(tensors["lm_head.weight"]).T)
    for name, (suffix, to_ours, _) in _layer_specs(config).items():
        per_layer = [to_ours(load(tensors[f"model.layers.{i}.{suffix}"])) for i in range(config.num_layers)]
        getattr(model.layers, name).set_value(jnp.stack(per_layer))
    return model


def _plain(model: Decoder) -> Decoder:
    """`model` itself, or with LoRA adapters merged into float32 weights (`merge_lora`)."""
    return merge_lora(model, param_dtype="float32") if has_lora(model) else model


def to_hf_state_dict(model: Decoder) -> dict[str, np.ndarray]:
    """HF-named numpy tensors (parameter dtype; bf16 as ml_dtypes.bfloat16) of a Decoder; a
    model with LoRA adapters is merged first, into float32 weights."""
    model = _plain(model)
    c = model.config
    out = {"model.embed_tokens.weight": model.embed[...], "model.norm.weight": model.final_norm[...]}
    if model.lm_head is not None:
        out["lm_head.weight"] = model.lm_head[...].T
    for name, (suffix, _, to_hf) in _layer_specs(c).items():
        stacked = getattr(model.layers, name)[...]
        for i in range(c.num_layers):
            out[f"model.layers.{i}.{suffix}"] = to_hf(stacked[i])
    return {k: np.ascontiguousarray(np.asarray(jax.device_get(v))) for k, v in out.items()}


def _read_safetensors(path: str) -> dict[str, jax.Array]:
    from safetensors.flax import load_file  # The numpy backend cannot read bfloat16.

    return load_file(path)


def load_hf_tensors(path: str) -> dict[str, jax.Array]:
    """All tensors of a local HF directory: model.safetensors or a sharded index."""
    index_path = os.path.join(path, _SAFETENSORS_INDEX)
    single = os.path.join(path, _SAFETENSORS)
    if os.path.exists(index_path):
        with open(index_path) as f:
            weight_map = json.load(f)["weight_map"]
        tensors = {}
        for shard in sorted(set(weight_map.values())):
            tensors.update(_read_safetensors(os.path.join(path, shard)))
        return tensors
    if os.path.exists(single):
        return _read_safetensors(single)
    raise FileNotFoundError(f"No {_SAFETENSORS} or {_SAFETENSORS_INDEX} in {path!r}; expected a local "
                            "Hugging Face model directory (download it first; hub access is not used).")


def load_config(path: str) -> DecoderConfig:
    """DecoderConfig from a local directory's config.json (transformers.AutoConfig, local only)."""
    if not os.path.exists(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"No config.json in {path!r}; expected a local Hugging Face model directory.")
    with open(os.path.join(path, "config.json")) as f:
        model_type = json.load(f).get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:  # Before AutoConfig, which knows many more.
        raise ValueError(f"Unsupported architecture model_type={model_type!r} in {path}/config.json; "
                         f"supported: {SUPPORTED_MODEL_TYPES}.")
    import transformers

    hf_config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    return DecoderConfig.from_hf(hf_config)


def from_pretrained(path: str, *, dtype: str = "float32", mesh: Any = None, remat: bool = False) -> Decoder:
    """Loads a Decoder from a local HF directory (config.json + safetensors, single or sharded).

    Args:
      path: the directory.
      dtype: parameter dtype, "float32" or "bfloat16" (independent of the checkpoint's dtype).
      mesh: optional `jax.sharding.Mesh`; when given the parameters are sharded with
        `jaxrl_vr.parallel.shard_model`.
    """
    config = load_config(path)
    model = from_hf_state_dict(config, load_hf_tensors(path), dtype=dtype, remat=remat)
    if mesh is not None:
        model = parallel.shard_model(model, mesh)
    jax.block_until_ready(nnx.state(model))
    release_free_heap()  # the checkpoint's freed staging copies (perf18: 730 MB for SmolLM2-135M)
    return model


def save_pretrained(model: Decoder, path: str) -> None:
    """Writes config.json + model.safetensors that transformers (torch) loads back as-is.

    A model with LoRA adapters is written merged (W + (alpha / r)·A·B), in float32."""
    from safetensors.flax import save_file  # Handles bfloat16 (ml_dtypes) arrays.

    model = _plain(model)
    os.makedirs(path, exist_ok=True)
    hf_config = model.config.to_hf()
    hf_config.save_pretrained(path)
    save_file(to_hf_state_dict(model), os.path.join(path, _SAFETENSORS), metadata={"format": "pt"})
