"""ChunkStore: atomic per-chunk files keyed by a fingerprint."""

import numpy as np

from jaxrl_vr.eval import ChunkStore, fingerprint_digest


def test_save_load_done_and_fingerprint_keying(tmp_path):
    store = ChunkStore(tmp_path, {"n": 4, "seed": 0})
    assert store.done() == set()
    store.save(2, {"counts": np.array([1, 2]), "x": np.array([0.5])})
    (store.directory / "chunk_00003.npz.tmp").write_bytes(b"torn")  # a killed write
    assert store.done() == {2}
    np.testing.assert_array_equal(store.load(2)["counts"], [1, 2])
    # Same fingerprint (any key order) -> same chunks; another -> a fresh directory.
    assert ChunkStore(tmp_path, {"seed": 0, "n": 4}).done() == {2}
    assert ChunkStore(tmp_path, {"n": 8, "seed": 0}).done() == set()
    assert fingerprint_digest({"a": 1, "b": 2}) == fingerprint_digest({"b": 2, "a": 1})
    assert (store.directory / "meta.json").is_file()
