"""`rl_step.py` at several git revisions of this repository, alternated on one machine.

How far has the code moved since a stored result was measured? A result from another CPU
(docs/performance.md keeps one row per CPU kind) cannot be re-measured without that CPU, but
the code that produced it can be run beside today's on this one. Each revision runs from its
own detached worktree, with its own library and its own `rl_step.py`, in a fresh process per
run and precision; the order rotates every round, and each revision is paired with the
reference (the first one) within a round, so a slow spell of a shared VM falls on both sides of
a pair. The comparison per revision is `ab_step.summarize` over those pairs: the median of each
pair's ratio, how many pairs were faster, a sign test and a paired t-interval of the
difference. Three rounds cannot show a 5 % effect on a noisy VM: use 6 or more.

    python benchmarks/across_commits.py --revs HEAD 0e85eec 6386e37 \\
        --model-dir $PEERS_ROOT/models/smollm2-135m --prompts-file prompts.jsonl \\
        [--precisions fp32,bf16] [--rounds 6] [--out benchmarks/results/across_commits.json]

`--revs` takes anything `git rev-parse` does, plus `worktree`: this checkout as it is,
uncommitted changes included. A revision must have `benchmarks/rl_step.py` with the flags used
here (since perf12). Every revision runs under its own defaults (its memory policy, scheduler
and segment counts), which is what its stored results measured. The worktrees are made under a
temporary directory and removed at the end, also on failure or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)

from ab_step import summarize  # noqa: E402
from jaxrl_vr import atomic, host_cpu  # noqa: E402

WORKTREE = "worktree"
METRICS = ("median_step_s", "median_rollout_s", "median_update_s")
RECORDED = METRICS + ("first_step_s", "peak_rss_mb", "matmul_peak_gflops",
                      "update_executed_fraction_of_matmul_peak", "load_1m_start", "load_1m_end")


def git(*args: str, cwd: str = REPO) -> str:
    proc = subprocess.run(("git",) + args, cwd=cwd, capture_output=True, text=True)
    if proc.returncode:
        raise ValueError(f"git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def resolve_revs(revs: list[str]) -> list[dict]:
    """Each revision as {"rev", "sha"} (sha None for `worktree`), checked before any run:
    it must name a commit with `benchmarks/rl_step.py`, and no commit may appear twice."""
    if len(revs) < 2:
        raise ValueError(f"--revs needs at least two revisions to compare (got {revs}); the first is the reference.")
    resolved, seen = [], set()
    for rev in revs:
        if rev == WORKTREE:
            sha = None
        else:
            try:
                sha = git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
            except ValueError:
                raise ValueError(f"--revs: {rev!r} is not a commit of this repository (see `git log --oneline`).") from None
            if subprocess.run(("git", "cat-file", "-e", f"{sha}:benchmarks/rl_step.py"), cwd=REPO).returncode:
                raise ValueError(f"--revs: {rev} ({sha[:7]}) has no benchmarks/rl_step.py; pick a commit from perf12 on.")
        if (sha or WORKTREE) in seen:
            raise ValueError(f"--revs: {rev} is the same code as an earlier revision; each must differ.")
        seen.add(sha or WORKTREE)
        resolved.append({"rev": rev, "sha": sha})
    return resolved


def round_order(count: int, round_index: int) -> list[int]:
    """The revisions' run order in a round: rotated by one each round, so every revision runs
    first, second, ... equally often over `count` rounds."""
    shift = round_index % count
    return list(range(shift, count)) + list(range(shift))


def compare_to_reference(runs: list[dict], revs: list[dict], precision: str) -> dict:
    """Per revision: each metric's median [min, max] over its runs, and, for every revision
    after the first, `ab_step.summarize(reference, revision)` over rounds where both ran."""
    out = {}
    for rev in revs:
        mine = [r for r in runs if r["rev"] == rev["rev"] and r["precision"] == precision]
        entry = {"runs": len(mine)}
        for name in RECORDED:
            values = [r[name] for r in mine if r.get(name) is not None]
            if values:
                entry[name] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
        if rev is not revs[0]:
            ref = {r["round"]: r for r in runs if r["rev"] == revs[0]["rev"] and r["precision"] == precision}
            paired = [(ref[r["round"]], r) for r in mine if r["round"] in ref]
            if paired:
                entry["vs_reference"] = {name: summarize([a[name] for a, _ in paired], [b[name] for _, b in paired])
                                         for name in METRICS}
        out[rev["rev"]] = entry
    return out


def run_rl_step(tree: str, args, precision: str, json_path: str, log_path: str) -> dict:
    """One `rl_step.py` process from `tree` (its library first on the path); its JSON."""
    cmd = [sys.executable, "benchmarks/rl_step.py", "--model-dir", args.model_dir, "--prompts-file",
           args.prompts_file, "--warmup", str(args.warmup), "--steps", str(args.steps),
           "--precision", precision, "--json", json_path]
    env = {**os.environ, "PYTHONPATH": tree + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode:
        raise SystemExit(f"rl_step.py failed ({proc.returncode}) in {tree}; log {log_path}:\n"
                         + open(log_path).read()[-3000:])
    with open(json_path) as f:
        return json.load(f)


def build_results(args, revs: list[dict], runs: list[dict], *, complete: bool) -> dict:
    return {"cpu": host_cpu.summary(), "revs": revs, "rounds": args.rounds, "complete": complete,
            "warmup": args.warmup, "steps": args.steps, "prompts_file": args.prompts_file, "runs": runs,
            "summary": {p: compare_to_reference(runs, revs, p) for p in args.precisions}}


def write_json(path: str, results: dict) -> None:
    atomic.write_json(path, results, indent=1, sort_keys=False)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--revs", nargs="+", required=True,
                   help=f"git revisions (or '{WORKTREE}'); the first is the reference")
    p.add_argument("--model-dir", required=True)
    p.add_argument("--prompts-file", required=True)
    p.add_argument("--precisions", default="fp32", help="comma-separated: fp32, bf16")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--out", default=None, help="write the results here (JSON)")
    args = p.parse_args(argv)
    args.precisions = [s for s in args.precisions.split(",") if s]
    bad = [s for s in args.precisions if s not in ("fp32", "bf16")]
    if bad or not args.precisions:
        p.error(f"--precisions: {bad or 'none'} not among fp32, bf16")
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    for name in ("model_dir", "prompts_file"):
        if not os.path.exists(getattr(args, name)):
            p.error(f"--{name.replace('_', '-')} {getattr(args, name)} does not exist")
    args.model_dir, args.prompts_file = os.path.abspath(args.model_dir), os.path.abspath(args.prompts_file)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    try:
        revs = resolve_revs(args.revs)
    except ValueError as e:
        raise SystemExit(f"across_commits.py: {e}") from None
    work = tempfile.mkdtemp(prefix="across_commits_")
    trees, runs = {}, []
    total = args.rounds * len(args.precisions) * len(revs)
    started = time.time()
    try:
        for rev in revs:
            if rev["sha"] is None:
                trees[rev["rev"]] = REPO
            else:
                tree = os.path.join(work, rev["sha"][:12])
                git("worktree", "add", "--detach", tree, rev["sha"])
                trees[rev["rev"]] = tree
        for round_index in range(args.rounds):
            for precision in args.precisions:
                for i in round_order(len(revs), round_index):
                    rev = revs[i]["rev"]
                    tag = f"{precision}_{i}_r{round_index}"
                    result = run_rl_step(trees[rev], args, precision, os.path.join(work, tag + ".json"),
                                         os.path.join(work, tag + ".log"))
                    runs.append({"rev": rev, "precision": precision, "round": round_index,
                                 **{k: result.get(k) for k in RECORDED}})
                    if args.out:  # After every run: a failure later loses nothing measured.
                        write_json(args.out, build_results(args, revs, runs, complete=False))
                    done, elapsed = len(runs), time.time() - started
                    print(f"[{done}/{total}] round {round_index + 1} {precision} {rev}: step "
                          f"{result['median_step_s']:.2f} s (rollout {result['median_rollout_s']:.2f}, update "
                          f"{result['median_update_s']:.2f}) · {elapsed / 60:.1f} min, ETA "
                          f"{elapsed / done * (total - done) / 60:.1f} min", flush=True)
    finally:
        for rev, tree in trees.items():
            if tree != REPO:
                subprocess.run(("git", "worktree", "remove", "--force", tree), cwd=REPO)
        subprocess.run(("git", "worktree", "prune"), cwd=REPO)
    results = build_results(args, revs, runs, complete=True)
    for precision, per_rev in results["summary"].items():
        for rev, entry in per_rev.items():
            line = " · ".join(f"{name[7:-2]} {entry[name]['median']:.2f} [{entry[name]['min']:.2f}, "
                              f"{entry[name]['max']:.2f}] s" for name in METRICS if name in entry)
            print(f"{precision} {rev}: {line}")
            for name, s in entry.get("vs_reference", {}).items():
                print(f"    {name[7:-2]} / {revs[0]['rev']}'s: pairs {s['pair_b_over_a_median']:.3f} "
                      f"[{s['pair_b_over_a_range'][0]:.3f}, {s['pair_b_over_a_range'][1]:.3f}], {rev} faster in "
                      f"{s['b_faster_pairs']} of {s['pairs']} (p = {s['sign_test_p']:.2f}), difference "
                      f"{s['b_minus_a_s']['mean']:+.2f} s [{s['b_minus_a_s']['low']:+.2f}, {s['b_minus_a_s']['high']:+.2f}]")
    if args.out:
        write_json(args.out, results)
        print(f"wrote {args.out}")
    return results


if __name__ == "__main__":
    main()
