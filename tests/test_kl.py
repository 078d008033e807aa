"""Tests for jaxrl_vr.kl: k1/k2/k3 estimators."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_vr import kl


class EstimateTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_computed(self):
        # logp = 0, ref = ln 0.5: d = ref - logp = -ln 2 = -0.6931472.
        #   k1 = -d = 0.6931472; k2 = ½ d² = 0.2402265;
        #   k3 = e^d - d - 1 = 0.5 + 0.6931472 - 1 = 0.1931472.
        # logp = ln 0.5, ref = 0: d = ln 2: k3 = 2 - 0.6931472 - 1 = 0.3068528.
        # logp = ref: all estimators are 0.
        logp = jnp.array([0.0, math.log(0.5), -1.0])
        ref_logp = jnp.array([math.log(0.5), 0.0, -1.0])
        fn = self.variant(kl.estimate, static_argnames="kind")
        expected = {"k1": [0.6931472, -0.6931472, 0.0], "k2": [0.2402265, 0.2402265, 0.0],
                    "k3": [0.1931472, 0.3068528, 0.0]}
        for kind, want in expected.items():
            np.testing.assert_allclose(fn(logp, ref_logp, kind=kind), want, atol=1e-6)
        np.testing.assert_allclose(fn(logp, ref_logp), fn(logp, ref_logp, kind="k3"))  # default k3

    def test_exact_expectations_equal_true_kl(self):
        # E_{x~p}[k1] = E_{x~p}[k3] = KL(p‖q) exactly (sum over the support, no sampling).
        p = jnp.array([0.1, 0.2, 0.3, 0.4])
        q = jnp.array([0.4, 0.3, 0.2, 0.1])
        true_kl = float(jnp.sum(p * jnp.log(p / q)))
        for kind in ("k1", "k3"):
            expectation = float(jnp.sum(p * kl.estimate(jnp.log(p), jnp.log(q), kind)))
            np.testing.assert_allclose(expectation, true_kl, rtol=1e-5, err_msg=kind)
        # k2 is biased: ½ E[d²] != KL here.
        k2_expectation = float(jnp.sum(p * kl.estimate(jnp.log(p), jnp.log(q), "k2")))
        self.assertGreater(abs(k2_expectation - true_kl), 1e-2)

    def test_k3_gradient_and_nonnegativity(self):
        # d k3 / d logp = 1 - e^d with d = ref - logp. logp = 0, ref = ln 0.5: 1 - 0.5 = 0.5.
        ref_logp = jnp.array([math.log(0.5)])
        grad = jax.grad(lambda lp: jnp.sum(kl.estimate(lp, ref_logp)))(jnp.array([0.0]))
        np.testing.assert_allclose(grad, [0.5], rtol=1e-6)
        # The reference is data: no gradient flows into it.
        ref_grad = jax.grad(lambda r: jnp.sum(kl.estimate(jnp.array([0.0]), r)))(jnp.array([-1.0]))
        np.testing.assert_array_equal(ref_grad, [0.0])
        diffs = jnp.linspace(-30.0, 30.0, 61)
        for kind in ("k2", "k3"):
            self.assertTrue(bool(jnp.all(kl.estimate(jnp.zeros(61), diffs, kind) >= 0)), kind)

    def test_huge_log_ratios_finite(self):
        logp = jnp.array([0.0, -1e4, 0.0])
        ref_logp = jnp.array([-1e4, 0.0, 0.0])

        def total(lp):
            return jnp.sum(kl.estimate(lp, ref_logp, "k3"))

        value, grad = jax.jit(jax.value_and_grad(total))(logp)
        self.assertTrue(np.isfinite(value))
        self.assertTrue(np.isfinite(grad).all())
        # d = -1e4 is exact (no exp overflow): k3 = e^-1e4 + 1e4 - 1 = 9999;
        # d = +1e4 is clipped to 20 before exp: e^20 - 20 - 1 = e^20 - 21.
        np.testing.assert_allclose(kl.estimate(logp, ref_logp, "k3")[:2],
                                   [9999.0, math.exp(20) - 21.0], rtol=1e-5)
        # The unclipped side keeps pulling: d k3/d logp = 1 - e^d = 1 at d = -1e4.
        np.testing.assert_allclose(grad[0], 1.0, rtol=1e-6)

    def test_k1_k2_are_not_clipped(self):
        logp = jnp.array([0.0])
        ref_logp = jnp.array([-30.0])
        # d = -30: k1 = -d = 30; k2 = d^2/2 = 450.
        np.testing.assert_allclose(kl.estimate(logp, ref_logp, "k1"), [30.0])
        np.testing.assert_allclose(kl.estimate(logp, ref_logp, "k2"), [450.0])
        grad_k2 = jax.grad(lambda lp: jnp.sum(kl.estimate(lp, ref_logp, "k2")))(logp)
        np.testing.assert_allclose(grad_k2, [30.0])  # d/dlp ½(lp - ref)^2 = lp - ref

    def test_mask_and_errors(self):
        logp = jnp.array([[0.0, 0.0]])
        ref_logp = jnp.array([[-1.0, jnp.nan]])
        mask = jnp.array([[True, False]])
        # k3 at d = -1: e^-1 + 1 - 1 = 0.3678794; masked NaN -> 0.
        np.testing.assert_allclose(kl.estimate(logp, ref_logp, "k3", mask=mask), [[0.3678794, 0.0]],
                                   rtol=1e-6)
        with pytest.raises(ValueError, match="valid kinds: k1, k2, k3"):
            kl.estimate(logp, ref_logp, "k4")
        with pytest.raises(AssertionError):
            kl.estimate(logp, ref_logp[:, :1])
