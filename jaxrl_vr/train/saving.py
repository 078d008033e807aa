"""What a run saves, and when: the loop state and host state of the RL driver.

* ``checkpoints/``: every ``rl.checkpoint_every`` steps and at the end of the run (the
  last step, the budget spent, or an interrupt), rotated to ``rl.max_to_keep``;
* ``budget_checkpoints/``: the first step that crosses each fraction of ``rl.budget``,
  kept for good and listed in ``budget_checkpoints.json``.

``restore`` loads the newest intact checkpoint (a damaged newest step is moved aside and
the one before it is used, with a warning). ``catch_signals`` turns SIGINT / SIGTERM into a
request to stop after the current step is saved.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Callable

from jaxrl_vr import layout
from jaxrl_vr.atomic import write_json
from jaxrl_vr.train.budget import Budget, BudgetConfig, due_fractions
from jaxrl_vr.train.checkpoint import Checkpointer, Restored
from jaxrl_vr.train.workdir import read_budget_marks

__all__ = ["RunCheckpoints", "RunInterrupted", "catch_signals", "restore_signals"]

# () -> (the loop state as a dict of arrays, the host state as a JSON-able dict)
Snapshot = Callable[[], tuple[dict, dict]]


class RunCheckpoints:
    """The checkpoints of one run (module docstring).

    Args:
      workdir: the run directory.
      every: checkpoint period in steps (0 = at the end only).
      max_to_keep: rotated checkpoints kept.
      budget: the run's BudgetConfig (its fractions are kept for good).
    """

    def __init__(self, workdir: str, *, every: int, max_to_keep: int, budget: BudgetConfig):
        self.workdir, self.every, self.budget = workdir, int(every), budget
        self.latest = Checkpointer(os.path.join(workdir, layout.CHECKPOINTS), max_to_keep=max_to_keep)
        self.kept = (Checkpointer(os.path.join(workdir, layout.BUDGET_CHECKPOINTS), max_to_keep=None)
                     if budget.fractions else None)
        self.marks = read_budget_marks(workdir)

    @property
    def directory(self) -> str:
        return self.latest.directory

    def restore(self, template: dict) -> Restored | None:
        """The newest intact (state, host, step), or None for a fresh run."""
        return self.latest.restore_latest_intact(template)

    def after_step(self, step: int, *, final: bool, snapshot: Snapshot, spent: Budget) -> list[float]:
        """Saves what is due after ``step`` (``final``: the run ends here); returns the budget
        fractions kept now."""
        due = due_fractions(self.budget, spent, [m["fraction"] for m in self.marks])
        if not (final or (self.every and step % self.every == 0) or due):
            return []
        state, host = snapshot()
        if final or (self.every and step % self.every == 0):
            self.latest.save(step, state, host)
        if not due or self.kept is None:
            return []
        if step not in self.kept.all_steps():
            self.kept.save(step, state, host)
        charged = spent.charged(self.budget.include_calibration)
        self.marks = sorted(self.marks + [
            {"fraction": f, "step": step, "token_budget": int(self.budget.tokens),
             "generated_tokens": float(charged)} for f in due], key=lambda m: m["fraction"])
        write_json(os.path.join(self.workdir, layout.BUDGET_MARKS), {"marks": self.marks})
        return due

    def latest_step(self) -> int | None:
        return self.latest.latest_step()

    def close(self) -> None:
        self.latest.close()
        if self.kept is not None:
            self.kept.close()


class RunInterrupted(KeyboardInterrupt):
    """SIGINT/SIGTERM: the last complete step was checkpointed; re-run to resume."""


def catch_signals(stop: list) -> dict:
    """SIGINT/SIGTERM append their name to ``stop`` (the step finishes); a second one aborts."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum, frame):
        name = signal.Signals(signum).name
        if stop:
            raise KeyboardInterrupt(f"second {name}: aborting without a checkpoint")
        stop.append(name)

    return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}


def restore_signals(handlers: dict) -> None:
    for sig, previous in handlers.items():
        signal.signal(sig, previous)
