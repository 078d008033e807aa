"""Prints the SmolLM2 HumanEval base numbers from the files next to this script:
pass@1 and pass@8 over the 164 problems (n = 8 each) with a percentile bootstrap over
problems (5000 resamples, seed 0), which shows how much the mean moves with the choice
of problems; it says nothing about other models or prompts.

    python experiments/results/smollm2_humaneval_base/table.py
"""

import json
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

with open(os.path.join(HERE, "base_eval.json")) as f:
    counts = np.asarray(json.load(f)["counts"])
with open(os.path.join(HERE, "summary.json")) as f:
    summary = json.load(f)
n = int(summary["passk"]["ks"][-1])
pass1, pass8 = counts / n, (counts > 0).astype(float)
rng = np.random.default_rng(0)
draws = [rng.integers(0, len(counts), len(counts)) for _ in range(5000)]
for name, values in (("pass@1", pass1), (f"pass@{n}", pass8)):
    low, high = np.percentile([values[d].mean() for d in draws], [2.5, 97.5])
    print(f"{name}: {values.mean():.3f}  [{low:.3f}, {high:.3f}]  ({len(counts)} problems, n = {n})")
print(f"problems solved at least once: {(counts > 0).sum()} of {len(counts)}")
