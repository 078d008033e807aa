"""Per-token KL(π_θ ‖ π_ref) estimators from sampled log-probs (SPEC §3.6).

With tokens sampled from π_θ and d = log π_ref − log π_θ (Schulman, "Approximating KL
Divergence", 2020, http://joschu.net/blog/kl-approx.html):

| kind | estimate             | notes                                                    |
|------|----------------------|----------------------------------------------------------|
| k1   | −d                   | unbiased, high variance, can be negative; as a loss its   |
|      |                      | expected gradient on-policy is zero                       |
| k2   | ½ d²                 | biased, low variance, ≥ 0                                 |
| k3   | exp(d) − d − 1       | unbiased, low variance, ≥ 0 (default; GRPO's KL term)     |

k1 and k2 use d as it is; k3 clips d at +20 before exp (SPEC §3.4), so it is finite for
any input and exact whenever d ≤ 20.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from jaxrl_vr import ratios

KL_KINDS = ("k1", "k2", "k3")


def estimate(logp: jax.Array, ref_logp: jax.Array, kind: str = "k3", *,
             mask: jax.Array | None = None) -> jax.Array:
    """Elementwise KL(π_θ ‖ π_ref) estimate of kind k1, k2 or k3 (SPEC §3.6, **contract**).

    Args:
        logp: log π_θ of the sampled tokens, any shape (gradient flows through it).
        ref_logp: log π_ref of the same tokens, same shape (data: stop-gradiented here).
        kind: "k1", "k2" or "k3" (static).
        mask: optional bool of the same shape; masked elements are exactly 0 (zero grad).

    Returns:
        float32 array of logp's shape.
    """
    if kind not in KL_KINDS:
        raise ValueError(f"Unknown KL estimator kind {kind!r}; valid kinds: "
                         f"{', '.join(KL_KINDS)} (k3 is the usual low-variance choice).")
    chex.assert_equal_shape([logp, ref_logp])
    logp = jnp.asarray(logp, jnp.float32)
    ref_logp = jax.lax.stop_gradient(jnp.asarray(ref_logp, jnp.float32))
    log_ratio = ref_logp - logp  # d = log π_ref − log π_θ
    if mask is not None:
        chex.assert_equal_shape([logp, mask])
        chex.assert_type(mask, bool)
        # Masked elements may hold inf/NaN (padding): d = 0 there gives zero value and grad.
        log_ratio = jnp.where(mask, log_ratio, 0.0)
    if kind == "k1":
        kl = -log_ratio
    elif kind == "k2":
        kl = 0.5 * jnp.square(log_ratio)
    else:
        # Only exp can overflow, so only d > LOG_RATIO_BOUND is clipped (SPEC §3.4): the
        # other side stays exact and keeps its gradient however far the policy drifts.
        clipped = jnp.minimum(log_ratio, ratios.LOG_RATIO_BOUND)
        kl = jnp.expm1(clipped) - clipped  # exp(d) − 1 − d, accurate for small d
    if mask is not None:
        kl = jnp.where(mask, kl, 0.0)
    return kl
