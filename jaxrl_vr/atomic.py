"""Atomic writes: a file is either absent, the old version or the whole new one.

Every file a run writes goes through here: a killed process never leaves half a JSON
file, plot or chunk behind, and a reader never sees one.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
from typing import Any, Iterator

__all__ = ["replaced", "write_bytes", "write_json", "write_text"]


@contextlib.contextmanager
def replaced(path: str | os.PathLike, *, suffix: str = ".tmp") -> Iterator[pathlib.Path]:
    """Yields a temporary path beside ``path``; on a clean exit it replaces ``path`` (the
    parent directory is created). ``suffix`` keeps an extension writers look at (".tmp.png")."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + suffix)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_bytes(path: str | os.PathLike, data: bytes, *, sync: bool = False) -> pathlib.Path:
    """Writes ``data`` atomically (``sync``: flushed to disk before the rename)."""
    with replaced(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
    return pathlib.Path(path)


def write_text(path: str | os.PathLike, text: str) -> pathlib.Path:
    """Writes ``text`` (UTF-8) atomically."""
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, tree: Any, *, indent: int = 2, **dump_kwargs) -> pathlib.Path:
    """Writes ``tree`` as JSON (keys sorted unless ``sort_keys=False``) atomically."""
    dump_kwargs.setdefault("sort_keys", True)
    return write_text(path, json.dumps(tree, indent=indent, **dump_kwargs) + "\n")
