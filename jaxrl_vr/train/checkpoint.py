"""Checkpoints with orbax: device state (pytree of arrays) + host state (JSON).

One checkpoint step holds two items:
  * "state": every array the run carries (params, optimizer state, step, PRNG key data,
    CurveRL window, entropy controller, ...), saved with ``StandardSave`` and restored
    into the exact structure, shapes and dtypes of a template;
  * "host": everything else as JSON (data position, prompt-tracker state, config digest),
    numpy arrays encoded losslessly.

Orbax writes each step into a temporary directory and renames it when complete, so a run
killed mid-save leaves the previous step as the latest one (incomplete temporaries are
ignored on restore and cleaned up by the next manager).
"""

from __future__ import annotations

import base64
import json
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp


def _encode(obj: Any) -> Any:
    """JSON-safe copy of ``obj``: numpy arrays/scalars become tagged base64 records."""
    if isinstance(obj, dict):
        bad = [k for k in obj if not isinstance(k, str)]
        if bad:
            raise TypeError(f"host checkpoint state needs string keys, got {bad[:3]}.")
        return {k: _encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_encode(v) for v in obj]
    if isinstance(obj, (np.ndarray, np.generic, jax.Array)):
        arr = np.asarray(obj)
        return {
            "__ndarray__": base64.b64encode(np.ascontiguousarray(arr).tobytes()).decode("ascii"),
            "dtype": arr.dtype.str,
            "shape": list(arr.shape),
        }
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    raise TypeError(
        f"cannot store {type(obj).__name__} in the host checkpoint state; "
        "convert it to numpy arrays, numbers, strings, lists or dicts."
    )


def _decode(obj: Any) -> Any:
    if isinstance(obj, dict):
        if "__ndarray__" in obj:
            data = base64.b64decode(obj["__ndarray__"])
            return np.frombuffer(data, dtype=np.dtype(obj["dtype"])).reshape(obj["shape"]).copy()
        return {k: _decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    return obj


class Checkpointer:
    """Thin wrapper over ``ocp.CheckpointManager`` for (array state, host state) pairs.

    Args:
      directory: where step directories go (created).
      max_to_keep: keep the newest N complete checkpoints (None = all).
    """

    def __init__(self, directory: str | os.PathLike, *, max_to_keep: int | None = 3):
        self.directory = os.path.abspath(os.fspath(directory))
        if os.path.exists(self.directory) and not os.path.isdir(self.directory):
            raise NotADirectoryError(
                f"checkpoint directory {self.directory} exists and is not a directory; pass a "
                "different --workdir."
            )
        os.makedirs(self.directory, exist_ok=True)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            create=True,
            enable_async_checkpointing=False,
            cleanup_tmp_directories=True,
        )
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, item_names=("state", "host")
        )

    def latest_step(self) -> int | None:
        """Newest complete checkpoint step, or None."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def save(self, step: int, state: Any, host: dict | None = None, *, force: bool = True) -> None:
        """Saves ``state`` (pytree of arrays) and ``host`` (JSON-able, numpy allowed) at ``step``."""
        host_json = json.loads(json.dumps(_encode(host or {})))
        self._manager.save(
            int(step),
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), host=ocp.args.JsonSave(host_json)
            ),
            force=force,
        )
        self._manager.wait_until_finished()

    def restore(self, template: Any, step: int | None = None) -> tuple[Any, dict, int]:
        """Restores (state shaped like ``template``, host dict, step); latest when step is None.

        Raises:
          FileNotFoundError: there is no complete checkpoint.
          ValueError: the stored arrays do not match the template (config changed).
        """
        if step is None:
            step = self.latest_step()
        if step is None:
            raise FileNotFoundError(f"no complete checkpoint in {self.directory}.")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
        try:
            restored = self._manager.restore(
                int(step),
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract), host=ocp.args.JsonRestore()
                ),
            )
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(
                f"checkpoint step {step} in {self.directory} does not match this run's state "
                f"(model/optimizer/algorithm config changed?): {err}. Use a fresh --workdir or "
                "the config the run was started with."
            ) from err
        state = restored["state"]
        for want, got in zip(jax.tree.leaves(abstract), jax.tree.leaves(state)):
            if tuple(want.shape) != tuple(got.shape) or want.dtype != got.dtype:
                raise ValueError(
                    f"checkpoint step {step} in {self.directory} holds an array {got.shape} "
                    f"{got.dtype} where this run expects {want.shape} {want.dtype}: the config "
                    "changed since the run started. Use a fresh --workdir or the original config."
                )
        return state, _decode(restored["host"] or {}), int(step)

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()
