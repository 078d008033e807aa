"""Reward-hack detectors: host-side string checks, each a 0/1 flag per completion.

P_hack in R = R_verifier − λ_len·P_overlong − λ_hack·P_hack (SPEC §5) is 1 when any
enabled detector fires. The detectors are deliberately conservative; each one's flags are
returned separately so they are logged (and ablated) one by one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np

from jaxrl_vr.verifiers.math_answers import BOX, closing_braces, extract_answer

__all__ = ["DETECTORS", "conflicting_final_answers", "answer_copied_from_prompt",
           "empty_or_truncated_answer", "hack_penalties"]

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


def empty_or_truncated_answer(completion: str, truncated: bool = False) -> bool:
    """Empty (whitespace only), cut off by the length limit, or ending inside an unclosed \\boxed{."""
    if truncated or not completion.strip():
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
                   enabled: Sequence[str] = tuple(DETECTORS)) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Runs the enabled detectors over a batch.

    Args:
      prompts, completions: B strings each.
      truncated_b: B bools, True where the sampler hit max_new_tokens (default all False).
      golds: B gold answers or None (used by the copy detector to spare correct answers).
      enabled: detector names from DETECTORS.

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
            values = [empty_or_truncated_answer(c, bool(t)) for c, t in zip(completions, truncated_b)]
        flags[name] = np.asarray(values, bool).reshape([n])
    penalty_b = np.zeros([n], np.float32)
    for values in flags.values():
        penalty_b = np.maximum(penalty_b, values.astype(np.float32))
    return penalty_b, flags
