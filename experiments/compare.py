"""Compare training methods over seeds at one token budget: ``python -m experiments.compare``.

    python -m experiments.compare --root=runs/cmp --seeds=0,1,2 --token_budget=2000000 \\
      --arm=grpo --arm="loo=rl.estimator=loo loss.ratio=sequence" --baseline=grpo

Each ``--arm=NAME[=OVERRIDES]`` is a method: space-separated ``key=value`` config overrides
(dotted keys of the config file, without ``--config.``; ``config=PATH[:variant]`` switches
the config file). For every arm × seed this runs, one process each and resumably,

    python -m experiments.train --config=... --workdir=ROOT/NAME/seedS <overrides>
        --config.seed=S [--config.rl.budget.tokens=N]
    python -m experiments.evaluate --workdir=ROOT/NAME/seedS --checkpoint=final --num_samples=n

(a run with summary.json is not trained again, an evaluation with the same n is reused),
``--jobs`` of them at a time, then writes ROOT/compare.json, ROOT/compare.md and overlay plots: mean ± standard error
over seeds of pass@1 and pass@n, overall and per base regime, lost / newly solved prompts,
tokens generated and trained, wall time; and paired differences (by seed) against the
baseline arm with a 95 % t-interval ("no difference detected" when it contains 0).

Every arm's config is built and checked before any run starts (a mistyped or moved key
fails at once, naming the arm). ``--common`` overrides apply to every arm.
``--budget_fractions=0.25,0.5`` also keeps and evaluates each run's state where it crossed
those fractions of the token budget (``rl.budget.fractions``) and plots pass@1 / pass@n against the budget spent. Arms of one
seed whose overrides leave ``task.*``, ``model.*``, ``sft.*`` and ``eval.*`` alone have the
same SFT base and base evaluations; unless ``--noshare_base``, the first such arm builds
them and the others start from a copy (the copies' digests are checked on load).

Evidence. ``--collect_evidence=DIR`` also copies each run's small files (config.json,
summary.json, metrics.jsonl, budget marks, calibration caches, the evaluations compare reads;
``NAME.gz`` when larger than 64 KiB) to DIR/<arm>/seed<S>/, never checkpoints or models.
``--report_only`` trains and evaluates nothing and rebuilds compare.json, compare.md and the
plots from the per-run files under ``--root`` (runs, or such evidence) into ``--out``
(default ``--root``); without ``--arm`` it takes the arms, seeds, baseline, contrasts, n,
fractions and budget from ``OUT/compare.json`` (a flag given replaces its value):

    python -m experiments.compare ...the study's flags... --report_only \
      --out=experiments/results/study --collect_evidence=experiments/results/study/runs
    python -m experiments.compare --report_only --root=experiments/results/study/runs \
      --out=experiments/results/study
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from absl import app, flags

from experiments import cli

from experiments.config_files import build_config, split_override
from jaxrl_vr import eval as eval_lib
from jaxrl_vr import layout, passk
from jaxrl_vr.atomic import write_text
from jaxrl_vr.train import parts as train_parts
from jaxrl_vr.train import run_io
from jaxrl_vr.train.config import validate


def define_flags() -> None:
    """Command-line flags (defined only when run as a script, so modules import side-effect free)."""
    flags.DEFINE_string("root", None, "Directory for the runs (ROOT/<arm>/seed<S>) and the table.")
    flags.DEFINE_string("config", "experiments/configs/default.py", "Default config file[:variant].")
    flags.DEFINE_multi_string("arm", [], "NAME[=key=value key=value ...]; repeat per method.")
    flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds (comma-separated).")
    flags.DEFINE_string("baseline", None, "Arm the others are compared with (default: the first).")
    flags.DEFINE_integer(
        "token_budget", None, "Generated-token budget per run (passed as --config.rl.budget.tokens)."
    )
    flags.DEFINE_integer("num_samples", 256, "n samples per prompt of each evaluation.")
    flags.DEFINE_string("common", "", "key=value overrides applied to every arm (space-separated).")
    flags.DEFINE_list("budget_fractions", [], "Also evaluate at these fractions of the token budget.")
    flags.DEFINE_integer("eval_responses_per_call", 0, "experiments.evaluate --responses_per_call (0 = each run's "
                         "eval.prompts_per_chunk x eval.num_samples).")
    flags.DEFINE_integer("jobs", 1, "Runs trained / evaluated at the same time (one process each).")
    flags.DEFINE_multi_string("contrast", [], "A,B: also report paired differences A − B (repeatable).")
    flags.DEFINE_bool("share_base", True, "Copy a seed's SFT base and base evaluations between arms.")
    flags.DEFINE_bool("dry_run", False, "Print the commands and exit.")
    flags.DEFINE_bool("report_only", False, "Train and evaluate nothing: rebuild the table and plots from the "
                      "per-run files under --root (runs, or their evidence); without --arm, the arms and "
                      "settings recorded in OUT/compare.json (flags given replace them).")
    flags.DEFINE_string("out", None, "Directory for compare.json, compare.md and the plots (default: --root).")
    flags.DEFINE_string("collect_evidence", None, "Also copy each run's small files (config, summary, metrics, "
                        "evaluations; gzip-compressed when large) to this directory, as DIR/<arm>/seed<S>/.")


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


def parse_contrast(text: str) -> tuple[str, str]:
    """``A,B`` -> ("A", "B"): the paired difference A − B."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 2 or not all(parts) or parts[0] == parts[1]:
        raise ValueError(f"--contrast={text!r}: give two different arm names, A,B (for A − B).")
    return parts[0], parts[1]


