"""rl.budget_fractions: kept checkpoints where the generated-token budget crosses each fraction."""

import json
import os

import jax
import numpy as np
import pytest

from experiments.configs import default as default_config
from jaxrl_vr.train import run_io
from jaxrl_vr.train.config import PipelineConfig, validate
from jaxrl_vr.train.pipeline import run_pipeline


def _tree(**rl):
    tree = default_config.get_config("smoke").to_dict()
    tree["run"].update(tensorboard=False, export=False, print_table=False)
    tree["rl"].update(steps=100, checkpoint_every=0, max_to_keep=1, **rl)
    return tree


def test_fractions_need_a_budget_and_lie_inside_it():
    with pytest.raises(ValueError, match="rl.token_budget > 0"):
        validate(PipelineConfig.from_dict(_tree(budget_fractions=(0.5,))))
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        validate(PipelineConfig.from_dict(_tree(token_budget=100, budget_fractions=(0.5, 1.0))))
    cfg = PipelineConfig.from_dict(_tree(token_budget=100, budget_fractions=[0.75, 0.25]))
    assert cfg.rl.budget_fractions == (0.25, 0.75)  # sorted tuple, also from JSON lists


@pytest.mark.slow
def test_budget_fraction_checkpoints_are_first_crossings_and_loadable(tmp_path):
    budget = 400
    workdir = str(tmp_path / "run")
    cfg = PipelineConfig.from_dict(_tree(token_budget=budget, budget_fractions=(0.25, 0.5)))
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
