"""Tests for jaxrl_vr.advantages: hand-computed values, NumPy references, properties."""

import functools

import chex
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from jaxrl_vr import advantages, weighting

SETTINGS = hypothesis.settings(max_examples=25, deadline=None, derandomize=True)

# ----------------------------------------------------------- independent NumPy references


def _ref_group(rewards, valid, fn):
    """Applies fn(list of valid rewards) -> list of advantages prompt by prompt."""
    out = np.zeros(rewards.shape, np.float64)
    for p in range(rewards.shape[0]):
        idx = np.flatnonzero(valid[p])
        vals = rewards[p, idx].astype(np.float64)
        if len(vals) >= 2 and vals.max() > vals.min():
            out[p, idx] = fn(vals)
    return out


def ref_grpo(rewards, valid, scale="std", eps=1e-6):
    def fn(v):
        centred = v - v.mean()
        return centred / (np.std(v, ddof=1) + eps) if scale == "std" else centred
    return _ref_group(rewards, valid, fn)


def ref_loo(rewards, valid):
    # R_i minus the mean of the others, literally.
    return _ref_group(rewards, valid, lambda v: np.array(
        [v[i] - np.delete(v, i).mean() for i in range(len(v))]))


def ref_maxrl(rewards, valid, eps=1e-6):
    # MaxRL on success-valued rewards; a group with mean <= 0 gets 0 (never a huge value).
    return _ref_group(rewards, valid, lambda v: (v - v.mean()) / (v.mean() + eps)
                      if v.mean() > 0 else np.zeros_like(v))


ADV_FNS = {
    "grpo": (advantages.grpo, ref_grpo),
    "grpo_none": (functools.partial(advantages.grpo, scale="none"),
                  functools.partial(ref_grpo, scale="none")),
    "loo": (advantages.loo, ref_loo),
    "maxrl": (advantages.maxrl, ref_maxrl),
}


def _random_batch(rng, num_prompts, group, binary=True):
    if binary:
        rewards = (rng.random((num_prompts, group)) < rng.random((num_prompts, 1))).astype(
            np.float32)
    else:
        rewards = rng.random((num_prompts, group)).astype(np.float32)
    valid = rng.random((num_prompts, group)) < 0.75
    return rewards, valid


# ------------------------------------------------------------------ hand-computed values


