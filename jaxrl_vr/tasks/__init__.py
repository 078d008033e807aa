"""Tasks: the built-in procedural arithmetic task, HumanEval, and adapters for external task sources."""

from jaxrl_vr.tasks.arithmetic import ARITHMETIC_ALPHABET, make_items, make_sft_examples
from jaxrl_vr.tasks.base import (SplitReport, TaskItem, clean_split, drop_repeats, in_split, normalize_prompt,
                                 prompt_keys, stable_hash)
from jaxrl_vr.tasks.datasets import LoadedTasks, load_task_file, render_prompt, row_to_item
from jaxrl_vr.tasks.humaneval import completion_program, humaneval_verifier, make_humaneval_items, split_check

__all__ = [
    "TaskItem", "stable_hash", "in_split", "normalize_prompt", "prompt_keys", "drop_repeats", "SplitReport",
    "clean_split", "ARITHMETIC_ALPHABET", "make_items", "make_sft_examples",
    "LoadedTasks", "load_task_file", "render_prompt", "row_to_item", "make_reasoning_gym_items",
    "reasoning_gym_verifier", "make_humaneval_items", "humaneval_verifier", "completion_program", "split_check",
]


def __getattr__(name):
    # The reasoning-gym adapter imports reasoning_gym (seconds): load it only when asked for.
    if name in ("make_reasoning_gym_items", "reasoning_gym_verifier"):
        from jaxrl_vr.tasks import reasoning_gym as adapter  # noqa: PLC0415

        return getattr(adapter, name)
    raise AttributeError(f"module 'jaxrl_vr.tasks' has no attribute {name!r}")
