"""Resumable per-chunk results on disk.

An evaluation is split into numbered chunks; each finished chunk is written as one
``chunk_NNNNN.npz`` atomically (temporary file, then ``os.replace``), so a process killed
at any point leaves only complete chunks behind and a restart skips them. The directory
is keyed by a fingerprint of everything that determines the results (checkpoint, n,
seed, chunk layout, prompts): a different evaluation never reuses another's chunks.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pathlib
import re
from typing import Any, Mapping

import numpy as np

from jaxrl_vr.atomic import write_bytes, write_json

__all__ = ["ChunkStore", "fingerprint_digest"]

_CHUNK = re.compile(r"^chunk_(\d{5,})\.npz$")


def fingerprint_digest(fingerprint: Mapping[str, Any]) -> str:
    """16-hex-digit digest of a JSON-able mapping (key order does not matter)."""
    text = json.dumps(fingerprint, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class ChunkStore:
    """Chunks of one evaluation under ``root/<digest of fingerprint>/``.

    Args:
      root: parent directory (created).
      fingerprint: JSON-able mapping identifying the evaluation; stored as meta.json.
    """

    def __init__(self, root: str | os.PathLike, fingerprint: Mapping[str, Any]):
        self.fingerprint = dict(fingerprint)
        self.directory = pathlib.Path(root) / fingerprint_digest(self.fingerprint)
        self.directory.mkdir(parents=True, exist_ok=True)
        meta = self.directory / "meta.json"
        if not meta.exists():
            write_json(meta, self.fingerprint, default=str)

    def _path(self, index: int) -> pathlib.Path:
        return self.directory / f"chunk_{int(index):05d}.npz"

    def done(self) -> set[int]:
        """Indices of the complete chunks on disk."""
        found = set()
        for entry in self.directory.iterdir():
            match = _CHUNK.match(entry.name)
            if match:
                found.add(int(match.group(1)))
        return found

    def save(self, index: int, arrays: Mapping[str, np.ndarray]) -> None:
        """Writes chunk ``index`` atomically."""
        buffer = io.BytesIO()
        np.savez(buffer, **{k: np.asarray(v) for k, v in arrays.items()})
        write_bytes(self._path(index), buffer.getvalue(), sync=True)

    def load(self, index: int) -> dict[str, np.ndarray]:
        with np.load(self._path(index)) as data:
            return {k: data[k] for k in data.files}
