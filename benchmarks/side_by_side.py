"""jaxrl_vr vs TRL on the peer GRPO workload, back to back, both precisions; prints the ratios.

Each run is its own process, ours and TRL's back to back for a precision, so the two see the
same machine state as far as possible; the 1-minute load average is recorded around every run
(on a shared machine only ratios measured side by side mean anything). `--rounds N` repeats
the pairs, alternating which peer goes first, and reports each ratio as median [min, max]
over the rounds; with independent rounds [min, max] holds the true median ratio with
probability 1 − 2·2^−N (75 % for 3 rounds, 94 % for 5), whatever the noise distribution.
Needs the peer venv and model (`bash ../shared/peers/setup.sh trl && bash
../shared/peers/setup.sh models`).

    python benchmarks/side_by_side.py [--precisions fp32,bf16] [--warmup 1 --steps 2] \\
        [--rounds 3] [--out benchmarks/results/rl_step_results.json]

TRL runs at its best: torch's own OpenMP settings, and every micro-batch size in
`--trl-micro-batch` (default 8 and 0 = all 64 sequences at once, TRL's default), each in its
own process in every round. Each ratio is taken against the best TRL figure of its round:
the fastest step, the fastest rollout and the fastest update (step − rollout), whichever
configuration they came from. (Until perf18 TRL ran with micro-batches of 8 and
OMP_WAIT_POLICY=PASSIVE only; on an AMX Xeon its rollout then took a third longer and its bf16
step 60-75 % longer than at its best, so the earlier ratios flattered us: docs/performance.md
at 9f22ea1, "perf18".)

TRL also runs under each glibc malloc setting in `--trl-malloc` (default both): "default",
glibc as it comes, which returns freed memory to the kernel and maps large blocks afresh, so
every step page-faults its activations in again; and "keep", the policy our process sets
itself (`jaxrl_vr.host_memory.keep_host_memory`: no mmap'd blocks, no trimming) given to TRL
through GLIBC_TUNABLES. On a Zen 3 VM whose page faults had become costly, "keep" took TRL's
step from 160 to 92 s (docs/performance.md at 9f22ea1, "perf25"); measured without it, the ratios
flattered us. Both peers also inherit this process's environment, so an exported
GLIBC_TUNABLES (for example transparent huge pages for malloc, "perf16") applies to both.

Workloads (`--workloads`, `WORKLOADS`): `fixed64`, issue 12's (SmolLM2, P8 G8, 64 tokens with EOS
suppressed, fp32 and bf16), and issue 43's in the precision a user of the machine would pick
(bf16 where the CPU has bf16 dot units, else fp32): `ragged512` (SmolLM2, P8 G8, up to 512
tokens, each sample stops at its own EOS), `wide_full` (wide-qwen2, 0.4B, P4 G8, 128 tokens,
EOS suppressed, full fine-tuning) and `wide_lora16` (the same with LoRA rank 16 on all linear
layers, TRL through PEFT).

Targets. Issue 12 (fixed64): fp32 step ≤ 0.6 × TRL fp32; update ≥ 60 % of the same run's f32
matmul peak; bf16 step ≤ 0.6 × TRL bf16 (CPUs with bf16 units); rollout ≥ 2 × TRL's generation
throughput; peak RSS ≤ 6 GB. Issue 43: ragged512 step ≤ 0.5 × TRL and generated tokens per
rollout second ≥ 2 × TRL's; wide_full step ≤ 0.6 × TRL and peak RSS ≤ TRL's leanest
configuration; wide_lora16 step ≤ 0.6 × TRL + PEFT and peak RSS ≤ 0.6 × our wide_full.

    python benchmarks/side_by_side.py --workloads ragged512,wide_full,wide_lora16 --trl-malloc keep
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

from jaxrl_vr import host_cpu  # noqa: E402
from jaxrl_vr.host_memory import KEEP_HOST_MEMORY_TUNABLES  # noqa: E402


# Issue 12's targets, each a (ratio name, "max" | "min", bound). The RSS bound is in the
# harness's own unit (peak_rss_mb, MiB), read as the table reads it: 6.0 GB = 6,000 MB.
TARGETS = {
    "fp32": [("step_ours_over_trl", "max", 0.6), ("update_fraction_of_f32_peak", "min", 0.6),
             ("rollout_speedup_vs_trl", "min", 2.0), ("peak_rss_mb_ours", "max", 6000.0)],
    "bf16": [("step_ours_over_trl", "max", 0.6), ("rollout_speedup_vs_trl", "min", 2.0),
             ("peak_rss_mb_ours", "max", 6000.0)],
}


class Workload(NamedTuple):
    """One peer workload (shared/peers/README.md): the model dir under `$PEERS_ROOT/models`, P
    prompts × G samples, the response cap, whether samples stop at EOS, LoRA rank (0 = full
    fine-tuning), the precisions it runs in by default ("auto": bf16 where the CPU has bf16
    dot units, else fp32: what a user of the machine would pick) and its targets, each a
    (ratio name, "max" | "min", bound), or None for issue 12's per-precision `TARGETS`."""

    model: str
    prompts: int
    gens: int
    max_new_tokens: int
    allow_eos: bool
    lora_rank: int
    precisions: str
    targets: tuple


