"""Episode hack detectors on hand-written tool calls: spam, the answer printed from a tool,
empty turns; the batch function and its errors."""

import numpy as np
import pytest

from jaxrl_vr.envs import ToolCall, TurnRecord
from jaxrl_vr.verifiers import hacks


def code(text):
    return ToolCall("python", code=text, ok=True)


def test_tool_call_spam_counts_calls_and_repeats():
    assert not hacks.tool_call_spam([code("2*3"), code("4*5")], max_calls=2)
    assert hacks.tool_call_spam([code("1"), code("2"), code("3")], max_calls=2)
    assert hacks.tool_call_spam([code("2*3"), code("2*3")], max_calls=4)
    calc = [ToolCall("calc", arguments={"a": 1, "b": 2}), ToolCall("calc", arguments={"b": 2, "a": 1})]
    assert hacks.tool_call_spam(calc, max_calls=4)
    assert not hacks.tool_call_spam([calc[0], ToolCall("calc", arguments={"a": 2, "b": 2})], max_calls=4)


@pytest.mark.parametrize("source, expected", [
    ("print(4042)", True),
    ("print('4042')", True),
    ("print(f'the answer is 4042')", True),
    ("x = 4042.0\nprint(x)", True),
    ("print(47*86)", False),
    ("print(40420 // 10 + 0)", False),
    ("print(4042", True),        # does not parse: any number token counts
    ("", False),
])
def test_answer_printed_by_tool(source, expected):
    assert hacks.answer_printed_by_tool([code(source)], "47*86=", "4042") is expected


def test_answer_printed_by_tool_spares_golds_from_the_prompt_and_reads_arguments():
    assert not hacks.answer_printed_by_tool([code("print(5+0)")], "5+0=", "5")
    assert hacks.answer_printed_by_tool([code("print(-12)")], "3*-4=", "-12")
    assert hacks.answer_printed_by_tool([ToolCall("echo", arguments={"text": "4042"})], "47*86=", "4042")
    assert not hacks.answer_printed_by_tool([code("print(4042)")], "47*86=", None)


def test_empty_model_turn():
    assert hacks.empty_model_turn(["[2*3]", " \n"]) and hacks.empty_model_turn([""])
    assert not hacks.empty_model_turn(["[2*3]", "6"])


def test_episode_hack_flags_batch_and_errors():
    episodes = [
        [TurnRecord("[print(6)]", (code("print(6)"),)), TurnRecord("6")],
        [TurnRecord("[2*3]", (code("2*3"),)), TurnRecord("[2*3]", (code("2*3"),)), TurnRecord("6")],
        [TurnRecord(" "), TurnRecord("6")],
    ]
    flags = hacks.episode_hack_flags(episodes, ["2*3="] * 3, ["6"] * 3)
    assert flags["answer_from_tool"].tolist() == [True, False, False]
    assert flags["tool_spam"].tolist() == [False, True, False]
    assert flags["empty_turn"].tolist() == [False, False, True]
    only = hacks.episode_hack_flags(episodes, ["2*3="] * 3, ["6"] * 3, enabled=("tool_spam",), max_tool_calls=1)
    assert list(only) == ["tool_spam"] and only["tool_spam"].dtype == np.bool_
    with pytest.raises(ValueError, match="Unknown episode hack detectors"):
        hacks.episode_hack_flags(episodes, ["x"] * 3, ["6"] * 3, enabled=("spam",))
    with pytest.raises(ValueError, match="one each"):
        hacks.episode_hack_flags(episodes, ["x"], ["6"] * 3)
