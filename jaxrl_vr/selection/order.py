"""Prompt sources: which training prompts a step samples, with checkpointable state.

A source has ``next_prompts(num) -> int64 [num]`` (what batch strategies call),
``begin_step(step)`` (called once per RL step, before sampling) and
``state_dict()`` / ``load_state_dict()``. Its draws depend only on the seed and its own
state, so a resumed run draws the same prompts.

* ``DataOrder``: a seeded permutation per data epoch (the default).
* ``PairedSource``: positive–negative pairs (Weighted GRPO, arXiv 2602.03452) from the
  whole pool by tracked success rates, the data order filling the rest so unmeasured
  prompts keep entering;
* ``SkipSuspended``: the data order without prompts that dynamic sampling suspended.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np


class DataOrder:
    """The next prompts of a seeded permutation per epoch (``position`` counts prompts drawn)."""

    def __init__(self, num_items: int, *, seed: int):
        if num_items < 1:
            raise ValueError("DataOrder needs at least one item.")
        self.num_items, self.seed, self.position = int(num_items), int(seed), 0

    def begin_step(self, step: int) -> None:
        del step

    def next_prompts(self, num: int) -> np.ndarray:
        out, pos = [], self.position
        while len(out) < num:
            epoch, offset = divmod(pos, self.num_items)
            order = np.random.default_rng([self.seed, epoch]).permutation(self.num_items)
            take = min(num - len(out), self.num_items - offset)
            out.extend(order[offset:offset + take].tolist())
            pos += take
        self.position = pos
        return np.asarray(out, np.int64)

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.position = int(state["position"])


class PairedSource:
    """(q⁺, q⁻) pairs first, then data-order prompts (Weighted GRPO, arXiv 2602.03452).

    Wraps ``jaxrl_vr.selection.pairing.PairedPromptSource`` (pairs from the whole pool by
    calibrated and refreshed success rates; the data order fills the rest and always
    advances) behind the source interface. ``num_pairs`` is the last draw's pair count:
    rows [0, 2·num_pairs) are laid out [q⁺₀, q⁻₀, q⁺₁, q⁻₁, …].
    """

    def __init__(self, source):
        self.source, self.num_pairs, self._step = source, 0, 0

    @property
    def position(self) -> int:
        return int(self.source.data_position)

    def begin_step(self, step: int) -> None:
        self._step = int(step)

    def next_prompts(self, num: int) -> np.ndarray:
        choice = self.source.next_prompts(self._step)
        if choice.idx_p.shape[0] != num:
            raise ValueError(f"the pairing source draws {choice.idx_p.shape[0]} prompts per step, "
                             f"asked for {num}.")
        self.num_pairs = int(choice.num_pairs)
        return np.asarray(choice.idx_p, np.int64)

    def state_dict(self) -> dict:
        return self.source.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.source.load_state_dict(state)


class SkipSuspended:
    """The data order without suspended prompts (DAPO re-check, ``RecheckSchedule``).

    A drawn prompt that is suspended at this step is deferred; deferred prompts are served
    first once ``admissible(step)`` lets them back in, so a filtered prompt is re-checked
    after its suspension instead of waiting for the next epoch.
    """

    def __init__(self, order: DataOrder, admissible: Callable[[int], np.ndarray]):
        self.order, self.admissible = order, admissible
        self.pending: list[int] = []
        self._step = 0

    def begin_step(self, step: int) -> None:
        self._step = int(step)

    def next_prompts(self, num: int) -> np.ndarray:
        ok = np.asarray(self.admissible(self._step), bool)
        ready = [p for p in self.pending if ok[p]][:num]
        self.pending = [p for p in self.pending if p not in set(ready)]
        out = list(ready)
        while len(out) < num:
            if len(self.pending) >= self.order.num_items:  # everything suspended: take the oldest
                out.append(self.pending.pop(0))
                continue
            for p in self.order.next_prompts(num - len(out)).tolist():
                (out if ok[p] and p not in out else self.pending).append(p)
        return np.asarray(out[:num], np.int64)

    def state_dict(self) -> dict:
        return {**self.order.state_dict(), "pending": list(self.pending)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.order.load_state_dict(state)
        self.pending = [int(p) for p in state.get("pending", [])]
