"""Compare training methods over seeds at one token budget: ``python -m experiments.compare``.

    python -m experiments.compare --root=runs/cmp --seeds=0,1,2 --token_budget=2000000 \\
      --arm=grpo --arm="loo=rl.advantage=loo loss.ratio=sequence" --baseline=grpo

Each ``--arm=NAME[=OVERRIDES]`` is a method: space-separated ``key=value`` config overrides
(dotted keys of the config file, without ``--config.``; ``config=PATH[:variant]`` switches
the config file). For every arm × seed this runs, one process each and resumably,

    python -m experiments.train --config=... --workdir=ROOT/NAME/seedS <overrides>
        --config.seed=S [--config.rl.token_budget=N]
    python -m experiments.evaluate --workdir=ROOT/NAME/seedS --checkpoint=final --num_samples=n

(a run with summary.json is not trained again, an evaluation with the same n is reused),
then writes ROOT/compare.json, ROOT/compare.md and overlay plots: mean ± standard error
over seeds of pass@1 and pass@n, overall and per base regime, lost / newly solved prompts,
tokens generated and trained, wall time; and paired differences (by seed) against the
baseline arm with a 95 % t-interval ("no difference detected" when it contains 0).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from absl import app, flags

from jaxrl_vr import eval as eval_lib
from jaxrl_vr import passk
from jaxrl_vr.train import run_io


def define_flags() -> None:
    """Command-line flags (defined only when run as a script, so modules import side-effect free)."""
    flags.DEFINE_string("root", None, "Directory for the runs (ROOT/<arm>/seed<S>) and the table.")
    flags.DEFINE_string("config", "experiments/configs/default.py", "Default config file[:variant].")
    flags.DEFINE_multi_string("arm", [], "NAME[=key=value key=value ...]; repeat per method.")
    flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds (comma-separated).")
    flags.DEFINE_string("baseline", None, "Arm the others are compared with (default: the first).")
    flags.DEFINE_integer(
        "token_budget", None, "Generated-token budget per run (passed as --config.rl.token_budget)."
    )
    flags.DEFINE_integer("num_samples", 256, "n samples per prompt of each evaluation.")
    flags.DEFINE_bool("dry_run", False, "Print the commands and exit.")


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Arm(NamedTuple):
    """One method: a name, its config file and its config overrides."""

    name: str
    config: str
    overrides: tuple[str, ...]


def parse_arm(text: str, default_config: str) -> Arm:
    """``NAME[=key=value key=value ...]`` -> Arm (``config=PATH`` switches the config file)."""
    name, _, rest = text.partition("=")
    name = name.strip()
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"--arm={text!r}: the name must be a non-empty directory name.")
    config, overrides = default_config, []
    for token in rest.split():
        key, sep, value = token.partition("=")
        if not sep or not key:
            raise ValueError(f"--arm={text!r}: override {token!r} is not key=value.")
        key = key.removeprefix("--").removeprefix("config.")
        if key == "config":
            config = value
        elif key == "seed":
            raise ValueError(f"--arm={text!r}: the seed comes from --seeds, not from an arm.")
        else:
            overrides.append(f"{key}={value}")
    return Arm(name, config, tuple(overrides))


def run_dir(root: str, arm: str, seed: int) -> str:
    return os.path.join(os.path.abspath(root), arm, f"seed{seed}")


def train_command(arm: Arm, seed: int, workdir: str, token_budget: int | None) -> list[str]:
    cmd = [sys.executable, "-m", "experiments.train", f"--config={arm.config}", f"--workdir={workdir}"]
    cmd += [f"--config.{o}" for o in arm.overrides] + [f"--config.seed={seed}"]
    if token_budget is not None:
        cmd.append(f"--config.rl.token_budget={int(token_budget)}")
    return cmd


def evaluate_command(workdir: str, num_samples: int) -> list[str]:
    return [sys.executable, "-m", "experiments.evaluate", f"--workdir={workdir}", "--checkpoint=final",
            f"--num_samples={num_samples}", "--noprogress"]


def _evaluation_path(workdir: str) -> str:
    return os.path.join(workdir, "eval", "final", "evaluation.json")


def _load_evaluation(workdir: str, num_samples: int) -> dict | None:
    path = _evaluation_path(workdir)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        evaluation = json.load(f)
    return evaluation if evaluation.get("n") == num_samples else None


def _run_complete(workdir: str) -> bool:
    try:
        return run_io.read_run_stats(workdir).complete
    except FileNotFoundError:
        return False


def _subprocess(cmd: list[str], log_path: str) -> None:
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "a") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode:
        raise RuntimeError(f"command failed (exit {proc.returncode}), see {log_path}: {' '.join(cmd)}")


def run_grid(
    root: str,
    arms: Sequence[Arm],
    seeds: Sequence[int],
    *,
    token_budget: int | None,
    num_samples: int,
    runner: Callable[[list[str], str], None] = _subprocess,
    log: Callable[[str], None] = print,
) -> None:
    """Trains and evaluates every arm × seed that is not already done (resumable)."""
    for arm in arms:
        for seed in seeds:
            workdir = run_dir(root, arm.name, seed)
            logs = os.path.join(os.path.abspath(root), "logs", f"{arm.name}-seed{seed}")
            if not _run_complete(workdir):
                log(f"[compare] train {arm.name} seed {seed}")
                runner(train_command(arm, seed, workdir, token_budget), logs + "-train.log")
            if _load_evaluation(workdir, num_samples) is None:
                log(f"[compare] evaluate {arm.name} seed {seed} (n = {num_samples})")
                runner(evaluate_command(workdir, num_samples), logs + "-evaluate.log")


def _run_metrics(evaluation: Mapping[str, Any], stats: run_io.RunStats) -> dict[str, float | None]:
    """The per-run numbers of the table (one row per metric)."""
    n = evaluation["n"]
    out: dict[str, float | None] = {
        "pass@1": evaluation["pass_at_k"]["1"],
        f"pass@{n}": evaluation["pass_at_k"][str(n)],
    }
    for name in passk.REGIMES:
        reg = evaluation["regimes"][name]
        curve = reg["pass_at_k"] if reg["count"] else None
        out[f"{name} pass@1"] = None if curve is None else curve["1"]
        out[f"{name} pass@{n}"] = None if curve is None else curve[str(n)]
    out["lost"] = evaluation.get("lost")
    out["lost_expected_by_chance"] = evaluation.get("lost_expected_by_chance")
    out["newly_solved"] = evaluation.get("newly_solved")
    out["newly_solved_expected_by_chance"] = evaluation.get("newly_solved_expected_by_chance")
    out["generated_tokens"] = stats.generated_tokens
    out["trained_tokens"] = stats.trained_tokens
    out["rl_time_s"] = stats.rl_time_s
    out["wall_time_s"] = stats.wall_time_s
    return out


def collect_table(
    root: str,
    arms: Sequence[Arm],
    seeds: Sequence[int],
    *,
    baseline: str,
    num_samples: int,
) -> dict[str, Any]:
    """The comparison table from the evaluated runs (missing runs are listed, not fatal)."""
    per_run: dict[str, dict[int, dict]] = {}
    curves: dict[str, dict[int, list]] = {}
    missing = []
    ks = eval_lib.headline_ks(num_samples)
    for arm in arms:
        per_run[arm.name], curves[arm.name] = {}, {}
        for seed in seeds:
            workdir = run_dir(root, arm.name, seed)
            evaluation = _load_evaluation(workdir, num_samples)
            if evaluation is None:
                missing.append(f"{arm.name}/seed{seed}")
                continue
            per_run[arm.name][seed] = _run_metrics(evaluation, run_io.read_run_stats(workdir))
            curves[arm.name][seed] = [evaluation["pass_at_k"][str(k)] for k in ks]
            if evaluation.get("base"):
                curves.setdefault("base", {})[(arm.name, seed)] = [evaluation["base"]["pass_at_k"][str(k)] for k in ks]
    metrics = list(next((row for runs in per_run.values() for row in runs.values()), {}))
    summary = {}
    for arm in arms:
        summary[arm.name] = {}
        for metric in metrics:
            s = eval_lib.seed_summary([row[metric] for row in per_run[arm.name].values()])
            summary[arm.name][metric] = s._asdict()
    differences = {}
    for arm in arms:
        if arm.name == baseline:
            continue
        differences[arm.name] = {
            metric: eval_lib.paired_difference(
                {s: row[metric] for s, row in per_run[arm.name].items()},
                {s: row[metric] for s, row in per_run[baseline].items()},
            )._asdict()
            for metric in metrics
        }
    mean_curves = {
        name: [sum(c[i] for c in runs.values()) / len(runs) for i in range(len(ks))]
        for name, runs in curves.items() if runs
    }
    return eval_lib.to_jsonable({
        "root": os.path.abspath(root),
        "arms": [arm._asdict() for arm in arms],
        "seeds": list(seeds),
        "baseline": baseline,
        "num_samples": num_samples,
        "ks": ks,
        "metrics": metrics,
        "per_run": {name: {str(s): row for s, row in runs.items()} for name, runs in per_run.items()},
        "summary": summary,
        "paired_differences": differences,
        "mean_pass_at_k": mean_curves,
        "missing_runs": missing,
    })


def _pm(entry: Mapping[str, Any], digits: int) -> str:
    mean, se = entry["mean"], entry["stderr"]
    if mean is None:
        return "—"
    return f"{mean:.{digits}f}" + ("" if se is None else f" ± {se:.{digits}f}")


def _digits(metric: str) -> int:
    return 0 if "tokens" in metric else 1 if metric.endswith("_s") else 3 if "pass@" in metric else 2


def table_markdown(table: Mapping[str, Any], token_budget: int | None = None) -> str:
    arms = [a["name"] for a in table["arms"]]
    lines = ["# Comparison", ""]
    lines.append(
        f"Seeds {table['seeds']}; n = {table['num_samples']} samples per prompt; "
        + (f"token budget {token_budget} generated tokens per run." if token_budget else
           "no token budget given: runs stop at their configured steps.")
    )
    lines += ["", "## Mean ± standard error over seeds", ""]
    lines.append("| metric | " + " | ".join(arms) + " |")
    lines.append("|---|" + "---:|" * len(arms))
    for metric in table["metrics"]:
        cells = [_pm(table["summary"][a][metric], _digits(metric)) for a in arms]
        lines.append(f"| {metric} | " + " | ".join(cells) + " |")
    baseline = table["baseline"]
    for name, diffs in table["paired_differences"].items():
        lines += ["", f"## {name} − {baseline} (paired by seed, 95 % t-interval)", "",
                  "| metric | mean difference | 95 % interval | seeds | verdict |", "|---|---:|---:|---:|---|"]
        for metric in table["metrics"]:
            d = diffs[metric]
            digits = _digits(metric)
            interval = "—" if d["low"] is None else f"[{d['low']:.{digits}f}, {d['high']:.{digits}f}]"
            mean = "—" if d["mean"] is None else f"{d['mean']:+.{digits}f}"
            lines.append(f"| {metric} | {mean} | {interval} | {d['count']} | {d['verdict']} |")
    if table["missing_runs"]:
        lines += ["", f"Missing (not evaluated): {', '.join(table['missing_runs'])}."]
    lines += ["", "![pass@k](compare_passk.png)", "", "![regimes](compare_regimes.png)", ""]
    return "\n".join(lines)


def write_table(table: Mapping[str, Any], root: str, token_budget: int | None = None) -> dict[str, str]:
    """ROOT/compare.json, compare.md, compare_passk.png, compare_regimes.png."""
    from jaxrl_vr.eval.report import _atomic_write
    import pathlib

    root_path = pathlib.Path(root)
    paths = {}
    if table["mean_pass_at_k"]:
        paths["passk"] = str(eval_lib.plot_passk_curves(
            table["mean_pass_at_k"], table["ks"], root_path / "compare_passk.png",
            title="pass@k, mean over seeds"))
    n = table["num_samples"]
    values = {a["name"]: {} for a in table["arms"]}
    errors = {a["name"]: {} for a in table["arms"]}
    for name in values:
        for group in ["all"] + list(passk.REGIMES):
            metric = f"pass@{n}" if group == "all" else f"{group} pass@{n}"
            entry = table["summary"][name].get(metric)
            if entry and entry["mean"] is not None:
                values[name][group] = entry["mean"]
                errors[name][group] = entry["stderr"] if entry["stderr"] is not None else float("nan")
    if any(values.values()):
        paths["regimes"] = str(eval_lib.plot_bars(values, root_path / "compare_regimes.png", errors=errors,
                                                  title=f"pass@{n} by base regime (± s.e. over seeds)",
                                                  ylabel=f"pass@{n}"))
    text = json.dumps(table, indent=1, sort_keys=True, allow_nan=False)
    paths["json"] = str(_atomic_write(root_path / "compare.json", text + "\n"))
    paths["markdown"] = str(_atomic_write(root_path / "compare.md", table_markdown(table, token_budget)))
    return paths


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not flags.FLAGS.root:
        raise app.UsageError("--root is required, e.g. --root=runs/compare")
    if not flags.FLAGS.arm:
        raise app.UsageError("give at least one --arm=NAME[=key=value ...]")
    try:
        arms = [parse_arm(text, flags.FLAGS.config) for text in flags.FLAGS.arm]
        seeds = [int(s) for s in flags.FLAGS.seeds]
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    names = [a.name for a in arms]
    if len(set(names)) != len(names):
        print(f"error: arm names must be unique, got {names}.", file=sys.stderr)
        return 2
    baseline = flags.FLAGS.baseline or names[0]
    if baseline not in names:
        print(f"error: --baseline={baseline} is not one of the arms {names}.", file=sys.stderr)
        return 2
    if flags.FLAGS.dry_run:
        for arm in arms:
            for seed in seeds:
                workdir = run_dir(flags.FLAGS.root, arm.name, seed)
                print(" ".join(train_command(arm, seed, workdir, flags.FLAGS.token_budget)))
                print(" ".join(evaluate_command(workdir, flags.FLAGS.num_samples)))
        return 0
    try:
        run_grid(flags.FLAGS.root, arms, seeds, token_budget=flags.FLAGS.token_budget, num_samples=flags.FLAGS.num_samples)
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    table = collect_table(flags.FLAGS.root, arms, seeds, baseline=baseline, num_samples=flags.FLAGS.num_samples)
    paths = write_table(table, flags.FLAGS.root, flags.FLAGS.token_budget)
    print(f"[compare] wrote {paths['markdown']}")
    return 0


if __name__ == "__main__":
    define_flags()
    app.run(main)