def check_arm(arm: Arm, seed: int, token_budget: int | None, budget_fractions: Sequence[float] = ()) -> None:
    """Builds and validates the config of ``arm`` as its train command will (raises ValueError
    naming the arm and the key), so a bad override fails before any arm has trained."""
    cmd = train_command(arm, seed, "", token_budget, budget_fractions)
    overrides = [split_override(arg) for arg in cmd if arg.startswith("--config.")]
    try:
        validate(build_config(arm.config, overrides))
    except ValueError as err:
        raise ValueError(f"--arm={arm.name}: {err}") from None


def run_dir(root: str, arm: str, seed: int) -> str:
    return os.path.join(os.path.abspath(root), arm, f"seed{seed}")


def with_common(arms: Sequence[Arm], common: str, default_config: str) -> list[Arm]:
    """Prepends the ``--common`` overrides to every arm's own (an arm's value wins)."""
    shared = parse_arm("common=" + common, default_config).overrides if common.strip() else ()
    return [arm._replace(overrides=tuple(shared) + arm.overrides) for arm in arms]


def _fractions_text(fractions: Sequence[float]) -> str:
    return "(" + ",".join(repr(float(f)) for f in fractions) + ",)"


def train_command(arm: Arm, seed: int, workdir: str, token_budget: int | None,
                  budget_fractions: Sequence[float] = ()) -> list[str]:
    cmd = [sys.executable, "-m", "experiments.train", f"--config={arm.config}", f"--workdir={workdir}"]
    cmd += [f"--config.{o}" for o in arm.overrides] + [f"--config.seed={seed}"]
    if token_budget is not None:
        cmd.append(f"--config.rl.budget.tokens={int(token_budget)}")
    if budget_fractions:
        cmd.append(f"--config.rl.budget.fractions={_fractions_text(budget_fractions)}")
    return cmd


def evaluate_command(workdir: str, num_samples: int, checkpoint: str = "final",
                     responses_per_call: int = 0) -> list[str]:
    return [sys.executable, "-m", "experiments.evaluate", f"--workdir={workdir}", f"--checkpoint={checkpoint}",
            f"--num_samples={num_samples}", "--noprogress"] + (
                [f"--responses_per_call={responses_per_call}"] if responses_per_call else [])


def _load_evaluation(workdir: str, num_samples: int, label: str = "final") -> dict | None:
    evaluation = run_io.read_evaluation(workdir, label)
    return evaluation if evaluation is not None and evaluation.get("n") == num_samples else None


def _run_complete(workdir: str) -> bool:
    try:
        return run_io.read_run_stats(workdir).complete
    except FileNotFoundError:
        return False


def _fraction_marks(workdir: str, fractions: Sequence[float]) -> dict[float, dict]:
    """{f: mark} for each requested fraction f at which the run kept a budget checkpoint
    (a mark is {"fraction", "step", "token_budget", "generated_tokens"})."""
    try:
        marks = run_io.budget_marks(workdir)
    except FileNotFoundError:
        return {}
    by_fraction = {round(m["fraction"], 9): m for m in marks}
    return {float(f): by_fraction[round(float(f), 9)] for f in fractions
            if round(float(f), 9) in by_fraction}


def _subprocess(cmd: list[str], log_path: str) -> None:
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "a") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode:
        raise RuntimeError(f"command failed (exit {proc.returncode}), see {log_path}: {' '.join(cmd)}")


# Config sections the SFT base and the base evaluations depend on (with the file and seed).
BASE_SECTIONS = ("task.", "model.", "sft.", "eval.")
BASE_FILES = (layout.BASE, layout.BASE_EVAL, layout.BASE_CALIBRATION)


