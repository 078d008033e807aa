"""Math answers: extract the final answer from a completion and compare it with the gold one.

`extract_answer(text)` rules, in order (the first that yields something wins):
  1. the content of the last complete `\\boxed{...}` (or `\\fbox{...}`), nested braces
     matched, escaped braces `\\{ \\}` ignored; `\\boxed 5` (no braces) also counts;
  2. the text after the last "answer is" / "answer:" (case-insensitive) up to the line end,
     without a trailing period or `$`;
  3. the last number in the text (sign, thousands commas, decimals, a/b fractions, %).
  Returns None when none applies (status "unparsable").

`math_equal(pred, gold)` compares with math-verify (sympy underneath, Hugging Face): exact
string match first, then both parsed as LaTeX/expressions and compared numerically and
symbolically: fractions, decimals, percentages, sets, intervals, equations (`x=3` vs 3),
thousands separators, and `\\text{}` units are handled by math-verify; plain-word units
after a number ("5 dollars") are stripped first. Inputs longer than
MAX_ANSWER_CHARS are rejected before parsing. math-verify's own time limit uses
SIGALRM, so it is active only on the main thread; elsewhere (and against C-level
big-integer work that no signal interrupts) the VerifierPool's per-item deadline, which
kills the worker, is what bounds the time.
"""

from __future__ import annotations

import logging
import math
import re
import threading

__all__ = ["BOX", "closing_braces", "extract_answer", "math_equal", "math_verifier", "warmup", "MAX_ANSWER_CHARS"]

MAX_ANSWER_CHARS = 2000
BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BOX_NO_BRACE = re.compile(r"\\boxed\s+([^\s{}$]+)")
_BRACE = re.compile(r"[{}]")
_ANSWER_IS = re.compile(r"answer\s*(?:is|:)\s*:?\s*", re.IGNORECASE)
# A plain number followed by words ("5 dollars", "12 square feet."): the words are units.
_NUMBER_THEN_WORDS = re.compile(r"^\s*([-+]?\\?\$?\d[\d,]*(?:\.\d+)?%?)\s+[A-Za-z]{2,}(?:\s+[A-Za-z]{2,})*\.?\s*$")  # unambiguous: no backtracking blow-up
_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?%?|-?\d+(?:\.\d+)?(?:/\d+)?%?|-?\.\d+%?")

# math-verify logs a warning per timeout; a hostile batch should not flood the logs.
logging.getLogger("math_verify").setLevel(logging.ERROR)


def closing_braces(text: str) -> dict[int, int]:
    """Maps the index of every unescaped "{" to the index of its matching "}" (one pass)."""
    stack: list[int] = []
    closing: dict[int, int] = {}
    for match in _BRACE.finditer(text):
        position = match.start()
        before = position
        while before > 0 and text[before - 1] == "\\":  # each backslash run is walked once: linear
            before -= 1
        if (position - before) % 2 == 1:  # an odd run of backslashes escapes the brace
            continue
        if text[position] == "{":
            stack.append(position)
        elif stack:
            closing[stack.pop()] = position
    return closing


def _last_boxed(text: str) -> str | None:
    starts = [m.end() - 1 for m in BOX.finditer(text)]
    if starts:
        closing = closing_braces(text)
        for start in reversed(starts):  # the last *complete* box (a truncated one is skipped)
            if start in closing:
                return text[start + 1:closing[start]].strip()
    bare = list(_BOX_NO_BRACE.finditer(text))
    return bare[-1].group(1) if bare else None


def extract_answer(text: str) -> str | None:
    """The final answer of a completion by the rules in the module docstring, or None."""
    if not isinstance(text, str):
        raise TypeError(f"extract_answer needs a str, got {type(text).__name__}.")
    boxed = _last_boxed(text)
    if boxed:
        return boxed
    said = list(_ANSWER_IS.finditer(text[-20_000:]))
    if said:
        tail = text[-20_000:][said[-1].end():].split("\n", 1)[0].strip()
        tail = tail.strip("$ ").rstrip(".").strip("$ ")
        if tail:
            return tail
    numbers = _NUMBER.findall(text[-20_000:])
    return numbers[-1] if numbers else None


def _normalise(answer: str) -> str:
    return re.sub(r"\s+", "", answer.replace("\\$", "")).strip("$").rstrip(".")


def _strip_word_units(answer: str) -> str:
    match = _NUMBER_THEN_WORDS.match(answer)
    return match.group(1) if match else answer


def _parse(answer: str, timeout: int | None):
    import math_verify  # noqa: PLC0415  (heavy import, workers preload it)

    answer = _strip_word_units(answer)
    answer = answer.replace("\\$", "")  # a currency sign is not part of the value
    if "$" not in answer and "\\boxed" not in answer:
        answer = f"${answer}$"
    return math_verify.parse(answer, parsing_timeout=timeout)


def math_equal(pred: str, gold: str, *, timeout_s: float = 3.0) -> bool:
    """Whether the predicted answer `pred` equals `gold` mathematically (math-verify).

    Args:
      pred: the model's extracted answer (see `extract_answer`), LaTeX or plain.
      gold: the reference answer.
      timeout_s: math-verify's limit per parse/compare step (whole seconds, main thread only).

    Returns:
      True when equal; False when different, unparsable, too long or timed out. Never raises
      for a string input.
    """
    if not isinstance(pred, str) or not isinstance(gold, str):
        raise TypeError(f"math_equal needs two str, got {type(pred).__name__} and {type(gold).__name__}.")
    if not pred.strip() or len(pred) > MAX_ANSWER_CHARS:
        return False
    if _normalise(pred) == _normalise(gold):
        return True
    on_main_thread = threading.current_thread() is threading.main_thread()
    timeout = max(1, math.ceil(timeout_s)) if on_main_thread else None
    try:
        import math_verify  # noqa: PLC0415

        gold_parsed = _parse(gold, timeout)
        pred_parsed = _parse(pred, timeout)
        if not gold_parsed or not pred_parsed:
            return False
        return bool(math_verify.verify(gold_parsed, pred_parsed, timeout_seconds=timeout))
    except Exception:  # noqa: BLE001  (hostile input must not raise)
        return False


def math_verifier(item, completion: str) -> tuple[float, str]:
    """Built-in "math": extract the completion's answer and compare it with item.answer."""
    if item.answer is None:
        raise ValueError(f"Item {item.uid!r}: the 'math' verifier needs a gold answer.")
    pred = extract_answer(completion)
    if pred is None or len(pred) > MAX_ANSWER_CHARS:
        return 0.0, "unparsable"
    timeout_s = float(item.meta.get("math_timeout_s", 3.0)) if isinstance(item.meta, dict) else 3.0
    return (1.0, "ok") if math_equal(pred, str(item.answer), timeout_s=timeout_s) else (0.0, "wrong")


def warmup() -> None:
    """Pays math-verify's first-call costs (grammar load, regex compilation) up front."""
    math_equal("\\frac{1}{2}", "0.5")
    math_equal("x=3", "3")
    math_equal("\\{1,2\\}", "[1,2)")


math_verifier.warmup = warmup
