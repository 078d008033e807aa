"""The simulator's predictions beside the C1–C5 study's measurements (issue 39).

    python -m experiments.sim_vs_study [--sim=experiments/results/sim] \
        [--study=experiments/results/study/compare.json]

prints the markdown table of ``experiments/results/sim/README.md`` ("Predictions against
the study"); a test rebuilds it from the committed files and checks the README's rows.

Each row is one contrast and one metric. The simulator's value is a paired difference
over its 8 seeds (mean [95% t-interval]) from the equal-budget runs
(``study_budget*``). The study's is its paired difference over 3 seeds
(``compare.json``: ``paired_differences``, ``contrasts``, ``change_from_base``).

The two have different units (10,000 simulated prompts against 80 held-out prompts; an
exact out-of-reach test against 0 of 256 samples), so each simulator difference is also
put on the study's scale: multiplied by (the study's GRPO change from the base) /
(the simulator's GRPO change from the base) for the same metric, with the ends of both
intervals (for "lost", the study's change is its excess over the losses expected by
chance). C1 fixes these factors, so C1 checks signs only.

Verdict:
  agrees        the study's interval excludes 0 on the side the simulator predicts, and
                meets the scaled prediction;
  agrees in sign, not in size
                ... but lies wholly beyond or short of the scaled prediction;
  disagrees     the study's interval excludes 0 on the other side, or it does not meet
                the scaled prediction at all while including 0 (the predicted effect is
                ruled out);
  not detected  the study's interval includes 0 and meets the scaled prediction.
"""

from __future__ import annotations

import json
import os
from typing import NamedTuple

import numpy as np
from absl import app, flags

from jaxrl_vr.sim.report import mean_ci

SIM_RUNS = {  # label -> (sim run folder, method)
    "grpo": ("study_budget", "grpo"),
    "loo": ("study_budget", "loo"),
    "dr_grpo": ("study_budget", "dr_grpo"),
    "maxrl": ("study_budget", "maxrl"),
    "curverl": ("study_budget", "curverl"),
    "pairing": ("study_budget", "pairing"),
    "dapo": ("study_budget", "dapo"),
    "loo+dapo": ("study_budget", "loo+dapo"),
    "pba_oracle": ("study_budget", "pba_oracle"),
    "pba_trainer": ("study_budget", "pba_trainer"),
    "pba_trainer charged": ("study_budget_pba_charged", "pba_trainer"),
    "pba_trainer n=8 charged": ("study_budget_pba8_charged", "pba_trainer"),
}

# (claim, study arm A, study arm B or "base", sim A, sim B or "base"); A − B.
CONTRASTS = (
    ("C1", "grpo", "base", "grpo", "base"),
    ("C2", "pba", "grpo", "pba_trainer", "grpo"),
    ("C2", "pba", "grpo", "pba_oracle", "grpo"),
    ("C2", "pba8_charged", "grpo", "pba_trainer n=8 charged", "grpo"),
    ("C2", "pba_charged", "grpo", "pba_trainer charged", "grpo"),
    ("C3", "curverl", "grpo", "curverl", "grpo"),
    ("C3", "maxrl", "grpo", "maxrl", "grpo"),
    ("C3", "curverl", "maxrl", "curverl", "maxrl"),
    ("C4", "pairing_wgrpo", "dapo", "pairing", "dapo"),
    ("C4", "pairing_wgrpo", "grpo", "pairing", "grpo"),
    ("C5", "loo", "grpo", "loo", "grpo"),
    ("C5", "dr_grpo", "grpo", "dr_grpo", "grpo"),
    ("C5", "dapo", "grpo", "dapo", "grpo"),
    ("C5", "loo_gspo_dapo", "loo_gspo", "loo+dapo", "loo"),
)
# pass@1: overall; boundary pass@256; lost: base-solvable prompts lost (all regimes).
METRICS = ("pass@1", "boundary pass@256", "lost")
NOT_MODELLED = ("C5: GSPO's sequence ratio (gspo − grpo) is not modelled: the simulator takes one "
                "on-policy step per batch, so there is no importance ratio to clip.")


class Interval(NamedTuple):
    mean: float
    low: float
    high: float