# Issue 43's workloads beside issue 12's. Cross-workload targets (LoRA's memory against our
# full fine-tuning of the same model) are `CROSS_TARGETS`.
WORKLOADS = {
    "fixed64": Workload("smollm2-135m", 8, 8, 64, False, 0, "fp32,bf16", None),  # None: TARGETS, per precision
    "ragged512": Workload("smollm2-135m", 8, 8, 512, True, 0, "auto",
                          (("step_ours_over_trl", "max", 0.5), ("rollout_tokens_per_s_over_trl", "min", 2.0))),
    "wide_full": Workload("wide-qwen2", 4, 8, 128, False, 0, "auto",
                          (("step_ours_over_trl", "max", 0.6), ("peak_rss_over_trl_leanest", "max", 1.0))),
    "wide_lora16": Workload("wide-qwen2", 4, 8, 128, False, 16, "auto",
                            (("step_ours_over_trl", "max", 0.6),)),
}
CROSS_TARGETS = (("wide_lora16", "wide_full", "peak_rss_mb_ours", "max", 0.6),)


def resolve_precisions(text: str, bf16_dot_units: bool | None) -> list[str]:
    """`--precisions` (or a workload's default) as a list; "auto" = bf16 on a CPU with bf16 dot
    units (or unknown), fp32 on one without."""
    return [("fp32" if bf16_dot_units is False else "bf16") if p == "auto" else p
            for p in (part.strip() for part in text.split(",")) if p]


def target_verdicts(ratios: dict, bf16_dot_units: bool | None, targets: dict | None = None) -> list[dict]:
    """Each issue-12 target against the summarised ratios (`summarise` per name, per precision).

    A target is "met" when its median meets the bound, and "met in every round" when the worst
    round does too. The bf16 step target applies only where the CPU has bf16 dot units (None,
    unknown, counts as having them); the rollout and memory targets hold in both precisions.
    """
    verdicts = []
    for precision, summaries in ratios.items():
        for name, kind, bound in (TARGETS.get(precision, []) if targets is None else targets):
            applies = not (precision == "bf16" and name == "step_ours_over_trl" and bf16_dot_units is False)
            summary = summaries[name]
            worst = summary["max"] if kind == "max" else summary["min"]
            meets = (lambda v: v <= bound) if kind == "max" else (lambda v: v >= bound)
            verdicts.append({"precision": precision, "ratio": name, "bound": f"{'<=' if kind == 'max' else '>='} {bound:g}",
                             "median": summary["median"], "worst_round": worst, "applies": applies,
                             "met": meets(summary["median"]), "met_in_every_round": meets(worst)})
    return verdicts


def run(cmd: list[str], log_path: str, env: dict | None = None) -> dict:
    """Runs one peer process; returns its wall time, CPU seconds and minor page faults
    (`getrusage` of the waited-for child: what the whole process cost, setup included)."""
    t0 = time.time()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    print("$ " + " ".join(cmd), flush=True)
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                              env=None if env is None else {**os.environ, **env})
    if proc.returncode:
        tail = open(log_path).read()[-3000:]
        raise SystemExit(f"command failed ({proc.returncode}); log {log_path}:\n{tail}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"wall_s": time.time() - t0, "user_s": after.ru_utime - before.ru_utime,
            "kernel_s": after.ru_stime - before.ru_stime, "minor_faults": after.ru_minflt - before.ru_minflt}


def trl_micro_batches(text: str) -> list[int]:
    """`--trl-micro-batch` as a list of sizes ("8,0": 8 sequences, then all at once)."""
    sizes = [int(part) for part in text.split(",") if part.strip()]
    if not sizes or any(size < 0 for size in sizes):
        raise SystemExit(f"--trl-micro-batch {text!r}: give one or more sizes >= 0, comma-separated (0 = all)")
    return sizes


