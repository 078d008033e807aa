"""Batch strategies on scripted reward streams: no model, no monkeypatching.

A scripted ``sample_round`` returns Rounds whose verifier scores come from a fixed table of
per-prompt outcomes, so every keep / continue decision is known in advance.
"""

import numpy as np
import pytest

from jaxrl_vr.selection.dynamic import RecheckSchedule, dynamic_batch
from jaxrl_vr.selection.two_stage import two_stage_batch
from jaxrl_vr.train import rounds as rounds_lib
from jaxrl_vr.train.prompts import DataOrder, SkipSuspended

T, S = 3, 2


def scripted(outcome_fn):
    """sample_round whose sample g of prompt p scores outcome_fn(p, g, call) (0 or 1)."""
    calls = []

    def sample_round(prompt_idx, num_samples):
        idx = np.asarray(prompt_idx, np.int64)
        call = len(calls)
        calls.append((idx.tolist(), int(num_samples)))
        num_b = len(idx) * num_samples
        scores = np.asarray([outcome_fn(int(p), g, call) for p in idx for g in range(num_samples)],
                            np.float32)
        length_b = np.full(num_b, 2, np.int32)
        return rounds_lib.Round(
            prompt_idx_p=idx,
            prompt_tokens_ps=np.repeat(idx[:, None], S, axis=1).astype(np.int32),
            prompt_mask_ps=np.ones((len(idx), S), bool),
            tokens_bt=np.repeat(np.repeat(idx, num_samples)[:, None], T, axis=1).astype(np.int32),
            mask_bt=np.arange(T)[None, :] < length_b[:, None],
            sampler_logp_bt=np.full((num_b, T), -0.5, np.float32),
            length_b=length_b,
            truncated_b=np.zeros(num_b, bool),
            scores_b=scores,
            rewards_b=scores - 0.1,  # shaped rewards differ from scores
            valid_pg=np.ones((len(idx), num_samples), bool),
            stats={"generated_tokens": float(length_b.sum()), "generated_samples": float(num_b)},
        )

    sample_round.calls = calls
    return sample_round


def test_plain_batch_is_one_round_of_the_next_prompts():
    order = DataOrder(10, seed=0)
    sample = scripted(lambda p, g, c: float(g == 0))
    batch = rounds_lib.plain_batch(sample, order.next_prompts, num_prompts=4, num_samples=3)
    assert sample.calls == [(np.random.default_rng([0, 0]).permutation(10)[:4].tolist(), 3)]
    assert batch.valid_pg.shape == (4, 3) and batch.valid_pg.all()
    assert order.position == 4


def test_dynamic_batch_keeps_informative_groups_over_rounds_and_counts_every_token():
    # Even prompts are informative (scores differ within the group), odd ones all wrong.
    order = DataOrder(20, seed=1)
    sample = scripted(lambda p, g, c: float(p % 2 == 0 and g == 0))
    batch = dynamic_batch(sample, order.next_prompts, num_prompts=4, num_samples=2, max_rounds=5)
    assert all(p % 2 == 0 for p in batch.prompt_idx_p.tolist())
    assert batch.valid_pg.all()
    rounds = len(sample.calls)
    assert batch.stats["dynamic/rounds"] == rounds
    # Budget: every generated token of every round, kept or filtered.
    assert batch.stats["generated_tokens"] == rounds * 4 * 2 * 2
    # The logged reward/pass rate cover every sampled group, not only the kept ones.
    assert batch.stats["sampled/pass_rate"] < 0.5 == float(
        (batch.scores_b.reshape(4, 2) >= 0.5).mean())


def test_dynamic_batch_pads_with_invalid_groups_when_the_budget_is_spent():
    order = DataOrder(20, seed=2)
    sample = scripted(lambda p, g, c: float(p == order_first[0] and g == 0))
    order_first = [int(np.random.default_rng([2, 0]).permutation(20)[0])]
    batch = dynamic_batch(sample, order.next_prompts, num_prompts=4, num_samples=2, max_rounds=2)
    assert batch.num_prompts == 4 and len(sample.calls) == 2
    assert batch.valid_pg.sum(1).tolist() == [2, 0, 0, 0]
    assert not batch.mask_bt[2:].any() and not batch.rewards_b[2:].any()
    assert batch.stats["dynamic/batch_fill"] == 0.25


