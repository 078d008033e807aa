"""Run metrics: JSON lines + TensorBoard events in the workdir, and a progress bar.

``MetricsWriter.write(step, metrics)`` appends one JSON object per step to
``<workdir>/metrics.jsonl`` (opened in append mode, so a resumed run continues the same
file; rows after the resume step are dropped first so the file never holds a step
twice) and the scalars to TensorBoard (tensorboardX) under ``<workdir>/tb``.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any, Mapping

import numpy as np


def to_scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Python floats of every scalar entry (arrays of size 1, numpy/jax scalars, numbers)."""
    out = {}
    for name, value in metrics.items():
        if isinstance(value, (bool, int, float, np.number, np.bool_)):
            out[name] = float(value)
            continue
        arr = np.asarray(value)
        if arr.size == 1 and arr.dtype.kind in "biuf":
            out[name] = float(arr.reshape(()))
    return out


def _json_value(value: float):
    return value if math.isfinite(value) else str(value)  # NaN/inf as strings: valid JSON


class MetricsWriter:
    """JSONL + TensorBoard writer.

    Args:
      workdir: run directory.
      tensorboard: also write TensorBoard events (tensorboardX) to ``workdir/tb``.
      resume_step: if given, rows with ``step > resume_step`` are dropped from an existing
        metrics.jsonl (they belong to the part of a run that the resume replays).
    """

    def __init__(
        self,
        workdir: str,
        *,
        tensorboard: bool = True,
        resume_step: int | None = None,
        filename: str = "metrics.jsonl",
    ):
        os.makedirs(workdir, exist_ok=True)
        self.path = os.path.join(workdir, filename)
        if resume_step is not None and os.path.exists(self.path):
            with open(self.path) as f:
                rows = [line for line in f if line.strip()]
            keep = [line for line in rows if json.loads(line).get("step", 0) <= resume_step]
            with open(self.path, "w") as f:
                f.writelines(keep)
        elif resume_step is None and os.path.exists(self.path):
            os.remove(self.path)
        self._file = open(self.path, "a")
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter  # local import: optional at analysis time

            self._tb = SummaryWriter(os.path.join(workdir, "tb"))

    def write(self, step: int, metrics: Mapping[str, Any]) -> dict[str, float]:
        scalars = to_scalars(metrics)
        row = {"step": int(step), **{k: _json_value(v) for k, v in scalars.items()}}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._tb is not None:
            for name, value in scalars.items():
                if math.isfinite(value):
                    self._tb.add_scalar(name, value, int(step))
            self._tb.flush()
        return scalars

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def read_jsonl(path: str) -> list[dict]:
    """All rows of a metrics.jsonl file."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class ProgressBar:
    """A tqdm progress bar with rates (steps/s, generated tokens/s) and ETA.

    Args:
      total: number of steps; initial: steps already done (resume).
      desc: label. disable: no output (tests).
    """

    def __init__(self, total: int, *, initial: int = 0, desc: str = "rl", disable: bool = False):
        from tqdm.auto import tqdm

        self._bar = tqdm(
            total=total,
            initial=initial,
            desc=desc,
            disable=disable,
            dynamic_ncols=True,
            file=sys.stderr,
            unit="step",
        )
        self._start = time.perf_counter()
        self._tokens = 0.0

    def update(self, scalars: Mapping[str, float], *, keys=("reward", "pass_rate", "kl")) -> None:
        self._tokens += scalars.get("generated_tokens", 0.0)
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        post = {k: f"{scalars[k]:.3f}" for k in keys if k in scalars}
        post["tok/s"] = f"{self._tokens / elapsed:.0f}"
        self._bar.set_postfix(post, refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        self._bar.close()
