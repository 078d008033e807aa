"""One process of the 2-process jax.distributed test (run by test_distributed.py, not by pytest).

Every process runs the same program: initialise the multi-process runtime from
JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID, build a data × fsdp mesh over
all processes' CPU devices, feed its own half of each batch, take 2 train steps, and
(process 0) write the resulting params to the file named by argv[1].
"""

import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: xla_testlib

from xla_testlib import with_fast_compile  # noqa: E402

# The tests' fast-to-compile settings (conftest.py).
os.environ["XLA_FLAGS"] = with_fast_compile("--xla_force_host_platform_device_count=2")

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")

from jaxrl_vr import parallel  # noqa: E402

parallel.initialize_distributed()

import numpy as np  # noqa: E402

import trainer_testlib as lib  # noqa: E402
from jaxrl_vr.train import step as step_lib  # noqa: E402
from jaxrl_vr.train.optim import OptimConfig, make_optimizer  # noqa: E402


def main(out_path: str) -> None:
    mesh = parallel.make_mesh(data=2, fsdp=2)  # 2 processes × 2 devices
    graphdef, params, rest = step_lib.split_model(lib.tiny_decoder(16))
    optimizer = make_optimizer(OptimConfig(learning_rate=1e-2, warmup_steps=0, eps=1e-4))
    cfg = step_lib.LossConfig(kl_beta=1.0)
    state = step_lib.init_train_state(params, optimizer, cfg)
    sharding = parallel.train_state_shardings(state, mesh)
    state = jax.device_put(state, sharding)
    train_step = step_lib.make_train_step(graphdef, rest, optimizer, cfg, state_sharding=sharding)
    rank, size = jax.process_index(), jax.process_count()
    for seed in (0, 1):
        batch = lib.random_batch(seed, batch=8, vocab=16)
        per = 8 // size
        local = jax.tree.map(lambda x: np.asarray(x)[rank * per:(rank + 1) * per], batch)
        state, metrics = train_step(state, parallel.shard_batch(local, mesh),
                                    step_lib.StepHyper.create(kl_beta=0.1))
    from jax.experimental import multihost_utils

    full = multihost_utils.process_allgather(state.params, tiled=True)
    if rank == 0:
        leaves = jax.tree_util.tree_leaves_with_path(full)
        np.savez(out_path, **{jax.tree_util.keystr(p): np.asarray(v) for p, v in leaves},
                 loss=np.asarray(float(metrics["loss"])), processes=np.asarray(size))


if __name__ == "__main__":
    main(sys.argv[1])
