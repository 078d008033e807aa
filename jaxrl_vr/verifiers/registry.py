"""Verifiers by name: the built-ins and user callables registered from a config.

A verifier is a plain callable `fn(item: TaskItem, completion: str)` returning a float
score, a `(score, status)` pair with status in STATUSES, or a `Verdict(score, status,
test_passed)` whose `test_passed` holds one pass flag per unit test (code verifiers: the
fraction of tests passed is an intermediate signal the trainer logs and step-level
credit can read). A bare float means status "ok" when score > 0, else "wrong". Verifiers
run inside VerifierPool workers, which add the time limit and turn any exception into
status "error" (score 0).

Register your own with `register_verifier("name", fn)` or, from a config, by import path:
`register_verifier("name", "my_pkg.my_module:my_fn")`. With the default "forkserver"
pool, a verifier must be importable (a module-level function) so workers can load it.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from jaxrl_vr.registry import did_you_mean

__all__ = [
    "STATUSES", "Verdict", "VerifierFn", "register_verifier", "get_verifier", "registered_verifiers",
    "check_verifier", "unknown_verifier_message", "normalize_output", "normalize_verdict", "parse_leading_int",
    "exact_verifier",
]

STATUSES = ("ok", "wrong", "timeout", "error", "unparsable")
VerifierFn = Callable[[Any, str], Any]

_REGISTRY: dict[str, VerifierFn | str] = {}


class Verdict(NamedTuple):
    """A verifier's full answer: score, status and (test-based verifiers) per-test results.

    Attributes:
      score: finite float (1/0 for pass/fail tasks; partial credit where the task says so).
      status: one of STATUSES.
      test_passed: one bool per unit test in the item's order, or None when the verifier
        runs no tests (answer-checking verifiers).
    """

    score: float
    status: str
    test_passed: tuple[bool, ...] | None = None


def register_verifier(name: str, fn: VerifierFn | str, *, overwrite: bool = False) -> None:
    """Registers `fn` (a callable or a "module:attribute" import path) under `name`."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"Verifier name must be a non-empty string, got {name!r}.")
    if not (callable(fn) or (isinstance(fn, str) and ":" in fn)):
        raise TypeError(f"Verifier {name!r} must be a callable or a 'module:attribute' string, got {fn!r}.")
    if name in _REGISTRY and not overwrite and _REGISTRY[name] is not fn:
        raise ValueError(f"Verifier {name!r} is already registered; pass overwrite=True to replace it.")
    _REGISTRY[name] = fn


def _resolve(name: str, fn: VerifierFn | str) -> VerifierFn:
    if callable(fn):
        return fn
    module_name, _, attribute = fn.partition(":")
    try:
        resolved = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"Verifier {name!r}: cannot import {fn!r} ({e}). Check the 'module:attribute' path.") from e
    if not callable(resolved):
        raise TypeError(f"Verifier {name!r}: {fn!r} is not callable.")
    return resolved


def unknown_verifier_message(name: Any) -> str:
    """Names the unknown verifier, the closest registered name, all of them and how to add one."""
    known = sorted(registered_verifiers())
    return (f"Unknown verifier {name!r}{did_you_mean(str(name), known)}; registered: {known}. Register it before the run starts with "
            f"jaxrl_vr.verifiers.register_verifier({str(name)!r}, fn) where fn is a module-level function "
            "(item, completion) -> score | (score, status), or an import path 'my_pkg.my_module:my_fn'.")


def check_verifier(name: str, *, resolve: bool = False) -> None:
    """Raises ValueError (naming the registered verifiers) unless `name` is registered.

    Call it at start-up for every verifier a task uses, before any model is loaded. With
    `resolve=True` an import-path verifier is also imported here (ValueError if it fails).
    """
    if not isinstance(name, str) or name not in registered_verifiers():
        raise ValueError(unknown_verifier_message(name))
    if resolve:
        _resolve(name, _REGISTRY[name])


