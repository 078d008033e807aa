"""`python -m experiments.train` user errors: one `error:` line, exit status 2, nothing created."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOKE = "--config=experiments/configs/default.py:smoke"

_TYPO_CONFIG = '''
from experiments.configs import default


def get_config(arg=None):
    config = default.get_config("smoke")
    config.rl.estimatr = "loo"
    return config
'''


def _run(*args: str, module: str = "experiments.train") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def _error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    return lines[0]


def test_missing_config_file_names_the_path(tmp_path):
    line = _error_line(_run("--config=experiments/configs/nope.py:smoke", f"--workdir={tmp_path / 'w'}"))
    assert "experiments/configs/nope.py" in line and "does not exist" in line
    assert "config_config" not in line
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("under", ["file/x", "file"])
def test_workdir_that_cannot_be_a_directory(tmp_path, under):
    (tmp_path / "file").write_text("not a directory")
    workdir = tmp_path / under
    line = _error_line(_run(SMOKE, f"--workdir={workdir}"))
    assert str(workdir) in line and "is a file" in line


def test_mistyped_override_key_says_did_you_mean(tmp_path):
    line = _error_line(_run(SMOKE, f"--workdir={tmp_path / 'w'}", "--config.rl.estimatr.name=loo"))
    assert "'rl.estimatr'" in line and "did you mean 'rl.estimator'?" in line
    assert not (tmp_path / "w").exists()


def test_mistyped_key_in_a_config_file_says_did_you_mean(tmp_path):
    config = tmp_path / "typo.py"
    config.write_text(_TYPO_CONFIG)
    line = _error_line(_run(f"--config={config}", f"--workdir={tmp_path / 'w'}"))
    assert "rl.estimatr" in line and "did you mean 'rl.estimator'" in line
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("old, new", [
    ("rl.advantage=loo", "rl.estimator.name"),
    ("rl.dynamic_sampling=True", "rl.batch_strategy=dynamic"),
    ("rl.anchor=above", "rl.anchor.polarity=above"),
    ("rl.pairing_neg_c=3", "rl.pairing.neg_c"),
    ("rl.token_budget=100", "rl.budget.tokens"),
])
def test_every_old_flat_key_names_its_new_home(tmp_path, old, new):
    line = _error_line(_run(SMOKE, f"--workdir={tmp_path / 'w'}", f"--config.{old}"))
    assert old.split("=")[0] in line and new in line
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("args, expected", [
    ((SMOKE, "--workdri=/tmp/w"), "workdir"),  # absl's own suggestion, without the usage dump
    ((SMOKE,), "--workdir is required"),
    ((SMOKE, "--workdir=/tmp/w", "--config.rl.steps=abc"), "rl.steps must be an integer, got 'abc'"),
    ((SMOKE, "--workdir=/tmp/w", "--config.rl.estimator.window=3"), "'grpo' has no setting 'window'"),
    ((SMOKE, "--workdir=/tmp/w", "--config.rl.estimator=grpoo"), "did you mean 'grpo'"),
    ((SMOKE, "--workdir=/tmp/w", "--config.rl"), "needs a value"),
])
def test_other_flag_mistakes(args, expected):
    assert expected in _error_line(_run(*args))


def test_overrides_parse_by_type_choose_entries_first_and_switch_sections():
    from experiments.config_files import apply_overrides
    from jaxrl_vr.train.config import PipelineConfig

    tree = apply_overrides({}, [("rl.estimator.window", "4"), ("rl.estimator", "curverl"),
                                ("rl.anchor.weight", "0.2"), ("rl.budget.fractions", "0.5,0.25"), ("rl.budget.tokens", "1e3"),
                                ("rl.rewards.hack_detectors", "empty_or_truncated"),
                                ("model.system_prompt", "None"), ("rl.pairing", "on")])
    cfg = PipelineConfig.from_dict(tree)
    assert (cfg.rl.estimator.name, cfg.rl.estimator.settings.window) == ("curverl", 4)
    assert cfg.rl.anchor.weight == 0.2 and cfg.rl.anchor.polarity == "above"
    assert cfg.rl.budget.fractions == (0.25, 0.5) and cfg.model.system_prompt is None
    assert cfg.rl.rewards.hack_detectors == ("empty_or_truncated",) and cfg.rl.pairing is not None
    off = PipelineConfig.from_dict(apply_overrides(tree, [("rl.anchor", "None"), ("rl.estimator", "loo")]))
    assert off.rl.anchor is None and off.rl.estimator.name == "loo"  # curverl's window dropped


def test_every_old_flat_key_fails_naming_a_key_that_exists_now():
    """Each key of the flat layout, set as an override, names its new home, and that home
    is a key of today's config (or a choice of one)."""
    import re

    from experiments.config_files import apply_overrides
    from jaxrl_vr.config_tree import ConfigError, dotted_keys
    from jaxrl_vr.train.config import MOVED, PipelineConfig

    keys = set(dotted_keys(PipelineConfig)) | {"rl.estimator.window", "rl.estimator.neg_weight",
                                               "rl.estimator.scope", "rl.batch_strategy.max_rounds",
                                               "rl.batch_strategy.recheck_interval", "rl.batch_strategy.probe",
                                               "rl.batch_strategy.lo", "rl.batch_strategy.hi",
                                               "rl.batch_strategy.adaptive_g_max"}
    for old in MOVED:
        if old == "rl.pairing":  # rl.pairing=True still switches pairing on, with its defaults
            assert PipelineConfig.from_dict(apply_overrides({}, [(old, "True")])).rl.pairing is not None
            continue
        with pytest.raises(ConfigError, match=re.escape(f"config key '{old}'")) as err:
            apply_overrides({}, [(old, "above" if old == "rl.anchor" else "1")])
        named = re.findall(r"rl\.[a-z_.]+", str(err.value).split("moved:" if "moved:" in str(err.value) else "(", 1)[1])
        assert named and all(k.rstrip(".") in keys for k in named), (old, str(err.value))


@pytest.mark.parametrize("module", ["experiments.train", "experiments.evaluate", "experiments.compare"])
def test_a_cli_starts_without_the_libraries_only_some_runs_use(module):
    """reasoning-gym (with sympy), scipy and matplotlib take seconds to import together; a
    CLI imports them where a run uses them, so a config error or --help does not wait for them."""
    code = (f"import sys, {module}; "
            "print(sorted(m for m in ('reasoning_gym', 'sympy', 'scipy', 'matplotlib') if m in sys.modules))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]", proc.stdout
