"""Verifiers: host-side, sandboxed scoring of completions (never imported by jitted code).

A verifier is `fn(item, completion) -> score | (score, status)` registered by name;
`VerifierPool` runs them in killable worker processes with a per-item deadline.
"""

from jaxrl_vr.verifiers.hacks import (
    answer_copied_from_prompt,
    conflicting_final_answers,
    empty_or_truncated_answer,
    hack_penalties,
)
from jaxrl_vr.verifiers.math_answers import MAX_ANSWER_CHARS, extract_answer, math_equal, math_verifier
from jaxrl_vr.verifiers.pool import (ErrorLog, ErrorStop, MainGuardError, VerifierPool, VerifyResult,
                                     score_serial)
from jaxrl_vr.verifiers.registry import (
    STATUSES,
    Verdict,
    check_verifier,
    exact_verifier,
    get_verifier,
    parse_leading_int,
    register_verifier,
    registered_verifiers,
)
from jaxrl_vr.verifiers.sandbox import CodeResult, code_verdict, code_verifier, run_python, sandbox_capabilities

__all__ = [
    "STATUSES", "register_verifier", "get_verifier", "registered_verifiers", "exact_verifier",
    "parse_leading_int", "VerifierPool", "VerifyResult", "score_serial", "extract_answer",
    "math_equal", "math_verifier", "MAX_ANSWER_CHARS", "run_python", "CodeResult", "code_verifier",
    "sandbox_capabilities", "conflicting_final_answers", "answer_copied_from_prompt",
    "empty_or_truncated_answer", "hack_penalties", "ErrorLog", "ErrorStop", "MainGuardError",
    "check_verifier", "Verdict", "code_verdict",
]
