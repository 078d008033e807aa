"""PNG plots for run reports (SPEC §6).

Uses matplotlib's object API with the Agg canvas (no pyplot, no global backend
state), so it works headless and in threads.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import pathlib
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from jaxrl_vr.atomic import replaced

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "read_metrics_jsonl",
    "plot_passk",
    "plot_passk_curves",
    "plot_regimes",
    "plot_training_curves",
    "plot_delta_by_regime",
    "plot_prompt_scatter",
    "plot_bars",
    "plot_budget_curves",
    "plot_tradeoff",
    "plot_training_path",
]


_LINESTYLES = ("-", "--", ":", "-.")
_MARKERS = ("o", "s", "^", "D", "v", "x")


def _colors(count: int) -> list:
    """Distinct colours for ``count`` series (tab10, or tab20 beyond ten)."""
    from matplotlib import colormaps

    cmap = colormaps["tab10" if count <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(max(count, 1))]


def _legend(ax, count: int) -> None:
    """Inside the axes for a few series, outside on the right for many."""
    if count > 6:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    else:
        ax.legend(fontsize=8)


def _figure(**kwargs) -> Figure:
    """A matplotlib Figure, imported on first use: matplotlib takes most of a second to import,
    which a process that never plots (a CLI that stops at a config error) need not pay."""
    from matplotlib.figure import Figure  # noqa: PLC0415

    return Figure(**kwargs)


def _save(fig: Figure, path: str | os.PathLike) -> pathlib.Path:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415 (see _figure)

    FigureCanvasAgg(fig)
    fig.tight_layout()
    with replaced(path, suffix=".tmp.png") as tmp:
        fig.savefig(tmp, dpi=110)
    return path


def plot_passk_curves(
    curves: Mapping[str, Sequence[float]],
    ks: Sequence[int],
    path: str | os.PathLike,
    *,
    title: str = "pass@k",
) -> pathlib.Path:
    """Several pass@k curves (label -> [K]) on a log-x axis."""
    ks = np.asarray(ks, np.float64)
    colors = _colors(len(curves))
    fig = _figure(figsize=(5.5 + (1.6 if len(curves) > 6 else 0.0), 4.0))
    ax = fig.add_subplot(1, 1, 1)
    # Later curves are drawn thinner, dashed and with hollow markers on top of earlier
    # ones, so curves that coincide (an unchanged policy) stay visible as distinct lines.
    for i, (label, curve) in enumerate(curves.items()):
        curve = np.asarray(curve, np.float64)
        if curve.shape != ks.shape:
            raise ValueError(f"curve '{label}' has shape {curve.shape}, ks {ks.shape}.")
        ax.plot(
            ks,
            curve,
            linestyle=_LINESTYLES[i % len(_LINESTYLES)],
            linewidth=max(3.2 - 0.8 * i, 1.0),
            marker=_MARKERS[i % len(_MARKERS)] if ks.size <= 16 else None,
            markersize=max(7 - 1.5 * i, 3),
            markerfacecolor="none" if i else None,
            zorder=2 + i,
            label=label,
            color=colors[i],
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k")
    ax.set_ylim(0.0, 1.02)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax, len(curves))
    return _save(fig, path)


def plot_passk(
    base_curve: Sequence[float],
    final_curve: Sequence[float],
    ks: Sequence[int],
    path: str | os.PathLike,
    *,
    title: str = "pass@k: base vs trained",
    labels: tuple[str, str] = ("base", "trained"),
) -> pathlib.Path:
    """pass@k of the base and trained policy vs k (log-x)."""
    return plot_passk_curves({labels[0]: base_curve, labels[1]: final_curve}, ks, path, title=title)


def plot_regimes(
    report: Mapping[str, Any],
    path: str | os.PathLike,
    *,
    ks: Sequence[int] | None = None,
) -> pathlib.Path:
    """Per-regime bars of pass@k, base vs trained, one panel per k (default: 1 and max k).

    Args:
      report: ``passk_report`` output.
    """
    all_ks = list(report["ks"])
    ks = sorted({all_ks[0], all_ks[-1]}) if ks is None else [int(k) for k in ks]
    col = {k: i for i, k in enumerate(all_ks)}
    if any(k not in col for k in ks):
        raise KeyError(f"ks {ks} not all in the report's ks.")
    names = list(report["regimes"])
    fig = _figure(figsize=(4.0 * len(ks) + 1.0, 3.8))
    x = np.arange(len(names))
    for panel, k in enumerate(ks):
        ax = fig.add_subplot(1, len(ks), panel + 1)
        for offset, (key, label) in zip((-0.2, 0.2), (("pass_at_k_base", "base"), ("pass_at_k_final", "trained"))):
            heights = [
                (report["regimes"][n][key] or [0.0] * len(all_ks))[col[k]] for n in names
            ]
            ax.bar(x + offset, heights, width=0.4, label=label)
        ax.set_xticks(x)
        ax.set_xticklabels([f"{n}\n({report['regimes'][n]['count']} prompts)" for n in names], fontsize=7)
        ax.set_ylim(0.0, 1.05)
        ax.set_title(f"pass@{k} by base regime")
        ax.legend(fontsize=7)
    return _save(fig, path)


def read_metrics_jsonl(path: str | os.PathLike) -> list[dict]:
    """Reads one JSON object per line (a ".gz" path is gzip-compressed). Blank lines are
    skipped; a torn last line (a run killed mid-write) is dropped; a malformed line
    elsewhere raises naming its number."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"metrics file {path} does not exist; check --workdir.")
    data = path.read_bytes()
    lines = (gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8").splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines):
                break
            raise ValueError(f"{path}:{number} is not valid JSON ({err.msg}).") from err
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number} is not a JSON object.")
        records.append(record)
    return records


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _resolve_key(key: str, available: Sequence[str]) -> str | None:
    if key in available:
        return key
    suffix = [a for a in available if a.endswith("/" + key)]
    return sorted(suffix)[0] if suffix else None


