"""Decoding on the live rows only: `generate(..., compact=True)` for long, ragged rollouts.

With a stop token, the rows of a long rollout finish at very different steps (a 512-token
buffer with answers of 40 to 512 tokens). `sampler._generate_core` keeps decoding all B rows
until the last one stops: a finished row still costs a full decode step (its matmuls, its
LM head and its attention over the cache). Here the decode is a host-driven sequence of
jitted chunks of at most `compact_every` steps. Between two chunks the host reads which rows
are done; when the live rows fit a smaller batch bucket (`batch_bucket`: powers of two and
their 1.5 multiples, at least MIN_BUCKET) it gathers their decode state (last logits, KV
cache, positions and their outputs so far) into that bucket, and the following chunks decode
only them. A finished row's outputs are copied out as they are. The decode stops when every
row is done.

The cache still grows by segments (`sampler.decode_segment_ends`: each chunk's attention
reads only the slots written by its segment's end). Compiled programs: one decode chunk per
(batch bucket, cache length) pair that a rollout visits; the bucket only shrinks and the
cache only grows, so one rollout visits at most 2·log2(B / MIN_BUCKET) + segments of them
(10 for B = 64 and 4 segments; 7 buckets × 4 cache lengths exist), and `_regroup` (a
gather) per transition. Which pairs a rollout visits depends on where its rows stop, so a
later rollout can still compile one mid-decode (seconds each for a real model on a small
CPU); `precompile` compiles every pair of a rollout shape up front, for runs (and
benchmarks) that want no compilation after warm-up.

Exactness: at step s, row b (its index in the full prompt-major batch) draws with the b-th
of ``uniform(fold_in(key, s), (B,))`` (`sampler.row_uniforms`), the uniform the uncompacted
decode gives it; so a row's draws do not depend on which other rows are alive, and the
rollout with compaction equals the one without (tokens exactly, log-probs up to the float
rounding of a smaller batch's matmuls, which can flip a sampled token that falls on a
boundary, as `decode_segments` can).
"""

from __future__ import annotations

import functools
import inspect
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_vr.models.decoder import KVCache, cast_matmul_weights, unstacked_matmul_weights
from jaxrl_vr.sampling import sampler as sampler_lib

MIN_BUCKET = 8
DEFAULT_COMPACT_EVERY = 32
COMPACT_AUTO_MIN_BUFFER = 65
"""`generate(compact=None)` compacts response buffers of at least this many slots: the short
buffers (<= 64, the embedded default's) keep the single jitted program."""

TRACE_COUNTS: dict[str, int] = {"decode_chunk": 0, "regroup": 0}
LAST_CHUNKS: list[tuple[int, int, int]] = []
"""(rows, cache slots, decode step reached) of each chunk the last `generate_compact` ran:
the batch buckets and cache lengths a rollout visited and where it stopped."""


class LiveRows(NamedTuple):
    """The decode state of the rows being decoded (n = a batch bucket), with their outputs.

    Attributes:
      step: int32 scalar, the next decode step (shared).
      logits_nv: float [n, V] last logits of each row.
      cache: the rows' KV cache.
      done_n: bool [n] the row has emitted a stop token (always True for padding rows).
      row_n: int32 [n] the row's index in the full batch (B for padding rows).
      start_pos_n: int32 [n] the position of the row's first response token.
      tokens_nt, logp_nt, mask_nt: [n, buffer] the row's outputs so far (as `Rollout`'s).
    """

    step: jax.Array
    logits_nv: jax.Array
    cache: KVCache
    done_n: jax.Array
    row_n: jax.Array
    start_pos_n: jax.Array
    tokens_nt: jax.Array
    logp_nt: jax.Array
    mask_nt: jax.Array


def batch_bucket(live: int, batch: int) -> int:
    """The batch a decode chunk runs `live` rows in: the smallest power of two or 1.5 times a
    power of two (8, 12, 16, 24, 32, 48, 64, ...) >= live, at least min(MIN_BUCKET, batch), at
    most `batch`. With powers of two alone a bucket could be half padding (17 live rows in 32);
    here at most a third. The long tail of a ragged rollout runs in the bucket of the answers
    that reach the cap, and a small decode step costs a fixed part (the weights streamed once)
    plus a part per row: the bf16 SmolLM2 step over 160 cache slots took about 48, 55 and
    115-129 ms at 16, 24 and 64 rows on a 2-core Zen 4 EPYC (docs/performance.md, issue 43;
    benchmarks/results/ragged_rollout_epyc_zen4_cache_*.json)."""
    live = max(int(live), 1)
    power = 1 << (live - 1).bit_length()
    bucket = power * 3 // 4 if power >= 4 and power * 3 // 4 >= live else power
    return min(batch, max(bucket, min(MIN_BUCKET, batch)))


