"""Run directories: ownership by config, content digests and cached JSON results.

A workdir belongs to one config: ``prepare_workdir`` writes ``config.json`` the first time
and, once that run has completed a step, refuses a later run whose config differs in a key
that changes results (keys in ``RESUMABLE_KEYS`` may change between resumes). Cached results (base evaluations and
calibrations) are JSON files stamped with the digest of what produced them.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Callable, NamedTuple

import numpy as np

from jaxrl_vr import layout
from jaxrl_vr.atomic import write_json
from jaxrl_vr.train.budget import Budget, BudgetConfig

# Keys that may differ between the run that wrote a workdir and a resume of it.
RESUMABLE_KEYS = (
    "run.",
    "rl.steps",
    "rl.budget.tokens",
    "rl.budget.fractions",
    "rl.checkpoint_every",
    "rl.max_to_keep",
    "rl.verifier.workers",
    "rl.verifier.timeout_s",
    "eval.prompts_per_chunk",
    "eval.every",  # evaluations during training: they change no training result
    "eval.during_samples",
)


# Top-level keys of config.json that record the process that wrote it (library versions),
# not the config: never compared, and left out by ``config_of``.
RECORD_KEYS = ("versions",)


def config_of(stored: dict) -> dict:
    """A stored config.json's config tree, without its records (``RECORD_KEYS``)."""
    return {k: v for k, v in stored.items() if k not in RECORD_KEYS}


class WorkdirError(RuntimeError):
    """The workdir cannot be used for this config (wrong directory or config mismatch)."""


def flatten(tree: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def digest(tree: Any) -> str:
    """A short stable hash of a JSON-able tree."""
    return hashlib.sha256(json.dumps(tree, sort_keys=True).encode()).hexdigest()[:16]


def check_workdir(workdir: str) -> str:
    """The absolute path, or WorkdirError when it (or a parent) is a file."""
    workdir = os.path.abspath(workdir)
    probe = workdir
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if probe and not os.path.isdir(probe):
        raise WorkdirError(f"--workdir {workdir}: {probe} is a file, not a directory; pass a "
                           "directory path.")
    return workdir


class RunDir(NamedTuple):
    """A prepared workdir: its path, the summary of the run in it when that run is finished
    (all ``steps`` done, or its budget spent; None otherwise), and the stored config's keys
    this config replaced ("" when none: see ``prepare_workdir``)."""

    path: str
    finished: dict | None
    replaced: str = ""


def completed_a_step(workdir: str) -> bool:
    """Whether a run in ``workdir`` got past its start: an RL checkpoint or a summary exists."""
    checkpoints = os.path.join(workdir, layout.CHECKPOINTS)
    return os.path.exists(os.path.join(workdir, layout.SUMMARY)) or (
        os.path.isdir(checkpoints) and any(name.isdigit() for name in os.listdir(checkpoints)))


def finished_summary(workdir: str, steps: int, budget: BudgetConfig) -> dict | None:
    """summary.json of a finished run in ``workdir`` (``steps`` done or ``budget`` spent), or None."""
    path = os.path.join(workdir, layout.SUMMARY)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        summary = json.load(f)
    done = summary.get("rl_steps", -1) >= steps
    budget_done = Budget.from_dict(summary.get("budget", {})).spent(budget)
    return summary if summary.get("finished") and (done or budget_done) else None


def prepare_workdir(workdir: str, config_tree: dict, defaults: dict | None = None, *,
                    upgrade: Callable[[dict], dict] = lambda tree: tree, steps: int = 0,
                    budget: BudgetConfig = BudgetConfig(), record: dict | None = None) -> RunDir:
    """Creates the workdir or checks it belongs to this config; writes config.json (the
    config tree and ``record``'s top-level keys, e.g. {"versions": ...}: see ``RECORD_KEYS``;
    a finished run keeps its stored record).

    A key the stored config lacks (written before the key existed) matches when the new
    value equals its default in ``defaults`` (the config tree of the defaults), so a
    workdir from an older version resumes unless the new key is actually changed.
    ``upgrade`` translates a stored config of an older layout to today's first. ``steps``
    and ``budget`` say when a run is finished (``RunDir.finished``).

    A workdir whose run never completed an RL step (no checkpoint, no summary: it failed
    or was stopped at start-up) takes the new config; ``RunDir.replaced`` lists what
    changed. Its cached base evaluations are stamped with what produced them, so none is
    reused for another config.

    Raises:
      WorkdirError: ``workdir`` is (under) a file, or holds a run that completed a step and
        whose config differs in a key that changes results (the message lists each
        differing key with both values).
    """
    workdir = check_workdir(workdir)
    path = os.path.join(workdir, layout.CONFIG)
    replaced, stored_record = "", {}
    if os.path.exists(path):
        with open(path) as f:
            stored = json.load(f)
        stored_record = {k: v for k, v in stored.items() if k in RECORD_KEYS}
        stored = upgrade(config_of(stored))
        a, b = flatten(stored), flatten(config_tree)
        default = flatten(defaults or {})
        diffs = [k for k in sorted(set(a) | set(b))
                 if a.get(k) != b.get(k) and not any(k.startswith(p) for p in RESUMABLE_KEYS)
                 and not (k not in a and k in default and b.get(k) == default[k])]
        lines = "; ".join(f"{k}: workdir has {a.get(k)!r}, config has {b.get(k)!r}" for k in diffs)
        if diffs and not completed_a_step(workdir):  # a failed start: the corrected config wins
            replaced = lines
        elif diffs:
            raise WorkdirError(f"--workdir {workdir} holds a run with a different config ({lines}). "
                               "Resume with the original config, or choose a new --workdir.")
    elif os.path.isdir(os.path.join(workdir, layout.CHECKPOINTS)) and os.listdir(
            os.path.join(workdir, layout.CHECKPOINTS)):
        raise WorkdirError(f"--workdir {workdir} has checkpoints but no config.json: it was not "
                           "written by this pipeline. Choose a new --workdir.")
    finished = finished_summary(workdir, steps, budget)
    os.makedirs(workdir, exist_ok=True)
    record = record or {}
    if set(record) - set(RECORD_KEYS):
        raise ValueError(f"record keys {sorted(set(record) - set(RECORD_KEYS))} are not in RECORD_KEYS.")
    # A finished run keeps the record of the process that ran it.
    write_json(path, {**config_tree, **record, **(stored_record if finished is not None else {})})
    return RunDir(workdir, finished, replaced)


def read_budget_marks(workdir: str) -> list[dict]:
    """The budget-fraction marks of a workdir ([] when it has none)."""
    path = os.path.join(workdir, layout.BUDGET_MARKS)
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return list(json.load(f)["marks"])


def cached_counts(path: str, key: str, compute: Callable[[], dict]) -> dict:
    """``compute()``'s result ({"counts": int array, ...}) cached in ``path`` under digest ``key``."""
    if os.path.exists(path):
        with open(path) as f:
            stored = json.load(f)
        if stored.get("digest") == key:
            stored["counts"] = np.asarray(stored["counts"], np.int64)
            return stored
    result = compute()
    write_json(path, {**result, "counts": np.asarray(result["counts"]).tolist(), "digest": key})
    return result
