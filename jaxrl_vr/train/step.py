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
import numpy as np
import optax
from flax import nnx

from jaxrl_vr import entropy as entropy_lib
from jaxrl_vr import kl as kl_lib
from jaxrl_vr import losses
from jaxrl_vr import ratios
from jaxrl_vr.models.decoder import DecoderLayers, LayerGradSink, default_positions
from jaxrl_vr.models.lora import has_lora

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


# Clip defaults per ratio scale: token ratios (PPO/DAPO clip-higher) and length-normalised
# sequence ratios (GSPO, arXiv 2507.18071, uses ε of order 3e-4 / 4e-4).
DEFAULT_EPS = {"token": (0.2, 0.28), "sequence": (3e-4, 4e-4), "gspo_token": (3e-4, 4e-4)}


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """The loss: its structure (static; changing it builds a new step) and its values
    (``hyper()`` turns them into ``StepHyper`` arrays, so changing them never recompiles).

    Attributes:
      ratio: "token" (PPO), "sequence" (GSPO, arXiv 2507.18071: one length-normalised
        ratio per response, broadcast to its tokens) or "gspo_token" (value of the
        sequence ratio, gradient of each token's).
      aggregation: loss reduction mode of ``losses.aggregate`` (SPEC §3.5).
      max_len: constant divisor for "seq_mean_token_sum_norm" (Dr.GRPO); None = T.
      eps_low, eps_high: clip range [1 − eps_low, 1 + eps_high]; None = the default of the
        ratio's scale (``DEFAULT_EPS``: 0.2 / 0.28 for token ratios, 3e-4 / 4e-4 for GSPO's
        sequence ratios).
      dual_clip: c > 1 of the dual clip (negative advantages), None = off.
      log_ratio_low, log_ratio_high: outer truncation of the log-ratio before the surrogate
        (MAI-style guard), both None = off.
      kl_beta: β of the reference KL(π‖π_ref) on every response token (0 = off). PBA's
        per-prompt anchor weight is separate (``rl.anchor.weight``).
      kl_kind: "k1", "k2" or "k3" (SPEC §3.6).
      kl_aggregation: reduction mode of the KL term.
      entropy: "none"; "bonus" (loss −= entropy_coef·H); "feedback" (the entropy-feedback
        controller widens the upper clip by k, SPEC §3.6).
      entropy_coef: coefficient of the entropy bonus.
      entropy_target, entropy_step_size, entropy_k_min, entropy_k_max: H* (nats), δ, k_min
        and k_max of the feedback controller, whose upper clip is 1 + ε_high·(1 + k): δ and
        the bounds are fractions of ε_high, so they suit token and sequence ratios alike
        (k_min < 0, down to −1, lets it tighten the clip below ε_high while entropy is
        above target; 0 = never below the plain clip).
      num_microbatches: micro-batches per optimizer step (gradient accumulation, exact).
      logprob_chunk_size: T-chunk of the chunked LM-head log-softmax (None = one chunk).
      detach_behaviour: use sg(log π_θ) of the step's own forward as log π_old (ratio ≡ 1)
        instead of ``batch.behaviour_logp_bt``. Exact only when each rollout batch gets a
        single optimizer step (then π_old = π_θ), and it saves the separate behaviour
        forward pass; the RL config rejects it otherwise.
      prompt_group_size: G > 1 when every G consecutive rows of a batch share one prompt
        (the prompt-major [P, G] layout of ``generate`` and the trainer's rounds). The step
        then runs each prompt through the blocks once per batch, not once per response, and
        the responses attend to its keys and values (Prefix Grouper, arXiv 2506.05433). The
        loss and its gradient are the same (the prompt's cotangents from all G responses
        meet before its backward pass); the update does (G − 1)/G less prompt work. 1 = off.
        ``make_train_step``'s wrapper checks the layout; the RL trainer sets it itself.
    """

    ratio: str = "token"
    aggregation: str = "token_mean"
    max_len: int | None = None
    eps_low: float | None = None
    eps_high: float | None = None
    dual_clip: float | None = None
    log_ratio_low: float | None = None
    log_ratio_high: float | None = None
    kl_beta: float = 0.0
    kl_kind: str = "k3"
    kl_aggregation: str = "token_mean"
    entropy: str = "none"
    entropy_coef: float = 0.0
    entropy_target: float = 0.5
    entropy_step_size: float = 0.01
    entropy_k_min: float = 0.0
    entropy_k_max: float = 0.5
    num_microbatches: int = 1
    logprob_chunk_size: int | None = None
    detach_behaviour: bool = False
    prompt_group_size: int = 1

    def __post_init__(self):
        for name, value, allowed in (
            ("ratio", self.ratio, RATIO_TYPES),
            ("aggregation", self.aggregation, AGGREGATIONS),
            ("kl_aggregation", self.kl_aggregation, AGGREGATIONS),
            ("kl_kind", self.kl_kind, KL_KINDS),
            ("entropy", self.entropy, ENTROPY_MODES),
        ):
            if value not in allowed:
                raise ValueError(f"loss.{name}={value!r} is not one of {allowed}.")
        if self.num_microbatches < 1:
            raise ValueError(f"loss.num_microbatches must be >= 1, got {self.num_microbatches}.")
        if self.prompt_group_size < 1:
            raise ValueError(f"loss.prompt_group_size must be >= 1 (1 = off), got {self.prompt_group_size}.")
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise ValueError(f"loss.dual_clip must be > 1 (or None = off), got {self.dual_clip}.")
        if (self.log_ratio_low is None) != (self.log_ratio_high is None):
            raise ValueError("set both loss.log_ratio_low and loss.log_ratio_high, or neither.")
        if self.log_ratio_low is not None and not self.log_ratio_low < 0 < self.log_ratio_high:
            raise ValueError(
                f"need loss.log_ratio_low < 0 < loss.log_ratio_high, got "
                f"{self.log_ratio_low}, {self.log_ratio_high}.")
        for name in ("eps_low", "eps_high", "kl_beta", "entropy_coef"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"loss.{name} must be >= 0, got {value}.")
        if not -1.0 <= self.entropy_k_min <= 0.0 <= self.entropy_k_max or self.entropy_step_size < 0:
            raise ValueError(
                "the entropy controller needs -1 <= loss.entropy_k_min <= 0 <= loss.entropy_k_max and "
                f"loss.entropy_step_size >= 0 (fractions of eps_high), got {self.entropy_k_min}, "
                f"{self.entropy_k_max}, {self.entropy_step_size}.")

    @property
    def reads_response_width(self) -> bool:
        """True when the loss reads the response axis' width T: Dr.GRPO
        (``seq_mean_token_sum_norm``, policy or KL term) without ``max_len`` divides by T, so
        the response columns may not be cut (``train.ragged``, ``microbatch_widths``)."""
        return self.max_len is None and "seq_mean_token_sum_norm" in (self.aggregation, self.kl_aggregation)

    @property
    def clip_eps(self) -> tuple[float, float]:
        """(eps_low, eps_high) in force: the configured values or the ratio's defaults."""
        low, high = DEFAULT_EPS[self.ratio]
        return (low if self.eps_low is None else self.eps_low,
                high if self.eps_high is None else self.eps_high)

    def hyper(self, *, temperature: float = 1.0) -> "StepHyper":
        """The values as ``StepHyper`` arrays (``temperature``: the sampling temperature,
        so training log-probs use the same logits / T as the sampler)."""
        eps_low, eps_high = self.clip_eps
        return StepHyper.create(
            eps_low=eps_low,
            eps_high=eps_high,
            dual_clip=self.dual_clip or 0.0,
            log_ratio_low=self.log_ratio_low or 0.0,
            log_ratio_high=self.log_ratio_high or 0.0,
            kl_beta=self.kl_beta,
            entropy_coef=self.entropy_coef,
            entropy_target=self.entropy_target,
            entropy_step_size=self.entropy_step_size,
            entropy_k_min=self.entropy_k_min,
            entropy_k_max=self.entropy_k_max,
            temperature=temperature,
        )

    def structure(self, *, kl_term: bool | None = None) -> "LossConfig":
        """The static part only (values reset to defaults): the key of compiled steps.

        ``kl_term`` (default: kl_beta > 0) says whether the KL term is in the loss; the RL
        loop turns it on for PBA anchoring too. It is kept as ``kl_beta`` = 1 or 0.
        """
        kl_on = self.kl_beta > 0 if kl_term is None else kl_term
        return dataclasses.replace(
            self,
            eps_low=None,
            eps_high=None,
            dual_clip=None if self.dual_clip is None else 2.0,
            log_ratio_low=None if self.log_ratio_low is None else -1.0,
            log_ratio_high=None if self.log_ratio_high is None else 1.0,
            kl_beta=1.0 if kl_on else 0.0,
            entropy_coef=0.0,
            entropy_target=0.5,
            entropy_step_size=0.01,
            entropy_k_min=0.0,
            entropy_k_max=0.5,
        )

    @property
    def use_kl(self) -> bool:
        """The KL term is in the loss (a structural decision; its β is a StepHyper value)."""
        return self.kl_beta > 0


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
    temperature: jax.Array
    entropy_k_min: jax.Array

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
        temperature=1.0,
        entropy_k_min=0.0,
    ) -> "StepHyper":
        """All fields as float32 scalars (for tests and scripts; a run builds its
        StepHyper from ``LossConfig.hyper``)."""
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
            f(temperature),
            f(entropy_k_min),
        )


