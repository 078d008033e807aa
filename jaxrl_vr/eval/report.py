"""Machine-readable and human-readable run summaries (SPEC §6).

``summary`` is a dict: either a ``passk_report`` itself, or any run summary that holds
one under the key ``"passk"`` next to scalar metrics (entropy, clip fractions, KL,
valid-group fraction, truncation rate, generated tokens, wall time, …).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
from typing import Any, Sequence

import numpy as np

from jaxrl_vr import layout
from jaxrl_vr.atomic import write_text

__all__ = ["to_jsonable", "write_summary", "format_table", "write_report_md", "write_report"]


def to_jsonable(obj: Any) -> Any:
    """Recursively converts numpy/jax values, tuples, paths and dataclasses to JSON types.

    Non-finite floats become None (strict JSON has no NaN).
    """
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return to_jsonable(dataclasses.asdict(obj))
    if isinstance(obj, pathlib.PurePath):
        return str(obj)
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        value = float(obj)
        return value if math.isfinite(value) else None
    if obj is None or isinstance(obj, str):
        return obj
    if hasattr(obj, "__array__"):  # numpy / jax arrays
        arr = np.asarray(obj)
        return to_jsonable(arr.item() if arr.ndim == 0 else arr.tolist())
    raise TypeError(f"cannot write {type(obj).__name__} to summary.json; convert it to numbers or strings.")


def write_summary(summary: dict, workdir: str | os.PathLike) -> pathlib.Path:
    """Writes ``workdir/summary.json`` atomically; returns its path."""
    text = json.dumps(to_jsonable(summary), indent=2, sort_keys=True, allow_nan=False)
    return write_text(pathlib.Path(workdir) / layout.SUMMARY, text + "\n")


def _passk_of(summary: dict) -> dict | None:
    if "regimes" in summary and "pass_at_k" in summary:
        return summary
    inner = summary.get("passk")
    return inner if isinstance(inner, dict) else None


def _table_ks(report: dict, max_columns: int = 4) -> list[int]:
    heads = list(report.get("headline_ks") or report["ks"])
    if len(heads) <= max_columns:
        return heads
    picks = np.linspace(0, len(heads) - 1, max_columns).round().astype(int)
    return [heads[i] for i in sorted(set(picks.tolist()))]


def _cell(base: list | None, final: list | None, j: int) -> str:
    if base is None or final is None:
        return "—"
    b, f = base[j], final[j]
    return f"{b:.3f} → {f:.3f} ({f - b:+.3f})"


def format_table(summary: dict, *, ks: Sequence[int] | None = None) -> str:
    """Markdown table: rows = all prompts and each regime; cells pass@k base → final (Δ)."""
    report = _passk_of(summary)
    if report is None:
        raise KeyError("summary holds no pass@k report: pass passk_report(...) or {'passk': ...}.")
    ks = _table_ks(report) if ks is None else [int(k) for k in ks]
    col = {k: i for i, k in enumerate(report["ks"])}
    missing = [k for k in ks if k not in col]
    if missing:
        raise KeyError(f"k={missing} not in the report's ks; recompute passk_report with them.")
    head = "| prompts | count | lost | " + " | ".join(f"pass@{k} base → final (Δ)" for k in ks) + " |"
    rule = "|---|---:|---:|" + "---:|" * len(ks)
    overall = report["pass_at_k"]
    rows = [f"| all | {report['num_prompts']} | {report['lost']} | "
            + " | ".join(_cell(overall["base"], overall["final"], col[k]) for k in ks) + " |"]
    for name, reg in report["regimes"].items():
        rows.append(f"| {name} | {reg['count']} | {reg['lost']} | "
                    + " | ".join(_cell(reg["pass_at_k_base"], reg["pass_at_k_final"], col[k]) for k in ks)
                    + " |")
    return "\n".join([head, rule] + rows)


def _scalar_lines(summary: dict) -> list[str]:
    lines = []
    for key in sorted(summary):
        value = summary[key]
        if isinstance(value, (bool, np.bool_)):
            lines.append(f"| {key} | {bool(value)} |")
        elif isinstance(value, (int, float, np.integer, np.floating)):
            v = float(value)
            text = f"{int(value)}" if isinstance(value, (int, np.integer)) else (f"{v:.4g}" if math.isfinite(v) else "nan")
            lines.append(f"| {key} | {text} |")
        elif isinstance(value, str) and len(value) <= 80:
            lines.append(f"| {key} | {value} |")
    return lines


def write_report_md(
    summary: dict,
    workdir: str | os.PathLike,
    *,
    title: str = "jaxrl_vr run report",
    images: Sequence[str] | None = None,
    sections: Sequence[str] = (),
) -> pathlib.Path:
    """Writes ``workdir/report.md``: scalar metrics, the pass@k table, ``sections`` (Markdown
    text, in order), linked plots.

    ``images``: file names (relative to workdir) to embed; default every *.png in workdir.
    """
    workdir = pathlib.Path(workdir)
    parts = [f"# {title}", ""]
    scalars = _scalar_lines(summary)
    if scalars:
        parts += ["## Metrics", "", "| metric | value |", "|---|---:|", *scalars, ""]
    report = _passk_of(summary)
    if report is not None:
        parts += [
            "## pass@k by base-model regime",
            "",
            f"{report['num_prompts']} prompts, n = {report['n']} samples each (trained: "
            f"{report['final_n']}); regimes from the base pass rate (n = {report['regime_n']}). "
            f"Base-solvable prompts lost: {report['lost']}; newly solved: {report['gained']}.",
            "",
            format_table(report),
            "",
        ]
    parts += [section.rstrip("\n") + "\n" for section in sections]
    if images is None:
        images = sorted(p.name for p in workdir.glob("*.png")) if workdir.is_dir() else []
    if images:
        parts += ["## Plots", ""] + [f"![{name}]({name})" for name in images] + [""]
    return write_text(workdir / layout.REPORT, "\n".join(parts))


def write_report(summary: dict, workdir: str | os.PathLike, **kwargs: Any) -> dict[str, pathlib.Path]:
    """``write_summary`` + ``write_report_md``; returns {"summary": path, "report": path}."""
    return {"summary": write_summary(summary, workdir), "report": write_report_md(summary, workdir, **kwargs)}
