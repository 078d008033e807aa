"""Flax NNX decoder (Llama / Qwen2 / Qwen3) and Hugging Face weight I/O."""

from jaxrl_vr.models.config import SUPPORTED_MODEL_TYPES, DecoderConfig
from jaxrl_vr.models.decoder import Decoder, KVCache, num_params
from jaxrl_vr.models.hf_io import (
    from_hf_state_dict,
    from_pretrained,
    load_hf_tensors,
    save_pretrained,
    to_hf_state_dict,
)

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "DecoderConfig",
    "Decoder",
    "KVCache",
    "num_params",
    "from_hf_state_dict",
    "from_pretrained",
    "load_hf_tensors",
    "save_pretrained",
    "to_hf_state_dict",
    # models-io (merged by the lead): from_gguf, tokenizers (CharTokenizer, HFTokenizer, ...).
]
