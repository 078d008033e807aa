"""Checkpoints with orbax: device state (pytree of arrays) + host state (JSON).

One checkpoint step holds two items:
  * "state": every array the run carries (params, optimizer state, step, PRNG key data,
    CurveRL window, entropy controller, ...), saved with ``StandardSave`` and restored
    into the exact structure, shapes and dtypes of a template;
  * "host": everything else as JSON (data position, prompt-tracker state, config digest),
    numpy arrays encoded losslessly.

Faults (SPEC: "no run thrown away"):

  * Orbax writes each step into a temporary directory and renames it when complete, so a
    run killed mid-save leaves the previous step as the latest one (incomplete temporaries
    are ignored on restore and cleaned up by the next manager). SIGINT/SIGTERM arriving
    during ``save`` (main thread) are held until the save and its deletions are done, then
    delivered; a second one aborts at once.
  * Old steps beyond ``max_to_keep`` are first renamed into ``<dir>/.trash`` (one atomic
    rename) and only then removed, so no half-deleted step directory is ever left behind.
  * ``restore_latest_intact`` moves a damaged step (truncated or overwritten files) aside
    into ``<dir>/corrupt/<step>-<UTC time>`` (never deleted), warns, and falls back to the
    newest intact step; with none left it returns None (start fresh).
  * Only a stored state whose tree paths, shapes or dtypes differ from the template raises
    ``CheckpointMismatchError`` (the run's config changed); it lists the differing paths.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import os
import shutil
import signal
import sys
import threading
import warnings
from typing import Any, NamedTuple

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


TRASH_DIR = ".trash"  # old steps are renamed here (atomic), then removed
CORRUPT_DIR = "corrupt"  # damaged steps are moved here and kept


class CheckpointMismatchError(ValueError):
    """The stored state differs from the template in tree paths, shapes or dtypes.

    Attributes:
      directory, step: the checkpoint.
      differences: one line per differing path ("path: checkpoint ..., this run ...").
    """

    def __init__(self, directory: str, step: int, differences: list[str]):
        self.directory, self.step, self.differences = directory, step, list(differences)
        shown = differences[:12] + ([f"... and {len(differences) - 12} more"] if len(differences) > 12 else [])
        super().__init__(
            f"checkpoint step {step} in {directory} does not match the state this run expects (the "
            "model/optimizer/algorithm config changed since the run started); differing paths:\n  "
            + "\n  ".join(shown)
            + "\nResume with the config the run was started with, or use a fresh --workdir."
        )


class CheckpointDamagedError(RuntimeError):
    """A step's files cannot be read (truncated, overwritten or missing)."""

    def __init__(self, directory: str, step: int, reason: str):
        self.directory, self.step, self.reason = directory, step, reason
        super().__init__(f"checkpoint step {step} in {directory} is damaged: {reason}")


class CheckpointDamagedWarning(UserWarning):
    """A damaged step was moved aside (see ``Checkpointer.damaged``)."""


class DamagedStep(NamedTuple):
    """A step ``restore_latest_intact`` moved aside: where it went and why."""

    step: int
    moved_to: str
    reason: str


class Restored(NamedTuple):
    """What ``Checkpointer.restore`` returns (unpacks as ``state, host, step``)."""

    state: Any
    host: dict
    step: int


def _short(err: BaseException, limit: int = 300) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


def _must_propagate(err: BaseException) -> bool:
    """Errors that say nothing about the files (out of memory, no permission): never move aside."""
    return isinstance(err, (MemoryError, PermissionError)) or "RESOURCE_EXHAUSTED" in str(err)


def _key_name(entry: Any) -> str:
    for attr in ("key", "name", "idx"):  # DictKey / FlattenedIndexKey, GetAttrKey, SequenceKey
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


