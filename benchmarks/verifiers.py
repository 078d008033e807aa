"""Verifier throughput: items/s for math and code verification, pool vs serial loop, in one run.

    .venv/bin/python -m benchmarks.verifiers [--num-math 600] [--num-code 48] [--workers 1,2,4]

The serial baseline scores in this process one item at a time (math: score_serial; code:
run_python in a loop). The pool rows use VerifierPool with 1..N workers; throughput should
grow with the worker count up to the number of free cores. Pool start-up (forkserver and
warm-up, one untimed pass over the batch) is excluded: a training run pays it once. Each row is the best of --repeats runs
(a shared machine is noisy) and also reports the median. Prints one JSON object per row.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from jaxrl_vr.tasks.base import TaskItem
from jaxrl_vr.verifiers import VerifierPool, run_python, score_serial


def math_batch(num: int, seed: int = 0) -> tuple[list[TaskItem], list[str]]:
    """Fraction answers in LaTeX; completions give half of them as decimals, a quarter wrong."""
    rng = np.random.default_rng(seed)
    items, completions = [], []
    for i in range(num):
        a, b = int(rng.integers(1, 50)), int(rng.choice([2, 4, 5, 8, 10, 20, 25]))
        items.append(TaskItem(uid=f"m{i}", prompt=f"What is {a}/{b}?", answer=f"\\frac{{{a}}}{{{b}}}",
                              verifier="math"))
        shown = f"{a / b:g}" if i % 2 == 0 else f"\\dfrac{{{a}}}{{{b}}}"
        if i % 4 == 3:
            shown = f"{a / b + 1:g}"
        completions.append(f"We divide {a} by {b}. So the answer is \\boxed{{{shown}}}.")
    return items, completions


def code_batch(num: int) -> tuple[list[TaskItem], list[str]]:
    """f(x) = k·x with three asserts; every third program has an off-by-one bug."""
    items, completions = [], []
    for i in range(num):
        k = i % 7 + 2
        tests = tuple(f"assert f({x}) == {k * x}" for x in (0, 3, 11))
        items.append(TaskItem(uid=f"c{i}", prompt=f"Write f(x) = {k}x.", tests=tests, verifier="code",
                              meta={"timeout_s": 5.0}))
        body = f"return {k} * x" + (" + 1" if i % 3 == 2 else "")
        completions.append(f"```python\ndef f(x):\n    {body}\n```")
    return items, completions


def serial_code(items, completions) -> float:
    start = time.perf_counter()
    for item, completion in zip(items, completions):
        run_python(completion.split("```python\n")[1].split("```")[0], item.tests, timeout_s=5.0)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-math", type=int, default=600)
    parser.add_argument("--num-code", type=int, default=48)
    parser.add_argument("--workers", default=None, help="comma-separated worker counts (default 1,2,..,cores)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    workers = ([int(w) for w in args.workers.split(",")] if args.workers
               else sorted({1, 2, 4, 8, 16, cores} & set(range(1, cores + 1))))
    batches = {"math": math_batch(args.num_math), "code": code_batch(args.num_code)}
    print(json.dumps({"cores": cores, "load_average": os.getloadavg()}))

    def row(kind, mode, num_workers, items, times, statuses):
        rates = sorted(len(items) / t for t in times)
        print(json.dumps({"kind": kind, "mode": mode, "workers": num_workers, "items": len(items),
                          "items_per_s": round(rates[-1], 1), "median_items_per_s": round(rates[len(rates) // 2], 1),
                          "statuses": statuses}), flush=True)

    for kind, (items, completions) in batches.items():
        if kind == "math":
            score_serial(items, completions)  # one untimed pass: imports, caches (steady state, as in training)
            results = [score_serial(items, completions) for _ in range(args.repeats)]
            row(kind, "serial", 0, items, [r.elapsed_s for r in results], results[-1].counts())
        else:
            row(kind, "serial", 0, items, [serial_code(items, completions) for _ in range(args.repeats)], None)
        for num_workers in workers:
            with VerifierPool(num_workers, timeout_s=10.0) as pool:
                pool.score(items, completions)  # one untimed pass: start-up, warm-up, first-touch page faults
                results = [pool.score(items, completions) for _ in range(args.repeats)]
            row(kind, "pool", num_workers, items, [r.elapsed_s for r in results], results[-1].counts())


if __name__ == "__main__":
    main()
