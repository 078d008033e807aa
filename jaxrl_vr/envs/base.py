"""The environment API: one instance per rollout, text in, messages out.

An environment turns a task item into the opening messages (`reset`) and answers each
model turn (`step`) with observation messages, or ends the episode. The episode runner
(`jaxrl_vr.envs.episodes`) does everything with tokens: it samples the model's turns,
renders observations through the chat template as token deltas, and bounds turns, tokens
and observation lengths, so an environment never sees or makes token ids.

A single-turn task is the one-step case: `reset` gives the user prompt and the first
`step` ends the episode, leaving the outcome to the task's verifier.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, NamedTuple, Sequence

__all__ = ["Environment", "Message", "StepResult", "ToolCall"]

Message = Mapping[str, str]
"""A chat message: {"role": "system" | "user" | "assistant" | "tool", "content": text}."""


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """What the model sent to a tool and what came back.

    Attributes:
      name: the tool's registered name ("" when the call did not parse).
      code: the program, for a code tool (the Python tool); else "".
      arguments: the parsed arguments, for other tools; else {}.
      output: the text the environment returned (an error message included).
      ok: the tool ran and reported success (exit status 0 for the Python tool).
      parsed: the call could be read (a name, arguments of the tool's schema).
    """

    name: str
    code: str = ""
    arguments: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    output: str = ""
    ok: bool = False
    parsed: bool = True

    def record(self) -> dict:
        """The rollout dump's form: {"name", "code" or "arguments", "output"} (+ ok, parsed)."""
        out: dict[str, Any] = {"name": self.name}
        if self.code or not self.arguments:
            out["code"] = self.code
        else:
            out["arguments"] = dict(self.arguments)
        out.update(output=self.output, ok=self.ok, parsed=self.parsed)
        return out


class StepResult(NamedTuple):
    """An environment's answer to one model turn.

    Attributes:
      observation: messages that follow the model's turn (empty when done).
      reward: the episode's reward when the environment scores it itself, or None: the
        task's verifier scores the model's final turn (batched in the sandboxed pool).
      done: the episode ended.
      tool_calls: the tool calls this turn made (empty for a final answer).
      info: anything else worth logging (JSON-able).
    """

    observation: Sequence[Message] = ()
    reward: float | None = None
    done: bool = True
    tool_calls: Sequence[ToolCall] = ()
    info: Mapping[str, Any] = {}


class Environment:
    """Base class: one instance per rollout (state lives on the instance).

    Subclasses implement `reset` and `step`. `stop_strings` end a model turn early (for
    example the end of a tool call); the runner stops a row's turn when its text ends
    with one, then calls `step`.
    """

    stop_strings: tuple[str, ...] = ()

    def reset(self, item) -> list[Message]:
        """The opening messages for task item `item` (a `jaxrl_vr.tasks.TaskItem`)."""
        raise NotImplementedError

    def step(self, model_text: str) -> StepResult:
        """Answers the model's turn (its text, stop string included, EOS excluded)."""
        raise NotImplementedError
