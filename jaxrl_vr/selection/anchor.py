"""Per-problem Base Anchoring (PBA, arXiv 2607.20543; SPEC §4).

L = L_policy + λ · 1[anchor(x)] · KL(π‖π₀), KL per response token (k3) against the
frozen base π₀. anchor(x) = τ_low <= p_base(x) <= τ_high (``polarity="above"``: keep the
policy near the base where the base already solves the problem) or its complement
(``polarity="below"``; with τ_high = 1 this is p_base(x) < τ_low). The paper's τ values
are not known; both are parameters.

The functions are pure and jittable; τ and λ may be arrays (changing them under jit does
not recompile), ``polarity`` is static.
"""

from __future__ import annotations

from typing import Any

import chex
import jax.numpy as jnp

__all__ = ["anchor_mask", "anchored_kl_weight", "expand_to_responses", "POLARITIES"]

POLARITIES = ("above", "below")


def _check_band(tau_low: Any, tau_high: Any, polarity: str) -> None:
    if polarity not in POLARITIES:
        raise ValueError(f"polarity must be one of {POLARITIES}, got {polarity!r}.")
    if isinstance(tau_low, (int, float)) and isinstance(tau_high, (int, float)):
        if not 0.0 <= tau_low <= tau_high <= 1.0:
            raise ValueError(
                f"need 0 <= tau_low <= tau_high <= 1, got tau_low={tau_low}, tau_high={tau_high}."
            )


def anchor_mask(
    p_base_p: chex.Array,
    *,
    tau_low: Any,
    tau_high: Any = 1.0,
    polarity: str = "above",
    calibrated_p: chex.Array | None = None,
) -> chex.Array:
    """PBA anchor set: bool [P].

    ``"above"``: τ_low <= p_base <= τ_high.  ``"below"``: not (τ_low <= p_base <= τ_high).
    Prompts with ``calibrated_p`` False (no base samples) are never anchored.

    Args:
      p_base_p: [P] base pass rates (``PromptTracker.p_base``).
      tau_low, tau_high: band edges (floats or scalar arrays), both inclusive.
      polarity: ``"above"`` or ``"below"`` (static).
      calibrated_p: optional [P] bool.
    """
    _check_band(tau_low, tau_high, polarity)
    chex.assert_rank(p_base_p, 1)
    p = jnp.asarray(p_base_p, jnp.float32)
    in_band = (p >= jnp.asarray(tau_low, jnp.float32)) & (p <= jnp.asarray(tau_high, jnp.float32))
    mask = in_band if polarity == "above" else ~in_band
    if calibrated_p is not None:
        chex.assert_equal_shape([p_base_p, calibrated_p])
        chex.assert_type(calibrated_p, bool)
        mask = mask & calibrated_p
    return mask


def anchored_kl_weight(
    p_base_p: chex.Array,
    *,
    coef: Any,
    tau_low: Any,
    tau_high: Any = 1.0,
    polarity: str = "above",
    calibrated_p: chex.Array | None = None,
) -> chex.Array:
    """Per-prompt PBA KL coefficient λ · 1[anchor(x)], float32 [P].

    The trainer multiplies it (expanded to responses, ``expand_to_responses``) into
    the per-response token-KL term against the frozen base.
    """
    mask = anchor_mask(p_base_p, tau_low=tau_low, tau_high=tau_high, polarity=polarity,
                       calibrated_p=calibrated_p)
    return jnp.where(mask, jnp.asarray(coef, jnp.float32), jnp.float32(0.0))


def expand_to_responses(weight_p: chex.Array, num_samples: int) -> chex.Array:
    """Prompt-major expansion [P] -> [P·G] (b = p·G + g), matching ``generate``."""
    chex.assert_rank(weight_p, 1)
    return jnp.repeat(weight_p, num_samples, total_repeat_length=weight_p.shape[0] * num_samples)
