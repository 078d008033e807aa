"""Shared prompt prefixes (LossConfig.prompt_group_size, Prefix Grouper): each prompt runs
through the blocks once per batch; the loss, gradients and update are those of running
every row's full sequence."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_vr.models.config import DecoderConfig
from jaxrl_vr.models.decoder import Decoder, default_positions
from jaxrl_vr.train import step as step_lib
from jaxrl_vr.train.optim import OptimConfig, make_optimizer


def _decoder(seed=0, **overrides) -> Decoder:
    kwargs = dict(hidden_size=16, intermediate_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                  head_dim=8, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    kwargs.update(overrides)
    return Decoder(DecoderConfig.tiny(13, **kwargs), rngs=nnx.Rngs(seed))


def _grouped_batch(seed=0, *, prompts=3, group=4, prompt_len=6, resp_len=5, vocab=13):
    """P prompts (left-padded, ragged; one of a single token), G responses each, prompt-major;
    ragged response masks, one empty response."""
    rng = np.random.default_rng(seed)
    real = np.array([prompt_len, 1] + list(rng.integers(2, prompt_len, prompts - 2)))[:prompts]
    prompt_mask_ps = np.arange(prompt_len)[None] >= (prompt_len - real)[:, None]
    prompt_ps = np.where(prompt_mask_ps, rng.integers(3, vocab, (prompts, prompt_len)), 0)
    rows = prompts * group
    lengths = rng.integers(1, resp_len + 1, (rows, 1))
    mask_bt = np.arange(resp_len)[None] < lengths
    mask_bt[1] = False
    return step_lib.RolloutBatch(
        prompt_tokens_bs=jnp.asarray(np.repeat(prompt_ps, group, axis=0), jnp.int32),
        prompt_mask_bs=jnp.asarray(np.repeat(prompt_mask_ps, group, axis=0)),
        tokens_bt=jnp.asarray(np.where(mask_bt, rng.integers(3, vocab, (rows, resp_len)), 0), jnp.int32),
        mask_bt=jnp.asarray(mask_bt),
        loss_mask_bt=jnp.asarray(mask_bt),
        adv_bt=jnp.asarray(np.broadcast_to(rng.normal(size=(rows, 1)), (rows, resp_len)), jnp.float32),
        behaviour_logp_bt=jnp.asarray(-np.log(vocab) + 0.3 * rng.normal(size=(rows, resp_len)), jnp.float32),
        reference_logp_bt=jnp.asarray(-np.log(vocab) + 0.3 * rng.normal(size=(rows, resp_len)), jnp.float32),
        kl_weight_b=jnp.asarray(0.5 * (rng.random(rows) < 0.7), jnp.float32),
    )


@pytest.mark.parametrize("overrides", [{}, {"attention_bias": True, "qk_norm": True}])
def test_hidden_states_on_a_prefix_equal_the_full_sequence(overrides):
    model = _decoder(**overrides)
    batch = _grouped_batch(1, group=1, prompts=4)
    seq = jnp.concatenate([batch.prompt_tokens_bs, batch.tokens_bt], axis=1)
    mask = jnp.concatenate([batch.prompt_mask_bs, batch.mask_bt], axis=1)
    full = model.hidden_states(seq, mask_bt=mask)
    positions = default_positions(mask)
    for split in (1, 3, 6):  # prefix of 1, 3 and all 6 prompt columns
        prefix = model.prefix_kv(seq[:, :split], positions_bs=positions[:, :split], mask_bs=mask[:, :split])
        chex.assert_shape(prefix.keys_lbske, (2, 4, split, 2, 8))
        rest = model.hidden_states(seq[:, split:], positions_bt=positions[:, split:], mask_bt=mask[:, split:],
                                   prefix=prefix, prefix_mask_bs=mask[:, :split])
        real = np.asarray(mask[:, split:])[..., None]  # padded queries are meaningless either way
        np.testing.assert_allclose(np.where(real, rest, 0), np.where(real, full[:, split:], 0), atol=2e-6)


@pytest.mark.parametrize("num_microbatches", [1, 2, 4])
def test_shared_prefix_loss_and_grads_equal_the_full_sequences(num_microbatches):
    graphdef, params, rest = step_lib.split_model(_decoder())
    params = jax.tree.map(lambda p: p * 1.5, params)  # off the behaviour policy: clipping acts
    batch = _grouped_batch(2)
    hyper = step_lib.StepHyper.create(kl_beta=0.2, entropy_coef=0.05, eps_low=0.1, eps_high=0.1)
    results = []
    for group in (1, 4):
        cfg = step_lib.LossConfig(kl_beta=1.0, entropy="bonus", num_microbatches=num_microbatches,
                                  prompt_group_size=group)
        results.append(step_lib.make_eval_loss(graphdef, cfg)(params, rest, batch, hyper, ()))
    (loss_full, grads_full), (loss_shared, grads_shared) = results
    assert abs(float(loss_full)) > 1e-4
    np.testing.assert_allclose(float(loss_shared), float(loss_full), rtol=1e-5, atol=1e-7)
    # Every parameter gets gradient through the prompts, and the shared path gives the same.
    assert all(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grads_full))
    chex.assert_trees_all_close(grads_shared, grads_full, rtol=1e-4, atol=1e-6)


def test_shared_prefix_train_step_gives_the_same_update_and_metrics():
    graphdef, params, rest = step_lib.split_model(_decoder(seed=3))
    optimizer = make_optimizer(OptimConfig(learning_rate=1e-2))
    batch = _grouped_batch(3)
    outs = []
    for group in (1, 4):
        cfg = step_lib.LossConfig(num_microbatches=2, detach_behaviour=True, prompt_group_size=group)
        state = step_lib.init_train_state(params, optimizer, cfg)
        outs.append(step_lib.make_train_step(graphdef, rest, optimizer, cfg)(state, batch,
                                                                             step_lib.StepHyper.create()))
    (state_full, metrics_full), (state_shared, metrics_shared) = outs
    # Adam divides each gradient by its own root mean square, so where a gradient is near
    # zero the two summation orders' rounding moves the step: allow 0.1 % of one lr step.
    chex.assert_trees_all_close(state_shared.params, state_full.params, rtol=1e-5, atol=1e-3 * 1e-2)
    for name in ("loss", "entropy", "grad_norm", "trained_tokens"):
        np.testing.assert_allclose(float(metrics_shared[name]), float(metrics_full[name]), rtol=1e-4)


def test_shared_prefix_runs_each_prompt_once():
    """The switch's effect: the compiled step does less work (XLA's own FLOP count)."""
    graphdef, params, rest = step_lib.split_model(_decoder())
    batch = _grouped_batch(4, prompts=2, group=8, prompt_len=24, resp_len=4)
    hyper = step_lib.StepHyper.create()
    flops = {}
    for group in (1, 8):
        fn = step_lib.make_eval_loss(graphdef, step_lib.LossConfig(prompt_group_size=group))
        flops[group] = fn.lower(params, rest, batch, hyper, ()).compile().cost_analysis()["flops"]
    # 16 rows × 28 tokens against 2 × 23 prefix tokens + 16 × 4: about a third of the work.
    assert flops[8] < 0.5 * flops[1], flops


def test_prompt_groups_are_checked_before_the_step():
    graphdef, params, rest = step_lib.split_model(_decoder())
    optimizer = make_optimizer(OptimConfig(learning_rate=1e-2))
    cfg = step_lib.LossConfig(prompt_group_size=4)
    state = step_lib.init_train_state(params, optimizer, cfg)
    train_step = step_lib.make_train_step(graphdef, rest, optimizer, cfg)
    batch = _grouped_batch(5)
    shuffled = jax.tree.map(lambda x: x[np.r_[1:12, 0]], batch)  # row 0 moved to the end
    with pytest.raises(ValueError, match="do not share one prompt"):
        train_step(state, shuffled, step_lib.StepHyper.create())
    right_padded = batch._replace(prompt_tokens_bs=batch.prompt_tokens_bs[:, ::-1],
                                  prompt_mask_bs=batch.prompt_mask_bs[:, ::-1])
    with pytest.raises(ValueError, match="left-padded"):
        train_step(state, right_padded, step_lib.StepHyper.create())
    with pytest.raises(ValueError, match="does not divide"):
        step_lib.check_prompt_groups(batch, 5)
    with pytest.raises(ValueError, match="prompt_group_size must be >= 1"):
        step_lib.LossConfig(prompt_group_size=0)
    step_lib.check_prompt_groups(batch, 4)  # the real layout passes


@pytest.mark.slow
def test_the_trainer_shares_prompts_when_minibatches_keep_whole_groups(tmp_path):
    """With one minibatch per pass the RL trainer's rows are the round's [P, G] rows in
    order: it shares each prompt, and two steps end where the unshared step ends.

    The reward is the parity of the completion's characters, not the arithmetic verifier: the
    tiny model answers every prompt wrongly on some CPUs, and with all groups degenerate the
    only gradient left was rounding noise between the shared and unshared log-probs, which
    Adam scales up to a full step (a Zen 5 EPYC failed that way). Parity gives mixed groups."""
    import dataclasses

    from jaxrl_vr.models.tokenizers import CharTokenizer
    from jaxrl_vr.tasks import arithmetic
    from jaxrl_vr.train.batch import rollout_batch
    from jaxrl_vr.train.config import RLConfig, VerifierConfig
    from jaxrl_vr.train.update import make_update_fns
    from jaxrl_vr.train.update import update_on_batch
    from jaxrl_vr.verifiers.pool import VerifyResult

    import trainer_testlib as lib

    tokenizer = CharTokenizer(arithmetic.ARITHMETIC_ALPHABET)
    items = arithmetic.make_items(0, 6, levels=(0,), split=None)
    optim = OptimConfig(learning_rate=0.05, warmup_steps=1)

    def parity(items, completions):
        scores = np.asarray([float(sum(map(ord, c)) % 2) for c in completions], np.float32)
        return VerifyResult(scores=scores, statuses=["ok"] * len(completions), errors=[None] * len(completions),
                            elapsed_s=0.0)

    def trainer(name, num_minibatches):
        rl = RLConfig(steps=2, prompts_per_step=2, samples_per_prompt=4, max_new_tokens=3,
                      num_minibatches=num_minibatches, num_epochs=2, verifier=VerifierConfig(workers=0),
                      seed=3)
        return lib.make_trainer(tmp_path / name, tokenizer, items, rl=rl,
                                loss=step_lib.LossConfig(kl_beta=0.05), optim=optim, scorer=parity)

    assert trainer("split", 2).parts.loss_structure.prompt_group_size == 1
    shared, plain = trainer("shared", 1), trainer("plain", 1)
    assert shared.parts.loss_structure.prompt_group_size == 4
    p = plain.parts
    fns = make_update_fns(p.graphdef, optim, dataclasses.replace(p.loss_structure, prompt_group_size=1))

    def unshared_update(state, batch, step):
        return update_on_batch(lambda s, b: fns.train_step(s, b, p.hyper, p.rest), state, rollout_batch(batch),
                               num_epochs=2, num_minibatches=1, seed=3, step=step)

    plain.parts = p._replace(update=unshared_update)
    rows_shared, rows_plain = shared.run(), plain.run()
    assert [r["trained_tokens"] for r in rows_shared] == [r["trained_tokens"] for r in rows_plain]
    # Real gradients, not rounding noise: mixed groups and a gradient norm of order one.
    assert any(r["adv_std"] > 0 for r in rows_plain) and max(r["grad_norm"] for r in rows_plain) > 0.1, rows_plain
    for name in ("loss", "grad_norm"):  # each step's gradient, from the same parameters up to rounding
        np.testing.assert_allclose([r[name] for r in rows_shared], [r[name] for r in rows_plain], rtol=1e-3,
                                   err_msg=name)
    # Four Adam steps at lr 0.05 move the weights (~0.1) by ~1e-2 each: a wrong shared-prefix gradient
    # shows at that scale. Summation order alone moved one near-zero weight by 1.6e-5 on a Zen 4 EPYC.
    chex.assert_trees_all_close(shared.state.train.params, plain.state.train.params, rtol=1e-4, atol=1e-4)


def test_the_rl_config_keeps_prompt_group_size_for_the_trainer():
    from experiments.configs import default as default_config
    from jaxrl_vr.train.config import PipelineConfig, validate

    tree = default_config.get_config("smoke").to_dict()
    tree.setdefault("loss", {})["prompt_group_size"] = 4
    with pytest.raises(ValueError, match="the trainer's to set"):
        validate(PipelineConfig.from_dict(tree))


def test_shared_prefix_logprobs_equal_the_full_sequences():
    graphdef, params, rest = step_lib.split_model(_decoder(seed=5))
    batch = _grouped_batch(6)
    inputs = (batch.prompt_tokens_bs, batch.prompt_mask_bs, batch.tokens_bt, batch.mask_bt)
    full = step_lib.make_logprob_fn(graphdef, num_microbatches=2)(params, rest, *inputs, 0.7)
    shared = step_lib.make_logprob_fn(graphdef, num_microbatches=2, prompt_group_size=4)(
        params, rest, *inputs, 0.7)
    mask = np.asarray(batch.mask_bt)
    for a, b in zip(shared, full):
        np.testing.assert_allclose(np.where(mask, a, 0), np.where(mask, b, 0), rtol=1e-5, atol=1e-6)
