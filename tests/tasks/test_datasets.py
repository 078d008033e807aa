"""JSONL / Parquet adapters, malformed rows, prompt templates, reasoning-gym."""

import json

import pytest

from jaxrl_vr.tasks import TaskItem, load_task_file, make_reasoning_gym_items, render_prompt
from jaxrl_vr.verifiers import VerifierPool, score_serial


def _write_jsonl(path, lines):
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return str(path)


ROWS = [
    {"prompt": "Natalia sold 48 clips...", "answer": "She sold 48/2 = 24 in May.\n#### 72"},  # line 1
    {"prompt": "What is 1/2 + 1/4?", "answer": "\\frac{3}{4}", "id": "m1", "difficulty": 2},  # line 2
    "{not json",                                                                               # line 3
    {"prompt": "", "answer": "1"},                                                             # line 4
    {"prompt": "Write f", "tests": ["assert f() == 1"], "timeout_s": 2},                      # line 5
    {"prompt": "no target"},                                                                   # line 6
    {"prompt": "bad tests", "tests": "assert True"},                                           # line 7
]


def test_jsonl_rows_and_malformed_lines(tmp_path):
    path = _write_jsonl(tmp_path / "mix.jsonl", ROWS)
    loaded = load_task_file(path)
    assert [item.answer for item in loaded.items] == ["72", "\\frac{3}{4}", None]
    assert [item.verifier for item in loaded.items] == ["math", "math", "code"]
    assert loaded.items[1].uid == "m1" and loaded.items[1].difficulty == 2
    assert loaded.items[2].tests == ("assert f() == 1",) and loaded.items[2].meta["timeout_s"] == 2.0
    assert loaded.items[0].uid.startswith("mix:")
    assert [p.split(":")[1] for p in loaded.problems] == ["line 3", "line 4", "line 6", "line 7"]
    assert "invalid JSON" in loaded.problems[0] and "'prompt'" in loaded.problems[1]
    with pytest.raises(ValueError, match=r"line 3: invalid JSON.*on_error='skip'"):
        load_task_file(path, on_error="raise")


def test_splits_are_disjoint(tmp_path):
    path = _write_jsonl(tmp_path / "many.jsonl", [{"prompt": f"q{i}", "answer": str(i)} for i in range(200)])
    train = load_task_file(path, split="train", heldout_fraction=0.3).items
    test = load_task_file(path, split="test", heldout_fraction=0.3).items
    assert len(train) + len(test) == 200 and not {i.prompt for i in train} & {i.prompt for i in test}
    assert 30 < len(test) < 90  # ≈ 60 expected


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table({"prompt": ["2+2?", "", "3*3?"], "answer": ["4", "0", "9"]})
    pq.write_table(table, tmp_path / "rows.parquet")
    loaded = load_task_file(str(tmp_path / "rows.parquet"))
    assert [i.answer for i in loaded.items] == ["4", "9"]
    assert loaded.problems and "row 1" in loaded.problems[0]


def test_missing_file_and_bad_switch(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_task_file(str(tmp_path / "nope.jsonl"))
    with pytest.raises(ValueError, match="on_error"):
        load_task_file(_write_jsonl(tmp_path / "a.jsonl", ROWS[:1]), on_error="ignore")


class _FakeChatTokenizer:
    def apply_chat_template(self, messages, add_generation_prompt=True):
        body = "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)
        return body + ("<assistant>" if add_generation_prompt else "")


def test_render_prompt():
    item = TaskItem(uid="u", prompt="47+38=", answer="85")
    assert render_prompt(item) == "47+38="
    assert render_prompt(item, template="Q: {prompt}\nA:") == "Q: 47+38=\nA:"
    chat = render_prompt(item, _FakeChatTokenizer(), chat=True, system="Be brief.")
    assert chat == "<system>Be brief.</system><user>47+38=</user><assistant>"
    with pytest.raises(ValueError, match="tokenizer"):
        render_prompt(item, chat=True)


def test_reasoning_gym_items_and_own_scoring():
    pytest.importorskip("reasoning_gym")
    items = make_reasoning_gym_items("basic_arithmetic", seed=3, size=4)
    assert items == make_reasoning_gym_items("basic_arithmetic", seed=3, size=4)
    legs = make_reasoning_gym_items("leg_counting", seed=1, size=2)
    batch = items + legs
    completions = [f"thinking... <answer>{batch[0].answer}</answer>", "<answer>not a number</answer>",
                   batch[2].answer, "", f"<answer>{legs[0].answer}</answer>", "<answer>-1</answer>"]
    serial = score_serial(batch, completions)
    assert serial.statuses == ["ok", "wrong", "ok", "unparsable", "ok", "wrong"]
    with VerifierPool(2, timeout_s=5.0) as pool:  # items (with their entries) travel to workers
        assert pool.score(batch, completions).statuses == serial.statuses


def test_reasoning_gym_answer_tag_is_linear_on_hostile_text():
    import time

    from jaxrl_vr.tasks.reasoning_gym import _last_answer_tag

    start = time.perf_counter()
    assert _last_answer_tag("<answer>" * 200_000) is None
    assert _last_answer_tag("<answer>1</answer> <answer>2</answer>") == "2"
    assert _last_answer_tag("<answer>" * 1000 + "3</answer>") == "3"
    assert time.perf_counter() - start < 1.0
