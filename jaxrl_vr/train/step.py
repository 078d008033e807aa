"""The jitted RL train step: clipped policy loss + β·KL ± entropy, exact micro-batching.

Every formula is called from the math modules (SPEC §3): ratios (§3.4), losses (§3.5),
kl and entropy (§3.6). This module only wires them: it runs the policy on
prompt + response, picks the log-ratio the config asks for, sums each loss term's
(numerator, denominator) over micro-batches, divides once (so a micro-batched step
equals the full-batch step exactly), and applies one optax update.

Static choices (ratio type, aggregation mode, which terms are on, micro-batch count) are
a frozen ``LossConfig`` closed over at build time; every value that may change during
training (ε's, dual-clip c, log-ratio bounds, β, entropy coefficient, controller
settings) is an array in ``StepHyper`` so changing it never recompiles.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxrl_vr import entropy as entropy_lib
from jaxrl_vr import kl as kl_lib
from jaxrl_vr import losses
from jaxrl_vr import ratios

RATIO_TYPES = ("token", "sequence", "gspo_token")
AGGREGATIONS = (
    "token_mean",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_sum_norm",
    "seq_mean",
)
KL_KINDS = ("k1", "k2", "k3")
ENTROPY_MODES = ("none", "bonus", "feedback")


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Static structure of the loss (changing any field builds a new step).

    Attributes:
      ratio: "token" (PPO), "sequence" (GSPO, arXiv 2507.18071: one length-normalised
        ratio per response, broadcast to its tokens) or "gspo_token" (value of the
        sequence ratio, gradient of each token's).
      aggregation: loss reduction mode of ``losses.aggregate`` (SPEC §3.5).
      max_len: constant divisor for "seq_mean_token_sum_norm" (Dr.GRPO); None = T.
      dual_clip: enable the dual clip (its c is ``StepHyper.dual_clip``).
      log_ratio_bounds: enable the outer log-ratio truncation (bounds in StepHyper).
      use_kl: add β·KL(π‖π_ref) with estimator ``kl_kind`` (β is ``StepHyper.kl_beta``).
      kl_kind: "k1", "k2" or "k3" (SPEC §3.6).
      kl_aggregation: reduction mode of the KL term.
      entropy: "none"; "bonus" (loss −= coef·H); "feedback" (entropy-feedback
        controller widens the upper clip, SPEC §3.6).
      num_microbatches: micro-batches per optimizer step (gradient accumulation).
      logprob_chunk_size: T-chunk of the chunked LM-head log-softmax (None = one chunk).
      detach_behaviour: use sg(log π_θ) of the step's own forward as log π_old (ratio ≡ 1)
        instead of ``batch.behaviour_logp_bt``. Exact only when each rollout batch gets a
        single optimizer step (then π_old = π_θ), and it saves the separate behaviour
        forward pass; the RL loop rejects it otherwise.
    """

    ratio: str = "token"
    aggregation: str = "token_mean"
    max_len: int | None = None
    dual_clip: bool = False
    log_ratio_bounds: bool = False
    use_kl: bool = False
    kl_kind: str = "k3"
    kl_aggregation: str = "token_mean"
    entropy: str = "none"
    num_microbatches: int = 1
    logprob_chunk_size: int | None = None
    detach_behaviour: bool = False

    def __post_init__(self):
        for name, value, allowed in (
            ("ratio", self.ratio, RATIO_TYPES),
            ("aggregation", self.aggregation, AGGREGATIONS),
            ("kl_aggregation", self.kl_aggregation, AGGREGATIONS),
            ("kl_kind", self.kl_kind, KL_KINDS),
            ("entropy", self.entropy, ENTROPY_MODES),
        ):
            if value not in allowed:
                raise ValueError(f"loss {name}={value!r} is not one of {allowed}.")
        if self.num_microbatches < 1:
            raise ValueError(f"num_microbatches must be >= 1, got {self.num_microbatches}.")


