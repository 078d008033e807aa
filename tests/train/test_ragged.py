"""Trimming the response axis (jaxrl_vr.train.ragged): the loss, its gradient, the update
and the log-probs of a batch cut after its last real token equal the padded batch's."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_vr.losses import AGGREGATION_MODES
from jaxrl_vr.models.config import DecoderConfig
from jaxrl_vr.models.decoder import Decoder
from jaxrl_vr.train import ragged
from jaxrl_vr.train import step as step_lib
from jaxrl_vr.train.optim import OptimConfig, make_optimizer
from jaxrl_vr.train.update import make_update_fns

import trainer_testlib as lib

PAD_COLUMNS = 11  # masked columns appended to a batch; `MULTIPLE` keeps the cut inside them
MULTIPLE = 4


def padded(batch: step_lib.RolloutBatch, extra: int = PAD_COLUMNS) -> step_lib.RolloutBatch:
    """`batch` with `extra` masked response columns holding garbage (as a long buffer has)."""
    def widen(name, x):
        if not name.endswith("_bt"):
            return x
        fill = {"tokens_bt": 7, "mask_bt": False, "loss_mask_bt": False, "adv_bt": 3.0,
                "behaviour_logp_bt": jnp.inf, "reference_logp_bt": jnp.nan}[name]
        return jnp.concatenate([x, jnp.full((x.shape[0], extra), fill, x.dtype)], axis=1)
    return step_lib.RolloutBatch(*(widen(n, getattr(batch, n)) for n in step_lib.RolloutBatch._fields))


def grouped_decoder_batch(seed=0, prompts=2, group=4, prompt_len=5, resp_len=6):
    """Prompt-major rows sharing left-padded prompts, ragged responses (one empty)."""
    rng = np.random.default_rng(seed)
    real = rng.integers(1, prompt_len + 1, prompts)
    prompt_mask_ps = np.arange(prompt_len)[None] >= (prompt_len - real)[:, None]
    prompt_ps = np.where(prompt_mask_ps, rng.integers(3, 13, (prompts, prompt_len)), 0)
    rows = prompts * group
    mask_bt = np.arange(resp_len)[None] < rng.integers(1, resp_len + 1, (rows, 1))
    mask_bt[1] = False
    return step_lib.RolloutBatch(
        prompt_tokens_bs=jnp.asarray(np.repeat(prompt_ps, group, axis=0), jnp.int32),
        prompt_mask_bs=jnp.asarray(np.repeat(prompt_mask_ps, group, axis=0)),
        tokens_bt=jnp.asarray(rng.integers(3, 13, (rows, resp_len)), jnp.int32),
        mask_bt=jnp.asarray(mask_bt), loss_mask_bt=jnp.asarray(mask_bt),
        adv_bt=jnp.asarray(np.broadcast_to(rng.normal(size=(rows, 1)), (rows, resp_len)), jnp.float32),
        behaviour_logp_bt=jnp.asarray(-np.log(13) + 0.3 * rng.normal(size=(rows, resp_len)), jnp.float32),
        reference_logp_bt=jnp.asarray(-np.log(13) + 0.3 * rng.normal(size=(rows, resp_len)), jnp.float32),
        kl_weight_b=jnp.asarray(0.5 * (rng.random(rows) < 0.7), jnp.float32))


def test_trimmed_width_hand_computed():
    mask = np.zeros((3, 20), bool)
    mask[0, :3] = True
    mask[2, :9] = True  # the last column any row uses is 8
    assert ragged.trimmed_width(mask, multiple=4) == 12
    assert ragged.trimmed_width(mask, multiple=64) == 20  # never wider than T
    assert ragged.trimmed_width(mask, multiple=1) == 9
    assert ragged.trimmed_width(np.zeros((2, 20), bool), multiple=4) == 4  # no token: one bucket
    assert ragged.trimmed_width(np.ones((2, 64), bool)) == 64  # short buffers are never cut


def test_trim_response_cuts_every_response_field_only():
    batch = padded(lib.random_batch(0, resp_len=5))
    cut = ragged.trim_response(batch, multiple=MULTIPLE)
    assert cut.tokens_bt.shape[1] == 8 and batch.tokens_bt.shape[1] == 5 + PAD_COLUMNS
    for name in step_lib.RolloutBatch._fields:
        full, trimmed = np.asarray(getattr(batch, name)), np.asarray(getattr(cut, name))
        np.testing.assert_array_equal(trimmed, full[:, :8] if name.endswith("_bt") else full)
    assert ragged.trim_response(cut, multiple=MULTIPLE) is cut  # nothing more to cut


@pytest.mark.parametrize("aggregation, jit", [(mode, True) for mode in AGGREGATION_MODES]
                         + [("token_mean", False)])  # op by op is slow: one mode covers the no-jit path
def test_trimmed_loss_and_grads_equal_the_padded_ones(aggregation, jit):
    """Every aggregation mode (Dr.GRPO with an explicit max_len), ragged lengths, one empty
    response, 2 micro-batches, KL and entropy terms on."""
    graphdef, params, rest = step_lib.split_model(lib.CausalBagModel())
    params = jax.tree.map(lambda p: p * 1.5, params)  # off the behaviour policy: clipping acts
    batch = padded(lib.random_batch(1, resp_len=6))
    cfg = step_lib.LossConfig(aggregation=aggregation, kl_aggregation=aggregation, kl_beta=1.0, entropy="bonus",
                              num_microbatches=2, ratio="sequence" if aggregation == "seq_mean" else "token",
                              max_len=9 if aggregation == "seq_mean_token_sum_norm" else None)
    assert not ragged.width_is_read(cfg)
    hyper = step_lib.StepHyper.create(kl_beta=0.2, entropy_coef=0.05, eps_low=0.1, eps_high=0.1)
    fn = step_lib.make_eval_loss(graphdef, cfg)
    cut = ragged.trim_response(batch, multiple=MULTIPLE)
    assert cut.tokens_bt.shape[1] == 8 < batch.tokens_bt.shape[1]
    loss_full, grads_full = fn(params, rest, batch, hyper, ())
    with jax.disable_jit(not jit):  # without jit only the trimmed batch runs op by op (the padded one took 16 s)
        loss_cut, grads_cut = fn(params, rest, cut, hyper, ())
    assert np.isfinite(float(loss_full)) and abs(float(loss_full)) > 1e-4
    np.testing.assert_allclose(float(loss_cut), float(loss_full), rtol=1e-5, atol=1e-7)
    chex.assert_trees_all_close(grads_cut, grads_full, rtol=1e-4, atol=1e-6)


def test_dr_grpo_without_max_len_reads_the_width_so_the_step_is_not_trimmed():
    """Its normaliser is the padded width T: cutting columns would change the loss, so
    `trimmed_train_step` hands back the jitted step itself."""
    graphdef, params, rest = step_lib.split_model(lib.CausalBagModel())
    cfg = step_lib.LossConfig(aggregation="seq_mean_token_sum_norm")
    assert ragged.width_is_read(cfg)
    fn = step_lib.make_eval_loss(graphdef, cfg)
    batch = padded(lib.random_batch(2, resp_len=6))
    hyper = step_lib.StepHyper.create()
    loss_full, _ = fn(params, rest, batch, hyper, ())
    loss_cut, _ = fn(params, rest, ragged.trim_response(batch, multiple=MULTIPLE), hyper, ())
    assert abs(float(loss_cut) - float(loss_full)) > 1e-4
    jitted = object()
    assert ragged.trimmed_train_step(jitted, cfg) is jitted


def test_update_fns_trim_the_batch_with_shared_prefixes_and_compile_once_per_bucket():
    """The trainer's update (`make_update_fns`, prompt_group_size = G, micro-batches) on a padded
    batch equals the update on the batch as sampled, and two batches whose longest responses
    fall in one width bucket reuse one compiled step."""
    model = Decoder(DecoderConfig.tiny(13, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
                                       num_kv_heads=1, head_dim=8, bos_token_id=1, eos_token_id=2,
                                       pad_token_id=0), rngs=nnx.Rngs(0))
    graphdef, params, rest = step_lib.split_model(model)
    optim = OptimConfig(learning_rate=1e-2)
    cfg = step_lib.LossConfig(num_microbatches=2, kl_beta=0.5, prompt_group_size=4)
    fns = make_update_fns(graphdef, optim, cfg, num_updates=2, group_size=4)
    hyper = step_lib.StepHyper.create(kl_beta=0.1)
    batch = grouped_decoder_batch(0)
    long_batch = padded(batch, extra=64 + 6)  # 76 columns, 6 used: cut to 64
    step = step_lib.make_train_step(graphdef, rest, make_optimizer(optim), cfg)
    fresh = lambda: step_lib.init_train_state(jax.tree.map(jnp.copy, params), make_optimizer(optim), cfg)  # noqa: E731
    state_ref, metrics_ref = step(fresh(), batch, hyper)
    state, metrics = fns.train_step(fresh(), long_batch, hyper, rest)  # donates the state
    chex.assert_trees_all_close(state.params, state_ref.params, rtol=1e-5, atol=1e-6)
    for name in ("loss", "entropy", "grad_norm", "trained_tokens", "ratio_max", "kl"):
        np.testing.assert_allclose(float(metrics[name]), float(metrics_ref[name]), rtol=1e-5, atol=1e-7)
    other = padded(grouped_decoder_batch(1), extra=64 + 6)
    fns.train_step(state, other, hyper, rest)
    assert fns.train_step.jitted._cache_size() == 1  # both were cut to 64 columns

    logp_full, ent_full = fns.logprob_fn.jitted(params, rest, *(getattr(long_batch, n) for n in (
        "prompt_tokens_bs", "prompt_mask_bs", "tokens_bt", "mask_bt")), 1.0)
    logp, ent = fns.logprob_fn(params, rest, *(getattr(long_batch, n) for n in (
        "prompt_tokens_bs", "prompt_mask_bs", "tokens_bt", "mask_bt")), 1.0)
    assert logp.shape == logp_full.shape == long_batch.tokens_bt.shape
    mask = np.asarray(long_batch.mask_bt)
    np.testing.assert_allclose(np.where(mask, logp, 0), np.where(mask, logp_full, 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.where(mask, ent, 0), np.where(mask, ent_full, 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(logp)[:, 64:], 0.0)


def long_ragged_batch(seed=3, lengths=(0, 3, 10, 20, 40, 70, 100, 150)):
    """8 rows over 150 columns: one empty response, mostly short ones, a few long."""
    batch = lib.random_batch(seed, resp_len=150)
    mask = np.arange(150)[None] < np.asarray(lengths)[np.random.default_rng(seed).permutation(8)][:, None]
    return batch._replace(mask_bt=jnp.asarray(mask), loss_mask_bt=jnp.asarray(mask))


def test_microbatch_widths_and_buckets_hand_computed():
    cfg = step_lib.LossConfig(num_microbatches=4)
    assert step_lib.microbatch_widths(150, cfg) == (64, 128, 150)
    assert step_lib.microbatch_widths(512, cfg) == (64, 128, 256, 512)
    assert step_lib.microbatch_widths(64, cfg) == ()  # short buffers: the strided full-width split
    assert step_lib.microbatch_widths(512, step_lib.LossConfig()) == ()  # one micro-batch
    assert step_lib.microbatch_widths(512, step_lib.LossConfig(num_microbatches=4,
                                                               aggregation="seq_mean_token_sum_norm")) == ()
    batch = long_ragged_batch()
    index_b = jnp.arange(8, dtype=jnp.int32)
    mbs, index_m, bucket_m = step_lib._length_sorted_microbatches(batch, index_b, 4, (64, 128, 150))
    # Sorted lengths (0, 3), (10, 20), (40, 70), (100, 150) -> widths 64, 64, 128, 150.
    np.testing.assert_array_equal(bucket_m, [0, 0, 1, 2])
    np.testing.assert_array_equal(np.asarray(mbs.mask_bt).sum(-1), [[0, 3], [10, 20], [40, 70], [100, 150]])
    np.testing.assert_array_equal(np.asarray(mbs.tokens_bt).reshape(8, -1),
                                  np.asarray(batch.tokens_bt)[np.asarray(index_m).reshape(-1)])


@pytest.mark.parametrize("aggregation", AGGREGATION_MODES)
def test_length_bucketed_microbatches_equal_the_full_batch(aggregation):
    """4 length-sorted micro-batches at widths 64/64/128/150 give the loss and gradient of one
    full-width micro-batch, in every aggregation mode (the jitted step)."""
    graphdef, params, rest = step_lib.split_model(lib.CausalBagModel())
    params = jax.tree.map(lambda p: p * 1.5, params)
    batch = long_ragged_batch()
    hyper = step_lib.StepHyper.create(kl_beta=0.2, entropy_coef=0.05, eps_low=0.1, eps_high=0.1)
    results = []
    for num in (1, 4):
        cfg = step_lib.LossConfig(aggregation=aggregation, kl_aggregation=aggregation, kl_beta=1.0,
                                  entropy="bonus", num_microbatches=num,
                                  ratio="sequence" if aggregation == "seq_mean" else "token",
                                  max_len=160 if aggregation == "seq_mean_token_sum_norm" else None)
        results.append(step_lib.make_eval_loss(graphdef, cfg)(params, rest, batch, hyper, ()))
    (loss1, grads1), (loss4, grads4) = results
    assert abs(float(loss1)) > 1e-4
    np.testing.assert_allclose(float(loss4), float(loss1), rtol=1e-5, atol=1e-7)
    chex.assert_trees_all_close(grads4, grads1, rtol=1e-4, atol=1e-6)


def test_length_bucketed_train_step_with_shared_prefixes_equals_the_strided_one():
    """The decoder with shared prompt prefixes (rows of one prompt land in different
    micro-batches): same update and metrics as one full-width micro-batch; the compiled step
    holds one loop per width, and a batch of other lengths reuses it."""
    model = Decoder(DecoderConfig.tiny(13, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
                                       num_kv_heads=1, head_dim=8, bos_token_id=1, eos_token_id=2,
                                       pad_token_id=0), rngs=nnx.Rngs(0))
    graphdef, params, rest = step_lib.split_model(model)
    optimizer = make_optimizer(OptimConfig(learning_rate=1e-2))
    base = grouped_decoder_batch(5, resp_len=6)
    batch = padded(base, extra=94)  # 100 columns: widths 64 and 100
    lengths = np.array([0, 2, 5, 9, 30, 70, 99, 100])
    mask = jnp.asarray(np.arange(100)[None] < lengths[:, None])
    batch = batch._replace(mask_bt=mask, loss_mask_bt=mask)
    hyper = step_lib.StepHyper.create(kl_beta=0.1)
    outs = []
    for num in (1, 4):
        cfg = step_lib.LossConfig(num_microbatches=num, kl_beta=0.5, prompt_group_size=4)
        step = step_lib.make_train_step(graphdef, rest, optimizer, cfg)
        state = step_lib.init_train_state(jax.tree.map(jnp.copy, params), optimizer, cfg)
        outs.append((step, *step(state, batch, hyper)))
    (_, state1, metrics1), (step4, state4, metrics4) = outs
    chex.assert_trees_all_close(state4.params, state1.params, rtol=1e-5, atol=1e-5 * 1e-2)
    for name in ("loss", "entropy", "grad_norm", "trained_tokens", "ratio_max", "kl"):
        np.testing.assert_allclose(float(metrics4[name]), float(metrics1[name]), rtol=1e-4, atol=1e-7)
    shuffled = batch._replace(mask_bt=mask[::-1], loss_mask_bt=mask[::-1])
    step4(state4, shuffled, hyper)
    assert step4.jitted._cache_size() == 1
