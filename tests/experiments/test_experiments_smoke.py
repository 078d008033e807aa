"""experiments.train: config errors fail fast; the smoke pipeline writes every artefact."""

import json
import os
import subprocess
import sys

import pytest

from experiments.configs import default as default_config
from jaxrl_vr.config_tree import ConfigError
from jaxrl_vr.train.config import PipelineConfig
from jaxrl_vr.train.pipeline import run_pipeline
from jaxrl_vr.train.workdir import WorkdirError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_config_field_maps_to_the_pipeline_config():
    for variant in ("", "smoke"):
        cfg = PipelineConfig.from_dict(default_config.get_config(variant).to_dict())
        assert cfg.rl.steps >= 1
    assert PipelineConfig.from_dict(default_config.get_config("smoke").to_dict()).rl.steps <= 5


def test_unknown_key_in_dict_names_the_dotted_key():
    tree = default_config.get_config("smoke").to_dict()
    tree["rl"]["stepz"] = 3
    with pytest.raises(ConfigError, match=r"rl\.stepz.*did you mean 'rl\.steps'"):
        PipelineConfig.from_dict(tree)


def test_unknown_variant_is_rejected():
    with pytest.raises(ValueError, match="smok"):
        default_config.get_config("smok")


def test_cli_unknown_override_fails_at_once_naming_the_key(tmp_path):
    workdir = tmp_path / "w"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.train",
            "--config=experiments/configs/default.py:smoke",
            f"--workdir={workdir}",
            "--config.rl.stepz=3",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "stepz" in proc.stderr
    assert not workdir.exists()  # failed before any work


@pytest.mark.slow
def test_smoke_run_writes_summary_metrics_plots_and_resumes(tmp_path):
    cfg = PipelineConfig.from_dict(default_config.get_config("smoke").to_dict())
    workdir = str(tmp_path / "run")
    lines = []
    summary = run_pipeline(cfg, workdir, log=lines.append)
    for name in (
        "summary.json",
        "metrics.jsonl",
        "report.md",
        "passk.png",
        "reward_curve.png",
        "config.json",
        "base_eval.json",
        "base_calibration.json",
    ):
        assert os.path.isfile(os.path.join(workdir, name)), name
    assert os.path.isdir(os.path.join(workdir, "tb")) and os.listdir(os.path.join(workdir, "tb"))
    with open(os.path.join(workdir, "summary.json")) as f:
        stored = json.load(f)
    n = cfg.eval.num_samples
    assert len(stored["passk"]["pass_at_k"]["base"]) == n == len(stored["passk"]["ks"])
    assert set(stored["regime_counts"]) == {"out_of_reach", "boundary", "reachable", "solved_easy"}
    assert sum(stored["regime_counts"].values()) == cfg.task.num_eval
    # Regimes come from the independent calibration samples, not the base pass@k ones.
    assert stored["passk"]["regime_n"] == cfg.eval.base_calibration_samples != n
    assert stored["budget"]["generated_tokens"] > 0 and stored["wall_time_s"]["total"] > 0
    assert 0.0 <= summary["final_pass_at_1"] <= 1.0
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert [r["step"] for r in rows] == list(range(1, cfg.rl.steps + 1))
    assert any("pass@1" in line for line in lines)  # the printed table
    # The smoke config learns something: at least one step has a non-zero gradient.
    assert max(r["grad_norm"] for r in rows) > 0
    # The policy is exported as a transformers-loadable directory.
    export = os.path.join(workdir, "export")
    assert stored["export_dir"] == export
    from transformers import AutoConfig, AutoTokenizer

    assert AutoConfig.from_pretrained(export).model_type == "llama"
    tok = AutoTokenizer.from_pretrained(export)
    assert tok.decode(tok("12+3=").input_ids) == "12+3="
    # Re-running a finished workdir says so and keeps its summary as it was.
    again = run_pipeline(cfg, workdir, log=lines.append)
    assert "finished run" in lines[-1] and again["final_pass_at_1"] == stored["final_pass_at_1"]
    with open(os.path.join(workdir, "summary.json")) as f:
        assert json.load(f) == stored

    # A changed algorithm key on the same workdir is a clear error naming the key.
    tree = default_config.get_config("smoke").to_dict()
    tree["rl"]["estimator"] = "loo"
    with pytest.raises(WorkdirError, match=r"rl\.estimator\.name"):
        run_pipeline(PipelineConfig.from_dict(tree), workdir, log=lines.append)
    # A workdir that is a file is a clear error too.
    bad = tmp_path / "file"
    bad.write_text("x")
    with pytest.raises(WorkdirError, match="not a directory"):
        run_pipeline(cfg, str(bad), log=lines.append)


