"""Supervised warm start: teacher-forced cross-entropy on (prompt, target) pairs.

Used to build the base policy of the embedded default (a tiny char-level decoder that is
stopped while still imperfect, so its per-prompt pass rates span all four SPEC §3.6
regimes). The loss is −mean over target tokens of log π(target token), computed with the
same chunked log-softmax as the RL step (``step.response_logprobs``) and reduced with
``losses.aggregate(mode="token_mean")``.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import numpy as np
import optax
from flax import nnx

from jaxrl_vr import losses
from jaxrl_vr.train import step as step_lib
from jaxrl_vr.train.rollout import encode_prompts
from jaxrl_vr.train.optim import OptimConfig, make_optimizer


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """Supervised phase.

    Attributes:
      steps: optimizer steps.
      batch_size: examples per step.
      learning_rate, warmup_steps, weight_decay, grad_clip_norm: AdamW (cosine decay to 10%).
      seed: shuffling seed.
    """

    steps: int = 300
    batch_size: int = 64
    learning_rate: float = 3e-3
    warmup_steps: int = 20
    weight_decay: float = 0.0
    grad_clip_norm: float = 1.0
    seed: int = 0

    def optim(self) -> OptimConfig:
        return OptimConfig(
            learning_rate=self.learning_rate,
            warmup_steps=self.warmup_steps,
            schedule="cosine",
            decay_steps=max(self.steps, self.warmup_steps + 1),
            end_lr_ratio=0.1,
            weight_decay=self.weight_decay,
            grad_clip_norm=self.grad_clip_norm,
        )


def target_segments(target) -> list[tuple[str, bool]]:
    """A target as (text, trained) segments: a string is one trained segment; a tuple of
    (text, trained) pairs is a multi-turn demonstration whose environment text (tool
    output, trained=False) is attended to but not learned."""
    if isinstance(target, str):
        return [(target, True)]
    return [(str(text), bool(trained)) for text, trained in target]


def encode_targets(tokenizer, targets: Sequence, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Right-padded int32 [N, T] target ids (segments then EOS), bool mask and bool loss
    mask (False on environment segments)."""
    tokens = np.full((len(targets), width), tokenizer.pad_id or 0, np.int32)
    mask = np.zeros((len(targets), width), bool)
    loss_mask = np.zeros((len(targets), width), bool)
    for i, target in enumerate(targets):
        ids, trained = [], []
        for text, on in target_segments(target):
            piece = list(tokenizer.encode(text))
            ids += piece
            trained += [on] * len(piece)
        ids.append(tokenizer.eos_id)
        trained.append(True)
        if len(ids) > width:
            raise ValueError(
                f"target {target!r} needs {len(ids)} tokens (with EOS) but the target "
                f"width is {width}."
            )
        tokens[i, : len(ids)] = ids
        mask[i, : len(ids)] = True
        loss_mask[i, : len(ids)] = trained
    return tokens, mask, loss_mask


def make_sft_step(graphdef, optimizer: optax.GradientTransformation) -> Callable:
    """Jitted ``(params, rest, opt_state, prompt_bs, prompt_mask_bs, target_bt, target_mask_bt,
    loss_mask_bt) -> (params, opt_state, loss)``."""

    def loss_fn(params, rest, prompt_bs, prompt_mask_bs, target_bt, target_mask_bt, loss_mask_bt):
        model = nnx.merge(graphdef, params, rest)
        logp_bt, _ = step_lib.response_logprobs(
            model, prompt_bs, prompt_mask_bs, target_bt, target_mask_bt
        )
        num, den = losses.aggregate(-logp_bt, loss_mask_bt, mode="token_mean")
        return losses.finalize(num, den)

    @jax.jit
    def sft_step(params, rest, opt_state, prompt_bs, prompt_mask_bs, target_bt, target_mask_bt, loss_mask_bt):
        loss, grads = jax.value_and_grad(loss_fn)(
            params, rest, prompt_bs, prompt_mask_bs, target_bt, target_mask_bt, loss_mask_bt
        )
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return sft_step


def train_sft(
    model,
    tokenizer,
    examples: Sequence[tuple[str, str]],
    cfg: SFTConfig,
    *,
    prompt_width: int | None = None,
    target_width: int | None = None,
    log_fn: Callable[[int, float], None] | None = None,
):
    """Trains ``model`` in place on (prompt, target) pairs; returns the loss history.

    Args:
      model: nnx Decoder (updated in place).
      tokenizer: Tokenizer (BOS added to prompts, EOS appended to targets).
      examples: (prompt, target) pairs, sampled with replacement in seeded order; a target
        is a string or (text, trained) segments (``target_segments``).
      cfg: SFTConfig.
      prompt_width, target_width: fixed padded widths (default: the longest).
      log_fn: optional callback (step, loss).
    """
    if not examples:
        raise ValueError("train_sft needs at least one (prompt, target) example.")
    prompts = [p for p, _ in examples]
    targets = [t for _, t in examples]
    prompt_tokens, prompt_mask = encode_prompts(tokenizer, prompts, prompt_width)
    target_width = target_width or max(
        sum(len(tokenizer.encode(text)) for text, _ in target_segments(t)) + 1 for t in targets)
    target_tokens, target_mask, loss_mask = encode_targets(tokenizer, targets, target_width)
    graphdef, params, rest = step_lib.split_model(model)
    optimizer = make_optimizer(cfg.optim())
    opt_state = optimizer.init(params)
    sft_step = make_sft_step(graphdef, optimizer)
    rng = np.random.default_rng(cfg.seed)
    history = []
    for step in range(cfg.steps):
        rows = rng.integers(0, len(examples), cfg.batch_size)
        params, opt_state, loss = sft_step(
            params,
            rest,
            opt_state,
            prompt_tokens[rows],
            prompt_mask[rows],
            target_tokens[rows],
            target_mask[rows],
            loss_mask[rows],
        )
        if log_fn is not None and (step % 50 == 0 or step == cfg.steps - 1):
            log_fn(step, float(loss))
        history.append(loss)
    nnx.update(model, params)
    return [float(x) for x in jax.device_get(history)]
