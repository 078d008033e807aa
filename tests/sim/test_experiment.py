"""experiments.simulate + configs/sim.py + the colab notebook, end to end at smoke size."""

import json
import os
import subprocess
import sys

import pytest

from experiments.configs import sim as sim_config
from jaxrl_vr.sim import SimConfig

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REQUIRED_NAMES = ("num_prompts", "steps", "num_seeds", "group_size", "methods")


def test_config_fields_are_exactly_the_sim_config_fields():
    import dataclasses

    for variant in ("", "smoke"):
        tree = sim_config.get_config(variant).to_dict()
        assert set(tree) == {"sim"}
        assert set(tree["sim"]) == {f.name for f in dataclasses.fields(SimConfig)}
        cfg = SimConfig.from_dict(tree["sim"])
        for name in REQUIRED_NAMES:
            assert hasattr(cfg, name)
    assert SimConfig.from_dict(sim_config.get_config("").to_dict()["sim"]) == SimConfig()
    with pytest.raises(KeyError, match="sim.stepz"):
        SimConfig.from_dict({"stepz": 3})
    with pytest.raises(ValueError, match="smok"):
        sim_config.get_config("smok")


def test_cli_bad_override_fails_before_touching_the_workdir(tmp_path):
    workdir = tmp_path / "w"
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.simulate",
         "--config=experiments/configs/sim.py:smoke", f"--workdir={workdir}",
         "--config.sim.methods=grpo,grpoo"],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "grpoo" in proc.stderr
    assert not workdir.exists()


def test_notebook_runs_at_smoke_size(tmp_path, monkeypatch):
    """Executes the notebook's code cells in order (nbclient is not a dependency)."""
    with open(os.path.join(REPO, "colab", "rlvr_simulator.ipynb")) as f:
        notebook = json.load(f)
    monkeypatch.setenv("RLVR_SIM_SMOKE", "1")
    monkeypatch.setenv("RLVR_SIM_WORKDIR", str(tmp_path / "nb"))
    monkeypatch.chdir(REPO)
    namespace = {"__name__": "__main__"}
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), "<notebook>", "exec"), namespace)  # noqa: S102
    assert set(namespace["summary"]["methods"]) == {"grpo", "pba", "curverl", "maxrl", "pairing"}
    _check_simulation_json(tmp_path / "nb", namespace["cfg"])


def _check_simulation_json(workdir, cfg):
    """The smoke run's simulation.json has the keys the acceptance check reads."""
    doc = json.loads((workdir / "simulation.json").read_text())
    assert doc["ks"] == list(range(1, 257))
    for name in REQUIRED_NAMES:
        assert doc["config"][name] == getattr(cfg, name)
    for res in doc["methods"].values():
        for regime in ("out_of_reach", "boundary", "reachable", "solved_easy", "overall"):
            curve = res["final_pass_at_k"][regime]
            assert len(curve) == 256
            if curve[0] is not None:
                assert all(0.0 <= v <= 1.0 for v in curve)
                assert all(a <= b + 1e-7 for a, b in zip(curve, curve[1:]))  # monotone in k
        assert len(res["final"]["lost"]["overall"]["per_seed"]) == cfg.num_seeds
        assert len(res["trajectories"]["p"]) == cfg.num_tracked
    for name in ("delta_passk_by_regime.png", "lost_prompts.png", "pbase_vs_pfinal.png",
                 "delta_passk_final.png"):
        assert (workdir / name).stat().st_size > 1000
