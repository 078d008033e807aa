"""The episode runner on scripted policies: ids, masks, segments and tool calls are kept
exactly; bad environments end their episode, never the run; names fail at start-up."""

import time

import jax
import numpy as np
import pytest

from jaxrl_vr.envs import (EpisodeLimits, EpisodeRunner, Environment, Renderer, StepResult, ToolEnvSettings,
                           make_env_factory, make_tool)
from jaxrl_vr.models.tokenizers import CharTokenizer
from jaxrl_vr.registry import UnknownNameError
from jaxrl_vr.sampling import multiturn as mt
from jaxrl_vr.tasks.base import TaskItem
from jaxrl_vr.tasks.tool_arith import TOOL_ALPHABET
from jaxrl_vr.train.rollout import encode_episode_prompts

TOK = CharTokenizer(TOOL_ALPHABET)
EOS = TOK.eos_id


class ScriptedSampler:
    """``multiturn``'s interface with a fixed script: row b's turn t emits script[b][t]
    (ids; its end decides the stop: EOS, a stop sequence, else the cap)."""

    def __init__(self, script):
        self.script, self.appended, self.turn = script, [], 0

    def start(self, model, tokens_ps, mask_ps, *, num_samples, capacity):
        self.batch = len(tokens_ps) * num_samples
        return "session"

    def decode_turn(self, key, model, session, live_b, *, max_tokens, stop_sequences, stop_token_ids, **_):
        width = max_tokens
        tokens = np.zeros((self.batch, width), np.int32)
        mask = np.zeros((self.batch, width), bool)
        stop = np.zeros(self.batch, np.int32)
        seqs = [list(s[s >= 0]) for s in np.asarray(stop_sequences)]
        for b in np.flatnonzero(live_b):
            ids = self.script[b][self.turn][:width]
            tokens[b, :len(ids)], mask[b, :len(ids)] = ids, True
            if ids and ids[-1] in stop_token_ids:
                stop[b] = mt.STOP_TOKEN
            elif any(s and ids[-len(s):] == s for s in seqs):
                stop[b] = mt.STOP_SEQUENCE
        self.turn += 1
        return session, mt.Turn(tokens, np.full((self.batch, width), -0.5, np.float32) * mask, mask, stop)

    def append(self, model, session, chunks, pad_id=0):
        self.appended.append([list(c) for c in chunks])
        return session


def tool_runner(script, limits=None, env_factory=None):
    settings = ToolEnvSettings(call_open="[", call_close="]", observation_format="{{output}}")
    factory = env_factory or make_env_factory("tools", settings, [make_tool("python")])
    limits = limits or EpisodeLimits(max_turns=2, max_turn_tokens=12, max_total_tokens=32, max_observation_tokens=12)
    return EpisodeRunner(factory, Renderer(TOK, chat=False), limits, eos_ids=(EOS,), sampler=ScriptedSampler(script))


ITEM = TaskItem("t/6*7", "6*7=", answer="42")


def run(runner, rows):
    tokens, mask = encode_episode_prompts(runner, [ITEM])
    return runner.run(jax.random.key(0), None, [ITEM], tokens, mask, num_samples=rows)


def ids(text):
    return TOK.encode(text)


