"""Sharded train state: params and optimizer state split over fsdp/tensor, batch over data.

Two train steps on a mesh of the 8 fake CPU devices must equal the one-device steps, and
each device must hold about 1/(fsdp·tensor) of the parameter bytes.
"""

import chex
import jax
import numpy as np
import pytest
from flax import nnx

from jaxrl_vr import parallel
from jaxrl_vr.models.config import DecoderConfig
from jaxrl_vr.models.decoder import Decoder
from jaxrl_vr.train import step as step_lib
from jaxrl_vr.train.optim import OptimConfig, make_optimizer

import trainer_testlib as lib


def _model():
    cfg = DecoderConfig.tiny(16, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                             num_kv_heads=2, head_dim=8, bos_token_id=1, eos_token_id=2,
                             pad_token_id=0, tie_word_embeddings=False)
    return Decoder(cfg, rngs=nnx.Rngs(0))


def _two_steps(mesh):
    graphdef, params, rest = step_lib.split_model(_model())
    # eps = 1e-4: Adam would otherwise blow float reduction-order noise of ~0 grads up to a step.
    optimizer = make_optimizer(OptimConfig(learning_rate=1e-2, warmup_steps=0, eps=1e-4))
    cfg = step_lib.LossConfig(kl_beta=1.0, num_microbatches=2)
    state = step_lib.init_train_state(params, optimizer, cfg)
    sharding = None
    if mesh is not None:
        sharding = parallel.train_state_shardings(state, mesh)
        state = jax.device_put(state, sharding)
    train_step = step_lib.make_train_step(graphdef, rest, optimizer, cfg, state_sharding=sharding)
    hyper = step_lib.StepHyper.create(kl_beta=0.1)
    losses = []
    for seed in (0, 1):
        batch = lib.random_batch(seed, batch=16, vocab=16)
        if mesh is not None:
            batch = parallel.shard_batch(batch, mesh)
        state, metrics = train_step(state, batch, hyper)
        losses.append(float(metrics["loss"]))
    return state, losses


def _bytes_on(device, tree) -> int:
    total = 0
    for leaf in jax.tree.leaves(tree):
        for shard in leaf.addressable_shards:
            if shard.device == device:
                total += shard.data.nbytes
    return total


@pytest.mark.parametrize("data,fsdp,tensor", [(8, 1, 1), (2, 4, 1), (2, 2, 2)])
def test_sharded_steps_equal_single_device_steps(data, fsdp, tensor):
    plain_state, plain_losses = _two_steps(None)
    mesh = parallel.make_mesh(data=data, fsdp=fsdp, tensor=tensor)
    state, losses = _two_steps(mesh)
    np.testing.assert_allclose(losses, plain_losses, rtol=2e-5)
    chex.assert_trees_all_close(jax.device_get(state.params), jax.device_get(plain_state.params),
                                rtol=2e-4, atol=2e-6)
    # Params (and Adam moments) stay sharded after the update.
    wq = state.params["layers"]["wq"].value if hasattr(state.params["layers"]["wq"], "value") \
        else state.params["layers"]["wq"]
    expected = jax.sharding.NamedSharding(
        mesh, parallel.param_partition_spec(("layers", "wq"), wq.shape, mesh))
    assert wq.sharding.is_equivalent_to(expected, wq.ndim), wq.sharding
    total = sum(leaf.nbytes for leaf in jax.tree.leaves(state.params))
    per_device = _bytes_on(jax.devices()[0], state.params)
    split = fsdp * tensor
    # Norm scales are replicated, so a little more than 1/split; far less than a full copy.
    assert per_device <= total / split * 1.15 + 4096, (per_device, total, split)
    if split > 1:
        assert per_device < 0.6 * total
    opt_total = sum(np.asarray(x).nbytes for x in jax.tree.leaves(state.opt_state))
    assert _bytes_on(jax.devices()[0], state.opt_state) <= opt_total / split * 1.15 + 4096


def test_trainer_on_a_mesh_keeps_params_and_optimizer_state_sharded(tmp_path):
    from jaxrl_vr.models.tokenizers import CharTokenizer
    from jaxrl_vr.tasks import arithmetic
    from jaxrl_vr.train.config import RLConfig, VerifierConfig
    from jaxrl_vr.verifiers.pool import score_serial

    import trainer_testlib as lib

    tokenizer = CharTokenizer(arithmetic.ARITHMETIC_ALPHABET)
    items = arithmetic.make_items(0, 8, levels=(0,), split=None)
    cfg = DecoderConfig.tiny(tokenizer.vocab_size, hidden_size=32, intermediate_size=64,
                             num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8,
                             bos_token_id=1, eos_token_id=2, pad_token_id=0)
    mesh = parallel.make_mesh(data=2, fsdp=2, tensor=2)
    rl = RLConfig(steps=1, prompts_per_step=4, samples_per_prompt=4, max_new_tokens=3,
                  num_minibatches=2, verifier=VerifierConfig(workers=0), seed=1)
    trainer = lib.make_trainer(tmp_path, tokenizer, items, rl=rl, model=Decoder(cfg, rngs=nnx.Rngs(0)),
                               loss=step_lib.LossConfig(), optim=OptimConfig(learning_rate=1e-2),
                               scorer=score_serial, mesh=mesh)
    rows = trainer.run()
    trainer.close()
    assert np.isfinite(rows[0]["loss"])
    w_up = trainer.state.train.params["layers"]["w_up"]
    w_up = getattr(w_up, "value", w_up)
    expected = jax.sharding.NamedSharding(
        mesh, parallel.param_partition_spec(("layers", "w_up"), w_up.shape, mesh))
    assert w_up.sharding.is_equivalent_to(expected, w_up.ndim)
    total = sum(leaf.nbytes for leaf in jax.tree.leaves(trainer.state.train.params))
    assert _bytes_on(jax.devices()[0], trainer.state.train.params) < 0.6 * total
