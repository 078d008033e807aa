"""Messages to token ids, and observations as token deltas of the chat template.

The episode's token sequence is the prompt's ids, then per turn the ids the model sampled
and the ids of what the template adds after them: the end of the assistant turn, the
observation messages and the next assistant header. That delta is cut from renders of the
conversation as text (everything after the model's own text), so the model's ids are
never decoded and re-encoded, and the concatenation equals a render of the whole
conversation whenever the model's ids are the encoding of its text.
"""

from __future__ import annotations

from typing import Sequence

from jaxrl_vr.envs.base import Message

__all__ = ["Renderer", "TemplateError"]


class TemplateError(ValueError):
    """A chat template that cannot render the turns an environment needs."""


class Renderer:
    """Renders an episode's messages with ``tokenizer``.

    Args:
      tokenizer: the policy's tokenizer.
      chat: render through the chat template (else messages are concatenated as plain
        text, BOS first: the built-in models).
      system_prompt: a system message put first when the messages have none (chat only).
      model_name: named in errors.
    """

    def __init__(self, tokenizer, *, chat: bool, system_prompt: str | None = None, model_name: str = "the model"):
        self.tokenizer, self.chat, self.system_prompt, self.model_name = tokenizer, chat, system_prompt, model_name

    def _messages(self, messages: Sequence[Message]) -> list[dict]:
        messages = [dict(m) for m in messages]
        if self.chat and self.system_prompt and not (messages and messages[0]["role"] == "system"):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    def text(self, messages: Sequence[Message], *, add_generation_prompt: bool = True) -> str:
        if not self.chat:
            return "".join(m["content"] for m in messages)
        return self.tokenizer.apply_chat_template(self._messages(messages),
                                                  add_generation_prompt=add_generation_prompt)

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """The opening messages as the model's prompt (`train.rollout.encode_prompts`' ids)."""
        add_bos = self.tokenizer.bos_id is not None and not self.chat
        return list(self.tokenizer.encode(self.text(messages), add_bos=add_bos))

    def observation_ids(self, history: Sequence[Message], model_text: str,
                        observation: Sequence[Message]) -> list[int]:
        """The ids that follow the model's turn ``model_text`` (its ids already in the
        sequence) up to the next assistant turn: the template's delta."""
        if not self.chat:
            return list(self.tokenizer.encode(self.encodable("".join(m["content"] for m in observation))))
        before = self.text(history) + model_text
        full = self.text([*history, {"role": "assistant", "content": model_text}, *observation])
        if not full.startswith(before):
            raise TemplateError(
                f"the chat template of {self.model_name} does not render an assistant turn verbatim after "
                "its generation prompt, so tool observations cannot be appended as tokens; use a model whose "
                "template does (ChatML, Llama 3, Qwen), task.env.role=user, or model.chat=False.")
        return list(self.tokenizer.encode(full[len(before):]))

    def encodable(self, text: str) -> str:
        """``text`` with characters a character tokenizer lacks written as "?" (when it has
        "?"; else dropped). Other tokenizers encode any text: returned as it is."""
        alphabet = getattr(self.tokenizer, "alphabet", None)
        if alphabet is None:
            return text
        fill = "?" if "?" in alphabet else ""
        return "".join(c if c in alphabet else fill for c in text)

    def check(self, role: str) -> int:
        """Fails at start-up when a tool turn of ``role`` cannot be rendered; returns the
        template's overhead in tokens around an observation (for the cache's capacity)."""
        history = [{"role": "user", "content": "1"}]
        try:
            ids = self.observation_ids(history, "2", [{"role": role, "content": "3"}])
        except TemplateError:
            raise
        except Exception as err:  # noqa: BLE001  Jinja raises for roles it does not know.
            raise TemplateError(
                f"the chat template of {self.model_name} cannot render a {role!r} message after an assistant "
                f"turn ({type(err).__name__}: {err}); set task.env.role=user or use model.chat=False.") from None
        return len(ids)
