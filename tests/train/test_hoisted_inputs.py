"""What the micro-batches share is computed once per step (`step.hoisted_inputs`): a tied
embedding's [D, V] transpose and the prompts' prefixes. Same loss and gradients as computing
everything inside each micro-batch; the tied LM head's gradient is summed in [D, V] and
transposed once per step, not once per micro-batch."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_vr.models.config import DecoderConfig
from jaxrl_vr.models.decoder import Decoder
from jaxrl_vr.train import step as step_lib

VOCAB, WIDTH = 13, 16


def _decoder(tied: bool) -> Decoder:
    config = DecoderConfig.tiny(VOCAB, hidden_size=WIDTH, intermediate_size=32, num_layers=2, num_heads=4,
                                num_kv_heads=2, head_dim=8, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                tie_word_embeddings=tied)
    return Decoder(config, rngs=nnx.Rngs(0))


def _batch(rows=8, prompt_len=5, resp_len=4, seed=0, group=4):
    """Prompt-major: each prompt is shared by `group` consecutive rows."""
    rng = np.random.default_rng(seed)
    mask_bt = np.arange(resp_len)[None] < rng.integers(1, resp_len + 1, (rows, 1))
    prompts = np.repeat(rng.integers(3, VOCAB, (rows // group, prompt_len)), group, axis=0)
    return step_lib.RolloutBatch(
        prompt_tokens_bs=jnp.asarray(prompts, jnp.int32),
        prompt_mask_bs=jnp.ones((rows, prompt_len), bool),
        tokens_bt=jnp.asarray(rng.integers(3, VOCAB, (rows, resp_len)), jnp.int32),
        mask_bt=jnp.asarray(mask_bt),
        adv_b=jnp.asarray(rng.normal(size=rows), jnp.float32),
        behaviour_logp_bt=jnp.asarray(-np.log(VOCAB) + 0.3 * rng.normal(size=(rows, resp_len)), jnp.float32),
        reference_logp_bt=jnp.asarray(-np.log(VOCAB) + 0.3 * rng.normal(size=(rows, resp_len)), jnp.float32),
        kl_weight_b=jnp.zeros((rows,), jnp.float32),
    )


def _tied_transposes_in_loops(jaxpr) -> list[str]:
    """Transposes of a [V, D] or [D, V] array inside any scan body of `jaxpr`, recursively."""
    shapes = {(VOCAB, WIDTH), (WIDTH, VOCAB)}
    found = []

    def sub_jaxprs(eqn):
        for value in eqn.params.values():
            for item in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(item, jax.extend.core.ClosedJaxpr):
                    yield item.jaxpr
                elif isinstance(item, jax.extend.core.Jaxpr):
                    yield item

    def walk(jx, in_loop):
        for eqn in jx.eqns:
            if in_loop and eqn.primitive.name == "transpose" and tuple(eqn.invars[0].aval.shape) in shapes:
                found.append(f"{eqn.primitive.name} {eqn.invars[0].aval.shape}")
            for sub in sub_jaxprs(eqn):
                walk(sub, in_loop or eqn.primitive.name in ("scan", "while"))

    walk(jaxpr.jaxpr, False)
    return found


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("group", [1, 4])
def test_hoisted_loss_and_grads_equal_the_unhoisted_objective(tied, group):
    """Reference: the per-micro-batch objective on the whole batch, computing the
    unembedding (and every row's full prompt) inside, differentiated directly."""
    graphdef, params, rest = step_lib.split_model(_decoder(tied))
    params = jax.tree.map(lambda p: p * 1.5, params)
    batch = _batch()
    hyper = step_lib.StepHyper.create(kl_beta=0.2, entropy_coef=0.05, eps_low=0.1, eps_high=0.1)
    reference_cfg = step_lib.LossConfig(kl_beta=1.0, entropy="bonus")
    dens = step_lib.loss_denominators(batch, reference_cfg)
    objective = step_lib.make_loss_fn(graphdef, reference_cfg)
    (ref_loss, _), ref_grads = jax.value_and_grad(objective, has_aux=True)(params, rest, batch, hyper, (), dens)
    for num_microbatches in (1, 4):
        cfg = step_lib.LossConfig(kl_beta=1.0, entropy="bonus", num_microbatches=num_microbatches,
                                  prompt_group_size=group)
        loss, grads = step_lib.make_eval_loss(graphdef, cfg)(params, rest, batch, hyper, ())
        np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5, atol=1e-7)
        chex.assert_trees_all_close(grads, ref_grads, rtol=1e-4, atol=1e-6)
    assert float(jnp.abs(grads["embed"][...]).max()) > 0


@pytest.mark.parametrize("tied", [True, False])
def test_only_a_tied_embedding_is_hoisted(tied):
    model = _decoder(tied)
    hoisted = step_lib.hoisted_inputs(model, _batch(), group_size=1)
    if tied:
        np.testing.assert_array_equal(hoisted["unembed_dv"], model.embed[...].T)
    else:  # an untied LM head is [D, V] already: hoisting it would only add an accumulator
        assert "unembed_dv" not in hoisted


def test_the_tied_embedding_is_transposed_outside_the_micro_batch_loop():
    graphdef, params, rest = step_lib.split_model(_decoder(tied=True))
    cfg = step_lib.LossConfig(num_microbatches=4)
    loss_and_grad = step_lib.make_eval_loss(graphdef, cfg)
    jaxpr = jax.make_jaxpr(loss_and_grad)(params, rest, _batch(), step_lib.StepHyper.create(), ())
    assert _tied_transposes_in_loops(jaxpr) == []
