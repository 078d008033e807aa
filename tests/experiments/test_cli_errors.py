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
    config.unlock()
    config.rl.advantag = "loo"
    return config
'''


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-m", "experiments.train", *args], cwd=REPO, env=env,
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
    line = _error_line(_run(SMOKE, f"--workdir={tmp_path / 'w'}", "--config.rl.advantag=loo"))
    assert "'rl.advantag'" in line and "did you mean 'rl.advantage'?" in line
    assert not (tmp_path / "w").exists()


def test_mistyped_key_in_a_config_file_says_did_you_mean(tmp_path):
    config = tmp_path / "typo.py"
    config.write_text(_TYPO_CONFIG)
    line = _error_line(_run(f"--config={config}", f"--workdir={tmp_path / 'w'}"))
    assert "rl.advantag" in line and "rl.advantage" in line and "did you mean" in line.lower()
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("args, expected", [
    ((SMOKE, "--workdri=/tmp/w"), "workdir"),  # absl's own suggestion, without the usage dump
    ((SMOKE,), "--workdir is required"),
    ((SMOKE, "--workdir=/tmp/w", "--config.rl.steps=abc"), "--config.rl.steps=abc"),
])
def test_other_flag_mistakes(args, expected):
    assert expected in _error_line(_run(*args))


def test_key_suggestions_without_a_subprocess():
    from experiments import train
    assert train.key_problem("rl.advantage") is None
    assert train.key_problem("advantage") == "unknown config key 'advantage'; did you mean 'rl.advantage'?"
    assert train.key_problem("rl.steps.x").startswith("config key 'rl.steps' is a value")
    assert train.key_problem("rl").startswith("config key 'rl' is a section")
    assert train.unknown_keys({"rl": {"steps": 1, "advantag": "x"}, "sedd": 0}) == ["rl.advantag", "sedd"]
    assert train.suggest_key("sedd") == "seed"
    assert train.suggest_key("qqqqqqq") is None
