"""Simulator speed: P prompts × steps × seeds for one method, wall time with and without compile.

The issue's target: 10,000 prompts × 1,000 steps × 8 seeds for one method in under 60 s
on 2 CPU cores.

    python benchmarks/sim.py                       # grpo, the target workload
    python benchmarks/sim.py --method=pairing --json=out.json
    taskset -c 0,1 python benchmarks/sim.py        # pin to 2 cores

Reported: the end-to-end wall time of ``jaxrl_vr.sim.simulate`` in a fresh process
(compilation included), a second call with everything compiled, the per-step time, the
CPU count and load average. A benchmark, never a test.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402

from jaxrl_vr.sim import SimConfig, simulate  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="grpo")
    parser.add_argument("--num_prompts", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--num_seeds", type=int, default=8)
    parser.add_argument("--log_every", type=int, default=10)
    parser.add_argument("--json", default=None, help="also write the numbers here")
    args = parser.parse_args()
    cfg = dataclasses.replace(SimConfig(), num_prompts=args.num_prompts, steps=args.steps,
                              num_seeds=args.num_seeds, log_every=args.log_every,
                              progress=False, plots=False)
    start = time.perf_counter()
    first = simulate(cfg, args.method)
    cold_s = time.perf_counter() - start
    start = time.perf_counter()
    simulate(cfg, args.method)
    warm_s = time.perf_counter() - start
    result = {
        "method": args.method,
        "num_prompts": cfg.num_prompts,
        "steps": cfg.steps,
        "num_seeds": cfg.num_seeds,
        "group_size": cfg.group_size,
        "batch_prompts": cfg.batch_prompts,
        "log_every": cfg.log_every,
        "wall_s_with_compile": round(cold_s, 2),
        "wall_s_compiled": round(warm_s, 2),
        "ms_per_step_all_seeds": round(1e3 * warm_s / cfg.steps, 3),
        "cpu_count": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "final_pass_at_1": float(first.metrics.passk_rk[:, -1, -1, 0].mean()),
    }
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
