"""A real 2-process run: jax.distributed on localhost with CPU (gloo) collectives.

Two processes each feed half of every batch to a data × fsdp mesh spanning both; after two
train steps the params equal the one-process, full-batch steps.
"""

import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

import trainer_testlib as lib
from jaxrl_vr.train import step as step_lib
from jaxrl_vr.train.optim import OptimConfig, make_optimizer

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reference():
    graphdef, params, rest = step_lib.split_model(lib.tiny_decoder(16))
    optimizer = make_optimizer(OptimConfig(learning_rate=1e-2, warmup_steps=0, eps=1e-4))
    cfg = step_lib.LossConfig(kl_beta=1.0)
    state = step_lib.init_train_state(params, optimizer, cfg)
    train_step = step_lib.make_train_step(graphdef, rest, optimizer, cfg)
    for seed in (0, 1):
        state, metrics = train_step(state, lib.random_batch(seed, batch=8, vocab=16),
                                    step_lib.StepHyper.create(kl_beta=0.1))
    return state.params, float(metrics["loss"])


@pytest.mark.slow
def test_two_processes_train_like_one(tmp_path):
    out = tmp_path / "params.npz"
    port = _free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
                   JAX_PROCESS_ID=str(rank), PYTHONPATH=REPO)
        env.pop("XLA_FLAGS", None)
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "distributed_worker.py"),
                                       str(out)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    logs = []
    for proc in procs:
        try:
            logs.append(proc.communicate(timeout=300)[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail("the 2-process run did not finish in 300 s")
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
    got = np.load(out)
    assert int(got["processes"]) == 2
    params, loss = _reference()
    np.testing.assert_allclose(float(got["loss"]), loss, rtol=1e-5)
    for path, value in jax.tree_util.tree_leaves_with_path(params):
        np.testing.assert_allclose(got[jax.tree_util.keystr(path)], np.asarray(value),
                                   rtol=1e-4, atol=1e-6, err_msg=jax.tree_util.keystr(path))
