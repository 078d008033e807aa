"""Prints the tool_arith results from the files next to this script: per seed, held-out
pass@1 of the base and of the trained policy, and how they used the Python tool (calls per
episode, share of calls that ran without an error); then the mean change in pass@1 over the
seeds with a t interval (2 degrees of freedom with 3 seeds), which shows how much the
change varies across seeds of this config on the same 60 held-out prompts, nothing wider.

    python experiments/results/tool_arith/table.py
"""

import json
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571}  # Student t, 97.5th percentile by df
seeds = sorted(d for d in os.listdir(HERE) if d.startswith("seed"))
print("| seed | pass@1 base → final | tool calls / episode base → final | calls ok base → final | wall s |")
print("|---|---:|---:|---:|---:|")
deltas = []
for seed in seeds:
    with open(os.path.join(HERE, seed, "summary.json")) as f:
        s = json.load(f)
    deltas.append(s["final_pass_at_1"] - s["base_pass_at_1"])
    print(f"| {seed[4:]} | {s['base_pass_at_1']:.3f} → {s['final_pass_at_1']:.3f} | "
          f"{s['base_tool_calls_per_episode']:.2f} → {s['final_tool_calls_per_episode']:.2f} | "
          f"{s['base_tool_call_ok_rate']:.3f} → {s['final_tool_call_ok_rate']:.3f} | "
          f"{s['wall_time_s']['total']:.0f} |")
d = np.asarray(deltas)
if len(d) > 1:
    half = T975[len(d) - 1] * d.std(ddof=1) / np.sqrt(len(d))
    print(f"\nmean change in pass@1: {d.mean():+.3f}, 95% t interval [{d.mean() - half:+.3f}, {d.mean() + half:+.3f}] "
          f"over {len(d)} seeds")