def shares_base(arm: Arm, donor: Arm) -> bool:
    """Whether ``arm`` has the donor's base: same config file, same base-section overrides."""
    def base_overrides(a: Arm) -> list[str]:
        return sorted(o for o in a.overrides if o.startswith(BASE_SECTIONS))
    return arm.config == donor.config and base_overrides(arm) == base_overrides(donor)


def copy_base(donor_dir: str, workdir: str) -> list[str]:
    """Copies the donor's base files into a workdir that holds no run yet; returns their names."""
    if os.path.exists(os.path.join(workdir, layout.CONFIG)):
        return []
    os.makedirs(workdir, exist_ok=True)
    copied = []
    for name in BASE_FILES:
        src, dst = os.path.join(donor_dir, name), os.path.join(workdir, name)
        if not os.path.exists(src) or os.path.exists(dst):
            continue
        if os.path.isdir(src):
            shutil.copytree(src, dst + ".tmp", dirs_exist_ok=True)
        else:
            shutil.copy(src, dst + ".tmp")
        os.replace(dst + ".tmp", dst)
        copied.append(name)
    return copied


class _Job(NamedTuple):
    arm: Arm
    seed: int
    donor: str | None  # run directory whose base this run copies (None: builds its own)


def plan_jobs(root: str, arms: Sequence[Arm], seeds: Sequence[int], *, share_base: bool) -> list[_Job]:
    """Every arm × seed, donors first (the first arm of a seed that shares a base with others)."""
    donors, jobs = [], []
    for seed in seeds:
        for arm in arms:
            donor = next((d for d in arms if share_base and d is not arm and shares_base(arm, d)
                          and arms.index(d) < arms.index(arm)), None)
            job = _Job(arm, seed, None if donor is None else run_dir(root, donor.name, seed))
            (jobs if donor is not None else donors).append(job)
    return donors + jobs


def run_grid(
    root: str,
    arms: Sequence[Arm],
    seeds: Sequence[int],
    *,
    token_budget: int | None,
    num_samples: int,
    budget_fractions: Sequence[float] = (),
    jobs: int = 1,
    share_base: bool = False,
    responses_per_call: int = 0,
    runner: Callable[[list[str], str], None] = _subprocess,
    log: Callable[[str], None] = print,
) -> None:
    """Trains and evaluates every arm × seed that is not already done (resumable).

    Up to ``jobs`` runs at a time; a run that copies a donor's base waits for the donor's
    training to finish. The first failure stops new runs and is raised once the running
    ones end.
    """
    pending = plan_jobs(root, arms, seeds, share_base=share_base)
    trained: set[str] = set()
    running: set[str] = set()
    errors: list[BaseException] = []
    cond = threading.Condition()

    def work(job: _Job) -> None:
        workdir = run_dir(root, job.arm.name, job.seed)
        logs = os.path.join(os.path.abspath(root), "logs", f"{job.arm.name}-seed{job.seed}")
        if not _run_complete(workdir):
            if job.donor is not None:
                copied = copy_base(job.donor, workdir)
                if copied:
                    log(f"[compare] {job.arm.name} seed {job.seed}: base copied from {job.donor} ({', '.join(copied)})")
            log(f"[compare] train {job.arm.name} seed {job.seed}")
            runner(train_command(job.arm, job.seed, workdir, token_budget, budget_fractions), logs + "-train.log")
        with cond:
            trained.add(workdir)
            cond.notify_all()
        if _load_evaluation(workdir, num_samples) is None:
            log(f"[compare] evaluate {job.arm.name} seed {job.seed} (n = {num_samples})")
            runner(evaluate_command(workdir, num_samples, responses_per_call=responses_per_call),
                   logs + "-evaluate.log")
        for fraction, mark in sorted(_fraction_marks(workdir, budget_fractions).items()):
            step = int(mark["step"])
            if _load_evaluation(workdir, num_samples, str(step)) is None:
                log(f"[compare] evaluate {job.arm.name} seed {job.seed} at {fraction:g} of the budget (step {step})")
                runner(evaluate_command(workdir, num_samples, str(step), responses_per_call=responses_per_call),
                       logs + f"-evaluate-{step}.log")

    def worker() -> None:
        while True:
            with cond:
                while True:
                    if errors or not pending:
                        return
                    ready = next((j for j in pending if j.donor is None or j.donor in trained
                                  or j.donor not in running and _run_complete(j.donor)), None)
                    if ready is None and not running:  # a donor never ran: build own base
                        ready = pending[0]._replace(donor=None)
                        pending[0] = ready
                    if ready is not None:
                        pending.remove(ready)
                        workdir = run_dir(root, ready.arm.name, ready.seed)
                        running.add(workdir)
                        break
                    cond.wait()
            try:
                work(ready)
            except BaseException as err:  # noqa: BLE001 - re-raised in the caller
                with cond:
                    errors.append(err)
            finally:
                with cond:
                    running.discard(workdir)
                    trained.add(workdir)
                    cond.notify_all()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, int(jobs)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def _last_rows_mean(workdir: str, key: str, count: int = 10) -> float | None:
    """Mean of ``key`` over the last ``count`` rows of the run's metrics.jsonl (None if absent)."""
    rows = [r[key] for r in run_io.read_metrics(workdir) if key in r]
    return float(sum(rows[-count:]) / len(rows[-count:])) if rows else None