class RolloutBatch(NamedTuple):
    """The rows of a trajectory the loss reads; B responses, S prompt and T response tokens
    (``jaxrl_vr.train.batch.rollout_batch`` makes one from a ``Trajectory``).

    Attributes:
      prompt_tokens_bs: int32 [B, S], left-padded prompts (repeated per sample).
      prompt_mask_bs: bool [B, S].
      tokens_bt: int32 [B, T] tokens after the prompt (sampled, or written by an environment).
      mask_bt: bool [B, T], tokens that exist: the policy attends to them.
      loss_mask_bt: bool [B, T], tokens the policy sampled (incl. its stop token): the only
        ones the loss, KL, entropy and their token counts see (SPEC §6b).
      adv_bt: float32 [B, T] advantage of each token (an outcome advantage broadcast).
      behaviour_logp_bt: float32 [B, T] log π_old recomputed by the trainer at rollout time.
      reference_logp_bt: float32 [B, T] log π_ref of the frozen reference (zeros if no KL).
      kl_weight_b: float32 [B] extra KL weight of each response on top of β: λ_PBA on
        responses of anchored prompts, 0 elsewhere (PBA, arXiv 2607.20543, Eq. 4). The KL
        term is Σ (β + w_b)·KL_bt over *all* response tokens / their count, so
        non-anchored tokens add 0 to the numerator and count in the denominator.
    """

    prompt_tokens_bs: jax.Array
    prompt_mask_bs: jax.Array
    tokens_bt: jax.Array
    mask_bt: jax.Array
    loss_mask_bt: jax.Array
    adv_bt: jax.Array
    behaviour_logp_bt: jax.Array
    reference_logp_bt: jax.Array
    kl_weight_b: jax.Array


