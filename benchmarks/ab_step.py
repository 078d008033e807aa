"""In-process A/B of two code variants of the RL update (or, with --what rollout, the rollout).

Both variants are compiled in one process on rl_step.py's workload, warmed up, then run
alternately (A B, B A, A B, ...), so machine drift and the heap's state hit both alike; the
timings of separate processes on a shared VM differed by more than the changes measured in
docs/performance.md at 9f22ea1 (perf27, perf28). A variants file is a Python module with two functions,
`A()` and `B()`, each putting the code into one variant's state (monkeypatching the library
before the variant is traced; JAX's caches are cleared first); `B()` is applied last and
left in place. Examples: `benchmarks/ab_variants/attention_layout.py` (update),
`benchmarks/ab_variants/decode_attention_form.py` (rollout). It prints the medians,
each pair's B/A, the mean B − A with its paired t-interval and an exact sign test on how
many pairs B won (`jaxrl_vr.eval`'s `paired_difference` and `exact_two_sided_p`): with 5 pairs
even 5 wins is p = 0.06, so a claimed difference wants 8 or more.

    python benchmarks/ab_step.py benchmarks/ab_variants/attention_layout.py \\
        --model-dir $PEERS_ROOT/models/smollm2-135m --prompts-file prompts.jsonl \\
        [--what update|rollout|long-rollout] [--precision bf16] [-P 8 -G 8 --max-new-tokens 64] \\
        [--pairs 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from typing import Sequence

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import profile_step  # noqa: E402
import rl_step  # noqa: E402
from jaxrl_vr.eval import exact_two_sided_p, paired_difference, poisson_binomial_pmf  # noqa: E402
from jaxrl_vr.host_memory import keep_host_memory, memory_optimized_cpu_schedule  # noqa: E402


def load_variants(path: str):
    """The variants module at `path`; it must define callables A() and B()."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"variants file {path!r} not found; see benchmarks/ab_variants/ for an example.")
    spec = importlib.util.spec_from_file_location("ab_variants_module", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    missing = [name for name in ("A", "B") if not callable(getattr(module, name, None))]
    if missing:
        raise ValueError(f"variants file {path!r} defines no {' or '.join(missing)}(): it needs A() and B(), "
                         "each putting the code into one variant's state.")
    return module


def compile_variants(variants, build) -> dict:
    """{"A": build(), "B": build()}, each built after its hook ran and JAX's caches were cleared.

    `build` returns a compiled thunk with its HLO text as `.hlo_text` (profile_step's
    `update_call` and `rollout_call`). Clearing matters: a module-level `jax.jit` such as
    `generate`'s core keeps its first trace, so without it B would reuse A's program whatever
    its hook changed. Two identical programs are refused: the A/B would time one program twice.
    """
    runs = {}
    for name in ("A", "B"):
        jax.clear_caches()
        getattr(variants, name)()
        print(f"compiling {name} ...", flush=True)
        runs[name] = build()
        if getattr(runs[name], "temp_bytes", None) is not None:
            print(f"{name}: compiled temporaries {runs[name].temp_bytes / 2**20:,.0f} MiB", flush=True)
    if runs["A"].hlo_text == runs["B"].hlo_text:
        raise ValueError("variants A and B compiled to the same program: their hooks change nothing that "
                         "is traced (patch the function the compiled code calls, not a copy of it).")
    return runs


def pair_order(index: int) -> tuple[str, str]:
    """A B for even pairs, B A for odd ones: neither variant always runs first."""
    return ("A", "B") if index % 2 == 0 else ("B", "A")


def sign_test_p(wins: int, pairs: int) -> float:
    """Two-sided exact sign test: the chance of a split at least as uneven as `wins` of
    `pairs` if neither variant were faster (each pair a fair coin). 5 of 5 gives 0.0625:
    five pairs cannot show a difference at the 5 % level, however large it is."""
    return exact_two_sided_p(poisson_binomial_pmf(np.full(pairs, 0.5)), wins)


def summarize(times_a: Sequence[float], times_b: Sequence[float]) -> dict:
    """Medians, B's median over A's, each pair's B/A with their median and range, in how many
    pairs B was faster (pairs by index) with the sign test's p-value, and the mean of B − A
    over the pairs with its 95 % t-interval (`jaxrl_vr.eval.paired_difference`, pairs as seeds)."""
    if len(times_a) != len(times_b) or not times_a:
        raise ValueError(f"need the same positive number of A and B timings; got {len(times_a)} and {len(times_b)}.")
    median_a, median_b = statistics.median(times_a), statistics.median(times_b)
    ratios = [b / a for a, b in zip(times_a, times_b)]
    wins = sum(b < a for a, b in zip(times_a, times_b))
    diff = paired_difference(dict(enumerate(times_b)), dict(enumerate(times_a)))
    return {"median_a_s": median_a, "median_b_s": median_b, "b_over_a": median_b / median_a,
            "pair_b_over_a": ratios, "pair_b_over_a_median": statistics.median(ratios),
            "pair_b_over_a_range": [min(ratios), max(ratios)],
            "b_faster_pairs": wins, "pairs": len(times_a), "sign_test_p": sign_test_p(wins, len(times_a)),
            "b_minus_a_s": {"mean": diff.mean, "low": diff.low, "high": diff.high, "verdict": diff.verdict},
            "a_s": list(times_a), "b_s": list(times_b)}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", help="a Python file defining A() and B()")
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--prompts-file", default=None, help="prompts.py's file (update and rollout)")
    parser.add_argument("--what", choices=("update", "rollout", "long-rollout"), default="update",
                        help="long-rollout: decode.py's long-response case (1 prompt x 8 samples, 512 tokens, EOS "
                             "allowed; no prompts file). A variant that moves float rounding can draw other "
                             "tokens and end rows at other lengths: each rollout's generated tokens are reported")
    parser.add_argument("--precision", choices=tuple(rl_step.PRECISIONS), default="fp32")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("-P", "--prompts", type=int, default=profile_step.PROMPTS)
    parser.add_argument("-G", "--gens", type=int, default=profile_step.SAMPLES)
    parser.add_argument("--max-new-tokens", type=int, default=profile_step.NEW_TOKENS)
    parser.add_argument("--lora-rank", type=int, default=0,
                        help="both variants on a model with rank-R adapters on all seven block matrices, as rl_step.py")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--warm-calls", type=int, default=2,
                        help="untimed calls of each variant first (the update's second call still faults its heap in)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error(f"--pairs must be at least 1; got {args.pairs}.")
    if args.what != "long-rollout" and not args.prompts_file:
        parser.error(f"--what {args.what} needs --prompts-file (write it with the peers' prompts.py).")
    return args


def main(argv=None):
    args = parse_args(argv)
    variants = load_variants(args.variants)  # Fail on a bad file before loading the model.
    memory_optimized_cpu_schedule()  # before any computation, as rl_step.py
    keep_host_memory()
    if args.what == "long-rollout":
        model = profile_step.load_model(args)
    else:
        model, prompt_ps, mask_ps = profile_step.load_workload(args)
    if args.what == "update":
        rollout = profile_step.workload_rollout(model, prompt_ps, mask_ps, args.gens, args.max_new_tokens)
        # profile_step's own defaults for what update_call reads (LM-head chunk, shared prefix).
        profile_args = profile_step.parse_args(["--model-dir", args.model_dir, "--prompts-file", args.prompts_file,
                                                "--precision", args.precision,
                                                "--microbatches", str(args.microbatches), "-P", str(args.prompts),
                                                "-G", str(args.gens), "--max-new-tokens", str(args.max_new_tokens)])
        build = lambda: profile_step.update_call(profile_args, model, rollout)  # noqa: E731
    elif args.what == "rollout":
        build = lambda: profile_step.rollout_call(model, prompt_ps, mask_ps, num_samples=args.gens,  # noqa: E731
                                                  max_new_tokens=args.max_new_tokens)
    else:
        build = lambda: profile_step.long_rollout_call(model, args.model_dir)  # noqa: E731
    runs = compile_variants(variants, build)
    generated = {}
    for _ in range(args.warm_calls):
        for name in ("A", "B"):
            out = jax.block_until_ready(runs[name]())
            if args.what != "update":  # generate's core returns (tokens, log-probs, mask, lengths, truncated).
                generated[name] = int(np.asarray(out[3]).sum())
    if generated:
        print(f"generated tokens per call: A {generated['A']}, B {generated['B']}", flush=True)
    times = {"A": [], "B": []}
    for index in range(args.pairs):
        for name in pair_order(index):
            start = time.perf_counter()
            jax.block_until_ready(runs[name]())
            times[name].append(time.perf_counter() - start)
        print(f"pair {index + 1}/{args.pairs}: A {times['A'][-1]:.2f} s, B {times['B'][-1]:.2f} s", flush=True)
    summary = summarize(times["A"], times["B"])
    print(f"{args.what} {args.precision}: median A {summary['median_a_s']:.3f} s, B {summary['median_b_s']:.3f} s "
          f"(B/A {summary['b_over_a']:.3f}; per pair {summary['pair_b_over_a_median']:.3f}, range "
          f"{summary['pair_b_over_a_range'][0]:.3f}-{summary['pair_b_over_a_range'][1]:.3f}); B faster in "
          f"{summary['b_faster_pairs']} of {summary['pairs']} pairs (sign test p = {summary['sign_test_p']:.3f}); "
          f"B - A {summary['b_minus_a_s']['mean']:+.3f} s, 95 % interval [{summary['b_minus_a_s']['low']:+.3f}, "
          f"{summary['b_minus_a_s']['high']:+.3f}]: {summary['b_minus_a_s']['verdict']}")
    if args.json:
        with open(args.json, "w") as f:
            temps = {name: getattr(run, "temp_bytes", None) for name, run in runs.items()}
            json.dump({"variants": args.variants, "what": args.what, "precision": args.precision,
                       "load_1m": os.getloadavg()[0], "generated_tokens": generated or None,
                       "temp_bytes": temps, **summary}, f, indent=2)


if __name__ == "__main__":
    main()
