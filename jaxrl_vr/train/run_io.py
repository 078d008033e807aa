"""Reading a finished (or running) pipeline workdir: the one place that knows its layout.

Everything that evaluates or compares runs goes through ``load_run`` and
``read_run_stats``, so a change of the workdir layout is a change of this file only.
The file names are ``jaxrl_vr.layout``'s; a config.json of the flat layout before the
config sections is read through ``train.config.upgrade_legacy``.

Per-run evidence: ``copy_evidence`` copies the small files a comparison's tables are made
from (``EVIDENCE_FILES`` and the evaluations) into a folder of the same layout, each one
larger than ``GZIP_ABOVE`` bytes gzip-compressed as ``NAME.gz``; every reader here takes
either form, so ``experiments.compare --report_only`` rebuilds the tables from such a folder.
"""

from __future__ import annotations

import gzip
import json
import os
from typing import Any, NamedTuple

import numpy as np
from flax import nnx

from jaxrl_vr import layout
from jaxrl_vr.atomic import write_bytes
from jaxrl_vr.eval.plots import read_metrics_jsonl
from jaxrl_vr.train import sources
from jaxrl_vr.train.checkpoint import Checkpointer
from jaxrl_vr.train.config import load_config
from jaxrl_vr.train.update import make_update
from jaxrl_vr.train.step import split_model

__all__ = [
    "CheckpointNotFoundError",
    "LoadedRun",
    "RunNotFoundError",
    "RunStats",
    "EVIDENCE_FILES",
    "GZIP_ABOVE",
    "budget_marks",
    "checkpoint_steps",
    "copy_evidence",
    "evaluation_file",
    "load_run",
    "read_evaluation",
    "read_metrics",
    "read_run_json",
    "read_run_stats",
    "run_file",
]


class RunNotFoundError(FileNotFoundError):
    """The workdir does not exist or holds no pipeline run (no config.json)."""


class CheckpointNotFoundError(FileNotFoundError):
    """The requested checkpoint is not in the workdir."""


class LoadedRun(NamedTuple):
    """A policy of a run, with everything needed to evaluate it like the run did.

    Attributes:
      config: the run's PipelineConfig.
      model: the policy (Decoder) with the checkpoint's params.
      tokenizer: the run's tokenizer.
      eval_items: held-out TaskItems (the run's evaluation prompts, fixed order).
      base_calibration_counts: int64 [P] correct base samples of the independent
        calibration cache, or None when the run has none.
      calibration_n: samples per prompt of that cache (0 when None).
      max_new_tokens: the run's response cap.
      temperature: the run's evaluation temperature.
      chat: whether prompts are wrapped in the chat template.
      step: RL step of the params (0 for the base).
    """

    config: Any
    model: Any
    tokenizer: Any
    eval_items: list
    base_calibration_counts: np.ndarray | None
    calibration_n: int
    max_new_tokens: int
    temperature: float
    chat: bool
    step: int


class RunStats(NamedTuple):
    """Cost of a run, for comparisons at an equal budget.

    Attributes:
      complete: the run finished (summary.json written).
      rl_steps: RL steps done.
      generated_tokens: rollout tokens sampled by RL (cumulative over resumes).
      trained_tokens: tokens that entered the loss.
      rl_time_s: RL wall time (cumulative over resumes).
      wall_time_s: wall time of the process that finished the run (SFT, base evaluation,
        RL and final evaluation; NaN while running).
      calibration_tokens: tokens of the training-prompt calibration passes before RL
        (PBA's base calibration, pairing's rate calibration; outside ``generated_tokens``).
    """

    complete: bool
    rl_steps: int
    generated_tokens: float
    trained_tokens: float
    rl_time_s: float
    wall_time_s: float
    calibration_tokens: float = 0.0


def run_file(workdir: str | os.PathLike, name: str) -> str | None:
    """The path of the run's file ``name`` (relative to the workdir), or of its
    gzip-compressed copy ``name.gz`` (per-run evidence); None when neither exists."""
    path = os.path.join(os.fspath(workdir), name)
    return next((p for p in (path, path + ".gz") if os.path.isfile(p)), None)


def read_run_json(workdir: str | os.PathLike, name: str) -> Any:
    """The JSON file ``name`` of a run (or ``name.gz``); None when neither exists."""
    path = run_file(workdir, name)
    if path is None:
        return None
    with (gzip.open(path, "rt", encoding="utf-8") if path.endswith(".gz") else open(path, encoding="utf-8")) as f:
        return json.load(f)


def evaluation_file(label: str = "final") -> str:
    """experiments.evaluate's evaluation.json of checkpoint ``label``, relative to the workdir."""
    return os.path.join(layout.EVAL, label, layout.EVALUATION)