def plot_training_curves(
    metrics_jsonl_path: str | os.PathLike,
    path: str | os.PathLike,
    keys: Sequence[str] | None = None,
    *,
    x: str = "step",
    max_panels: int = 16,
) -> pathlib.Path:
    """One panel per metric vs ``x`` from the trainer's JSON-lines metrics.

    Args:
      metrics_jsonl_path: one JSON object per line, each with an ``x`` field ("step").
      keys: metric names; a name also matches ``<prefix>/<name>`` (e.g. "reward" finds
        "train/reward"); missing names are skipped. Default: every numeric key.
      x: the x-axis field.
    """
    records = [r for r in read_metrics_jsonl(metrics_jsonl_path) if _is_number(r.get(x))]
    available = sorted({k for r in records for k, v in r.items() if k != x and _is_number(v)})
    if keys is None:
        chosen = available[:max_panels]
    else:
        chosen = [k for k in (_resolve_key(key, available) for key in keys) if k is not None]
    if not chosen:
        raise ValueError(
            f"no requested metric {list(keys) if keys else []} with a numeric '{x}' in "
            f"{metrics_jsonl_path}; available: {available[:30]}."
        )
    cols = min(3, len(chosen))
    rows = math.ceil(len(chosen) / cols)
    fig = _figure(figsize=(4.0 * cols, 2.8 * rows))
    for i, key in enumerate(chosen):
        ax = fig.add_subplot(rows, cols, i + 1)
        pts = np.asarray([(r[x], r[key]) for r in records if _is_number(r.get(key))], np.float64)
        pts = pts[np.isfinite(pts).all(axis=1)] if pts.size else pts.reshape(0, 2)
        ax.plot(pts[:, 0], pts[:, 1], linewidth=1.2)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel(x, fontsize=8)
        ax.grid(True, alpha=0.3)
    return _save(fig, path)



