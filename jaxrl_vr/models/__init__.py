"""Flax NNX decoder (Llama / Qwen2 / Qwen3), Hugging Face and GGUF weight I/O, tokenizers."""

from jaxrl_vr.models.config import COMPUTE_DTYPES, SUPPORTED_MODEL_TYPES, DecoderConfig
from jaxrl_vr.models.decoder import Decoder, KVCache, PrefixKV, num_params, set_compute_dtype
from jaxrl_vr.models.gguf_io import from_gguf, read_gguf
from jaxrl_vr.models.hf_io import (
    from_hf_state_dict,
    from_pretrained,
    load_hf_tensors,
    save_pretrained,
    to_hf_state_dict,
)
from jaxrl_vr.models.lora import LORA_TARGETS, add_lora, has_lora, lora_off, lora_targets, merge_lora
from jaxrl_vr.models.tokenizers import (
    CharTokenizer,
    GGUFTokenizer,
    HFTokenizer,
    Tokenizer,
    load_tokenizer,
    tokenizer_from_gguf,
)

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "COMPUTE_DTYPES",
    "DecoderConfig",
    "Decoder",
    "KVCache",
    "PrefixKV",
    "num_params",
    "set_compute_dtype",
    "LORA_TARGETS",
    "add_lora",
    "has_lora",
    "lora_off",
    "lora_targets",
    "merge_lora",
    "from_hf_state_dict",
    "from_pretrained",
    "load_hf_tensors",
    "save_pretrained",
    "to_hf_state_dict",
    "from_gguf",
    "read_gguf",
    "Tokenizer",
    "CharTokenizer",
    "HFTokenizer",
    "GGUFTokenizer",
    "tokenizer_from_gguf",
    "load_tokenizer",
]
