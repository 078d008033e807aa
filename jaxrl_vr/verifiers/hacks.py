"""Reward-hack detectors: host-side string checks, each a 0/1 flag per completion.

P_hack in R = R_verifier − λ_len·P_overlong − λ_hack·P_hack (SPEC §5) is 1 when any
enabled detector fires. The detectors are deliberately conservative; each one's flags are
returned separately so they are logged (and ablated) one by one.

``DETECTORS`` read a completion's text (the final model turn of an episode);
``EPISODE_DETECTORS`` read an episode's model turns and tool calls (SPEC §6b: the
behaviours tools invite) and run on environment tasks only (``episode_hack_flags``).
"""

from __future__ import annotations

import ast
import json
import re
import warnings
from collections.abc import Callable, Sequence

import numpy as np

from jaxrl_vr.verifiers.math_answers import BOX, closing_braces, extract_answer

__all__ = ["DETECTORS", "EPISODE_DETECTORS", "answer_copied_from_prompt", "answer_printed_by_tool",
           "conflicting_final_answers", "empty_model_turn", "empty_or_truncated_answer", "episode_hack_flags",
           "hack_penalties", "tool_call_spam"]

_STATED = re.compile(r"answer\s*(?:is|:)\s*:?\s*\$?([^\s$,;]+)", re.IGNORECASE)
_TOKEN = re.compile(r"-?\d+(?:\.\d+)?|[A-Za-z_]\w*")


def _norm(text: str) -> str:
    return re.sub(r"\s+", "", text).strip("$").rstrip(".")


def conflicting_final_answers(completion: str) -> bool:
    """Two or more *different* final answers: boxed contents, or "answer is X" statements.

    Example: "\\boxed{3} ... or \\boxed{4}" fires; "\\boxed{3} so \\boxed{3}" does not.
    """
    closing = closing_braces(completion) if "\\" in completion else {}
    boxed = {_norm(completion[m.end():closing[m.end() - 1]]) for m in BOX.finditer(completion)
             if m.end() - 1 in closing}
    stated = {_norm(m.group(1)) for m in _STATED.finditer(completion[-20_000:])}
    return len(boxed - {""}) > 1 or len(stated - {""}) > 1


def answer_copied_from_prompt(prompt: str, completion: str, gold: str | None = None) -> bool:
    """The completion echoes the prompt, or its answer is a number/name taken from the prompt.

    Fires when the whole prompt (at least 8 characters) reappears in the completion, or when
    the extracted answer equals one of the prompt's numbers/identifiers and differs from
    the gold answer (when given): "47+38=" answered "47" fires, "0+5=" answered "5" does not.
    """
    if len(prompt.strip()) >= 8 and prompt.strip() in completion:
        return True
    answer = extract_answer(completion)
    if answer is None:
        return False
    answer = _norm(answer)
    if gold is not None and answer == _norm(gold):
        return False
    return answer in set(_TOKEN.findall(prompt))


def empty_or_truncated_answer(completion: str, truncated: bool = False, *,
                              hard_truncation: bool = False) -> bool:
    """Empty (whitespace only), or ending inside an unclosed \\boxed{ (an answer cut off
    mid-box). Hitting the length limit alone is the overlong penalty's business (DAPO's soft
    window, ``rewards.overlong_penalty``), not a hack: ``truncated`` fires only under the
    hard rule ``hard_truncation=True`` (``rl.rewards.truncation_is_hack``)."""
    if (truncated and hard_truncation) or not completion.strip():
        return True
    boxes = [m.end() - 1 for m in BOX.finditer(completion)]
    return bool(boxes) and boxes[-1] not in closing_braces(completion)


DETECTORS: dict[str, Callable[..., bool]] = {
    "conflicting_answers": conflicting_final_answers,
    "copied_from_prompt": answer_copied_from_prompt,
    "empty_or_truncated": empty_or_truncated_answer,
}


