"""PBA anchor mask and per-prompt KL weight: band edges, polarity, jit."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_vr.selection import anchor_mask, anchored_kl_weight, expand_to_responses

P_BASE = jnp.array([0.0, 0.29, 0.3, 0.5, 0.8, 0.81, 1.0], jnp.float32)


class AnchorTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_default_above(self):
        # anchor(x) = p_base >= 0.3 (tau_high = 1): the edge 0.3 is anchored, 0.29 is not.
        mask = self.variant(lambda p: anchor_mask(p, tau_low=0.3))(P_BASE)
        np.testing.assert_array_equal(mask, [False, False, True, True, True, True, True])

    @chex.variants(with_jit=True, without_jit=True)
    def test_band_and_below(self):
        band = self.variant(lambda p: anchor_mask(p, tau_low=0.3, tau_high=0.8))(P_BASE)
        np.testing.assert_array_equal(band, [False, False, True, True, True, False, False])
        below = self.variant(lambda p: anchor_mask(p, tau_low=0.3, tau_high=0.8, polarity="below"))(P_BASE)
        np.testing.assert_array_equal(below, ~np.asarray(band))

    @chex.variants(with_jit=True, without_jit=True)
    def test_weight_coef_and_calibration(self):
        calibrated = jnp.array([True, True, True, True, True, True, False])
        w = self.variant(lambda p, c, coef: anchored_kl_weight(p, coef=coef, tau_low=0.3, calibrated_p=c))(
            P_BASE, calibrated, jnp.float32(0.05))
        # λ = 0.05 where p_base >= 0.3 and calibrated; 0 elsewhere (the last prompt has no base samples).
        np.testing.assert_allclose(w, [0, 0, 0.05, 0.05, 0.05, 0.05, 0])
        assert w.dtype == jnp.float32

    @chex.variants(with_jit=True, without_jit=True)
    def test_expand_to_responses(self):
        out = self.variant(lambda w: expand_to_responses(w, 3))(jnp.array([0.0, 2.0]))
        np.testing.assert_array_equal(out, [0, 0, 0, 2, 2, 2])


def test_traced_thresholds_do_not_recompile():
    traces = []

    @jax.jit
    def weight(p, tau, coef):
        traces.append(1)
        return anchored_kl_weight(p, coef=coef, tau_low=tau)

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