class TrainState(NamedTuple):
    """Everything the update changes; a pytree of arrays (checkpointed as is)."""

    step: jax.Array
    params: Any
    opt_state: Any
    controller: Any  # entropy-feedback controller state (an empty tuple when unused)


def split_model(model: nnx.Module):
    """(graphdef, params, rest): the trainable state and all other state.

    Trainable: every nnx.Param, or only the LoRA adapters (nnx.LoRAParam) when the model has
    any (``jaxrl_vr.models.lora``). The base weights then sit in ``rest``: never
    differentiated (no weight gradient is formed for them), no optimizer state, not in the
    train state's checkpoints.
    """
    trainable = nnx.LoRAParam if has_lora(model) else nnx.Param
    graphdef, params, rest = nnx.split(model, trainable, ...)
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
    temperature=1.0,
    prefix=None,
    unembed=None,
):
    """log π(response token | prompt, earlier tokens) [B, T] f32 (+ entropy [B, T]).

    Runs the decoder once over prompt ++ response and computes the log-softmax only on the
    response positions, chunked over T through the unembedding (ratios.token_logprobs_from_hidden).
    ``temperature`` scales the logits as the sampler does (logits / T), so importance ratios
    against sampler-time log-probs compare like with like.

    ``prefix`` (``shared_prompt_prefix`` of each row's prompt, gathered per row) replaces the
    prompt's forward: only the last prompt token (it predicts response token 0) and the
    response run through the blocks, attending to the prefix's keys and values. Same
    log-probs; the prompts must be left-padded (their last column real).

    ``unembed`` ([D, V], default ``model.unembed_matrix()``) is the output projection to use:
    the update passes one it formed before its micro-batch loop (``step_tables``).
    """
    chex.assert_rank([prompt_tokens_bs, tokens_bt], 2)
    chex.assert_equal_shape([prompt_tokens_bs, prompt_mask_bs])
    chex.assert_equal_shape([tokens_bt, mask_bt])
    num_prompt = prompt_tokens_bs.shape[1]
    num_resp = tokens_bt.shape[1]
    seq_bl = jnp.concatenate([prompt_tokens_bs, tokens_bt], axis=1)
    seq_mask_bl = jnp.concatenate([prompt_mask_bs.astype(bool), mask_bt.astype(bool)], axis=1)
    if prefix is None:
        hidden_bld = model.hidden_states(seq_bl, mask_bt=seq_mask_bl)
        # Position S-1+t predicts response token t.
        hidden_btd = hidden_bld[:, num_prompt - 1 : num_prompt - 1 + num_resp]
    else:
        # The same positions S-1 .. S-1+T-1 of the sequence, on top of the prompt's prefix.
        window = slice(num_prompt - 1, num_prompt - 1 + num_resp)
        hidden_btd = model.hidden_states(
            seq_bl[:, window], positions_bt=default_positions(seq_mask_bl)[:, window],
            mask_bt=seq_mask_bl[:, window], prefix=prefix,
            prefix_mask_bs=prompt_mask_bs[:, : num_prompt - 1].astype(bool))
    return ratios.token_logprobs_from_hidden(
        hidden_btd,
        (model.unembed_matrix() if unembed is None else unembed) / jnp.asarray(temperature, jnp.float32),
        tokens_bt,
        chunk_size=chunk_size,
        with_entropy=with_entropy,
    )


def _check_group_divides(rows: int, group_size: int) -> None:
    if rows % group_size:
        raise ValueError(f"loss.prompt_group_size={group_size} does not divide the batch of {rows} rows; "
                         "set it to the samples per prompt G, or 1 to run every row's prompt.")


def shared_prompt_prefix(model, prompt_tokens_bs, prompt_mask_bs, group_size: int):
    """Keys and values of the first S − 1 tokens of each group's prompt, one row per group of
    ``group_size`` consecutive rows (``response_logprobs(prefix=)`` after ``.rows(b // G)``):
    the part of the sequence that every response to the prompt shares."""
    _check_group_divides(prompt_tokens_bs.shape[0], group_size)
    tokens_ps = prompt_tokens_bs[::group_size]
    mask_ps = prompt_mask_bs[::group_size].astype(bool)
    positions_ps = default_positions(mask_ps)
    return model.prefix_kv(tokens_ps[:, :-1], positions_bs=positions_ps[:, :-1], mask_bs=mask_ps[:, :-1])


