"""The task item every task source produces and every verifier consumes."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any


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