def _flat_specs(tree: Any) -> dict[str, tuple]:
    """{"a/b/0": (shape, dtype)} for every leaf; the path spelling ignores container types."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        shape = getattr(leaf, "shape", None)
        dtype = getattr(leaf, "dtype", None)
        out["/".join(_key_name(k) for k in path)] = (
            tuple(shape) if shape is not None else None,
            np.dtype(dtype) if dtype is not None else type(leaf).__name__,
        )
    return out


def _spec_str(spec: tuple) -> str:
    shape, dtype = spec
    return f"{list(shape) if shape is not None else '?'} {dtype}"


def structure_differences(stored: dict[str, tuple], expected: dict[str, tuple]) -> list[str]:
    """Lines naming every path missing on one side or stored with another shape/dtype."""
    lines = [
        f"{p}: missing from the checkpoint (this run has {_spec_str(expected[p])})"
        for p in sorted(expected.keys() - stored.keys())
    ]
    lines += [
        f"{p}: in the checkpoint ({_spec_str(stored[p])}) but not in this run's state"
        for p in sorted(stored.keys() - expected.keys())
    ]
    lines += [
        f"{p}: checkpoint {_spec_str(stored[p])}, this run {_spec_str(expected[p])}"
        for p in sorted(stored.keys() & expected.keys())
        if stored[p] != expected[p]
    ]
    return lines


@contextlib.contextmanager
def signals_held(what: str, signums=(signal.SIGINT, signal.SIGTERM)):
    """Holds SIGINT/SIGTERM while the block runs, then delivers the first one received.

    A second signal during the block restores the previous handlers and is delivered at
    once (abort). Outside the main thread (where handlers cannot be set) it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for signum in signums:
        handler = signal.getsignal(signum)
        if handler is not None:  # None: installed outside Python, cannot be restored
            previous[signum] = handler
    received: list[int] = []
    restored = False

    def restore() -> None:
        nonlocal restored
        if not restored:
            restored = True
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def hold(signum, frame):
        if received:  # asked twice: stop now
            restore()
            signal.raise_signal(signum)
            return
        received.append(signum)
        print(
            f"{signal.Signals(signum).name} received while {what}; finishing that first "
            "(send it again to stop at once).",
            file=sys.stderr,
            flush=True,
        )

    for signum in previous:
        signal.signal(signum, hold)
    try:
        yield
    finally:
        already = restored
        restore()
        if received and not already:
            signal.raise_signal(received[0])  # the caller's handler runs now


