"""Per-step batch diagnostics: prompt weights and their ESS, success bins, one-positive groups."""

import numpy as np
import pytest

from jaxrl_vr import advantages
from jaxrl_vr.diagnostics import (SUCCESS_BINS, Histogram, one_positive_frac, prompt_weights, success_bins,
                                  weight_stats)

# Four groups of G = 4: A one success (w = 2), B two (w = 1), C none (no weight: rewards
# equal), D two valid samples, one success (w = 4; its invalid columns hold junk), E no
# valid sample.
REWARDS_PG = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 1], [1, 1, 0, 0]], np.float64)
VALID_PG = np.array([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]], bool)


def _adv_pg():
    adv = np.zeros_like(REWARDS_PG)
    adv[0] = 2.0 * (REWARDS_PG[0] - 0.25)
    adv[1] = 1.0 * (REWARDS_PG[1] - 0.5)
    adv[2] = 7.0  # equal rewards: whatever the advantage, the group has no weight
    adv[3] = [4.0 * 0.5, 4.0 * -0.5, 99.0, -99.0]
    adv[4] = 5.0
    return adv


def test_prompt_weights_and_their_effective_sample_size_by_hand():
    weight_p, defined_p = prompt_weights(_adv_pg(), REWARDS_PG, VALID_PG)
    np.testing.assert_array_equal(defined_p, [True, True, False, True, False])
    np.testing.assert_allclose(weight_p, [2.0, 1.0, 0.0, 4.0, 0.0])
    stats = weight_stats(weight_p, defined_p)
    # ESS = (2 + 1 + 4)² / (4 + 1 + 16) = 49/21; max/mean = 4 / (7/3) = 12/7.
    assert stats["prompt_weights/ess"] == pytest.approx(49 / 21)
    assert stats["prompt_weights/ess_frac"] == pytest.approx(49 / 63)
    assert stats["prompt_weights/max_over_mean"] == pytest.approx(12 / 7)
    assert stats["prompt_weights/prompts"] == 3


def test_ess_ends_equal_weights_one_weight_and_none():
    equal = weight_stats(np.full(5, 0.3), np.ones(5, bool))
    assert equal["prompt_weights/ess"] == pytest.approx(5) and equal["prompt_weights/max_over_mean"] == 1
    collapsed = weight_stats(np.array([0.0, 0.0, 3.0]), np.ones(3, bool))  # CurveRL's collapse
    assert collapsed["prompt_weights/ess"] == pytest.approx(1) and collapsed["prompt_weights/ess_frac"] == 1 / 3
    none = weight_stats(np.zeros(2), np.zeros(2, bool))
    assert none["prompt_weights/ess"] == 0 and np.isnan(none["prompt_weights/ess_frac"])


def test_prompt_weights_recover_the_weights_of_a_prompt_weighted_estimator():
    rng = np.random.default_rng(0)
    rewards_pg = (rng.random((6, 8)) < 0.4).astype(np.float32)
    rewards_pg[0] = 1.0  # equal rewards: no weight
    weight_p = rng.uniform(0.1, 3.0, 6).astype(np.float32)
    adv_pg = np.asarray(advantages.prompt_weighted(rewards_pg, weight_p))
    recovered_p, defined_p = prompt_weights(adv_pg, rewards_pg, np.ones_like(rewards_pg, bool))
    assert not defined_p[0] and defined_p[1:].all()
    np.testing.assert_allclose(recovered_p[1:], weight_p[1:], rtol=1e-5)
    # GRPO's z-score: w = 1/(std + eps), with the sample std (ddof = 1) of each group.
    grpo_pg = np.asarray(advantages.grpo(rewards_pg, np.ones_like(rewards_pg, bool), scale="std"))
    grpo_p, _ = prompt_weights(grpo_pg, rewards_pg, np.ones_like(rewards_pg, bool))
    np.testing.assert_allclose(grpo_p[1:], 1 / rewards_pg[1:].std(axis=1, ddof=1), rtol=1e-4)


def test_one_positive_fraction_by_hand():
    success_pg = REWARDS_PG > 0.5
    # Groups with a valid sample: A, B, C, D; exactly one valid success: A and D (D's
    # successes in invalid columns do not count).
    assert one_positive_frac(success_pg, VALID_PG) == 0.5
    assert one_positive_frac(np.zeros((2, 3), bool), np.zeros((2, 3), bool)) == 0.0


def test_success_bins_put_each_rate_in_one_bin_with_exact_ends():
    rates = np.array([0.0, 0.25, 0.5, 0.6, 1.0, 0.8, 0.1])
    keep = np.array([1, 1, 1, 1, 1, 1, 0], bool)  # the last prompt did not reach the update
    out = success_bins(rates, keep, "d")
    assert [out[f"d/{name}"] for name in SUCCESS_BINS] == [pytest.approx(1 / 6)] * 6
    assert isinstance(out["d"], Histogram) and out["d"].values.tolist() == [0.0, 0.25, 0.5, 0.6, 1.0, 0.8]
    assert sum(success_bins(np.array([0.9999, 1e-9]), np.ones(2, bool), "d")[f"d/{n}"]
               for n in ("0-0.25", "0.75-1")) == 1.0
    assert success_bins(rates, np.zeros(7, bool), "d")["d/0"] == 0.0