def get_verifier(name: str) -> VerifierFn:
    """The callable registered under `name`; raises a ValueError listing the known names."""
    check_verifier(name)
    return _resolve(name, _REGISTRY[name])


def registered_verifiers() -> dict[str, VerifierFn | str]:
    """A copy of the registry (name -> callable or import path)."""
    _register_builtins()
    return dict(_REGISTRY)


def normalize_verdict(output: Any) -> Verdict:
    """A verifier's return value as a Verdict (finite score, known status); raises on anything else.

    Accepts a number, `(score, status)`, or `(score, status, test_passed)` / `Verdict` with
    test_passed a sequence of bools (or None).
    """
    test_passed = None
    if isinstance(output, tuple):
        if len(output) not in (2, 3):
            raise TypeError(f"A verifier must return a float, (score, status) or (score, status, test_passed); "
                            f"got a {len(output)}-tuple.")
        score, status = output[0], output[1]
        if len(output) == 3 and output[2] is not None:
            test_passed = output[2]
            if isinstance(test_passed, (str, bytes)) or not isinstance(test_passed, Sequence) or not all(
                    isinstance(flag, (bool, np.bool_)) for flag in test_passed):
                raise TypeError(f"A verifier's test_passed must be a sequence of bools, got {test_passed!r:.80}.")
            test_passed = tuple(bool(flag) for flag in test_passed)
        if status not in STATUSES:
            raise ValueError(f"Verifier status {status!r} is not one of {STATUSES}.")
    else:
        score, status = output, None
    if isinstance(score, bool):
        score = float(score)
    if not isinstance(score, (int, float)) and not hasattr(score, "__float__"):
        raise TypeError(f"A verifier score must be a number, got {type(score).__name__}.")
    score = float(score)
    if not math.isfinite(score):
        raise ValueError(f"A verifier score must be finite, got {score}.")
    if status is None:
        status = "ok" if score > 0 else "wrong"
    return Verdict(score, status, test_passed)


def normalize_output(output: Any) -> tuple[float, str]:
    """A verifier's return value as (finite float score, status); raises on anything else."""
    verdict = normalize_verdict(output)
    return verdict.score, verdict.status


_LEADING_INT = re.compile(r"[+-]?\d{1,4300}")


def parse_leading_int(text: str) -> int | None:
    """The integer the text starts with, ignoring spaces (" 1 2 3x" -> 123); None if none."""
    head = text[:8192].replace(" ", "").replace("\t", "").lstrip("\n")
    match = _LEADING_INT.match(head)
    return int(match.group()) if match else None


def exact_verifier(item, completion: str) -> tuple[float, str]:
    """Built-in "exact": the completion's leading integer equals the integer gold answer.

    Spaces are stripped first; a completion that does not start with an integer is
    "unparsable" (score 0). Used by the built-in arithmetic task.
    """
    gold = parse_leading_int(str(item.answer)) if item.answer is not None else None
    if gold is None:
        raise ValueError(f"Item {item.uid!r}: the 'exact' verifier needs an integer answer, got {item.answer!r}.")
    pred = parse_leading_int(completion)
    if pred is None:
        return 0.0, "unparsable"
    return (1.0, "ok") if pred == gold else (0.0, "wrong")


_BUILTINS: dict[str, str] = {
    "exact": "jaxrl_vr.verifiers.registry:exact_verifier",
    "math": "jaxrl_vr.verifiers.math_answers:math_verifier",
    "code": "jaxrl_vr.verifiers.sandbox:code_verifier",
    "reasoning_gym": "jaxrl_vr.tasks.reasoning_gym:reasoning_gym_verifier",
    "humaneval": "jaxrl_vr.tasks.humaneval:humaneval_verifier",
}


def _register_builtins() -> None:
    for name, path in _BUILTINS.items():
        _REGISTRY.setdefault(name, path)