def check_prompt_groups(batch: "RolloutBatch", group_size: int) -> None:
    """Raises ValueError unless every ``group_size`` consecutive rows share one left-padded
    prompt (what ``LossConfig.prompt_group_size`` promises the step). Skipped for traced or
    not fully addressable arrays (inside jit, multi-process meshes)."""
    arrays = (batch.prompt_tokens_bs, batch.prompt_mask_bs)
    if any(isinstance(x, jax.core.Tracer) or not getattr(x, "is_fully_addressable", True) for x in arrays):
        return
    tokens_bs, mask_bs = (np.asarray(x) for x in arrays)
    rows = tokens_bs.shape[0]
    _check_group_divides(rows, group_size)
    for name, x in (("prompt_tokens_bs", np.where(mask_bs, tokens_bs, 0)), ("prompt_mask_bs", mask_bs)):
        grouped = x.reshape((rows // group_size, group_size) + x.shape[1:])
        bad = np.flatnonzero(~(grouped == grouped[:, :1]).all(axis=(1, 2)))
        if bad.size:
            raise ValueError(
                f"loss.prompt_group_size={group_size}, but rows {int(bad[0]) * group_size}.."
                f"{int(bad[0]) * group_size + group_size - 1} do not share one prompt ({name} differs). "
                "Keep each prompt's G responses in consecutive rows (generate's prompt-major order) "
                "or set loss.prompt_group_size=1.")
    if mask_bs.shape[1] and not mask_bs[:, -1].all():
        raise ValueError("loss.prompt_group_size > 1 needs left-padded prompts (last column real); "
                         f"rows {np.flatnonzero(~mask_bs[:, -1])[:8].tolist()} end in padding.")


def _upper_eps(cfg: LossConfig, hyper: StepHyper, controller):
    """ε_high in force: the configured one, or the entropy-feedback controller's."""
    if cfg.entropy != "feedback":
        return hyper.eps_high
    return entropy_lib.controlled_eps_high(controller, hyper.eps_high)


def _microbatch_loss_terms(model, mb: RolloutBatch, hyper: StepHyper, controller, cfg: LossConfig,
                           prefix=None, unembed=None):
    """Per-micro-batch (numerator, denominator) of each loss term + metric sums."""
    mask_bt = mb.loss_mask_bt.astype(bool)  # the policy's own tokens: what every term counts
    logp_bt, entropy_bt = response_logprobs(
        model,
        mb.prompt_tokens_bs,
        mb.prompt_mask_bs,
        mb.tokens_bt,
        mb.mask_bt.astype(bool),
        chunk_size=cfg.logprob_chunk_size,
        with_entropy=True,
        temperature=hyper.temperature,
        prefix=prefix,
        unembed=unembed,
    )
    # Data enters the loss here, stop-gradiented once (SPEC §2). Masked positions may hold
    # anything (inf/NaN from padding): zero them so no NaN reaches the backward pass.
    if cfg.detach_behaviour:  # on-policy single update: π_old = sg(π_θ), ratio ≡ 1
        old_logp_bt = jax.lax.stop_gradient(jnp.where(mask_bt, logp_bt, 0.0))
    else:
        old_logp_bt = jax.lax.stop_gradient(
            jnp.where(mask_bt, mb.behaviour_logp_bt.astype(jnp.float32), 0.0)
        )
    adv_bt = jax.lax.stop_gradient(jnp.where(mask_bt, mb.adv_bt.astype(jnp.float32), 0.0))
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
        adv_bt,
        eps_low=hyper.eps_low,
        eps_high=eps_high,
        dual_clip=hyper.dual_clip if cfg.dual_clip is not None else None,
        log_ratio_bounds=(
            (hyper.log_ratio_low, hyper.log_ratio_high) if cfg.log_ratio_low is not None else None
        ),
    )
    loss_bt = jnp.broadcast_to(loss_bt, mask_bt.shape)
    policy_num, _ = losses.aggregate(loss_bt, mask_bt, mode=cfg.aggregation, max_len=cfg.max_len)
    ref_logp_bt = jax.lax.stop_gradient(
        jnp.where(mask_bt, mb.reference_logp_bt.astype(jnp.float32), 0.0)
    )
    kl_bt = jnp.where(mask_bt, kl_lib.estimate(logp_bt, ref_logp_bt, kind=cfg.kl_kind), 0.0)
    kl_weight_b = jax.lax.stop_gradient(mb.kl_weight_b.astype(jnp.float32))
    kl_coef_bt = jnp.broadcast_to((hyper.kl_beta + kl_weight_b)[:, None], mask_bt.shape)
    kl_num, _ = losses.aggregate(kl_coef_bt * kl_bt, mask_bt, mode=cfg.kl_aggregation,
                                 max_len=cfg.max_len)
    kl_plain_num, _ = losses.aggregate(kl_bt, mask_bt, mode=cfg.kl_aggregation,
                                       max_len=cfg.max_len)
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
        "kl_plain_num": kl_plain_num,
    }
    return (policy_num, kl_num, ent_num), sums


def loss_denominators(batch: RolloutBatch, cfg: LossConfig):
    """Denominators of the policy, KL and entropy terms over a whole (mini)batch.

    They depend only on masks, so they are computed once per optimizer step and every
    micro-batch divides its numerator by the full-batch denominator (SPEC §3.5).
    """
    mask_bt = batch.loss_mask_bt.astype(bool)
    zeros_bt = jnp.zeros(mask_bt.shape, jnp.float32)
    _, policy_den = losses.aggregate(zeros_bt, mask_bt, mode=cfg.aggregation, max_len=cfg.max_len)
    _, kl_den = losses.aggregate(zeros_bt, mask_bt, mode=cfg.kl_aggregation, max_len=cfg.max_len)
    return policy_den, kl_den


