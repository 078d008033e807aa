"""simulation.json and the PNG plots of a simulator run (host-side NumPy/matplotlib).

Per method: exact pass@k (k = 1..max_k) per base regime at the base and at the end, the
change Δpass@k over training at the headline ks, lost-prompt counts, entropy, KL to the
base, per-prompt trajectories of a sample of prompts — each as a mean over seeds with a
95% t-interval (half-width) and the per-seed values.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Sequence

import numpy as np
from scipy import stats as scipy_stats

from jaxrl_vr import atomic
from jaxrl_vr.sim.config import SimConfig
from jaxrl_vr.sim.engine import HEADLINE_KS, NUM_REGIMES, REGIME_ROWS, SimRun
from jaxrl_vr.sim.population import exact_pass_at_k

MAX_K = 256


def mean_ci(values_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean over the leading (seed) axis and the 95% t-interval half-width (NaN for 1 seed)."""
    values_s = np.asarray(values_s, np.float64)
    num = values_s.shape[0]
    mean = values_s.mean(axis=0)
    if num < 2:
        return mean, np.full_like(mean, np.nan)
    half = scipy_stats.t.ppf(0.975, num - 1) * values_s.std(axis=0, ddof=1) / np.sqrt(num)
    return mean, half


def regime_passk_curve(p_p: np.ndarray, regime_p: np.ndarray, max_k: int = MAX_K) -> np.ndarray:
    """Mean exact pass@k for k = 1..max_k per regime row (4 regimes + overall): [R+1, K]."""
    passk_pk = np.asarray(exact_pass_at_k(np.asarray(p_p, np.float32), np.arange(1, max_k + 1)))
    rows = []
    for r in range(NUM_REGIMES):
        members = regime_p == r
        rows.append(passk_pk[members].mean(axis=0) if members.any()
                    else np.full(max_k, np.nan))
    rows.append(passk_pk.mean(axis=0))
    return np.stack(rows)


def _round(v: float) -> float | None:
    """6 significant digits (keeps simulation.json small); None for NaN/inf."""
    return float(f"{v:.6g}") if np.isfinite(v) else None


def _floats(x) -> list:
    return [_round(v) for v in np.asarray(x, np.float64).ravel()]


def _stat(values_s: np.ndarray) -> dict:
    mean, half = mean_ci(values_s)
    return {"mean": _floats(mean) if np.ndim(mean) else _floats([mean])[0],
            "ci95": _floats(half) if np.ndim(half) else _floats([half])[0],
            "per_seed": [_floats(v) if np.ndim(v) else _round(float(v))
                         for v in np.asarray(values_s, np.float64)]}


