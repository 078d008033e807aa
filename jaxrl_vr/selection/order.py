"""The data order: the prompt source every run starts from.

A prompt source has ``next_prompts(num) -> int64 [num]`` (what batch strategies call),
``begin_step(step)`` (called once per RL step, before sampling), ``num_items`` and
``state_dict()`` / ``load_state_dict()``. Its draws depend only on the seed and its own
state, so a resumed run draws the same prompts. Hooks may wrap it
(``jaxrl_vr.hooks.Hook.wrap_source``): ``selection.dynamic.SkipSuspended`` skips prompts
DAPO suspended, ``selection.pairing.PairedSource`` draws positive–negative pairs.
"""

from __future__ import annotations

from typing import Any, Mapping

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