def _split_microbatches(batch, num: int):
    """[B, ...] -> [M, B/M, ...], micro-batch m = rows {j·M + m} (keeps data sharding)."""
    size = jax.tree.leaves(batch)[0].shape[0]
    if size % num:
        raise ValueError(
            f"batch of {size} responses is not divisible into {num} micro-batches; "
            "choose num_microbatches dividing the minibatch size."
        )

    def split(x):
        x = x.reshape((size // num, num) + x.shape[1:])
        return jnp.swapaxes(x, 0, 1)

    return jax.tree.map(split, batch)


MIN_MICROBATCH_WIDTH = 64


def microbatch_widths(num_columns: int, cfg: LossConfig) -> tuple[int, ...]:
    """The response widths `_accumulate` runs micro-batches at: MIN_MICROBATCH_WIDTH × 2^k
    below `num_columns`, then `num_columns`; () (every micro-batch at full width, strided rows)
    for one micro-batch, for <= MIN_MICROBATCH_WIDTH columns, or when the loss reads the width."""
    if cfg.num_microbatches < 2 or num_columns <= MIN_MICROBATCH_WIDTH or cfg.reads_response_width:
        return ()
    widths, width = [], MIN_MICROBATCH_WIDTH
    while width < num_columns:
        widths.append(width)
        width *= 2
    return tuple(widths) + (num_columns,)


def _length_sorted_microbatches(batch, index_b, num: int, widths: tuple[int, ...]):
    """[B, ...] -> [M, B/M, ...] of the rows sorted by response length (micro-batch m = the
    m-th B/M shortest), with each micro-batch's width bucket: int32 [M] index into `widths`
    of the narrowest width holding its longest response."""
    size, num_columns = batch.tokens_bt.shape
    if size % num:
        _split_microbatches(batch, num)  # raises its error
    used_bt = batch.mask_bt.astype(bool) | batch.loss_mask_bt.astype(bool)
    end_b = jnp.max(jnp.where(used_bt, jnp.arange(1, num_columns + 1, dtype=jnp.int32)[None, :], 0), axis=1)
    order_b = jnp.argsort(end_b, stable=True)
    split = lambda x: jnp.take(x, order_b, axis=0).reshape((num, size // num) + x.shape[1:])  # noqa: E731
    end_m = jnp.max(split(end_b), axis=1)
    bucket_m = jnp.sum(end_m[:, None] > jnp.asarray(widths, jnp.int32)[None, :], axis=1, dtype=jnp.int32)
    return jax.tree.map(split, batch), split(index_b), jnp.minimum(bucket_m, len(widths) - 1)


def _narrowed(mb, width: int):
    """A micro-batch's [b, T] fields cut to `width` columns."""
    return mb._replace(**{name: getattr(mb, name)[:, :width] for name in type(mb)._fields if name.endswith("_bt")})


def make_loss_fn(graphdef, cfg: LossConfig):
    """The per-micro-batch objective ``(params, rest, mb, hyper, controller, dens) ->
    (value, metric sums)``.

    ``dens`` are the full-(mini)batch denominators (``loss_denominators``), so summing
    ``value`` (and its gradient) over the micro-batches gives exactly the full-batch
    objective policy_num/policy_den + kl_num/kl_den − c·ent_num/policy_den (SPEC §3.5), where
    kl_num = Σ (β + w_b)·KL_bt carries the global β and PBA's per-response weights.

    ``tables`` (``step_tables``) are what the micro-batches share, formed once per step: the
    prompt prefixes (``"prefix"``, with ``cfg.prompt_group_size`` > 1, one row per prompt,
    read through each row's ``prompt_index_b``) and a tied model's unembedding
    (``"unembed"``).
    """

    def microbatch_objective(params, rest, mb, hyper, controller, dens, tables=None, prompt_index_b=None,
                             layer_grads=None):
        model = nnx.merge(graphdef, params, rest)
        if layer_grads:  # `_accumulate`'s gradient sink: returned as sums["layer_grads"]
            model.layers.grad_sink = LayerGradSink(layer_grads)
        tables = tables or {}
        prefix = tables["prefix"].rows(prompt_index_b) if "prefix" in tables else None
        (policy_num, kl_num, ent_num), sums = _microbatch_loss_terms(
            model, mb, hyper, controller, cfg, prefix, tables.get("unembed")
        )
        if layer_grads is not None:
            sums = dict(sums, layer_grads=model.layers.grad_sink.acc if layer_grads else layer_grads)
        policy_den, kl_den = dens
        objective = losses.finalize(policy_num, policy_den)
        if cfg.use_kl:
            objective = objective + losses.finalize(kl_num, kl_den)
        if cfg.entropy == "bonus":
            objective = objective - hyper.entropy_coef * losses.finalize(ent_num, policy_den)
        sums = dict(sums, policy_num=policy_num, kl_num=kl_num, ent_num=ent_num)
        return objective, sums

    return microbatch_objective


def runtime_zero(anchor: jax.Array) -> jax.Array:
    """A float32 0 that XLA cannot treat as a constant: ``0 * anchor`` (finite `anchor`).

    The gradient accumulators start from it. Zeros broadcast from a constant are merged by
    XLA with every other constant zero of the same shape: before the layer gradient sink, the
    layer stacks that the prefix's backward pass (after the micro-batch loop) filled, so one
    buffer of each shape lived from the accumulators' start to that backward pass: 516 MiB
    for SmolLM2-135M through the activation peak (docs/performance.md at 9f22ea1, "perf24").
    With the sink that backward pass forms no stacks, and on a Decoder the two kinds of zeros
    give the same temporaries (tests/test_host_memory.py); other models' accumulators still
    start from it. XLA keeps ``x * 0`` for floats (NaN and inf times 0 are NaN), so these zeros
    stay apart.
    """
    return jnp.zeros((), jnp.float32) * jnp.asarray(anchor, jnp.float32)


def step_tables(model, batch: "RolloutBatch", cfg: LossConfig) -> dict:
    """What every micro-batch of a step reads and none changes, formed once per step.

    - ``"prefix"`` (``cfg.prompt_group_size`` G > 1): each prompt's prefix keys and values
      (``shared_prompt_prefix``), so a prompt runs once per group instead of once per row.
    - ``"unembed"`` (tied embeddings): the [D, V] unembedding, ``embed.T``. Each micro-batch's
      LM-head weight gradient then adds into a [D, V] accumulator in the layout the dot
      produces it in, and is transposed into the [V, D] embedding's gradient once per step,
      not once per micro-batch (a strided 113 MB transpose-and-add, 57 ms each on SmolLM2-135M
      on a Zen 5 EPYC; docs/performance.md at 9f22ea1, "perf27").

    `_accumulate` differentiates the micro-batch objective with respect to these tables and
    sends the summed cotangents back through one VJP of this function.
    """
    tables = {}
    if cfg.prompt_group_size > 1:
        tables["prefix"] = shared_prompt_prefix(model, batch.prompt_tokens_bs, batch.prompt_mask_bs,
                                                cfg.prompt_group_size)
    # The config's flag, not `lm_head is None`: the trainer also takes duck-typed models
    # (hidden_states + unembed_matrix) without a config, which have nothing to tie.
    if getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        tables["unembed"] = model.unembed_matrix()
    return tables


class _LayerSink(NamedTuple):
    """The update's split of the trainable parameters around a `LayerGradSink`: ``layers``
    (nnx.State of the stacked layer leaves, gradients through the sink) and ``other`` (the
    rest, differentiated as usual)."""

    layers: Any
    other: Any
    names: tuple[str, ...]  # the stacked leaves, in `layers`' flattening order
    treedef: Any

    def params(self, other):
        return nnx.merge_state(self.layers, other)

    def zeros(self, zero: jax.Array) -> dict[str, jax.Array]:
        leaves = jax.tree.leaves(self.layers)
        return {name: jnp.full(leaf.shape, zero, jnp.float32) for name, leaf in zip(self.names, leaves)}

    def grads(self, other_grads, layer_grads: dict[str, jax.Array]):
        """The parameters' gradient (their tree) from the other gradients and the sink's."""
        layers = jax.tree_util.tree_unflatten(self.treedef, [layer_grads[name] for name in self.names])
        return nnx.merge_state(layers, other_grads)


def _no_layer_sink(params) -> _LayerSink:
    """The split with nothing in the sink: every parameter takes its gradient as usual."""
    layers = nnx.State({})
    return _LayerSink(layers, params, (), jax.tree_util.tree_structure(layers))


def _layer_sink(graphdef, params, rest) -> _LayerSink:
    """The split of ``params`` around the gradient sink: the stacked layer leaves of a
    `Decoder` (the full model's, or LoRA's adapters) go through it; other models (the
    tests' toy policies) get `_no_layer_sink`."""
    if "layers" not in params or not isinstance(getattr(nnx.merge(graphdef, params, rest), "layers", None),
                                                 DecoderLayers):
        return _no_layer_sink(params)
    layers, other = nnx.split_state(params, nnx.PathContains("layers"), ...)
    leaves, treedef = jax.tree_util.tree_flatten(layers)
    names = tuple(sorted(params["layers"].keys()))
    if len(names) != len(leaves):
        return _no_layer_sink(params)
    return _LayerSink(layers, other, names, treedef)


def _accumulate(params, rest, batch, hyper, controller, cfg, objective_fn, with_grad, graphdef):
    """Sum objective (and grads) over micro-batches; returns (loss, grads|None, sums, dens).

    With several micro-batches over more than MIN_MICROBATCH_WIDTH response columns
    (`microbatch_widths`), the rows are sorted by response length and micro-batch m takes
    the m-th B/M shortest, run at the narrowest width bucket holding them (one loop per
    bucket over its run of micro-batches, so one compiled step serves every mix of lengths):
    a batch of short answers with a few long ones pays the long width only in the
    micro-batches that hold them. The columns cut are masked in every row they are cut from, so every sum is the same
    (up to float summation order); the denominators stay the full batch's.

    The step's shared tables (``step_tables``: prompt prefixes, a tied unembedding) are
    formed before the micro-batches (``jax.vjp``); each micro-batch's gradient with respect
    to them is summed, and one backward pass through them adds their share to the
    parameters' gradient.

    A `Decoder`'s stacked layer parameters take their gradient through a `LayerGradSink`:
    one float32 accumulator per stacked leaf rides each micro-batch's layer scan, seeded as
    the cotangent of the sink with the sum so far, and each layer's backward pass adds its
    gradient into its slice in place. A micro-batch then forms no stacked gradient of its own
    to add to the accumulator: one [L, ...] buffer less (1.5 GiB for the 0.4B model) and one
    pass less over it per micro-batch. The other parameters' gradients (embedding, final
    norm, LM head; every parameter of a model without `DecoderLayers`) are summed as usual.
    """
    dens = loss_denominators(batch, cfg)
    group = cfg.prompt_group_size
    zero = runtime_zero(dens[0])
    sink = _layer_sink(graphdef, params, rest)

    def tables_fn(other, layer_grads):  # a shared prefix's layer scan feeds the sink too
        model = nnx.merge(graphdef, sink.params(other), rest)
        if layer_grads:
            model.layers.grad_sink = LayerGradSink(layer_grads)
        return step_tables(model, batch, cfg), model.layers.grad_sink.acc if layer_grads else layer_grads

    layer_zeros = sink.zeros(zero)
    if with_grad:
        (tables, _), tables_vjp = jax.vjp(tables_fn, sink.other, layer_zeros)
    else:
        tables, _ = tables_fn(sink.other, {})
    index_b = jnp.arange(batch.tokens_bt.shape[0], dtype=jnp.int32) // group
    widths = microbatch_widths(batch.tokens_bt.shape[1], cfg)
    if widths:  # Length-sorted micro-batches, each run at its own width bucket (one loop per bucket).
        xs = _length_sorted_microbatches(batch, index_b, cfg.num_microbatches, widths)
    else:
        xs = (_split_microbatches(batch, cfg.num_microbatches), _split_microbatches(index_b, cfg.num_microbatches),
              jnp.zeros((cfg.num_microbatches,), jnp.int32))

    def evaluate(mb, index, layer_grads):
        """((loss, sums), (grads of the other parameters, grads of tables) | None, layer_grads)."""
        if not with_grad:
            return objective_fn(params, rest, mb, hyper, controller, dens, tables, index), None, layer_grads

        def sunk(other, tables, layer_grads):
            loss, sums = objective_fn(sink.params(other), rest, mb, hyper, controller, dens, tables, index,
                                      layer_grads=layer_grads)
            sums = dict(sums)
            return (loss, sums.pop("layer_grads")), sums

        (loss, _), vjp_fn, sums = jax.vjp(sunk, sink.other, tables, layer_grads, has_aux=True)
        other_grads, table_grads, layer_grads = vjp_fn((jnp.ones_like(loss), layer_grads))
        return (loss, sums), (other_grads, table_grads), layer_grads

    def add_microbatch(carry, mb, index, width):
        loss_acc, grad_acc, layer_grads, sums_acc = carry
        (loss, sums), grads, layer_grads = evaluate(mb if width is None else _narrowed(mb, width), index,
                                                    layer_grads)
        if with_grad:
            grad_acc = jax.tree.map(jnp.add, grad_acc, grads)
        max_keys = {k for k in sums if k.endswith("_max")}
        sums_acc = {
            k: (jnp.maximum(sums_acc[k], v) if k in max_keys else sums_acc[k] + v)
            for k, v in sums.items()
        }
        return loss_acc + loss, grad_acc, layer_grads, sums_acc

    first, first_index, _ = jax.tree.map(lambda x: x[0], xs)
    sums_shape = jax.eval_shape(
        lambda: objective_fn(params, rest, first, hyper, controller, dens, tables, first_index)[1]
    )
    zero_sums = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), sums_shape)
    zeros_like = lambda tree: jax.tree.map(lambda p: jnp.full(p.shape, zero, jnp.float32), tree)  # noqa: E731
    zero_grads = (zeros_like(sink.other), zeros_like(tables)) if with_grad else None
    init = (jnp.zeros((), jnp.float32), zero_grads, layer_zeros if with_grad else None, zero_sums)
    if widths:
        # The micro-batches are sorted by length, so each width bucket holds a contiguous
        # run of them: one loop per bucket, in order. (A `lax.switch` per micro-batch made
        # XLA copy the gradient sink into and out of the taken branch.)
        carry, bucket_m = init, xs[2]
        for i, width in enumerate(widths):
            def run(m, carry, width=width):
                mb, index, _ = jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, m, keepdims=False), xs)
                return add_microbatch(carry, mb, index, width)

            carry = jax.lax.fori_loop(jnp.sum(bucket_m < i), jnp.sum(bucket_m <= i), run, carry)
    else:
        carry, _ = jax.lax.scan(lambda carry, x: (add_microbatch(carry, x[0], x[1], None), None), init, xs)
    loss, grads, layer_grads, sums = carry
    if with_grad:
        other_grads, table_grads = grads
        if tables:  # a shared prefix's layer scan adds its share to the sink in place
            table_cts = jax.tree.map(lambda g, x: g.astype(x.dtype), table_grads, tables)
            through_tables, layer_grads = tables_vjp((table_cts, layer_grads))
            other_grads = jax.tree.map(lambda a, b: a + b.astype(a.dtype), other_grads, through_tables)
        grads = sink.grads(other_grads, layer_grads)
    return loss, grads, sums, dens


