"""The update phase: num_epochs × num_minibatches optimizer steps on one rollout batch.

``update_on_batch`` takes the jitted train step as a callable, so it runs with a stub in
tests. Minibatch m of epoch e holds a seeded random subset of the batch's rows (sorted, so
a row's position inside the minibatch is stable); a non-finite step leaves the state as it
was and stops the run with the pre-step state and minibatch saved for inspection.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_vr.train.checkpoint import Checkpointer


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
                from jaxrl_vr import parallel

                minibatch = parallel.shard_batch(minibatch, mesh)
            new_state, metrics = train_step(train_state, minibatch)
            if float(metrics["nonfinite"]) > 0:
                path = _save_nonfinite(nonfinite_dir, step, train_state, minibatch, metrics)
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
    path = os.path.join(directory, f"nonfinite_step_{step}")
    ckpt = Checkpointer(path, max_to_keep=None)
    ckpt.save(step, {"train": state, "batch": minibatch},
              {"metrics": {k: float(v) for k, v in metrics.items()}})
    ckpt.close()
    return path
