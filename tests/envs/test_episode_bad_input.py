"""Bad input in episodes: an environment that raises, hangs or returns non-text ends its
episode with a logged error and zero reward; a call that does not parse is an observation;
unknown tool / environment names and templates without tool turns fail at start-up."""

import time

import jax
import numpy as np
import pytest

from jaxrl_vr.envs import Environment, Renderer, StepResult, TemplateError, make_env_factory, make_tool
from jaxrl_vr.registry import UnknownNameError
from jaxrl_vr.tasks import TaskItem
from jaxrl_vr.train.rollout import RewardShaper, RoundSampler, RoundScorer, SamplingConfig, encode_episode_prompts
from jaxrl_vr.verifiers import pool as pool_lib

from scripted_episodes import TOKENIZER, runner, tool_env

ITEM = TaskItem(uid="a", prompt="2*3=", answer="6", verifier="exact")


class Broken(Environment):
    stop_strings = ("]",)

    def __init__(self, how):
        self.how = how

    def reset(self, item):
        return [{"role": "user", "content": item.prompt}]

    def step(self, model_text):
        if self.how == "raise":
            raise RuntimeError("boom")
        if self.how == "hang":
            time.sleep(2.0)
        if self.how == "non_text":
            return StepResult(observation=[{"role": "user", "content": 6}], done=False)
        return StepResult(observation=[{"role": "user", "content": "{6}"}], done=False)


@pytest.mark.parametrize("how, message", [("raise", "RuntimeError: boom"), ("hang", "timed out"),
                                          ("non_text", "observation must be")])
def test_a_broken_environment_ends_the_episode_scores_zero_and_is_logged(how, message):
    episodes = runner([["[2*3]", "6"]], lambda: Broken(how), step_timeout_s=0.5)
    logged = []
    tokens, mask = encode_episode_prompts(episodes, [ITEM])
    sampler = RoundSampler(
        tokens, mask, score=RoundScorer([ITEM], TOKENIZER, pool_lib.score_serial,
                                        on_result=lambda items, texts, result: logged.append(result)),
        shape_rewards=RewardShaper(max_len=48), sampling=SamplingConfig(), min_prompts=1,
        episodes=episodes, items=[ITEM])
    traj = sampler.sample(None, jax.random.key(0), np.array([0]), 1)
    episodes.close()
    assert traj.scores_b.tolist() == [0.0] and traj.rewards_b.tolist() == [0.0]
    assert traj.stats.env_errors == 1 and traj.stats.verifier_errors >= 1
    errors = [e for result in logged for e in result.errors if e]
    assert len(errors) == 1 and message in errors[0] and errors[0].startswith("environment: ")


def test_a_call_that_does_not_parse_is_an_observation():
    env = tool_env()
    result = env.step('[{"name": "calc", "arguments": {}}]')
    assert not result.done and not result.tool_calls[0].parsed
    assert "unknown tool 'calc'" in result.observation[0]["content"]
    result = env.step("2*3]")
    assert not result.done and "has no [" in result.observation[0]["content"]


def test_unknown_names_fail_at_start_up_with_did_you_mean():
    with pytest.raises(UnknownNameError, match="did you mean 'python'"):
        make_tool("pyhton")
    with pytest.raises(UnknownNameError, match="did you mean 'tools'"):
        make_env_factory("tool")


def test_a_template_without_tool_turns_fails_at_start_up_naming_the_model():
    class NoToolRole:
        def apply_chat_template(self, messages, add_generation_prompt=True):
            if any(m["role"] == "tool" for m in messages):
                raise ValueError("Conversation roles must alternate user/assistant")
            return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

        def encode(self, text, add_bos=False):
            return list(text.encode())

    renderer = Renderer(NoToolRole(), chat=True, model_name="model.source=hf acme/tiny")
    with pytest.raises(TemplateError, match="acme/tiny.*task.env.role=user"):
        renderer.check("tool")
    assert renderer.check("user") > 0