def make_eval_loss(graphdef, cfg: LossConfig) -> Callable:
    """Jitted loss(params, rest, batch, hyper, controller) -> (loss, grads) (for tests)."""
    objective_fn = make_loss_fn(graphdef, cfg)

    @jax.jit
    def loss_and_grad(params, rest, batch, hyper, controller):
        loss, grads, _, _ = _accumulate(
            params, rest, batch, hyper, controller, cfg, objective_fn, with_grad=True,
            graphdef=graphdef,
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


def guarded_optimizer_update(optimizer: optax.GradientTransformation, finite: jax.Array, grads, params,
                             opt_state) -> tuple[Any, Any]:
    """(new params, new optimizer state) when `finite`, else the inputs unchanged (NaN guard).

    A `lax.cond`, not a select between the new and the old state: under the select, with the
    state donated, each AdamW moment was read by the select and by the parameter update
    while its new value was written in place, so XLA copied every moment at the start of
    the step (2 × the parameters: 1,026 MiB for SmolLM2-135M, written and read once per
    step). Inside the taken branch the moments are updated in place without copies
    (docs/performance.md at 9f22ea1, "perf24"). A non-finite step also skips the optimizer's arithmetic.

    Both branches of a cond must return the same types. An optimizer whose update changes
    a state leaf's dtype (optax's own keep theirs; a custom one might, e.g. bf16 moments
    updated in float32) gets the kept state cast to the updated dtypes, as the select used
    to promote them; a new tree structure or shape is an error that names the leaf.
    """
    operands = (grads, params, opt_state)

    def update(operands):
        grads, params, opt_state = operands
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    updated = jax.eval_shape(update, operands)  # Trace-time only: the types of the new state.

    def keep(operands):
        _, params, opt_state = operands
        return _cast_like((params, opt_state), updated)

    return jax.lax.cond(finite, update, keep, operands)


def _cast_like(tree, like):
    """`tree`'s arrays in the dtypes of `like`'s (same structure and shapes, else ValueError)."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    like_leaves, like_treedef = jax.tree_util.tree_flatten(like)
    if treedef != like_treedef:
        raise ValueError("The optimizer's update returned a state of another structure than its input: "
                         f"{like_treedef} instead of {treedef}. The NaN guard keeps the old state on a "
                         "non-finite step, so the update must keep the state's structure.")
    cast = []
    for (path, leaf), target in zip(leaves, like_leaves):
        if jnp.shape(leaf) != target.shape:
            raise ValueError(f"The optimizer's update changed the shape of {jax.tree_util.keystr(path)} from "
                             f"{jnp.shape(leaf)} to {target.shape}; the NaN guard needs the state's shapes kept.")
        cast.append(jnp.asarray(leaf, dtype=target.dtype))  # no convert where the dtype is already right
    return jax.tree_util.tree_unflatten(treedef, cast)


def make_train_step(
    graphdef,
    rest,
    optimizer: optax.GradientTransformation,
    cfg: LossConfig,
    *,
    donate: bool = False,
    state_sharding: Any = None,
) -> Callable:
    """Build the jitted step ``(state, batch, hyper) -> (state, metrics)``.

    One optimizer update on one minibatch: accumulate grads over micro-batches (exact,
    SPEC §3.5), AdamW update (optax; clipping inside the chain), entropy-feedback
    controller update, and a NaN guard: if the loss or grad norm is not finite the
    returned state is the input state and ``metrics["nonfinite"]`` is 1.

    ``rest`` (non-trainable model state) is passed as a traced argument; same shapes and
    dtypes => the step is traced once. ``state_sharding`` (a TrainState of NamedShardings,
    ``jaxrl_vr.parallel.train_state_shardings``) keeps the updated params and optimizer
    state sharded as they came in (FSDP / tensor parallel on a mesh).
    """
    objective_fn = make_loss_fn(graphdef, cfg)

    def step(state: TrainState, batch: RolloutBatch, hyper: StepHyper, rest):
        loss, grads, sums, (policy_den, kl_den) = _accumulate(
            state.params, rest, batch, hyper, state.controller, cfg, objective_fn, with_grad=True,
            graphdef=graphdef,
        )
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        params, opt_state = guarded_optimizer_update(optimizer, finite, grads, state.params, state.opt_state)
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
                k_min=hyper.entropy_k_min,
            )
        step_count, controller = jax.tree.map(lambda new, old: jnp.where(finite, new, old),
                                              (state.step + 1, controller), (state.step, state.controller))
        new_state = TrainState(step=step_count, params=params, opt_state=opt_state, controller=controller)
        if state_sharding is not None:
            new_state = jax.lax.with_sharding_constraint(new_state, state_sharding)
        metrics = {
            "loss": loss,
            "policy_loss": losses.finalize(sums["policy_num"], policy_den),
            "kl": losses.finalize(sums["kl_plain_num"], kl_den),
            "kl_loss": losses.finalize(sums["kl_num"], kl_den),
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
        if cfg.prompt_group_size > 1:
            check_prompt_groups(batch, cfg.prompt_group_size)
        return jitted(state, batch, hyper, rest)

    train_step.jitted = jitted  # exposed so tests can assert the trace cache size
    return train_step


def make_logprob_fn(graphdef, *, num_microbatches: int = 1, chunk_size=None,
                    prompt_group_size: int = 1) -> Callable:
    """Jitted ``(params, rest, prompt_tokens_bs, prompt_mask_bs, tokens_bt, mask_bt,
    temperature=1.0) -> (logp_bt, entropy_bt)``, micro-batched with lax.map; used for the behaviour
    (current policy at rollout time) and reference (frozen π_ref) log-probs.

    ``prompt_group_size`` = G > 1: every G consecutive rows share one left-padded prompt (the
    trainer's prompt-major rows), whose prefix then runs once (``shared_prompt_prefix``).
    """
    if prompt_group_size < 1:
        raise ValueError(f"prompt_group_size must be >= 1 (1 = off), got {prompt_group_size}.")

    @jax.jit
    def logprobs(params, rest, prompt_tokens_bs, prompt_mask_bs, tokens_bt, mask_bt,
                 temperature=1.0):
        size = tokens_bt.shape[0]
        model = nnx.merge(graphdef, params, rest)
        prefix_table = None
        if prompt_group_size > 1:
            prefix_table = shared_prompt_prefix(model, prompt_tokens_bs, prompt_mask_bs, prompt_group_size)

        def one(args):
            *parts, index_b = args
            prefix = None if prefix_table is None else prefix_table.rows(index_b)
            return response_logprobs(model, *parts, chunk_size=chunk_size, with_entropy=True,
                                     temperature=temperature, prefix=prefix)

        index_b = jnp.arange(size, dtype=jnp.int32) // prompt_group_size
        parts = (prompt_tokens_bs, prompt_mask_bs, tokens_bt, mask_bt, index_b)
        logp, ent = jax.lax.map(one, _split_microbatches(parts, num_microbatches))

        def merge(x):
            return jnp.swapaxes(x, 0, 1).reshape((size,) + x.shape[2:])

        return merge(logp), merge(ent)

    return logprobs