class StepHyper(NamedTuple):
    """Per-step scalar hyperparameters (float32 arrays: changing them never recompiles)."""

    eps_low: jax.Array
    eps_high: jax.Array
    dual_clip: jax.Array
    log_ratio_low: jax.Array
    log_ratio_high: jax.Array
    kl_beta: jax.Array
    entropy_coef: jax.Array
    entropy_target: jax.Array
    entropy_step_size: jax.Array
    entropy_k_max: jax.Array

    @classmethod
    def create(
        cls,
        *,
        eps_low=0.2,
        eps_high=0.2,
        dual_clip=3.0,
        log_ratio_low=-20.0,
        log_ratio_high=20.0,
        kl_beta=0.0,
        entropy_coef=0.0,
        entropy_target=0.5,
        entropy_step_size=0.01,
        entropy_k_max=0.5,
    ) -> "StepHyper":
        """All fields as float32 scalars (the entropy_* ones drive the feedback controller:
        target H* in nats, step δ, bound k_max)."""
        f = lambda v: jnp.asarray(v, jnp.float32)
        return cls(
            f(eps_low),
            f(eps_high),
            f(dual_clip),
            f(log_ratio_low),
            f(log_ratio_high),
            f(kl_beta),
            f(entropy_coef),
            f(entropy_target),
            f(entropy_step_size),
            f(entropy_k_max),
        )


class RolloutBatch(NamedTuple):
    """One (mini)batch of responses for the loss; B responses, S prompt and T response tokens.

    Attributes:
      prompt_tokens_bs: int32 [B, S], left-padded prompts (repeated per sample).
      prompt_mask_bs: bool [B, S].
      tokens_bt: int32 [B, T] response tokens.
      mask_bt: bool [B, T], True for response tokens that count (incl. the stop token).
      adv_b: float32 [B] advantage of each response.
      behaviour_logp_bt: float32 [B, T] log π_old recomputed by the trainer at rollout time.
      reference_logp_bt: float32 [B, T] log π_ref of the frozen reference (zeros if no KL).
      kl_mask_b: bool [B], responses whose tokens get the KL term (PBA anchors; all True
        for a plain reference KL).
    """

    prompt_tokens_bs: jax.Array
    prompt_mask_bs: jax.Array
    tokens_bt: jax.Array
    mask_bt: jax.Array
    adv_b: jax.Array
    behaviour_logp_bt: jax.Array
    reference_logp_bt: jax.Array
    kl_mask_b: jax.Array


class TrainState(NamedTuple):
    """Everything the update changes; a pytree of arrays (checkpointed as is)."""

    step: jax.Array
    params: Any
    opt_state: Any
    controller: Any  # entropy-feedback controller state (an empty tuple when unused)


def split_model(model: nnx.Module):
    """(graphdef, params, rest): trainable nnx.Param state and all other state."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    return graphdef, params, rest


def response_logprobs(
    model,
    prompt_tokens_bs,
    prompt_mask_bs,
    tokens_bt,
    mask_bt,
    *,
    chunk_size=None,
    with_entropy=False,
):
    """log π(response token | prompt, earlier tokens) [B, T] f32 (+ entropy [B, T]).

    Runs the decoder once over prompt ++ response and computes the log-softmax only on the
    response positions, chunked over T through the unembedding (ratios.token_logprobs_from_hidden).
    """
    chex.assert_rank([prompt_tokens_bs, tokens_bt], 2)
    chex.assert_equal_shape([prompt_tokens_bs, prompt_mask_bs])
    chex.assert_equal_shape([tokens_bt, mask_bt])
    num_prompt = prompt_tokens_bs.shape[1]
    num_resp = tokens_bt.shape[1]
    seq_bl = jnp.concatenate([prompt_tokens_bs, tokens_bt], axis=1)
    seq_mask_bl = jnp.concatenate([prompt_mask_bs.astype(bool), mask_bt.astype(bool)], axis=1)
    hidden_bld = model.hidden_states(seq_bl, mask_bt=seq_mask_bl)
    # Position S-1+t predicts response token t.
    hidden_btd = hidden_bld[:, num_prompt - 1 : num_prompt - 1 + num_resp]
    return ratios.token_logprobs_from_hidden(
        hidden_btd,
        model.unembed_matrix(),
        tokens_bt,
        chunk_size=chunk_size,
        with_entropy=with_entropy,
    )


def _upper_eps(cfg: LossConfig, hyper: StepHyper, controller):
    """ε_high in force: the configured one, or the entropy-feedback controller's."""
    if cfg.entropy != "feedback":
        return hyper.eps_high
    return entropy_lib.controlled_eps_high(controller, hyper.eps_high)