@functools.partial(jax.jit, static_argnames=("graphdef", "num_samples", "buffer_len", "cache_len", "cache_dtype"))
def _prefill_rows(graphdef, state, weights, tokens_ps, mask_ps, pad_id, *, num_samples: int, buffer_len: int,
                  cache_len: int, cache_dtype: str | None) -> LiveRows:
    """Every prompt once, broadcast to its G rows: the decode state before step 0 (the model
    and decode weights as `_prepared` made them)."""
    model = nnx.merge(graphdef, state)
    layer_params, unembed = weights
    logits_pv, cache = sampler_lib._prefill(model, layer_params, tokens_ps, mask_ps, cache_len, cache_dtype, unembed)
    repeat = lambda x: jnp.repeat(x, num_samples, axis=0)  # noqa: E731  Prompt-major.
    cache = cache._replace(keys_bkem=tuple(repeat(k) for k in cache.keys_bkem),
                           values_bkme=tuple(repeat(v) for v in cache.values_bkme), valid_bm=repeat(cache.valid_bm))
    batch = tokens_ps.shape[0] * num_samples
    return LiveRows(
        step=jnp.zeros((), jnp.int32), logits_nv=repeat(logits_pv), cache=cache,
        done_n=jnp.zeros((batch,), bool), row_n=jnp.arange(batch, dtype=jnp.int32),
        start_pos_n=repeat(jnp.sum(mask_ps, axis=1, dtype=jnp.int32)),
        tokens_nt=jnp.full((batch, buffer_len), pad_id, jnp.int32),
        logp_nt=jnp.zeros((batch, buffer_len), jnp.float32), mask_nt=jnp.zeros((batch, buffer_len), bool))


@functools.partial(jax.jit, static_argnames=("graphdef", "dtype", "packed_dots"))
def _decode_weights(graphdef, state, *, dtype: str, packed_dots: bool):
    """Each layer's parameters as their own arrays, matmul weights in `dtype`, and the LM head
    to decode with (None: the model's own), packed with `packed_dots`; once per rollout."""
    model = nnx.merge(graphdef, state)
    return sampler_lib.decode_weights(model, unstacked_matmul_weights(model.layers, dtype), packed_dots)


def _prepared(graphdef, state, packed_dots: bool = False):
    """The decode chunks' model, once per rollout rather than once per chunk: its layers'
    parameters unstacked with their matmul weights cast to the compute dtype, and its LM head
    cast (`cast_matmul_weights`, which the chunks must not run again). The stacked layers stay
    the caller's arrays (the chunks read only the unstacked copies), so a rollout holds one
    compute-dtype copy of the block matrices, not two. With `packed_dots` the copies and the
    LM head are packed for the packed-dot kernel (`sampler.decode_weights`). Returns
    (graphdef, state, (layer_params, unembed))."""
    model = cast_matmul_weights(nnx.merge(graphdef, state), layers=False)
    graphdef, state = nnx.split(model)
    weights = _decode_weights(graphdef, state, dtype=str(jnp.dtype(model.config.matmul_dtype)),
                              packed_dots=packed_dots)
    return graphdef, state, weights


@functools.partial(jax.jit, static_argnames=("graphdef", "num_rows", "greedy", "use_filter"),
                   donate_argnames=("live",))
def _decode_chunk(graphdef, state, weights, key, live: LiveRows, stop_step, max_new_tokens, temperature, top_p,
                  top_k, stop_ids_n, pad_id, *, num_rows: int, greedy: bool, use_filter: bool) -> LiveRows:
    """Decodes `live` up to step `stop_step` (or max_new_tokens - 1, or until all are done), as
    `sampler._generate_core`'s loop does; once the rollout is over (the last step, or every row
    done) it also emits the final token, which costs no forward pass. The model and layers are
    `_prepared`'s."""
    TRACE_COUNTS["decode_chunk"] += 1
    model = nnx.merge(graphdef, state)
    layer_params, unembed = weights

    def emit(c: LiveRows) -> tuple[jax.Array, LiveRows]:
        step_key = jax.random.fold_in(key, c.step)
        uniform_n = None if greedy else sampler_lib.row_uniforms(step_key, c.row_n, num_rows)
        token_n, logp_n = sampler_lib.sample_token_and_logprob(
            step_key, c.logits_nv, temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy,
            use_filter=use_filter, uniform_b=uniform_n)
        live_n = ~c.done_n
        token_n = jnp.where(live_n, token_n, pad_id)
        return token_n, c._replace(
            done_n=c.done_n | jnp.any(token_n[:, None] == stop_ids_n[None, :], axis=-1),
            tokens_nt=c.tokens_nt.at[:, c.step].set(token_n),
            logp_nt=c.logp_nt.at[:, c.step].set(jnp.where(live_n, logp_n, 0.0)),
            mask_nt=c.mask_nt.at[:, c.step].set(live_n))

    def cond(c: LiveRows):
        return (c.step + 1 < max_new_tokens) & (c.step < stop_step) & ~jnp.all(c.done_n)

    def body(c: LiveRows) -> LiveRows:
        token_n, c = emit(c)
        logits_n1v, cache = model.decode_step(token_n[:, None], (c.start_pos_n + c.step)[:, None], c.cache,
                                              last_only=True, layer_params=layer_params, unembed=unembed)
        return c._replace(step=c.step + 1, logits_nv=logits_n1v[:, 0], cache=cache)

    c = jax.lax.while_loop(cond, body, live)
    over = (c.step + 1 >= max_new_tokens) | jnp.all(c.done_n)
    _, last = emit(c)
    pick = lambda new, old: jnp.where(over, new, old)  # noqa: E731
    return c._replace(done_n=pick(last.done_n, c.done_n), tokens_nt=pick(last.tokens_nt, c.tokens_nt),
                      logp_nt=pick(last.logp_nt, c.logp_nt), mask_nt=pick(last.mask_nt, c.mask_nt))


