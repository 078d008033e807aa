"""Built-in tool-use arithmetic: products the tiny model cannot do in its head, but can do
by calling the Python tool (the embedded environment task, no download).

A prompt is a product ending in "=" ("47*86="). The model may answer at once ("4042",
EOS) or call the Python tool: ``[47*86]`` (the text between "[" and "]" is run as a
notebook cell), read its output ``{4042}`` and copy it ("4042", EOS). The answer is
checked by the "exact" verifier on the model's final turn.

Levels (difficulty):
  0: a+b, one digit each             ("3+4=", learnable in its head)
  1: a*b, two digits by one digit    ("47*8=")
  2: a*b, two digits by two digits   ("47*86=")
  3: a*b, three digits by two digits ("473*86=")

The supervised warm start is deliberately imperfect: a share ``tool_share`` of its
demonstrations call the tool (the tool's output segment is not trained on) and the rest
answer directly, so the base sometimes calls the tool and often guesses.
``malformed_share`` (default 0) makes that share of the demonstrated calls malformed
("47x86", which the tool rejects); at 0.25 the built-in model, stopped at the same SFT
step, did not learn to copy the tool's output, and RL did not recover it. Train and held-out
items are disjoint by a stable hash of the prompt, independent of the seed.
"""

from __future__ import annotations

import string
from collections.abc import Sequence

import numpy as np

from jaxrl_vr.tasks.base import TaskItem, in_split

__all__ = ["CALL_CLOSE", "CALL_OPEN", "LEVELS", "OBSERVATION_FORMAT", "TOOL_ALPHABET", "make_items",
           "make_problem", "make_sft_examples"]

# Prompts, calls, outputs and the tool's error messages (unknown characters become "?").
TOOL_ALPHABET = string.digits + "+-*/=[]{}() " + string.ascii_letters + ":'._,?\n"
CALL_OPEN, CALL_CLOSE = "[", "]"
OBSERVATION_FORMAT = "{{output}}"  # "{" + output + "}"
LEVELS = (0, 1, 2, 3)


def make_problem(rng: np.random.Generator, level: int) -> tuple[str, int]:
    """One problem of ``level``: (prompt, integer answer)."""
    if level == 0:
        a, b = (int(x) for x in rng.integers(0, 10, size=2))
        return f"{a}+{b}=", a + b
    if level == 1:
        a, b = int(rng.integers(10, 100)), int(rng.integers(2, 10))
    elif level == 2:
        a, b = (int(x) for x in rng.integers(10, 100, size=2))
    elif level == 3:
        a, b = int(rng.integers(100, 1000)), int(rng.integers(10, 100))
    else:
        raise ValueError(f"unknown tool_arith level {level}; choose from {LEVELS}.")
    return f"{a}*{b}=", a * b


def make_items(seed: int, num: int, *, levels: Sequence[int] = LEVELS, split: str | None = None,
               heldout_fraction: float = 0.2) -> list[TaskItem]:
    """``num`` distinct items, levels round-robin, in ``split`` ("train" / "test" / None)."""
    levels = tuple(int(v) for v in levels)
    if not levels or any(v not in LEVELS for v in levels):
        raise ValueError(f"levels must be a non-empty subset of {LEVELS}, got {levels}.")
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    seen: set[str] = set()
    items = []
    active, misses = list(levels), 0
    while len(items) < num:
        if not active:
            raise ValueError(f"levels {levels} hold fewer than {num} distinct problems in split {split!r}.")
        level = active[len(items) % len(active)]
        prompt, answer = make_problem(rng, level)
        if prompt in seen or not in_split(prompt, split, heldout_fraction=heldout_fraction):
            misses += 1
            if misses > 2000:  # this level is exhausted (level 0 has 100 problems): drop it
                active.remove(level)
                misses = 0
            continue
        misses = 0
        seen.add(prompt)
        items.append(TaskItem(uid=f"tool_arith/{prompt}", prompt=prompt, answer=str(answer), verifier="exact",
                              difficulty=level))
    return items


def make_sft_examples(seed: int, num: int, *, levels: Sequence[int] = LEVELS, split: str | None = "train",
                      tool_share: float = 0.3, malformed_share: float = 0.0
                      ) -> list[tuple[str, tuple[tuple[str, bool], ...]]]:
    """(prompt, segments) demonstrations: a share ``tool_share`` call the tool (its output
    is an untrained segment), the rest answer directly. A share ``malformed_share`` of the
    calls writes "x" for "*" (the tool answers with a SyntaxError, the answer is a guess),
    so the base also makes calls that fail."""
    rng = np.random.default_rng(np.random.SeedSequence(seed + 1))
    out = []
    for item in make_items(seed, num, levels=levels, split=split):
        expression = item.prompt[:-1]
        if rng.random() < tool_share:
            if malformed_share > 0 and "*" in expression and rng.random() < malformed_share:
                call = f"{CALL_OPEN}{expression.replace('*', 'x')}{CALL_CLOSE}"
                output = OBSERVATION_FORMAT.replace("{output}", "SyntaxError")
            else:
                call = f"{CALL_OPEN}{expression}{CALL_CLOSE}"
                output = OBSERVATION_FORMAT.replace("{output}", item.answer)
            out.append((item.prompt, ((call, True), (output, False), (item.answer, True))))
        else:
            out.append((item.prompt, ((item.answer, True),)))
    return out
