"""Per-token policy entropy and the entropy-feedback clip controller (SPEC §3.6).

The controller follows MAI-Thinking-1: a bounded integral state k moves the upper ratio
clip when the measured entropy Ĥ leaves a target H*,

    k ← clip(k + δ·sign(H* − Ĥ), k_min, k_max),     upper clip = 1 + ε_high·(1 + k),

so clip-higher widens when the policy is collapsing and (with k_min < 0) tightens when its
entropy runs above target. k is relative to ε_high, so δ, k_min and k_max mean the same on
every ratio scale: δ = 0.01 moves a token ratio's ε_high = 0.28 by 0.0028 and GSPO's
sequence ratio's 4e-4 by 4e-6 (the same δ added to ε_high itself would widen the latter
~26× in one step). k_min ≥ −1 keeps ε_high·(1 + k) ≥ 0. k = 0 is exactly the plain clip 1 + ε_high:
switching the controller on changes nothing until it acts. It is an `(init, update)`
pair over a NamedTuple of arrays, like an optax transformation (jit-friendly, saved with
the checkpoint).
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from jaxrl_vr import ratios


def entropy_from_logits(logits_btv: jax.Array, *, chunk_size: int | None = None) -> jax.Array:
    """Per-token entropy H = −Σ_v p_v log p_v of softmax(logits), float32 (**contract**).

    Logits are upcast to float32 one time-chunk at a time (no full float32 copy of a bf16
    input); log p = z − logsumexp(z) is stable, and p_v = 0 terms (e.g. −inf logits)
    contribute exactly 0.

    Args:
        logits_btv: [B, T, V] logits, float32 or bf16.
        chunk_size: time steps per chunk; None picks `ratios.auto_chunk_size(B, T, V)`.

    Returns:
        entropy_bt: [B, T] float32, in [0, log V].
    """
    chex.assert_rank(logits_btv, 3)
    chex.assert_type(logits_btv, float)
    batch, length, vocab = logits_btv.shape
    if chunk_size is None:
        chunk_size = ratios.auto_chunk_size(batch, length, vocab)
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(
            f"chunk_size must be a positive int (or None for auto), got {chunk_size!r}.")

    dummy_tokens_bt = jnp.zeros((batch, length), jnp.int32)
    (entropy_bt,) = ratios.map_logits_chunks(_upcast_entropy, logits_btv, dummy_tokens_bt,
                                             chunk_size)
    return entropy_bt


def _upcast_entropy(logits_bcv: jax.Array, tokens_bc: jax.Array) -> tuple[jax.Array]:
    _, entropy_bc = ratios.logprob_and_entropy(logits_bcv.astype(jnp.float32), tokens_bc, True)
    return (entropy_bc,)


class EntropyControllerState(NamedTuple):
    """State of the entropy-feedback controller.

    Attributes:
        k: float32 scalar, the bounded integral term, in [k_min, k_max]: the upper clip is
            1 + ε_high·(1 + k).
        count: int32 scalar, number of updates applied.
    """

    k: jax.Array
    count: jax.Array


def entropy_controller_init(*, k_init: float = 0.0) -> EntropyControllerState:
    """Initial controller state: k = k_init (default 0: plain clip), count = 0."""
    return EntropyControllerState(k=jnp.asarray(k_init, jnp.float32),
                                  count=jnp.zeros((), jnp.int32))


def entropy_controller_update(
    state: EntropyControllerState,
    entropy: jax.Array,
    *,
    target: float | jax.Array,
    step_size: float | jax.Array,
    k_max: float | jax.Array,
    k_min: float | jax.Array = 0.0,
) -> EntropyControllerState:
    """One controller step: k ← clip(k + δ·sign(H* − Ĥ), k_min, k_max) (MAI-Thinking-1).

    Entropy below target (collapse) raises k, widening the upper clip; above target lowers
    it, down to k_min (0: back to the plain clip; −1 ≤ k_min < 0: below it). Ĥ exactly at
    target leaves k unchanged. δ, k_min and k_max are fractions of ε_high.

    Args:
        state: current EntropyControllerState.
        entropy: Ĥ, float scalar: the measured mean token entropy of the last batch.
        target: H*, the target entropy (nats).
        step_size: δ ≥ 0, relative to ε_high.
        k_max: upper bound of k (ε_high in force ≤ ε_high·(1 + k_max)).
        k_min: lower bound of k in [−1, 0] (ε_high in force ≥ ε_high·(1 + k_min)).

    Returns:
        The new EntropyControllerState.
    """
    entropy = jnp.asarray(entropy, jnp.float32)
    chex.assert_rank(entropy, 0)
    error = jnp.asarray(target, jnp.float32) - entropy  # H* − Ĥ
    step = jnp.asarray(step_size, jnp.float32) * jnp.sign(error)
    k = jnp.clip(state.k + step, jnp.asarray(k_min, jnp.float32), jnp.asarray(k_max, jnp.float32))
    return EntropyControllerState(k=k, count=state.count + 1)


def controlled_upper_clip(state: EntropyControllerState,
                          eps_high: float | jax.Array) -> jax.Array:
    """Upper ratio clip bound 1 + ε_high·(1 + k) (MAI-Thinking-1; SPEC §3.6), float32 scalar.

    With k = 0 this is exactly the plain upper clip 1 + ε_high of
    `losses.clipped_surrogate`, so the controller is neutral until it acts. The trainer
    passes `eps_high = controlled_eps_high(state, eps_high)` to the surrogate.

    Args:
        state: EntropyControllerState.
        eps_high: ε_high of the plain upper bound (≥ 0).

    Returns:
        float32 scalar upper bound of the ratio.
    """
    return 1.0 + controlled_eps_high(state, eps_high)


def controlled_eps_high(state: EntropyControllerState, eps_high: float | jax.Array) -> jax.Array:
    """ε_high·(1 + k): the eps_high to pass to `losses.clipped_surrogate` (ε_high at k = 0)."""
    eps_high = jnp.asarray(eps_high, jnp.float32)
    return eps_high + eps_high * state.k
