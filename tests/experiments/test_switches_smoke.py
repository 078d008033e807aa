"""Every prompt-distribution switch of docs/methods.md runs end to end at :smoke size.

One SFT base is built once and copied into each switch's workdir (its digest matches), so
each case costs a base evaluation, two RL steps and a final evaluation.
"""

import json
import os
import shutil

import numpy as np
import pytest

from experiments.configs import default as default_config
from jaxrl_vr.train.pipeline import PipelineConfig, run_pipeline

SWITCHES = {
    "curverl": {"rl": {"estimator": "curverl"}},
    "maxrl_overlong": {"rl": {"estimator": "maxrl", "rewards": {"overlong_cache_len": 2}}},
    "dynamic_recheck": {"rl": {"batch_strategy": {"name": "dynamic", "recheck_interval": 2}}},
    "two_stage": {"rl": {"batch_strategy": {"name": "two_stage", "probe": 2}}},
    "adaptive_g": {"rl": {"batch_strategy": {"name": "two_stage", "probe": 2, "adaptive_g_max": 6},
                          "num_minibatches": 1}},
    "pairing_weighted": {"rl": {"pairing": {"calibration_samples": 2},
                                "estimator": {"name": "pair_weighted", "neg_weight": 2.0}}},
    "pba": {"rl": {"anchor": {"weight": 0.1, "calibration_samples": 2}}},
    "kl_entropy_feedback": {"loss": {"kl_beta": 0.05, "entropy": "feedback"}},
    "loo_gspo": {"rl": {"estimator": "loo"}, "loss": {"ratio": "sequence"}},
    "hack_penalty": {"rl": {"rewards": {"hack_coef": 0.5, "hack_detectors": ["empty_or_truncated"]}}},
    "token_budget": {"rl": {"budget": {"tokens": 30}, "steps": 50}},
    "pkpo_annealed": {"rl": {"estimator": {"name": "pkpo", "k": 4, "k_end": 2, "anneal_steps": 1}}},
    "passk_training": {"rl": {"estimator": {"name": "passk_training", "k": 2}}},
}


def _tree(override=None):
    tree = default_config.get_config("smoke").to_dict()
    tree["rl"]["steps"] = 2
    tree["run"].update(tensorboard=False, export=False, print_table=False)
    for section, values in (override or {}).items():
        tree.setdefault(section, {}).update(values)
    return tree


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("base_run")
    tree = _tree()
    tree["rl"]["steps"] = 0
    run_pipeline(PipelineConfig.from_dict(tree), str(workdir), log=lambda line: None)
    return os.path.join(workdir, "base")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SWITCHES))
def test_switch_runs_end_to_end_at_smoke_size(name, base_dir, tmp_path):
    workdir = tmp_path / name
    os.makedirs(workdir)
    shutil.copytree(base_dir, workdir / "base")
    summary = run_pipeline(PipelineConfig.from_dict(_tree(SWITCHES[name])), str(workdir),
                           log=lambda line: None)
    assert 0.0 <= summary["final_pass_at_1"] <= 1.0
    with open(workdir / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert rows and all(np.isfinite(r["loss"]) for r in rows)
    if name == "token_budget":  # stops at the budget, whatever rl.steps says
        assert summary["generated_tokens"] >= 30 and summary["rl_steps"] < 50
        assert summary["rl_steps"] == len(rows)
    if name == "pba":
        assert "anchored_frac" in rows[-1] and "kl_loss" in rows[-1]
    if name == "pairing_weighted":
        assert "pairing/pairs" in rows[-1]
    if name == "dynamic_recheck":
        assert "dynamic/rounds" in rows[-1] and "kept/reward" in rows[-1]
    if name == "curverl":
        assert 0.0 < rows[-1]["estimator/window_fill"] <= 1.0
    if name == "hack_penalty":
        assert "hack/empty_or_truncated" in rows[-1]
    if name == "pkpo_annealed":  # k = 4 at step 0, then k_end = 2
        assert [r["estimator/k"] for r in rows] == [4.0, 2.0]
    if name == "passk_training":
        assert rows[-1]["estimator/k"] == 2.0