def plot_delta_by_regime(
    report: Mapping[str, Any],
    path: str | os.PathLike,
    *,
    title: str = "Δpass@k (trained − base) by base regime",
) -> pathlib.Path:
    """Δpass@k vs k (log-x), one line per non-empty regime plus all prompts.

    Args:
      report: ``passk_report`` output.
    """
    ks = np.asarray(report["ks"], np.float64)
    fig = _figure(figsize=(5.8, 4.0))
    ax = fig.add_subplot(1, 1, 1)
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.plot(ks, report["pass_at_k"]["delta"], color="black", linewidth=2.2,
            label=f"all ({report['num_prompts']})")
    for i, (name, reg) in enumerate(report["regimes"].items()):
        if reg["delta"] is None:
            continue
        ax.plot(ks, reg["delta"], linestyle=_LINESTYLES[(i + 1) % len(_LINESTYLES)],
                marker=_MARKERS[i % len(_MARKERS)] if ks.size <= 16 else None, markersize=4,
                label=f"{name} ({reg['count']})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("Δpass@k")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_prompt_scatter(
    base_rate_p: Sequence[float],
    trained_rate_p: Sequence[float],
    path: str | os.PathLike,
    *,
    groups_p: Sequence[str] | None = None,
    title: str = "per-prompt pass rate: base vs trained",
    labels: tuple[str, str] = ("base pass rate", "trained pass rate"),
) -> pathlib.Path:
    """One point per prompt (base rate, trained rate) with the diagonal; colour by group."""
    base = np.asarray(base_rate_p, np.float64)
    trained = np.asarray(trained_rate_p, np.float64)
    if base.shape != trained.shape or base.ndim != 1:
        raise ValueError(f"rates must be equal-length 1-D, got {base.shape} and {trained.shape}.")
    groups = np.asarray(["prompts"] * base.size if groups_p is None else list(groups_p))
    fig = _figure(figsize=(4.8, 4.6))
    ax = fig.add_subplot(1, 1, 1)
    ax.plot([0, 1], [0, 1], color="grey", linewidth=0.8, zorder=1)
    for i, name in enumerate(dict.fromkeys(groups.tolist())):
        sel = groups == name
        ax.scatter(base[sel], trained[sel], s=16, alpha=0.7, marker=_MARKERS[i % len(_MARKERS)],
                   label=f"{name} ({int(sel.sum())})", zorder=2)
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel(labels[0])
    ax.set_ylabel(labels[1])
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_bars(
    values: Mapping[str, Mapping[str, float]],
    path: str | os.PathLike,
    *,
    errors: Mapping[str, Mapping[str, float]] | None = None,
    title: str = "",
    ylabel: str = "",
) -> pathlib.Path:
    """Grouped bars: values[series][group] (e.g. method → regime → pass@k) ± errors."""
    series = list(values)
    groups = list(dict.fromkeys(g for s in series for g in values[s]))
    bars = len(groups) * max(1, len(series))
    fig = _figure(figsize=(min(14.0, 2.0 + 0.65 * bars if bars <= 8 else 2.5 + 0.2 * bars)
                          + (1.6 if len(series) > 6 else 0.0), 3.8))
    ax = fig.add_subplot(1, 1, 1)
    x = np.arange(len(groups))
    width = 0.8 / max(len(series), 1)
    colors = _colors(len(series))
    for i, name in enumerate(series):
        heights = [values[name].get(g, np.nan) for g in groups]
        errs = None if errors is None else [errors.get(name, {}).get(g, np.nan) for g in groups]
        errs = None if errs is None else np.nan_to_num(np.asarray(errs, np.float64), nan=0.0)
        ax.bar(x + (i - (len(series) - 1) / 2) * width, np.nan_to_num(heights), width=width,
               yerr=errs, capsize=2, label=name, color=colors[i])
    ax.set_xticks(x)
    ax.set_xticklabels(groups, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    _legend(ax, len(series))
    return _save(fig, path)


def plot_budget_curves(
    panels: Mapping[str, Mapping[str, tuple[Sequence[float], Sequence[float], Sequence[float]]]],
    path: str | os.PathLike,
    *,
    xlabel: str = "fraction of the token budget",
    title: str = "",
) -> pathlib.Path:
    """One panel per metric: label -> (x, mean, s.e.) lines with error bars (NaN s.e. = none)."""
    count = max((len(lines) for lines in panels.values()), default=1)
    colors = _colors(count)
    fig = _figure(figsize=(4.6 * len(panels) + 0.6 + (1.6 if count > 6 else 0.0), 3.9))
    for p, (metric, lines) in enumerate(panels.items()):
        ax = fig.add_subplot(1, len(panels), p + 1)
        for i, (label, (x, mean, err)) in enumerate(lines.items()):
            err = np.nan_to_num(np.asarray(err, np.float64), nan=0.0)
            ax.errorbar(np.asarray(x, np.float64), np.asarray(mean, np.float64), yerr=err,
                        linestyle=_LINESTYLES[i % len(_LINESTYLES)], marker=_MARKERS[i % len(_MARKERS)],
                        markersize=4, capsize=2, linewidth=1.4, label=label, color=colors[i])
        ax.set_xlabel(xlabel)
        ax.set_ylabel(metric)
        ax.grid(True, alpha=0.3)
        if p == len(panels) - 1:
            _legend(ax, count)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def plot_tradeoff(
    paths: Mapping[str, tuple[Sequence[float], Sequence[float], Sequence[float], Sequence[float]]],
    path: str | os.PathLike,
    *,
    xlabel: str = "pass@1",
    ylabel: str = "pass@n",
    title: str = "",
) -> pathlib.Path:
    """label -> (x, y, x s.e., y s.e.) as connected points (e.g. base → mid-budget → final).

    Shows a trade-off between two metrics along training: a method that gains more on one
    axis only by moving less on the other lies on the same curve, not above it.
    """
    colors = _colors(len(paths))
    fig = _figure(figsize=(5.8 + (1.6 if len(paths) > 6 else 0.0), 4.4))
    ax = fig.add_subplot(1, 1, 1)
    for i, (label, (x, y, xe, ye)) in enumerate(paths.items()):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        xe = np.nan_to_num(np.asarray(xe, np.float64), nan=0.0)
        ye = np.nan_to_num(np.asarray(ye, np.float64), nan=0.0)
        ax.errorbar(x, y, xerr=xe, yerr=ye, color=colors[i], linestyle=_LINESTYLES[i % len(_LINESTYLES)],
                    marker=_MARKERS[i % len(_MARKERS)], markersize=4, capsize=2, linewidth=1.2, label=label)
        ax.plot(x[-1:], y[-1:], marker=_MARKERS[i % len(_MARKERS)], markersize=8, color=colors[i])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if title:
        ax.set_title(title, fontsize=10)
    _legend(ax, len(paths))
    return _save(fig, path)


def plot_training_path(record: Mapping[str, Any], path: str | os.PathLike) -> pathlib.Path:
    """pass@k along training (``jaxrl_vr.eval.training_path``): left, pass@k against the RL
    step, one line per k; right, the pass@1–pass@n path, all prompts and each non-empty
    regime, from the base (step 0, hollow marker) to the last evaluation (labelled)."""
    points, ks, n = record["points"], list(record["ks"]), int(record["n"])
    fig = _figure(figsize=(11.0, 4.2))
    left = fig.add_subplot(1, 2, 1)
    colors = _colors(len(ks))
    for i, k in enumerate(ks):
        pts = [(p["step"], p["pass_at_k"].get(str(k))) for p in points]
        pts = np.asarray([xy for xy in pts if xy[1] is not None], np.float64).reshape(-1, 2)
        left.plot(pts[:, 0], pts[:, 1], marker=_MARKERS[i % len(_MARKERS)], markersize=3,
                  linestyle=_LINESTYLES[i % len(_LINESTYLES)], color=colors[i], label=f"pass@{k}")
    left.set_xlabel("RL step (0 = base)")
    left.set_ylabel("held-out pass@k")
    left.set_ylim(0.0, 1.02)
    left.set_title(f"pass@k during training (n = {n})", fontsize=10)
    left.grid(True, alpha=0.3)
    _legend(left, len(ks))
    right = fig.add_subplot(1, 2, 2)
    lines = {"all": [(p["pass_at_k"].get("1"), p["pass_at_k"].get(str(n)), p["step"]) for p in points]}
    for name in points[0]["regimes"]:
        if any(p["regimes"][name]["count"] for p in points):
            lines[name] = [(p["regimes"][name].get("pass@1"), p["regimes"][name].get(f"pass@{n}"), p["step"])
                           for p in points]
    colors = _colors(len(lines))
    for i, (name, xys) in enumerate(lines.items()):
        xys = [xy for xy in xys if xy[0] is not None and xy[1] is not None]
        if not xys:
            continue
        x, y = np.asarray([xy[0] for xy in xys]), np.asarray([xy[1] for xy in xys])
        right.plot(x, y, marker=_MARKERS[i % len(_MARKERS)], markersize=3, linewidth=2.2 if i == 0 else 1.2,
                   linestyle=_LINESTYLES[i % len(_LINESTYLES)], color=colors[i], label=name)
        right.plot(x[:1], y[:1], marker="o", markersize=8, markerfacecolor="none", color=colors[i])
        right.annotate(f"{xys[-1][2]}", (x[-1], y[-1]), fontsize=7, textcoords="offset points", xytext=(3, 3))
    right.set_xlabel("pass@1")
    right.set_ylabel(f"pass@{n}")
    right.set_xlim(-0.02, 1.02)
    right.set_ylim(-0.02, 1.02)
    right.set_title("pass@1 vs pass@n path (hollow: base; label: last step)", fontsize=10)
    right.grid(True, alpha=0.3)
    _legend(right, len(lines))
    return _save(fig, path)