def _sim_values(summary: dict, method: str, metric: str) -> np.ndarray:
    """Per-seed final value − base value of one simulator method: float [S]."""
    final = summary["methods"][method]["final"]
    if metric == "lost":
        return np.asarray(final["lost"]["overall"]["per_seed"], np.float64)
    regime = "overall" if metric == "pass@1" else "boundary"
    index = 0 if metric == "pass@1" else -1  # headline ks: 1, ..., 256
    return np.asarray([seed[index] for seed in
                       final["delta_pass_at_k_headline"][regime]["per_seed"]], np.float64)


def _interval(values_s: np.ndarray) -> Interval:
    mean, half = mean_ci(values_s)
    return Interval(float(mean), float(mean - half), float(mean + half))


def load_sim(root: str) -> dict[str, dict]:
    folders = sorted({folder for folder, _ in SIM_RUNS.values()})
    out = {}
    for folder in folders:
        with open(os.path.join(root, folder, "simulation.json")) as f:
            out[folder] = json.load(f)
    return out


def sim_difference(sims: dict, a: str, b: str, metric: str) -> Interval:
    """Paired (by seed) simulator difference a − b, or a's change from the base."""
    folder_a, method_a = SIM_RUNS[a]
    values = _sim_values(sims[folder_a], method_a, metric)
    if b != "base":
        folder_b, method_b = SIM_RUNS[b]
        values = values - _sim_values(sims[folder_b], method_b, metric)
    return _interval(values)


def study_difference(study: dict, a: str, b: str, metric: str) -> Interval:
    """The study's paired difference a − b (or a's change from the base; for "lost" the
    excess over the losses expected by chance), mean and 95% t-interval over seeds."""
    if b == "base":
        if metric == "lost":
            runs = study["per_run"][a]
            excess = [runs[s]["lost"] - runs[s]["lost_expected_by_chance"] for s in sorted(runs)]
            return _interval(np.asarray(excess, np.float64))
        key = {"pass@1": "Δpass@1 vs base", "boundary pass@256": "boundary Δpass@256 vs base"}[metric]
        entry = study["change_from_base"][a][key]
    elif b == study["baseline"]:
        entry = study["paired_differences"][a][metric]
    else:
        entry = study["contrasts"][f"{a} − {b}"][metric]
    return Interval(entry["mean"], entry["low"], entry["high"])


def scale_factor(sims: dict, study: dict, metric: str) -> Interval:
    """(the study's GRPO change from the base) / (the simulator's), with the range of the
    ratio over both intervals' ends (the mean is the ratio of the means)."""
    sim = sim_difference(sims, "grpo", "base", metric)
    real = study_difference(study, "grpo", "base", metric)
    ratios = [r / s for r in (real.low, real.high) for s in (sim.low, sim.high)]
    return Interval(real.mean / sim.mean, min(ratios), max(ratios))


def verdict(sim: Interval, scaled: Interval, real: Interval, *, sign_only: bool = False) -> str:
    sign = np.sign(sim.mean) if (sim.low > 0 or sim.high < 0) else 0.0
    detected = np.sign(real.mean) if (real.low > 0 or real.high < 0) else 0.0
    meets = real.low <= scaled.high and scaled.low <= real.high
    if detected and sign and detected != sign:
        return "disagrees"
    if detected and sign == detected:
        return "agrees" if (meets or sign_only) else "agrees in sign, not in size"
    if detected:  # the simulator predicted no difference
        return "agrees" if meets else "disagrees"
    return "not detected" if (meets or sign_only) else "disagrees"


def _fmt(x: float, metric: str) -> str:
    return f"{x:+.1f}" if metric == "lost" else f"{x:+.3f}"


def _cell(iv: Interval, metric: str) -> str:
    return f"{_fmt(iv.mean, metric)} [{_fmt(iv.low, metric)}, {_fmt(iv.high, metric)}]"


