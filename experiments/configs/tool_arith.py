"""Tool-use arithmetic: the built-in char model learns to call the Python tool for products.

    python -m experiments.train --config=experiments/configs/tool_arith.py --workdir=runs/tool_arith
    python -m experiments.train --config=experiments/configs/tool_arith.py:smoke --workdir=/tmp/t

An episode: "47*86=" → the model writes "[47*86]" (a call of the Python tool, which ends
its turn), the environment answers "{4042}", the model writes "4042" and EOS. The
supervised base calls the tool in 30 % of its demonstrations and answers in its head in
the rest, so it often guesses; RL should move it to the tool. Variants: "" (minutes on 2
CPU cores) and "smoke" (seconds, used by tests).
"""

from __future__ import annotations

import ml_collections

VARIANTS = ("", "default", "smoke")


def get_config(variant: str | None = None) -> ml_collections.ConfigDict:
    variant = (variant or "").strip()
    if variant not in VARIANTS:
        raise ValueError(f"unknown config variant {variant!r}; choose one of {VARIANTS[1:]} "
                         "(e.g. --config=experiments/configs/tool_arith.py:smoke).")
    c = ml_collections.ConfigDict()
    c.task = dict(
        name="tool_arith", levels=(1, 2, 3), num_train=1500, num_eval=60, num_sft_examples=8000,
        tool_share=0.3,
        env=dict(name="tools", call_open="[", call_close="]", observation_format="{{output}}"),
        tools=("python",), max_turns=2, max_turn_tokens=12, max_observation_tokens=10)
    c.sft = dict(steps=400)
    c.rl = dict(
        steps=60, prompts_per_step=32, samples_per_prompt=8,
        max_new_tokens=32,  # call + output + answer, every token after the prompt
        num_minibatches=2, checkpoint_every=20)
    c.optim = dict(learning_rate=5e-4, warmup_steps=5, b2=0.99)
    c.eval = dict(num_samples=32, base_calibration_samples=64)  # every call runs a sandboxed process
    c.run = dict(dump_rollouts=4)
    if variant == "smoke":
        c.task.update(num_train=64, num_eval=8, num_sft_examples=256)
        c.model = dict(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                       num_kv_heads=2, head_dim=16)
        c.sft = dict(steps=60, batch_size=16, learning_rate=1e-2)
        c.rl.update(steps=2, prompts_per_step=4, samples_per_prompt=4, checkpoint_every=1,
                    verifier=dict(workers=0))
        c.eval = dict(num_samples=4, prompts_per_chunk=8, base_calibration_samples=8)
        c.run = dict(progress=False, dump_rollouts=3)
    return c
