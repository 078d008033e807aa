"""jaxrl_vr.sim engine and methods: hand-checked gradient, jit equality, seeds, methods."""

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxrl_vr import advantages
from jaxrl_vr.selection import pairing as host_pairing
from jaxrl_vr.sim import engine, methods, population as pop_lib
from jaxrl_vr.sim.config import SimConfig, validate

TINY = SimConfig(num_prompts=64, feature_dim=4, steps=6, log_every=3, batch_prompts=8,
                 group_size=4, num_seeds=2, num_tracked=4, progress=False, plots=False,
                 calibration_samples=8, pairing_min_count=1)


def _two_prompt_population():
    """2 prompts × 2 modes (mode 0 correct), D = 2, hand-picked numbers."""
    base = jnp.log(jnp.array([[0.2, 0.8], [0.6, 0.4]], jnp.float32))
    feats = jnp.array([[[1.0, 0.0], [0.6, 0.8]], [[0.0, 1.0], [0.8, -0.6]]], jnp.float32)
    correct = jnp.array([[True, False], [True, False]])
    p_base = pop_lib.pass_rate(base, correct)
    return pop_lib.Population(base, correct, feats, jnp.zeros((2, 2), jnp.int32), p_base,
                              jnp.array([2, 2], jnp.int32))


def _batch(modes, rewards):
    modes = jnp.asarray(modes, jnp.int32)
    return methods.Batch(jnp.array([0, 1], jnp.int32), modes, jnp.asarray(rewards, jnp.float32),
                         jnp.ones(modes.shape, bool), jnp.int32(modes.size), jnp.array(False))


