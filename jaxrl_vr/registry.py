"""Registries of interchangeable parts, and the one "did you mean" of the project.

A family of interchangeable choices (advantage estimators, batch strategies, methods,
model and task sources, verifiers) is a ``Registry``: name -> ``Entry(fn, settings)``,
where ``settings`` is the entry's own frozen dataclass of options (``NoSettings`` when it
has none). Adding a choice is one function, one settings dataclass and one line::

    ESTIMATORS["scaled_loo"] = Entry(scaled_loo, ScaledLooSettings)

An unknown name fails naming the kind, the valid names and the closest one.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Callable, Iterable, Iterator, MutableMapping, NamedTuple

__all__ = ["Entry", "NoSettings", "Registry", "UnknownNameError", "closest", "did_you_mean"]


def closest(name: str, choices: Iterable[str], *, cutoff: float = 0.6) -> str | None:
    """The choice most similar to ``name`` (difflib ratio >= cutoff), or None."""
    match = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=cutoff)
    return match[0] if match else None


def did_you_mean(name: str, choices: Iterable[str], *, quote: str = "'") -> str:
    """``" (did you mean 'x'?)"`` for the closest choice, or ``""`` when none is close."""
    match = closest(name, choices)
    return f" (did you mean {quote}{match}{quote}?)" if match else ""


@dataclasses.dataclass(frozen=True)
class NoSettings:
    """The settings of an entry that has none."""


class Entry(NamedTuple):
    """A registered choice: its function and the frozen dataclass of its settings."""

    fn: Callable[..., Any]
    settings: type = NoSettings


class UnknownNameError(KeyError, ValueError):
    """A name that is not registered (the message lists the valid names)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Registry(MutableMapping[str, Entry]):
    """name -> Entry, for one kind of part (``kind`` names it in error messages).

    ``registry[name] = fn`` registers a function without settings; ``= Entry(fn, Settings)``
    one with its settings dataclass.
    """

    def __init__(self, kind: str, entries: dict[str, Any] | None = None):
        self.kind = kind
        self._entries: dict[str, Entry] = {}
        for name, entry in (entries or {}).items():
            self[name] = entry

    def __setitem__(self, name: str, entry: Any) -> None:
        if not isinstance(entry, Entry):
            entry = Entry(entry)
        if not (dataclasses.is_dataclass(entry.settings) and isinstance(entry.settings, type)):
            raise TypeError(f"{self.kind} {name!r}: settings must be a dataclass type, got "
                            f"{entry.settings!r}.")
        self._entries[str(name)] = entry

    def __getitem__(self, name: str) -> Entry:
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise UnknownNameError(self.unknown(name)) from None

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def unknown(self, name: Any) -> str:
        """The message for an unregistered ``name``."""
        return (f"unknown {self.kind} {name!r}{did_you_mean(str(name), self._entries)}; "
                f"registered: {', '.join(sorted(self._entries))}.")

    def settings(self, name: str, values: dict | None = None) -> Any:
        """The settings dataclass of ``name`` built from ``values`` (defaults for the rest)."""
        return self[name].settings(**(values or {}))
