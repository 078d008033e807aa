"""Train step: hand-computed loss/grad, micro-batch exactness, no recompilation, NaN guard."""

import math
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_vr.train import step as step_lib
from jaxrl_vr.train.optim import OptimConfig, learning_rate_schedule, make_optimizer

import trainer_testlib as lib


class TableModel(nnx.Module):
    """Position-independent policy: hidden = 1 (D = 1), logits = w for every position.

    log π(v) = w_v − logsumexp(w), so every expectation can be computed by hand.
    """

    def __init__(self, probs):
        self.w = nnx.Param(jnp.log(jnp.asarray(probs, jnp.float32))[None, :])  # [1, V]

    def hidden_states(self, tokens_bt, *, positions_bt=None, mask_bt=None):
        del positions_bt, mask_bt
        return jnp.ones(tokens_bt.shape + (1,), jnp.float32)

    def unembed_matrix(self):
        return self.w[...]


def _hand_batch():
    # p = (0.5, 0.25, 0.25). Response 0: tokens (1, 0), response 1: token 2 then padding.
    log = math.log
    return step_lib.RolloutBatch(
        prompt_tokens_bs=jnp.asarray([[1, 1], [0, 1]], jnp.int32),
        prompt_mask_bs=jnp.asarray([[True, True], [False, True]]),
        tokens_bt=jnp.asarray([[1, 0], [2, 0]], jnp.int32),
        mask_bt=jnp.asarray([[True, True], [True, False]]),
        loss_mask_bt=jnp.asarray([[True, True], [True, False]]),
        adv_bt=jnp.asarray([[1.0, 1.0], [-0.5, -0.5]], jnp.float32),
        # ratios: 0.25/0.2 = 1.25, 0.5/0.5 = 1, 0.25/0.25 = 1, (masked: garbage -inf)
        behaviour_logp_bt=jnp.asarray([[log(0.2), log(0.5)], [log(0.25), -jnp.inf]], jnp.float32),
        # reference differs only at (0, 0): log π_ref = log 0.5 vs log π = log 0.25
        reference_logp_bt=jnp.asarray([[log(0.5), log(0.5)], [log(0.25), jnp.nan]], jnp.float32),
        kl_weight_b=jnp.zeros(2, jnp.float32),
    )


def _hand_loss(aggregation, **hyper):
    model = TableModel([0.5, 0.25, 0.25])
    graphdef, params, rest = step_lib.split_model(model)
    cfg = step_lib.LossConfig(aggregation=aggregation, kl_beta=1.0)
    loss_fn = step_lib.make_eval_loss(graphdef, cfg)
    h = step_lib.StepHyper.create(eps_low=0.2, eps_high=0.2, **hyper)
    return loss_fn(params, rest, _hand_batch(), h, ())


def test_token_mean_loss_and_grad_match_hand_computation():
    loss, grads = _hand_loss("token_mean", kl_beta=0.0)
    # Token losses: (0,0) r=1.25 > 1.2 with A=+1 -> −min(1.25, 1.2) = −1.2 (clipped, no grad);
    # (0,1) r=1, A=+1 -> −1; (1,0) r=1, A=−0.5 -> +0.5. token_mean: (−1.2 − 1 + 0.5)/3.
    np.testing.assert_allclose(float(loss), (-1.2 - 1.0 + 0.5) / 3, rtol=1e-6)
    # ∂/∂w of −A·r·log π(y): −A·(e_y − p). Token 0 with A=1: −(0.5, −0.25, −0.25);
    # token 2 with A=−0.5: 0.5·(−0.5, −0.25, 0.75). Sum (−0.75, 0.125, 0.625) / 3 tokens.
    np.testing.assert_allclose(
        np.asarray(grads["w"][...])[0], [-0.25, 0.125 / 3, 0.625 / 3], rtol=1e-5, atol=1e-7
    )


def test_seq_mean_token_mean_and_k3_kl_match_hand_computation():
    loss, _ = _hand_loss("seq_mean_token_mean", kl_beta=0.1)
    policy = ((-1.2 - 1.0) / 2 + 0.5) / 2  # mean over responses of per-response token means
    # k3 at (0,0): d = log π_ref − log π = log 2 -> e^d − 1 − d = 1 − log 2; other tokens 0.
    # KL aggregated with kl_aggregation="token_mean" over the 3 valid tokens.
    kl = (1.0 - math.log(2.0)) / 3
    np.testing.assert_allclose(float(loss), policy + 0.1 * kl, rtol=1e-5)


