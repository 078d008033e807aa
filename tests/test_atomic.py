"""Atomic writes: the file is the old one or the whole new one, never half of either."""

import json
import os

import pytest

from jaxrl_vr import atomic


def test_writes_replace_whole_files_and_leave_no_temporaries(tmp_path):
    path = tmp_path / "sub" / "x.json"
    atomic.write_json(path, {"b": 1, "a": [1, 2]})
    assert json.loads(path.read_text()) == {"a": [1, 2], "b": 1}
    atomic.write_text(path, "new")
    atomic.write_bytes(tmp_path / "y.bin", b"\x00\x01", sync=True)
    assert path.read_text() == "new" and (tmp_path / "y.bin").read_bytes() == b"\x00\x01"
    assert sorted(os.listdir(tmp_path / "sub")) == ["x.json"]


def test_a_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "x.txt"
    atomic.write_text(path, "old")
    with pytest.raises(RuntimeError):
        with atomic.replaced(path) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed mid-write")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["x.txt"]