def _microbatch_loss_terms(model, mb: RolloutBatch, hyper: StepHyper, controller, cfg: LossConfig):
    """Per-micro-batch (numerator, denominator) of each loss term + metric sums."""
    mask_bt = mb.mask_bt.astype(bool)
    logp_bt, entropy_bt = response_logprobs(
        model,
        mb.prompt_tokens_bs,
        mb.prompt_mask_bs,
        mb.tokens_bt,
        mask_bt,
        chunk_size=cfg.logprob_chunk_size,
        with_entropy=True,
    )
    # Data enters the loss here, stop-gradiented once (SPEC §2). Masked positions may hold
    # anything (inf/NaN from padding): zero them so no NaN reaches the backward pass.
    if cfg.detach_behaviour:  # on-policy single update: π_old = sg(π_θ), ratio ≡ 1
        old_logp_bt = jax.lax.stop_gradient(jnp.where(mask_bt, logp_bt, 0.0))
    else:
        old_logp_bt = jax.lax.stop_gradient(
            jnp.where(mask_bt, mb.behaviour_logp_bt.astype(jnp.float32), 0.0)
        )
    adv_b = jax.lax.stop_gradient(mb.adv_b.astype(jnp.float32))
    if cfg.ratio == "token":
        log_ratio_bt = ratios.token_log_ratio(logp_bt, old_logp_bt)
    elif cfg.ratio == "sequence":
        seq_b = ratios.sequence_log_ratio(logp_bt, old_logp_bt, mask_bt)
        log_ratio_bt = jnp.broadcast_to(seq_b[:, None], logp_bt.shape)
    else:
        log_ratio_bt = ratios.gspo_token_log_ratio(logp_bt, old_logp_bt, mask_bt)
    eps_high = _upper_eps(cfg, hyper, controller)
    loss_bt, info = losses.clipped_surrogate(
        log_ratio_bt,
        adv_b[:, None],
        eps_low=hyper.eps_low,
        eps_high=eps_high,
        dual_clip=hyper.dual_clip if cfg.dual_clip else None,
        log_ratio_bounds=(
            (hyper.log_ratio_low, hyper.log_ratio_high) if cfg.log_ratio_bounds else None
        ),
    )
    loss_bt = jnp.broadcast_to(loss_bt, mask_bt.shape)
    policy_num, _ = losses.aggregate(loss_bt, mask_bt, mode=cfg.aggregation, max_len=cfg.max_len)
    kl_mask_bt = mask_bt & mb.kl_mask_b.astype(bool)[:, None]
    ref_logp_bt = jax.lax.stop_gradient(
        jnp.where(kl_mask_bt, mb.reference_logp_bt.astype(jnp.float32), 0.0)
    )
    kl_bt = kl_lib.estimate(logp_bt, ref_logp_bt, kind=cfg.kl_kind)
    kl_num, _ = losses.aggregate(kl_bt, kl_mask_bt, mode=cfg.kl_aggregation, max_len=cfg.max_len)
    ent_num, _ = losses.aggregate(entropy_bt, mask_bt, mode=cfg.aggregation, max_len=cfg.max_len)
    ratio_bt = info.ratio
    fractions = losses.clip_fractions(info, mask_bt)
    sums = {
        "tokens": jnp.sum(mask_bt.astype(jnp.float32)),
        "clip_low": fractions["clipped_low"][0],
        "clip_high": fractions["clipped_high"][0],
        "clip_dual": fractions["dual_clipped"][0],
        "clip_outer": fractions["truncated"][0],
        "entropy": jnp.sum(jnp.where(mask_bt, entropy_bt, 0.0)),
        "kl_token": jnp.sum(jnp.where(mask_bt, kl_bt, 0.0)),
        "ratio": jnp.sum(jnp.where(mask_bt, ratio_bt, 0.0)),
        "ratio_max": jnp.max(jnp.where(mask_bt, ratio_bt, 0.0)),
    }
    return (policy_num, kl_num, ent_num), sums


def loss_denominators(batch: RolloutBatch, cfg: LossConfig):
    """Denominators of the policy, KL and entropy terms over a whole (mini)batch.

    They depend only on masks, so they are computed once per optimizer step and every
    micro-batch divides its numerator by the full-batch denominator (SPEC §3.5).
    """
    mask_bt = batch.mask_bt.astype(bool)
    zeros_bt = jnp.zeros(mask_bt.shape, jnp.float32)
    _, policy_den = losses.aggregate(zeros_bt, mask_bt, mode=cfg.aggregation, max_len=cfg.max_len)
    kl_mask_bt = mask_bt & batch.kl_mask_b.astype(bool)[:, None]
    _, kl_den = losses.aggregate(zeros_bt, kl_mask_bt, mode=cfg.kl_aggregation, max_len=cfg.max_len)
    return policy_den, kl_den