def test_dual_clip_caps_negative_advantage_loss():
    model = TableModel([0.5, 0.25, 0.25])
    graphdef, params, rest = step_lib.split_model(model)
    batch = _hand_batch()._replace(
        adv_bt=jnp.full((2, 2), -1.0, jnp.float32),
        behaviour_logp_bt=jnp.log(jnp.asarray([[0.05, 0.5], [0.25, 1.0]], jnp.float32)),
    )
    cfg = step_lib.LossConfig(dual_clip=3.0)
    loss, _ = step_lib.make_eval_loss(graphdef, cfg)(
        params, rest, batch, step_lib.StepHyper.create(eps_low=0.2, eps_high=0.2, dual_clip=3.0), ()
    )
    # (0,0): r = 0.25/0.05 = 5, A = −1: PPO loss = 5 > c·|A| = 3 -> capped at 3.
    # (0,1): r = 1 -> 1. (1,0): r = 1 -> 1. token_mean = (3 + 1 + 1)/3.
    np.testing.assert_allclose(float(loss), 5.0 / 3, rtol=1e-6)


CASES = [
    ("token", "token_mean", "none"),
    ("sequence", "seq_mean", "bonus"),
    ("gspo_token", "seq_mean_token_mean", "none"),
    ("token", "seq_mean_token_sum_norm", "bonus"),
]


@pytest.mark.parametrize("ratio,aggregation,entropy", CASES)
def test_microbatched_loss_and_grads_equal_full_batch(ratio, aggregation, entropy):
    # The real Decoder for one case, the cheap causal model for the others (compile time).
    model = lib.tiny_decoder() if ratio == "gspo_token" else lib.CausalBagModel()
    graphdef, params, rest = step_lib.split_model(model)
    batch = lib.random_batch(1)
    hyper = step_lib.StepHyper.create(kl_beta=0.2, entropy_coef=0.05, eps_low=0.1, eps_high=0.1)
    # Move the policy off the behaviour so clipping is active in some tokens.
    params = jax.tree.map(lambda p: p * 1.5, params)
    results = []
    for num in (1, 4):
        cfg = step_lib.LossConfig(
            ratio=ratio,
            aggregation=aggregation,
            kl_beta=1.0,
            entropy=entropy,
            dual_clip=3.0,
            num_microbatches=num,
        )
        results.append(step_lib.make_eval_loss(graphdef, cfg)(params, rest, batch, hyper, ()))
    (loss1, grads1), (loss4, grads4) = results
    assert np.isfinite(float(loss1)) and abs(float(loss1)) > 1e-4
    np.testing.assert_allclose(float(loss4), float(loss1), rtol=1e-5, atol=1e-7)
    chex.assert_trees_all_close(grads4, grads1, rtol=1e-4, atol=1e-6)


def test_masked_positions_do_not_change_loss_or_grads():
    graphdef, params, rest = step_lib.split_model(lib.CausalBagModel())
    batch = lib.random_batch(2)
    garbage = batch._replace(
        behaviour_logp_bt=jnp.where(batch.mask_bt, batch.behaviour_logp_bt, jnp.inf),
        reference_logp_bt=jnp.where(batch.mask_bt, batch.reference_logp_bt, -jnp.inf),
        tokens_bt=jnp.where(batch.mask_bt, batch.tokens_bt, 11),
    )
    cfg = step_lib.LossConfig(kl_beta=1.0, aggregation="seq_mean_token_mean")
    fn = step_lib.make_eval_loss(graphdef, cfg)
    hyper = step_lib.StepHyper.create(kl_beta=0.1)
    loss_a, grads_a = fn(params, rest, batch, hyper, ())
    loss_b, grads_b = fn(params, rest, garbage, hyper, ())
    np.testing.assert_allclose(float(loss_b), float(loss_a), rtol=1e-6)
    chex.assert_trees_all_close(grads_b, grads_a, rtol=1e-5, atol=1e-7)


