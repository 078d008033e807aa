"""Optimizer factory: AdamW with linear warm-up, a decay schedule and global-norm clipping.

Loshchilov & Hutter, "Decoupled Weight Decay Regularization" (arXiv 1711.05101). The
learning rate is a schedule of the optimizer's own step count and every other
hyperparameter is injected as an array (``optax.inject_hyperparams``), so a value that
changes during training never changes a traced constant and never recompiles.
"""

from __future__ import annotations

import dataclasses

import optax

SCHEDULES = ("constant", "cosine", "linear")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """AdamW settings.

    Attributes:
      learning_rate: peak learning rate, reached after ``warmup_steps`` optimizer steps.
      warmup_steps: linear warm-up from 0 to the peak.
      schedule: "constant", "cosine" (to ``end_lr_ratio``·peak) or "linear" (same end).
      decay_steps: total optimizer steps the decay spans (warm-up included); needed by
        "cosine" and "linear".
      end_lr_ratio: final learning rate as a fraction of the peak.
      b1, b2, eps: Adam moments.
      weight_decay: decoupled weight decay.
      grad_clip_norm: global-norm clip threshold; 0 disables clipping.
    """

    learning_rate: float = 1e-3
    warmup_steps: int = 0
    schedule: str = "constant"
    decay_steps: int = 0
    end_lr_ratio: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip_norm: float = 1.0

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule={self.schedule!r} is not one of {SCHEDULES}.")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}.")
        if self.schedule != "constant" and self.decay_steps <= self.warmup_steps:
            raise ValueError(f"decay_steps={self.decay_steps} must exceed warmup_steps={self.warmup_steps} "
                             f"for schedule={self.schedule!r}: give the total optimizer steps.")
        for name in ("warmup_steps", "weight_decay", "grad_clip_norm", "end_lr_ratio"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}.")
        if not (0.0 <= self.b1 < 1.0 and 0.0 <= self.b2 < 1.0 and self.eps > 0):
            raise ValueError(f"b1, b2 must lie in [0, 1) and eps > 0, got {self.b1}, {self.b2}, {self.eps}.")


def learning_rate_schedule(cfg: OptimConfig) -> optax.Schedule:
    """Warm-up then the configured decay, as a function of the optimizer step (the config
    checked its values when it was built)."""
    peak = cfg.learning_rate
    if cfg.schedule == "constant":
        if cfg.warmup_steps <= 0:
            return optax.constant_schedule(peak)
        return optax.join_schedules(
            [optax.linear_schedule(0.0, peak, cfg.warmup_steps), optax.constant_schedule(peak)],
            [cfg.warmup_steps],
        )
    end = peak * cfg.end_lr_ratio
    if cfg.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            0.0, peak, max(cfg.warmup_steps, 0), cfg.decay_steps, end_value=end
        )
    decay = optax.linear_schedule(peak, end, cfg.decay_steps - cfg.warmup_steps)
    if cfg.warmup_steps <= 0:
        return decay
    return optax.join_schedules(
        [optax.linear_schedule(0.0, peak, cfg.warmup_steps), decay], [cfg.warmup_steps]
    )


def _adamw_with_clip(learning_rate, b1, b2, eps, weight_decay, grad_clip_norm, clip):
    parts = [optax.clip_by_global_norm(grad_clip_norm)] if clip else []
    parts.append(optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay))
    return optax.chain(*parts)


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
    """AdamW (+ global-norm clipping) whose hyperparameters live in the optimizer state.

    ``opt_state.hyperparams["learning_rate"]`` holds the current learning rate (logged by
    the trainer); the others can be changed between steps with
    ``opt_state.hyperparams[name] = jnp.asarray(value)`` without recompiling.
    """
    return optax.inject_hyperparams(_adamw_with_clip, static_args=("clip",))(
        learning_rate=learning_rate_schedule(cfg),
        b1=cfg.b1,
        b2=cfg.b2,
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        grad_clip_norm=cfg.grad_clip_norm if cfg.grad_clip_norm > 0 else 1.0,
        clip=cfg.grad_clip_norm > 0,
    )
