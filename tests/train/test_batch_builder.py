"""The batch builder: round + estimator + log-prob callables -> RolloutBatch (no model)."""

import jax.numpy as jnp
import numpy as np

from jaxrl_vr import estimators
from jaxrl_vr.train.batch import build_batch
from jaxrl_vr.train.metrics import rollout_metrics

from test_rounds import scripted


def _logprobs(value):
    def fn(prompt_tokens_bs, prompt_mask_bs, tokens_bt, mask_bt):
        return jnp.where(mask_bt, value, 0.0).astype(jnp.float32)

    return fn


def test_build_batch_repeats_prompts_zeroes_invalid_advantages_and_weights_anchored_kl():
    round_ = scripted(lambda p, g, c: float(g == 0))(np.array([3, 5]), 3)
    valid = round_.valid_pg.copy()
    valid[1, 2] = False
    from jaxrl_vr.train.rounds import invalidate

    round_ = invalidate(round_, valid)
    est = estimators.make_estimator("grpo")
    built = build_batch(round_, est, est.init(), behaviour_logprobs=_logprobs(-1.0),
                        reference_logprobs=_logprobs(-2.0), kl_weight_p=np.array([0.5, 0.0]))
    b = built.batch
    assert b.prompt_tokens_bs.shape == (6, 2)
    np.testing.assert_array_equal(np.asarray(b.prompt_tokens_bs[:, 0]), [3, 3, 3, 5, 5, 5])
    assert float(b.adv_b[5]) == 0.0 and not bool(b.mask_bt[5].any())
    np.testing.assert_allclose(np.asarray(b.kl_weight_b), [0.5] * 3 + [0.0] * 3)
    assert float(b.reference_logp_bt[0, 0]) == -2.0 and float(b.behaviour_logp_bt[0, 0]) == -1.0
    metrics = rollout_metrics(round_, built.adv_pg, built.behaviour_logp_bt)
    np.testing.assert_allclose(metrics["logp_gap_sampler_trainer"], 0.5)
    assert metrics["valid_sample_frac"] == 5 / 6
    # success = scores (g == 0): 2 of the 5 valid samples.
    np.testing.assert_allclose(metrics["pass_rate"], 2 / 5)


def test_build_batch_without_reference_reuses_behaviour_logprobs():
    round_ = scripted(lambda p, g, c: float(g == 0))(np.array([0, 1]), 2)
    est = estimators.make_estimator("curverl", num_prompts=2, window=2)
    built = build_batch(round_, est, est.init(), behaviour_logprobs=_logprobs(-1.0),
                        reference_logprobs=None)
    assert built.batch.reference_logp_bt is built.batch.behaviour_logp_bt
    assert float(np.asarray(built.batch.kl_weight_b).sum()) == 0.0
    state = built.estimator_state  # the window took this batch's two pass rates (0.5 each)
    assert int(state.num_updates) == 1
    np.testing.assert_allclose(np.asarray(state.window_p_wn)[np.asarray(state.window_valid_wn)],
                               [0.5, 0.5])


def test_detached_behaviour_skips_the_behaviour_forward():
    # loss.detach_behaviour: the loss uses its own detached forward as π_old, so the builder
    # computes no behaviour log-probs; the batch carries the sampler's, and no gap metric.
    round_ = scripted(lambda p, g, c: float(g == 0))(np.array([0, 1]), 2)
    est = estimators.make_estimator("grpo")

    built = build_batch(round_, est, est.init(), behaviour_logprobs=None,
                        reference_logprobs=None)
    np.testing.assert_allclose(np.asarray(built.batch.behaviour_logp_bt), round_.sampler_logp_bt)
    assert "logp_gap_sampler_trainer" not in rollout_metrics(round_, built.adv_pg, None)