def _reference_kl_logged(workdir: str) -> bool:
    """Whether the run's "kl" metric is the KL to the base (``parts.needs_reference`` of its
    config's methods); otherwise it is to the behaviour policy and says nothing about how far
    the run moved from the base."""
    try:
        cfg = run_io.read_config(workdir)
    except (run_io.RunNotFoundError, FileNotFoundError, ValueError):
        return True  # a run folder without its config (older evidence): as recorded
    return train_parts.needs_reference(cfg, train_parts.method_hook_types(cfg))


def _run_metrics(evaluation: Mapping[str, Any], stats: run_io.RunStats,
                 workdir: str | None = None) -> dict[str, float | None]:
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
    delta = evaluation.get("delta_pass_at_k")
    out["Δpass@1 vs base"] = None if delta is None else delta["1"]
    out[f"Δpass@{n} vs base"] = None if delta is None else delta[str(n)]
    for name in passk.REGIMES:
        reg = evaluation["regimes"][name]
        d = reg.get("delta_pass_at_k") if reg["count"] else None
        out[f"{name} Δpass@1 vs base"] = None if d is None else d["1"]
        out[f"{name} Δpass@{n} vs base"] = None if d is None else d[str(n)]
    out["lost"] = evaluation.get("lost")
    out["lost_expected_by_chance"] = evaluation.get("lost_expected_by_chance")
    out["newly_solved"] = evaluation.get("newly_solved")
    out["newly_solved_expected_by_chance"] = evaluation.get("newly_solved_expected_by_chance")
    # How far each policy moved, and how many updates it took: a method that loses less
    # coverage while moving less, or with fewer optimizer steps, is not the same finding.
    out["KL to base (last 10 steps)"] = (_last_rows_mean(workdir, "kl")
                                         if workdir is not None and _reference_kl_logged(workdir) else None)
    out["rl_steps"] = stats.rl_steps
    out["generated_tokens"] = stats.generated_tokens
    out["calibration_tokens"] = stats.calibration_tokens  # PBA / pairing passes before RL
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
    budget_fractions: Sequence[float] = (),
    contrasts: Sequence[tuple[str, str]] = (),
) -> dict[str, Any]:
    """The comparison table from the evaluated runs (missing runs are listed, not fatal).

    ``paired_differences`` holds every arm − baseline; ``contrasts`` each requested A − B;
    ``change_from_base`` the t-interval of each "… vs base" metric around 0 (the base of a
    seed is shared by its arms, so that is a paired comparison with the base itself).
    """
    per_run: dict[str, dict[int, dict]] = {}
    chance: dict[str, dict[int, dict]] = {}
    curves: dict[str, dict[int, list]] = {}
    missing = []
    ks = eval_lib.headline_ks(num_samples)
    for arm in arms:
        per_run[arm.name], curves[arm.name], chance[arm.name] = {}, {}, {}
        for seed in seeds:
            workdir = run_dir(root, arm.name, seed)
            evaluation = _load_evaluation(workdir, num_samples)
            if evaluation is None:
                missing.append(f"{arm.name}/seed{seed}")
                continue
            per_run[arm.name][seed] = _run_metrics(evaluation, run_io.read_run_stats(workdir), workdir)
            if evaluation.get("inversion"):
                chance[arm.name][seed] = {key: evaluation["inversion"][key] for key in CHANCE_KEYS}
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
    def paired(a: str, b: str) -> dict:
        return {metric: eval_lib.paired_difference(
                    {s: row[metric] for s, row in per_run[a].items()},
                    {s: row[metric] for s, row in per_run[b].items()})._asdict()
                for metric in metrics}

    differences = {arm.name: paired(arm.name, baseline) for arm in arms if arm.name != baseline}
    contrast_table = {f"{a} − {b}": paired(a, b) for a, b in contrasts}
    change = {
        arm.name: {metric: eval_lib.paired_difference(
                       {s: row[metric] for s, row in per_run[arm.name].items()},
                       {s: 0.0 for s in per_run[arm.name]})._asdict()
                   for metric in metrics if metric.endswith("vs base")}
        for arm in arms
    }
    order = ["base"] + [arm.name for arm in arms]  # the base first: drawn widest, underneath
    mean_curves = {
        name: [sum(c[i] for c in curves[name].values()) / len(curves[name]) for i in range(len(ks))]
        for name in order if curves.get(name)
    }
    budget_curves = (_budget_curves(root, arms, seeds, num_samples, budget_fractions)
                     if budget_fractions else {})
    return eval_lib.to_jsonable({
        "root": _shown_path(root),
        "arms": [arm._asdict() for arm in arms],
        "seeds": list(seeds),
        "baseline": baseline,
        "num_samples": num_samples,
        "ks": ks,
        "metrics": metrics,
        "per_run": {name: {str(s): row for s, row in runs.items()} for name, runs in per_run.items()},
        "per_run_chance": {name: {str(s): row for s, row in runs.items()} for name, runs in chance.items()},
        "summary": summary,
        "paired_differences": differences,
        "contrasts": contrast_table,
        "change_from_base": change,
        "mean_pass_at_k": mean_curves,
        "budget_fractions": [float(f) for f in budget_fractions],
        "contrast_pairs": [list(pair) for pair in contrasts],
        "budget_curves": budget_curves,
        "missing_runs": missing,
    })


