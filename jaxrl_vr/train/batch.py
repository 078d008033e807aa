"""The batch builder: advantages and behaviour / reference log-probs of a trajectory.

``build_batch`` takes the annotated training batch, the estimator and its state, and the
log-prob functions, and returns the trajectory with ``adv_bt``, ``behaviour_logp_bt`` and
``reference_logp_bt`` filled (device arrays) plus the new estimator state;
``rollout_batch`` gives the rows the update reads. Pure given its callables.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from jaxrl_vr import credit
from jaxrl_vr.estimators import Estimator
from jaxrl_vr.train.step import RolloutBatch
from jaxrl_vr.trajectory import Trajectory

__all__ = ["LogprobFn", "build_batch", "model_inputs", "rollout_batch"]

_step_credit = jax.jit(credit.step_credit)

# (prompt_tokens_bs, prompt_mask_bs, tokens_bt, mask_bt) -> logp_bt float32 [B, T]
LogprobFn = Callable[[Any, Any, Any, Any], Any]


def model_inputs(traj: Trajectory) -> tuple:
    """(prompt_tokens_bs, prompt_mask_bs, tokens_bt, mask_bt) of every row, on the device:
    each prompt repeated for its G samples, the token mask (what the policy attends to)."""
    num_g = traj.group_size
    return (jnp.repeat(jnp.asarray(traj.prompt_tokens_ps, jnp.int32), num_g, axis=0),
            jnp.repeat(jnp.asarray(traj.prompt_mask_ps, bool), num_g, axis=0),
            jnp.asarray(traj.tokens_bt, jnp.int32),
            jnp.asarray(traj.token_mask_bt, bool))


def build_batch(
    traj: Trajectory,
    estimator: Estimator,
    estimator_state: Any,
    *,
    behaviour_logprobs: LogprobFn | None,
    reference_logprobs: LogprobFn | None,
    step_credit_coef_n=None,
) -> tuple[Trajectory, Any]:
    """The batch's advantages, then log π_old and log π_ref (SPEC §3).

    Args:
      traj: the annotated batch (``valid_pg`` marks real samples; invalid rows carry no
        mask tokens, so they add nothing to any loss term).
      estimator, estimator_state: a ``jaxrl_vr.estimators`` pair and its state; it sees
        the shaped rewards and, as ``success_pg``, the verifier scores. Its per-sample
        advantage is broadcast to the sample's policy tokens (``loss_mask_bt``).
      behaviour_logprobs: log π_old of the current policy (recomputed by the trainer), or
        None when the loss detaches its own forward (``loss.detach_behaviour``): the batch
        then carries the sampler's log-probs, which the loss never reads.
      reference_logprobs: log π_ref of the frozen reference, or None when no KL is
        computed (the batch then carries the behaviour log-probs, never read by the loss).
      step_credit_coef_n: float [N] coefficients of the intermediate signals
        (``rl.step_credit``), or None: with them, each model turn's tokens get
        ``credit.step_credit``'s group-relative term on top of the outcome advantage
        (trajectories without turn signals, i.e. single-turn rounds, get none).

    Returns:
      (the trajectory with adv_bt, behaviour_logp_bt and reference_logp_bt, the new
      estimator state).
    """
    valid_pg = jnp.asarray(traj.valid_pg)
    adv_pg, estimator_state = estimator.update(
        jnp.asarray(traj.per_group(traj.rewards_b)), valid_pg, jnp.asarray(traj.per_group(traj.scores_b)),
        estimator_state, paired_p=jnp.asarray(traj.paired_p, bool))
    adv_b = jnp.where(valid_pg, adv_pg, 0.0).astype(jnp.float32).reshape(-1)
    loss_mask_bt = jnp.asarray(traj.loss_mask_bt, bool)
    inputs = model_inputs(traj)
    behaviour_logp_bt = (jnp.asarray(traj.sampler_logp_bt, jnp.float32)
                         if behaviour_logprobs is None else behaviour_logprobs(*inputs))
    reference_logp_bt = behaviour_logp_bt if reference_logprobs is None else reference_logprobs(*inputs)
    adv_bt = jnp.where(loss_mask_bt, adv_b[:, None], 0.0)
    if step_credit_coef_n is not None and traj.signals_bkn is not None:
        adv_bt = adv_bt + _step_credit(jnp.asarray(traj.signals_bkn, jnp.float32), jnp.asarray(traj.turn_bt),
                                       loss_mask_bt, valid_pg, jnp.asarray(step_credit_coef_n, jnp.float32))
    built = traj._replace(adv_bt=adv_bt,
                          behaviour_logp_bt=behaviour_logp_bt, reference_logp_bt=reference_logp_bt)
    return built, estimator_state


def rollout_batch(traj: Trajectory) -> RolloutBatch:
    """The rows of a built trajectory the update reads (device arrays)."""
    if traj.adv_bt is None:
        raise ValueError("the trajectory has no advantages yet; run build_batch first.")
    prompt_tokens_bs, prompt_mask_bs, tokens_bt, mask_bt = model_inputs(traj)
    return RolloutBatch(
        prompt_tokens_bs=prompt_tokens_bs,
        prompt_mask_bs=prompt_mask_bs,
        tokens_bt=tokens_bt,
        mask_bt=mask_bt,
        loss_mask_bt=jnp.asarray(traj.loss_mask_bt, bool),
        adv_bt=jnp.asarray(traj.adv_bt, jnp.float32),
        behaviour_logp_bt=jnp.asarray(traj.behaviour_logp_bt, jnp.float32),
        reference_logp_bt=jnp.asarray(traj.reference_logp_bt, jnp.float32),
        kl_weight_b=jnp.repeat(jnp.asarray(traj.kl_weight_p, jnp.float32), traj.group_size),
    )
