"""The embedded default before and after the trainer-core redesign, same seeds: prints the table.

    .venv/bin/python experiments/results/redesign_default/table.py

old_seed<S>/ ran at 9f22ea1 (the flat config), new_seed<S>/ at the redesign, each with
    python -m experiments.train --config=experiments/configs/default.py --workdir=... --config.seed=S
on the same 2-core Xeon (AMX, AVX512-BF16). Only summary.json and config.json of each run are kept.
"""

import json
import os

from jaxrl_vr.eval import paired_difference

HERE = os.path.dirname(os.path.abspath(__file__))
METRICS = {
    "base pass@1": lambda s: s["base_pass_at_1"],
    "final pass@1": lambda s: s["final_pass_at_1"],
    "final pass@256": lambda s: s["passk"]["pass_at_k"]["final"][-1],
    "lost prompts": lambda s: s["inversion"]["lost"],
}


def load(version: str) -> dict[int, dict]:
    out = {}
    for seed in range(3):
        with open(os.path.join(HERE, f"{version}_seed{seed}", "summary.json")) as f:
            out[seed] = json.load(f)
    return out


def main() -> None:
    old, new = load("old"), load("new")
    print("| metric | seed | old (9f22ea1) | new | new − old |")
    print("|---|---:|---:|---:|---:|")
    for name, get in METRICS.items():
        for seed in range(3):
            a, b = get(old[seed]), get(new[seed])
            print(f"| {name} | {seed} | {a:.4f} | {b:.4f} | {b - a:+.4f} |")
        diff = paired_difference({s: get(new[s]) for s in range(3)}, {s: get(old[s]) for s in range(3)})
        print(f"| {name} | mean, 95 % t-interval | | | {diff.mean:+.4f} [{diff.low:+.4f}, {diff.high:+.4f}] |")
    spread = [get(old[s]) for s in range(3) for get in [METRICS["final pass@1"]]]
    print(f"\nold final pass@1 across seeds: {min(spread):.4f} .. {max(spread):.4f}")


if __name__ == "__main__":
    main()
