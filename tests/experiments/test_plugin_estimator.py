"""A new estimator with a setting is one function, its settings dataclass and one registry
line, registered from outside the package and chosen from the command line."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PLUGIN = '''
import dataclasses

import jax.numpy as jnp

from jaxrl_vr.estimators import ESTIMATORS, Entry, stateless


@dataclasses.dataclass(frozen=True)
class ConstantSettings:
    value: float = 1.0


def constant(settings, context):
    """Every valid sample gets the advantage ``value`` (easy to see in the metrics)."""
    return stateless(lambda rewards_pg, valid_pg, success_pg: jnp.full(rewards_pg.shape, settings.value))


ESTIMATORS["constant"] = Entry(constant, ConstantSettings)
'''

CONFIG = '''
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import my_estimators  # noqa: E402,F401  (registers "constant")

from experiments.configs import default  # noqa: E402


def get_config(variant=None):
    return default.get_config("smoke")
'''


@pytest.mark.slow
def test_an_estimator_registered_outside_the_package_runs_from_the_cli(tmp_path):
    (tmp_path / "my_estimators.py").write_text(PLUGIN)
    (tmp_path / "my_config.py").write_text(CONFIG)
    workdir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.train", f"--config={tmp_path / 'my_config.py'}",
         f"--workdir={workdir}", "--config.rl.estimator.name=constant",
         "--config.rl.estimator.value=2.5", "--config.rl.steps=1", "--config.run.export=False",
         "--config.run.tensorboard=False"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(workdir / "config.json") as f:
        assert json.load(f)["rl"]["estimator"] == {"name": "constant", "value": 2.5}
    with open(workdir / "metrics.jsonl") as f:
        row = json.loads(f.readline())
    assert row["adv_mean"] == pytest.approx(2.5) and row["adv_std"] == pytest.approx(0.0, abs=1e-6)
    # A setting the estimator does not have is named with the ones it has.
    bad = subprocess.run(
        [sys.executable, "-m", "experiments.train", f"--config={tmp_path / 'my_config.py'}",
         f"--workdir={tmp_path / 'bad'}", "--config.rl.estimator.name=constant",
         "--config.rl.estimator.valu=2.5"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "did you mean 'value'" in bad.stderr and "its settings: value" in bad.stderr