def prediction_table(sims: dict, study: dict) -> str:
    """The README's markdown table (one row per contrast and metric)."""
    factors = {metric: scale_factor(sims, study, metric) for metric in METRICS}
    lines = ["| claim | study arms | simulator methods | metric | simulator | on the study's scale | "
             "study | verdict |", "|---|---|---|---|---:|---:|---:|---|"]
    for claim, real_a, real_b, sim_a, sim_b in CONTRASTS:
        for metric in METRICS:
            sim = sim_difference(sims, sim_a, sim_b, metric)
            factor = factors[metric]
            ends = [e * f for e in (sim.low, sim.high) for f in (factor.low, factor.high)]
            scaled = Interval(sim.mean * factor.mean, min(ends), max(ends))
            real = study_difference(study, real_a, real_b, metric)
            label = "lost (excess over chance)" if (metric == "lost" and real_b == "base") else metric
            lines.append(
                f"| {claim} | {real_a} − {real_b} | {sim_a} − {sim_b} | {label} | {_cell(sim, metric)} "
                f"| {_cell(scaled, metric)} | {_cell(real, metric)} | "
                f"{verdict(sim, scaled, real, sign_only=claim == 'C1')} |")
    return "\n".join(lines)


def scale_table(sims: dict, study: dict) -> str:
    """The factors that put simulator differences on the study's scale."""
    lines = ["| metric | simulator GRPO − base | study GRPO − base | factor [range] |",
             "|---|---:|---:|---:|"]
    for metric in METRICS:
        sim = sim_difference(sims, "grpo", "base", metric)
        real = study_difference(study, "grpo", "base", metric)
        factor = scale_factor(sims, study, metric)
        lines.append(f"| {metric} | {_cell(sim, metric)} | {_cell(real, metric)} | "
                     f"{factor.mean:.3g} [{factor.low:.3g}, {factor.high:.3g}] |")
    return "\n".join(lines)


# Settings of the κ and ρ sweeps (label -> folder); each holds grpo and the RATIO_METHODS.
SWEEPS = {
    "κ=64": "kappa_64", "κ=256 (main)": "study_budget", "κ=1024": "kappa_1024",
    "fixed, ρ=0.5": "sharing_fixed_0.5", "fixed, ρ=1.0": "sharing_fixed_1.0",
}
# simulator method -> the study's arm
RATIO_METHODS = {"pba_trainer": "pba", "curverl": "curverl", "maxrl": "maxrl",
                 "pairing": "pairing_wgrpo"}


def _ratio_cell(values_s: np.ndarray) -> str:
    iv = _interval(values_s)
    return f"{iv.mean:.2f} [{iv.low:.2f}, {iv.high:.2f}]"


def ratio_table(root: str, study: dict) -> str:
    """Lost prompts of each method as a fraction of GRPO's, per seed (mean [95% t-interval]):
    the simulator's at each κ / ρ setting, and the study's excess over chance."""
    lines = ["| setting | " + " | ".join(f"{m} / grpo" for m in RATIO_METHODS) + " |",
             "|---|" + "---:|" * len(RATIO_METHODS)]
    for label, folder in SWEEPS.items():
        with open(os.path.join(root, folder, "simulation.json")) as f:
            summary = json.load(f)
        grpo = _sim_values(summary, "grpo", "lost")
        cells = [_ratio_cell(_sim_values(summary, m, "lost") / grpo) for m in RATIO_METHODS]
        lines.append(f"| simulator, {label} | " + " | ".join(cells) + " |")
    runs = study["per_run"]

    def excess(arm):
        return np.asarray([runs[arm][s]["lost"] - runs[arm][s]["lost_expected_by_chance"]
                           for s in sorted(runs[arm])], np.float64)

    cells = [_ratio_cell(excess(arm) / excess("grpo")) for arm in RATIO_METHODS.values()]
    lines.append("| study (excess over chance) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


_SIM = flags.DEFINE_string("sim", "experiments/results/sim", "Folder of the simulator runs.")
_STUDY = flags.DEFINE_string("study", "experiments/results/study/compare.json",
                             "The study's compare.json.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    sims = load_sim(_SIM.value)
    with open(_STUDY.value) as f:
        study = json.load(f)
    print(scale_table(sims, study))
    print()
    print(prediction_table(sims, study))
    print()
    print(ratio_table(_SIM.value, study))
    print()
    print(NOT_MODELLED)


if __name__ == "__main__":
    app.run(main)
