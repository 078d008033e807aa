"""Decoding on the live rows only (jaxrl_vr.sampling.compact): the same rollout as the
uncompacted decode, per-row stops, the early exit, smaller batches as rows finish."""

import os

import chex
import jax
import numpy as np
import pytest

from jaxrl_vr.models import from_pretrained
from jaxrl_vr.sampling import compact as compact_lib
from jaxrl_vr.sampling import generate
from jaxrl_vr.sampling import sampler as sampler_lib

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures")
MAX_NEW = 90  # a 96-slot buffer: four decode segments ending at steps 24, 48, 72, 96


@pytest.fixture(scope="module")
def llama():
    path = os.path.join(FIXTURES, "tiny_llama")
    return from_pretrained(path), dict(np.load(os.path.join(path, "reference.npz")))


def test_batch_bucket_hand_computed():
    assert ([compact_lib.batch_bucket(n, 64) for n in (64, 49, 48, 33, 32, 25, 24, 17, 16, 13, 12, 9, 8, 3, 1)]
            == [64, 64, 48, 48, 32, 32, 24, 24, 16, 16, 12, 12, 8, 8, 8])
    assert [compact_lib.batch_bucket(n, 40) for n in (40, 33, 32)] == [40, 40, 32]
    assert [compact_lib.batch_bucket(n, 12) for n in (12, 9, 8, 1)] == [12, 12, 8, 8]
    assert [compact_lib.batch_bucket(n, 4) for n in (4, 3, 1)] == [4, 4, 4]


def rollouts(llama, compact_every=8, **kwargs):
    model, ref = llama
    kwargs = dict(num_samples=4, max_new_tokens=MAX_NEW, **kwargs)
    plain = generate(jax.random.key(1), model, ref["input_ids"], ref["attention_mask"], compact=False, **kwargs)
    compacted = generate(jax.random.key(1), model, ref["input_ids"], ref["attention_mask"], compact=True,
                         compact_every=compact_every, **kwargs)
    return plain, compacted


def assert_same_rollout(plain, compacted):
    for name in ("tokens_bt", "mask_bt", "length_b", "truncated_b", "prompt_tokens_bs", "prompt_mask_bs"):
        np.testing.assert_array_equal(np.asarray(getattr(compacted, name)), np.asarray(getattr(plain, name)), name)
    np.testing.assert_allclose(np.asarray(compacted.logp_bt), np.asarray(plain.logp_bt), atol=1e-5)


@pytest.mark.parametrize("greedy, stop_ids", [(True, (68,)), (False, (68,)), (False, (5, 7, 9, 11, 13))])
def test_compaction_keeps_the_rollout(llama, greedy, stop_ids):
    """Same key: the same tokens with the decode on all 12 rows until the last stops and with
    the live rows gathered into 8 as they finish (ragged, left-padded prompts; rows stopping
    in different segments; greedy and sampled)."""
    plain, compacted = rollouts(llama, greedy=greedy, stop_token_ids=stop_ids)
    assert_same_rollout(plain, compacted)
    lengths = np.asarray(plain.length_b)
    assert lengths.min() < MAX_NEW and (lengths < 24).any()  # some rows stop in the first segment
    widths = [rows for rows, _, _ in compact_lib.LAST_CHUNKS]
    shrinks = (lengths < MAX_NEW).sum() >= 4  # 8 rows or fewer left alive at some point
    assert widths[0] == 12 and min(widths) == (8 if shrinks else 12), compact_lib.LAST_CHUNKS


def test_compaction_with_top_p_top_k_keeps_the_rollout(llama):
    plain, compacted = rollouts(llama, compact_every=5, temperature=0.8, top_p=0.9, top_k=20,
                                stop_token_ids=(5, 7, 9, 68))
    assert_same_rollout(plain, compacted)


def test_each_row_stops_at_its_own_stop_token_and_the_decode_exits_when_all_are_done(llama):
    stops = (5, 7, 9, 11, 13)
    _, rollout = rollouts(llama, stop_token_ids=stops)
    tokens, mask, length = (np.asarray(x) for x in (rollout.tokens_bt, rollout.mask_bt, rollout.length_b))
    np.testing.assert_array_equal(mask.sum(1), length)
    for row in range(tokens.shape[0]):
        n = length[row]
        assert mask[row, :n].all() and not mask[row, n:].any()
        stopped = tokens[row, n - 1] in stops
        assert stopped == (not bool(rollout.truncated_b[row]))
        assert not np.isin(tokens[row, :n - 1], stops).any()  # no earlier stop token
        np.testing.assert_array_equal(tokens[row, n:], 0)  # pad after the stop
    assert length.max() <= 24 and not np.asarray(rollout.truncated_b).any()
    # Every row stopped inside the first segment: the last chunk ends at the last stop (step
    # L - 1 emitted it, then the loop saw every row done), never reaching step 89.
    chunks = compact_lib.LAST_CHUNKS
    assert chunks[-1][2] == length.max() and all(slots == chunks[0][1] for _, slots, _ in chunks), chunks