def test_tool_call_episode_bookkeeping():
    script = [
        [ids("[6*7]"), ids("42") + [EOS]],  # calls the tool, copies its output
        [ids("41") + [EOS]],  # answers at once
        [ids("[6*]"), ids("x") + [EOS]],  # a call that fails: the error is the observation
        [ids("1" * 12)],  # never stops: the turn cap truncates it
    ]
    runner = tool_runner(script)
    ep = run(runner, 4)
    # Row 0: model "[6*7]", env "{42}", model "42" EOS; the env tokens are not trained on.
    want = ids("[6*7]") + ids("{42}") + ids("42") + [EOS]
    n = int(ep.length_b[0])
    assert ep.tokens_bt[0, :n].tolist() == want
    assert ep.loss_mask_bt[0, :n].tolist() == [1] * 5 + [0] * 4 + [1] * 3
    assert ep.token_mask_bt[0, :n].all() and not ep.token_mask_bt[0, n:].any()
    assert ep.segments[0] == [("model", 0, 5), ("env", 5, 9), ("model", 9, 12)]
    assert np.all(ep.logp_bt[0, :n][ep.loss_mask_bt[0, :n]] == -0.5)
    assert np.all(ep.logp_bt[0][~ep.loss_mask_bt[0]] == 0.0)
    assert [c.record() for c in ep.tool_calls[0]] == [
        {"name": "python", "code": "6*7", "output": "42", "ok": True, "parsed": True}]
    assert ep.final_texts[0] == "42" and ep.turns_b[0] == 2
    assert ep.model_tokens_b[0] == 8 and ep.env_tokens_b[0] == 4
    # The appended chunk is exactly the rendered observation; rows without one get nothing.
    assert runner.sampler.appended[0][0] == ids("{42}") and runner.sampler.appended[0][1] == []
    # Row 1: one turn, no call.
    assert ep.final_texts[1] == "41" and ep.turns_b[1] == 1 and ep.tool_calls[1] == []
    assert ep.loss_mask_bt[1].sum() == 3 and ep.env_tokens_b[1] == 0
    # Row 2: the failed call's error (cut to 12 tokens) is what the model reads.
    (call,) = ep.tool_calls[2]
    assert not call.ok and call.parsed and call.output.startswith("SyntaxError")
    env_start, env_end = ep.segments[2][1][1:]
    assert env_end - env_start <= 12 + 2 and ep.final_texts[2] == "x"
    # Row 3: truncated at the cap, one turn.
    assert ep.truncated_b[3] and ep.turns_b[3] == 1 and ep.length_b[3] == 12
    assert not ep.truncated_b[:3].any() and ep.errors == [None] * 4


def test_last_turn_ends_the_episode_and_total_bound_holds():
    script = [[ids("[6*7]"), ids("[6*7]")]]
    limits = EpisodeLimits(max_turns=2, max_turn_tokens=8, max_total_tokens=16, max_observation_tokens=8)
    ep = run(tool_runner(script, limits), 1)
    assert ep.turns_b[0] == 2 and len(ep.tool_calls[0]) == 2  # the last call runs but gets no reply
    assert ep.length_b[0] <= 16 and [s[0] for s in ep.segments[0]] == ["model", "env", "model"]


class Raises(Environment):
    stop_strings = ("]",)

    def reset(self, item):
        return [{"role": "user", "content": item.prompt}]

    def step(self, text):
        if not text.endswith("]"):
            return StepResult(done=True)  # a final answer: fine
        raise RuntimeError("boom")


class Hangs(Raises):
    def step(self, text):
        time.sleep(3 if text.endswith("]") else 0)
        return StepResult(done=True)


class NotText(Raises):
    def step(self, text):
        return StepResult(observation=[{"role": "tool", "content": 42}], done=not text.endswith("]"))


@pytest.mark.parametrize("env, message", [(Raises, "raised RuntimeError: boom"), (Hangs, "timed out"),
                                          (NotText, "raised TypeError")])
def test_bad_environment_ends_its_episode_with_an_error(env, message):
    limits = EpisodeLimits(max_turns=2, max_turn_tokens=8, max_total_tokens=16, step_timeout_s=0.5)
    runner = tool_runner([[ids("[1]")], [ids("2") + [EOS]]], limits, env_factory=env)
    ep = run(runner, 2)
    assert message in ep.errors[0] and ep.errors[1] is None
    assert ep.final_texts[1] == "2"


def test_unknown_names_fail_at_start_up_with_did_you_mean():
    with pytest.raises(UnknownNameError, match="did you mean 'python'"):
        make_tool("pyton")
    with pytest.raises(UnknownNameError, match="did you mean 'tools'"):
        make_env_factory("tool")
    with pytest.raises(ValueError, match="needs at least one tool"):
        make_env_factory("tools")


def test_tool_call_parsing():
    env = make_env_factory("tools", ToolEnvSettings(), [make_tool("python")])()
    assert env.parse_call("no call here") is None
    call = env.parse_call('<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>')
    assert call.name == "python" and call.code == "print(1)"
    assert env.parse_call("<tool_call>```python\nprint(2)\n```</tool_call>").code == "print(2)"
    bad = env.parse_call('<tool_call>{"name": "calc", "arguments": {}}</tool_call>')
    assert not bad.parsed and "unknown tool 'calc'" in bad.output
    assert not env.parse_call("print(1)</tool_call>").parsed
