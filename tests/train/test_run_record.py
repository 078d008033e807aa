"""config.json records the library versions without making them part of the config."""

import json
import os

from jaxrl_vr.train.config import PipelineConfig, load_config
from jaxrl_vr.train.workdir import prepare_workdir
from jaxrl_vr.versions import DISTRIBUTIONS, versions


def test_versions_name_python_the_jax_stack_and_the_verifier_libraries():
    found = versions()
    assert set(found) == {"python", "jaxrl_vr_git", *DISTRIBUTIONS}
    for name in ("python", "jaxrl_vr", "jax", "flax", "optax", "math-verify", "sympy"):
        assert isinstance(found[name], str) and found[name][0].isdigit(), (name, found[name])
    assert {"math-verify", "sympy", "reasoning-gym"} <= set(found)


def test_config_json_holds_the_versions_and_a_resume_with_other_versions_is_not_a_config_change(tmp_path):
    tree = PipelineConfig().to_dict()
    workdir = str(tmp_path / "run")
    prepare_workdir(workdir, tree, record={"versions": {"jax": "0.0.1"}})
    os.makedirs(os.path.join(workdir, "checkpoints", "1"))  # a step is done: config changes are refused
    assert prepare_workdir(workdir, tree, record={"versions": {"jax": "9.9"}}).replaced == ""
    with open(os.path.join(workdir, "config.json")) as f:
        stored = json.load(f)
    assert stored["versions"] == {"jax": "9.9"}  # the process that resumed it
    assert load_config(stored) == PipelineConfig()
