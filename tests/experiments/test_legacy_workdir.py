"""A workdir written before the config sections (flat keys, commit 9f22ea1) still resumes.

``tests/fixtures/workdir_before_redesign`` is a :smoke run of the code before the redesign
with CurveRL (window 4), PBA (λ 0.1, 4 calibration samples), DAPO dynamic sampling with a
re-check interval and an overlong penalty, stopped after 2 of its 3 steps: its config.json
has the old flat keys and its checkpoint holds the estimator window, the tracker, the
re-check schedule and the data order.
"""

import json
import os
import shutil

import pytest

from jaxrl_vr.train.config import MOVED, load_config, upgrade_legacy
from jaxrl_vr.train.pipeline import run_pipeline

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "workdir_before_redesign")


def _old_tree() -> dict:
    with open(os.path.join(FIXTURE, "config.json")) as f:
        return json.load(f)


def test_old_flat_keys_map_to_their_sections():
    cfg = load_config(_old_tree())
    rl = cfg.rl
    assert (rl.estimator.name, rl.estimator.settings.window) == ("curverl", 4)
    assert (rl.anchor.polarity, rl.anchor.weight, rl.anchor.calibration_samples) == ("above", 0.1, 4)
    assert (rl.batch_strategy.name, rl.batch_strategy.settings.max_rounds,
            rl.batch_strategy.settings.recheck_interval) == ("dynamic", 2, 2)
    assert rl.rewards.overlong_cache_len == 2 and rl.pairing is None and rl.verifier.workers == 0
    assert rl.steps == 3 and cfg.model.hidden_size == 32
    # Every old key is translated or dropped, none is carried over as an unknown key.
    assert not set(upgrade_legacy(_old_tree())["rl"]) & {k.split(".", 1)[1] for k in MOVED
                                                          if k not in ("rl.anchor", "rl.pairing")}


def test_upgrade_maps_each_method_and_leaves_a_new_tree_alone():
    tree = {"rl": {"advantage": "pair_weighted", "pair_neg_weight": 2.0, "pair_scope": "pair",
                   "pairing": True, "pairing_neg_c": 3, "two_stage": False, "token_budget": 500,
                   "budget_fractions": [0.5], "hack_coef": 0.5, "hack_detectors": "empty_or_truncated",
                   "anchor": "none", "anchor_weight": 0.0, "verifier_timeout_s": 2.0}}
    rl = load_config(tree).rl
    assert (rl.estimator.settings.neg_weight, rl.estimator.settings.scope) == (2.0, "pair")
    assert rl.pairing.neg_c == 3 and rl.anchor is None and rl.batch_strategy.name == "plain"
    assert (rl.budget.tokens, rl.budget.fractions) == (500, (0.5,))
    assert rl.rewards.hack_detectors == ("empty_or_truncated",) and rl.verifier.timeout_s == 2.0
    two_stage = load_config({"rl": {"two_stage": True, "two_stage_probe": 2, "adaptive_g_max": 9}}).rl
    assert (two_stage.batch_strategy.name, two_stage.batch_strategy.settings.probe,
            two_stage.batch_strategy.settings.adaptive_g_max) == ("two_stage", 2, 9)
    new = load_config({}).to_dict()
    assert upgrade_legacy(new) is new


@pytest.mark.slow
def test_a_workdir_from_before_the_redesign_resumes_and_finishes(tmp_path):
    workdir = tmp_path / "old"
    shutil.copytree(FIXTURE, workdir)
    cached = ("base_eval.json", "base_calibration.json", "base_train_calibration.json")
    stamps = {name: os.stat(workdir / name).st_mtime_ns for name in cached}
    lines = []
    summary = run_pipeline(load_config(_old_tree()), str(workdir), log=lines.append)
    assert summary["rl_steps"] == 3  # steps 1-2 from the old checkpoint, step 3 now
    with open(workdir / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert "dynamic/rounds" in rows[-1] and "anchored_frac" in rows[-1]
    # The cached base evaluation and calibrations were reused (their digests match), not
    # sampled again; the SFT base was loaded, not trained.
    assert {name: os.stat(workdir / name).st_mtime_ns for name in cached} == stamps
    assert summary["budget"]["calibration_tokens"] > 0
    assert any("loaded cached SFT base" in line for line in lines)
