"""Batch strategies on scripted reward streams: no model, no monkeypatching.

A scripted ``sample_round`` returns trajectories whose verifier scores come from a fixed
table of per-prompt outcomes, so every keep / continue decision is known in advance.
"""

import numpy as np
import pytest

from jaxrl_vr.selection import strategies
from jaxrl_vr.selection.dynamic import DynamicStats, RecheckSchedule, SkipSuspended, dynamic_batch
from jaxrl_vr.selection.order import DataOrder
from jaxrl_vr.selection.two_stage import TwoStageStats, two_stage_batch

from trajectory_testlib import T, scripted


def test_plain_batch_is_one_round_of_the_next_prompts():
    order = DataOrder(10, seed=0)
    sample = scripted(lambda p, g, c: float(g == 0))
    batch = strategies.plain_batch(sample, order.next_prompts, num_prompts=4, num_samples=3)
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
    assert isinstance(batch.stats.strategy, DynamicStats)
    assert batch.stats.strategy.rounds == rounds == batch.stats.rounds
    assert batch.stats.strategy.metrics()["dynamic/rounds"] == rounds
    # Budget: every generated token of every round, kept or filtered.
    assert batch.stats.generated_tokens == rounds * 4 * 2 * 2


def test_dynamic_batch_pads_with_invalid_groups_when_the_budget_is_spent():
    order = DataOrder(20, seed=2)
    first = int(np.random.default_rng([2, 0]).permutation(20)[0])
    sample = scripted(lambda p, g, c: float(p == first and g == 0))
    batch = dynamic_batch(sample, order.next_prompts, num_prompts=4, num_samples=2, max_rounds=2)
    assert batch.num_prompts == 4 and len(sample.calls) == 2
    assert batch.valid_pg.sum(1).tolist() == [2, 0, 0, 0]
    assert not batch.token_mask_bt[2:].any() and not batch.loss_mask_bt[2:].any()
    assert not batch.rewards_b[2:].any() and not batch.overlong_b[2:].any()
    assert batch.stats.strategy.batch_fill == 0.25


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
    assert not batch.loss_mask_bt.reshape(4, 5, T)[~batch.valid_pg].any()
    assert batch.stats.generated_samples == 4 * 2 + 2 * 3
    assert batch.stats.strategy == TwoStageStats(0.5)


def test_adaptive_g_spends_exactly_the_fixed_total_on_in_band_prompts():
    order = DataOrder(4, seed=0)
    sample = scripted(lambda p, g, c: float(p < 2 or g % 2 == 0))  # p >= 2: rate 1/2
    batch = two_stage_batch(sample, order.next_prompts, num_prompts=4, g_probe=2, g_full=4,
                            lo=0.1, hi=0.9, adaptive_g_max=6)
    assert batch.valid_pg.shape == (4, 6)
    assert int(batch.valid_pg.sum()) == 4 * 4 == batch.stats.generated_samples
    per_prompt = dict(zip(batch.prompt_idx_p.tolist(), batch.valid_pg.sum(1).tolist()))
    assert per_prompt[2] == per_prompt[3] == 6 and per_prompt[0] == per_prompt[1] == 2


def test_registry_builds_each_strategy_with_its_settings():
    context = strategies.StrategyContext(num_prompts=2, samples_per_prompt=2, num_items=8)
    plain = strategies.make_batch_strategy("plain", context=context)
    order = DataOrder(8, seed=0)
    assert plain.wrap_source(order) is order and plain.state_dict() is None
    assert plain(scripted(lambda p, g, c: 1.0), order.next_prompts).valid_pg.shape == (2, 2)
    dynamic = strategies.make_batch_strategy(
        "dynamic", strategies.DynamicSettings(max_rounds=2, recheck_interval=3), context=context)
    source = dynamic.wrap_source(DataOrder(8, seed=0))
    assert isinstance(source, SkipSuspended) and dynamic.state_key == "recheck"
    dynamic.begin_step(4)
    dynamic(scripted(lambda p, g, c: 0.0), source.next_prompts)  # everything filtered
    assert (dynamic.state_dict()["until_p"] > 4).any()
    with pytest.raises(ValueError, match="batch strategy 'dynamc'.*did you mean 'dynamic'"):
        strategies.make_batch_strategy("dynamc", context=context)


def test_strategy_settings_check_their_values_and_the_rl_config():
    with pytest.raises(ValueError, match="max_rounds"):
        strategies.DynamicSettings(max_rounds=0)
    with pytest.raises(ValueError, match="lo <= hi"):
        strategies.TwoStageSettings(lo=0.8, hi=0.2)

    class RL:
        samples_per_prompt = 4

    with pytest.raises(ValueError, match="probe=5"):
        strategies.TwoStageSettings(probe=5).check(RL)
    assert strategies.batch_group_size(strategies.TwoStageSettings(adaptive_g_max=6), 4) == 6
    assert strategies.batch_group_size(strategies.DynamicSettings(), 4) == 4