def _step_setup(num_microbatches=1, entropy="none", model=None):
    graphdef, params, rest = step_lib.split_model(model or lib.CausalBagModel())
    optimizer = make_optimizer(OptimConfig(learning_rate=1e-2, warmup_steps=2))
    cfg = step_lib.LossConfig(num_microbatches=num_microbatches, kl_beta=1.0, entropy=entropy)
    state = step_lib.init_train_state(params, optimizer, cfg)
    return step_lib.make_train_step(graphdef, rest, optimizer, cfg), state


def test_train_step_is_traced_once_for_new_hyperparameters_and_data():
    train_step, state = _step_setup()
    state, m1 = train_step(state, lib.random_batch(3), step_lib.StepHyper.create(kl_beta=0.1))
    new_hyper = step_lib.StepHyper.create(kl_beta=0.5, eps_low=0.1, eps_high=0.3, entropy_coef=0.2)
    state, m2 = train_step(state, lib.random_batch(4), new_hyper)
    assert train_step.jitted._cache_size() == 1
    assert int(state.step) == 2
    # Warm-up is a schedule of the optimizer count: lr was 0 then peak/2.
    np.testing.assert_allclose(
        [float(m1["learning_rate"]), float(m2["learning_rate"])], [0.0, 5e-3], rtol=1e-6
    )


def test_train_step_microbatched_update_equals_full_batch_update():
    batch = lib.random_batch(5)
    hyper = step_lib.StepHyper.create(kl_beta=0.1)
    outs = []
    for num in (1, 2):
        train_step, state = _step_setup(num, model=lib.tiny_decoder())
        state, _ = train_step(state, batch, hyper)
        state, metrics = train_step(state, batch, hyper)  # second step: lr > 0 after warm-up
        outs.append((state.params, metrics))
    # Adam divides each gradient coordinate by its own running RMS, so for a coordinate whose
    # gradient is ~0 float32 summation-order noise becomes a visible fraction of an lr-sized
    # step (seen on an AVX-512 Xeon: 1.7e-6 on one of 512 weights). 1e-5 is 0.2 % of the
    # 5e-3 step; the gradient itself is compared through its norm below.
    chex.assert_trees_all_close(outs[1][0], outs[0][0], rtol=1e-5, atol=1e-5)
    for key in ("loss", "kl", "entropy", "clip_frac_high", "trained_tokens", "grad_norm"):
        np.testing.assert_allclose(
            float(outs[1][1][key]), float(outs[0][1][key]), rtol=1e-5, atol=1e-7
        )


def _widening_sgd():
    """SGD whose state is a bfloat16 step count that each update returns as float32."""
    import optax

    def init(params):
        del params
        return jnp.zeros((), jnp.bfloat16)

    def update(updates, count, params=None):
        del params
        return jax.tree.map(lambda g: -0.1 * g, updates), count.astype(jnp.float32) + 1

    return optax.GradientTransformation(init, update)


@pytest.mark.parametrize("finite", [True, False])
def test_guarded_update_casts_the_kept_state_to_the_updated_dtypes(finite):
    # A cond's branches must agree in type: without the cast, tracing this update fails.
    params = {"w": jnp.ones(3, jnp.float32)}
    optimizer = _widening_sgd()
    grads = {"w": jnp.full(3, 2.0, jnp.float32)}
    for guard in (step_lib.guarded_optimizer_update, jax.jit(step_lib.guarded_optimizer_update,
                                                             static_argnums=0)):
        new_params, new_count = guard(optimizer, jnp.asarray(finite), grads, params, optimizer.init(params))
        assert new_count.dtype == jnp.float32
        if finite:
            np.testing.assert_allclose(np.asarray(new_params["w"]), 0.8)
            assert float(new_count) == 1.0
        else:
            np.testing.assert_array_equal(np.asarray(new_params["w"]), 1.0)
            assert float(new_count) == 0.0


def test_guarded_update_names_a_state_whose_shape_the_update_changes():
    import optax

    growing = optax.GradientTransformation(lambda params: jnp.zeros(1),
                                           lambda u, s, params=None: (u, jnp.zeros(2)))
    params = {"w": jnp.ones(3)}
    with pytest.raises(ValueError, match=r"changed the shape of .* from \(1,\) to \(2,\)"):
        step_lib.guarded_optimizer_update(growing, jnp.asarray(True), params, params, growing.init(params))