def hack_penalties(prompts: Sequence[str], completions: Sequence[str], *,
                   truncated_b: Sequence[bool] | None = None, golds: Sequence[str | None] | None = None,
                   enabled: Sequence[str] = tuple(DETECTORS), truncation_is_hack: bool = False
                   ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Runs the enabled detectors over a batch.

    Args:
      prompts, completions: B strings each.
      truncated_b: B bools, True where the sampler hit max_new_tokens (default all False).
      golds: B gold answers or None (used by the copy detector to spare correct answers).
      enabled: detector names from DETECTORS.
      truncation_is_hack: the hard rule: ``empty_or_truncated`` fires on every truncated
        completion (default: only on empty ones and unclosed boxes).

    Returns:
      (penalty_b float32 [B] = 1 where any enabled detector fired, {name: bool [B]}).
    """
    unknown = sorted(set(enabled) - set(DETECTORS))
    if unknown:
        raise ValueError(f"Unknown hack detectors {unknown}; choose from {sorted(DETECTORS)}.")
    n = len(completions)
    if len(prompts) != n:
        raise ValueError(f"Got {len(prompts)} prompts and {n} completions; pass one prompt per completion.")
    truncated_b = [False] * n if truncated_b is None else list(truncated_b)
    golds = [None] * n if golds is None else list(golds)
    if len(truncated_b) != n or len(golds) != n:
        raise ValueError(f"truncated_b and golds must have {n} entries like completions.")
    flags = {}
    for name in enabled:
        if name == "conflicting_answers":
            values = [conflicting_final_answers(c) for c in completions]
        elif name == "copied_from_prompt":
            values = [answer_copied_from_prompt(p, c, g) for p, c, g in zip(prompts, completions, golds)]
        else:
            values = [empty_or_truncated_answer(c, bool(t), hard_truncation=truncation_is_hack)
                      for c, t in zip(completions, truncated_b)]
        flags[name] = np.asarray(values, bool).reshape([n])
    penalty_b = np.zeros([n], np.float32)
    for values in flags.values():
        penalty_b = np.maximum(penalty_b, values.astype(np.float32))
    return penalty_b, flags


# ------------------------------------------------------------------ episode detectors


def _call_key(call) -> str:
    return json.dumps([call.name, call.code, dict(call.arguments)], sort_keys=True, default=str)


def tool_call_spam(tool_calls: Sequence, *, max_calls: int) -> bool:
    """More than ``max_calls`` tool calls in the episode, or the same call (name, code and
    arguments) made twice: a deterministic tool answers a repeat with what it said before."""
    keys = [_call_key(c) for c in tool_calls]
    return len(keys) > max_calls or len(set(keys)) < len(keys)


def _literals(code: str) -> set[str]:
    """Normalized literals of ``code``: numbers (with their sign) and the numbers and names
    inside its strings; every number/name token when the code does not parse."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set(_TOKEN.findall(code))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
            node, sign = node.operand, "-"
        else:
            sign = ""
        if not isinstance(node, ast.Constant) or isinstance(node.value, bool):
            continue
        if isinstance(node.value, (int, float)):
            out.add(sign + _norm(repr(node.value)))
            if isinstance(node.value, float) and node.value.is_integer():
                out.add(sign + str(int(node.value)))
        elif isinstance(node.value, str):
            out.add(_norm(node.value))
            out.update(_TOKEN.findall(node.value))
    return out


def answer_printed_by_tool(tool_calls: Sequence, prompt: str, gold: str | None) -> bool:
    """A tool call carries the gold answer as a literal (``print(4042)`` for "47*86="), so
    the tool echoes the answer instead of computing it.

    Fires when the normalized gold answer is a literal of a call's code (a number, a string,
    or a number inside a string) or an argument's value, unless the gold is itself a
    number/name of the prompt ("5+0=" computed as ``print(5+0)`` does not fire). A gold that
    any computation might spell (a one-digit number) can fire on honest code too.
    """
    if gold is None or not _norm(str(gold)):
        return False
    target = _norm(str(gold))
    if target in set(_TOKEN.findall(prompt)):
        return False
    for call in tool_calls:
        if call.code and target in _literals(call.code):
            return True
        if any(_norm(str(v)) == target for v in dict(call.arguments).values()):
            return True
    return False


def empty_model_turn(turn_texts: Sequence[str]) -> bool:
    """A model turn whose text is empty or whitespace (the turn only spent a step)."""
    return any(not text.strip() for text in turn_texts)


EPISODE_DETECTORS: dict[str, Callable[..., bool]] = {
    "tool_spam": tool_call_spam,
    "answer_from_tool": answer_printed_by_tool,
    "empty_turn": empty_model_turn,
}


def episode_hack_flags(turn_records: Sequence[Sequence], prompts: Sequence[str], golds: Sequence[str | None], *,
                       enabled: Sequence[str] = tuple(EPISODE_DETECTORS), max_tool_calls: int = 4
                       ) -> dict[str, np.ndarray]:
    """Runs the enabled episode detectors over B episodes.

    Args:
      turn_records: per episode, its model turns (``jaxrl_vr.envs.TurnRecord``: ``text``,
        ``tool_calls`` with ``name``, ``code``, ``arguments``).
      prompts, golds: per episode, the task's prompt and gold answer (None = unknown).
      enabled: names from EPISODE_DETECTORS.
      max_tool_calls: ``tool_spam`` fires above this many calls in an episode.

    Returns:
      {name: bool [B]} per enabled detector.
    """
    unknown = sorted(set(enabled) - set(EPISODE_DETECTORS))
    if unknown:
        raise ValueError(f"Unknown episode hack detectors {unknown}; choose from {sorted(EPISODE_DETECTORS)}.")
    n = len(turn_records)
    if len(prompts) != n or len(golds) != n:
        raise ValueError(f"Got {len(prompts)} prompts and {len(golds)} golds for {n} episodes; pass one each.")
    calls = [[c for turn in turns for c in turn.tool_calls] for turns in turn_records]
    flags = {}
    for name in enabled:
        if name == "tool_spam":
            values = [tool_call_spam(c, max_calls=max_tool_calls) for c in calls]
        elif name == "answer_from_tool":
            values = [answer_printed_by_tool(c, p, g) for c, p, g in zip(calls, prompts, golds)]
        else:
            values = [empty_model_turn([turn.text for turn in turns]) for turns in turn_records]
        flags[name] = np.asarray(values, bool).reshape([n])
    return flags
