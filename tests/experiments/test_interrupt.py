"""SIGINT / SIGTERM during training: the last complete step is checkpointed, the run exits
cleanly with the command to resume, and a re-run continues from there."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_checkpoints_the_last_step_and_exits_cleanly(tmp_path, sig):
    workdir = tmp_path / "run"
    cmd = [sys.executable, "-m", "experiments.train",
           "--config=experiments/configs/default.py:smoke", f"--workdir={workdir}",
           "--config.rl.steps=400", "--config.rl.checkpoint_every=1000",
           "--config.run.tensorboard=False"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = workdir / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "resume" in err
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    from jaxrl_vr.train.checkpoint import Checkpointer

    ckpt = Checkpointer(workdir / "checkpoints", max_to_keep=2)
    assert ckpt.latest_step() == steps[-1] < 400  # the step in flight finished and was saved
    ckpt.close()
    leftovers = [name for name in os.listdir(workdir / "checkpoints")
                 if not name.isdigit() and name not in (".trash", "corrupt")]
    assert not leftovers, leftovers  # no half-written or half-deleted step directories
    assert not os.path.exists(workdir / "summary.json")
