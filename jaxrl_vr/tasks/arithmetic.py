"""Built-in procedural arithmetic with graded difficulty (the embedded default task).

Prompts are short expressions ending in "=" ("47+38="), answers are the result's digits,
and a completion is the answer followed by EOS. A tiny character-level model trained
from scratch for a minute (SFT then RL) learns the low levels and not the high ones, so
per-prompt pass rates span "solved" to "out of reach".

Levels (difficulty):
  0: a+b, a, b one digit                       ("3+4=")
  1: a+b, a two digits, b one digit            ("47+8=")
  2: a+b, both two digits, units carry          ("47+38=")
  3: a+b, both three digits                     ("473+385=")
  4: a*b two digits by one digit, or a+b+c two digits each ("47*8=", "12+34+56=")

Everything is deterministic from the seed. Train and held-out items are disjoint by a
stable hash of the prompt (`split=`), independent of the seed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from jaxrl_vr.tasks.base import TaskItem, in_split

__all__ = ["ARITHMETIC_ALPHABET", "LEVELS", "make_items", "make_sft_examples", "make_problem"]

# Every character a prompt or completion can contain (CharTokenizer(ARITHMETIC_ALPHABET)).
ARITHMETIC_ALPHABET = "0123456789+-*= "
LEVELS = (0, 1, 2, 3, 4)
_MAX_DRAWS_PER_ITEM = 2000


def make_problem(rng: np.random.Generator, level: int) -> tuple[str, int]:
    """Draws one problem of `level`; returns (prompt, integer answer)."""
    if level == 0:
        a, b = rng.integers(0, 10, size=2)
        return f"{a}+{b}=", int(a + b)
    if level == 1:
        a, b = int(rng.integers(10, 100)), int(rng.integers(0, 10))
        return f"{a}+{b}=", a + b
    if level == 2:
        a, b = (int(x) for x in rng.integers(10, 100, size=2))
        while (a % 10) + (b % 10) < 10:  # force a carry out of the units column
            a, b = (int(x) for x in rng.integers(10, 100, size=2))
        return f"{a}+{b}=", a + b
    if level == 3:
        a, b = (int(x) for x in rng.integers(100, 1000, size=2))
        return f"{a}+{b}=", a + b
    if level == 4:
        if rng.integers(0, 2) == 0:
            a, b = int(rng.integers(10, 100)), int(rng.integers(2, 10))
            return f"{a}*{b}=", a * b
        a, b, c = (int(x) for x in rng.integers(10, 100, size=3))
        return f"{a}+{b}+{c}=", a + b + c
    raise ValueError(f"Unknown arithmetic level {level}; choose from {LEVELS}.")


def _check_levels(levels: Sequence[int]) -> tuple[int, ...]:
    levels = tuple(int(level) for level in levels)
    if not levels or any(level not in LEVELS for level in levels):
        raise ValueError(f"levels must be a non-empty subset of {LEVELS}, got {levels}.")
    return levels


def _draw(seed: int, num: int, levels: Sequence[int], split: str | None, heldout_fraction: float,
          unique: bool) -> list[tuple[str, int, int]]:
    """(prompt, answer, level) triples, levels balanced round-robin then shuffled."""
    if num < 0:
        raise ValueError(f"num_items must be >= 0, got {num}.")
    levels = _check_levels(levels)
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    plan = [levels[i % len(levels)] for i in range(num)]
    rng.shuffle(plan)
    seen: set[str] = set()
    out = []
    for level in plan:
        for _ in range(_MAX_DRAWS_PER_ITEM):
            prompt, answer = make_problem(rng, level)
            if (not unique or prompt not in seen) and in_split(
                prompt, split, heldout_fraction=heldout_fraction):
                break
        else:
            raise ValueError(
                f"Could not draw {num} distinct {split or 'any'}-split problems at level {level}: "
                f"that level has too few problems. Ask for fewer items, add levels, or pass unique=False.")
        seen.add(prompt)
        out.append((prompt, answer, level))
    return out


def make_items(seed: int, num_items: int, *, levels: Sequence[int] = LEVELS, split: str | None = "train",
               heldout_fraction: float = 0.2, unique: bool = True) -> list[TaskItem]:
    """Procedural arithmetic items, deterministic from `seed`.

    Args:
      seed: integer seed; the same seed gives the same items in every process.
      num_items: how many items; levels are assigned round-robin, then shuffled.
      levels: which difficulty levels (see the module docstring).
      split: "train", "test" (held-out; disjoint from train by prompt hash) or None (both).
      heldout_fraction: share of all possible prompts that belong to "test".
      unique: no prompt repeats within the returned list.

    Returns:
      TaskItems with uid "arith:<prompt>", the answer's digits, verifier "exact" and
      difficulty = level.
    """
    return [
        TaskItem(uid=f"arith:{prompt}", prompt=prompt, answer=str(answer), verifier="exact",
                 difficulty=level, meta={"task": "arithmetic"})
        for prompt, answer, level in _draw(seed, num_items, levels, split, heldout_fraction, unique)
    ]


def make_sft_examples(seed: int, num_examples: int, *, levels: Sequence[int] = LEVELS,
                      split: str | None = "train", heldout_fraction: float = 0.2) -> list[tuple[str, str]]:
    """(prompt, target) pairs for supervised warm-up; target is the answer's digits (append EOS).

    Prompts may repeat (unique=False) so low levels with few distinct problems can still fill
    a large SFT set; use a different seed from the RL items.
    """
    return [(prompt, str(answer))
            for prompt, answer, _ in _draw(seed, num_examples, levels, split, heldout_fraction, False)]
