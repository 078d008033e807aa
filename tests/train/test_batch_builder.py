"""The batch builder: trajectory + estimator + log-prob callables -> advantages, log-probs (no model)."""

import jax.numpy as jnp
import numpy as np

from jaxrl_vr import estimators
from jaxrl_vr import trajectory as traj_lib
from jaxrl_vr.train.batch import build_batch, rollout_batch
from jaxrl_vr.train.metrics import rollout_metrics

from trajectory_testlib import scripted


def _logprobs(value):
    def fn(prompt_tokens_bs, prompt_mask_bs, tokens_bt, mask_bt):
        return jnp.where(mask_bt, value, 0.0).astype(jnp.float32)

    return fn


def test_build_batch_repeats_prompts_zeroes_invalid_advantages_and_weights_anchored_kl():
    sampled = scripted(lambda p, g, c: float(g == 0))(np.array([3, 5]), 3)
    valid = sampled.valid_pg.copy()
    valid[1, 2] = False
    traj = traj_lib.invalidate(sampled, valid)._replace(kl_weight_p=np.array([0.5, 0.0], np.float32))
    est = estimators.make_estimator("grpo")
    built, _ = build_batch(traj, est, est.init(), behaviour_logprobs=_logprobs(-1.0),
                           reference_logprobs=_logprobs(-2.0))
    b = rollout_batch(built)
    assert b.prompt_tokens_bs.shape == (6, 2)
    np.testing.assert_array_equal(np.asarray(b.prompt_tokens_bs[:, 0]), [3, 3, 3, 5, 5, 5])
    assert not np.asarray(b.adv_bt[5]).any() and not bool(b.loss_mask_bt[5].any())
    # The outcome advantage is broadcast to the sample's own tokens, 0 elsewhere.
    adv_pg = np.asarray(est.update(jnp.asarray(traj.per_group(traj.rewards_b)), jnp.asarray(valid),
                                   jnp.asarray(traj.per_group(traj.scores_b)), ())[0])
    np.testing.assert_allclose(np.asarray(b.adv_bt), np.where(
        traj.loss_mask_bt, np.where(valid, adv_pg, 0.0).reshape(-1)[:, None], 0.0), atol=1e-6)
    np.testing.assert_allclose(np.asarray(b.kl_weight_b), [0.5] * 3 + [0.0] * 3)
    assert float(b.reference_logp_bt[0, 0]) == -2.0 and float(b.behaviour_logp_bt[0, 0]) == -1.0
    metrics = rollout_metrics(built, sampled)
    np.testing.assert_allclose(metrics["logp_gap_sampler_trainer"], 0.5)
    assert metrics["valid_sample_frac"] == 5 / 6
    # success = scores (g == 0): 2 of the 6 sampled (2 of the 5 kept).
    np.testing.assert_allclose(metrics["pass_rate"], 2 / 6)
    np.testing.assert_allclose(metrics["kept/pass_rate"], 2 / 5)
    np.testing.assert_allclose(metrics["reward_terms/overlong"], -0.1, rtol=1e-6)


def test_environment_tokens_are_attended_but_get_no_advantage():
    traj = scripted(lambda p, g, c: float(g == 0))(np.array([0]), 2)
    loss_mask = traj.loss_mask_bt.copy()
    loss_mask[:, 1] = False  # token 1 written by a tool: in the context, not trained on
    traj = traj._replace(loss_mask_bt=loss_mask)
    est = estimators.make_estimator("loo")
    seen = {}

    def behaviour(prompt_tokens_bs, prompt_mask_bs, tokens_bt, mask_bt):
        seen["mask"] = np.asarray(mask_bt)
        return jnp.zeros(mask_bt.shape, jnp.float32)

    built, _ = build_batch(traj, est, est.init(), behaviour_logprobs=behaviour, reference_logprobs=None)
    np.testing.assert_array_equal(seen["mask"], traj.token_mask_bt)  # attention: every token
    assert not np.asarray(built.adv_bt)[:, 1].any() and np.asarray(built.adv_bt)[:, 0].any()


def test_build_batch_without_reference_reuses_behaviour_logprobs():
    traj = scripted(lambda p, g, c: float(g == 0))(np.array([0, 1]), 2)
    est = estimators.make_estimator("curverl", num_prompts=2, window=2)
    built, state = build_batch(traj, est, est.init(), behaviour_logprobs=_logprobs(-1.0),
                               reference_logprobs=None)
    assert built.reference_logp_bt is built.behaviour_logp_bt
    assert float(np.asarray(rollout_batch(built).kl_weight_b).sum()) == 0.0
    assert int(state.num_updates) == 1  # the window took this batch's two pass rates (0.5 each)
    np.testing.assert_allclose(np.asarray(state.window_p_wn)[np.asarray(state.window_valid_wn)],
                               [0.5, 0.5])


def test_paired_rows_reach_the_estimator():
    traj = scripted(lambda p, g, c: float(g == 0 if p == 0 else g != 0))(np.array([0, 1]), 4)
    est = estimators.make_estimator("pair_weighted", neg_weight=3.0)
    plain, _ = build_batch(traj, est, (), behaviour_logprobs=None, reference_logprobs=None)
    paired, _ = build_batch(traj._replace(paired_p=np.array([True, True])), est, (),
                            behaviour_logprobs=None, reference_logprobs=None)
    np.testing.assert_allclose(np.asarray(paired.adv_bt)[4:], 3.0 * np.asarray(plain.adv_bt)[4:], rtol=1e-5)


def test_detached_behaviour_skips_the_behaviour_forward():
    # loss.detach_behaviour: the loss uses its own detached forward as π_old, so the builder
    # computes no behaviour log-probs; the batch carries the sampler's, and no gap metric.
    traj = scripted(lambda p, g, c: float(g == 0))(np.array([0, 1]), 2)
    est = estimators.make_estimator("grpo")
    built, _ = build_batch(traj, est, est.init(), behaviour_logprobs=None, reference_logprobs=None)
    np.testing.assert_allclose(np.asarray(built.behaviour_logp_bt), traj.sampler_logp_bt)
    assert "logp_gap_sampler_trainer" not in rollout_metrics(built, traj, logprob_gap=False)