def test_nonfinite_loss_leaves_state_unchanged_and_is_flagged():
    train_step, state = _step_setup()
    batch = lib.random_batch(6)
    bad = batch._replace(adv_bt=batch.adv_bt.at[3].set(jnp.nan))
    new_state, metrics = train_step(state, bad, step_lib.StepHyper.create())
    assert float(metrics["nonfinite"]) == 1.0
    chex.assert_trees_all_equal(new_state.params, state.params)
    chex.assert_trees_all_equal(new_state.opt_state, state.opt_state)
    assert int(new_state.step) == 0
    # The guard skips the update, not the run: the next finite batch trains as usual.
    after, metrics = train_step(new_state, batch, step_lib.StepHyper.create())
    assert float(metrics["nonfinite"]) == 0.0 and int(after.step) == 1
    moved = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(after.opt_state),
                                                      jax.tree.leaves(state.opt_state))]
    assert any(moved)


def _copied_entry_parameters(hlo_text: str) -> list[str]:
    """Entry parameters of a compiled module that the module copies whole (rank >= 2)."""
    entry = hlo_text[hlo_text.index("\nENTRY"):]
    names = set(re.findall(r"%?([\w.\-]+): f32\[\d+,[\d,]*\]", entry.split("\n", 2)[1]))
    return sorted(name for name in re.findall(r" copy\(%([\w.\-]+)\)", hlo_text) if name in names)


@pytest.mark.parametrize("group", [1, 2])
def test_a_donated_step_updates_the_adam_moments_in_place(group):
    """The NaN guard is a cond around the optimizer update: a select between the new and the
    old state made XLA copy every AdamW moment (2x the parameters) at the start of the step."""
    graphdef, params, rest = step_lib.split_model(lib.tiny_decoder())
    optimizer = make_optimizer(OptimConfig(learning_rate=1e-2))
    cfg = step_lib.LossConfig(num_microbatches=2, prompt_group_size=group)
    state = step_lib.init_train_state(params, optimizer, cfg)
    train_step = step_lib.make_train_step(graphdef, rest, optimizer, cfg, donate=True)
    batch = lib.random_batch(0)
    rows = np.arange(batch.adv_bt.shape[0]) // group * group  # each group's rows share its first prompt
    batch = batch._replace(prompt_tokens_bs=batch.prompt_tokens_bs[rows], prompt_mask_bs=batch.prompt_mask_bs[rows])
    hlo = train_step.jitted.lower(state, batch, step_lib.StepHyper.create(), rest).compile().as_text()
    assert _copied_entry_parameters(hlo) == []


def test_runtime_zero_is_zero_and_not_a_constant():
    assert float(step_lib.runtime_zero(jnp.float32(37.0))) == 0.0
    jaxpr = jax.make_jaxpr(lambda d: jnp.full((2, 3), step_lib.runtime_zero(d)))(jnp.float32(5.0))
    assert "mul" in str(jaxpr)  # computed from the anchor, so XLA cannot merge it with constant zeros


def test_entropy_feedback_controller_widens_upper_clip_when_entropy_is_low():
    train_step, state = _step_setup(entropy="feedback")
    hyper = step_lib.StepHyper.create(
        eps_high=0.2, entropy_target=10.0, entropy_step_size=0.05, entropy_k_max=0.08
    )
    ks = []
    for seed in range(3):
        state, metrics = train_step(state, lib.random_batch(seed), hyper)
        ks.append(float(state.controller.k))
    # Entropy (<= log 12) is below the 10-nat target: k rises by δ and saturates at k_max.
    np.testing.assert_allclose(ks, [0.05, 0.08, 0.08], rtol=1e-6)
    # Upper clip 1 + ε_high·(1 + k), so ε_high in force = 0.2·(1 + k) (k = 0.08 before step 3).
    np.testing.assert_allclose(float(metrics["eps_high"]), 0.2 * (1 + 0.08), rtol=1e-6)