def _split_microbatches(batch: RolloutBatch, num: int) -> RolloutBatch:
    """[B, ...] -> [M, B/M, ...], micro-batch m = rows {j·M + m} (keeps data sharding)."""
    size = batch.tokens_bt.shape[0]
    if size % num:
        raise ValueError(
            f"batch of {size} responses is not divisible into {num} micro-batches; "
            "choose num_microbatches dividing the minibatch size."
        )

    def split(x):
        x = x.reshape((size // num, num) + x.shape[1:])
        return jnp.swapaxes(x, 0, 1)

    return jax.tree.map(split, batch)


def make_loss_fn(graphdef, cfg: LossConfig):
    """The per-micro-batch objective ``(params, rest, mb, hyper, controller, dens) ->
    (value, metric sums)``.

    ``dens`` are the full-(mini)batch denominators (``loss_denominators``), so summing
    ``value`` (and its gradient) over the micro-batches gives exactly the full-batch
    objective policy_num/policy_den + β·kl_num/kl_den − c·ent_num/policy_den (SPEC §3.5).
    """

    def microbatch_objective(params, rest, mb, hyper, controller, dens):
        model = nnx.merge(graphdef, params, rest)
        (policy_num, kl_num, ent_num), sums = _microbatch_loss_terms(
            model, mb, hyper, controller, cfg
        )
        policy_den, kl_den = dens
        objective = losses.finalize(policy_num, policy_den)
        if cfg.use_kl:
            objective = objective + hyper.kl_beta * losses.finalize(kl_num, kl_den)
        if cfg.entropy == "bonus":
            objective = objective - hyper.entropy_coef * losses.finalize(ent_num, policy_den)
        sums = dict(sums, policy_num=policy_num, kl_num=kl_num, ent_num=ent_num)
        return objective, sums

    return microbatch_objective


def _accumulate(params, rest, batch, hyper, controller, cfg, objective_fn, with_grad):
    """Sum objective (and grads) over micro-batches; returns (loss, grads|None, sums)."""
    dens = loss_denominators(batch, cfg)
    mbs = _split_microbatches(batch, cfg.num_microbatches)
    if with_grad:
        value_and_grad = jax.value_and_grad(objective_fn, has_aux=True)

    def body(carry, mb):
        loss_acc, grad_acc, sums_acc = carry
        if with_grad:
            (loss, sums), grads = value_and_grad(params, rest, mb, hyper, controller, dens)
            grad_acc = jax.tree.map(jnp.add, grad_acc, grads)
        else:
            loss, sums = objective_fn(params, rest, mb, hyper, controller, dens)
        max_keys = {k for k in sums if k.endswith("_max")}
        sums_acc = {
            k: (jnp.maximum(sums_acc[k], v) if k in max_keys else sums_acc[k] + v)
            for k, v in sums.items()
        }
        return (loss_acc + loss, grad_acc, sums_acc), None

    first = jax.tree.map(lambda x: x[0], mbs)
    sums_shape = jax.eval_shape(
        lambda: objective_fn(params, rest, first, hyper, controller, dens)[1]
    )
    zero_sums = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), sums_shape)
    zero_grads = (
        jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params) if with_grad else None
    )
    init = (jnp.zeros((), jnp.float32), zero_grads, zero_sums)
    (loss, grads, sums), _ = jax.lax.scan(body, init, mbs)
    return loss, grads, sums, dens


def make_eval_loss(graphdef, cfg: LossConfig) -> Callable:
    """Jitted loss(params, rest, batch, hyper, controller) -> (loss, grads) (for tests)."""
    objective_fn = make_loss_fn(graphdef, cfg)

    @jax.jit
    def loss_and_grad(params, rest, batch, hyper, controller):
        loss, grads, _, _ = _accumulate(
            params, rest, batch, hyper, controller, cfg, objective_fn, with_grad=True
        )
        return loss, grads

    return loss_and_grad


def init_train_state(
    params, optimizer: optax.GradientTransformation, cfg: LossConfig
) -> TrainState:
    """Fresh TrainState: step 0, optimizer state, controller state when enabled."""
    controller = ()
    if cfg.entropy == "feedback":
        controller = entropy_lib.entropy_controller_init()
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=optimizer.init(params),
        controller=controller,
    )