# glibc malloc settings for TRL (`--trl-malloc`): GLIBC_TUNABLES added to its environment.
# "keep" is `jaxrl_vr.host_memory.keep_host_memory`'s policy (no mmap, no trim, one arena): freed memory
# stays in the heap for the next step.
TRL_MALLOC = {"default": "", "keep": KEEP_HOST_MEMORY_TUNABLES}


def trl_malloc_settings(text: str) -> list[str]:
    """`--trl-malloc` as a list of TRL_MALLOC names ("default,keep")."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in TRL_MALLOC]
    if not names or unknown:
        raise SystemExit(f"--trl-malloc {text!r}: give one or more of {', '.join(TRL_MALLOC)}, comma-separated")
    return names


def trl_env(omp_wait_policy: str, malloc: str, inherited_tunables: str = "") -> dict | None:
    """The variables TRL's process adds to the inherited environment: OMP_WAIT_POLICY when
    set, and the malloc setting's tunables after any exported GLIBC_TUNABLES."""
    env = {"OMP_WAIT_POLICY": omp_wait_policy} if omp_wait_policy else {}
    if TRL_MALLOC[malloc]:
        env["GLIBC_TUNABLES"] = ":".join(t for t in (inherited_tunables, TRL_MALLOC[malloc]) if t)
    return env or None


def best_of_trl(configs: list[dict]) -> dict:
    """TRL at its best over its configurations in one round: the record of the fastest step,
    with the fastest rollout and fastest update (step − rollout) of any configuration."""
    best = dict(min(configs, key=lambda c: c["median_step_s"]))
    best["best_rollout_s"] = min(c["median_rollout_s"] for c in configs)
    best["best_update_s"] = min(c["median_step_s"] - c["median_rollout_s"] for c in configs)
    best["configs"] = [{k: c.get(k) for k in ("micro_batch", "malloc", "median_step_s", "median_rollout_s",
                                               "mean_gen_tokens_per_step", "peak_rss_mb", "process",
                                               "load_1m_start", "load_1m_end")}
                       for c in configs]
    return best


def workload_flags(workload: Workload) -> list[str]:
    """The flags both peers' scripts take for `workload`'s shape (-P, -G, new tokens, EOS, LoRA)."""
    flags = ["-P", str(workload.prompts), "-G", str(workload.gens), "--max-new-tokens", str(workload.max_new_tokens)]
    flags += ["--allow-eos"] if workload.allow_eos else []
    flags += ["--lora-rank", str(workload.lora_rank)] if workload.lora_rank else []
    return flags


def run_pair(args, work: str, model_dir: str, trl_python: str, prompts: str, precision: str,
             round_index: int, ours_first: bool, workload: Workload = WORKLOADS["fixed64"],
             name: str = "fixed64") -> tuple[dict, dict]:
    """One back-to-back pair: our rl_step.py, and TRL's bench_trl.py in each of its configurations,
    on the same prompts and workload. Returns our record and TRL's best (`best_of_trl`)."""
    tag = f"{name}_{precision}_r{round_index}"
    shape = workload_flags(workload)
    ours_json = os.path.join(work, f"ours_{tag}.json")
    loads, usage = {}, {}
    trl_records = []

    def ours_run():
        loads["ours"] = os.getloadavg()[0]
        command = [sys.executable, os.path.join(HERE, "rl_step.py"), "--model-dir", model_dir,
                   "--prompts-file", prompts, "--warmup", str(args.warmup), "--steps", str(args.steps),
                   "--precision", precision, "--json", ours_json] + shape + args.ours_args.split()
        usage["ours"] = run(command, os.path.join(work, f"ours_{tag}.log"))

    def trl_run():
        batch = workload.prompts * workload.gens
        for micro_batch in trl_micro_batches(args.trl_micro_batch):
            if micro_batch >= batch and 0 in trl_micro_batches(args.trl_micro_batch):
                continue  # the same run as micro-batch 0 (all sequences at once)
            for malloc in trl_malloc_settings(args.trl_malloc):
                name = f"trl_{tag}_mb{micro_batch}_{malloc}"
                trl_json = os.path.join(work, f"{name}.jsonl")
                load_start = os.getloadavg()[0]
                command = [trl_python, os.path.join(args.peers_dir, "bench_trl.py"), "--model", model_dir,
                           "-W", str(args.warmup), "-N", str(args.steps), "--micro-batch", str(micro_batch),
                           "--json-out", trl_json] + shape + (["--bf16"] if precision == "bf16" else [])
                process = run(command, os.path.join(work, f"{name}.log"),
                              env=trl_env(args.trl_omp_wait_policy, malloc, os.environ.get("GLIBC_TUNABLES", "")))
                record = json.loads(open(trl_json).read().splitlines()[-1])
                record["load_1m_start"], record["load_1m_end"] = load_start, os.getloadavg()[0]
                record["malloc"], record["process"] = malloc, process
                trl_records.append(record)

    for step in ((ours_run, trl_run) if ours_first else (trl_run, ours_run)):
        step()
    ours = json.load(open(ours_json))
    trl = best_of_trl(trl_records)
    ours["load_1m_before_run"], ours["process"] = loads["ours"], usage["ours"]
    ours["ran_first"], trl["ran_first"] = ours_first, not ours_first
    if trl.get("prompts_sha") != ours.get("prompts_sha"):
        print(f"WARNING: prompt sets differ ({trl.get('prompts_sha')} vs {ours.get('prompts_sha')})")
    return ours, trl


