"""Advantage estimators as (init, update) pairs: one registry, one signature."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_vr import advantages, estimators

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
                                           ("maxrl", True), ("pair_weighted", True)])
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