def test_entropy_feedback_controller_is_neutral_at_k_zero():
    # Switching the controller on changes nothing until it acts: at k = 0 the loss equals
    # the plain clipped loss (issue: an on/off ablation must change one thing).
    graphdef, params, rest = step_lib.split_model(lib.CausalBagModel())
    params = jax.tree.map(lambda p: p * 1.5, params)  # off-policy so the upper clip binds
    batch, hyper = lib.random_batch(9), step_lib.StepHyper.create(eps_low=0.1, eps_high=0.1)
    from jaxrl_vr import entropy as entropy_lib

    plain = step_lib.make_eval_loss(graphdef, step_lib.LossConfig())(params, rest, batch, hyper, ())
    fed = step_lib.make_eval_loss(graphdef, step_lib.LossConfig(entropy="feedback"))(
        params, rest, batch, hyper, entropy_lib.entropy_controller_init())
    np.testing.assert_allclose(float(fed[0]), float(plain[0]), rtol=1e-6)


def test_pba_anchored_kl_is_averaged_over_all_response_tokens():
    # PBA, arXiv 2607.20543 Eq. 4: KL term = λ·Σ_anchored KL / (all response tokens).
    # Only response 0 is anchored (λ = 2); its KL is at (0, 0): k3 = 1 − log 2. Response 1's
    # token counts in the denominator (3 tokens), not only the anchored response's 2.
    model = TableModel([0.5, 0.25, 0.25])
    graphdef, params, rest = step_lib.split_model(model)
    batch = _hand_batch()._replace(
        kl_weight_b=jnp.asarray([2.0, 0.0], jnp.float32),
        reference_logp_bt=jnp.asarray([[math.log(0.5), math.log(0.5)], [math.log(0.5), 0.0]],
                                      jnp.float32))
    hyper = step_lib.StepHyper.create(eps_low=0.2, eps_high=0.2, kl_beta=0.0)
    fn = step_lib.make_eval_loss(graphdef, step_lib.LossConfig(kl_beta=1.0))
    loss, _ = fn(params, rest, batch, hyper, ())
    policy = (-1.2 - 1.0 + 0.5) / 3
    np.testing.assert_allclose(float(loss), policy + 2.0 * (1.0 - math.log(2.0)) / 3, rtol=1e-5)
    # The same anchored response alone in its batch: its KL share is 1/2 of its tokens, so
    # the effective λ does not depend on what else is in the batch only through the count.
    # A global β adds β·mean KL over all tokens (response 1's token has KL too).
    loss_beta, _ = fn(params, rest, batch, hyper._replace(kl_beta=jnp.float32(0.5)), ())
    k3_resp1 = 0.5 / 0.25 - 1 - math.log(0.5 / 0.25)  # log π_ref − log π = log 2 at (1, 0)
    expected = policy + (2.0 * (1 - math.log(2)) + 0.5 * ((1 - math.log(2)) + k3_resp1)) / 3
    np.testing.assert_allclose(float(loss_beta), expected, rtol=1e-5)


def test_pba_kl_metric_over_all_tokens_is_zero_when_policy_equals_reference():
    graphdef, params, rest = step_lib.split_model(lib.CausalBagModel())
    batch = lib.random_batch(10)
    logp_bt, _ = step_lib.make_logprob_fn(graphdef)(
        params, rest, batch.prompt_tokens_bs, batch.prompt_mask_bs, batch.tokens_bt, batch.mask_bt)
    batch = batch._replace(behaviour_logp_bt=logp_bt, reference_logp_bt=logp_bt)
    train_step, state = _step_setup()
    _, metrics = train_step(state._replace(params=params), batch, step_lib.StepHyper.create())
    assert abs(float(metrics["kl"])) < 1e-6 and abs(float(metrics["kl_token_mean"])) < 1e-6


def test_training_logprobs_use_the_sampling_temperature():
    model = TableModel([0.5, 0.25, 0.25])
    graphdef, params, rest = step_lib.split_model(model)
    batch = _hand_batch()
    fn = step_lib.make_logprob_fn(graphdef)
    args = (params, rest, batch.prompt_tokens_bs, batch.prompt_mask_bs, batch.tokens_bt,
            batch.mask_bt)
    logp_t1, _ = fn(*args)
    logp_t2, _ = fn(*args, 2.0)
    logits = np.log([0.5, 0.25, 0.25]) / 2.0
    expected = logits - np.log(np.exp(logits).sum())
    np.testing.assert_allclose(np.asarray(logp_t2)[0, 0], expected[1], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(logp_t1)[0, 0], math.log(0.25), rtol=1e-5)