def test_policy_gradient_matches_hand_computation():
    pop = _two_prompt_population()
    params = pop_lib.PolicyParams(jnp.array([0.3, -0.2], jnp.float32),
                                  jnp.array([[0.1, 0.0], [0.0, -0.1]], jnp.float32))
    modes = np.array([[0, 1, 1], [1, 0, 1]])
    rewards = (modes == 0).astype(np.float32)
    adv = np.asarray(advantages.grpo(jnp.asarray(rewards)))
    rho, kappa = 0.6, 3.0
    cfg = dataclasses.replace(TINY, sharing=rho, private_gain=kappa)
    grads = jax.grad(engine.policy_loss)(params, pop, _batch(modes, rewards), jnp.asarray(adv),
                                         cfg, False)
    # Hand computation: z = b + √ρ φ·θ + √((1−ρ)κ) ψ;  L = −(1/N) Σ_b A_b log π(m_b).
    feats, base = np.asarray(pop.features_pmd), np.asarray(pop.base_logits_pm)
    z = base + np.sqrt(rho) * feats @ np.asarray(params.shared_d) + np.sqrt(
        (1 - rho) * kappa) * np.asarray(params.private_pm)
    pi = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    n = modes.size
    g_private = np.zeros((2, 2))
    g_shared = np.zeros(2)
    for x in range(2):
        for i in range(3):
            onehot = np.eye(2)[modes[x, i]]
            g_private[x] -= adv[x, i] * (onehot - pi[x]) / n
            g_shared -= adv[x, i] * (feats[x, modes[x, i]] - pi[x] @ feats[x]) / n
    np.testing.assert_allclose(grads.private_pm, np.sqrt((1 - rho) * kappa) * g_private,
                               rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grads.shared_d, np.sqrt(rho) * g_shared, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("kind", ["k3", "exact"])
def test_pba_loss_gradient_matches_finite_differences(kind):
    pop = _two_prompt_population()
    params = pop_lib.PolicyParams(jnp.array([0.5, -0.4], jnp.float32),
                                  jnp.array([[0.3, -0.2], [0.1, 0.2]], jnp.float32))
    modes = np.array([[0, 1, 1], [1, 0, 1]])
    rewards = (modes == 0).astype(np.float32)
    adv = advantages.grpo(jnp.asarray(rewards))
    cfg = dataclasses.replace(TINY, sharing=0.5, private_gain=2.0, pba_coef=0.7,
                              pba_tau_low=0.0, pba_tau_high=0.3, pba_kl=kind)
    batch = _batch(modes, rewards)
    loss = lambda prm: engine.policy_loss(prm, pop, batch, adv, cfg, True)  # noqa: E731
    grads = jax.grad(loss)(params)
    flat, unravel = jax.flatten_util.ravel_pytree(params)
    eps = 1e-2
    fd = np.array([(loss(unravel(flat.at[i].add(eps))) - loss(unravel(flat.at[i].add(-eps))))
                   / (2 * eps) for i in range(flat.size)])
    np.testing.assert_allclose(jax.flatten_util.ravel_pytree(grads)[0], fd, atol=2e-4)
    # Both prompts' p_base (0.2 and 0.6): only prompt 0 is in the band [0, 0.3]; KL adds to the loss.
    no_pba = engine.policy_loss(params, pop, batch, adv, cfg, False)
    assert float(loss(params)) > float(no_pba)


def _state(cfg, method, seed=0):
    spec = methods.parse_method(method)
    return engine.init_state(jax.random.key(seed), cfg, spec), spec


class StepTest(parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters("curverl+pba", "pairing")
    def test_jit_and_no_jit_agree(self, method):
        state, spec = _state(TINY, method)
        step = functools.partial(engine.train_step, cfg=TINY, spec=spec)
        reference, _ = jax.jit(step)(state)
        got, stats = self.variant(step)(state)
        chex.assert_trees_all_close(got.params, reference.params, rtol=1e-5, atol=1e-6)
        chex.assert_trees_all_close(got.tracker, reference.tracker, rtol=1e-6)
        self.assertTrue(np.isfinite(float(stats.loss)))


def test_tabular_policy_leaves_unvisited_prompts_exactly_unchanged():
    cfg = dataclasses.replace(TINY, sharing=0.0, num_prompts=400)
    state, spec = _state(cfg, "grpo")
    new_state, _ = jax.jit(functools.partial(engine.train_step, cfg=cfg, spec=spec))(state)
    p0 = engine.final_pass_rates(state, cfg)
    p1 = engine.final_pass_rates(new_state, cfg)
    visited = np.zeros(cfg.num_prompts, bool)
    # Replay the step's batch: same key, same selection.
    key_select = jax.random.split(state.key)[1]
    batch = methods.select_uniform(key_select, lambda k, i, g: engine.sample_modes(
        k, state.params, state.population, i, g, sharing=0.0, private_gain=cfg.private_gain),
        state.tracker, cfg)
    visited[np.asarray(batch.prompt_idx_p)] = True
    np.testing.assert_array_equal(np.asarray(p1)[~visited], np.asarray(p0)[~visited])
    assert np.any(np.asarray(p1)[visited] != np.asarray(p0)[visited])
    # With sharing the same step moves unvisited prompts too (the drift).
    shared = dataclasses.replace(cfg, sharing=0.9)
    state_s, _ = _state(shared, "grpo")
    new_s, _ = jax.jit(functools.partial(engine.train_step, cfg=shared, spec=spec))(state_s)
    moved = engine.final_pass_rates(new_s, shared) != engine.final_pass_rates(state_s, shared)
    assert np.asarray(moved)[~visited].mean() > 0.5


def test_dynamic_batch_keeps_informative_groups_and_counts_its_rounds():
    cfg = dataclasses.replace(TINY, dynamic_rounds=3)
    state, _ = _state(cfg, "dapo")
    sample = lambda k, i, g: engine.sample_modes(  # noqa: E731
        k, state.params, state.population, i, g, sharing=cfg.sharing,
        private_gain=cfg.private_gain)
    batch = methods.select_dynamic(jax.random.key(5), sample, state.tracker, cfg)
    rewards, valid = np.asarray(batch.rewards_pg), np.asarray(batch.valid_pg)
    spread = rewards.max(1) > rewards.min(1)
    np.testing.assert_array_equal(valid[:, 0], spread)  # valid rows are exactly the informative
    rounds = int(batch.samples) // (cfg.batch_prompts * cfg.group_size)
    assert 1 <= rounds <= 3 and int(batch.samples) % (cfg.batch_prompts * cfg.group_size) == 0
    if not valid[:, 0].all():
        assert rounds == 3  # a short batch used the whole budget


def test_two_stage_batch_is_ragged_by_probe():
    cfg = dataclasses.replace(TINY, two_stage_probe=2, two_stage_lo=0.0, two_stage_hi=0.5)
    state, _ = _state(cfg, "two_stage")
    sample = lambda k, i, g: engine.sample_modes(  # noqa: E731
        k, state.params, state.population, i, g, sharing=cfg.sharing,
        private_gain=cfg.private_gain)
    batch = methods.select_two_stage(jax.random.key(6), sample, state.tracker, cfg)
    valid, rewards = np.asarray(batch.valid_pg), np.asarray(batch.rewards_pg)
    assert valid[:, :2].all()
    cont = rewards[:, :2].mean(1) <= 0.5
    np.testing.assert_array_equal(valid[:, 2:].all(1), cont)
    assert int(batch.samples) == 2 * cfg.batch_prompts + 2 * cont.sum()


def test_jittable_pairing_pools_equal_the_host_pools():
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 12, 500).astype(np.float32)
    successes = np.floor(rng.uniform(0, 1, 500) * (counts + 1)).astype(np.float32)
    tracker = methods.Tracker(jnp.asarray(successes), jnp.asarray(counts))
    for cfg in (TINY, dataclasses.replace(TINY, pairing_neg_c=3, pairing_pos_max=0.4,
                                          pairing_min_count=4, group_size=8)):
        pos, neg = jax.jit(methods.pairing_pools, static_argnums=1)(tracker, cfg)
        rate = np.where(counts > 0, successes.astype(np.float64) / np.maximum(counts, 1), 0.0)
        host = host_pairing.pairing_pools(
            rate, counts, group_size=cfg.group_size, neg_c=cfg.pairing_neg_c,
            pos_max=cfg.pairing_pos_max, pos_min=cfg.pairing_pos_min,
            min_count=cfg.pairing_min_count)
        np.testing.assert_array_equal(pos, host.positive_p)
        np.testing.assert_array_equal(neg, host.negative_p)
        assert host.positive_p.any() and host.negative_p.any()


def test_pairing_batch_is_made_of_pool_pairs():
    state, spec = _state(TINY, "pairing")
    pos, neg = methods.pairing_pools(state.tracker, TINY)
    new_state, stats = jax.jit(functools.partial(engine.train_step, cfg=TINY, spec=spec))(state)
    assert float(stats.paired) == 1.0
    key_select = jax.random.split(state.key)[1]
    batch = methods.select_pairing(key_select, lambda k, i, g: engine.sample_modes(
        k, state.params, state.population, i, g, sharing=TINY.sharing,
        private_gain=TINY.private_gain), state.tracker, TINY)
    idx = np.asarray(batch.prompt_idx_p).reshape(-1, 2)
    assert np.asarray(pos)[idx[:, 0]].all() and np.asarray(neg)[idx[:, 1]].all()


def test_parse_method():
    assert methods.parse_method("grpo") == methods.MethodSpec("grpo", "uniform", False)
    assert methods.parse_method("pba") == methods.MethodSpec("grpo", "uniform", True)
    assert methods.parse_method("pairing") == methods.MethodSpec("pair_weighted", "pairing", False)
    assert methods.parse_method("dynamic+curverl+pba") == methods.MethodSpec(
        "curverl", "dapo", True)
    with pytest.raises(ValueError, match="grpoo"):
        methods.parse_method("grpoo")
    with pytest.raises(ValueError, match="repeated"):
        methods.parse_method("grpo+loo")
    with pytest.raises(ValueError, match="pairing"):
        methods.parse_method("pair_weighted")
    # One registry: every trainer estimator is a simulator method of the same name.
    from jaxrl_vr.estimators import ESTIMATORS
    for name in ESTIMATORS:
        spec = methods.parse_method(name + ("+pairing" if name == "pair_weighted" else ""))
        assert spec.estimator == name
    with pytest.raises(ValueError, match="log_every"):
        validate(dataclasses.replace(TINY, steps=7))


# The tests that read `runs` share one xdist worker, which simulates them once (7 s).
SHARES_RUNS = pytest.mark.xdist_group("sim_engine_runs")


@pytest.fixture(scope="module")
def runs():
    cfg = dataclasses.replace(TINY, steps=30, log_every=10, num_prompts=300, batch_prompts=16)
    return cfg, {m: engine.simulate(cfg, m) for m in ("grpo", "pba")}


@SHARES_RUNS
def test_seeds_differ_and_runs_are_deterministic(runs):
    cfg, by_method = runs
    run = by_method["grpo"]
    assert run.p_final_sp.shape == (2, cfg.num_prompts)
    assert not np.allclose(run.p_final_sp[0], run.p_final_sp[1])
    again = engine.simulate(cfg, "grpo")
    np.testing.assert_array_equal(again.p_final_sp, run.p_final_sp)
    np.testing.assert_array_equal(again.metrics.passk_rk, run.metrics.passk_rk)
    # Methods share each seed's population (paired comparisons).
    np.testing.assert_array_equal(by_method["pba"].p_base_sp, run.p_base_sp)


@SHARES_RUNS
def test_methods_change_behaviour(runs):
    _, by_method = runs
    grpo, pba = by_method["grpo"], by_method["pba"]
    assert not np.allclose(grpo.p_final_sp, pba.p_final_sp)
    # The anchored KL keeps anchored prompts (p_base <= 0.1) closer to the base.
    kl_grpo = grpo.metrics.kl_r[:, -1, :2].mean()
    kl_pba = pba.metrics.kl_r[:, -1, :2].mean()
    assert kl_pba < kl_grpo


@SHARES_RUNS
def test_chunk_does_not_recompile(runs):
    cfg, _ = runs
    spec = methods.parse_method("grpo")
    _, _, chunk, _ = engine.compiled(cfg, spec)
    assert chunk._cache_size() == 1  # simulate called it 3 times per run, twice


@pytest.mark.parametrize("method", ["pkpo", "passk_training"])
def test_passk_objectives_are_simulator_methods(method):
    cfg = dataclasses.replace(TINY, passk_k=2, methods=method)
    validate(cfg)
    state, spec = _state(cfg, method)
    step = jax.jit(functools.partial(engine.train_step, cfg=cfg, spec=spec))
    state, stats = step(state)
    state, stats = step(state)
    assert int(state.estimator_state.step) == 2  # the k schedule's clock runs in the scan
    assert np.isfinite(float(stats.loss)) and 0.0 <= float(stats.informative) <= 1.0
    with pytest.raises(ValueError, match="passk_k"):
        validate(dataclasses.replace(cfg, passk_k=TINY.group_size + (method == "pkpo")))
