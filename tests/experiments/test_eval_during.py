"""eval.every: evaluations during training in metrics.jsonl, the path plot, and resume."""

import json
import os

import pytest

from experiments.configs import default as default_config
from jaxrl_vr.train.config import PipelineConfig
from jaxrl_vr.train.metrics import read_jsonl
from jaxrl_vr.train.pipeline import run_pipeline


def _config(**rl):
    tree = default_config.get_config("smoke").to_dict()
    tree["rl"].update(steps=4, checkpoint_every=1, **rl)
    tree["eval"].update(every=2, during_samples=4)
    tree["run"].update(export=False, tensorboard=False, print_table=False)
    return PipelineConfig.from_dict(tree)


def _eval_rows(workdir):
    return [r for r in read_jsonl(os.path.join(workdir, "metrics.jsonl")) if "eval/pass@1" in r]


@pytest.mark.slow
def test_a_resumed_run_keeps_the_evaluation_schedule_and_its_samples(tmp_path):
    cfg = _config()
    straight = str(tmp_path / "straight")
    run_pipeline(cfg, straight, log=lambda line: None)

    resumed, first, second = str(tmp_path / "resumed"), [], []
    assert run_pipeline(cfg, resumed, log=first.append, stop_after=3) == {}
    before = _eval_rows(resumed)
    summary = run_pipeline(cfg, resumed, log=second.append)

    # Step 2 was evaluated before the interruption (after step 3) and is not evaluated again.
    assert [line.split(":")[0] for line in first if line.startswith("[eval] step")] == ["[eval] step 2"]
    assert [line.split(":")[0] for line in second if line.startswith("[eval] step")] == ["[eval] step 4"]
    rows = _eval_rows(resumed)
    assert [r["step"] for r in rows] == [2, 4] and rows[0] == before[0]
    # Same schedule and samples as the uninterrupted run: the key is folded with the step.
    for row, other in zip(rows, _eval_rows(straight)):
        assert {k: v for k, v in row.items() if k.startswith("eval/pass@")} == \
            {k: v for k, v in other.items() if k.startswith("eval/pass@")}
    with open(os.path.join(resumed, "eval_during.json")) as f:
        path = json.load(f)
    assert [p["step"] for p in path["points"]] == [0, 2, 4]
    assert summary["eval_during"]["evaluations"] == 2
    assert summary["eval_during"]["generated_tokens"] == sum(r["eval/generated_tokens"] for r in rows)
