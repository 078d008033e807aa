"""Plots write non-empty PNG files; JSON-lines reading is robust."""

import json

import pytest

from jaxrl_vr.eval import (
    passk_report,
    plot_passk,
    plot_regimes,
    plot_training_curves,
    read_metrics_jsonl,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _is_png(path):
    data = path.read_bytes()
    return len(data) > 1000 and data[:8] == PNG_MAGIC


def _write_metrics(path, torn_tail=False):
    lines = [json.dumps({"step": s, "train/reward": 0.1 * s, "pass_rate": 0.05 * s, "note": "x"})
             for s in range(5)]
    lines.insert(2, "")
    text = "\n".join(lines) + "\n"
    if torn_tail:
        text += '{"step": 5, "train/rew'
    path.write_text(text)


def test_plot_passk_and_regimes(tmp_path):
    rep = passk_report([1, 0, 3], [2, 1, 4], 4)
    out = plot_passk(rep["pass_at_k"]["base"], rep["pass_at_k"]["final"], rep["ks"], tmp_path / "a" / "passk.png")
    assert _is_png(out)
    assert _is_png(plot_regimes(rep, tmp_path / "regimes.png"))
    with pytest.raises(ValueError, match="shape"):
        plot_passk([0.1, 0.2], [0.1], [1, 2], tmp_path / "bad.png")


def test_read_metrics_jsonl(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _write_metrics(path, torn_tail=True)
    records = read_metrics_jsonl(path)
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]
    path.write_text('{"step": 0}\nnot json\n{"step": 1}\n')
    with pytest.raises(ValueError, match=":2 is not valid JSON"):
        read_metrics_jsonl(path)
    with pytest.raises(FileNotFoundError, match="workdir"):
        read_metrics_jsonl(tmp_path / "missing.jsonl")


def test_plot_training_curves(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _write_metrics(path)
    # "reward" resolves to "train/reward"; unknown keys are skipped.
    assert _is_png(plot_training_curves(path, tmp_path / "curves.png", keys=("reward", "pass_rate", "kl")))
    assert _is_png(plot_training_curves(path, tmp_path / "all.png"))  # default keys
    with pytest.raises(ValueError, match="available"):
        plot_training_curves(path, tmp_path / "none.png", keys=("kl",))
