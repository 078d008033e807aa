"""The built-in environments and their registry.

* ``single_turn``: the user prompt in, one model turn, the task's verifier scores it (what
  every task did before environments existed; the one-step case of the same runner).
* ``tools``: the model may call tools between its turns. A call is the text between
  ``call_open`` and ``call_close`` (the runner ends a turn at ``call_close``): either JSON
  ``{"name": ..., "arguments": {...}}`` or, for a code tool, the code itself (a fenced
  block inside is unwrapped). The tool's output (or the error it raised, or a note that
  the call did not parse) comes back as one message; a turn without a call is the final
  answer, which the task's verifier scores.

Adding an environment is a class (``jaxrl_vr.envs.base.Environment``), a factory taking
``(settings, tools)`` and one registry line::

    ENVIRONMENTS["my_env"] = Entry(lambda settings, tools: MyEnv(), NoSettings)

selected with ``task.env=my_env``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Sequence

from jaxrl_vr.envs.base import Environment, Message, StepResult, ToolCall
from jaxrl_vr.envs.tools import Tool
from jaxrl_vr.registry import Entry, NoSettings, Registry

__all__ = ["ENVIRONMENTS", "SingleTurnEnv", "ToolEnv", "ToolEnvSettings", "make_env_factory"]


class SingleTurnEnv(Environment):
    """One prompt, one answer: the task's verifier gives the reward."""

    def reset(self, item) -> list[Message]:
        return [{"role": "user", "content": item.prompt}]

    def step(self, model_text: str) -> StepResult:
        return StepResult(done=True)


@dataclasses.dataclass(frozen=True)
class ToolEnvSettings:
    """``task.env=tools`` settings.

    Attributes:
      call_open, call_close: what opens and closes a tool call in the model's text
        (``call_close`` ends the model's turn).
      observation_format: the tool message's content, ``{output}`` replaced by the tool's
        output (plain-text models read delimiters here, e.g. ``{{output}}`` → ``{...}``
        with literal braces written as they are).
      role: the observation message's role ("tool", or "user" for templates without one).
      system_prompt: a system message before the prompt ("" = none); ``{tools}`` in it is
        replaced by the tools' JSON schemas.
    """

    call_open: str = "<tool_call>"
    call_close: str = "</tool_call>"
    observation_format: str = "{output}"
    role: str = "tool"
    system_prompt: str = ""

    def __post_init__(self):
        if not self.call_open or not self.call_close:
            raise ValueError("task.env.call_open and call_close must be non-empty strings.")
        if "{output}" not in self.observation_format:
            raise ValueError(f"task.env.observation_format={self.observation_format!r} must contain "
                             "'{output}' (where the tool's output goes).")


def _unfence(body: str) -> str:
    """A fenced code block's content (```python ... ```), else the text stripped."""
    text = body.strip()
    if text.startswith("```") and text.endswith("```") and len(text) >= 6:
        first, _, rest = text[3:-3].partition("\n")
        return (rest if first.strip().isidentifier() or not first.strip() else text[3:-3]).strip("\n")
    return text


class ToolEnv(Environment):
    """Tool calls between turns; the final (call-free) turn is the answer."""

    def __init__(self, settings: ToolEnvSettings, tools: Sequence[Tool]):
        if not tools:
            raise ValueError("task.env=tools needs at least one tool (task.tools=python).")
        self.settings, self.tools = settings, {t.name: t for t in tools}
        self.stop_strings = (settings.call_close,)
        code_tools = [t for t in tools if t.code]
        self.code_tool = code_tools[0] if len(code_tools) == 1 else None

    def reset(self, item) -> list[Message]:
        messages: list[Message] = []
        if self.settings.system_prompt:
            schemas = json.dumps([t.schema() for t in self.tools.values()])
            messages.append({"role": "system", "content": self.settings.system_prompt.replace("{tools}", schemas)})
        messages.append({"role": "user", "content": item.prompt})
        return messages

    def parse_call(self, model_text: str) -> ToolCall | None:
        """The call that ends ``model_text`` (unrun), a ToolCall with parsed=False when it
        cannot be read, or None when the turn makes no call (a final answer)."""
        s = self.settings
        text = model_text.rstrip()
        if not text.endswith(s.call_close):
            return None
        begin = text.rfind(s.call_open, 0, len(text) - len(s.call_close))
        if begin < 0:
            return ToolCall("", output=f"the call has no {s.call_open}", parsed=False)
        body = text[begin + len(s.call_open):len(text) - len(s.call_close)]
        try:
            call = json.loads(body)
        except (json.JSONDecodeError, RecursionError):
            call = None
        if isinstance(call, dict) and "name" in call:
            name, arguments = str(call["name"]), call.get("arguments", {})
            if name not in self.tools:
                return ToolCall(name, output=f"unknown tool {name!r}; the tools are {sorted(self.tools)}",
                                parsed=False)
            tool = self.tools[name]
            if tool.code and isinstance(arguments, dict) and isinstance(arguments.get("code"), str):
                return ToolCall(name, code=arguments["code"])
            if not isinstance(arguments, dict) or set(arguments) != set(tool.parameters):
                return ToolCall(name, arguments=arguments if isinstance(arguments, dict) else {},
                                output=f"{name} takes the arguments {sorted(tool.parameters)}", parsed=False)
            return ToolCall(name, arguments=arguments)
        if self.code_tool is not None:
            return ToolCall(self.code_tool.name, code=_unfence(body))
        return ToolCall("", output='a call is JSON: {"name": ..., "arguments": {...}}', parsed=False)

    def run(self, call: ToolCall) -> ToolCall:
        """The call with its output: the tool's text, or the error it raised."""
        if not call.parsed:
            return call
        tool = self.tools[call.name]
        try:
            output = tool.fn(code=call.code) if tool.code else tool.fn(**call.arguments)
            if not isinstance(output, str):
                raise TypeError(f"tool {call.name!r} returned {type(output).__name__}, not text")
            return dataclasses.replace(call, output=output, ok=True)
        except Exception as err:  # noqa: BLE001  A failing tool is an observation, not a crash.
            message = str(err) if type(err).__name__ == "ToolError" else f"{type(err).__name__}: {err}"
            return dataclasses.replace(call, output=message, ok=False)

    def step(self, model_text: str) -> StepResult:
        call = self.parse_call(model_text)
        if call is None:
            return StepResult(done=True)
        call = self.run(call)
        content = self.settings.observation_format.replace("{output}", call.output)
        return StepResult(observation=[{"role": self.settings.role, "content": content}], done=False,
                          tool_calls=(call,))


ENVIRONMENTS = Registry("environment", {
    "single_turn": Entry(lambda settings, tools: SingleTurnEnv(), NoSettings),
    "tools": Entry(ToolEnv, ToolEnvSettings),
})


def make_env_factory(name: str, settings=None, tools: Sequence[Tool] = ()):
    """``() -> Environment``: a fresh instance per rollout of the registered environment."""
    entry = ENVIRONMENTS[name]
    settings = entry.settings() if settings is None else settings
    tools = tuple(tools)
    entry.fn(settings, tools)  # fail at start-up, not in the first rollout
    return lambda: entry.fn(settings, tools)
