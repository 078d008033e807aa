"""Step-level credit through the round sampler on scripted episodes: signals per model turn,
credit on that turn's tokens only (never on environment tokens), the logged statistics and
the episode hack detectors."""

import jax
import numpy as np
import pytest

from jaxrl_vr import estimators
from jaxrl_vr.envs import TurnRecord, ToolCall
from jaxrl_vr.envs.signals import SIGNALS, StepCreditSettings, code_compiles
from jaxrl_vr.tasks import TaskItem
from jaxrl_vr.train.batch import build_batch
from jaxrl_vr.train.metrics import rollout_metrics
from jaxrl_vr.train.rollout import (RewardShaper, RoundSampler, RoundScorer, SamplingConfig,
                                    encode_episode_prompts)
from jaxrl_vr.verifiers import pool as pool_lib

from scripted_episodes import runner

ITEMS = [TaskItem(uid="a", prompt="47*86=", answer="4042", verifier="exact")]
# b0 calls the tool and copies its output; b1's call fails to compile and run; b2 answers
# at once (no call: no tool signal); b3 prints the answer from the tool (a hack).
SCRIPT = [["[47*86]", "4042"], ["[47*]", "4000"], ["4042"], ["[print(4042)]", "4042"]]
DETECTORS = ("answer_from_tool", "tool_spam", "empty_turn", "empty_or_truncated")


def sample(hack_coef=0.0, script=SCRIPT, on_result=None):
    episodes = runner(script)
    tokens, mask = encode_episode_prompts(episodes, ITEMS)
    sampler = RoundSampler(
        tokens, mask, score=RoundScorer(ITEMS, episodes.renderer.tokenizer, pool_lib.score_serial,
                                        hack_detectors=DETECTORS, on_result=on_result, max_tool_calls=4),
        shape_rewards=RewardShaper(max_len=48, hack_coef=hack_coef), sampling=SamplingConfig(),
        min_prompts=1, episodes=episodes, items=ITEMS)
    traj = sampler.sample(None, jax.random.key(0), np.array([0]), len(script))
    episodes.close()
    return traj


def test_signals_per_turn_and_credit_only_on_that_turn_s_tokens():
    traj = sample()
    np.testing.assert_allclose(traj.scores_b, [1, 0, 1, 1])
    n = {name: i for i, name in enumerate(SIGNALS)}
    assert traj.signals_bkn.shape == (4, 3, len(SIGNALS))
    np.testing.assert_array_equal(traj.signals_bkn[:, 0, n["tool_ok"]], [1, 0, np.nan, 1])
    np.testing.assert_array_equal(traj.signals_bkn[:, 0, n["compiles"]], [1, 0, np.nan, 1])
    np.testing.assert_array_equal(traj.signals_bkn[:, 0, n["tool_parsed"]], [1, 1, np.nan, 1])
    assert np.isnan(traj.signals_bkn[:, 1:]).all() and np.isnan(traj.signals_bkn[:, :, n["tests_passed"]]).all()
    # Turns: b0 = "[47*86]" (7 tokens, turn 0), "{4042}" (6, env), "4042"+EOS (5, turn 1).
    np.testing.assert_array_equal(traj.turn_bt[0, :19], [0] * 7 + [-1] * 6 + [1] * 5 + [-1])
    assert (traj.turn_bt[~traj.loss_mask_bt] == -1).all() and (traj.turn_bt[traj.loss_mask_bt] >= 0).all()

    coefs = StepCreditSettings(tool_parsed=1.0, tool_ok=0.5, compiles=0.25)
    est = estimators.make_estimator("grpo")
    outcome, _ = build_batch(traj, est, est.init(), behaviour_logprobs=None, reference_logprobs=None)
    built, _ = build_batch(traj, est, est.init(), behaviour_logprobs=None, reference_logprobs=None,
                           step_credit_coef_n=coefs.coef_n())
    credit_bt = np.asarray(built.adv_bt) - np.asarray(outcome.adv_bt)
    # tool_ok and compiles: 1, 0, 1 on the call turns (baseline 2/3); tool_parsed is 1 on
    # all of them, so it adds nothing; the answer turns have no signal.
    on_call = (0.5 + 0.25) * np.array([1 / 3, -2 / 3, 0.0, 1 / 3])
    expected = np.where(traj.turn_bt == 0, on_call[:, None], 0.0)
    np.testing.assert_allclose(credit_bt, expected, atol=1e-6)
    assert not np.asarray(built.adv_bt)[~traj.loss_mask_bt].any()  # environment tokens and padding
    np.testing.assert_allclose(np.asarray(outcome.adv_bt)[~traj.loss_mask_bt], 0.0)

    metrics = rollout_metrics(built, traj, logprob_gap=False)
    np.testing.assert_allclose(metrics["credit/tool_ok/mean"], 2 / 3)
    np.testing.assert_allclose(metrics["credit/tool_ok/corr_verdict"], 1.0)
    np.testing.assert_allclose(metrics["credit/tool_parsed/mean"], 1.0)
    assert np.isnan(metrics["credit/tool_parsed/corr_verdict"])  # constant signal
    assert np.isnan(metrics["credit/tests_passed/mean"])


def test_episode_detectors_are_counted_always_and_penalize_only_with_hack_coef():
    off, on = sample(0.0), sample(1.0)
    counts = dict(off.stats.detector_counts)
    assert counts == {"answer_from_tool": 1.0, "tool_spam": 0.0, "empty_turn": 0.0, "empty_or_truncated": 0.0}
    np.testing.assert_allclose(off.rewards_b, [1, 0, 1, 1])
    np.testing.assert_allclose(on.rewards_b, [1, 0, 1, 0])
    metrics = rollout_metrics(off._replace(adv_bt=np.zeros_like(off.sampler_logp_bt)), off, logprob_gap=False)
    assert metrics["hack/answer_from_tool"] == 0.25 and metrics["hack/empty_turn"] == 0.0


def test_spam_and_empty_turns_through_the_sampler():
    traj = sample(1.0, script=[["[2*3]", "[2*3]", "6"], ["[2*3]", " ", "6"]])
    counts = dict(traj.stats.detector_counts)
    assert counts["tool_spam"] == 1.0 and counts["empty_turn"] == 1.0
    np.testing.assert_allclose(traj.rewards_b, [-1.0, -1.0])  # wrong answer (gold 4042) and a hack


def test_code_compiles_parses_only():
    assert code_compiles("print(47*86)") and code_compiles("x = '\\d'")
    assert not code_compiles("47*") and not code_compiles("a\x00b") and not code_compiles("(" * 500 + ")" * 500)
    turn = TurnRecord("[x]", (ToolCall("python", code="import os; os.remove('x')"),), {"tests_passed": 0.5})
    assert SIGNALS["compiles"](turn) == 1.0 and SIGNALS["tests_passed"](turn) == 0.5
    assert np.isnan(SIGNALS["tests_passed"](TurnRecord("", (), {"tests_passed": "all"})))
    assert SIGNALS["tests_passed"](TurnRecord("", (), {"tests_passed": 3})) == 1.0


def test_step_credit_settings_match_the_signals_and_refuse_bad_coefficients():
    assert list(StepCreditSettings().__dataclass_fields__) == list(SIGNALS)
    with pytest.raises(ValueError, match="rl.step_credit.tool_ok"):
        StepCreditSettings(tool_ok=-1.0)
    with pytest.raises(ValueError, match="compiles"):
        StepCreditSettings(compiles=float("nan"))
