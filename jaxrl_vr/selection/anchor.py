"""Per-problem Base Anchoring (PBA, arXiv 2607.20543, Eq. 4; SPEC §4).

L = L_policy + λ · KL_anchor, with the KL per response token (k3) against the frozen
base π₀, gated per prompt and averaged over *all* response tokens of the batch:

    KL_anchor = Σ_b 1[anchor(x_b)] Σ_t m_bt · KL_bt  /  Σ_b Σ_t m_bt

(non-anchored responses add 0 to the numerator and still count in the denominator;
``anchored_kl_terms``). anchor(x) = τ_low <= p_base(x) <= τ_high (``polarity="above"``)
or its complement (``"below"``), with p_base from the prompt's own base calibration
samples. The defaults follow the paper's intent — anchor prompts whose base has some
correct mass but that are not already easy: τ_low = 2/64 (two successes of a 64-sample
calibration), τ_high = 0.6 (the "solved_easy" edge of ``passk.regime``). The paper's
exact values are not known; both are parameters.

The functions are pure and jittable; τ and λ may be arrays (changing them under jit does
not recompile), ``polarity`` is static.
"""

from __future__ import annotations

from typing import Any

import chex
import jax.numpy as jnp

__all__ = [
    "DEFAULT_TAU_HIGH",
    "DEFAULT_TAU_LOW",
    "POLARITIES",
    "anchor_mask",
    "anchored_kl_terms",
    "anchored_kl_weight",
    "expand_to_responses",
]

POLARITIES = ("above", "below")
DEFAULT_TAU_LOW = 2.0 / 64.0  # 0.03125: some correct base mass (2 of 64 samples)
DEFAULT_TAU_HIGH = 0.6  # not already easy (passk "solved_easy" is p > 0.6)


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
    tau_low: Any = DEFAULT_TAU_LOW,
    tau_high: Any = DEFAULT_TAU_HIGH,
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
    tau_low: Any = DEFAULT_TAU_LOW,
    tau_high: Any = DEFAULT_TAU_HIGH,
    polarity: str = "above",
    calibrated_p: chex.Array | None = None,
) -> chex.Array:
    """Per-prompt PBA KL coefficient λ · 1[anchor(x)], float32 [P].

    Expanded to responses (``expand_to_responses(w_p, G)``) it is the ``weight_b`` of
    ``anchored_kl_terms``; the KL loss term is then numerator / denominator, with λ
    already inside the weight (λ is PBA's own coefficient, not the global β).
    """
    mask = anchor_mask(p_base_p, tau_low=tau_low, tau_high=tau_high, polarity=polarity,
                       calibrated_p=calibrated_p)
    return jnp.where(mask, jnp.asarray(coef, jnp.float32), jnp.float32(0.0))


def expand_to_responses(weight_p: chex.Array, num_samples: int) -> chex.Array:
    """Prompt-major expansion [P] -> [P·G] (b = p·G + g), matching ``generate``."""
    chex.assert_rank(weight_p, 1)
    return jnp.repeat(weight_p, num_samples, total_repeat_length=weight_p.shape[0] * num_samples)


def anchored_kl_terms(
    kl_bt: chex.Array, mask_bt: chex.Array, weight_b: chex.Array
) -> tuple[chex.Array, chex.Array]:
    """PBA KL over all response tokens of the batch, as (numerator, denominator).

      numerator = Σ_b w_b Σ_t m_bt · KL_bt,     denominator = Σ_b Σ_t m_bt

    with w_b = λ · 1[anchor(x_b)] (``anchored_kl_weight`` expanded to responses), so
    non-anchored responses contribute 0 to the numerator and count in the denominator
    (arXiv 2607.20543, Eq. 4; SPEC §4). Sum numerators and denominators over
    micro-batches and devices, then divide once (as ``losses.aggregate``).

    Args:
      kl_bt: float [B, T] per-token KL(π‖π₀) (e.g. ``kl.estimate(..., "k3")``).
      mask_bt: bool [B, T] valid response tokens.
      weight_b: float [B] per-response weight λ·1[anchor].

    Returns:
      (numerator, denominator) float32 scalars; masked tokens add exactly 0.
    """
    chex.assert_rank([kl_bt, mask_bt, weight_b], [2, 2, 1])
    chex.assert_equal_shape([kl_bt, mask_bt])
    chex.assert_type(mask_bt, bool)
    chex.assert_equal_shape_prefix([kl_bt, weight_b], 1)
    kl_bt = jnp.asarray(kl_bt, jnp.float32)
    weight_b = jnp.asarray(weight_b, jnp.float32)
    masked_kl_bt = jnp.where(mask_bt & (weight_b[:, None] != 0.0), kl_bt, 0.0)
    numerator = jnp.sum(weight_b * jnp.sum(masked_kl_bt, axis=1))
    denominator = jnp.sum(mask_bt).astype(jnp.float32)
    return numerator, denominator