def test_the_cache_grows_by_segments_and_each_bucket_compiles_once(llama):
    """No stop token: every row runs to the end through all four segments' cache lengths;
    a second rollout of the same shapes compiles nothing."""
    model, ref = llama
    kwargs = dict(num_samples=2, max_new_tokens=MAX_NEW, stop_token_ids=(-1,), compact=True, compact_every=16)
    first = generate(jax.random.key(3), model, ref["input_ids"], ref["attention_mask"], **kwargs)
    prompt_slots = sampler_lib.round_up(ref["input_ids"].shape[1], sampler_lib.DEFAULT_BUCKET)
    assert sorted({slots - prompt_slots for _, slots, _ in compact_lib.LAST_CHUNKS}) == [24, 48, 72, 96]
    assert np.asarray(first.length_b).tolist() == [MAX_NEW] * 6
    traces = dict(compact_lib.TRACE_COUNTS)
    again = generate(jax.random.key(3), model, ref["input_ids"], ref["attention_mask"], **kwargs)
    chex.assert_trees_all_equal(first, again)
    assert compact_lib.TRACE_COUNTS == traces


def test_compaction_is_on_by_default_for_long_buffers_only(llama):
    model, ref = llama
    compact_lib.LAST_CHUNKS.clear()
    generate(jax.random.key(0), model, ref["input_ids"], ref["attention_mask"], max_new_tokens=64, greedy=True)
    assert compact_lib.LAST_CHUNKS == []  # 64 slots: the one jitted program
    generate(jax.random.key(0), model, ref["input_ids"], ref["attention_mask"], max_new_tokens=65, greedy=True)
    assert compact_lib.LAST_CHUNKS  # 80 slots: compacted
    with pytest.raises(ValueError, match="compact_every"):
        generate(jax.random.key(0), model, ref["input_ids"], ref["attention_mask"], max_new_tokens=8,
                 compact=True, compact_every=-1)


@pytest.mark.parametrize("compact", [True, False])
def test_a_bf16_rollout_leaves_the_callers_float32_weights_as_they_were(compact):
    """The sampler casts its copy of the matmul weights to bf16; the State the policy was merged
    from (the trainer's master weights) keeps its float32 values. The compacting decode prepares
    that copy outside jit, where casting the merged Variables in place turned the trainer's
    master weights (and from then on Adam's updates) into bf16."""
    from flax import nnx

    from jaxrl_vr.models import set_compute_dtype

    path = os.path.join(FIXTURES, "tiny_llama")
    ref = dict(np.load(os.path.join(path, "reference.npz")))
    graphdef, params, rest = nnx.split(set_compute_dtype(from_pretrained(path), "bfloat16"), nnx.Param, ...)
    before = jax.tree.map(np.asarray, params)
    generate(jax.random.key(0), nnx.merge(graphdef, params, rest), ref["input_ids"], ref["attention_mask"],
             num_samples=2, max_new_tokens=MAX_NEW, compact=compact)
    after = jax.tree.map(np.asarray, params)
    assert {a.dtype for a in jax.tree.leaves(after)} == {np.dtype(np.float32)}
    jax.tree.map(np.testing.assert_array_equal, after, before)


def test_precompile_leaves_nothing_to_compile_mid_rollout(llama):
    """`precompile` compiles the decode chunk of every (batch bucket, cache length) pair (15
    rows: buckets 15, 12 and 8; two segments, ending at steps 48 and 96): a ragged rollout of
    those shapes that shrinks its batch and grows its cache then traces no decode chunk, and a
    second precompile none."""
    model, ref = llama
    kwargs = dict(num_samples=5, max_new_tokens=MAX_NEW, stop_token_ids=(5, 7, 9, 11, 13), top_k=40,
                  decode_segments=2)
    compiled = compact_lib.precompile(model, ref["input_ids"], ref["attention_mask"], **kwargs)
    assert compiled == 6  # (top_k=40 and 15 rows: shapes no other test compiles)
    before = compact_lib.TRACE_COUNTS["decode_chunk"]
    rollout = generate(jax.random.key(5), model, ref["input_ids"], ref["attention_mask"], compact=True,
                       compact_every=8, **kwargs)
    assert compact_lib.TRACE_COUNTS["decode_chunk"] == before
    visited = {(rows, slots) for rows, slots, _ in compact_lib.LAST_CHUNKS}
    assert {15, 8} <= {rows for rows, _ in visited} <= {15, 12, 8} and len({s for _, s in visited}) >= 2, visited
    assert np.asarray(rollout.length_b).min() < MAX_NEW
    assert compact_lib.precompile(model, ref["input_ids"], ref["attention_mask"], **kwargs) == 0
