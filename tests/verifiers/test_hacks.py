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
    ("", False, True), ("   \n", False, True), ("85", True, False), ("so \\boxed{8", False, True),
    ("so \\boxed{8}", False, False), ("85", False, False), ("so \\boxed{8", True, True),
])
def test_empty_or_truncated(completion, truncated, expected):
    assert hacks.empty_or_truncated_answer(completion, truncated) is expected


def test_truncation_alone_is_not_a_hack_unless_the_hard_rule_is_asked_for():
    # A complete answer that ran into the length limit is the overlong penalty's business.
    prompts, completions = ["1+1=", "2+2="], ["the sum is \\boxed{2}", "so \\boxed{4} and more"]
    penalty_b, flags = hacks.hack_penalties(prompts, completions, truncated_b=[True, False],
                                            enabled=("empty_or_truncated",))
    np.testing.assert_array_equal(penalty_b, [0, 0])
    penalty_b, flags = hacks.hack_penalties(prompts, completions, truncated_b=[True, False],
                                            enabled=("empty_or_truncated",), truncation_is_hack=True)
    np.testing.assert_array_equal(flags["empty_or_truncated"], [True, False])
    assert hacks.empty_or_truncated_answer("85", True, hard_truncation=True) is True


def test_the_hard_truncation_rule_is_a_reward_switch():
    from jaxrl_vr.train.config import PipelineConfig

    rewards = {"hack_coef": 0.5, "hack_detectors": ["empty_or_truncated"], "truncation_is_hack": True}
    assert PipelineConfig.from_dict({"rl": {"rewards": rewards}}).rl.rewards.truncation_is_hack
    with pytest.raises(ValueError, match="add it to hack_detectors"):
        PipelineConfig.from_dict({"rl": {"rewards": {"truncation_is_hack": True}}})


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
