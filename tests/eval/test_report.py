"""summary.json, report.md and the markdown table."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_vr.eval import format_table, passk_report, to_jsonable, write_report, write_report_md, write_summary


def test_to_jsonable():
    out = to_jsonable({"a": np.float32(0.5), "b": np.arange(3), "c": (1, np.nan), "d": jnp.ones(2),
                       1: np.bool_(True), "e": np.inf})
    assert out == {"a": 0.5, "b": [0, 1, 2], "c": [1, None], "d": [1.0, 1.0], "1": True, "e": None}
    with pytest.raises(TypeError, match="summary.json"):
        to_jsonable({"x": object()})


def test_write_summary_round_trip(tmp_path):
    rep = passk_report([1, 0], [2, 1], 4)
    path = write_summary({"passk": rep, "wall_time_s": np.float64(12.5), "steps": 3}, tmp_path / "run")
    loaded = json.loads(path.read_text())
    assert path.name == "summary.json"
    assert loaded["passk"]["pass_at_k"]["base"][0] == pytest.approx(0.125) and loaded["steps"] == 3
    assert not list((tmp_path / "run").glob("*.tmp"))


def test_format_table_numbers():
    rep = passk_report([1, 0], [2, 1], 4)
    table = format_table({"passk": rep})
    lines = table.splitlines()
    assert lines[0].startswith("| prompts | count | lost | pass@1 base")
    # Headline ks for n = 4: 1, 2, 4.
    assert "pass@2" in lines[0] and "pass@4" in lines[0] and "pass@3" not in lines[0]
    # all: pass@1 0.125 -> 0.375 (+0.250), pass@4 0.5 -> 1.0.
    assert lines[2] == ("| all | 2 | 0 | 0.125 → 0.375 (+0.250) | 0.250 → 0.667 (+0.417) "
                        "| 0.500 → 1.000 (+0.500) |")
    assert "| boundary | 0 | 0 | — | — | — |" in lines
    assert len(lines) == 2 + 1 + 4
    assert "pass@3" in format_table(rep, ks=[3])
    with pytest.raises(KeyError, match="no pass@k report"):
        format_table({"x": 1})


def test_write_report_md(tmp_path):
    rep = passk_report([1, 0], [2, 1], 4)
    (tmp_path / "passk.png").write_bytes(b"\x89PNG")
    paths = write_report({"passk": rep, "entropy": 0.42, "run": "smoke"}, tmp_path, title="smoke run")
    text = paths["report"].read_text()
    assert text.startswith("# smoke run")
    assert "| entropy | 0.42 |" in text and "| run | smoke |" in text
    assert "| all | 2 | 0 | 0.125 → 0.375 (+0.250)" in text
    assert "newly solved: 1" in text
    assert "![passk.png](passk.png)" in text
    assert paths["summary"].exists()
    # No pass@k report: metrics only, no table.
    only = write_report_md({"loss": 1.0}, tmp_path / "b", images=[])
    assert "pass@k" not in only.read_text()
