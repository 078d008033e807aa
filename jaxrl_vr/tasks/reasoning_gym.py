"""reasoning-gym adapter: its procedural generators as TaskItems, scored by their own score_answer.

Needs `pip install reasoning-gym` (the "tasks" extra). The completion's answer is the
content of its last <answer>...</answer> tag (reasoning-gym's convention), else the whole
completion stripped; the dataset's `score_answer(answer, entry)` gives the score in [0, 1].
"""

from __future__ import annotations

import functools
import json
from typing import NamedTuple

from jaxrl_vr.tasks.base import TaskItem, drop_repeats

try:  # imported here so a verifier worker pays it while resolving, not within an item's deadline
    import reasoning_gym
except ImportError:  # the adapter is optional ("tasks" extra)
    reasoning_gym = None

__all__ = ["UniqueDraw", "draw_unique_items", "make_reasoning_gym_items", "reasoning_gym_names",
           "reasoning_gym_verifier"]

# draw_unique_items looks at up to this many times the requested items (+ 100) before it
# gives up on a generator with too few distinct problems.
MAX_DRAW_FACTOR = 10


def reasoning_gym_names() -> tuple[str, ...]:
    """The registered generator names (() when reasoning-gym is not installed)."""
    if reasoning_gym is None:
        return ()
    from reasoning_gym.factory import DATASETS  # noqa: PLC0415
    return tuple(sorted(DATASETS))


@functools.lru_cache(maxsize=64)
def _dataset(name: str, config_json: str):
    if reasoning_gym is None:
        raise ImportError("The reasoning-gym adapter needs the package: pip install reasoning-gym.")
    return reasoning_gym.create_dataset(name, **json.loads(config_json))


def make_reasoning_gym_items(name: str, *, seed: int, size: int, **config) -> list[TaskItem]:
    """`size` items of reasoning-gym generator `name` (deterministic from `seed`).

    Extra keyword arguments are the generator's config (e.g. min_terms=2). Items carry the
    generator's entry in meta so `reasoning_gym_verifier` can score them in any process.
    """
    config_json = json.dumps({**config, "seed": seed, "size": size}, sort_keys=True)
    dataset = _dataset(name, config_json)
    items = []
    for index in range(size):
        entry = dataset[index]
        difficulty = entry.get("metadata", {}).get("difficulty")
        items.append(TaskItem(
            uid=f"rg:{name}:{seed}:{index}", prompt=entry["question"], answer=str(entry["answer"]),
            verifier="reasoning_gym", difficulty=difficulty if isinstance(difficulty, int) else 0,
            meta={"rg_name": name, "rg_config": config_json, "rg_entry": entry}))
    return items


class UniqueDraw(NamedTuple):
    """Items with distinct prompts, and what was skipped to get them."""

    items: list
    repeats: int  # drawn items skipped because their prompt was drawn before (or is in ``seen``)
    excluded: int  # drawn items skipped because their prompt is in ``exclude``
    drawn: int  # generator indices looked at (0 .. drawn - 1)


def draw_unique_items(name: str, *, seed: int, size: int, seen: set[str] | frozenset[str] = frozenset(),
                      exclude: set[str] | frozenset[str] = frozenset(), **config) -> UniqueDraw:
    """``size`` items of generator ``name`` whose prompts (``normalize_prompt``) are distinct
    and in neither ``seen`` nor ``exclude``: indices 0, 1, 2, ... in order, each skipped when
    its prompt is taken, up to ``MAX_DRAW_FACTOR · size + 100`` indices. With nothing to skip
    these are ``make_reasoning_gym_items(name, seed=seed, size=size)``; a generator with too
    few distinct problems gives fewer than ``size``.
    """
    limit = MAX_DRAW_FACTOR * size + 100
    count = size
    while True:
        kept, repeats, excluded = drop_repeats(make_reasoning_gym_items(name, seed=seed, size=count, **config),
                                               exclude, seen=seen, limit=size)
        if len(kept) == size or count >= limit:
            return UniqueDraw(kept, repeats, excluded, len(kept) + repeats + excluded)
        count = min(limit, max(2 * count, count + 2 * (size - len(kept))))


def _last_answer_tag(text: str) -> str | None:
    """Content of the last <answer>...</answer> (linear: no regex scan per opening tag)."""
    end = text.rfind("</answer>")
    begin = text.rfind("<answer>", 0, end) if end >= 0 else -1
    return text[begin + len("<answer>"):end] if begin >= 0 else None


def reasoning_gym_verifier(item: TaskItem, completion: str) -> tuple[float, str]:
    """Built-in "reasoning_gym": the generator's own score_answer on the extracted answer."""
    meta = item.meta
    if not isinstance(meta, dict) or "rg_name" not in meta:
        raise ValueError(f"Item {item.uid!r} was not made by make_reasoning_gym_items (no rg_name in meta).")
    answer = _last_answer_tag(completion)
    answer = (completion if answer is None else answer).strip()
    if not answer:
        return 0.0, "unparsable"
    score = float(_dataset(meta["rg_name"], meta["rg_config"]).score_answer(answer=answer, entry=meta["rg_entry"]))
    return score, ("ok" if score >= 1.0 else "wrong")
