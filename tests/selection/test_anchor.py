"""PBA anchor mask and per-prompt KL weight: band edges, polarity, jit."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_vr.selection import (
    DEFAULT_TAU_HIGH,
    DEFAULT_TAU_LOW,
    anchor_mask,
    anchored_kl_terms,
    anchored_kl_weight,
    expand_to_responses,
)

P_BASE = jnp.array([0.0, 0.29, 0.3, 0.5, 0.8, 0.81, 1.0], jnp.float32)


class AnchorTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_above_with_open_top(self):
        # anchor(x) = p_base >= 0.3 (tau_high = 1): the edge 0.3 is anchored, 0.29 is not.
        mask = self.variant(lambda p: anchor_mask(p, tau_low=0.3, tau_high=1.0))(P_BASE)
        np.testing.assert_array_equal(mask, [False, False, True, True, True, True, True])

    @chex.variants(with_jit=True, without_jit=True)
    def test_default_band_some_base_mass_not_easy(self):
        # Defaults: 2/64 <= p_base <= 0.6. Calibration counts of 64 samples: 0, 1 and 2
        # successes, 38/64 = 0.594, 39/64 = 0.609, 64/64.
        self.assertEqual((DEFAULT_TAU_LOW, DEFAULT_TAU_HIGH), (0.03125, 0.6))
        p_base = jnp.array([0, 1, 2, 38, 39, 64], jnp.float32) / 64.0
        mask = self.variant(anchor_mask)(p_base)
        np.testing.assert_array_equal(mask, [False, False, True, True, False, False])
        weight = self.variant(lambda p: anchored_kl_weight(p, coef=0.1))(p_base)
        np.testing.assert_allclose(weight, [0, 0, 0.1, 0.1, 0, 0])

    @chex.variants(with_jit=True, without_jit=True)
    def test_band_and_below(self):
        band = self.variant(lambda p: anchor_mask(p, tau_low=0.3, tau_high=0.8))(P_BASE)
        np.testing.assert_array_equal(band, [False, False, True, True, True, False, False])
        below = self.variant(lambda p: anchor_mask(p, tau_low=0.3, tau_high=0.8, polarity="below"))(P_BASE)
        np.testing.assert_array_equal(below, ~np.asarray(band))

    @chex.variants(with_jit=True, without_jit=True)
    def test_weight_coef_and_calibration(self):
        calibrated = jnp.array([True, True, True, True, True, True, False])
        w = self.variant(lambda p, c, coef: anchored_kl_weight(p, coef=coef, tau_low=0.3, tau_high=1.0, calibrated_p=c))(
            P_BASE, calibrated, jnp.float32(0.05))
        # λ = 0.05 where p_base >= 0.3 and calibrated; 0 elsewhere (the last prompt has no base samples).
        np.testing.assert_allclose(w, [0, 0, 0.05, 0.05, 0.05, 0.05, 0])
        assert w.dtype == jnp.float32

    @chex.variants(with_jit=True, without_jit=True)
    def test_expand_to_responses(self):
        out = self.variant(lambda w: expand_to_responses(w, 3))(jnp.array([0.0, 2.0]))
        np.testing.assert_array_equal(out, [0, 0, 0, 2, 2, 2])


class AnchoredKLTermsTest(chex.TestCase):
    kl_bt = jnp.array([[1.0, 2.0, 9.0], [3.0, 4.0, 5.0], [0.5, 7.0, 7.0], [6.0, 6.0, 6.0]])
    mask_bt = jnp.array([[True, True, False], [True, True, True], [True, False, False],
                         [False, False, False]])

    @chex.variants(with_jit=True, without_jit=True)
    def test_all_tokens_in_the_denominator(self):
        # Prompts of G = 2: prompt 0 anchored with λ = 0.5, prompt 1 not.
        weight_b = expand_to_responses(jnp.array([0.5, 0.0]), 2)
        num, den = self.variant(anchored_kl_terms)(self.kl_bt, self.mask_bt, weight_b)
        # Numerator: 0.5 · (1 + 2) + 0.5 · (3 + 4 + 5) = 7.5; responses 2, 3 add 0.
        # Denominator: every valid response token, anchored or not: 2 + 3 + 1 + 0 = 6.
        np.testing.assert_allclose([num, den], [7.5, 6.0], rtol=1e-6)
        self.assertEqual(num.dtype, jnp.float32)

    def test_micro_batches_sum_to_the_full_batch(self):
        weight_b = jnp.array([0.5, 0.5, 2.0, 0.0])
        full = anchored_kl_terms(self.kl_bt, self.mask_bt, weight_b)
        halves = [anchored_kl_terms(self.kl_bt[i:i + 2], self.mask_bt[i:i + 2], weight_b[i:i + 2])
                  for i in (0, 2)]
        np.testing.assert_allclose(full, np.sum(np.asarray(halves), axis=0), rtol=1e-6)

    def test_masked_and_unanchored_tokens_get_zero_grad_even_if_nonfinite(self):
        kl_bt = self.kl_bt.at[0, 2].set(jnp.inf).at[2, 1].set(jnp.nan)
        weight_b = jnp.array([1.0, 0.0, 1.0, 1.0])
        num, grad = jax.value_and_grad(lambda k: anchored_kl_terms(k, self.mask_bt, weight_b)[0])(
            kl_bt)
        np.testing.assert_allclose(num, 1.0 + 2.0 + 0.5)
        expected = np.asarray(self.mask_bt) * np.asarray(weight_b)[:, None]
        np.testing.assert_array_equal(grad, expected)


def test_traced_thresholds_do_not_recompile():
    traces = []

    @jax.jit
    def weight(p, tau, coef):
        traces.append(1)
        return anchored_kl_weight(p, coef=coef, tau_low=tau, tau_high=1.0)

    a = weight(P_BASE, jnp.float32(0.3), jnp.float32(1.0))
    b = weight(P_BASE, jnp.float32(0.81), jnp.float32(2.0))
    assert len(traces) == 1
    np.testing.assert_allclose(a, [0, 0, 1, 1, 1, 1, 1])
    np.testing.assert_allclose(b, [0, 0, 0, 0, 0, 2, 2])


def test_bad_arguments():
    with pytest.raises(ValueError, match="polarity"):
        anchor_mask(P_BASE, tau_low=0.3, polarity="inside")
    with pytest.raises(ValueError, match="tau_low <= tau_high"):
        anchor_mask(P_BASE, tau_low=0.9, tau_high=0.2)
    with pytest.raises(AssertionError):
        anchor_mask(P_BASE[None, :], tau_low=0.3)