class Checkpointer:
    """Thin wrapper over ``ocp.CheckpointManager`` for (array state, host state) pairs.

    Args:
      directory: where step directories go (created).
      max_to_keep: keep the newest N complete checkpoints (None = all).

    Attributes:
      damaged: every step ``restore_latest_intact`` moved aside (DamagedStep records).
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
            todelete_subdir=TRASH_DIR,
        )
        self._manager = ocp.CheckpointManager(  # handlers given: metadata readable before a restore
            self.directory,
            options=options,
            item_handlers={
                "state": ocp.StandardCheckpointHandler(),
                "host": ocp.JsonCheckpointHandler(),
            },
        )
        self.damaged: list[DamagedStep] = []
        self._closed = False
        self._purge_trash()  # what a killed run left half-removed (never a step directory)

    def latest_step(self) -> int | None:
        """Newest complete checkpoint step, or None (it may still be damaged)."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def _purge_trash(self) -> None:
        shutil.rmtree(os.path.join(self.directory, TRASH_DIR), ignore_errors=True)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"the Checkpointer for {self.directory} is closed.")

    def save(self, step: int, state: Any, host: dict | None = None, *, force: bool = True) -> None:
        """Saves ``state`` (pytree of arrays) and ``host`` (JSON-able, numpy allowed) at ``step``.

        Returns once the step is complete on disk and steps beyond ``max_to_keep`` are gone.
        Called from the main thread, SIGINT/SIGTERM are held until then (``signals_held``).
        """
        self._check_open()
        host_json = json.loads(json.dumps(_encode(host or {})))
        with signals_held(f"saving checkpoint step {step} in {self.directory}"):
            self._manager.save(
                int(step),
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state), host=ocp.args.JsonSave(host_json)
                ),
                force=force,
            )
            self._manager.wait_until_finished()
            self._purge_trash()

    def wait_until_finished(self) -> None:
        """Blocks until every started save and deletion is complete on disk (signals held)."""
        if self._closed:
            return
        with signals_held(f"finishing checkpoint writes in {self.directory}"):
            self._manager.wait_until_finished()
            self._purge_trash()

    def restore(self, template: Any, step: int | None = None) -> Restored:
        """Restores (state shaped like ``template``, host dict, step).

        With ``step=None`` this is ``restore_latest_intact`` (damaged steps are moved aside),
        but with no intact step left it raises FileNotFoundError instead of returning None.

        Raises:
          FileNotFoundError: there is no (intact) checkpoint, or ``step`` does not exist.
          CheckpointMismatchError: the stored tree paths/shapes/dtypes differ from the template.
          CheckpointDamagedError: the explicitly requested ``step`` cannot be read (it stays).
        """
        self._check_open()
        if step is not None:
            return self._restore_step(template, int(step))
        restored = self.restore_latest_intact(template)
        if restored is None:
            moved = [d.moved_to for d in self.damaged]
            raise FileNotFoundError(
                f"no intact checkpoint in {self.directory}"
                + (f"; damaged steps were moved to {moved}." if moved else ".")
            )
        return restored

    def restore_latest_intact(self, template: Any) -> Restored | None:
        """The newest step that reads back intact; None when there is none (start fresh).

        A step whose files cannot be read is moved to ``<dir>/corrupt/<step>-<UTC time>``
        (never deleted), recorded in ``self.damaged`` and reported with a
        CheckpointDamagedWarning; the next older step is tried. A structure mismatch is not
        damage: it raises CheckpointMismatchError and moves nothing.
        """
        self._check_open()
        self._manager.reload()
        before = len(self.damaged)
        for step in sorted(self.all_steps(), reverse=True):
            try:
                return self._restore_step(template, step)
            except CheckpointDamagedError as err:
                moved_to = self._move_aside(step, err.reason)
                self.damaged.append(DamagedStep(step, moved_to, err.reason))
                warnings.warn(
                    f"checkpoint step {step} in {self.directory} is damaged ({err.reason}); moved "
                    f"it to {moved_to} (kept: move it back to retry) and trying the next older step.",
                    CheckpointDamagedWarning,
                    stacklevel=2,
                )
        if len(self.damaged) > before:
            warnings.warn(
                f"no intact checkpoint remains in {self.directory}: the run starts from scratch "
                f"(damaged steps kept in {os.path.join(self.directory, CORRUPT_DIR)}).",
                CheckpointDamagedWarning,
                stacklevel=2,
            )
        return None

    def _move_aside(self, step: int, reason: str) -> str:
        source = os.path.join(self.directory, str(step))
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        target = os.path.join(self.directory, CORRUPT_DIR, f"{step}-{stamp}")
        suffix = 0
        while os.path.exists(target + (f"-{suffix}" if suffix else "")):
            suffix += 1
        target += f"-{suffix}" if suffix else ""
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.rename(source, target)
        except OSError as err:
            raise CheckpointDamagedError(
                self.directory,
                step,
                f"{reason}; moving it aside failed ({_short(err)}): move or remove {source} by hand",
            ) from err
        finally:
            self._manager.reload()
        return target

    def _stored_specs(self, step: int) -> dict[str, tuple] | None:
        """Paths, shapes and dtypes the step's metadata records; None when unreadable."""
        try:
            metadata = self._manager.item_metadata(step)["state"]
        except Exception as err:  # noqa: BLE001  (unreadable: the restore below decides)
            if _must_propagate(err):
                raise
            return None
        if metadata is None:
            return None
        try:
            return _flat_specs(getattr(metadata, "tree", metadata))
        except Exception:  # noqa: BLE001
            return None

    def _restore_step(self, template: Any, step: int) -> Restored:
        if step not in self.all_steps():
            raise FileNotFoundError(
                f"no complete checkpoint step {step} in {self.directory} (have {self.all_steps()})."
            )
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
        expected = _flat_specs(abstract)
        stored = self._stored_specs(step)
        if stored is not None:
            differences = structure_differences(stored, expected)
            if differences:
                raise CheckpointMismatchError(self.directory, step, differences)
        try:
            restored = self._manager.restore(
                int(step),
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract), host=ocp.args.JsonRestore()
                ),
            )
            state = restored["state"]
            host = _decode(restored["host"] or {})
            if not isinstance(host, dict):
                raise TypeError(f"host state is a {type(host).__name__}, not a dict")
        except Exception as err:  # noqa: BLE001  (tensorstore raises bare Exception)
            if _must_propagate(err):
                raise
            raise CheckpointDamagedError(self.directory, step, _short(err)) from err
        differences = structure_differences(_flat_specs(state), expected)
        if differences:
            raise CheckpointMismatchError(self.directory, step, differences)
        return Restored(state, host, int(step))

    def close(self) -> None:
        """Finishes pending writes and releases the manager; safe to call again."""
        if self._closed:
            return
        self._closed = True
        try:
            with signals_held(f"finishing checkpoint writes in {self.directory}"):
                self._manager.wait_until_finished()
                self._purge_trash()
        finally:
            self._manager.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