def _shown_path(path: str) -> str:
    """``path`` relative to the working directory when it lies inside it (a committed table
    names no machine's folders), else absolute."""
    full, here = os.path.abspath(path), os.getcwd()
    return os.path.relpath(full, here) if full.startswith(here + os.sep) else full


CHANCE_KEYS = ("lost", "lost_expected_by_chance", "lost_chance_sd", "lost_chance_p_value",
               "newly_solved", "newly_solved_expected_by_chance", "newly_solved_chance_p_value")


def _glance_markdown(table: Mapping[str, Any]) -> list[str]:
    """One row per arm: the headline metrics (mean ± s.e. over seeds)."""
    n = table["num_samples"]
    columns = [("pass@1", "pass@1"), (f"pass@{n}", f"pass@{n}"), (f"boundary pass@{n}", f"boundary pass@{n}"),
               ("lost", "lost"), ("lost_expected_by_chance", "lost by chance"),
               ("KL to base (last 10 steps)", "KL to base"), ("rl_steps", "RL steps")]
    columns = [(m, label) for m, label in columns if m in table["metrics"]]
    if not columns:
        return []
    lines = ["", "## At a glance (mean ± standard error over seeds)", "",
             "| arm | " + " | ".join(label for _, label in columns) + " |", "|---|" + "---:|" * len(columns)]
    for arm in (a["name"] for a in table["arms"]):
        cells = [_pm(table["summary"][arm][m], _digits(m)) for m, _ in columns]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return lines


