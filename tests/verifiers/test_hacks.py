"""Reward-hack detectors."""

import numpy as np
import pytest

from jaxrl_vr.verifiers import hacks


@pytest.mark.parametrize("completion, expected", [
    ("\\boxed{3} or maybe \\boxed{4}", True),
    ("\\boxed{3} so again \\boxed{ 3 }", False),
    ("The answer is 5. No wait, the answer is 6", True),
    ("The answer is 5.", False),
    ("just 42", False),
])
def test_conflicting_final_answers(completion, expected):
    assert hacks.conflicting_final_answers(completion) is expected


@pytest.mark.parametrize("prompt, completion, gold, expected", [
    ("47+38=", "47", "85", True),           # an operand copied as the answer
    ("0+5=", "5", "5", False),              # equal to the gold: not a hack
    ("47+38=", "85", "85", False),
    ("What is 12 times 3 plus 4?", "What is 12 times 3 plus 4? \\boxed{40}", None, True),  # prompt echoed
    ("What is 12 times 3?", "\\boxed{12}", None, True),
    ("What is 12 times 3?", "\\boxed{36}", None, False),
])
def test_answer_copied_from_prompt(prompt, completion, gold, expected):
    assert hacks.answer_copied_from_prompt(prompt, completion, gold) is expected


@pytest.mark.parametrize("completion, truncated, expected", [
    ("", False, True), ("   \n", False, True), ("85", True, True), ("so \\boxed{8", False, True),
    ("so \\boxed{8}", False, False), ("85", False, False),
])
def test_empty_or_truncated(completion, truncated, expected):
    assert hacks.empty_or_truncated_answer(completion, truncated) is expected


def test_hack_penalties_batch():
    prompts = ["47+38=", "1+1=", "2+2=", "3+3="]
    completions = ["47", "2", "", "\\boxed{6} \\boxed{7}"]
    penalty_b, flags = hacks.hack_penalties(prompts, completions, truncated_b=[False, False, False, False],
                                            golds=["85", "2", "4", "6"])
    np.testing.assert_array_equal(flags["copied_from_prompt"], [True, False, False, False])
    np.testing.assert_array_equal(flags["empty_or_truncated"], [False, False, True, False])
    np.testing.assert_array_equal(flags["conflicting_answers"], [False, False, False, True])
    np.testing.assert_array_equal(penalty_b, [1, 0, 1, 1])
    assert penalty_b.dtype == np.float32
    only, flags = hacks.hack_penalties(prompts, completions, enabled=("empty_or_truncated",))
    np.testing.assert_array_equal(only, [0, 0, 1, 0])
    assert set(flags) == {"empty_or_truncated"}
    with pytest.raises(ValueError, match="Unknown hack detectors"):
        hacks.hack_penalties(prompts, completions, enabled=("nope",))
