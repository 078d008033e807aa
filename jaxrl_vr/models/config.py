"""Decoder architecture config: one dataclass for Llama (incl. SmolLM2), Qwen2 and Qwen3.

The three families share one block (pre-norm RMSNorm, GQA attention with RoPE, SwiGLU MLP);
they differ only in switches: q/k/v projection bias (Qwen2), per-head q/k RMSNorm (Qwen3),
output-projection bias, Llama-3 RoPE frequency scaling and tied embeddings.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
_PARAM_DTYPES = ("float32", "bfloat16")
COMPUTE_DTYPES = ("float32", "bfloat16")
_LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _freeze(value: Any) -> Any:
    """Dicts -> sorted tuples of items, lists -> tuples, so the config stays hashable."""
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """Architecture of a decoder-only transformer (hashable: safe as a static jit argument).

    `rope_scaling` is None or Llama-3 scaling given as a dict
    `{"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
    "original_max_position_embeddings"}`; it is stored as a sorted tuple of items (read it back
    with `rope_scaling_dict`). `attention_bias` adds biases to q/k/v (Qwen2, Llama with
    attention_bias), `attention_out_bias` to the output projection (Llama/Qwen3 with
    attention_bias), `qk_norm` applies a per-head RMSNorm to q and k before RoPE (Qwen3).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10_000.0
    rope_scaling: Any = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    attention_bias: bool = False
    attention_out_bias: bool = False
    qk_norm: bool = False
    max_position_embeddings: int = 2048
    param_dtype: str = "float32"
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    model_type: str = "llama"
    compute_dtype: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "rope_scaling", _freeze(self.rope_scaling) or None)
        object.__setattr__(self, "eos_token_id", _freeze(self.eos_token_id))
        if self.param_dtype not in _PARAM_DTYPES:
            raise ValueError(f"param_dtype={self.param_dtype!r}; expected one of {_PARAM_DTYPES}.")
        if self.compute_dtype is not None and self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"compute_dtype={self.compute_dtype!r}; expected one of {COMPUTE_DTYPES} "
                             "or None (= param_dtype).")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                    f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads} (GQA)."
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings.")
        scaling = self.rope_scaling_dict
        if scaling is not None:
            if scaling.get("rope_type") != "llama3":
                raise ValueError(
                        f"rope_scaling type {scaling.get('rope_type')!r} is not supported; only 'llama3' "
                        "(or None for plain RoPE)."
                )
            missing = [k for k in _LLAMA3_ROPE_KEYS if k not in scaling]
            if missing:
                raise ValueError(f"llama3 rope_scaling is missing {missing}; got {scaling}.")

    @property
    def rope_scaling_dict(self) -> dict[str, Any] | None:
        """rope_scaling as a plain dict (or None)."""
        return None if self.rope_scaling is None else dict(self.rope_scaling)

    @property
    def matmul_dtype(self) -> str:
        """The dtype matmul operands are cast to: `compute_dtype`, else `param_dtype`."""
        return self.compute_dtype or self.param_dtype

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """All end-of-sequence ids as a tuple (empty when unknown)."""
        if self.eos_token_id is None:
            return ()
        if isinstance(self.eos_token_id, tuple):
            return self.eos_token_id
        return (int(self.eos_token_id),)

    def replace(self, **changes) -> "DecoderConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def tiny(cls, vocab_size: int = 128, **overrides) -> "DecoderConfig":
        """A small Llama-style config for built-in tasks and tests (82k params at V=128)."""
        fields = dict(
                vocab_size=vocab_size,
                hidden_size=64,
                intermediate_size=128,
                num_layers=2,
                num_heads=4,
                num_kv_heads=2,
                head_dim=16,
                rope_theta=10_000.0,
                rms_norm_eps=1e-6,
                tie_word_embeddings=True,
                max_position_embeddings=512,
                model_type="llama",
        )
        fields.update(overrides)
        return cls(**fields)

    @classmethod
    def small(cls, vocab_size: int = 128, **overrides) -> "DecoderConfig":
        """A Llama-style config for the embedded default task (0.8M params at V=128)."""
        fields = dict(
                hidden_size=128, intermediate_size=384, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32
        )
        fields.update(overrides)
        return cls.tiny(vocab_size, **fields)

    @classmethod
    def from_hf(cls, hf_config: Any, *, param_dtype: str = "float32") -> "DecoderConfig":
        """Reads a transformers LlamaConfig / Qwen2Config / Qwen3Config (by its `model_type`).

        Raises:
            ValueError: for an unsupported architecture or feature (sliding window, MLP bias,
                non-SiLU activation, RoPE scaling other than llama3), naming it.
        """
        model_type = getattr(hf_config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                    f"Unsupported architecture model_type={model_type!r}; jaxrl_vr's Decoder supports "
                    f"{SUPPORTED_MODEL_TYPES} (Llama, SmolLM2, Qwen2, Qwen3)."
            )
        get = lambda name, default=None: getattr(hf_config, name, default)  # noqa: E731
        if get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act={get('hidden_act')!r} is not supported; only 'silu' (SwiGLU).")
        if get("mlp_bias", False):
            raise ValueError("mlp_bias=True is not supported by jaxrl_vr's Decoder.")
        if get("use_sliding_window", False):
            raise ValueError("use_sliding_window=True is not supported; load with sliding windows off.")
        rope = dict(get("rope_parameters", None) or get("rope_scaling", None) or {})
        if any(isinstance(v, Mapping) for v in rope.values()):
            raise ValueError(f"Per-layer-type RoPE parameters are not supported: {rope}.")
        rope_theta = float(rope.get("rope_theta", get("rope_theta", 10_000.0)))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type == "default":
            rope_scaling = None
        elif rope_type == "llama3":
            rope_scaling = {"rope_type": "llama3"}
            for key in _LLAMA3_ROPE_KEYS:
                default = get("max_position_embeddings") if key == "original_max_position_embeddings" else None
                rope_scaling[key] = rope.get(key, default)
        else:
            raise ValueError(f"RoPE type {rope_type!r} is not supported; only 'default' and 'llama3'.")
        if rope.get("partial_rotary_factor", 1.0) != 1.0:
            raise ValueError("partial_rotary_factor != 1 is not supported.")
        num_heads = int(get("num_attention_heads"))
        head_dim = get("head_dim", None) or int(get("hidden_size")) // num_heads
        attn_bias = bool(get("attention_bias", False))
        if model_type == "qwen2":  # Qwen2 always has q/k/v bias and no o_proj bias.
            qkv_bias, out_bias = True, False
        else:
            qkv_bias, out_bias = attn_bias, attn_bias
        return cls(
                vocab_size=int(get("vocab_size")),
                hidden_size=int(get("hidden_size")),
                intermediate_size=int(get("intermediate_size")),
                num_layers=int(get("num_hidden_layers")),
                num_heads=num_heads,
                num_kv_heads=int(get("num_key_value_heads", None) or num_heads),
                head_dim=int(head_dim),
                rope_theta=rope_theta,
                rope_scaling=rope_scaling,
                rms_norm_eps=float(get("rms_norm_eps", 1e-6)),
                tie_word_embeddings=bool(get("tie_word_embeddings", False)),
                attention_bias=qkv_bias,
                attention_out_bias=out_bias,
                qk_norm=model_type == "qwen3",
                max_position_embeddings=int(get("max_position_embeddings", 2048)),
                param_dtype=param_dtype,
                bos_token_id=get("bos_token_id", None),
                eos_token_id=get("eos_token_id", None),
                pad_token_id=get("pad_token_id", None),
                model_type=model_type,
        )

    def to_hf(self) -> Any:
        """The equivalent transformers config object (for save_pretrained).

        Raises:
            ValueError: when the switches cannot be expressed by `model_type`'s HF class
                (e.g. qk_norm on a llama config).
        """
        import transformers  # Local: configs only, never torch.

        classes = {
                "llama": transformers.LlamaConfig,
                "qwen2": transformers.Qwen2Config,
                "qwen3": transformers.Qwen3Config,
        }
        if self.model_type not in classes:
            raise ValueError(f"model_type={self.model_type!r} has no HF config; use one of {tuple(classes)}.")
        expected_qk_norm = self.model_type == "qwen3"
        if self.qk_norm != expected_qk_norm:
            raise ValueError(f"qk_norm={self.qk_norm} cannot be expressed as model_type={self.model_type!r}.")
        if self.model_type == "qwen2":
            ok = self.attention_bias and not self.attention_out_bias
        else:
            ok = self.attention_bias == self.attention_out_bias
        if not ok:
            raise ValueError(
                    f"attention_bias={self.attention_bias}, attention_out_bias={self.attention_out_bias} "
                    f"cannot be expressed as model_type={self.model_type!r}."
            )
        rope_parameters = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling is not None:
            rope_parameters.update(self.rope_scaling_dict)
        eos = self.eos_token_id
        kwargs = dict(
                vocab_size=self.vocab_size,
                hidden_size=self.hidden_size,
                intermediate_size=self.intermediate_size,
                num_hidden_layers=self.num_layers,
                num_attention_heads=self.num_heads,
                num_key_value_heads=self.num_kv_heads,
                head_dim=self.head_dim,
                rope_parameters=rope_parameters,
                rms_norm_eps=self.rms_norm_eps,
                tie_word_embeddings=self.tie_word_embeddings,
                max_position_embeddings=self.max_position_embeddings,
                bos_token_id=self.bos_token_id,
                eos_token_id=list(eos) if isinstance(eos, tuple) else eos,
                pad_token_id=self.pad_token_id,
                dtype=self.param_dtype,
        )
        if self.model_type != "qwen2":
            kwargs["attention_bias"] = self.attention_bias
        return classes[self.model_type](**kwargs)
