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
