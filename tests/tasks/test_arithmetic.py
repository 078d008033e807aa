"""Built-in arithmetic task: determinism, levels, splits, alphabet, answers."""

import pytest

from jaxrl_vr.tasks import arithmetic
from jaxrl_vr.tasks.base import TaskItem, in_split


def _evaluate(prompt: str) -> int:
    expression = prompt.rstrip("=")
    if "*" in expression:
        a, b = expression.split("*")
        return int(a) * int(b)
    return sum(int(term) for term in expression.split("+"))


def test_deterministic_from_seed_and_seed_sensitive():
    first = arithmetic.make_items(7, 30)
    again = arithmetic.make_items(7, 30)
    other = arithmetic.make_items(8, 30)
    assert first == again
    assert [i.prompt for i in first] != [i.prompt for i in other]


def test_answers_are_correct_and_alphabet_covers_everything():
    items = arithmetic.make_items(0, 200)
    for item in items:
        assert isinstance(item, TaskItem) and item.verifier == "exact"
        assert item.answer == str(_evaluate(item.prompt))
        assert item.uid == f"arith:{item.prompt}"
        assert set(item.prompt + item.answer) <= set(arithmetic.ARITHMETIC_ALPHABET)
        assert len(item.prompt) <= 20
    assert len({i.prompt for i in items}) == len(items)  # unique=True


def test_levels_shape_and_balance():
    items = arithmetic.make_items(1, 50)
    assert sorted({i.difficulty for i in items}) == [0, 1, 2, 3, 4]
    assert all(sum(i.difficulty == level for i in items) == 10 for level in range(5))  # 50 / 5 round-robin
    for item in items:
        terms = item.prompt.rstrip("=").replace("*", "+").split("+")
        digits = [len(t) for t in terms]
        if item.difficulty == 0:
            assert digits == [1, 1]
        elif item.difficulty == 1:
            assert digits == [2, 1]
        elif item.difficulty == 2:
            a, b = (int(t) for t in terms)
            assert digits == [2, 2] and a % 10 + b % 10 >= 10  # a units carry, e.g. 47+38: 7+8=15
        elif item.difficulty == 3:
            assert digits == [3, 3]
        else:
            assert digits in ([2, 1], [2, 2, 2]) and (("*" in item.prompt) == (len(digits) == 2))


def test_train_and_test_splits_are_disjoint():
    train = {i.prompt for i in arithmetic.make_items(0, 300, split="train")}
    test = {i.prompt for i in arithmetic.make_items(0, 50, split="test")}
    assert not train & test
    assert all(in_split(p, "test", heldout_fraction=0.2) for p in test)
    # Level 0 has exactly 100 problems; the two splits partition them.
    level0_train = {i.prompt for i in arithmetic.make_items(0, 60, levels=(0,), split="train", unique=False)}
    assert all(not in_split(p, "test", heldout_fraction=0.2) for p in level0_train)


def test_too_many_unique_items_raises_a_clear_error():
    with pytest.raises(ValueError, match="too few problems"):
        arithmetic.make_items(0, 101, levels=(0,), split=None)  # only 10·10 = 100 distinct "a+b="
    with pytest.raises(ValueError, match="levels"):
        arithmetic.make_items(0, 5, levels=(9,))


def test_sft_examples_match_items_format():
    examples = arithmetic.make_sft_examples(3, 40, levels=(0, 1))
    assert len(examples) == 40
    for prompt, target in examples:
        assert prompt.endswith("=") and target == str(_evaluate(prompt))
    assert examples == arithmetic.make_sft_examples(3, 40, levels=(0, 1))
