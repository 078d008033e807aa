"""A scripted policy for `EpisodeRunner` (no model): row b plays the turn texts of script[b]."""

import numpy as np

from jaxrl_vr.envs import EpisodeLimits, EpisodeRunner, Renderer, Tool, ToolEnv, ToolEnvSettings, ToolError
from jaxrl_vr.models.tokenizers import CharTokenizer
from jaxrl_vr.sampling import multiturn as mt
from jaxrl_vr.tasks import tool_arith

TOKENIZER = CharTokenizer(tool_arith.TOOL_ALPHABET)
LOGP = -0.25


class ScriptedPolicy:
    """``start`` / ``decode_turn`` / ``append`` of `jaxrl_vr.sampling.multiturn`, playing
    fixed turns: a text ending in the call's close ("]") stops at the stop sequence, any
    other text is a final answer followed by EOS."""

    def __init__(self, script):
        self.script, self.appended = script, []

    def start(self, model, prompt_tokens_ps, prompt_mask_ps, *, num_samples, capacity):
        return {"turn": 0}

    def decode_turn(self, key, model, session, live_b, *, max_tokens, stop_token_ids, pad_id, **_):
        batch, width = len(self.script), max_tokens
        tokens = np.full((batch, width), pad_id, np.int32)
        logp, mask = np.zeros((batch, width), np.float32), np.zeros((batch, width), bool)
        stop = np.full(batch, mt.STOP_CAP, np.int32)
        for b in np.flatnonzero(live_b):
            text = self.script[b][session["turn"]]
            ids = TOKENIZER.encode(text) + ([] if text.endswith("]") else [stop_token_ids[0]])
            n = min(len(ids), width)
            tokens[b, :n], logp[b, :n], mask[b, :n] = ids[:n], LOGP, True
            if n == len(ids):
                stop[b] = mt.STOP_SEQUENCE if text.endswith("]") else mt.STOP_TOKEN
        return {"turn": session["turn"] + 1}, mt.Turn(tokens, logp, mask, stop)

    def append(self, model, session, chunks, *, pad_id):
        self.appended.append([list(c) for c in chunks])
        return session


def calculator(code: str) -> str:
    """A fast stand-in for the sandboxed Python tool: ``print(x)`` prints x, else evaluates."""
    if code.startswith("print(") and code.endswith(")"):
        return code[len("print("):-1]
    try:
        return str(eval(code, {"__builtins__": {}}))  # test-controlled arithmetic only
    except Exception as err:
        raise ToolError(f"{type(err).__name__}") from None


def tool_env(tools=None):
    settings = ToolEnvSettings(call_open="[", call_close="]", observation_format="{{output}}", role="user")
    tools = tools or [Tool("python", calculator, "Runs Python code.", {"code": {"type": "string"}}, code=True)]
    return ToolEnv(settings, tools)


def runner(script, env_factory=None, *, max_turns=3, max_total_tokens=48, step_timeout_s=30.0):
    limits = EpisodeLimits(max_turns=max_turns, max_turn_tokens=16, max_total_tokens=max_total_tokens,
                           max_observation_tokens=10, step_timeout_s=step_timeout_s)
    return EpisodeRunner(env_factory or tool_env, Renderer(TOKENIZER, chat=False), limits,
                         eos_ids=(TOKENIZER.eos_id,), pad_id=TOKENIZER.pad_id, sampler=ScriptedPolicy(script))