def read_evaluation(workdir: str | os.PathLike, label: str = "final") -> dict | None:
    """The run's ``eval/<label>/evaluation.json`` (or its .gz); None when absent."""
    return read_run_json(workdir, evaluation_file(label))


def read_metrics(workdir: str | os.PathLike) -> list[dict]:
    """The rows of the run's metrics.jsonl (or its .gz); [] when absent."""
    path = run_file(workdir, layout.METRICS)
    return read_metrics_jsonl(path) if path else []


def _workdir(workdir: str | os.PathLike) -> str:
    workdir = os.path.abspath(os.fspath(workdir))
    if not os.path.isdir(workdir):
        raise RunNotFoundError(f"workdir {workdir} does not exist; pass the --workdir of a training run.")
    if run_file(workdir, layout.CONFIG) is None:
        raise RunNotFoundError(
            f"workdir {workdir} has no config.json: it is not a run written by experiments.train."
        )
    return workdir


def read_config(workdir: str | os.PathLike):
    """The `PipelineConfig` a run was written with (its config.json).

    Raises:
      RunNotFoundError: no such run.
    """
    return load_config(read_run_json(_workdir(workdir), layout.CONFIG))


def _complete_steps(directory: str) -> list[int]:
    """Complete orbax step directories (a committed step has no tmp suffix)."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(name) for name in os.listdir(directory) if name.isdigit())


def checkpoint_steps(workdir: str | os.PathLike) -> list[int]:
    """RL steps with a saved checkpoint (rotating or budget-fraction), ascending."""
    workdir = _workdir(workdir)
    return sorted(set(_complete_steps(os.path.join(workdir, layout.CHECKPOINTS)))
                  | set(_complete_steps(os.path.join(workdir, layout.BUDGET_CHECKPOINTS))))


def budget_marks(workdir: str | os.PathLike) -> list[dict]:
    """[{"fraction", "step", "token_budget", "generated_tokens"}] of the kept budget checkpoints."""
    stored = read_run_json(_workdir(workdir), layout.BUDGET_MARKS)
    return list(stored["marks"]) if stored else []


def _parse_checkpoint(checkpoint: str | int) -> str | int:
    if isinstance(checkpoint, (int, np.integer)):
        return int(checkpoint)
    text = str(checkpoint).strip().lower()
    if text in ("final", "base"):
        return text
    if text.isdigit():
        return int(text)
    raise ValueError(f"checkpoint must be 'final', 'base' or an RL step number, got {checkpoint!r}.")


def load_run(workdir: str | os.PathLike, checkpoint: str | int = "final") -> LoadedRun:
    """The run's policy at ``checkpoint`` with its evaluation prompts and settings.

    Args:
      workdir: the run directory.
      checkpoint: "final" (the newest RL checkpoint), "base" (the SFT base) or an RL step.

    Raises:
      RunNotFoundError: no such run.
      CheckpointNotFoundError: no such checkpoint (the message lists those available).
    """
    workdir = _workdir(workdir)
    which = _parse_checkpoint(checkpoint)
    cfg = read_config(workdir)
    ckpt_dir = os.path.join(workdir, layout.CHECKPOINTS)
    steps = _complete_steps(ckpt_dir)
    budget_dir = os.path.join(workdir, layout.BUDGET_CHECKPOINTS)
    budget_steps = _complete_steps(budget_dir)
    base_dir = os.path.join(workdir, layout.BASE)
    if which == "base":
        if cfg.model.source == "builtin" and not _complete_steps(base_dir):
            raise CheckpointNotFoundError(f"workdir {workdir} has no base checkpoint (base/ is missing or empty).")
    else:
        if not steps:
            raise CheckpointNotFoundError(
                f"workdir {workdir} has no RL checkpoint yet; evaluate --checkpoint=base or train first."
            )
        if which == "final":
            which = steps[-1]
        if which not in steps and which not in budget_steps:
            raise CheckpointNotFoundError(
                f"workdir {workdir} has no checkpoint at step {which}; available: "
                f"{sorted(set(steps) | set(budget_steps))} (or base, final)."
            )
        if which not in steps:
            ckpt_dir = budget_dir

    data = sources.load_task(cfg)
    eval_items = data.heldout
    policy = sources.load_policy(cfg, workdir, data, log=lambda line: None)
    model, tokenizer = policy.model, policy.tokenizer
    step = 0
    if which != "base":
        graphdef, params, _ = split_model(model)
        template = make_update(cfg, graphdef, params, kl_in_loss=False).initial_state._asdict()
        ckpt = Checkpointer(ckpt_dir, max_to_keep=None)
        try:
            state, _, step = ckpt.restore(template, which)
        finally:
            ckpt.close()
        nnx.update(model, state["train"].params)

    calibration_counts, calibration_n = None, 0
    path = os.path.join(workdir, layout.BASE_CALIBRATION)
    if cfg.eval.base_calibration_samples > 0 and os.path.isfile(path):
        with open(path) as f:
            stored = json.load(f)
        calibration_counts = np.asarray(stored["counts"], np.int64)
        calibration_n = int(stored.get("n", cfg.eval.base_calibration_samples))
        if calibration_counts.shape != (len(eval_items),):
            calibration_counts, calibration_n = None, 0
    return LoadedRun(
        config=cfg,
        model=model,
        tokenizer=tokenizer,
        eval_items=list(eval_items),
        base_calibration_counts=calibration_counts,
        calibration_n=calibration_n,
        max_new_tokens=int(cfg.eval.max_new_tokens or cfg.rl.max_new_tokens),
        temperature=float(cfg.eval.temperature),
        chat=bool(cfg.model.chat),
        step=int(step),
    )


def _number(value: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return float("nan")


def _calibration_files_tokens(workdir: str) -> float:
    """Tokens recorded by the training-prompt calibration caches (runs older than the
    ``budget.calibration_tokens`` field)."""
    total = 0.0
    for name in layout.TRAIN_CALIBRATIONS:
        stored = read_run_json(workdir, name)
        if stored is not None:
            total += _number(stored.get("generated_tokens", 0.0))
    return total


def read_run_stats(workdir: str | os.PathLike) -> RunStats:
    """Token and time cost of a run, from summary.json (complete) or metrics.jsonl (running)."""
    workdir = _workdir(workdir)
    summary = read_run_json(workdir, layout.SUMMARY)
    if summary is not None:
        budget = summary.get("budget", {})
        return RunStats(
            complete=True,
            rl_steps=int(summary.get("rl_steps", 0)),
            generated_tokens=_number(budget.get("generated_tokens")),
            trained_tokens=_number(budget.get("trained_tokens")),
            rl_time_s=_number(budget.get("total_s")),
            wall_time_s=_number(summary.get("wall_time_s", {}).get("total")),
            calibration_tokens=(_number(budget["calibration_tokens"]) if "calibration_tokens" in budget
                                else _calibration_files_tokens(workdir)),
        )
    rows = read_metrics(workdir)
    last = rows[-1] if rows else {}
    return RunStats(
        complete=False,
        rl_steps=int(last.get("step", 0)),
        generated_tokens=_number(last.get("budget/generated_tokens", 0.0)),
        trained_tokens=_number(last.get("budget/trained_tokens", 0.0)),
        rl_time_s=_number(last.get("budget/total_s", 0.0)),
        wall_time_s=float("nan"),
        calibration_tokens=_number(last.get("budget/calibration_tokens", 0.0)),
    )


# ---------------------------------------------------------------------- per-run evidence

# What a comparison's tables are made from, besides the evaluations (experiments.compare).
EVIDENCE_FILES = (layout.CONFIG, layout.SUMMARY, layout.METRICS, layout.BUDGET_MARKS, *layout.TRAIN_CALIBRATIONS)
GZIP_ABOVE = 64 * 1024  # bytes: a larger evidence file is stored gzip-compressed as NAME.gz


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        data = f.read()
    return gzip.decompress(data) if path.endswith(".gz") else data


def copy_evidence(workdir: str | os.PathLike, dest: str | os.PathLike, *,
                  gzip_above: int = GZIP_ABOVE) -> list[str]:
    """Copies the run's ``EVIDENCE_FILES`` and evaluations (``eval/final`` and those of its
    kept budget checkpoints) into ``dest`` under the same names, each larger than
    ``gzip_above`` bytes as ``NAME.gz`` (no timestamp inside, so a copy of the same bytes
    is the same file); never checkpoints, the base model or exports. ``workdir`` may itself
    hold evidence. Returns the names written, relative to ``dest``.

    Raises:
      RunNotFoundError: ``workdir`` holds no run.
    """
    workdir = _workdir(workdir)
    names = list(EVIDENCE_FILES) + [evaluation_file("final")]
    names += [evaluation_file(str(int(mark["step"]))) for mark in budget_marks(workdir)]
    written = []
    for name in names:
        source = run_file(workdir, name)
        if source is None:
            continue
        data = _read_bytes(source)
        target = os.path.join(os.fspath(dest), name)
        packed = len(data) > gzip_above
        write_bytes(target + ".gz" if packed else target, gzip.compress(data, mtime=0) if packed else data)
        stale = target if packed else target + ".gz"
        if os.path.isfile(stale):
            os.remove(stale)
        written.append(name + ".gz" if packed else name)
    return written
