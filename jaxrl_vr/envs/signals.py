"""Intermediate signals of an episode's model turns (step-level credit, `jaxrl_vr.credit`).

A signal is a function of one ``TurnRecord`` returning a float in [0, 1], or NaN where it
does not apply (a turn without a tool call has no "the call ran"). The built-in ones:

* ``tool_parsed``: the share of the turn's tool calls that could be read.
* ``tool_ok``: the share that ran without an error (exit status 0 for the Python tool).
* ``compiles``: the share of its code-tool calls whose code parses as Python (``ast.parse``
  on the host: parsing only, nothing runs).
* ``tests_passed``: the fraction of tests passed that the environment reported for the
  turn in ``StepResult.info["tests_passed"]`` (a code environment's hook; NaN otherwise).

Adding a signal is a function, one ``SIGNALS`` line and its coefficient in
``StepCreditSettings`` (the ``rl.step_credit`` section); its metrics appear as
``credit/<name>/mean`` and ``credit/<name>/corr_verdict``.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import warnings
from typing import Callable, Sequence

import numpy as np

from jaxrl_vr.envs.episodes import Episodes, TurnRecord

__all__ = ["SIGNALS", "StepCreditSettings", "code_compiles", "episode_signals"]

NAN = float("nan")


def _share(flags: Sequence[bool]) -> float:
    return float(np.mean(flags)) if len(flags) else NAN


def code_compiles(code: str) -> bool:
    """``code`` parses as Python (``ast.parse``: nothing is compiled to bytecode or run)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarning for odd escapes: still parses
            ast.parse(code)
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # ValueError: NUL bytes
        return False


def tool_parsed(turn: TurnRecord) -> float:
    return _share([c.parsed for c in turn.tool_calls])


def tool_ok(turn: TurnRecord) -> float:
    return _share([c.ok for c in turn.tool_calls])


def compiles(turn: TurnRecord) -> float:
    return _share([code_compiles(c.code) for c in turn.tool_calls if c.parsed and c.code])


def tests_passed(turn: TurnRecord) -> float:
    value = turn.info.get("tests_passed")
    if isinstance(value, (bool, int, float, np.number)) and math.isfinite(float(value)):
        return float(min(max(float(value), 0.0), 1.0))
    return NAN


SIGNALS: dict[str, Callable[[TurnRecord], float]] = {
    "tool_parsed": tool_parsed,
    "tool_ok": tool_ok,
    "compiles": compiles,
    "tests_passed": tests_passed,
}


@dataclasses.dataclass(frozen=True)
class StepCreditSettings:
    """``rl.step_credit``: c_n of adv = A_outcome + Σ_n c_n·(s_turn,n − s̄_group,n) on each
    model turn's tokens (``jaxrl_vr.credit.step_credit``); the section absent = off.

    Attributes:
      tool_parsed, tool_ok, compiles, tests_passed: the coefficient of each ``SIGNALS``
        entry (0 = that signal ablated; its metrics are logged either way).
    """

    tool_parsed: float = 0.0
    tool_ok: float = 0.0
    compiles: float = 0.0
    tests_passed: float = 0.0

    def __post_init__(self):
        for name in SIGNALS:
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"rl.step_credit.{name}={value} must be a finite coefficient >= 0 "
                                 "(0 ablates the signal).")

    def coef_n(self) -> np.ndarray:
        """float32 [N] the coefficients in SIGNALS' order."""
        return np.asarray([getattr(self, name) for name in SIGNALS], np.float32)


def episode_signals(ep: Episodes, num_turns: int) -> tuple[np.ndarray, np.ndarray]:
    """Every ``SIGNALS`` value of every model turn, and the turn of every token.

    Args:
      ep: B episodes (``EpisodeRunner.run``).
      num_turns: K, the most model turns of an episode (``task.max_turns``).

    Returns:
      (signals_bkn float32 [B, K, N] in SIGNALS' order, NaN where a signal does not apply
      or turn k does not exist; turn_bt int32 [B, T] the model turn of each token, −1 on
      environment tokens and padding).
    """
    num_b, width = ep.tokens_bt.shape
    signals_bkn = np.full((num_b, num_turns, len(SIGNALS)), np.nan, np.float32)
    turn_bt = np.full((num_b, width), -1, np.int32)
    for b in range(num_b):
        spans = [(start, end) for role, start, end in ep.segments[b] if role == "model"]
        for k, (start, end) in enumerate(spans[:num_turns]):
            turn_bt[b, start:end] = k
        for k, turn in enumerate(ep.turn_records[b][:num_turns]):
            signals_bkn[b, k] = [fn(turn) for fn in SIGNALS.values()]
    return signals_bkn, np.where(ep.loss_mask_bt, turn_bt, -1).astype(np.int32)