class HandComputedTest(parameterized.TestCase):
    rewards = jnp.array([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])

    @chex.variants(with_jit=True, without_jit=True)
    def test_grpo_std(self):
        adv = self.variant(functools.partial(advantages.grpo, eps=0.0))(self.rewards)
        # Row 0: mean .25, centred [.75, -.25, -.25, -.25];
        #   unbiased var = (.5625 + 3*.0625)/3 = .25, std .5 -> [1.5, -.5, -.5, -.5].
        # Row 1 mirrors it: [.5, .5, .5, -1.5]. Row 2 all equal -> 0.
        expected = [[1.5, -0.5, -0.5, -0.5], [0.5, 0.5, 0.5, -1.5], [0.0] * 4]
        np.testing.assert_allclose(adv, expected, rtol=1e-6)
        self.assertEqual(adv.dtype, jnp.float32)

    @chex.variants(with_jit=True, without_jit=True)
    def test_grpo_eps_and_none(self):
        adv = self.variant(advantages.grpo)(self.rewards)
        # .75 / (.5 + 1e-6) = 1.4999970...
        np.testing.assert_allclose(adv[0, 0], 0.75 / 0.500001, rtol=1e-6)
        none = self.variant(functools.partial(advantages.grpo, scale="none"))(self.rewards)
        np.testing.assert_allclose(none[0], [0.75, -0.25, -0.25, -0.25], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_loo(self):
        adv = self.variant(advantages.loo)(self.rewards)
        # Row 0: 1 - mean(0,0,0) = 1; 0 - mean(1,0,0) = -1/3.
        # Row 1: 1 - mean(1,1,0) = 1/3; 0 - mean(1,1,1) = -1.
        expected = [[1.0, -1 / 3, -1 / 3, -1 / 3], [1 / 3, 1 / 3, 1 / 3, -1.0], [0.0] * 4]
        np.testing.assert_allclose(adv, expected, rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_maxrl(self):
        adv = self.variant(functools.partial(advantages.maxrl, eps=0.0))(self.rewards)
        # Row 0: (1 - .25)/.25 = 3, (0 - .25)/.25 = -1.
        # Row 1: (1 - .75)/.75 = 1/3, (0 - .75)/.75 = -1.
        expected = [[3.0, -1.0, -1.0, -1.0], [1 / 3, 1 / 3, 1 / 3, -1.0], [0.0] * 4]
        np.testing.assert_allclose(adv, expected, rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_prompt_weighted(self):
        weight_p = jnp.array([2.0, 4.0, 7.0])
        adv = self.variant(advantages.prompt_weighted)(self.rewards, weight_p)
        # w · (R - mean): 2 * [.75, -.25, ...], 4 * [.25, .25, .25, -.75], 7 * 0.
        expected = [[1.5, -0.5, -0.5, -0.5], [1.0, 1.0, 1.0, -3.0], [0.0] * 4]
        np.testing.assert_allclose(adv, expected, rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_prompt_weighted_infinite_weight_on_degenerate_or_invalid_is_zero(self):
        rewards = jnp.array([[1.0, 1.0], [1.0, 0.0]])
        valid = jnp.array([[True, True], [True, False]])
        # Row 0 is all-equal, row 1 has K = 1: both centre to 0, and 0 · inf must stay 0.
        adv = self.variant(advantages.prompt_weighted)(rewards, jnp.array([jnp.inf, 1.0]), valid)
        chex.assert_trees_all_equal(adv, jnp.zeros((2, 2), jnp.float32))

    @chex.variants(with_jit=True, without_jit=True)
    def test_reinforce(self):
        valid = jnp.array([[True, True, False, True]] * 3)
        adv = self.variant(functools.partial(advantages.reinforce, baseline="none"))(self.rewards * 3.0, valid)
        expected = np.where(np.asarray(valid), np.asarray(self.rewards) * 3.0, 0.0)
        chex.assert_trees_all_equal(adv, jnp.asarray(expected, jnp.float32))

    @chex.variants(with_jit=True, without_jit=True)
    def test_reinforce_subtracts_the_group_mean_as_documented(self):
        # Row 0: K = 3 of {3, 0, 1}: mean 4/3 -> [5/3, -4/3, 0, -1/3]. Row 1: K = 1 keeps its
        # reward (no baseline exists). Row 2: constant -> 0.
        rewards = jnp.array([[3.0, 0.0, 7.0, 1.0], [2.0, 5.0, 5.0, 5.0], [1.0, 1.0, 1.0, 1.0]])
        valid = jnp.array([[True, True, False, True], [True, False, False, False], [True] * 4])
        adv = self.variant(advantages.reinforce)(rewards, valid)
        np.testing.assert_allclose(np.asarray(adv), [[5 / 3, -4 / 3, 0, -1 / 3], [2, 0, 0, 0], [0] * 4],
                                   rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_ragged_hand_computed(self):
        rewards = jnp.array([[1.0, 0.0, 5.0, 5.0], [0.0, 1.0, 1.0, 9.0]])
        valid = jnp.array([[True, True, False, False], [True, True, True, False]])
        adv = self.variant(functools.partial(advantages.grpo, eps=0.0))(rewards, valid)
        # Row 0: K=2 of {1, 0}: mean .5, unbiased std sqrt(.5) -> ±.5/.70710678 = ±.70710678
        # Row 1: K=3 of {0, 1, 1}: mean 2/3, var (4/9 + 2/9)/2 = 1/3, std .57735027
        #   -> [-2/3, 1/3, 1/3]/.57735027 = [-1.1547005, .57735027, .57735027]
        expected = [[0.70710678, -0.70710678, 0.0, 0.0], [-1.1547005, 0.57735027, 0.57735027, 0.0]]
        np.testing.assert_allclose(adv, expected, rtol=1e-6)
        loo = self.variant(advantages.loo)(rewards, valid)
        # Row 0: 1 - 0 = 1, 0 - 1 = -1. Row 1: 0 - 1 = -1, 1 - .5 = .5.
        np.testing.assert_allclose(loo, [[1.0, -1.0, 0, 0], [-1.0, 0.5, 0.5, 0]], rtol=1e-6)


# ------------------------------------------------------------ references and properties


@pytest.mark.parametrize("name", sorted(ADV_FNS))
@pytest.mark.parametrize("binary", [True, False])
def test_matches_numpy_reference(name, binary):
    fn, ref = ADV_FNS[name]
    rng = np.random.default_rng(hash((name, binary)) % 2**32)
    rewards, valid = _random_batch(rng, 16, 6, binary)
    got = jax.jit(fn)(rewards, valid)
    np.testing.assert_allclose(got, ref(rewards, valid), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("name", sorted(ADV_FNS))
def test_degenerate_groups_give_zeros(name):
    fn, _ = ADV_FNS[name]
    # all-equal (non-representable 0.1), single valid sample, empty, all-equal ones.
    rewards = jnp.array([[0.1, 0.1, 0.1], [0.7, 0.2, 0.3], [0.5, 0.9, 0.1], [1.0, 1.0, 1.0]])
    valid = jnp.array([[True] * 3, [False, True, False], [False] * 3, [True] * 3])
    adv = jax.jit(fn)(rewards, valid)
    chex.assert_trees_all_equal(adv, jnp.zeros((4, 3), jnp.float32))


@hypothesis.given(
    st.integers(0, 2**31 - 1), st.sampled_from(sorted(ADV_FNS)), st.booleans())
@SETTINGS
def test_permutation_and_padding_invariance(seed, name, binary):
    fn, _ = ADV_FNS[name]
    rng = np.random.default_rng(seed)
    rewards, valid = _random_batch(rng, 3, 4, binary)
    adv = np.asarray(fn(rewards, valid))
    assert np.all(np.isfinite(adv)) and np.all(adv[~valid] == 0)
    # Permuting samples within each group permutes the advantages the same way.
    perm = np.stack([rng.permutation(4) for _ in range(3)])
    rows = np.arange(3)[:, None]
    np.testing.assert_allclose(
        fn(rewards[rows, perm], valid[rows, perm]), adv[rows, perm], rtol=1e-5, atol=1e-6)
    # Padding with extra invalid samples (garbage rewards) changes nothing.
    padded_r = np.concatenate([rewards, rng.normal(size=(3, 3)).astype(np.float32) * 50], 1)
    padded_v = np.concatenate([valid, np.zeros((3, 3), bool)], 1)
    padded = np.asarray(fn(padded_r, padded_v))
    np.testing.assert_allclose(padded[:, :4], adv, rtol=1e-6, atol=1e-7)
    assert np.all(padded[:, 4:] == 0)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="scale"):
        advantages.grpo(jnp.zeros((2, 3)), scale="mad")
    with pytest.raises(TypeError, match="bool"):
        advantages.grpo(jnp.zeros((2, 3)), jnp.ones((2, 3)))
    with pytest.raises(AssertionError):
        advantages.loo(jnp.zeros((6,)))
    with pytest.raises(AssertionError):
        advantages.maxrl(jnp.zeros((2, 3)), jnp.ones((2, 4), bool))
    with pytest.raises(AssertionError):
        advantages.prompt_weighted(jnp.zeros((2, 3)), jnp.ones((3,)))


# ------------------------------------------------------------------------------ CurveRL


def _make_rewards(p_hats, group):
    """Each prompt gets round(p * G) leading successes."""
    rows = [[1.0 if i < round(p * group) else 0.0 for i in range(group)] for p in p_hats]
    return jnp.asarray(rows, jnp.float32)


class CurveRLReference:
    """The authors' procedure with plain Python lists (one list of p̂ per past batch)."""

    def __init__(self, window):
        self.window = window
        self.batches = []

    def step(self, rewards, valid, num_bins, eps=1e-6):
        rewards = np.asarray(rewards, np.float32)
        valid = np.asarray(valid, bool)
        flat = rewards[valid]
        if not np.all((flat >= 0) & (flat <= 1)):
            rewards = (rewards > 0).astype(np.float32)
        prompts = [p for p in range(rewards.shape[0]) if valid[p].any()]
        p_hat = {p: np.float32(rewards[p][valid[p]].sum()) / np.float32(valid[p].sum())
                 for p in prompts}
        inside = [p_hat[p] for p in prompts if 0 < p_hat[p] < 1]
        pool = [v for batch in self.batches for v in batch]
        reference = pool if pool else inside
        counts = [0.0] * num_bins
        for v in reference:
            counts[min(int(np.floor(np.float32(v) * np.float32(num_bins))), num_bins - 1)] += 1
        total = max(sum(counts), eps)
        mass = [x / total for x in counts]
        cdf = list(np.cumsum(mass))
        bin_weight = [m / max(f, eps) for m, f in zip(mass, cdf)]
        adv = np.zeros(rewards.shape)
        for p in prompts:
            if 0 < p_hat[p] < 1:
                b = min(int(np.floor(np.float32(p_hat[p]) * np.float32(num_bins))), num_bins - 1)
                adv[p, valid[p]] = bin_weight[b] * (rewards[p][valid[p]] - p_hat[p])
        self.batches.append(inside)
        while len(self.batches) > self.window:
            self.batches.pop(0)
        return adv


class CurveRLTest(parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_first_step_uses_current_batch(self):
        rewards = _make_rewards([0.25, 0.75, 0.0, 1.0], 4)
        adv, state = self.variant(advantages.curverl)(rewards, advantages.curverl_init(4))
        # num_bins = 5; .25 -> bin 1, .75 -> bin 3; mass [0, .5, 0, .5, 0],
        # cdf [0, .5, .5, 1, 1] -> w(.25) = 1, w(.75) = .5; p in {0, 1} -> w = 0.
        # A = w (R - p): row 0 [.75, -.25, -.25, -.25]; row 1 .5*[.25, .25, .25, -.75].
        expected = [[0.75, -0.25, -0.25, -0.25], [0.125, 0.125, 0.125, -0.375],
                    [0.0] * 4, [0.0] * 4]
        np.testing.assert_allclose(adv, expected, rtol=1e-6)
        # Only p in (0, 1) enter the window; slot 0 written, next slot 1.
        np.testing.assert_allclose(state.window_p_wn[0], [0.25, 0.75, 0.0, 0.0])
        chex.assert_trees_all_equal(state.window_valid_wn[0], jnp.array([True, True, False, False]))
        self.assertEqual(int(state.next_slot), 1)
        self.assertEqual(int(state.num_updates), 1)

    def test_reference_is_lagged(self):
        step = jax.jit(advantages.curverl)
        _, state = step(_make_rewards([0.5], 4), advantages.curverl_init(1))
        adv, state = step(_make_rewards([0.25], 4), state)
        # Reference = {0.5} (bin 2) only: bin 1 has mass 0, cdf 0 -> weight 0/1e-6 = 0,
        # so step 2 advantages are 0. Including the current batch would give weight 1.
        chex.assert_trees_all_equal(adv, jnp.zeros((1, 4), jnp.float32))
        np.testing.assert_allclose(state.window_p_wn[:2, 0], [0.5, 0.25])
        adv, _ = step(_make_rewards([0.75], 4), state)
        # Reference {.5 (bin 2), .25 (bin 1)}: mass [0, .5, .5, 0, 0], cdf(3) = 1, mass(3) = 0
        # -> w(.75) = 0 as well.
        chex.assert_trees_all_equal(adv, jnp.zeros((1, 4), jnp.float32))
        adv, _ = step(_make_rewards([0.5], 4), state)
        # w(.5) = mass(2)/cdf(2) = .5/1 = .5 -> A = .5 * [.5, .5, -.5, -.5].
        np.testing.assert_allclose(adv, [[0.25, 0.25, -0.25, -0.25]], rtol=1e-6)

    def test_window_zero_always_uses_current_batch(self):
        step = jax.jit(advantages.curverl)
        state = advantages.curverl_init(1, window=0)
        _, state = step(_make_rewards([0.5], 4), state)
        adv, state = step(_make_rewards([0.25], 4), state)
        # Single-bin reference -> weight 1 -> A = R - p = [.75, -.25, -.25, -.25].
        np.testing.assert_allclose(adv, [[0.75, -0.25, -0.25, -0.25]], rtol=1e-6)
        self.assertEqual(state.window_p_wn.shape, (0, 1))

    def test_empty_window_rows_fall_back_to_current(self):
        # A batch with only p in {0, 1} occupies a window row but adds no values, so the
        # next step still falls back to its own batch (the authors' `if pool_values`).
        step = jax.jit(advantages.curverl)
        _, state = step(_make_rewards([0.0, 1.0], 4), advantages.curverl_init(2))
        adv, _ = step(_make_rewards([0.25, 0.25], 4), state)
        np.testing.assert_allclose(adv, [[0.75, -0.25, -0.25, -0.25]] * 2, rtol=1e-6)

    def test_eviction_after_window_batches(self):
        step = jax.jit(advantages.curverl)
        state = advantages.curverl_init(1, window=2)
        for p in (0.5, 0.25, 0.75):
            _, state = step(_make_rewards([p], 4), state)
        # window 2 keeps the last two batches {.25, .75}; .5 was evicted.
        self.assertCountEqual(np.asarray(state.window_p_wn[:, 0]).tolist(), [0.25, 0.75])
        adv, _ = step(_make_rewards([0.25], 4), state)
        # Reference bins {1, 3}: w(.25) = .5/.5 = 1 -> A = R - .25.
        np.testing.assert_allclose(adv, [[0.75, -0.25, -0.25, -0.25]], rtol=1e-6)

    def test_non_unit_rewards_are_binarised(self):
        # Rewards outside [0, 1] -> success = R > 0 (the authors' mapping).
        rewards = jnp.array([[2.0, -0.5, -0.5, -0.5]])
        adv, _ = jax.jit(advantages.curverl)(rewards, advantages.curverl_init(1))
        np.testing.assert_allclose(adv, [[0.75, -0.25, -0.25, -0.25]], rtol=1e-6)

    def test_too_many_prompts_raises(self):
        with pytest.raises(ValueError, match="curverl_init"):
            advantages.curverl(jnp.zeros((3, 4)), advantages.curverl_init(2))
        with pytest.raises(ValueError, match="window"):
            advantages.curverl_init(2, window=-1)

    def test_no_recompilation(self):
        traces = []

        def traced_step(rewards, state):
            traces.append(None)
            return advantages.curverl(rewards, state)

        step = jax.jit(traced_step)
        state = advantages.curverl_init(3, window=4)
        for p in (0.25, 0.5):
            _, state = step(_make_rewards([p, 0.5, 0.75], 4), state)
        self.assertLen(traces, 1)


@pytest.mark.parametrize("window", [0, 1, 3])
def test_curverl_matches_list_reference_over_steps(window):
    rng = np.random.default_rng(window)
    group, width = 4, 6
    state = advantages.curverl_init(width, window=window)
    reference = CurveRLReference(window)
    step = jax.jit(advantages.curverl)
    for _ in range(9):
        num_p = int(rng.choice([4, 6]))  # P <= num_prompts; padded prompts are invalid
        rewards = (rng.random((num_p, group)) < rng.random((num_p, 1))).astype(np.float32)
        valid = rng.random((num_p, group)) < 0.85
        valid[0] = True  # one full group: the authors' num_bins (max K + 1) equals G + 1
        adv, state = step(rewards, state, valid)
        expected = reference.step(rewards, valid, num_bins=group + 1)
        np.testing.assert_allclose(adv, expected, rtol=1e-5, atol=1e-6)
        assert np.all(np.asarray(adv)[~valid] == 0)
        held = sorted(np.asarray(state.window_p_wn)[np.asarray(state.window_valid_wn)].tolist())
        assert held == sorted(v for batch in reference.batches for v in batch)


def test_curverl_weights_are_prompt_weighted():
    # A = curverl_prompt_weights(p̂, bin_weights(reference)) · (R - p̂).
    rewards = _make_rewards([0.25, 0.5, 0.5, 0.75], 4)
    adv, _ = advantages.curverl(rewards, advantages.curverl_init(4))
    p_hat = rewards.mean(axis=1)
    bw = weighting.curverl_bin_weights(p_hat, num_bins=5)
    expected = advantages.prompt_weighted(
        rewards, weighting.curverl_prompt_weights(p_hat, bw))
    np.testing.assert_allclose(adv, expected, rtol=1e-6)


# ------------------------------------------------------------------------ pair weighting


class PairWeightedTest(parameterized.TestCase):
    pair = jnp.array([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    # G = 8: a lone success on q+ and a lone failure on q-.
    lone = jnp.array([[1.0] + [0.0] * 7, [1.0] * 7 + [0.0]])

    @chex.variants(with_jit=True, without_jit=True)
    def test_default_group_scope_lone_success_before_weighting(self):
        adv = self.variant(functools.partial(advantages.pair_weighted, eps=0.0))(
            self.lone, neg_weight=1.0)
        # q+ row: s = [1, 0 x7], s̄ = 1/8; centred 7/8 and -1/8;
        #   unbiased var = (49/64 + 7/64)/7 = 1/8, std = 0.35355339
        #   -> 0.875/0.35355339 = 2.4748737, -0.125/0.35355339 = -0.35355339.
        # q- row mirrors it: the lone failure gets -2.4748737 (λ = 1 here).
        hi, lo = 0.875 / np.sqrt(1 / 8), 0.125 / np.sqrt(1 / 8)
        np.testing.assert_allclose(hi, 2.4748737, rtol=1e-7)
        np.testing.assert_allclose(adv, [[hi] + [-lo] * 7, [lo] * 7 + [-hi]], rtol=1e-6)
        self.assertEqual(adv.dtype, jnp.float32)

    @chex.variants(with_jit=True, without_jit=True)
    def test_group_scope_neg_weight_scales_the_negative_row(self):
        fn = self.variant(functools.partial(advantages.pair_weighted, eps=0.0))
        base = np.asarray(fn(self.lone, neg_weight=1.0))
        for lam in (0.0, 0.5, 3.0):
            adv = np.asarray(fn(self.lone, neg_weight=jnp.float32(lam)))
            np.testing.assert_allclose(adv[0], base[0], rtol=1e-6)  # q+ row weight 1
            np.testing.assert_allclose(adv[1], lam * base[1], rtol=1e-6, atol=1e-7)
        # The lone failure on q- under λ = 3: 3 · (-2.4748737) = -7.4246212.
        np.testing.assert_allclose(fn(self.lone, neg_weight=3.0)[1, 7], -7.4246212, rtol=1e-6)
        # Per-row weights [λ+, λ-] = [2, 0.5].
        adv = fn(self.lone, neg_weight=jnp.array([2.0, 0.5]))
        np.testing.assert_allclose(adv, base * np.array([[2.0], [0.5]]), rtol=1e-6)

    def test_group_scope_equals_grpo_on_success_times_row_weight(self):
        rng = np.random.default_rng(4)
        rewards = rng.random((3, 2, 6)).astype(np.float32)  # non-binary: thresholded at 0.5
        valid = rng.random((3, 2, 6)) < 0.8
        got = advantages.pair_weighted(rewards, neg_weight=0.25, valid_2g=valid)
        success = (rewards >= 0.5).astype(np.float32).reshape(6, 6)
        want = np.asarray(advantages.grpo(success, valid.reshape(6, 6))).reshape(3, 2, 6)
        np.testing.assert_allclose(got, want * np.array([1.0, 0.25])[None, :, None], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_pair_scope(self):
        fn = functools.partial(advantages.pair_weighted, scope="pair", eps=0.0)
        adv = self.variant(fn)(self.pair, neg_weight=2.0)
        # y = [[1, -2, -2, -2], [1, 1, 1, -2]]; pooled mean = (4 - 8)/8 = -.5;
        # deviations ±1.5; unbiased var = 8 * 2.25 / 7 = 18/7; std = 1.6035675
        # -> ±1.5 / 1.6035675 = ±.93541435.
        s = 1.5 / np.sqrt(18 / 7)
        np.testing.assert_allclose(adv, [[s, -s, -s, -s], [s, s, s, -s]], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_mean_scope(self):
        fn = functools.partial(advantages.pair_weighted, scope="mean")
        adv = self.variant(fn)(self.pair, neg_weight=2.0)
        # y - (-.5): successes 1.5, failures -1.5.
        np.testing.assert_allclose(adv, [[1.5, -1.5, -1.5, -1.5], [1.5, 1.5, 1.5, -1.5]])

    @chex.variants(with_jit=True, without_jit=True)
    def test_per_row_neg_weight_mean_scope(self):
        fn = functools.partial(advantages.pair_weighted, scope="mean")
        adv = self.variant(fn)(self.pair, neg_weight=jnp.array([0.0, 4.0]))
        # y = [[1, 0, 0, 0], [1, 1, 1, -4]]: mean = (4 - 4)/8 = 0 -> A = y.
        np.testing.assert_allclose(adv, [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, -4.0]])

    def test_scalar_neg_weight_cancels_in_pair_scope(self):
        # A scalar λ on the outcomes is an affine map of the success bit: pooled z-scores
        # ignore it (documented), which is why "pair" is not the default.
        a = advantages.pair_weighted(self.pair, neg_weight=0.5, scope="pair")
        b = advantages.pair_weighted(self.pair, neg_weight=3.0, scope="pair")
        np.testing.assert_allclose(a, b, rtol=1e-5)

    def test_batch_of_pairs_and_validity(self):
        rng = np.random.default_rng(0)
        batch = (rng.random((3, 2, 5)) < 0.5).astype(np.float32)
        valid = rng.random((3, 2, 5)) < 0.8
        for scope in ("pair", "group", "mean"):
            fn = jax.jit(functools.partial(advantages.pair_weighted, scope=scope))
            got = fn(batch, neg_weight=1.5, valid_2g=valid)
            for n in range(3):
                one = fn(batch[n], neg_weight=1.5, valid_2g=valid[n])
                np.testing.assert_allclose(got[n], one, rtol=1e-6)
            assert np.all(np.asarray(got)[~valid] == 0)
            assert np.all(np.isfinite(got))

    def test_traced_neg_weight_does_not_recompile(self):
        fn = jax.jit(advantages.pair_weighted)
        a = fn(self.lone, neg_weight=jnp.float32(1.0))
        b = fn(self.lone, neg_weight=jnp.float32(2.0))
        self.assertEqual(fn._cache_size(), 1)  # pylint: disable=protected-access
        np.testing.assert_allclose(b[1], 2.0 * np.asarray(a[1]), rtol=1e-6)

    def test_degenerate_pairs_give_zeros(self):
        for scope in ("pair", "group", "mean"):
            fn = jax.jit(functools.partial(advantages.pair_weighted, scope=scope))
            for valid in (jnp.ones((2, 4), bool), jnp.zeros((2, 4), bool)):
                adv = fn(jnp.ones((2, 4)), neg_weight=1.0, valid_2g=valid)
                chex.assert_trees_all_equal(adv, jnp.zeros((2, 4), jnp.float32))

    def test_bad_inputs_raise(self):
        with pytest.raises(ValueError, match=r"\[2, G\]"):
            advantages.pair_weighted(jnp.zeros((3, 4)), neg_weight=1.0)
        with pytest.raises(ValueError, match="scope"):
            advantages.pair_weighted(self.pair, neg_weight=1.0, scope="batch")
        with pytest.raises(ValueError, match=">= 0"):
            advantages.pair_weighted(self.pair, neg_weight=-1.0)
        with pytest.raises(ValueError, match="neg_weight"):
            advantages.pair_weighted(self.pair, neg_weight=jnp.ones(3))


# ------------------------------------------------------------------ MaxRL with shaping


class MaxRLShapingTest(parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_no_success_penalty_only(self):
        rewards = jnp.array([[-1.0, 0.0, 0.0, 0.0]])
        success = jnp.zeros((1, 4))
        adv = self.variant(advantages.maxrl)(rewards, success_pg=success)
        # Success part: s̄ = 0 -> 0. Shaping h = [-1, 0, 0, 0], h̄ = -.25 -> [-.75, .25, .25, .25].
        np.testing.assert_allclose(adv, [[-0.75, 0.25, 0.25, 0.25]], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_success_and_penalty_add(self):
        # Successes [1, 1, 0, 0]; sample 1 also pays an overlong penalty of 0.5.
        success = jnp.array([[1.0, 1.0, 0.0, 0.0]])
        rewards = jnp.array([[1.0, 0.5, 0.0, 0.0]])
        adv = self.variant(functools.partial(advantages.maxrl, eps=0.0))(
            rewards, success_pg=success)
        # Success part: s̄ = .5 -> (s - .5)/.5 = [1, 1, -1, -1].
        # Shaping h = [0, -.5, 0, 0], h̄ = -.125 -> [.125, -.375, .125, .125].
        np.testing.assert_allclose(adv, [[1.125, 0.625, -0.875, -0.875]], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_without_success_nonpositive_mean_gives_zero(self):
        # Old formula: [-1, 0, 0, 0] gave the penalised response +3 and [-.5, .5, 0, 0]
        # gave ±5e5 (division by R̄ + eps with R̄ = 0).
        rewards = jnp.array([[-1.0, 0.0, 0.0, 0.0], [-0.5, 0.5, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
        adv = self.variant(functools.partial(advantages.maxrl, eps=0.0))(rewards)
        # Row 2 keeps MaxRL: R̄ = .25 -> [3, -1, -1, -1].
        np.testing.assert_allclose(
            adv, [[0.0] * 4, [0.0] * 4, [3.0, -1.0, -1.0, -1.0]], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_ragged_with_success(self):
        success = jnp.array([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 1.0]])
        rewards = jnp.array([[1.0, -1.0, 0.0, 7.0], [0.0, -0.5, 1.0, 9.0]])
        valid = jnp.array([[True, True, True, False], [True, True, True, False]])
        adv = self.variant(functools.partial(advantages.maxrl, eps=0.0))(
            rewards, valid, success_pg=success)
        # Row 0 (valid 3): s = [1, 0, 0], s̄ = 1/3 -> [2, -1, -1]; h = [0, -1, 0], h̄ = -1/3
        #   -> [1/3, -2/3, 1/3]; sum [7/3, -5/3, -2/3].
        # Row 1: s = [0, 0, 1] -> [-1, -1, 2]; h = [0, -.5, 0], h̄ = -1/6 -> [1/6, -1/3, 1/6];
        #   sum [-5/6, -4/3, 13/6].
        np.testing.assert_allclose(
            adv, [[7 / 3, -5 / 3, -2 / 3, 0.0], [-5 / 6, -4 / 3, 13 / 6, 0.0]], rtol=1e-6)

    def test_success_equal_to_rewards_matches_plain_maxrl(self):
        rng = np.random.default_rng(7)
        rewards, valid = _random_batch(rng, 8, 6, binary=True)
        np.testing.assert_allclose(
            jax.jit(advantages.maxrl)(rewards, valid, success_pg=rewards),
            advantages.maxrl(rewards, valid), rtol=1e-6, atol=1e-7)

    @hypothesis.given(st.integers(0, 2**31 - 1))
    @SETTINGS
    def test_shaped_advantages_stay_bounded(self, seed):
        # Successes in {0, 1}, penalties in [-1, 0]: |A| <= G (1/p̂ <= G) + 1.
        rng = np.random.default_rng(seed)
        success = (rng.random((4, 8)) < rng.random((4, 1))).astype(np.float32)
        rewards = success - rng.random((4, 8)).astype(np.float32) * (rng.random((4, 8)) < 0.3)
        valid = rng.random((4, 8)) < 0.9
        adv = np.asarray(advantages.maxrl(rewards, valid, success_pg=success))
        assert np.all(np.isfinite(adv)) and np.all(np.abs(adv) <= 9.0)
        assert np.all(adv[~valid] == 0)
        unshaped = np.asarray(advantages.maxrl(rewards, valid))
        assert np.all(np.isfinite(unshaped))


def test_curverl_success_pg_keeps_a_reward_penalty():
    # Verifier outcomes and the shaped reward (sample 2 of prompt 0 pays a 0.5 overlong penalty).
    success = jnp.array([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    rewards = jnp.array([[1.0, 1.0, -0.5, 0.0], [1.0, 1.0, 0.0, 0.0]])
    state = advantages.curverl_init(2, window=2)
    # p̂ = 0.5 for both prompts; first step -> reference = this batch; G = 4 -> 5 bins,
    # bin(0.5) = floor(2.5) = 2 holds all the mass: mass[2] = 1, cdf[2] = 1, w = 1.
    # Row 0: R̄ = (1 + 1 - 0.5 + 0)/4 = 0.375 -> [0.625, 0.625, -0.875, -0.375].
    adv, _ = jax.jit(advantages.curverl)(rewards, state, success_pg=success)
    np.testing.assert_allclose(
        adv, [[0.625, 0.625, -0.875, -0.375], [0.5, 0.5, -0.5, -0.5]], rtol=1e-6)
    # Without success_pg the authors' mapping binarises the whole batch (R > 0): the
    # penalty disappears.
    adv_default, _ = advantages.curverl(rewards, state)
    np.testing.assert_allclose(adv_default, [[0.5, 0.5, -0.5, -0.5]] * 2, rtol=1e-6)
