"""The task item every task source produces and every verifier consumes, and the splits.

Train and held-out prompts are compared in one form, ``normalize_prompt``; ``clean_split``
gives every task source a training pool without repeats or held-out prompts and a held-out
set without repeats, and counts what it removed (``SplitReport``).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, NamedTuple


@dataclasses.dataclass(frozen=True)
class TaskItem:
    """One prompt with what is needed to verify a completion of it.

    Attributes:
        uid: stable identifier of the prompt (per-prompt trackers key on it).
        prompt: the text given to the model (before any chat template).
        answer: gold answer for answer-checking verifiers ("exact", "math"), else None.
        tests: test snippets for the "code" verifier, else None.
        verifier: name of the registered verifier that scores this item.
        difficulty: integer difficulty level (task-specific; 0 = easiest).
        meta: anything else a verifier needs (e.g. "timeout_s" for code items).
    """

    uid: str
    prompt: str
    answer: str | None = None
    tests: tuple[str, ...] | None = None
    verifier: str = "exact"
    difficulty: int = 0
    meta: dict[str, Any] = dataclasses.field(default_factory=dict, hash=False)

    def __post_init__(self):
        if not isinstance(self.prompt, str):
            raise TypeError(f"TaskItem {self.uid!r}: prompt must be a str, got {type(self.prompt).__name__}.")
        if self.tests is not None and not isinstance(self.tests, tuple):
            # Accept any sequence of strings; store an immutable tuple.
            object.__setattr__(self, "tests", tuple(self.tests))


def stable_hash(text: str) -> int:
    """A 64-bit hash of `text` that is the same in every process and Python version."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def in_split(key: str, split: str | None, *, heldout_fraction: float) -> bool:
    """Whether `key` belongs to `split` ("train", "test" or None = all), by a stable hash.

    Train and test are disjoint by construction: a key is "test" when its hash bucket
    (out of 10_000) falls below heldout_fraction·10_000.
    """
    if split is None:
        return True
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train', 'test' or None, got {split!r}.")
    if not 0.0 <= heldout_fraction <= 1.0:
        raise ValueError(f"heldout_fraction must lie in [0, 1], got {heldout_fraction}.")
    is_test = stable_hash(key) % 10_000 < round(heldout_fraction * 10_000)
    return is_test == (split == "test")


def normalize_prompt(text: str) -> str:
    """The form in which two prompts are compared: whitespace runs collapsed to one space,
    stripped, case-folded ("  What is 2+2? " and "what is 2+2?" are the same prompt)."""
    return " ".join(text.split()).casefold()


def prompt_keys(items) -> set[str]:
    """The normalised prompts of ``items``."""
    return {normalize_prompt(item.prompt) for item in items}


def drop_repeats(items, exclude: set[str] | frozenset[str] = frozenset(), *,
                 seen: set[str] | frozenset[str] = frozenset(), limit: int | None = None) -> tuple[list, int, int]:
    """``items`` in order without those whose normalised prompt is in ``exclude`` or repeats
    an earlier item's (or one of ``seen``); stops once ``limit`` items are kept.

    Returns:
      (kept items, repeats dropped, excluded dropped); an item that is both counts as excluded.
      The items looked at are their sum.
    """
    kept, seen, repeats, excluded = [], set(seen), 0, 0
    for item in items:
        if limit is not None and len(kept) == limit:
            break
        key = normalize_prompt(item.prompt)
        if key in exclude:
            excluded += 1
        elif key in seen:
            repeats += 1
        else:
            seen.add(key)
            kept.append(item)
    return kept, repeats, excluded


class SplitReport(NamedTuple):
    """What cleaning a task's training pool and held-out set removed (counts of items).

    Attributes:
      train, heldout: sizes after cleaning.
      train_duplicates: training items dropped because their prompt repeats an earlier one.
      train_in_heldout: training items dropped because their prompt is a held-out prompt.
      heldout_duplicates: held-out items dropped because their prompt repeats an earlier one.
      extra_drawn: items a generated source drew beyond the requested counts to replace them.
      train_short, heldout_short: requested prompts a generated source could not draw (the
        generator has too few distinct problems): the pool or the held-out set is smaller.
    """

    train: int = 0
    heldout: int = 0
    train_duplicates: int = 0
    train_in_heldout: int = 0
    heldout_duplicates: int = 0
    extra_drawn: int = 0
    train_short: int = 0
    heldout_short: int = 0

    def plus(self, later: SplitReport) -> SplitReport:
        """The counts of both cleanings (``self`` first) with ``later``'s sizes."""
        counts = {name: getattr(self, name) + getattr(later, name) for name in self._fields[2:]}
        return SplitReport(train=later.train, heldout=later.heldout, **counts)

    def describe(self) -> str:
        """One line for the log."""
        text = (f"{self.train} training prompts, {self.heldout} held-out; removed {self.train_duplicates} "
                f"repeated and {self.train_in_heldout} held-out prompts from the training pool, "
                f"{self.heldout_duplicates} repeated from the held-out set")
        if self.extra_drawn:
            text += f"; drew {self.extra_drawn} more items to replace them"
        if self.train_short or self.heldout_short:
            text += (f"; the generator has too few distinct problems: {self.train_short} training and "
                     f"{self.heldout_short} held-out prompts short of the request")
        return text


def clean_split(train, heldout, *, num_train: int = 0, num_eval: int = 0) -> tuple[list, list, SplitReport]:
    """A training pool without repeats and without held-out prompts, and a held-out set
    without repeats (by ``normalize_prompt``; the first occurrence is kept, order is kept).

    Args:
      train, heldout: TaskItems.
      num_train, num_eval: caps applied after cleaning (0 = none), so a later row takes the
        place of a removed one; the held-out set is capped before the pool is checked
        against it.

    Returns:
      (train, heldout, SplitReport).
    """
    heldout, heldout_repeats, _ = drop_repeats(heldout)
    heldout = heldout[: num_eval or None]
    train, train_repeats, in_heldout = drop_repeats(train, prompt_keys(heldout))
    train = train[: num_train or None]
    return train, heldout, SplitReport(
        train=len(train), heldout=len(heldout), train_duplicates=train_repeats,
        train_in_heldout=in_heldout, heldout_duplicates=heldout_repeats)