@functools.partial(jax.jit, static_argnames=("cache_len",))
def _regroup(live: LiveRows, index_m, keep_m, num_rows, *, cache_len: int) -> LiveRows:
    """Rows `index_m` of `live` (a new batch of m rows; those with keep_m False are padding:
    done, row `num_rows`), with the cache grown to `cache_len` slots."""
    TRACE_COUNTS["regroup"] += 1
    take = lambda x: jnp.take(x, index_m, axis=0)  # noqa: E731
    cache = KVCache(tuple(take(k) for k in live.cache.keys_bkem), tuple(take(v) for v in live.cache.values_bkme),
                    take(live.cache.valid_bm), live.cache.index)
    if cache_len > cache.valid_bm.shape[1]:
        cache = cache.grown(cache_len)
    return LiveRows(live.step, take(live.logits_nv), cache, take(live.done_n) | ~keep_m,
                    jnp.where(keep_m, take(live.row_n), num_rows), take(live.start_pos_n), take(live.tokens_nt),
                    take(live.logp_nt), take(live.mask_nt))


def generate_compact(graphdef, state, key, tokens_ps, mask_ps, max_new_tokens, temperature, top_p, top_k,
                     stop_ids_n, pad_id, *, num_samples: int, buffer_len: int, greedy: bool, use_filter: bool,
                     cache_dtype: str | None = None, decode_segments: int | None = None,
                     packed_dots: bool = False, compact_every: int = DEFAULT_COMPACT_EVERY):
    """`sampler._generate_core`'s outputs (same arguments, from `generate_core_call`), decoding
    only the rows still alive (module docstring).

    Args:
      compact_every: decode steps between two looks at which rows are done (each look is a
        device-to-host sync of B booleans; a compaction happens only when the live rows fit a
        smaller `batch_bucket`).

    Returns:
      (tokens_bt, logp_bt, mask_bt, length_b, truncated_b), [B, buffer_len] as the core's.
    """
    if compact_every < 1:
        raise ValueError(f"compact_every={compact_every} must be >= 1 (decode steps between compactions).")
    num_prompts, prompt_len = tokens_ps.shape
    batch = num_prompts * num_samples
    ends = sampler_lib.decode_segment_ends(buffer_len,
                                           decode_segments or sampler_lib.default_decode_segments(buffer_len))
    cast_graphdef, cast_state, weights = _prepared(graphdef, state, packed_dots)
    live = _prefill_rows(cast_graphdef, cast_state, weights, tokens_ps, mask_ps, pad_id, num_samples=num_samples,
                         buffer_len=buffer_len, cache_len=prompt_len + ends[0], cache_dtype=cache_dtype)
    tokens_bt = np.full((batch, buffer_len), int(pad_id), np.int32)
    logp_bt = np.zeros((batch, buffer_len), np.float32)
    mask_bt = np.zeros((batch, buffer_len), bool)

    def store(rows: LiveRows) -> None:
        row_n = np.asarray(rows.row_n)
        real_n = row_n < batch
        for out, part in ((tokens_bt, rows.tokens_nt), (logp_bt, rows.logp_nt), (mask_bt, rows.mask_nt)):
            out[row_n[real_n]] = np.asarray(part)[real_n]

    segment, width, step = 0, batch, 0
    LAST_CHUNKS.clear()
    while True:
        stop_step = np.int32(min(step + compact_every, ends[segment]))
        live = _decode_chunk(cast_graphdef, cast_state, weights, key, live, stop_step, max_new_tokens,
                             temperature, top_p, top_k, stop_ids_n, pad_id, num_rows=batch, greedy=greedy,
                             use_filter=use_filter)
        step, done_n = int(live.step), np.asarray(live.done_n)
        LAST_CHUNKS.append((width, int(live.cache.valid_bm.shape[1]), step))
        if step + 1 >= int(max_new_tokens) or done_n.all():
            break
        grow = step >= ends[segment]
        segment += int(grow)
        alive_n = np.flatnonzero(~done_n)
        bucket = batch_bucket(alive_n.size, batch)
        if bucket < width or grow:
            if bucket < width:
                store(live)  # The rows left behind keep their outputs.
                index_m = np.concatenate([alive_n, np.full(bucket - alive_n.size, alive_n[0])]).astype(np.int32)
                keep_m = np.arange(bucket) < alive_n.size
            else:
                index_m, keep_m = np.arange(width, dtype=np.int32), np.ones(width, bool)
            live = _regroup(live, index_m, keep_m, np.int32(batch), cache_len=prompt_len + ends[segment])
            width = bucket
    store(live)
    length_b = mask_bt.sum(axis=1).astype(np.int32)
    last_b = np.take_along_axis(tokens_bt, np.maximum(length_b - 1, 0)[:, None], axis=1)[:, 0]
    stopped_b = (length_b > 0) & np.isin(last_b, np.asarray(stop_ids_n))
    return (jnp.asarray(tokens_bt), jnp.asarray(logp_bt), jnp.asarray(mask_bt), jnp.asarray(length_b),
            jnp.asarray(~stopped_b))