def make_train_step(
    graphdef,
    rest,
    optimizer: optax.GradientTransformation,
    cfg: LossConfig,
    *,
    donate: bool = False,
) -> Callable:
    """Build the jitted step ``(state, batch, hyper) -> (state, metrics)``.

    One optimizer update on one minibatch: accumulate grads over micro-batches (exact,
    SPEC §3.5), AdamW update (optax; clipping inside the chain), entropy-feedback
    controller update, and a NaN guard: if the loss or grad norm is not finite the
    returned state is the input state and ``metrics["nonfinite"]`` is 1.

    ``rest`` (non-trainable model state) is passed as a traced argument; same shapes and
    dtypes => the step is traced once.
    """
    objective_fn = make_loss_fn(graphdef, cfg)

    def step(state: TrainState, batch: RolloutBatch, hyper: StepHyper, rest):
        loss, grads, sums, (policy_den, kl_den) = _accumulate(
            state.params, rest, batch, hyper, state.controller, cfg, objective_fn, with_grad=True
        )
        grad_norm = optax.tree.norm(grads)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        tokens = sums["tokens"]
        entropy_mean = losses.finalize(sums["entropy"], tokens)
        controller = state.controller
        if cfg.entropy == "feedback":
            controller = entropy_lib.entropy_controller_update(
                controller,
                entropy_mean,
                target=hyper.entropy_target,
                step_size=hyper.entropy_step_size,
                k_max=hyper.entropy_k_max,
            )
        new_state = TrainState(
            step=state.step + 1, params=params, opt_state=opt_state, controller=controller
        )
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        new_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old), new_state, state)
        metrics = {
            "loss": loss,
            "policy_loss": losses.finalize(sums["policy_num"], policy_den),
            "kl": losses.finalize(sums["kl_num"], kl_den),
            "kl_token_mean": losses.finalize(sums["kl_token"], tokens),
            "entropy": entropy_mean,
            "grad_norm": grad_norm,
            "clip_frac_low": losses.finalize(sums["clip_low"], tokens),
            "clip_frac_high": losses.finalize(sums["clip_high"], tokens),
            "clip_frac_dual": losses.finalize(sums["clip_dual"], tokens),
            "clip_frac_outer": losses.finalize(sums["clip_outer"], tokens),
            "ratio_mean": losses.finalize(sums["ratio"], tokens),
            "ratio_max": sums["ratio_max"],
            "trained_tokens": tokens,
            "learning_rate": jnp.asarray(opt_state.hyperparams["learning_rate"], jnp.float32)
            if hasattr(opt_state, "hyperparams")
            else jnp.zeros((), jnp.float32),
            "eps_high": jnp.asarray(_upper_eps(cfg, hyper, state.controller), jnp.float32),
            "nonfinite": (~finite).astype(jnp.float32),
        }
        return new_state, metrics

    jitted = jax.jit(step, donate_argnums=(0,) if donate else ())

    def train_step(state: TrainState, batch: RolloutBatch, hyper: StepHyper):
        return jitted(state, batch, hyper, rest)

    train_step.jitted = jitted  # exposed so tests can assert the trace cache size
    return train_step


def make_logprob_fn(graphdef, *, num_microbatches: int = 1, chunk_size=None) -> Callable:
    """Jitted ``(params, rest, prompt_tokens_bs, prompt_mask_bs, tokens_bt, mask_bt) ->
    (logp_bt, entropy_bt)``, micro-batched with lax.map; used for the behaviour
    (current policy at rollout time) and reference (frozen π_ref) log-probs."""

    @jax.jit
    def logprobs(params, rest, prompt_tokens_bs, prompt_mask_bs, tokens_bt, mask_bt):
        size = tokens_bt.shape[0]
        if size % num_microbatches:
            raise ValueError(
                f"{size} responses not divisible into {num_microbatches} micro-batches."
            )

        def split(x):
            return jnp.swapaxes(
                x.reshape((size // num_microbatches, num_microbatches) + x.shape[1:]), 0, 1
            )

        def one(args):
            model = nnx.merge(graphdef, params, rest)
            return response_logprobs(model, *args, chunk_size=chunk_size, with_entropy=True)

        parts = (prompt_tokens_bs, prompt_mask_bs, tokens_bt, mask_bt)
        logp, ent = jax.lax.map(one, tuple(split(x) for x in parts))

        def merge(x):
            return jnp.swapaxes(x, 0, 1).reshape((size,) + x.shape[2:])

        return merge(logp), merge(ent)

    return logprobs