def rollout_tokens_per_s(record: dict) -> float | None:
    """Generated tokens per second of rollout: the mean real (not padding) tokens a step
    generated over the median rollout time; None where the record lacks either."""
    tokens, seconds = record.get("mean_gen_tokens_per_step"), record.get("median_rollout_s")
    return tokens / seconds if tokens and seconds else None


def pair_ratios(ours: dict, trl: dict) -> dict:
    """The ratios of one back-to-back pair, each against TRL's best figure (`best_of_trl`;
    TRL's update = its step − its rollout; its leanest = the smallest peak RSS of any of its
    configurations)."""
    trl_rates = [rate for rate in map(rollout_tokens_per_s, trl["configs"]) if rate]
    ours_rate = rollout_tokens_per_s(ours)
    return {
        "rollout_tokens_per_s_over_trl": (ours_rate / max(trl_rates)) if ours_rate and trl_rates else float("nan"),
        "peak_rss_over_trl_leanest": ours["peak_rss_mb"] / min(c["peak_rss_mb"] for c in trl["configs"]),
        "step_ours_over_trl": ours["median_step_s"] / trl["median_step_s"],
        "update_ours_over_trl": ours["median_update_s"] / trl["best_update_s"],
        "rollout_speedup_vs_trl": trl["best_rollout_s"] / ours["median_rollout_s"],
        # What the update ran (since perf19 each prompt's prefix once per group) / its time / peak;
        # the nominal count (every row's full sequence, TRL's work) rises with prefix sharing.
        "update_fraction_of_f32_peak": ours["update_executed_fraction_of_matmul_peak"],
        "update_nominal_fraction_of_f32_peak": ours["update_fraction_of_matmul_peak"],
        "peak_rss_mb_ours": ours["peak_rss_mb"],
        "peak_rss_mb_trl": trl["peak_rss_mb"],
    }


