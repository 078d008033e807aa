"""The update phase: the loop state, its jitted functions, and num_epochs × num_minibatches
optimizer steps on one batch.

``make_update`` wires it once from the config (the one wiring of the RL step: the trainer
and ``benchmarks/rl_step.py`` call ``make_update_fns``): the loss structure, the jitted train
step (the state donated, so it updates in place) and log-prob function, the step's
hyperparameters, the estimator and the initial ``LoopState``. ``update_on_batch`` takes the
jitted train step as a callable, so it runs with a stub in tests. Minibatch m of epoch e holds a seeded random subset of the batch's rows (sorted, so
a row's position inside the minibatch is stable); a non-finite step leaves the state as it
was (the step's NaN guard returns it unchanged, so it is saved even when the step donated
its input) and stops the run with that state and the minibatch saved for inspection.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_vr import layout, parallel
from jaxrl_vr.estimators import Estimator, EstimatorContext, make_estimator
from jaxrl_vr.train import ragged
from jaxrl_vr.train import step as step_lib
from jaxrl_vr.train.checkpoint import Checkpointer
from jaxrl_vr.train.config import PipelineConfig
from jaxrl_vr.train.optim import OptimConfig, make_optimizer

__all__ = ["LoopState", "NonFiniteLossError", "Update", "UpdateFns", "make_update", "make_update_fns",
           "rl_seed", "update_on_batch"]


class LoopState(NamedTuple):
    """The device side of the loop: everything jitted code updates (checkpointed as is)."""

    train: step_lib.TrainState
    key: jax.Array  # raw key data (jax.random.key_data)
    estimator: Any


class UpdateFns(NamedTuple):
    """The jitted ``train_step(state, batch, hyper, rest)`` (the state is donated: the update
    runs in place, and the state passed in is gone) and ``logprob_fn(params, rest,
    prompt_tokens_bs, prompt_mask_bs, tokens_bt, mask_bt, temperature)``.

    Both first cut the batch's response axis after its last real token (rounded up to a
    multiple of ``ragged.TRIM_MULTIPLE``, host-side: ``ragged.trim_response``), so a long
    buffer of short answers trains on its answers' columns only; the jitted functions are
    their ``.jitted``."""

    train_step: Callable
    logprob_fn: Callable


def _build_update_fns(graphdef, optim: OptimConfig, loss_structure: step_lib.LossConfig,
                      num_updates: int, group_size: int, state_sharding=None) -> UpdateFns:
    train_step = step_lib.make_train_step(graphdef, None, make_optimizer(optim), loss_structure,
                                          donate=True, state_sharding=state_sharding)
    logprob_fn = step_lib.make_logprob_fn(graphdef, num_microbatches=num_updates,
                                          chunk_size=loss_structure.logprob_chunk_size,
                                          prompt_group_size=group_size)
    return UpdateFns(ragged.trimmed_train_step(train_step.jitted, loss_structure),
                     ragged.trimmed_logprob_fn(logprob_fn))


# Shared by trainers of one structure, so a resumed or repeated run in one process does not
# compile again (sharded runs build their own: shardings are not hashable).
_cached_update_fns = functools.lru_cache(maxsize=8)(_build_update_fns)


def make_update_fns(graphdef, optim: OptimConfig, loss_structure: step_lib.LossConfig, *,
                    num_updates: int = 1, group_size: int = 1, state_sharding=None) -> UpdateFns:
    """The jitted update and log-prob functions of one model structure and loss structure.

    Args:
      graphdef: ``step_lib.split_model(model)[0]``.
      optim: OptimConfig.
      loss_structure: ``LossConfig.structure(...)``, with ``prompt_group_size`` set when
        every G consecutive rows of a batch share a prompt.
      num_updates: micro-batches the log-prob pass splits a batch into (the update's
        micro-batches × minibatches, so it holds no more rows at once than the update).
      group_size: G of the batch rows (the log-prob pass shares each prompt's prefix).
      state_sharding: NamedShardings of the train state (None = one device).
    """
    build = _cached_update_fns if state_sharding is None else _build_update_fns
    return build(graphdef, optim, loss_structure, num_updates, group_size, state_sharding)


def rl_seed(cfg: PipelineConfig) -> int:
    """The RL loop's seed: the run seed combined with ``rl.seed``."""
    return cfg.seed * 1_000_003 + cfg.rl.seed


class Update(NamedTuple):
    """The update phase of one run, wired from the config by ``make_update``.

    Attributes:
      loss_structure: the compiled step's static loss structure.
      hyper: the step's hyperparameters as arrays (changing them never recompiles).
      fns: the jitted train step and log-prob function.
      estimator: ``rl.estimator`` for batches of ``rl.prompts_per_step`` groups.
      initial_state: the loop state before step 0 (also the template a checkpoint is
        restored into); its params are a copy, so the caller's model is never donated.
    """

    loss_structure: step_lib.LossConfig
    hyper: step_lib.StepHyper
    fns: UpdateFns
    estimator: Estimator
    initial_state: LoopState


def make_update(cfg: PipelineConfig, graphdef, params, *, kl_in_loss: bool, mesh=None) -> Update:
    """The run's update phase: ``kl_in_loss`` puts the KL term in the loss (β > 0, or a hook
    that sets per-prompt KL weights); a ``mesh`` shards the state by ``jaxrl_vr.parallel``'s
    rules; with one minibatch per pass the step shares each prompt's prefix across its G rows."""
    rl, loss, seed = cfg.rl, cfg.loss, rl_seed(cfg)
    structure = loss.structure(kl_term=kl_in_loss)
    if rl.num_minibatches == 1:
        # The update's rows are the batch's [P, G] prompt-major rows in order, so each
        # prompt's prefix runs once per group (same loss and gradient, less work).
        structure = dataclasses.replace(structure, prompt_group_size=rl.batch_group_size)
    estimator = make_estimator(rl.estimator.name, rl.estimator.settings, context=EstimatorContext(
        rl.prompts_per_step, rl.success_threshold))
    train_state = step_lib.init_train_state(jax.tree.map(jnp.copy, params), make_optimizer(cfg.optim), loss)
    state_sharding = None if mesh is None else parallel.train_state_shardings(train_state, mesh)
    if state_sharding is not None:
        train_state = jax.device_put(train_state, state_sharding)
    initial_state = LoopState(train_state, jax.random.key_data(jax.random.key(seed)), estimator.init())
    fns = make_update_fns(graphdef, cfg.optim, structure, num_updates=loss.num_microbatches * rl.num_minibatches,
                          group_size=rl.batch_group_size, state_sharding=state_sharding)
    return Update(structure, loss.hyper(temperature=rl.temperature), fns, estimator, initial_state)


class NonFiniteLossError(FloatingPointError):
    """A train step produced a NaN/inf loss or gradient; the offending step was saved."""


def minibatch_rows(size: int, *, num_minibatches: int, seed: int, step: int, epoch: int) -> list:
    """Row indices of each minibatch of one epoch (a seeded permutation, each part sorted)."""
    order = np.random.default_rng([seed, step, epoch, 7]).permutation(size)
    per = size // num_minibatches
    return [np.sort(order[m * per:(m + 1) * per]) for m in range(num_minibatches)]


def summarize(history: list[dict]) -> dict:
    """Mean of each metric over the optimizer steps; max ratio, summed trained tokens."""
    out = {k: float(np.mean([float(h[k]) for h in history])) for k in history[0]}
    out["ratio_max"] = float(max(float(h["ratio_max"]) for h in history))
    out["trained_tokens"] = float(sum(float(h["trained_tokens"]) for h in history))
    out["optimizer_steps"] = float(len(history))
    return out


def update_on_batch(train_step: Callable, train_state: Any, batch: Any, *, num_epochs: int,
                    num_minibatches: int, seed: int, step: int, mesh=None,
                    nonfinite_dir: str | None = None) -> tuple[Any, dict]:
    """(new train state, metrics) after the optimizer steps of one RL step.

    Args:
      train_step: ``(train_state, minibatch) -> (train_state, metrics)``.
      mesh: optional mesh; each minibatch is split over its batch axes.
      nonfinite_dir: where the pre-step state and minibatch of a non-finite step go.

    Raises:
      NonFiniteLossError: a step's loss or gradient norm was NaN/inf.
    """
    size = batch.tokens_bt.shape[0]
    history = []
    for epoch in range(num_epochs):
        parts = minibatch_rows(size, num_minibatches=num_minibatches, seed=seed, step=step,
                               epoch=epoch)
        for m, rows in enumerate(parts):
            minibatch = jax.tree.map(lambda x: x[jnp.asarray(rows)], batch)
            if mesh is not None:
                minibatch = parallel.shard_batch(minibatch, mesh)
            new_state, metrics = train_step(train_state, minibatch)
            if float(metrics["nonfinite"]) > 0:  # new_state is the pre-step state, kept by the guard
                path = _save_nonfinite(nonfinite_dir, step, new_state, minibatch, metrics)
                raise NonFiniteLossError(
                    f"non-finite loss/grad at RL step {step} (epoch {epoch}, minibatch {m}): "
                    f"loss={float(metrics['loss'])}, grad_norm={float(metrics['grad_norm'])}. The "
                    f"pre-step state and the minibatch are saved in {path} for inspection.")
            train_state = new_state
            history.append(jax.device_get(metrics))
    return train_state, summarize(history)


def _save_nonfinite(directory: str | None, step: int, state, minibatch, metrics) -> str | None:
    if directory is None:
        return None
    path = os.path.join(directory, f"{layout.NONFINITE_PREFIX}{step}")
    ckpt = Checkpointer(path, max_to_keep=None)
    ckpt.save(step, {"train": state, "batch": minibatch},
              {"metrics": {k: float(v) for k, v in metrics.items()}})
    ckpt.close()
    return path
