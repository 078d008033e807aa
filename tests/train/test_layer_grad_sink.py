"""The update's gradient sink for a Decoder's stacked layer parameters (`LayerGradSink`):
each micro-batch's layer scan adds its gradient into one accumulator in place; the result
is `jax.grad`'s, and the compiled update holds one stacked gradient less."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_vr.models import add_lora
from jaxrl_vr.models.config import DecoderConfig
from jaxrl_vr.models.decoder import Decoder, _through_sink
from jaxrl_vr.train import step as step_lib
from jaxrl_vr.train.optim import OptimConfig, make_optimizer

import trainer_testlib as lib
from test_ragged import grouped_decoder_batch


def decoder(num_layers=3, hidden=16, mlp=32, seed=0):
    return Decoder(DecoderConfig.tiny(13, hidden_size=hidden, intermediate_size=mlp, num_layers=num_layers,
                                      num_heads=2, num_kv_heads=1, head_dim=8, bos_token_id=1, eos_token_id=2,
                                      pad_token_id=0), rngs=nnx.Rngs(seed))


def test_the_sink_adds_a_layers_cotangent_into_its_slice_hand_computed():
    acc = {"w": jnp.arange(6.0).reshape(3, 2)}  # 3 layers
    p = {"w": jnp.array([7.0, 8.0])}
    out, vjp = jax.vjp(lambda acc, p: _through_sink(acc, jnp.int32(1), p), acc, p)
    chex.assert_trees_all_equal(out, (acc, p))  # the forward pass changes nothing
    seed = {"w": jnp.array([[10.0, 20.0], [30.0, 40.0], [50.0, 60.0]])}
    acc_ct, p_ct = vjp((seed, {"w": jnp.array([1.0, 2.0])}))
    np.testing.assert_array_equal(acc_ct["w"], [[10.0, 20.0], [31.0, 42.0], [50.0, 60.0]])
    np.testing.assert_array_equal(p_ct["w"], [0.0, 0.0])  # the gradient went to the sink only


def _without_sink(monkeypatch):
    monkeypatch.setattr(step_lib, "_layer_sink", lambda graphdef, params, rest: step_lib._no_layer_sink(params))


@pytest.mark.parametrize("case, jit", [("plain", True), ("plain", False), ("shared_prefix", True),
                                       ("length_buckets", True), ("lora", True)])
def test_the_sink_gives_the_gradient_of_jax_grad(case, jit, monkeypatch):
    """Three layers (each slice of the accumulator distinct), several micro-batches: the same
    loss and gradient as with every parameter differentiated as usual (nothing in the sink); with
    shared prompt prefixes (the prefix's own layer scan adds into the sink after the loop),
    length-bucketed micro-batches (one loop per bucket) and LoRA (adapters only trained)."""
    model = decoder()
    group, batch = 1, grouped_decoder_batch(1, resp_len=6)
    if case == "shared_prefix":
        group = 4
    if case == "length_buckets":
        batch = lib.random_batch(3, resp_len=100, vocab=13)
        lengths = np.array([0, 2, 5, 9, 30, 70, 99, 100])
        mask = jnp.asarray(np.arange(100)[None] < lengths[:, None])
        batch = batch._replace(mask_bt=mask, loss_mask_bt=mask)
    if case == "lora":
        model = add_lora(model, rank=2, alpha=4.0, key=jax.random.key(3))
    graphdef, params, rest = step_lib.split_model(model)
    params = jax.tree.map(lambda p: p + 0.05 * jnp.sin(jnp.arange(p.size).reshape(p.shape)), params)  # B != 0
    cfg = step_lib.LossConfig(num_microbatches=4, kl_beta=0.5, prompt_group_size=group)
    if case == "length_buckets":
        assert step_lib.microbatch_widths(100, cfg) == (64, 100)
    hyper = step_lib.StepHyper.create(kl_beta=0.1)
    if not jit:
        monkeypatch.setattr(jax, "jit", lambda f, **kw: f)
    sunk = step_lib.make_eval_loss(graphdef, cfg)(params, rest, batch, hyper, ())
    _without_sink(monkeypatch)
    plain = step_lib.make_eval_loss(graphdef, cfg)(params, rest, batch, hyper, ())
    assert abs(float(plain[0])) > 1e-4
    np.testing.assert_allclose(float(sunk[0]), float(plain[0]), rtol=1e-6)
    chex.assert_trees_all_close(sunk[1], plain[1], rtol=1e-5, atol=1e-7)
    layer_grads = jax.tree.leaves(plain[1]["layers"])
    assert all(float(jnp.abs(g).max()) > 0 for g in layer_grads)  # every stacked leaf is trained


def _update_temp_bytes(graphdef, params, rest, cfg, batch) -> int:
    optimizer = make_optimizer(OptimConfig(learning_rate=1e-2))
    state = step_lib.init_train_state(params, optimizer, cfg)
    step = step_lib.make_train_step(graphdef, rest, optimizer, cfg, donate=True)
    compiled = step.jitted.lower(state, batch, step_lib.StepHyper.create(), rest).compile()
    return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("resp_len", [6, 100])
def test_the_donated_update_holds_one_stacked_gradient_less(resp_len, monkeypatch):
    """XLA's buffer assignment of the donated step: with the sink, the temporaries shrink by
    more than half the stacked layer parameters' bytes (no stacked gradient per micro-batch,
    and no copy of the accumulator into a width bucket's loop). Measured: 75 % here, 79 % on
    the 0.4B model (4,590 -> 3,389 MiB)."""
    graphdef, params, rest = step_lib.split_model(decoder(num_layers=4, hidden=64, mlp=512))
    batch = lib.random_batch(3, resp_len=resp_len, vocab=13)
    cfg = step_lib.LossConfig(num_microbatches=4)
    stacked = sum(leaf.nbytes for leaf in jax.tree.leaves(params["layers"]))
    sunk = _update_temp_bytes(graphdef, params, rest, cfg, batch)
    _without_sink(monkeypatch)
    plain = _update_temp_bytes(graphdef, params, rest, cfg, batch)
    assert plain - sunk > 0.5 * stacked, (plain, sunk, stacked)
