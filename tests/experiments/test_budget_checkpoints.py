"""rl.budget.fractions: kept checkpoints where the generated-token budget crosses each fraction."""

import json
import os

import jax
import numpy as np
import pytest

from experiments.configs import default as default_config
from jaxrl_vr.train import run_io
from jaxrl_vr.train.config import PipelineConfig, validate
from jaxrl_vr.train.pipeline import run_pipeline


def _tree(budget=None, **rl):
    tree = default_config.get_config("smoke").to_dict()
    tree["run"].update(tensorboard=False, export=False, print_table=False)
    tree["rl"].update(steps=100, checkpoint_every=0, max_to_keep=1, **rl)
    if budget is not None:
        tree["rl"]["budget"] = budget
    return tree


def test_fractions_need_a_budget_and_lie_inside_it():
    with pytest.raises(ValueError, match=r"rl\.budget\.fractions=\[0\.5\].*set tokens > 0"):
        validate(PipelineConfig.from_dict(_tree({"fractions": (0.5,)})))
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        validate(PipelineConfig.from_dict(_tree({"tokens": 100, "fractions": (0.5, 1.0)})))
    cfg = PipelineConfig.from_dict(_tree({"tokens": 100, "fractions": [0.75, 0.25]}))
    assert cfg.rl.budget.fractions == (0.25, 0.75)  # sorted tuple, also from JSON lists


@pytest.mark.slow
def test_budget_fraction_checkpoints_are_first_crossings_and_loadable(tmp_path):
    budget = 400
    workdir = str(tmp_path / "run")
    cfg = PipelineConfig.from_dict(_tree({"tokens": budget, "fractions": (0.25, 0.5)}))
    summary = run_pipeline(cfg, workdir, log=lambda line: None)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        tokens = {row["step"]: row["budget/generated_tokens"] for row in map(json.loads, f)}
    marks = run_io.budget_marks(workdir)
    assert [m["fraction"] for m in marks] == [0.25, 0.5]
    for mark in marks:
        step = mark["step"]
        assert tokens[step] == mark["generated_tokens"] >= mark["fraction"] * budget
        assert tokens.get(step - 1, 0.0) < mark["fraction"] * budget  # the first crossing
    final_step = summary["rl_steps"]
    assert marks[-1]["step"] < final_step
    # max_to_keep=1 rotated the regular checkpoints away; the budget ones stay.
    steps = run_io.checkpoint_steps(workdir)
    assert {m["step"] for m in marks} <= set(steps) and steps[-1] == final_step
    early = run_io.load_run(workdir, marks[0]["step"])
    final = run_io.load_run(workdir, "final")
    assert early.step == marks[0]["step"] and final.step == final_step
    from flax import nnx
    diffs = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b)))),
                         nnx.state(early.model, nnx.Param), nnx.state(final.model, nnx.Param))
    assert max(jax.tree.leaves(diffs)) > 0.0


def test_workdir_of_an_older_version_resumes_unless_a_new_key_changes(tmp_path):
    """A key missing from the stored config.json (added later) matches its default."""
    from jaxrl_vr.train.workdir import WorkdirError, prepare_workdir

    defaults = PipelineConfig().to_dict()
    old = PipelineConfig.from_dict(_tree()).to_dict()
    del old["rl"]["budget"]["include_calibration"]  # as written before the key existed
    prepare_workdir(str(tmp_path), old)
    (tmp_path / "checkpoints" / "1").mkdir(parents=True)  # a step done: the config is binding
    prepare_workdir(str(tmp_path), PipelineConfig.from_dict(_tree()).to_dict(), defaults=defaults)
    with open(tmp_path / "config.json", "w") as f:
        json.dump(old, f)
    with pytest.raises(WorkdirError, match=r"rl\.budget\.include_calibration"):
        prepare_workdir(str(tmp_path), PipelineConfig.from_dict(
            _tree({"include_calibration": True})).to_dict(), defaults=defaults)


@pytest.mark.slow
def test_calibration_tokens_are_recorded_and_charged_when_asked(tmp_path):
    """PBA's base calibration of the training prompts happens before RL: its tokens are in
    budget.calibration_tokens, and with rl.budget.include_calibration they count against
    rl.budget.tokens (fewer RL tokens)."""
    pba = {"anchor": {"weight": 0.1, "calibration_samples": 2}}
    free = run_pipeline(PipelineConfig.from_dict(_tree({"tokens": 300}, **pba)),
                        str(tmp_path / "free"), log=lambda line: None)
    calibration = free["calibration_tokens"]
    assert calibration > 0 and free["budget"]["calibration_tokens"] == calibration
    assert free["generated_tokens"] >= 300
    budget = int(calibration) + 300
    charged = run_pipeline(PipelineConfig.from_dict(_tree({"tokens": budget, "include_calibration": True},
                                                          **pba)),
                           str(tmp_path / "charged"), log=lambda line: None)
    assert charged["calibration_tokens"] == calibration
    assert charged["generated_tokens"] + calibration >= budget
    assert charged["generated_tokens"] < budget - calibration + 100  # stopped within a step
    stats = run_io.read_run_stats(str(tmp_path / "charged"))
    assert stats.calibration_tokens == calibration
    # Finished means finished: a rerun does not train again.
    again = run_pipeline(PipelineConfig.from_dict(_tree({"tokens": budget, "include_calibration": True},
                                                        **pba)),
                         str(tmp_path / "charged"), log=lambda line: None)
    assert again["rl_steps"] == charged["rl_steps"]
