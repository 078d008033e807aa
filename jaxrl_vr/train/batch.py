"""The batch builder: a scored round → advantages, behaviour/reference log-probs → RolloutBatch.

Pure given its callables: ``build_batch`` takes the round, the estimator and its state,
and the log-prob functions, and returns the train step's ``RolloutBatch`` with the new
estimator state. The round's host arrays go to the device once, here.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax.numpy as jnp
import numpy as np

from jaxrl_vr.estimators import Estimator
from jaxrl_vr.train.rounds import Round
from jaxrl_vr.train.step import RolloutBatch

# (prompt_tokens_bs, prompt_mask_bs, tokens_bt, mask_bt) -> logp_bt float32 [B, T]
LogprobFn = Callable[[Any, Any, Any, Any], Any]


class BuiltBatch(NamedTuple):
    """What ``build_batch`` returns: the batch, the estimator's new state, and the
    device arrays the metrics need (advantages [P, G], behaviour log-probs [B, T])."""

    batch: RolloutBatch
    estimator_state: Any
    adv_pg: Any
    behaviour_logp_bt: Any


def build_batch(
    round_: Round,
    estimator: Estimator,
    estimator_state: Any,
    *,
    behaviour_logprobs: LogprobFn | None,
    reference_logprobs: LogprobFn | None,
    kl_weight_p: np.ndarray | None = None,
    num_pairs: int = 0,
) -> BuiltBatch:
    """RolloutBatch of one round (SPEC §3: advantages, then log π_old and log π_ref).

    Args:
      round_: the scored round (``valid_pg`` marks real samples; invalid rows carry no
        mask tokens, so they add nothing to any loss term).
      estimator, estimator_state: ``jaxrl_vr.estimators`` pair and its current state; the
        estimator sees shaped rewards and, as ``success_pg``, the verifier scores.
      behaviour_logprobs: log π_old of the current policy (recomputed by the trainer), or
        None when the loss detaches its own forward (``loss.detach_behaviour``): the batch
        then carries the sampler's log-probs, which the loss never reads.
      reference_logprobs: log π_ref of the frozen reference, or None when no KL is
        computed (the batch then carries the behaviour log-probs, never read by the loss).
      kl_weight_p: optional float [P] extra KL weight per prompt (PBA's λ on anchored
        prompts); None = 0.
      num_pairs: rows [0, 2·num_pairs) are (q⁺, q⁻) pairs (for Weighted GRPO).

    Returns:
      BuiltBatch.
    """
    num_p, num_g = round_.valid_pg.shape
    valid_pg = jnp.asarray(round_.valid_pg)
    rewards_pg = jnp.asarray(round_.rewards_b.reshape(num_p, num_g))
    success_pg = jnp.asarray(round_.scores_b.reshape(num_p, num_g))
    adv_pg, estimator_state = estimator.update(rewards_pg, valid_pg, success_pg, estimator_state,
                                                num_pairs=num_pairs)
    adv_pg = jnp.where(valid_pg, adv_pg, 0.0).astype(jnp.float32)

    prompt_tokens_bs = jnp.repeat(jnp.asarray(round_.prompt_tokens_ps, jnp.int32), num_g, axis=0)
    prompt_mask_bs = jnp.repeat(jnp.asarray(round_.prompt_mask_ps, bool), num_g, axis=0)
    tokens_bt = jnp.asarray(round_.tokens_bt, jnp.int32)
    mask_bt = jnp.asarray(round_.mask_bt, bool)
    inputs = (prompt_tokens_bs, prompt_mask_bs, tokens_bt, mask_bt)
    behaviour_logp_bt = (jnp.asarray(round_.sampler_logp_bt, jnp.float32)
                         if behaviour_logprobs is None else behaviour_logprobs(*inputs))
    reference_logp_bt = behaviour_logp_bt if reference_logprobs is None else reference_logprobs(*inputs)
    kl_weight_b = (jnp.zeros(num_p * num_g, jnp.float32) if kl_weight_p is None
                   else jnp.repeat(jnp.asarray(kl_weight_p, jnp.float32), num_g))
    batch = RolloutBatch(
        prompt_tokens_bs=prompt_tokens_bs,
        prompt_mask_bs=prompt_mask_bs,
        tokens_bt=tokens_bt,
        mask_bt=mask_bt,
        adv_b=adv_pg.reshape(-1),
        behaviour_logp_bt=behaviour_logp_bt,
        reference_logp_bt=reference_logp_bt,
        kl_weight_b=kl_weight_b,
    )
    return BuiltBatch(batch, estimator_state, adv_pg, behaviour_logp_bt)
