"""Per-token KL(π_θ ‖ π_ref) estimators from sampled log-probs (SPEC §3.6).

With tokens sampled from π_θ and d = log π_ref − log π_θ (Schulman, "Approximating KL
Divergence", 2020, http://joschu.net/blog/kl-approx.html):

| kind | estimate             | notes                                                    |
|------|----------------------|----------------------------------------------------------|
| k1   | −d                   | unbiased, high variance, can be negative; as a loss its   |
|      |                      | expected gradient on-policy is zero                       |
| k2   | ½ d²                 | biased, low variance, ≥ 0                                 |
| k3   | exp(d) − d − 1       | unbiased, low variance, ≥ 0 (default; GRPO's KL term)     |

d is clipped to ±20 before exp, so k3 is finite for any input.
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
    log_ratio = ratios.clip_log_ratio(ref_logp - logp)  # d = log π_ref − log π_θ
    if kind == "k1":
        kl = -log_ratio
    elif kind == "k2":
        kl = 0.5 * jnp.square(log_ratio)
    else:
        kl = jnp.expm1(log_ratio) - log_ratio  # exp(d) − 1 − d, accurate for small d
    if mask is not None:
        chex.assert_equal_shape([logp, mask])
        chex.assert_type(mask, bool)
        kl = jnp.where(mask, kl, 0.0)
    return kl