def test_dynamic_batch_records_filtered_prompts_for_the_recheck_schedule():
    order = DataOrder(8, seed=3)
    recheck = RecheckSchedule(8, interval=5)
    sample = scripted(lambda p, g, c: float(p < 4 and g == 0))
    dynamic_batch(sample, order.next_prompts, num_prompts=2, num_samples=2, max_rounds=4,
                  recheck=recheck, step=10)
    drawn = [p for idx, _ in sample.calls for p in idx]
    suspended = [p for p in drawn if p >= 4]
    assert suspended and not recheck.admissible(12)[suspended].any()
    assert recheck.admissible(15)[suspended].all()


def test_skip_suspended_defers_filtered_prompts_until_their_recheck():
    order = DataOrder(6, seed=0)
    admissible = np.ones(6, bool)
    source = SkipSuspended(order, lambda step: admissible)
    first = np.random.default_rng([0, 0]).permutation(6)
    admissible[first[0]] = False
    got = source.next_prompts(2)
    assert first[0] not in got and source.pending == [int(first[0])]
    admissible[first[0]] = True
    assert source.next_prompts(1).tolist() == [int(first[0])]  # served first once admissible
    state = source.state_dict()
    again = SkipSuspended(DataOrder(6, seed=0), lambda step: admissible)
    again.load_state_dict(state)
    assert again.next_prompts(2).tolist() == source.next_prompts(2).tolist()


def test_two_stage_continues_in_band_prompts_and_pads_the_others():
    # Prompt p passes its probe samples iff p < 2 -> probe rate 1 (out of band [0, 0.5]).
    order = DataOrder(4, seed=0)
    sample = scripted(lambda p, g, c: float(p < 2))
    batch = two_stage_batch(sample, order.next_prompts, num_prompts=4, g_probe=2, g_full=5,
                            lo=0.0, hi=0.5)
    probe_idx = sample.calls[0][0]
    cont = [p for p in probe_idx if p >= 2]
    assert sample.calls[1] == (cont, 3)  # one continuation call with G_full − G_probe samples
    valid = {p: row.sum() for p, row in zip(batch.prompt_idx_p.tolist(), batch.valid_pg)}
    assert all(valid[p] == (5 if p >= 2 else 2) for p in valid)
    assert not batch.mask_bt.reshape(4, 5, T)[~batch.valid_pg].any()
    assert batch.stats["generated_samples"] == 4 * 2 + 2 * 3
    assert batch.stats["two_stage/continued_frac"] == 0.5


def test_adaptive_g_spends_exactly_the_fixed_total_on_in_band_prompts():
    order = DataOrder(4, seed=0)
    sample = scripted(lambda p, g, c: float(p < 2 or g % 2 == 0))  # p >= 2: rate 1/2
    batch = two_stage_batch(sample, order.next_prompts, num_prompts=4, g_probe=2, g_full=4,
                            lo=0.1, hi=0.9, adaptive_g_max=6)
    assert batch.valid_pg.shape == (4, 6)
    assert int(batch.valid_pg.sum()) == 4 * 4 == batch.stats["generated_samples"]
    per_prompt = dict(zip(batch.prompt_idx_p.tolist(), batch.valid_pg.sum(1).tolist()))
    assert per_prompt[2] == per_prompt[3] == 6 and per_prompt[0] == per_prompt[1] == 2


def test_round_helpers_keep_fields_aligned():
    sample = scripted(lambda p, g, c: float(g == p % 2))
    a = sample(np.array([0, 1]), 2)
    wide = rounds_lib.widen(a, 3)
    assert wide.valid_pg.tolist() == [[True, True, False], [True, True, False]]
    assert wide.tokens_bt.shape == (6, T) and not wide.mask_bt[[2, 5]].any()
    more = sample(np.array([1]), 1)
    placed = rounds_lib.place_samples(wide, more, np.array([1]), 2)
    assert placed.valid_pg[1].all() and placed.stats["generated_samples"] == 5
    picked = rounds_lib.select_groups(placed, np.array([False, True]))
    assert picked.prompt_idx_p.tolist() == [1] and picked.scores_b.shape == (3,)
    padded = rounds_lib.pad_groups(picked, 3)
    assert padded.valid_pg.sum() == 3 and padded.prompt_idx_p.tolist() == [1, 1, 1]
    with pytest.raises(ValueError, match="fit"):
        rounds_lib.place_samples(wide, more, np.array([1]), 3)