def test_quickstart_notebook_is_valid_nbformat_and_uses_public_api():
    with open(os.path.join(REPO, "colab", "quickstart.ipynb")) as f:
        nb = json.load(f)
    assert nb["nbformat"] == 4 and nb["cells"]
    sources = []
    for cell in nb["cells"]:
        assert cell["cell_type"] in ("markdown", "code") and isinstance(cell["source"], list)
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and "execution_count" in cell
            source = "".join(cell["source"])
            compile(source, "<cell>", "exec")  # syntax check of every code cell
            sources.append(source)
    code = "\n".join(sources)
    assert "get_config(\"smoke\")" in code and "run_pipeline" in code
    assert "._" not in code  # no private attributes


def test_bad_config_is_rejected_before_the_workdir_is_touched(tmp_path):
    tree = default_config.get_config("smoke").to_dict()
    tree["task"]["levels"] = (0, 9)
    workdir = tmp_path / "w"
    with pytest.raises(ValueError, match=r"task\.levels=\[0, 9\]"):
        run_pipeline(PipelineConfig.from_dict(tree), str(workdir), log=lambda line: None)
    assert not workdir.exists()


@pytest.mark.parametrize("override,match", [
    ({"rl": {"samples_per_prompt": 1}}, "every advantage is 0"),
    ({"rl": {"anchor": {"weight": 0.0}}}, r"rl\.anchor\.weight .*> 0"),
    ({"rl": {"estimator": "pair_weighted"}}, "rl.pairing"),
    ({"rl": {"pairing": {}, "batch_strategy": "dynamic"}}, "batch_strategy=plain"),
    ({"rl": {"batch_strategy": {"name": "two_stage", "probe": 5}}}, "probe=5"),
    ({"model": {"source": "hf"}}, r"model\.source='hf' needs path"),
    ({"task": {"name": "reasoning_gym"}}, "real model"),
    ({"loss": {"entropy": "bonus"}}, "entropy_coef"),
    ({"model": {"dtype": "bfloat16"}}, "compute_dtype"),
    ({"model": {"system_prompt": "Be brief."}}, "chat=True"),
    ({"optim": {"learning_rate": -1e-4}}, r"optim\.learning_rate must be > 0"),
])
def test_configs_that_cannot_learn_or_do_nothing_are_errors(override, match):
    from jaxrl_vr.train.config import validate

    tree = default_config.get_config("smoke").to_dict()
    for section, values in override.items():
        tree.setdefault(section, {}).update(values)
    with pytest.raises(ValueError, match=match):
        validate(PipelineConfig.from_dict(tree))


def test_steps_zero_evaluates_the_base_only(tmp_path):
    tree = default_config.get_config("smoke").to_dict()
    tree["rl"]["steps"] = 0
    summary = run_pipeline(PipelineConfig.from_dict(tree), str(tmp_path / "w"),
                           log=lambda line: None)
    assert summary["rl_steps"] == 0 and summary["final_pass_at_1"] == summary["base_pass_at_1"]
    assert not (tmp_path / "w" / "checkpoints").exists()