def summarize_run(run: SimRun, max_k: int = MAX_K) -> dict:
    """JSON-able summary of one method over its seeds."""
    num_seeds = run.p_base_sp.shape[0]
    base_curve_srk = np.stack([regime_passk_curve(run.p_base_sp[s], run.regime_sp[s], max_k)
                               for s in range(num_seeds)])
    final_curve_srk = np.stack([regime_passk_curve(run.p_final_sp[s], run.regime_sp[s], max_k)
                                for s in range(num_seeds)])
    m = run.metrics
    delta_slrk = m.passk_rk - m.passk_rk[:, :1]  # change vs base over training
    final_mean, final_ci = mean_ci(final_curve_srk)
    base_mean, _ = mean_ci(base_curve_srk)
    delta_mean, delta_ci = mean_ci(final_curve_srk - base_curve_srk)
    out = {
        "estimator": run.spec.estimator,
        "selection": run.spec.selection,
        "pba": bool(run.spec.pba),
        "pba_kind": run.spec.pba_kind if run.spec.pba else None,
        "wall_s": float(run.wall_s),
        "regime_counts": {
            name: [int((run.regime_sp[s] == r).sum()) if r < NUM_REGIMES else
                   int(run.regime_sp.shape[1]) for s in range(num_seeds)]
            for r, name in enumerate(REGIME_ROWS)},
        "base_pass_at_k": {name: _floats(base_mean[r]) for r, name in enumerate(REGIME_ROWS)},
        "final_pass_at_k": {name: _floats(final_mean[r]) for r, name in enumerate(REGIME_ROWS)},
        "final_pass_at_k_ci95": {name: _floats(final_ci[r])
                                 for r, name in enumerate(REGIME_ROWS)},
        "delta_pass_at_k": {name: _floats(delta_mean[r]) for r, name in enumerate(REGIME_ROWS)},
        "delta_pass_at_k_ci95": {name: _floats(delta_ci[r])
                                 for r, name in enumerate(REGIME_ROWS)},
        "final": {
            "delta_pass_at_k_headline": {
                name: _stat(delta_slrk[:, -1, r, :]) for r, name in enumerate(REGIME_ROWS)},
            "lost": {name: _stat(m.lost_r[:, -1, r]) for r, name in enumerate(REGIME_ROWS)},
            "declined": {name: _stat(m.declined_r[:, -1, r])
                         for r, name in enumerate(REGIME_ROWS)},
            "entropy": {name: _stat(m.entropy_r[:, -1, r]) for r, name in enumerate(REGIME_ROWS)},
            "kl_to_base": {name: _stat(m.kl_r[:, -1, r]) for r, name in enumerate(REGIME_ROWS)},
            "samples_generated": _stat(m.samples[:, -1]),
            "updates": _stat(m.updates[:, -1]),
        },
        "curves": {  # means over seeds, one value per logged step
            "delta_pass_at_1": {name: _floats(delta_slrk[:, :, r, 0].mean(0))
                                for r, name in enumerate(REGIME_ROWS)},
            "delta_pass_at_256": {name: _floats(delta_slrk[:, :, r, -1].mean(0))
                                  for r, name in enumerate(REGIME_ROWS)},
            "lost": {name: _floats(m.lost_r[:, :, r].mean(0)) for r, name in enumerate(REGIME_ROWS)},
            "entropy": {name: _floats(m.entropy_r[:, :, r].mean(0))
                        for r, name in enumerate(REGIME_ROWS)},
            "samples_generated": _floats(m.samples.mean(0)),
            "batch_reward": _floats(run.stats.reward.mean(0)),
            "informative_fraction": _floats(run.stats.informative.mean(0)),
            "paired_fraction": _floats(run.stats.paired.mean(0)),
        },
        "trajectories": {  # seed 0: exact p(x) of a sample of prompts at every logged step
            "seed": 0,
            "prompt_index": run.tracked_idx_sn[0].tolist(),
            "regime": [REGIME_ROWS[int(r)] for r in run.regime_sp[0][run.tracked_idx_sn[0]]],
            "p_base": _floats(run.p_base_sp[0][run.tracked_idx_sn[0]]),
            "p": [_floats(row) for row in np.asarray(m.p_tracked_n[0], np.float64).T],
        },
    }
    return out


def summarize(runs: Sequence[SimRun], cfg: SimConfig) -> dict:
    """The whole simulation.json document."""
    max_k = MAX_K
    return {
        "config": dataclasses.asdict(cfg),
        "regimes": list(REGIME_ROWS),
        "ks": list(range(1, max_k + 1)),
        "headline_ks": list(HEADLINE_KS),
        "steps": runs[0].steps_l.tolist() if runs else [],
        "note": ("pass@k is exact: mean over a regime's prompts of 1 - (1 - p(x))^k with the "
                 "policy's exact p(x); *_ci95 are 95% t-interval half-widths over seeds; "
                 "'lost' counts base-solvable prompts (regime != out_of_reach) whose p(x) "
                 "is now out of reach at n = regime_n."),
        "methods": {run.method: summarize_run(run, max_k) for run in runs},
    }


def write_json(summary: dict, workdir: str | os.PathLike, name: str = "simulation.json"):
    return atomic.write_json(pathlib.Path(workdir) / name, summary, indent=None, separators=(",", ":"),
                             allow_nan=False, sort_keys=False)


def _save_png(fig, path: pathlib.Path) -> None:
    with atomic.replaced(path, suffix=".tmp.png") as tmp:
        fig.savefig(tmp, dpi=60)


# ---------------------------------------------------------------------------- plots


def _band(ax, x, values_s, label):
    mean, half = mean_ci(values_s)
    line, = ax.plot(x, mean, label=label)
    if np.all(np.isfinite(half)):
        ax.fill_between(x, mean - half, mean + half, alpha=0.2, color=line.get_color())


