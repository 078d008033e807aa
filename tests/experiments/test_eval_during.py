"""eval.every: evaluations during training in metrics.jsonl, the path plot, and resume;
task.eval_paths: more evaluation sets reported apart; versions and diagnostics of a CLI run."""

import json
import os
import subprocess
import sys

import pytest

from experiments.configs import default as default_config
from jaxrl_vr.train.config import PipelineConfig
from jaxrl_vr.train.metrics import read_jsonl
from jaxrl_vr.train.pipeline import run_pipeline

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config(**rl):
    tree = default_config.get_config("smoke").to_dict()
    tree["rl"].update(steps=2, checkpoint_every=1, **rl)
    tree["eval"].update(every=1, during_samples=4)
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
    assert run_pipeline(cfg, resumed, log=first.append, stop_after=1) == {}
    before = _eval_rows(resumed)
    summary = run_pipeline(cfg, resumed, log=second.append)

    # Step 1 was evaluated before the interruption and is not evaluated again.
    assert [line.split(":")[0] for line in first if line.startswith("[eval] step")] == ["[eval] step 1"]
    assert [line.split(":")[0] for line in second if line.startswith("[eval] step")] == ["[eval] step 2"]
    rows = _eval_rows(resumed)
    assert [r["step"] for r in rows] == [1, 2] and rows[0] == before[0]
    # Same schedule and samples as the uninterrupted run: the key is folded with the step.
    for row, other in zip(rows, _eval_rows(straight)):
        assert {k: v for k, v in row.items() if k.startswith("eval/pass@")} == \
            {k: v for k, v in other.items() if k.startswith("eval/pass@")}
    # The evaluations change no training number: a run without them trains the same steps.
    tree = cfg.to_dict()
    tree["eval"]["every"] = 0
    without = str(tmp_path / "without")
    run_pipeline(PipelineConfig.from_dict(tree), without, log=lambda line: None)
    training = ("reward", "loss", "grad_norm", "kl", "generated_tokens", "budget/generated_tokens")
    assert [{k: r[k] for k in training} for r in read_jsonl(os.path.join(without, "metrics.jsonl"))] == \
        [{k: r[k] for k in training} for r in read_jsonl(os.path.join(straight, "metrics.jsonl"))]
    with open(os.path.join(resumed, "eval_during.json")) as f:
        path = json.load(f)
    assert [p["step"] for p in path["points"]] == [0, 1, 2]
    assert summary["eval_during"]["evaluations"] == 2
    assert summary["eval_during"]["generated_tokens"] == sum(r["eval/generated_tokens"] for r in rows)


def _write_rows(path, pairs):
    with open(path, "w") as f:
        for a, b in pairs:
            f.write(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b), "verifier": "exact"}) + "\n")
    return str(path)


@pytest.mark.slow
def test_cli_run_with_evaluations_during_training_and_two_more_evaluation_sets(tmp_path):
    sets = [_write_rows(tmp_path / "small_sums.jsonl", [(1, 2), (3, 4), (2, 2), (5, 1), (0, 7), (4, 4)]),
            _write_rows(tmp_path / "with_zero.jsonl", [(0, 3), (6, 0), (0, 0), (0, 9), (8, 0)])]
    workdir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.train", "--config=experiments/configs/default.py:smoke",
         f"--workdir={workdir}", "--config.rl.steps=4", "--config.eval.every=2", "--config.eval.during_samples=4",
         f"--config.task.eval_paths={','.join(sets)}", "--config.run.export=False"],
        cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_jsonl(str(workdir / "metrics.jsonl"))
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["step"] for r in rows if "eval/pass@1" in r] == [2, 4]
    for key in ("eval/pass@1", "eval/pass@2", "eval/pass@4", "eval/reachable/pass@1", "eval/reachable/pass@4",
                "eval/generated_tokens"):
        assert key in rows[1] and key not in rows[0], key
    for row in rows:  # the per-step diagnostics
        for key in ("prompt_weights/ess", "prompt_weights/max_over_mean", "one_positive_frac",
                    "prompt_dist/observed/0.25-0.5", "prompt_dist/tracked/1"):
            assert key in row, key
    with open(workdir / "summary.json") as f:
        summary = json.load(f)
    # The evaluations' tokens are reported, not charged to the budget.
    assert summary["budget"]["generated_tokens"] == pytest.approx(sum(r["generated_tokens"] for r in rows))
    assert summary["eval_during"]["generated_tokens"] == sum(r.get("eval/generated_tokens", 0) for r in rows) > 0
    assert (workdir / "eval_during.png").is_file() and (workdir / "eval_during.json").is_file()
    report = (workdir / "report.md").read_text()
    assert "![eval_during.png](eval_during.png)" in report and "Regimes under shifted boundary cutoffs" in report
    # Each evaluation set is evaluated and reported on its own, named by its file stem.
    assert set(summary["eval_sets"]) == {"small_sums", "with_zero"}
    for name, count in (("small_sums", 6), ("with_zero", 5)):
        entry = summary["eval_sets"][name]
        with open(workdir / entry["evaluation"]) as f:
            evaluation = json.load(f)
        assert evaluation["set"] == name and evaluation["num_prompts"] == entry["num_prompts"] == count
        assert evaluation["base"] is not None and "regime_sensitivity" in evaluation
        assert sum(entry["regime_counts"].values()) == count
        assert f"## Evaluation set {name}" in report
        assert (workdir / "eval_sets" / name / "passk.png").is_file()
    assert summary["regime_sensitivity"]["cutoff_scales"]["scales"] == [0.5, 1.0, 2.0]
    # The library versions the numbers depend on.
    with open(workdir / "config.json") as f:
        config_versions = json.load(f)["versions"]
    for versions in (config_versions, summary["versions"]):
        assert versions["jax"] and versions["flax"] and versions["optax"] and versions["python"]
        assert {"math-verify", "sympy", "reasoning-gym", "jaxrl_vr"} <= set(versions)


def test_a_bad_evaluation_set_fails_before_the_workdir_is_touched(tmp_path):
    tree = default_config.get_config("smoke").to_dict()
    workdir = tmp_path / "w"
    repeated = _write_rows(tmp_path / "twice.jsonl", [(1, 2), (1, 2)])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    for paths, match in (([str(tmp_path / "missing.jsonl")], r"task\.eval_paths: .*missing\.jsonl.* is not a file"),
                         ([repeated], r"task\.eval_paths: .*repeats the prompt"),
                         ([str(empty)], r"task\.eval_paths: .*empty\.jsonl.* holds no usable rows")):
        tree["task"]["eval_paths"] = paths
        with pytest.raises(ValueError, match=match):
            run_pipeline(PipelineConfig.from_dict(tree), str(workdir), log=lambda line: None)
        assert not workdir.exists()
    tree["task"]["eval_paths"] = ["a/sums.jsonl", "b/sums.parquet"]
    with pytest.raises(ValueError, match=r"eval_paths has more than one file with the stem \['sums'\]"):
        PipelineConfig.from_dict(tree)
