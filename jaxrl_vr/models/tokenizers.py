"""Tokenizers behind one small protocol: characters, Hugging Face directories, GGUF metadata.

Every tokenizer here has

* ``encode(text, *, add_bos=False) -> list[int]``: the text's ids, no special tokens added
  except a leading BOS when ``add_bos`` (special-token *strings* in the text, like
  ``<|im_end|>``, are matched whole as the source tokenizer does);
* ``decode(ids, *, skip_special_tokens=True) -> str``;
* ``apply_chat_template(messages, add_generation_prompt=True) -> str``: the prompt text;
* ``vocab_size``, ``bos_id``, ``eos_id``, ``pad_id`` (``bos_id`` may be ``None``: Qwen has none).

``load_tokenizer(spec)`` picks the implementation: ``"char:<alphabet>"``, a ``.gguf`` file, or a
directory holding ``tokenizer.json`` / ``tokenizer_config.json``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "Tokenizer",
    "CharTokenizer",
    "HFTokenizer",
    "GGUFTokenizer",
    "tokenizer_from_gguf",
    "load_tokenizer",
    "byte_to_unicode",
]


@runtime_checkable
class Tokenizer(Protocol):
    """What the sampler, trainer and tasks need from a tokenizer."""

    vocab_size: int
    bos_id: int | None
    eos_id: int
    pad_id: int

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]: ...

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str: ...

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True
    ) -> str: ...


def _check_messages(messages: Sequence[Mapping[str, str]]) -> None:
    if isinstance(messages, (str, bytes)) or not all(
        isinstance(m, Mapping) and "role" in m and "content" in m for m in messages
    ):
        raise TypeError(
            "apply_chat_template expects a list of {'role': ..., 'content': ...} dicts, "
            f"got {messages!r}; wrap a plain prompt as [{{'role': 'user', 'content': prompt}}]."
        )


# ----------------------------------------------------------------------------- characters


@dataclasses.dataclass(frozen=True)
class CharTokenizer:
    """One id per character of a fixed alphabet, for the built-in tasks.

    Ids: 0 = pad, 1 = bos, 2 = eos, then ``3 + alphabet.index(c)``. The chat template is the
    plain concatenation of the messages' contents (a char model has no roles).
    """

    alphabet: str
    pad_id: int = dataclasses.field(default=0, init=False)
    bos_id: int = dataclasses.field(default=1, init=False)
    eos_id: int = dataclasses.field(default=2, init=False)

    NUM_SPECIAL = 3
    SPECIAL_NAMES = ("<pad>", "<bos>", "<eos>")

    def __post_init__(self):
        if not isinstance(self.alphabet, str) or not self.alphabet:
            raise ValueError(f"CharTokenizer needs a non-empty alphabet string, got {self.alphabet!r}.")
        seen = set()
        duplicates = sorted({c for c in self.alphabet if c in seen or seen.add(c)})
        if duplicates:
            raise ValueError(
                f"CharTokenizer alphabet repeats {''.join(duplicates)!r}; list each character once."
            )

    @functools.cached_property
    def _char_to_id(self) -> dict[str, int]:
        return {c: self.NUM_SPECIAL + i for i, c in enumerate(self.alphabet)}

    @property
    def vocab_size(self) -> int:
        return self.NUM_SPECIAL + len(self.alphabet)

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        table = self._char_to_id
        unknown = sorted({c for c in text if c not in table})
        if unknown:
            raise ValueError(
                f"CharTokenizer cannot encode {''.join(unknown)!r} in {text!r}: not in the alphabet "
                f"{self.alphabet!r}. Add the characters to the alphabet (e.g. 'char:{self.alphabet}"
                f"{''.join(unknown)}')."
            )
        ids = [table[c] for c in text]
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        pieces = []
        for token_id in ids:
            token_id = int(token_id)
            if not 0 <= token_id < self.vocab_size:
                raise ValueError(
                    f"CharTokenizer id {token_id} is outside [0, {self.vocab_size}); the ids come "
                    "from a model with a different vocabulary than this alphabet."
                )
            if token_id < self.NUM_SPECIAL:
                if not skip_special_tokens:
                    pieces.append(self.SPECIAL_NAMES[token_id])
            else:
                pieces.append(self.alphabet[token_id - self.NUM_SPECIAL])
        return "".join(pieces)

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True
    ) -> str:
        del add_generation_prompt  # No roles, so nothing marks the assistant's turn.
        _check_messages(messages)
        return "".join(m["content"] for m in messages)


# ----------------------------------------------------------------------------- Hugging Face


class HFTokenizer:
    """A ``transformers`` fast tokenizer behind the protocol; behaviour is the wrapped one's.

    ``encode`` calls ``tokenizer.encode(text, add_special_tokens=False)`` and prepends
    ``bos_id`` when ``add_bos``; ``decode`` and ``apply_chat_template`` forward unchanged.
    ``pad_id`` falls back to ``eos_id`` when the tokenizer names no pad token.
    """

    def __init__(self, hf_tokenizer: Any, *, add_bos_default: bool = False):
        self.hf = hf_tokenizer
        self.add_bos_default = add_bos_default  # what the source's own add_special_tokens would do
        eos_id = hf_tokenizer.eos_token_id
        if eos_id is None:
            raise ValueError(
                "The tokenizer names no eos_token; generation cannot stop. Set eos_token in its "
                "tokenizer_config.json (or tokenizer.ggml.eos_token_id in the GGUF)."
            )
        self.eos_id = int(eos_id)
        bos_id = hf_tokenizer.bos_token_id
        self.bos_id = None if bos_id is None else int(bos_id)
        pad_id = hf_tokenizer.pad_token_id
        self.pad_id = self.eos_id if pad_id is None else int(pad_id)
        self.vocab_size = len(hf_tokenizer)

    @classmethod
    def from_dir(cls, path: str | os.PathLike) -> HFTokenizer:
        """``transformers.AutoTokenizer.from_pretrained(path)`` from a local directory only."""
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise FileNotFoundError(
                f"HFTokenizer.from_dir: {path!r} is not a directory; pass a local folder holding "
                "tokenizer.json / tokenizer_config.json (hub downloads are not used)."
            )
        import transformers  # Deferred: heavy import, not needed by char-level runs.

        hf = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
        return cls(hf, add_bos_default=bool(getattr(hf, "add_bos_token", False)))

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        ids = list(self.hf.encode(text, add_special_tokens=False))
        if add_bos:
            if self.bos_id is None:
                raise ValueError(
                    "add_bos=True but this tokenizer has no bos_token (Qwen models have none); "
                    "call encode(text) without add_bos."
                )
            ids.insert(0, self.bos_id)
        return ids

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True
    ) -> str:
        _check_messages(messages)
        if not getattr(self.hf, "chat_template", None):
            raise ValueError(
                "This tokenizer has no chat_template; format the prompt yourself or use a model "
                "whose tokenizer_config.json / GGUF metadata carries one."
            )
        return self.hf.apply_chat_template(
            [dict(m) for m in messages], add_generation_prompt=add_generation_prompt, tokenize=False
        )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(vocab_size={self.vocab_size}, bos_id={self.bos_id}, "
            f"eos_id={self.eos_id}, pad_id={self.pad_id})"
        )


# ----------------------------------------------------------------------------- GGUF

# llama.cpp token types (gguf.TokenType): 1 normal, 2 unknown, 3 control, 4 user-defined,
# 5 unused, 6 byte.
_CONTROL, _USER_DEFINED = 3, 4


@functools.lru_cache(maxsize=1)
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable-character table used by byte-level BPE vocabularies.

    Printable Latin-1 bytes map to themselves; the other 68 bytes (controls, space, ...) map in
    order to code points 256, 257, ... (Radford et al. 2019, GPT-2's encoder.py).
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


# Pre-tokenizer split regexes keyed by llama.cpp's `tokenizer.ggml.pre` (llama-vocab.cpp).
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_SPLITS = {
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}
# Vocabularies trained with every digit its own pre-token (StarCoder, SmolLM): digits first,
# then GPT-2's split (llama.cpp: "\\p{N}" before the GPT-2 regex).
_DIGIT_THEN_GPT2 = {"smollm", "starcoder", "refact", "codeshell"}


def _byte_level_pre_tokenizer(pre: str | None):
    from tokenizers import Regex, pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre in _PRE_SPLITS:
        split = _PRE_SPLITS[pre]
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(split), behavior="isolated"), byte_level]
        )
    steps = [pre_tokenizers.Split(Regex(_GPT2_SPLIT), behavior="isolated"), byte_level]
    if pre in _DIGIT_THEN_GPT2:
        steps.insert(0, pre_tokenizers.Digits(individual_digits=True))
    return pre_tokenizers.Sequence(steps)


def _field(reader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def _open_reader(path_or_reader):
    import gguf

    if isinstance(path_or_reader, gguf.GGUFReader):
        return path_or_reader
    path = os.fspath(path_or_reader)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF file {path!r} does not exist.")
    return gguf.GGUFReader(path, "r")


def tokenizer_from_gguf(path_or_reader) -> GGUFTokenizer:
    """Rebuild the byte-level BPE tokenizer a GGUF file stores in its metadata.

    Reads ``tokenizer.ggml.{model, pre, tokens, merges, token_type, bos/eos/padding_token_id,
    add_bos_token}`` and ``tokenizer.chat_template``; builds a ``tokenizers`` BPE over the
    vocabulary and merges with the split regex llama.cpp uses for ``pre`` and a byte-level
    decoder; control tokens (type 3) become special tokens, user-defined ones (type 4) added
    tokens, both matched whole in text. Only ``tokenizer.ggml.model == "gpt2"`` is supported.
    """
    reader = _open_reader(path_or_reader)
    model = _field(reader, "tokenizer.ggml.model")
    if model is None:
        raise ValueError("The GGUF file has no tokenizer.ggml.model: it stores no tokenizer.")
    if model != "gpt2":
        raise NotImplementedError(
            f"GGUF tokenizer type {model!r} is not supported (only byte-level BPE 'gpt2': "
            "Llama-3, Qwen2/3, SmolLM). Load the tokenizer from the model's HF directory instead."
        )
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    merges = list(_field(reader, "tokenizer.ggml.merges", []))
    token_types = list(_field(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
    eos_id = _field(reader, "tokenizer.ggml.eos_token_id")
    if eos_id is None:
        raise ValueError("The GGUF file has no tokenizer.ggml.eos_token_id; generation cannot stop.")
    bos_id = _field(reader, "tokenizer.ggml.bos_token_id")
    pad_id = _field(reader, "tokenizer.ggml.padding_token_id")
    return GGUFTokenizer(
        tokens=tokens,
        merges=merges,
        token_types=token_types,
        pre=_field(reader, "tokenizer.ggml.pre"),
        bos_id=None if bos_id is None else int(bos_id),
        eos_id=int(eos_id),
        pad_id=None if pad_id is None else int(pad_id),
        add_bos_default=bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        chat_template=_field(reader, "tokenizer.chat_template"),
    )


class GGUFTokenizer(HFTokenizer):
    """Byte-level BPE rebuilt from GGUF metadata, wrapped as a ``transformers`` fast tokenizer.

    Wrapping in ``PreTrainedTokenizerFast`` gives the exact ``transformers`` chat-template
    rendering (sandboxed Jinja, ``raise_exception``, ...) and special-token handling.
    """

    def __init__(
        self,
        *,
        tokens: Sequence[str],
        merges: Sequence[str],
        token_types: Sequence[int],
        pre: str | None,
        bos_id: int | None,
        eos_id: int,
        pad_id: int | None,
        add_bos_default: bool = False,
        chat_template: str | None = None,
    ):
        from tokenizers import AddedToken, decoders, models
        from tokenizers import Tokenizer as RawTokenizer
        from transformers import PreTrainedTokenizerFast

        if len(token_types) != len(tokens):
            raise ValueError(
                f"GGUF token_type has {len(token_types)} entries for {len(tokens)} tokens."
            )
        for name, token_id in (("bos", bos_id), ("eos", eos_id), ("pad", pad_id)):
            if token_id is not None and not 0 <= token_id < len(tokens):
                raise ValueError(f"GGUF {name}_token_id {token_id} is outside the {len(tokens)} tokens.")
        spelling = byte_to_unicode()
        alphabet = set(spelling.values())

        def respell(token: str) -> str:  # A token stored as raw text -> its byte-level spelling.
            if set(token) <= alphabet:
                return token
            return "".join(spelling[b] for b in token.encode("utf-8"))

        vocab = {respell(token): index for index, token in enumerate(tokens)}
        pairs = [tuple(merge.split(" ")) for merge in merges]
        bad = [m for m, p in zip(merges, pairs) if len(p) != 2]
        if bad:
            raise ValueError(f"GGUF merges must be 'left right' pairs; got {bad[:3]!r}.")
        raw = RawTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
        raw.pre_tokenizer = _byte_level_pre_tokenizer(pre)
        raw.decoder = decoders.ByteLevel()
        # Control tokens (<|im_start|>, <|endoftext|>, ...) and user-defined ones (<think>) are
        # matched whole before BPE, like llama.cpp does. A control token spelled outside the byte
        # alphabet is a mislabelled vocabulary entry, not a real special token: leave it.
        special = [
            AddedToken(t, special=True, normalized=False)
            for t, kind in zip(tokens, token_types)
            if kind == _CONTROL and set(t) <= alphabet
        ]
        user = [
            AddedToken(t, special=False, normalized=False)
            for t, kind in zip(tokens, token_types)
            if kind == _USER_DEFINED and set(t) <= alphabet
        ]
        raw.add_special_tokens(special)
        raw.add_tokens(user)

        def name(token_id):
            return None if token_id is None else tokens[token_id]

        hf = PreTrainedTokenizerFast(
            tokenizer_object=raw,
            bos_token=name(bos_id),
            eos_token=name(eos_id),
            pad_token=name(pad_id),
            chat_template=chat_template,
            clean_up_tokenization_spaces=False,
        )
        super().__init__(hf, add_bos_default=add_bos_default)
        self.pre = pre


# ----------------------------------------------------------------------------- dispatch


def load_tokenizer(spec: str | os.PathLike) -> Tokenizer:
    """``"char:<alphabet>"`` -> CharTokenizer; ``*.gguf`` -> GGUF metadata; a directory -> HF."""
    if isinstance(spec, str) and spec.startswith("char:"):
        return CharTokenizer(spec[len("char:") :])
    path = os.fspath(spec)
    if path.endswith(".gguf"):
        return tokenizer_from_gguf(path)
    if os.path.isdir(path):
        if not any(
            os.path.isfile(os.path.join(path, f))
            for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json")
        ):
            raise FileNotFoundError(
                f"{path!r} holds no tokenizer.json / tokenizer_config.json; save the tokenizer "
                "there (tokenizer.save_pretrained(path)) or pass a .gguf or 'char:<alphabet>'."
            )
        return HFTokenizer.from_dir(path)
    raise ValueError(
        f"load_tokenizer cannot tell what {spec!r} is: pass 'char:<alphabet>', a .gguf file or a "
        "directory holding tokenizer.json."
    )