def precompile(model, prompt_tokens_ps, prompt_mask_ps, *, num_samples: int, max_new_tokens: int, **generate_kwargs
               ) -> int:
    """Compiles the decode chunk of every (batch bucket, cache length) pair that
    `generate(..., compact=True)` with these arguments could visit, so no later rollout of the
    same shapes compiles one mid-decode (module docstring). Runs one prefill and no decode
    step: each chunk is called on zeroed rows with its stop step at 0. `_regroup`s (cheap)
    still compile on first use. Returns the number of decode-chunk programs it compiled.

    Args: as `sampler.generate` (its sampling settings and stop ids decide nothing here but
    are part of the compiled programs' signature, so pass the ones the rollouts will use).
    """
    key = generate_kwargs.pop("key", jax.random.key(0))
    for unused in ("compact", "compact_every"):  # `generate` options that no compiled chunk depends on
        generate_kwargs.pop(unused, None)
    core_options = inspect.signature(sampler_lib.generate_core_call).parameters  # generate's defaults for them
    options = {name: p.default for name, p in inspect.signature(sampler_lib.generate).parameters.items()
               if name in core_options and p.default is not p.empty}
    options.update(generate_kwargs, num_samples=num_samples, max_new_tokens=max_new_tokens)
    (graphdef, state, key, tokens_ps, mask_ps, max_new, temperature, top_p, top_k, stop_ids_n, pad_id), kwargs = \
        sampler_lib.generate_core_call(key, model, prompt_tokens_ps, prompt_mask_ps, **options)
    num_prompts, prompt_len = tokens_ps.shape
    batch = num_prompts * num_samples
    buffer_len = kwargs["buffer_len"]
    ends = sampler_lib.decode_segment_ends(buffer_len, kwargs["decode_segments"]
                                           or sampler_lib.default_decode_segments(buffer_len))
    cast_graphdef, cast_state, weights = _prepared(graphdef, state, kwargs["packed_dots"])
    live = _prefill_rows(cast_graphdef, cast_state, weights, tokens_ps, mask_ps, pad_id, num_samples=num_samples,
                         buffer_len=buffer_len, cache_len=prompt_len + ends[0], cache_dtype=kwargs["cache_dtype"])
    buckets = sorted({batch_bucket(n, batch) for n in range(1, batch + 1)}, reverse=True)
    before = TRACE_COUNTS["decode_chunk"]
    # Largest rows first: each later (smaller) zeroed batch fits in the memory the previous one
    # freed, so a heap that keeps freed memory (`host_memory.keep_host_memory`) grows once.
    for end in reversed(ends):
        for bucket in buckets:
            index_m = np.zeros(bucket, np.int32)
            shapes = jax.eval_shape(functools.partial(_regroup, cache_len=prompt_len + end), live, index_m,
                                    np.ones(bucket, bool), np.int32(batch))
            rows = jax.tree.map(lambda x: jax.device_put(jnp.zeros(x.shape, x.dtype)), shapes)
            _decode_chunk(cast_graphdef, cast_state, weights, key, rows, np.int32(0), max_new, temperature, top_p,
                          top_k, stop_ids_n, pad_id, num_rows=batch, greedy=kwargs["greedy"],
                          use_filter=kwargs["use_filter"]).step.block_until_ready()
    return TRACE_COUNTS["decode_chunk"] - before
