"""Advantage estimators as (init, update) pairs: one registry, one signature."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_vr import advantages, estimators, passk

REWARDS = jnp.asarray([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0]], jnp.float32)
VALID = jnp.asarray([[True, True, True, True], [True, True, True, False]])


@pytest.mark.parametrize("name,reference", [
    ("grpo", lambda r, v: advantages.grpo(r, v)),
    ("dr_grpo", lambda r, v: advantages.grpo(r, v, scale="none")),
    ("loo", lambda r, v: advantages.loo(r, v)),
    ("reinforce", lambda r, v: advantages.reinforce(r, v)),
    ("maxrl", lambda r, v: advantages.maxrl(r, v, success_pg=r)),
])
def test_stateless_estimators_call_their_formula_with_empty_state(name, reference):
    est = estimators.make_estimator(name)
    state = est.init()
    assert state == ()
    adv, new_state = est.update(REWARDS, VALID, REWARDS, state)
    assert new_state == ()
    np.testing.assert_allclose(np.asarray(adv), np.asarray(reference(REWARDS, VALID)), atol=1e-6)


def test_maxrl_gives_shaping_a_plain_baseline_through_the_registry():
    # success [0,0,0,0], rewards [−1,0,0,0] (an overlong penalty): nothing huge.
    est = estimators.make_estimator("maxrl")
    adv, _ = est.update(jnp.asarray([[-1.0, 0, 0, 0]]), jnp.ones((1, 4), bool),
                        jnp.zeros((1, 4)), ())
    np.testing.assert_allclose(np.asarray(adv), [[-0.75, 0.25, 0.25, 0.25]], atol=1e-6)


def test_curverl_state_is_its_lagged_window_and_the_update_jits():
    est = estimators.make_estimator("curverl", num_prompts=2, window=3)
    state = est.init()
    adv_eager, s1 = est.update(REWARDS, VALID, REWARDS, state)
    adv_jit, s1_jit = jax.jit(est.update)(REWARDS, VALID, REWARDS, state)
    np.testing.assert_allclose(np.asarray(adv_eager), np.asarray(adv_jit), atol=1e-6)
    chex.assert_trees_all_close(s1, s1_jit)
    ref, _ = advantages.curverl(REWARDS, state, VALID, success_pg=REWARDS)
    np.testing.assert_allclose(np.asarray(adv_eager), np.asarray(ref), atol=1e-6)
    assert int(np.asarray(s1.window_valid_wn).sum()) > int(np.asarray(state.window_valid_wn).sum())


def test_pair_weighted_uses_group_normalisation_then_the_pair_weights():
    # Pair 0: q+ with a lone success among 8, q− with a lone failure among 8; then one
    # unpaired data-order row.
    q_pos = [1.0] + [0.0] * 7
    q_neg = [0.0] + [1.0] * 7
    extra = [1.0, 0.0] * 4
    scores = jnp.asarray([q_pos, q_neg, extra], jnp.float32)
    valid = jnp.ones(scores.shape, bool)
    paired = jnp.asarray([True, True, False])
    est = estimators.make_estimator("pair_weighted", neg_weight=2.0)
    adv, _ = est.update(scores, valid, scores, (), paired_p=paired)
    lone = 7 / 8 / np.sqrt((7 / 64 * 8) / 7)  # (1 − 1/8) / std with K − 1 = +2.4749
    np.testing.assert_allclose(float(adv[0, 0]), lone, rtol=1e-5)
    np.testing.assert_allclose(float(adv[1, 0]), -2.0 * lone, rtol=1e-5)  # λ scales q− rows
    np.testing.assert_allclose(np.asarray(adv[2]), np.asarray(advantages.grpo(scores[2:]))[0],
                               rtol=1e-6)
    adv_one, _ = estimators.make_estimator("pair_weighted", neg_weight=1.0).update(
        scores, valid, scores, (), paired_p=paired)
    assert not np.allclose(np.asarray(adv_one[1]), np.asarray(adv[1]))  # λ changes the update
    np.testing.assert_allclose(np.asarray(adv_one[0]), np.asarray(adv[0]))
    # The pair rows are data: one compiled update for any layout; no pairs = GRPO everywhere.
    adv_jit, _ = jax.jit(est.update)(scores, valid, scores, (), paired_p=paired)
    np.testing.assert_allclose(np.asarray(adv_jit), np.asarray(adv), rtol=1e-6)
    adv_none, _ = est.update(scores, valid, scores, (), paired_p=jnp.zeros(3, bool))
    np.testing.assert_allclose(np.asarray(adv_none), np.asarray(advantages.grpo(scores, valid)), rtol=1e-6)


def test_pair_weighted_at_unit_weights_is_grpo_on_binary_rewards():
    # λ_neg = λ_pos = 1, group scope: every row, paired or not, gets GRPO's z-score, so a
    # pairing run with the default weights trains pairing's prompts with plain GRPO.
    rng = np.random.default_rng(0)
    scores = jnp.asarray(rng.integers(0, 2, (6, 8)), jnp.float32)
    valid = jnp.asarray(rng.random((6, 8)) < 0.9)
    adv, _ = estimators.make_estimator("pair_weighted").update(
        scores, valid, scores, (), paired_p=jnp.asarray([True] * 4 + [False] * 2))
    np.testing.assert_allclose(np.asarray(adv), np.asarray(advantages.grpo(scores, valid)), rtol=1e-6, atol=1e-7)


def test_unknown_estimator_names_the_registered_ones():
    with pytest.raises(ValueError, match="registered"):
        estimators.make_estimator("grpoo")


@dataclasses.dataclass(frozen=True)
class ScaledLooSettings:
    scale: float = 0.5


def test_adding_an_estimator_is_one_function_one_settings_dataclass_one_registry_line(monkeypatch):
    def scaled_loo(settings, context):
        return estimators.stateless(lambda r, v, s: settings.scale * advantages.loo(r, v))

    monkeypatch.setitem(estimators.ESTIMATORS, "scaled_loo", estimators.Entry(scaled_loo, ScaledLooSettings))
    for kwargs, scale in (({}, 0.5), ({"scale": 3.0}, 3.0)):
        adv, _ = estimators.make_estimator("scaled_loo", **kwargs).update(REWARDS, VALID, REWARDS, ())
        np.testing.assert_allclose(np.asarray(adv), scale * np.asarray(advantages.loo(REWARDS, VALID)))
    with pytest.raises(TypeError, match="scal"):
        estimators.make_estimator("scaled_loo", scal=2.0)


@pytest.mark.parametrize("name,expected", [("grpo", True), ("loo", True), ("curverl", True),
                                           ("maxrl", True), ("pair_weighted", True),
                                           ("passk_training", True)])
def test_needs_groups_is_measured_not_listed(name, expected):
    assert estimators.needs_groups(name) is expected


def test_needs_groups_of_an_estimator_without_a_baseline(monkeypatch):
    monkeypatch.setitem(estimators.ESTIMATORS, "raw", lambda settings, context: estimators.stateless(
        lambda r, v, s: r))
    assert estimators.needs_groups("raw") is False


def test_curverl_reports_its_window_fill():
    est = estimators.make_estimator("curverl", num_prompts=2, window=4)
    state = est.init()
    assert est.diagnostics(state) == {"window_fill": 0.0}
    _, state = est.update(REWARDS, VALID, REWARDS, state)
    assert 0.0 < est.diagnostics(state)["window_fill"] <= 1.0
    assert estimators.make_estimator("grpo").diagnostics(()) == {}


# ------------------------------------------------------------------ pass@k objectives

PASSK_REWARDS = jnp.asarray([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0], [1.0, 1.0, 0.0, 9.0]])
PASSK_VALID = jnp.asarray([[True] * 4, [True] * 4, [True, True, True, False]])


@pytest.mark.parametrize("name,reference", [
    ("pkpo", lambda r, v, k: passk.pkpo(r, v, k=k, success_pg=r)),
    ("passk_training", lambda r, v, k: passk.passk_training(r, v, k=k, success_pg=r)),
])
def test_passk_estimators_call_their_formula_eager_and_jitted(name, reference):
    est = estimators.make_estimator(name, k=2)
    state = est.init()
    adv, new_state = est.update(PASSK_REWARDS, PASSK_VALID, PASSK_REWARDS, state)
    adv_jit, state_jit = jax.jit(est.update)(PASSK_REWARDS, PASSK_VALID, PASSK_REWARDS, state)
    expected = np.asarray(reference(PASSK_REWARDS, PASSK_VALID, 2))
    np.testing.assert_allclose(np.asarray(adv), expected, atol=1e-6)
    np.testing.assert_allclose(np.asarray(adv_jit), expected, atol=1e-6)
    assert int(new_state.step) == int(state_jit.step) == 1
    assert np.any(expected != 0.0) and np.all(expected[2, 3] == 0.0)
    assert est.diagnostics(new_state) == {"k": 2.0}


def test_passk_estimators_at_k1_are_reinforce_over_g_and_grpo_with_population_std():
    r = np.asarray(PASSK_REWARDS[:2])
    pkpo = estimators.make_estimator("pkpo", k=1)
    adv, _ = pkpo.update(r, jnp.ones(r.shape, bool), r, pkpo.init())
    # k = 1: REINFORCE without a baseline (advantages.reinforce(baseline="none")) over n = 4.
    np.testing.assert_allclose(np.asarray(adv), np.asarray(advantages.reinforce(r, baseline="none")) / 4, atol=1e-7)
    training = estimators.make_estimator("passk_training", k=1)
    adv, _ = training.update(r, jnp.ones(r.shape, bool), r, training.init())
    np.testing.assert_allclose(np.asarray(adv), (r - r.mean(1, keepdims=True)) / r.std(1, keepdims=True),
                               rtol=1e-5)


def test_k_anneals_over_the_state_clock_without_recompiling():
    # k = 4 -> 1 over 3 batches: 4 + round(-3·t/3) = 4, 3, 2, 1, then 1.
    est = estimators.make_estimator("pkpo", k=4, k_end=1, anneal_steps=3)
    update = jax.jit(est.update)
    state, seen = est.init(), []
    rewards = jnp.asarray([[0.1, 0.4, 0.2, 0.8]])
    for expected_k in (4, 3, 2, 1, 1):
        adv, state = update(rewards, jnp.ones((1, 4), bool), rewards, state)
        seen.append(est.diagnostics(state)["k"])
        np.testing.assert_allclose(np.asarray(adv), np.asarray(passk.pkpo(rewards, k=expected_k)), atol=1e-6)
    assert seen == [4.0, 3.0, 2.0, 1.0, 1.0]
    assert update._cache_size() == 1
    np.testing.assert_array_equal([int(passk.annealed_k(t, k=2, k_end=8, anneal_steps=4)) for t in range(6)],
                                  [2, 4, 5, 7, 8, 8])  # 2 + round(1.5·t), halves up


def test_passk_settings_reject_what_cannot_work():
    with pytest.raises(ValueError, match="anneal_steps"):
        estimators.make_estimator("pkpo", k=4, k_end=1)
    with pytest.raises(ValueError, match="k and k_end"):
        estimators.make_estimator("passk_training", k=0)
    with pytest.raises(ValueError, match="baseline"):
        estimators.make_estimator("pkpo", baseline="loo")


def test_passk_k_above_the_group_size_is_a_config_error_naming_the_fix():
    from jaxrl_vr.train.config import PipelineConfig, validate

    def cfg(name, **settings):
        return PipelineConfig.from_dict({"rl": {"samples_per_prompt": 4, "estimator": {"name": name, **settings}}})

    with pytest.raises(ValueError, match=r"rl.estimator.k = 8 exceeds rl.samples_per_prompt=4.*lower it to <= 4"):
        validate(cfg("pkpo", k=8))
    with pytest.raises(ValueError, match=r"k_end = 6 exceeds"):
        validate(cfg("pkpo", k=2, k_end=6, anneal_steps=5))
    with pytest.raises(ValueError, match=r"every advantage is 0; lower it to <= 3"):
        validate(cfg("passk_training", k=4))
    validate(cfg("pkpo", k=4))  # k = G is PKPO's k = n
    validate(cfg("passk_training", k=3, k_end=1, anneal_steps=10))


def test_passk_estimators_are_reachable_from_command_line_keys():
    from experiments.config_files import apply_overrides
    from jaxrl_vr.train.config import PipelineConfig

    tree = apply_overrides({}, [("rl.estimator.k", "2"), ("rl.estimator", "pkpo"),
                                ("rl.estimator.k_end", "1"), ("rl.estimator.anneal_steps", "50")])
    choice = PipelineConfig.from_dict(tree).rl.estimator
    assert choice.name == "pkpo"
    assert (choice.settings.k, choice.settings.k_end, choice.settings.anneal_steps) == (2, 1, 50)
    tree = apply_overrides({}, [("rl.estimator", "passk_training"), ("rl.estimator.k", "3")])
    assert PipelineConfig.from_dict(tree).rl.estimator.settings.k == 3


def test_reinforce_is_r_minus_the_group_mean_and_still_trains_one_sample_per_prompt():
    from jaxrl_vr.train.config import PipelineConfig, validate

    rewards = jnp.asarray([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    adv, _ = estimators.make_estimator("reinforce").update(rewards, jnp.ones((2, 4), bool), rewards, ())
    np.testing.assert_allclose(np.asarray(adv), [[0.5, -0.5, -0.5, 0.5], [0.75, -0.25, -0.25, -0.25]])
    raw, _ = estimators.make_estimator("reinforce", baseline="none").update(
        rewards, jnp.ones((2, 4), bool), rewards, ())
    np.testing.assert_array_equal(np.asarray(raw), np.asarray(rewards))
    # G = 1: no group to take a mean over; the advantage is the reward, not 0, and the
    # config is not rejected as group-relative.
    lone = jnp.asarray([[1.0], [0.0]])
    adv, _ = estimators.make_estimator("reinforce").update(lone, jnp.ones((2, 1), bool), lone, ())
    np.testing.assert_array_equal(np.asarray(adv), [[1.0], [0.0]])
    assert estimators.needs_groups("reinforce") is False
    validate(PipelineConfig.from_dict({"rl": {"samples_per_prompt": 1, "estimator": "reinforce"}}))


def test_maxrl_with_a_finite_sample_count_uses_the_truncated_weight():
    # success [1, 0, 0, 0]: p̂ = 1/4; T = 4: w = (1 − (3/4)^4)/(1/4) = 175/64, A = w·(s − 1/4).
    success = jnp.asarray([[1.0, 0.0, 0.0, 0.0]])
    valid = jnp.ones((1, 4), bool)
    adv, _ = estimators.make_estimator("maxrl", num_samples=4).update(success, valid, success, ())
    np.testing.assert_allclose(np.asarray(adv), 175 / 64 * np.asarray([[0.75, -0.25, -0.25, -0.25]]), rtol=1e-6)
    # T = 1 is Dr.GRPO; a large T approaches 1/p̂; shaping keeps its plain baseline.
    adv, _ = estimators.make_estimator("maxrl", num_samples=1).update(success, valid, success, ())
    np.testing.assert_allclose(np.asarray(adv), np.asarray(advantages.grpo(success, scale="none")), rtol=1e-6)
    adv, _ = estimators.make_estimator("maxrl", num_samples=200).update(success, valid, success, ())
    np.testing.assert_allclose(np.asarray(adv), np.asarray(advantages.maxrl(success)), rtol=1e-4)
    adv, _ = estimators.make_estimator("maxrl", num_samples=4).update(
        jnp.asarray([[-1.0, 0, 0, 0]]), valid, jnp.zeros((1, 4)), ())
    np.testing.assert_allclose(np.asarray(adv), [[-0.75, 0.25, 0.25, 0.25]], atol=1e-6)
    with pytest.raises(ValueError, match="num_samples"):
        estimators.make_estimator("maxrl", num_samples=0)
    from experiments.config_files import apply_overrides
    from jaxrl_vr.train.config import PipelineConfig

    tree = apply_overrides({}, [("rl.estimator", "maxrl"), ("rl.estimator.num_samples", "8")])
    assert PipelineConfig.from_dict(tree).rl.estimator.settings.num_samples == 8