def test_loss_config_values_build_the_step_hyper_and_gspo_has_its_own_clip_scale():
    token = step_lib.LossConfig()
    assert token.clip_eps == (0.2, 0.28)
    seq = step_lib.LossConfig(ratio="sequence")
    assert seq.clip_eps == (3e-4, 4e-4)  # GSPO's sequence-ratio scale (arXiv 2507.18071)
    hyper = step_lib.LossConfig(ratio="sequence", eps_high=1e-3, kl_beta=0.05,
                                dual_clip=3.0).hyper(temperature=0.7)
    np.testing.assert_allclose(
        [float(hyper.eps_low), float(hyper.eps_high), float(hyper.kl_beta),
         float(hyper.dual_clip), float(hyper.temperature)], [3e-4, 1e-3, 0.05, 3.0, 0.7], rtol=1e-6)
    # Values never enter the compiled structure.
    a = step_lib.LossConfig(kl_beta=0.05, eps_low=0.1).structure()
    b = step_lib.LossConfig(kl_beta=0.5, eps_low=0.3).structure()
    assert a == b and hash(a) == hash(b)
    assert step_lib.LossConfig().structure(kl_term=True).use_kl
    with pytest.raises(ValueError, match="dual_clip"):
        step_lib.LossConfig(dual_clip=0.5)


def test_loss_config_rejects_unknown_modes():
    with pytest.raises(ValueError, match="ratio"):
        step_lib.LossConfig(ratio="tokn")
    with pytest.raises(ValueError, match="aggregation"):
        step_lib.LossConfig(aggregation="mean")


def test_cosine_schedule_warms_up_then_decays():
    schedule = learning_rate_schedule(
        OptimConfig(
            learning_rate=1.0, warmup_steps=2, schedule="cosine", decay_steps=6, end_lr_ratio=0.1
        )
    )
    # Linear warm-up 0 -> 1 over 2 steps, then cosine from 1 to 0.1 over 4 steps.
    values = [float(schedule(i)) for i in (0, 1, 2, 4, 6)]
    np.testing.assert_allclose(values, [0.0, 0.5, 1.0, 0.1 + 0.9 * 0.5, 0.1], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="decay_steps"):
        learning_rate_schedule(OptimConfig(schedule="cosine", warmup_steps=3, decay_steps=2))


def test_data_parallel_step_on_a_mesh_equals_single_device_step():
    from jaxrl_vr import parallel

    mesh = parallel.make_mesh(data=jax.device_count())
    batch = lib.random_batch(7, batch=jax.device_count() * 2)
    hyper = step_lib.StepHyper.create(kl_beta=0.1)
    train_step, state = _step_setup(2)
    plain_state, plain_metrics = train_step(state, batch, hyper)
    sharded_state, sharded_metrics = train_step(
        jax.device_put(state, parallel.replicated(mesh)), parallel.shard_batch(batch, mesh), hyper
    )
    assert len(sharded_metrics["loss"].sharding.device_set) == jax.device_count()
    chex.assert_trees_all_close(sharded_state.params, plain_state.params, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        float(sharded_metrics["loss"]), float(plain_metrics["loss"]), rtol=1e-5
    )