def _chance_markdown(table: Mapping[str, Any]) -> list[str]:
    """Per run: prompts lost (and newly solved) against what sampling alone would give."""
    runs = table.get("per_run_chance") or {}
    if not any(runs.values()):
        return []
    n = table["num_samples"]
    lines = ["", f"## Per run: base-solvable prompts lost (0 of {n}) against chance", "",
             "Chance: the count an unchanged policy would lose to sampling alone (the evaluation's "
             "Poisson-binomial; p two-sided).", "",
             "| arm | seed | lost | expected | sd | p | newly solved | expected | p |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, by_seed in runs.items():
        for seed, c in by_seed.items():
            lines.append(
                f"| {name} | {seed} | {c['lost']} | {c['lost_expected_by_chance']:.1f} | {c['lost_chance_sd']:.1f} "
                f"| {c['lost_chance_p_value']:.2g} | {c['newly_solved']} | "
                f"{c['newly_solved_expected_by_chance']:.1f} | {c['newly_solved_chance_p_value']:.2g} |")
    return lines


def _budget_curves(root: str, arms: Sequence[Arm], seeds: Sequence[int], num_samples: int,
                   fractions: Sequence[float]) -> dict[str, Any]:
    """Per arm: pass@1 / pass@n (mean ± s.e. over seeds) at 0 (base), each fraction and 1 (final).

    A run's point at fraction f is its kept checkpoint where generated tokens first reached
    f · token_budget (``rl.budget_fractions``); "generated_fraction" is the budget share it
    had actually used there.
    """
    n = num_samples
    points = [0.0] + sorted(float(f) for f in fractions) + [1.0]
    out = {}
    for arm in arms:
        values: dict[str, list[list[float]]] = {m: [[] for _ in points] for m in
                                                ("pass@1", f"pass@{n}", "generated_fraction")}
        for seed in seeds:
            workdir = run_dir(root, arm.name, seed)
            final = _load_evaluation(workdir, n)
            if final is None:
                continue
            marks = _fraction_marks(workdir, fractions)
            for i, f in enumerate(points):
                if f == 0.0:
                    ev = final.get("base")
                    used = 0.0
                elif f == 1.0:
                    ev, used = final, None
                elif f in marks:
                    ev = _load_evaluation(workdir, n, str(marks[f]["step"]))
                    used = marks[f]["generated_tokens"] / marks[f]["token_budget"]
                else:
                    ev = None
                if not ev:
                    continue
                values["pass@1"][i].append(ev["pass_at_k"]["1"])
                values[f"pass@{n}"][i].append(ev["pass_at_k"][str(n)])
                if used is not None:
                    values["generated_fraction"][i].append(used)
        out[arm.name] = {"fractions": points}
        for metric, per_point in values.items():
            summaries = [eval_lib.seed_summary(v) for v in per_point]
            out[arm.name][metric] = {"mean": [s.mean for s in summaries],
                                     "stderr": [s.stderr for s in summaries],
                                     "count": [s.count for s in summaries]}
    return out


def _pm(entry: Mapping[str, Any], digits: int) -> str:
    mean, se = entry["mean"], entry["stderr"]
    if mean is None:
        return "—"
    return f"{mean:.{digits}f}" + ("" if se is None else f" ± {se:.{digits}f}")


def _digits(metric: str) -> int:
    if "tokens" in metric or metric == "rl_steps":
        return 0
    return 1 if metric.endswith("_s") else 3 if "pass@" in metric else 4 if "KL" in metric else 2


def table_markdown(table: Mapping[str, Any], token_budget: int | None = None) -> str:
    arms = [a["name"] for a in table["arms"]]
    lines = ["# Comparison", ""]
    lines.append(
        f"Seeds {table['seeds']}; n = {table['num_samples']} samples per prompt; "
        + (f"token budget {token_budget} generated tokens per run." if token_budget else
           "no token budget given: runs stop at their configured steps.")
    )
    lines += _glance_markdown(table)
    lines += ["", "## Mean ± standard error over seeds", ""]
    lines.append("| metric | " + " | ".join(arms) + " |")
    lines.append("|---|" + "---:|" * len(arms))
    for metric in table["metrics"]:
        cells = [_pm(table["summary"][a][metric], _digits(metric)) for a in arms]
        lines.append(f"| {metric} | " + " | ".join(cells) + " |")
    change = table.get("change_from_base") or {}
    change_metrics = [m for m in table["metrics"] if m.endswith("vs base")]
    if change and change_metrics:
        lines += ["", "## Change from the base (95 % t-interval over seeds; the base of a seed is shared by its arms)", "",
                  "| metric | " + " | ".join(arms) + " |", "|---|" + "---:|" * len(arms)]
        for metric in change_metrics:
            cells = []
            for a in arms:
                d = change[a][metric]
                cells.append("—" if d["mean"] is None else f"{d['mean']:+.3f}" + (
                    "" if d["low"] is None else f" [{d['low']:+.3f}, {d['high']:+.3f}]"))
            lines.append(f"| {metric} | " + " | ".join(cells) + " |")
    baseline = table["baseline"]
    by_name = {a["name"]: Arm(a["name"], a["config"], tuple(a["overrides"])) for a in table["arms"]}
    sections = [(f"{name} − {baseline}", name, baseline, diffs)
                for name, diffs in table["paired_differences"].items()]
    sections += [(title, *title.split(" − "), diffs) for title, diffs in (table.get("contrasts") or {}).items()]
    for title, first, second, diffs in sections:
        # With a shared base, "… vs base" rows repeat the rows above them and the chance
        # baselines are identical: leave them out.
        same_base = shares_base(by_name[first], by_name[second])
        lines += ["", f"## {title} (paired by seed, 95 % t-interval)", "",
                  "| metric | mean difference | 95 % interval | seeds | verdict |", "|---|---:|---:|---:|---|"]
        for metric in table["metrics"]:
            if same_base and (metric.endswith("vs base") or metric.endswith("by_chance")):
                continue
            d = diffs[metric]
            digits = _digits(metric)
            interval = "—" if d["low"] is None else f"[{d['low']:.{digits}f}, {d['high']:.{digits}f}]"
            mean = "—" if d["mean"] is None else f"{d['mean']:+.{digits}f}"
            lines.append(f"| {metric} | {mean} | {interval} | {d['count']} | {d['verdict']} |")
    curves = table.get("budget_curves") or {}
    if curves:
        n = table["num_samples"]
        lines += ["", "## Along the budget (mean ± standard error over seeds)", "",
                  "0 is the base, 1 the final policy; at a fraction f, each run's checkpoint where its "
                  "generated tokens first reached f × budget (the share actually used in brackets).", "",
                  "| arm | fraction | pass@1 | pass@" + str(n) + " | seeds |", "|---|---:|---:|---:|---:|"]
        for name, curve in curves.items():
            for i, f in enumerate(curve["fractions"]):
                cell = {m: {"mean": curve[m]["mean"][i], "stderr": curve[m]["stderr"][i]}
                        for m in ("pass@1", f"pass@{n}", "generated_fraction")}
                used = cell["generated_fraction"]["mean"]
                label = f"{f:g}" + ("" if used is None or f in (0.0, 1.0) else f" ({used:.3f})")
                lines.append(f"| {name} | {label} | {_pm(cell['pass@1'], 3)} | {_pm(cell[f'pass@{n}'], 3)} "
                             f"| {curve['pass@1']['count'][i]} |")
    lines += _chance_markdown(table)
    if table["missing_runs"]:
        lines += ["", f"Missing (not evaluated): {', '.join(table['missing_runs'])}."]
    lines += ["", "![pass@k](compare_passk.png)", "", "![regimes](compare_regimes.png)", ""]
    if curves:
        lines += ["![budget](compare_budget.png)", "", "![trade-off](compare_tradeoff.png)", ""]
    return "\n".join(lines)


def write_table(table: Mapping[str, Any], root: str, token_budget: int | None = None) -> dict[str, str]:
    """ROOT/compare.json (the table and ``token_budget``), compare.md, compare_passk.png,
    compare_regimes.png (and the budget plots when the table has budget curves)."""
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
    curves = table.get("budget_curves") or {}
    if curves:
        panels = {metric: {name: (c["fractions"], c[metric]["mean"], c[metric]["stderr"])
                           for name, c in curves.items()}
                  for metric in ("pass@1", f"pass@{n}")}
        paths["budget"] = str(eval_lib.plot_budget_curves(
            panels, root_path / "compare_budget.png", title="along the token budget (± s.e. over seeds)"))
        tradeoff = {name: (c["pass@1"]["mean"], c[f"pass@{n}"]["mean"], c["pass@1"]["stderr"],
                           c[f"pass@{n}"]["stderr"]) for name, c in curves.items()}
        paths["tradeoff"] = str(eval_lib.plot_tradeoff(
            tradeoff, root_path / "compare_tradeoff.png", ylabel=f"pass@{n}",
            title=f"pass@1 vs pass@{n}: base → {', '.join(f'{f:g}' for f in table['budget_fractions'])} "
                  "→ full budget (large marker)"))
    text = json.dumps({**table, "token_budget": token_budget}, indent=1, sort_keys=True, allow_nan=False)
    paths["json"] = str(write_text(root_path / "compare.json", text + "\n"))
    paths["markdown"] = str(write_text(root_path / "compare.md", table_markdown(table, token_budget)))
    return paths


class Settings(NamedTuple):
    """What a comparison is: its arms and seeds, and how its table is made."""

    arms: list[Arm]
    seeds: list[int]
    baseline: str
    contrasts: list[tuple[str, str]]
    num_samples: int
    budget_fractions: list[float]
    token_budget: int | None


def recorded_settings(path: str) -> Settings:
    """The settings a compare.json was written with (one written before it recorded
    ``contrast_pairs`` and ``token_budget`` gives its contrasts in key order and no budget).

    Raises:
      ValueError: no such file, or it is not a compare.json.
    """
    if not os.path.isfile(path):
        raise ValueError(f"--report_only without --arm takes the arms from {path}, which does not exist; "
                         "give the --arm flags of the comparison, or --out=<the folder of its compare.json>.")
    with open(path) as f:
        table = json.load(f)
    try:
        pairs = table.get("contrast_pairs")
        if pairs is None:
            pairs = [key.split(" − ") for key in table.get("contrasts") or {}]
        return Settings(
            arms=[Arm(a["name"], a["config"], tuple(a["overrides"])) for a in table["arms"]],
            seeds=[int(seed) for seed in table["seeds"]], baseline=table["baseline"],
            contrasts=[(a, b) for a, b in pairs], num_samples=int(table["num_samples"]),
            budget_fractions=[float(f) for f in table.get("budget_fractions") or []],
            token_budget=table.get("token_budget"))
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{path} is not a compare.json written by experiments.compare ({err!r}); "
                         "give the --arm flags of the comparison.") from None


