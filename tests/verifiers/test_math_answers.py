"""Math answer extraction and math_equal (math-verify), including hostile input."""

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxrl_vr.tasks.base import TaskItem
from jaxrl_vr.verifiers import VerifierPool, extract_answer, math_equal, math_verifier
from jaxrl_vr.verifiers.math_answers import _strip_word_units


@pytest.mark.parametrize("text, expected", [
    ("so \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
    ("first \\boxed{3}, finally \\boxed{\\{1,2\\}}", "\\{1,2\\}"),   # last box; escaped braces
    ("\\boxed{\\frac{a}{\\sqrt{b}}}", "\\frac{a}{\\sqrt{b}}"),          # nested braces
    ("\\boxed{1} then \\boxed{2", "1"),                                 # truncated last box skipped
    ("\\fbox{7}", "7"),
    ("\\boxed 7", "7"),
    ("Thus the answer is $42$.", "42"),
    ("Answer: x+1\nmore", "x+1"),
    ("we get 3, 4 and 1,234.5 in total", "1,234.5"),
    ("ratio -3/4", "-3/4"),
    ("no digits here", None),
    ("", None),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("pred, gold", [
    ("0.5", "\\frac{1}{2}"), ("\\dfrac{3}{4}", "0.75"), ("50\\%", "0.5"), ("1,000", "1000"),
    ("3.0", "3"), ("5\\text{ cm}", "5"), ("5 \\mathrm{cm}", "5"), ("\\$5", "5"), ("x=3", "3"),
    ("\\{2,1\\}", "\\{1,2\\}"), ("[1,2)", "[1,2)"), ("\\frac{\\sqrt{2}}{2}", "\\sqrt{2}/2"),
])
def test_math_equal_true(pred, gold):
    assert math_equal(pred, gold)


@pytest.mark.parametrize("pred, gold", [
    ("2", "3"), ("(1,2)", "[1,2)"), ("\\{1,3\\}", "\\{1,2\\}"), ("0.51", "\\frac{1}{2}"), ("", "1"), ("a", "b"),
])
def test_math_equal_false(pred, gold):
    assert not math_equal(pred, gold)


def test_math_verifier_statuses():
    item = TaskItem(uid="m", prompt="1/2?", answer="\\frac{1}{2}", verifier="math")
    assert math_verifier(item, "so \\boxed{0.5}") == (1.0, "ok")
    assert math_verifier(item, "so \\boxed{0.6}") == (0.0, "wrong")
    assert math_verifier(item, "I do not know") == (0.0, "unparsable")


def test_extraction_is_linear_on_hostile_text():
    hostile = [
        "{" * 100_000 + "}" * 100_000,
        "\\boxed{" * 100_000,
        "\\boxed{" + "{" * 100_000 + "1" + "}" * 100_000 + "}",
        "x" * 1_000_000 + "\\boxed{5}",
    ]
    start = time.perf_counter()
    results = [extract_answer(text) for text in hostile]
    assert time.perf_counter() - start < 5.0
    assert results[:2] == [None, None] and results[2].count("{") == 100_000 and results[3] == "5"


def test_hostile_math_returns_within_the_deadline():
    item = TaskItem(uid="h", prompt="?", answer="1", verifier="math")
    completions = ["\\boxed{10^{10^{10^{10}}}}", "\\boxed{9^9^9^9}", "\\boxed{9^{9^{9^{9}}}}",
                   "\\boxed{" + "{" * 100_000 + "1" + "}" * 100_000 + "}", "z" * 1_000_000 + " \\boxed{1}",
                   "\\boxed{1}"]
    with VerifierPool(2, timeout_s=2.0) as pool:
        start = time.perf_counter()
        result = pool.score([item] * len(completions), completions)
        elapsed = time.perf_counter() - start
    assert elapsed < 2.0 * 3 + 3.0  # at most three deadlines per worker, plus restarts
    assert set(result.statuses[:4]) <= {"wrong", "timeout", "unparsable"}
    assert result.statuses[4:] == ["ok", "ok"]
    assert result.scores[:4].tolist() == [0.0] * 4


@pytest.mark.parametrize("pred", ["10^{10^{10^{10}}}", "9^9^9^9", "9^{9^{9^{9}}}", "{" * 100_000 + "1" + "}" * 100_000,
                                  "1" * 1_000_000])
def test_math_equal_on_hostile_answers_returns_false_in_time(pred):
    start = time.perf_counter()
    assert not math_equal(pred, "1", timeout_s=1)
    assert time.perf_counter() - start < 4.0  # at most a few 1 s alarms (parse gold, parse pred, compare)


@settings(max_examples=40, deadline=None)
@given(st.integers(-10**6, 10**6), st.integers(1, 1000))
def test_math_equal_fraction_property(numerator, denominator):
    gold = f"\\frac{{{numerator}}}{{{denominator}}}"
    assert math_equal(f"{numerator}/{denominator}", gold)
    assert not math_equal(f"{numerator}/{denominator} + 1", gold)


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="\\boxed{}0123456789 $answer is:.,-/%", max_size=200))
def test_extract_answer_never_raises(text):
    answer = extract_answer(text)
    assert answer is None or (isinstance(answer, str) and answer)


@pytest.mark.parametrize("pred, gold, expected", [
    ("5 dollars", "5", True), ("12 square feet.", "12", True), ("5 dollars", "6", False), ("5 x", "5", False),
])
def test_plain_word_units_are_stripped(pred, gold, expected):
    assert math_equal(pred, gold) is expected


def test_unit_stripping_regex_does_not_backtrack():
    # A words-then-junk tail is the classic exponential-backtracking input for "(word\\s*)+".
    start = time.perf_counter()
    assert _strip_word_units("5 " + "a" * 100_000 + "!") == "5 " + "a" * 100_000 + "!"  # no match: unchanged
    assert _strip_word_units("5 " + "ab " * 30_000 + "1").startswith("5 ab")
    assert time.perf_counter() - start < 1.0


def test_backslash_runs_are_linear():
    start = time.perf_counter()
    assert extract_answer("\\" * 1_000_000 + "{") is None
    assert extract_answer("\\boxed{" + "\\\\" * 200_000 + "}") == "\\\\" * 200_000  # "\\\\" escapes nothing
    assert extract_answer("\\boxed{\\{1\\}}") == "\\{1\\}"
    assert time.perf_counter() - start < 5.0