def median_index(values: list[float]) -> int:
    """Index of the median value (the lower middle one for an even count)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    return order[(len(values) - 1) // 2]


def range_coverage(rounds: int) -> float:
    """P(min <= true median <= max) for `rounds` independent draws: 1 − 2 · 2^−n (no
    assumption on the distribution; 0 for a single round)."""
    return max(0.0, 1.0 - 2.0 * 0.5 ** rounds)


def summarise(values: list[float]) -> dict:
    """Median, min and max over rounds, with the distribution-free coverage of [min, max]."""
    ordered = sorted(values)
    n = len(ordered)
    median = ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])
    return {"median": median, "min": ordered[0], "max": ordered[-1], "n": n,
            "range_coverage_of_median": range_coverage(n)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers-root", default=os.environ.get("PEERS_ROOT", os.path.expanduser("~/.cache/jaxrl_vr-peers")))
    parser.add_argument("--peers-dir", default=os.path.join(REPO, "..", "shared", "peers"),
                        help="folder with bench_trl.py and prompts.py")
    parser.add_argument("--workloads", default="fixed64",
                        help=f"comma-separated, from {', '.join(WORKLOADS)} (shared/peers/README.md; issue 43's: "
                             "ragged512, wide_full, wide_lora16)")
    parser.add_argument("--precisions", default="",
                        help="fp32, bf16 or auto (bf16 where the CPU has bf16 dot units), comma-separated; "
                             "default: the workload's own (fixed64: fp32,bf16; the others: auto)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1,
                        help="back-to-back pairs per precision, alternating which peer runs first; "
                             "the ratios are reported as median [min, max] over the rounds")
    parser.add_argument("--trl-micro-batch", default="8,0",
                        help="TRL sequences per forward/backward, comma-separated; every size runs each round "
                             "and the ratios take TRL's best (ours: 8 micro-batches of 8); 0 = all 64 at "
                             "once (TRL's default, ~14-17 GB peak RSS)")
    parser.add_argument("--trl-omp-wait-policy", default="",
                        help="OMP_WAIT_POLICY for TRL; '' (default) keeps torch's own busy-waiting threads, "
                             "its fastest on a quiet machine. PASSIVE helps only when other processes hold "
                             "a core")
    parser.add_argument("--trl-malloc", default="default,keep",
                        help="glibc malloc settings for TRL, comma-separated, each run every round: "
                             "'default' (glibc as it comes: freed memory goes back to the kernel) and 'keep' "
                             "(our own policy, keep_host_memory, as GLIBC_TUNABLES); the ratios take TRL's best")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "rl_step_results.json"))
    parser.add_argument("--ours-args", default="", help="extra arguments for benchmarks/rl_step.py")
    args = parser.parse_args(argv)

    trl_micro_batches(args.trl_micro_batch)  # a bad list fails before any run
    trl_malloc_settings(args.trl_malloc)
    names = [name.strip() for name in args.workloads.split(",") if name.strip()]
    unknown = [name for name in names if name not in WORKLOADS]
    if not names or unknown:
        raise SystemExit(f"--workloads {args.workloads!r}: choose from {', '.join(WORKLOADS)}, comma-separated")
    trl_python = os.path.join(args.peers_root, "venv-trl", "bin", "python")
    for path in [trl_python] + [os.path.join(args.peers_root, "models", WORKLOADS[n].model) for n in names]:
        if not os.path.exists(path):
            raise SystemExit(f"{path} not found; run `bash shared/peers/setup.sh trl` and "
                             "`bash shared/peers/setup.sh models` first.")
    work = tempfile.mkdtemp(prefix="side_by_side_")
    cpu = host_cpu.summary()
    results = {"cpu": cpu, "warmup": args.warmup, "steps": args.steps, "rounds": args.rounds,
               "trl_micro_batch": args.trl_micro_batch, "trl_omp_wait_policy": args.trl_omp_wait_policy,
               "trl_malloc": args.trl_malloc,
               # Inherited by both peers' processes.
               "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
               "workloads": {}, "targets": []}
    for name in names:
        workload = WORKLOADS[name]
        model_dir = os.path.join(args.peers_root, "models", workload.model)
        prompts = os.path.join(work, f"prompts_{name}.jsonl")
        run([trl_python, os.path.join(args.peers_dir, "prompts.py"), "--model", model_dir, "--out", prompts,
             "-P", str(workload.prompts), "-W", str(args.warmup), "-N", str(args.steps)],
            os.path.join(work, f"prompts_{name}.log"))
        precisions = resolve_precisions(args.precisions or workload.precisions, cpu.get("bf16_dot_units"))
        pairs = {precision: [] for precision in precisions}
        for round_index in range(args.rounds):
            for precision in precisions:
                # Alternate who goes first, so a machine that drifts over the session favours neither.
                pairs[precision].append(run_pair(args, work, model_dir, trl_python, prompts, precision,
                                                 round_index, round_index % 2 == 0, workload, name))
        entry = {"workload": workload._asdict(), "runs": {}, "ratios": {}, "round_ratios": {}}
        for precision, rounds in pairs.items():
            per_round = [pair_ratios(ours, trl) for ours, trl in rounds]
            representative = median_index([r["step_ours_over_trl"] for r in per_round])
            ours, trl = rounds[representative]
            entry["runs"][precision] = {"jaxrl_vr": {k: v for k, v in ours.items() if k != "steps"},
                                        "jaxrl_vr_steps": ours["steps"], "trl": trl, "round": representative}
            entry["round_ratios"][precision] = per_round
            entry["ratios"][precision] = {key: summarise([r[key] for r in per_round]) for key in per_round[0]}
        entry["targets"] = target_verdicts(entry["ratios"], cpu.get("bf16_dot_units"),
                                           workload.targets)
        results["workloads"][name] = entry
        results["targets"] += [{"workload": name, **v} for v in entry["targets"]]
        report_workload(name, entry, args.rounds)
    for name, base, key, kind, bound in CROSS_TARGETS:
        if name in results["workloads"] and base in results["workloads"]:
            for precision, run_ in results["workloads"][name]["runs"].items():
                base_run = results["workloads"][base]["runs"].get(precision)
                if base_run is None:
                    continue
                value = run_["jaxrl_vr"]["peak_rss_mb"] / base_run["jaxrl_vr"]["peak_rss_mb"]
                met = value <= bound if kind == "max" else value >= bound
                results["targets"].append({"workload": name, "precision": precision,
                                           "ratio": f"{key}_over_{base}", "bound": f"<= {bound:g}",
                                           "median": value, "worst_round": value, "applies": True,
                                           "met": met, "met_in_every_round": met})
    print("\ntargets (median; worst round):")
    for v in results["targets"]:
        state = ("met" if v["met"] else "MISSED") + ("" if v["met_in_every_round"] == v["met"] else
                                                      ", not in every round" if v["met"] else ", met in some round")
        note = "" if v["applies"] else "  (does not apply: this CPU has no bf16 dot units)"
        print(f"{v['workload']:>11} {v['precision']:>5} {v['ratio']:<34} {v['bound']:<9} {v['median']:9.2f}; "
              f"{v['worst_round']:9.2f}  {state}{note}")
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"-> {args.out} (logs in {work})")
    return results


def report_workload(name: str, entry: dict, rounds: int) -> None:
    """Prints one workload's table: ours beside TRL's best, per precision."""
    print(f"\n== {name}: {entry['workload']}")
    print(f"{'precision':>9} {'ours step':>9} {'TRL step':>9} {'ratio':>6} {'ours roll':>9} {'TRL roll':>9} "
          f"{'speedup':>7} {'tok/s x':>7} {'ours upd':>8} {'TRL upd':>8} {'RSS MB':>7} {'TRL MB':>7} {'load':>5} "
          f"{'TRL cfg':>10}")
    for precision, run_ in entry["runs"].items():
        o, t = run_["jaxrl_vr"], run_["trl"]
        r = {k: v["median"] for k, v in entry["ratios"][precision].items()}
        print(f"{precision:>9} {o['median_step_s']:9.2f} {t['median_step_s']:9.2f} {r['step_ours_over_trl']:6.2f} "
              f"{o['median_rollout_s']:9.2f} {t['best_rollout_s']:9.2f} "
              f"{r['rollout_speedup_vs_trl']:7.2f} {r['rollout_tokens_per_s_over_trl']:7.2f} "
              f"{o['median_update_s']:8.2f} {t['best_update_s']:8.2f} "
              f"{o['peak_rss_mb']:7.0f} {min(c['peak_rss_mb'] for c in t['configs']):7.0f} {o['load_1m_start']:5.1f} "
              f"{str(t['micro_batch']) + '/' + str(t.get('malloc')):>10}")
    print("(TRL: its best in the representative round: fastest step, rollout and update of any micro-batch "
          "size and malloc setting; 'TRL cfg' is the fastest step's, micro-batch/malloc; 'TRL MB' its leanest "
          "peak RSS; 'tok/s x' generated tokens per rollout second, ours over TRL's best)")
    for precision, run_ in entry["runs"].items():
        for who, process in [("ours", run_["jaxrl_vr"].get("process"))] + [
                (f"TRL {c['micro_batch']}/{c['malloc']}", c.get("process")) for c in run_["trl"]["configs"]]:
            if process:
                print(f"{precision:>9} {who:<16} process: {process['kernel_s']:7.1f} s kernel, "
                      f"{process['user_s']:7.1f} s user, {process['minor_faults'] / 1e6:6.2f} M minor faults")
    if rounds > 1:
        print(f"median [min, max] over {rounds} rounds; the range covers the median ratio with "
              f"probability {range_coverage(rounds):.0%} (distribution-free):")
        for precision, ratios in entry["ratios"].items():
            print(f"{precision:>9} " + "  ".join(
                f"{key} {v['median']:.2f} [{v['min']:.2f}, {v['max']:.2f}]" for key, v in ratios.items()
                if not key.startswith("peak_rss")))


if __name__ == "__main__":
    main()
