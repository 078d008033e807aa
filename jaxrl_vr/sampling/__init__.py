"""Jitted prefill + decode sampling with a static KV cache."""

from jaxrl_vr.sampling.sampler import Rollout, filter_logits, generate, sample_token

__all__ = ["Rollout", "filter_logits", "generate", "sample_token"]