def write_plots(runs: Sequence[SimRun], workdir: str | os.PathLike) -> list[pathlib.Path]:
    """Δpass@k by regime vs step, lost prompts vs step, p_base vs p_final, Δpass@k vs k."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    paths = []

    fig, axes = plt.subplots(2, NUM_REGIMES, figsize=(4 * NUM_REGIMES, 6.5), sharex=True)
    for row, (k_index, k) in enumerate(((0, 1), (len(HEADLINE_KS) - 1, HEADLINE_KS[-1]))):
        for r in range(NUM_REGIMES):
            ax = axes[row, r]
            for run in runs:
                delta = run.metrics.passk_rk[:, :, r, k_index] - run.metrics.passk_rk[:, :1, r, k_index]
                _band(ax, run.steps_l, delta, run.method)
            ax.axhline(0.0, color="k", lw=0.5)
            ax.set_title(f"{REGIME_ROWS[r]}: Δpass@{k}")
            if row == 1:
                ax.set_xlabel("step")
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    paths.append(workdir / "delta_passk_by_regime.png")
    _save_png(fig, paths[-1])
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for run in runs:
        _band(axes[0], run.steps_l, run.metrics.lost_r[:, :, -1], run.method)
        _band(axes[1], run.steps_l, run.metrics.lost_r[:, :, 1], run.method)
    axes[0].set_title("lost base-solvable prompts (all)")
    axes[1].set_title("lost boundary prompts")
    for ax in axes:
        ax.set_xlabel("step")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    paths.append(workdir / "lost_prompts.png")
    _save_png(fig, paths[-1])
    plt.close(fig)

    cols = len(runs)
    fig, axes = plt.subplots(1, cols, figsize=(3.6 * cols, 3.6), squeeze=False)
    rng = np.random.default_rng(0)
    for ax, run in zip(axes[0], runs):
        num_p = run.p_base_sp.shape[1]
        pick = rng.choice(num_p, size=min(num_p, 3000), replace=False)
        floor = 1e-7
        for r in range(NUM_REGIMES):
            sel = pick[run.regime_sp[0][pick] == r]
            ax.scatter(np.maximum(run.p_base_sp[0][sel], floor),
                       np.maximum(run.p_final_sp[0][sel], floor), s=2, label=REGIME_ROWS[r])
        ax.plot([floor, 1], [floor, 1], "k", lw=0.5)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(run.method)
        ax.set_xlabel("p_base")
    axes[0, 0].set_ylabel("p_final (seed 0)")
    axes[0, 0].legend(fontsize=7, markerscale=4)
    fig.tight_layout()
    paths.append(workdir / "pbase_vs_pfinal.png")
    _save_png(fig, paths[-1])
    plt.close(fig)

    fig, axes = plt.subplots(1, NUM_REGIMES + 1, figsize=(3.6 * (NUM_REGIMES + 1), 3.4))
    ks = np.arange(1, MAX_K + 1)
    for run in runs:
        deltas = np.stack([
            regime_passk_curve(run.p_final_sp[s], run.regime_sp[s])
            - regime_passk_curve(run.p_base_sp[s], run.regime_sp[s])
            for s in range(run.p_base_sp.shape[0])])
        for r, ax in enumerate(axes):
            _band(ax, ks, deltas[:, r], run.method)
    for r, ax in enumerate(axes):
        ax.axhline(0.0, color="k", lw=0.5)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{REGIME_ROWS[r]}: final Δpass@k")
        ax.set_xlabel("k")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    paths.append(workdir / "delta_passk_final.png")
    _save_png(fig, paths[-1])
    plt.close(fig)
    return paths


def study_table(summaries: dict[str, dict], *, regime: str = "boundary",
                methods: Sequence[str] | None = None) -> str:
    """Markdown table over several simulation.json documents (label -> summary).

    Columns: final Δpass@1 and Δpass@256 on ``regime`` and overall, and lost prompts,
    as mean ± 95% half-width over seeds. ``methods``: only these rows (default all).
    """
    def cell(stat, index=None):
        mean, half = stat["mean"], stat["ci95"]
        if index is not None:
            mean, half = mean[index], half[index]
        return f"{mean:+.3f} ± {half:.3f}" if half is not None else f"{mean:+.3f}"

    def count(stat):
        half = stat["ci95"]
        return f"{stat['mean']:.0f} ± {half:.0f}" if half is not None else f"{stat['mean']:.0f}"

    lines = [f"| run | method | Δpass@1 {regime} | Δpass@256 {regime} | Δpass@1 all | "
             f"Δpass@256 all | lost {regime} | lost all |",
             "|---|---|---|---|---|---|---|---|"]
    for label, summary in summaries.items():
        for method, res in summary["methods"].items():
            if methods is not None and method not in methods:
                continue
            d = res["final"]["delta_pass_at_k_headline"]
            lost = res["final"]["lost"]
            lines.append(
                f"| {label} | {method} | {cell(d[regime], 0)} | {cell(d[regime], -1)} | "
                f"{cell(d['overall'], 0)} | {cell(d['overall'], -1)} | {count(lost[regime])} | "
                f"{count(lost['overall'])} |")
    return "\n".join(lines)