def test_detached_behaviour_equals_recomputed_behaviour_on_policy():
    graphdef, params, rest = step_lib.split_model(lib.CausalBagModel())
    batch = lib.random_batch(8)
    logp_bt, _ = step_lib.make_logprob_fn(graphdef)(
        params, rest, batch.prompt_tokens_bs, batch.prompt_mask_bs, batch.tokens_bt,
        batch.mask_bt)
    on_policy = batch._replace(behaviour_logp_bt=logp_bt)
    hyper = step_lib.StepHyper.create(kl_beta=0.1)
    results = []
    for detach in (False, True):
        cfg = step_lib.LossConfig(detach_behaviour=detach, kl_beta=1.0, num_microbatches=2)
        results.append(step_lib.make_eval_loss(graphdef, cfg)(params, rest, on_policy, hyper, ()))
    np.testing.assert_allclose(float(results[1][0]), float(results[0][0]), rtol=1e-6)
    chex.assert_trees_all_close(results[1][1], results[0][1], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("tied", [True, False])
def test_the_step_forms_a_tied_unembedding_once_with_the_same_gradient(tied):
    """`step_tables` hoists a tied model's unembedding (embed.T) out of the micro-batch loop;
    the gradient must equal differentiating each micro-batch through embed.T itself."""
    import dataclasses

    from jaxrl_vr.models import Decoder

    model = lib.tiny_decoder()
    if not tied:
        model = Decoder(dataclasses.replace(model.config, tie_word_embeddings=False), rngs=nnx.Rngs(1))
    graphdef, params, rest = step_lib.split_model(model)
    batch = lib.random_batch(4)
    cfg = step_lib.LossConfig(kl_beta=0.5, entropy="bonus", num_microbatches=2)
    hyper = step_lib.StepHyper.create(kl_beta=0.5, entropy_coef=0.05, temperature=0.7)
    assert ("unembed" in step_lib.step_tables(model, batch, cfg)) == tied

    loss, grads = step_lib.make_eval_loss(graphdef, cfg)(params, rest, batch, hyper, ())
    objective = step_lib.make_loss_fn(graphdef, cfg)  # no tables: the model's own unembed_matrix()
    dens = step_lib.loss_denominators(batch, cfg)

    def plain(p):
        halves = step_lib._split_microbatches(batch, 2)
        return sum(objective(p, rest, jax.tree.map(lambda x: x[m], halves), hyper, (), dens)[0] for m in range(2))

    # The reference is compiled: differentiated op by op it took 16 s more than the step itself.
    plain_loss, plain_grads = jax.jit(jax.value_and_grad(plain))(params)
    np.testing.assert_allclose(float(loss), float(plain_loss), rtol=1e-6)
    chex.assert_trees_all_close(grads, plain_grads, rtol=1e-5, atol=1e-7)
    assert float(jnp.abs(grads["embed"][...]).sum()) > 0


def test_environment_tokens_are_attended_to_but_never_trained_on():
    """Tokens with loss mask 0 (written by a tool) add nothing to the loss, the KL, the entropy
    or the token count, whatever their advantages and log-probs say; the policy still attends
    to them, so they move the log-probs of the tokens after them (SPEC §6b)."""
    model = lib.tiny_decoder()
    graphdef, params, rest = step_lib.split_model(model)
    cfg = step_lib.LossConfig(kl_beta=0.1, entropy="bonus", entropy_coef=0.01)
    loss_fn = step_lib.make_eval_loss(graphdef, cfg)
    hyper = step_lib.StepHyper.create(kl_beta=0.1, entropy_coef=0.01)
    batch = lib.random_batch(4)
    batch = batch._replace(mask_bt=jnp.ones_like(batch.mask_bt), loss_mask_bt=jnp.ones_like(batch.mask_bt))
    tool = batch.loss_mask_bt.at[:, 1].set(False)  # token 1 of every row came from a tool
    with_tool = batch._replace(loss_mask_bt=tool)
    loss, grads = loss_fn(params, rest, with_tool, hyper, ())
    garbage = with_tool._replace(adv_bt=with_tool.adv_bt.at[:, 1].set(1e6),
                                 behaviour_logp_bt=with_tool.behaviour_logp_bt.at[:, 1].set(-1e6),
                                 reference_logp_bt=with_tool.reference_logp_bt.at[:, 1].set(1e6))
    loss_g, grads_g = loss_fn(params, rest, garbage, hyper, ())
    np.testing.assert_allclose(float(loss_g), float(loss), rtol=1e-6)
    chex.assert_trees_all_close(grads_g, grads, rtol=1e-5, atol=1e-7)
    assert float(step_lib.loss_denominators(with_tool, cfg)[0]) == float(tool.sum())
    # The tool token is part of the context: changing it changes the later tokens' log-probs.
    inputs = (batch.prompt_tokens_bs, batch.prompt_mask_bs)
    logp = step_lib.response_logprobs(model, *inputs, batch.tokens_bt, batch.mask_bt)[0]
    other = batch.tokens_bt.at[:, 1].set((batch.tokens_bt[:, 1] + 1) % 12)
    logp_other = step_lib.response_logprobs(model, *inputs, other, batch.mask_bt)[0]
    assert not np.allclose(np.asarray(logp)[:, 2:], np.asarray(logp_other)[:, 2:])
