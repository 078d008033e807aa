"""jaxrl_vr.sim.population: exact base pass rates, exact pass@k, Monte-Carlo agreement."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxrl_vr import passk
from jaxrl_vr.sim import engine, population as pop_lib

SPEC = pop_lib.PopulationSpec(num_prompts=2000, feature_dim=8)


@pytest.fixture(scope="module")
def population():
    return jax.jit(lambda k: pop_lib.make_population(k, SPEC))(jax.random.key(3))


def test_base_logits_reproduce_p_base_and_span_all_regimes(population):
    p_from_logits = pop_lib.pass_rate(population.base_logits_pm, population.correct_pm)
    np.testing.assert_allclose(p_from_logits, population.p_base_p, rtol=1e-5, atol=1e-7)
    counts = np.bincount(np.asarray(population.regime_p), minlength=4)
    assert np.all(counts >= 0.1 * SPEC.num_prompts), counts  # every regime is populated
    np.testing.assert_array_equal(population.regime_p, passk.regime(population.p_base_p))
    norms = np.linalg.norm(np.asarray(population.features_pmd), axis=-1)
    np.testing.assert_allclose(norms, 1.0, rtol=1e-5)


def test_zero_params_are_the_base_policy(population):
    params = pop_lib.init_params(SPEC)
    for sharing in (0.0, 0.5, 1.0):
        logits = pop_lib.policy_logits(params, population, sharing=sharing, private_gain=256.0)
        np.testing.assert_array_equal(logits, population.base_logits_pm)


def test_exact_p_matches_monte_carlo(population):
    params = pop_lib.PolicyParams(  # a non-trivial policy, not the base
        shared_d=jnp.linspace(-1.0, 1.0, SPEC.feature_dim),
        private_pm=0.1 * jax.random.normal(jax.random.key(1), (SPEC.num_prompts, SPEC.num_modes)))
    idx = jnp.arange(0, SPEC.num_prompts, 50, dtype=jnp.int32)  # 40 prompts
    num_samples = 20_000
    _, rewards = engine.sample_modes(jax.random.key(2), params, population, idx, num_samples,
                                     sharing=0.7, private_gain=4.0)
    logits = pop_lib.policy_logits(params, population, idx, sharing=0.7, private_gain=4.0)
    p_exact = np.asarray(pop_lib.pass_rate(logits, population.correct_pm[idx]))
    p_mc = np.asarray(rewards).mean(axis=1)
    sigma = np.sqrt(p_exact * (1 - p_exact) / num_samples) + 1e-6
    assert np.all(np.abs(p_mc - p_exact) <= 5 * sigma + 1e-4), np.max(np.abs(p_mc - p_exact) / sigma)


class ExactPassAtKTest(parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_formula_and_limit_of_unbiased_estimator(self):
        p = np.array([0.0, 1e-6, 0.003, 0.05, 0.5, 0.9, 1.0], np.float32)
        ks = np.array([1, 2, 8, 64, 256])
        got = np.asarray(self.variant(lambda q: pop_lib.exact_pass_at_k(q, ks))(p))
        expect = 1.0 - (1.0 - p.astype(np.float64)[:, None]) ** ks[None, :]
        np.testing.assert_allclose(got, expect, rtol=2e-5, atol=1e-7)
        np.testing.assert_allclose(got[:, 0], p, rtol=1e-6)
        # The unbiased estimator on n samples with c = p·n correct tends to 1 − (1−p)^k.
        n = 4096
        c = np.array([0, 4, 205, 2048, 3686, 4096])
        p_exact = (c / n).astype(np.float32)
        small_ks = np.array([1, 2, 4, 8])
        est = passk.pass_at_k(n, c[:, None], small_ks[None, :])
        ours = np.asarray(self.variant(lambda q: pop_lib.exact_pass_at_k(q, small_ks))(p_exact))
        np.testing.assert_allclose(ours, est, atol=5e-3)


def test_mode_entropy_and_kl_to_base():
    logits = jnp.log(jnp.array([[0.5, 0.5], [0.9, 0.1]], jnp.float32))
    base = jnp.log(jnp.array([[0.5, 0.5], [0.5, 0.5]], jnp.float32))
    np.testing.assert_allclose(pop_lib.mode_entropy(logits),
                               [np.log(2), -(0.9 * np.log(0.9) + 0.1 * np.log(0.1))], rtol=1e-5)
    np.testing.assert_allclose(pop_lib.kl_to_base(logits, base),
                               [0.0, 0.9 * np.log(1.8) + 0.1 * np.log(0.2)], atol=1e-6)


def test_private_coupling_fixed_holds_the_private_step_when_rho_changes(population):
    """"fixed" scales ψ by √κ whatever ρ; "coupled" by √((1−ρ)κ); the config reaches both."""
    import dataclasses

    from experiments.configs import sim as sim_config
    from jaxrl_vr.sim import SimConfig, methods

    key_t, key_p = jax.random.split(jax.random.key(1))
    params = pop_lib.PolicyParams(jax.random.normal(key_t, (SPEC.feature_dim,)),
                                  jax.random.normal(key_p, (SPEC.num_prompts, SPEC.num_modes)))
    idx = jnp.arange(50)
    # Fixed at κ = (1 − ρ0)·κ0 has the kernel (and the logits) of coupled at (ρ0, κ0).
    coupled = pop_lib.policy_logits(params, population, idx, sharing=0.9, private_gain=256.0)
    fixed = pop_lib.policy_logits(params, population, idx, sharing=0.9, private_gain=25.6,
                                  private_coupling="fixed")
    np.testing.assert_allclose(fixed, coupled, rtol=1e-5, atol=1e-5)
    # With θ = 0 the logits, and so ψ's gradient, do not depend on ρ under "fixed"; under
    # "coupled" ψ's gradient scales with √(1 − ρ).
    zero_theta = params._replace(shared_d=jnp.zeros_like(params.shared_d))
    batch = methods.Batch(idx[:2].astype(jnp.int32), jnp.array([[0, 1, 2], [1, 0, 0]], jnp.int32),
                          jnp.array([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]]), jnp.ones((2, 3), bool),
                          jnp.int32(6), jnp.array(False))
    adv = jnp.array([[1.0, -0.5, -0.5], [-1.0, 0.5, 0.5]])

    def private_grad(rho, coupling):
        cfg = SimConfig(num_prompts=SPEC.num_prompts, feature_dim=SPEC.feature_dim,
                        sharing=rho, private_gain=16.0, private_coupling=coupling)
        grads = jax.grad(engine.policy_loss)(zero_theta, population, batch, adv, cfg, False)
        return np.asarray(grads.private_pm[:2])

    np.testing.assert_allclose(private_grad(0.2, "fixed"), private_grad(0.8, "fixed"), rtol=1e-6)
    np.testing.assert_allclose(private_grad(0.2, "coupled") * np.sqrt(0.2 / 0.8),
                               private_grad(0.8, "coupled"), rtol=1e-5, atol=1e-8)
    assert np.abs(private_grad(0.8, "coupled")).max() > 0
    # Reachable from the config file (the CLI's --config.sim.* overrides), ρ and κ included.
    tree = sim_config.get_config("").to_dict()["sim"]
    tree.update(private_coupling="fixed", private_gain=64.0, sharing=0.5)
    cfg = SimConfig.from_dict(tree)
    got = engine.logits(params, population, cfg, idx)
    want = pop_lib.policy_logits(params, population, idx, sharing=0.5, private_gain=64.0,
                                 private_coupling="fixed")
    np.testing.assert_array_equal(got, want)
    assert not np.allclose(got, engine.logits(params, population,
                                              dataclasses.replace(cfg, private_coupling="coupled"),
                                              idx))
    with pytest.raises(ValueError, match="private_coupling"):
        from jaxrl_vr.sim.config import validate
        validate(dataclasses.replace(cfg, private_coupling="fixd"))
