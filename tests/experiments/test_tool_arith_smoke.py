"""tool_arith end to end: multi-turn episodes train, evaluate, dump readable rollouts, and a
run resumed mid-way equals one that ran straight."""

import json
import os
import shutil

import pytest

from experiments.configs import tool_arith
from jaxrl_vr.train.config import PipelineConfig
from jaxrl_vr.train.metrics import read_jsonl
from jaxrl_vr.train.pipeline import run_pipeline


def config(steps):
    tree = tool_arith.get_config("smoke").to_dict()
    tree["rl"]["steps"] = steps
    tree["run"]["export"] = False
    return PipelineConfig.from_dict(tree)


@pytest.mark.slow
def test_tool_arith_runs_dumps_episodes_and_resumes_exactly(tmp_path):
    straight = str(tmp_path / "straight")
    run_pipeline(config(2), straight, log=lambda *_: None)
    rows = read_jsonl(os.path.join(straight, "metrics.jsonl"))
    assert [r["step"] for r in rows] == [1, 2]
    assert all("env/tool_calls_per_episode" in r and "env/turns_per_episode" in r for r in rows)
    with open(os.path.join(straight, "summary.json")) as f:
        summary = json.load(f)
    assert summary["budget"]["generated_tokens"] > 0 and "env_tokens" in summary["budget"]
    for when in ("base", "final"):  # tool use before and after, from the evaluation episodes
        assert 0.0 <= summary[f"{when}_tool_call_valid_rate"] <= 1.0
        assert 1.0 <= summary[f"{when}_turns_per_episode"] <= 2.0

    # The dump: ids after the prompt, a loss mask of the same length, segments that tile the
    # ids with loss mask 1 exactly on the model's segments.
    with open(os.path.join(straight, "rollouts", "step_1.jsonl")) as f:
        episodes = [json.loads(line) for line in f]
    assert len(episodes) == 3
    for ep in episodes:
        assert len(ep["ids"]) == len(ep["loss_mask"]) and ep["prompt_ids"]
        assert ep["segments"][0]["start"] == 0 and ep["segments"][-1]["end"] == len(ep["ids"])
        for seg, nxt in zip(ep["segments"], ep["segments"][1:]):
            assert seg["end"] == nxt["start"]
        for seg in ep["segments"]:
            want = 1 if seg["role"] == "model" else 0
            assert ep["loss_mask"][seg["start"]:seg["end"]] == [want] * (seg["end"] - seg["start"])
        assert set(ep["reward_terms"]) == {"verifier", "overlong", "hack"}
        for call in ep["tool_calls"]:
            assert {"name", "output"} <= set(call)

    resumed = str(tmp_path / "resumed")
    shutil.copytree(os.path.join(straight, "base"), os.path.join(resumed, "base"))  # the same SFT base, not trained again
    run_pipeline(config(1), resumed, log=lambda *_: None)
    run_pipeline(config(2), resumed, log=lambda *_: None)
    again = read_jsonl(os.path.join(resumed, "metrics.jsonl"))
    assert [r["step"] for r in again] == [1, 2]
    for key in ("reward", "loss", "grad_norm", "env/tool_calls_per_episode", "env/tokens", "generated_tokens"):
        assert again[-1][key] == rows[-1][key], key