def settings_from_flags(recorded: Settings | None = None) -> Settings:
    """The comparison the flags describe; over ``recorded`` settings, only the flags given
    on the command line replace their values."""
    fl = flags.FLAGS

    def given(name: str) -> bool:
        return recorded is None or fl[name].present

    if recorded is None:
        arms = with_common([parse_arm(text, fl.config) for text in fl.arm], fl.common, fl.config)
    else:
        arms = recorded.arms
    return Settings(
        arms=arms,
        seeds=[int(s) for s in fl.seeds] if given("seeds") else recorded.seeds,
        baseline=(fl.baseline or arms[0].name) if given("baseline") else recorded.baseline,
        contrasts=[parse_contrast(text) for text in fl.contrast] if given("contrast") else recorded.contrasts,
        num_samples=fl.num_samples if given("num_samples") else recorded.num_samples,
        budget_fractions=(sorted(float(f) for f in fl.budget_fractions) if given("budget_fractions")
                          else recorded.budget_fractions),
        token_budget=fl.token_budget if given("token_budget") else recorded.token_budget)


def collect_evidence(root: str, arms: Sequence[Arm], seeds: Sequence[int], dest: str, *,
                     gzip_above: int = run_io.GZIP_ABOVE) -> list[str]:
    """Copies the per-run evidence of every run under ROOT (``run_io.copy_evidence``: config,
    summary, metrics, budget marks, calibration caches and evaluations, gzip-compressed when
    larger than ``gzip_above`` bytes) to DEST/<arm>/seed<S>/; returns the files written,
    relative to DEST."""
    written = []
    for arm in arms:
        for seed in seeds:
            workdir = run_dir(root, arm.name, seed)
            if run_io.run_file(workdir, layout.CONFIG) is None:
                continue
            names = run_io.copy_evidence(workdir, run_dir(dest, arm.name, seed), gzip_above=gzip_above)
            written += [os.path.join(arm.name, f"seed{seed}", name) for name in names]
    return written


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    fl = flags.FLAGS
    if not fl.root:
        raise app.UsageError("--root is required, e.g. --root=runs/compare")
    if not fl.arm and not fl.report_only:
        raise app.UsageError("give at least one --arm=NAME[=key=value ...]")
    out = fl.out or fl.root
    try:
        recorded = recorded_settings(os.path.join(out, "compare.json")) if not fl.arm else None
        settings = settings_from_flags(recorded)
        arms, seeds, fractions = settings.arms, settings.seeds, settings.budget_fractions
        if not fl.report_only:
            if fractions and not settings.token_budget:
                raise ValueError("--budget_fractions are fractions of --token_budget: give --token_budget.")
            if any(not 0.0 < f < 1.0 for f in fractions):
                raise ValueError(f"--budget_fractions={fractions} must lie strictly between 0 and 1.")
            for arm in arms:
                check_arm(arm, seeds[0], settings.token_budget, fractions)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    names = [a.name for a in arms]
    if len(set(names)) != len(names):
        print(f"error: arm names must be unique, got {names}.", file=sys.stderr)
        return 2
    for name in [settings.baseline] + [n for pair in settings.contrasts for n in pair]:
        if name not in names:
            print(f"error: arm {name!r} (--baseline / --contrast) is not one of the arms {names}.", file=sys.stderr)
            return 2
    if fl.dry_run:
        for arm in arms:
            for seed in seeds:
                workdir = run_dir(fl.root, arm.name, seed)
                print(" ".join(train_command(arm, seed, workdir, settings.token_budget, fractions)))
                print(" ".join(evaluate_command(workdir, settings.num_samples,
                                                responses_per_call=fl.eval_responses_per_call)))
        return 0
    if not fl.report_only:
        try:
            run_grid(fl.root, arms, seeds, token_budget=settings.token_budget, num_samples=settings.num_samples,
                     budget_fractions=fractions, jobs=fl.jobs, share_base=fl.share_base,
                     responses_per_call=fl.eval_responses_per_call)
        except RuntimeError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
    table = collect_table(fl.root, arms, seeds, baseline=settings.baseline, num_samples=settings.num_samples,
                          budget_fractions=fractions, contrasts=settings.contrasts)
    if fl.report_only and not any(table["per_run"].values()):
        print(f"error: --root={fl.root} holds no evaluated run (<arm>/seed<S>/eval/final/evaluation.json "
              f"with n = {settings.num_samples}) of the arms {names} and seeds {seeds}; give the folder of the "
              "runs or of their evidence (--collect_evidence).", file=sys.stderr)
        return 2
    paths = write_table(table, out, settings.token_budget)
    print(f"[compare] wrote {paths['markdown']}")
    if fl.collect_evidence:
        written = collect_evidence(fl.root, arms, seeds, fl.collect_evidence)
        print(f"[compare] copied {len(written)} per-run files to {fl.collect_evidence}")
    return 0


if __name__ == "__main__":
    cli.exit_on_interrupt()
    define_flags()
    app.run(main, flags_parser=cli.flags_parser(__doc__))
