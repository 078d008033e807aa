"""SmolLM2-135M-Instruct with the Python tool, through its chat template, on reasoning-gym
arithmetic: multi-turn episodes on a real model from a config.

    python -m experiments.train --config=experiments/configs/smollm2_tools.py --workdir=runs/smol_tools
    python -m experiments.train --config=experiments/configs/smollm2_tools.py:smoke --workdir=/tmp/st

The system prompt tells the model it may write Python between <tool_call> and
</tool_call>; a call ends its turn, the sandbox runs it, and the output comes back as a
``tool`` message of the ChatML template (rendered as a token delta, never re-encoding the
model's text); the final turn's boxed answer is scored by the math verifier. Learning is
not expected at 135M: this shows the path runs, evaluates and trains. Builds on
smollm2_rg.py and states what differs.
"""

from __future__ import annotations

from experiments.configs import smollm2_rg

VARIANTS = smollm2_rg.VARIANTS

SYSTEM_PROMPT = (
    "You are a helpful assistant that solves arithmetic problems. You can run Python: write code "
    "between <tool_call> and </tool_call> and you will see what it prints. Put the final answer in \\boxed{}.")


def get_config(variant: str | None = None):
    c = smollm2_rg.get_config(variant)
    c.model.system_prompt = SYSTEM_PROMPT
    c.task.update(env=dict(name="tools", call_open="<tool_call>", call_close="</tool_call>"),
                  tools=("python",), max_turns=3, max_turn_tokens=48, max_observation_tokens=32)
    c.rl.max_new_tokens = 128  # every token after the prompt: calls, outputs and the answer
    c.eval.max_new_tokens = 128
    if (variant or "").strip() == "smoke":
        c.task.update(max_turn_tokens=12, max_observation_tokens=8)
        c.rl.max_new_tokens = 32
        c.eval.max_new_tokens = 32
        c.run = dict(progress=False, export=False, dump_rollouts=2)
    return c
