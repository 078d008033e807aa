"""Jitted autoregressive sampling with a static-shape KV cache.

`generate` prefills each prompt once, broadcasts the prompt's cache to its G samples, then
decodes one token per step under `lax.while_loop`s (one per segment of the response buffer,
over a cache that grows between them: `decode_segments`) that stop as soon as every sequence
has emitted a stop token (or after `max_new_tokens`). The jitted core takes the model as
(graphdef: static, state: argument) via `nnx.split`, so new parameters from training reuse
the compiled program. Prompt length S and the response buffer are rounded up to multiples
of `bucket` (extra left padding / unused slots), and temperature, top-p, top-k,
max_new_tokens, stop ids and pad id are traced values: changing them does not recompile.

Log-probabilities: `Rollout.logp_bt` is log π_T(y_t | prefix) = log softmax(z / T)_y of the
sampled token, float32: the tempered distribution the token was drawn from, which is what
the trainer scores (``train.step`` divides the logits by the same T). Top-p / top-k
truncation is not in it: the trainer scores the untruncated tempered distribution, and with
a filter on the draw's support is the filtered subset of it. Greedy decoding records T = 1.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_vr import ratios
from jaxrl_vr.models import packed_dot
from jaxrl_vr.models.decoder import Decoder, cast_matmul_weights, default_cache_dtype, default_positions, pack_layer_params, packed_unembed

DEFAULT_BUCKET = 16
# Decode-loop segments (`decode_segments`): segment j of n runs steps [j/n, (j+1)/n) of the
# response buffer and its attention reads only the cache slots written by the segment's end.
# By default up to MAX_DECODE_SEGMENTS of at least MIN_SEGMENT_STEPS steps each: every segment
# is another compiled copy of the loop body (a 16-token buffer keeps one loop and its compile
# time; SmolLM2's 64- and 512-token rollouts get four, docs/performance.md "perf30").
MAX_DECODE_SEGMENTS = 4
MIN_SEGMENT_STEPS = 16

# Trace-time bookkeeping (Python side effects run once per compilation): tests use these to
# check "no recompilation" and "one prefill per prompt, not per sample".
TRACE_COUNTS: dict[str, int] = {"generate": 0}
PREFILL_BATCH_SIZES: list[int] = []


class Rollout(NamedTuple):
    """Sampled responses, prompt-major: row b = p * G + g.

    Attributes:
      tokens_bt: int32 [B, T] response tokens, `pad_id` after the stop token.
      logp_bt: float32 [B, T] log π_T of each sampled token, T the temperature (0 where masked).
      mask_bt: bool [B, T] response tokens, including the stop token.
      length_b: int32 [B] number of response tokens (= mask_bt.sum(1)).
      truncated_b: bool [B] True when no stop token was emitted within max_new_tokens.
      prompt_tokens_bs: int32 [B, S] the (left-padded) prompts, repeated G times.
      prompt_mask_bs: bool [B, S] their masks.
    """

    tokens_bt: jax.Array
    logp_bt: jax.Array
    mask_bt: jax.Array
    length_b: jax.Array
    truncated_b: jax.Array
    prompt_tokens_bs: jax.Array
    prompt_mask_bs: jax.Array


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def filter_logits(logits_bv: jax.Array, *, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """Keeps the top-k tokens, then the smallest set of those whose mass reaches top_p.

    HF order: top-k first, top-p on the renormalised survivors (nucleus sampling,
    Holtzman et al. 2019, arXiv 1904.09751). top_k <= 0 or top_p >= 1 disable a filter. The
    most likely token is always kept; ties at the threshold are kept. Removed logits become
    finfo.min. Float32 in, float32 out.
    """
    vocab = logits_bv.shape[-1]
    sorted_bv = -jnp.sort(-logits_bv, axis=-1)  # Descending.
    rank_1v = jnp.arange(vocab)[None, :]
    in_top_k_1v = (top_k <= 0) | (rank_1v < top_k)
    neg = jnp.finfo(jnp.float32).min
    probs_bv = jax.nn.softmax(jnp.where(in_top_k_1v, sorted_bv, neg), axis=-1)
    mass_before_bv = jnp.cumsum(probs_bv, axis=-1) - probs_bv
    keep_sorted_bv = in_top_k_1v & ((mass_before_bv < top_p) | (rank_1v == 0))
    num_keep_b = jnp.sum(keep_sorted_bv, axis=-1)
    threshold_b = jnp.take_along_axis(sorted_bv, (num_keep_b - 1)[:, None], axis=-1)
    return jnp.where(logits_bv >= threshold_b, logits_bv, neg)


def argmax_last(x_bv: jax.Array) -> jax.Array:
    """int32 index of the first maximum along the last axis (`jnp.argmax` on finite input).

    Two plain reductions (max, then the smallest index attaining it) instead of argmax's
    variadic (value, index) reduce, which XLA's CPU backend does not vectorise: over a
    [64, 49152] logits block this is 14 ms -> 2.8 ms per decode step on one core. A row
    with NaN has no index equal to its max and returns the last index, never out of range.
    """
    vocab = x_bv.shape[-1]
    max_b1 = jnp.max(x_bv, axis=-1, keepdims=True)
    index_1v = jnp.arange(vocab, dtype=jnp.int32)[None, :]
    first_b = jnp.min(jnp.where(x_bv == max_b1, index_1v, vocab - 1), axis=-1)
    return first_b.astype(jnp.int32)


CDF_BLOCK = 256
"""Vocabulary block size of `categorical_inverse_cdf`'s two-level search."""


def categorical_inverse_cdf(key: jax.Array, logits_bv: jax.Array) -> jax.Array:
    """One draw per row from softmax(logits_bv) by inverse-CDF with a single uniform per row.

    `jax.random.categorical` (Gumbel-max) draws V random numbers per row: over a 49k
    vocabulary at batch 64 that is ~94 ms of CPU per decode step, ~6x the rest of the
    sampling math. Here u ~ U[0, 1) · Σp picks the block of `CDF_BLOCK` tokens whose
    cumulative mass first exceeds u, then the token inside it, so the cost is one exp per
    logit, the block masses, and one block's cumulative sum (p = exp(z − max z),
    unnormalised; a cumulative sum over all V entries cost 8 ms per step at batch 64). Tokens with
    p = 0 (filtered logits at finfo.min) are never drawn: the search takes the first index
    whose cumulative mass is > u, and rounding at a block's end falls back to its last
    positive-mass token. Same key => same draw; a different stream than `categorical`.

    Args:
      key: PRNG key.
      logits_bv: float [B, V] logits (already tempered/filtered).

    Returns:
      int32 [B] token ids.
    """
    return _inverse_cdf_draw(key, logits_bv)[0]


def row_uniforms(key: jax.Array, row_b: jax.Array, num_rows: int) -> jax.Array:
    """float32 [B] uniforms of rows `row_b` out of a batch of `num_rows`: entry b is the
    row_b[b]-th of ``jax.random.uniform(key, (num_rows,))``, the uniform the full batch's draw
    gives that row, so a row's draw does not depend on which other rows are decoded with it
    (`jaxrl_vr.sampling.compact`). Indices outside [0, num_rows) are clipped."""
    return jnp.take(jax.random.uniform(key, (num_rows,), jnp.float32), row_b, mode="clip")


def _inverse_cdf_draw(key: jax.Array, logits_bv: jax.Array,
                      uniform_b: jax.Array | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`categorical_inverse_cdf` with the draw's normaliser terms.

    `uniform_b` (float32 [B] in [0, 1), e.g. `row_uniforms`) replaces the key's own
    ``uniform(key, (B,))``. Returns (int32 [B] token ids, float32 [B] max z, float32 [B]
    mass Σ_v exp(z_v − max z)), so that logsumexp(z) = max z + log mass costs no second pass
    (`sample_token_and_logprob`).
    """
    batch, vocab = logits_bv.shape
    logits_bv = logits_bv.astype(jnp.float32)
    max_b1 = jnp.max(logits_bv, axis=-1, keepdims=True)
    probs_bv = jnp.exp(logits_bv - max_b1)
    num_blocks = -(-vocab // CDF_BLOCK)
    pad = num_blocks * CDF_BLOCK - vocab
    probs_bnk = jnp.pad(probs_bv, ((0, 0), (0, pad))).reshape(batch, num_blocks, CDF_BLOCK)
    mass_bn = jnp.sum(probs_bnk, axis=-1)  # Block masses; the cumulative sum runs in one block only.
    cum_bn = jnp.cumsum(mass_bn, axis=-1)
    if uniform_b is None:
        uniform_b = jax.random.uniform(key, (batch,), jnp.float32)
    u_b = uniform_b * cum_bn[:, -1]
    block_index_n = jnp.arange(num_blocks, dtype=jnp.int32)[None, :]
    last_block_b = jnp.max(jnp.where(mass_bn > 0, block_index_n, 0), axis=-1)
    block_b = jnp.minimum(jnp.sum(cum_bn <= u_b[:, None], axis=-1, dtype=jnp.int32), last_block_b)
    before_b = jnp.where(block_b > 0, jnp.take_along_axis(cum_bn, jnp.maximum(block_b - 1, 0)[:, None], -1)[:, 0],
                         0.0)
    rest_b = jnp.maximum(u_b - before_b, 0.0)
    probs_bk = jnp.take_along_axis(probs_bnk, block_b[:, None, None], axis=1)[:, 0]
    cum_bk = jnp.cumsum(probs_bk, axis=-1)
    index_k = jnp.arange(CDF_BLOCK, dtype=jnp.int32)[None, :]
    last_positive_b = jnp.max(jnp.where(probs_bk > 0, index_k, 0), axis=-1)
    within_b = jnp.minimum(jnp.sum(cum_bk <= rest_b[:, None], axis=-1, dtype=jnp.int32), last_positive_b)
    return block_b * CDF_BLOCK + within_b, max_b1[:, 0], cum_bn[:, -1]


def sample_token(key: jax.Array, logits_bv: jax.Array, *, temperature: jax.Array, top_k: jax.Array,
                 top_p: jax.Array, greedy: bool, use_filter: bool, uniform_b: jax.Array | None = None) -> jax.Array:
    """One token per row: argmax when `greedy`, else a categorical draw over filtered logits / T
    (with `uniform_b` [B], e.g. `row_uniforms`, as the draw's uniforms instead of the key's)."""
    if greedy:
        return argmax_last(logits_bv)
    scaled_bv = logits_bv / temperature
    if use_filter:
        scaled_bv = filter_logits(scaled_bv, top_k=top_k, top_p=top_p)
    return _inverse_cdf_draw(key, scaled_bv, uniform_b)[0]


def sample_token_and_logprob(key: jax.Array, logits_bv: jax.Array, *, temperature: jax.Array,
                             top_k: jax.Array, top_p: jax.Array, greedy: bool,
                             use_filter: bool, uniform_b: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """`sample_token`'s draw (the same token for the same key) and its tempered log-prob.

    log π_T(y) = z_y/T − logsumexp(z/T) of the float32 logits z: the distribution the token
    was drawn from, as the trainer scores it (`Rollout.logp_bt`, `ratios.token_logprobs` of
    logits / T); top-p / top-k truncation is not in it, and greedy decoding uses T = 1.
    Without a filter the draw's unnormalised probabilities exp(z/T − max z/T) are the
    normaliser's terms, so log Z = max z/T + log Σ exp(z/T − max z/T) reuses their sum
    instead of a second exp pass over the vocabulary (5.9 ms a decode step at batch 64 over
    49k logits on a 2-core AVX2 EPYC, docs/performance.md at 9f22ea1, "perf20"); a filter or
    greedy decoding computes logsumexp as its own pass. `uniform_b`: as in `sample_token`.

    Returns:
      (int32 [B] tokens, float32 [B] log-probs).
    """
    logits_bv = logits_bv.astype(jnp.float32)
    scaled_bv = logits_bv if greedy else logits_bv / temperature

    def separate_pass(token_b):
        return ratios.token_logprobs(scaled_bv[:, None, :], token_b[:, None])[:, 0]

    if greedy or use_filter:
        token_b = sample_token(key, logits_bv, temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy,
                               use_filter=use_filter, uniform_b=uniform_b)
        return token_b, separate_pass(token_b)
    token_b, max_b, mass_b = _inverse_cdf_draw(key, scaled_bv, uniform_b)  # `sample_token`'s draw.
    return token_b, jnp.take_along_axis(scaled_bv, token_b[:, None], axis=-1)[:, 0] - (max_b + jnp.log(mass_b))


def decode_weights(model: Decoder, layer_params, packed: bool):
    """(layer_params, unembed) for `Decoder.decode_step` in a decode loop: `layer_params` as
    given and the model's own LM head, or, with `packed`, both packed for the packed-dot CPU
    kernel (`decoder.pack_layer_params`, `decoder.packed_unembed`), LoRA adapters merged
    into the packed float32 matrices."""
    if not packed:
        return layer_params, None
    return pack_layer_params(layer_params, model.layers.lora_scale), packed_unembed(model)


def _prefill(model: Decoder, layer_params, tokens_ps, mask_ps, max_len: int, cache_dtype=None, unembed=None):
    """Runs the prompts once: last-position logits [P, V] and a cache of max_len slots."""
    PREFILL_BATCH_SIZES.append(tokens_ps.shape[0])
    cache = model.init_cache(tokens_ps.shape[0], max_len, cache_dtype)
    positions_ps = default_positions(mask_ps)
    logits_p1v, cache = model.decode_step(tokens_ps, positions_ps, cache, mask_bt=mask_ps, last_only=True,
                                          layer_params=layer_params, unembed=unembed)
    return logits_p1v[:, 0], cache


def default_decode_segments(buffer_len: int) -> int:
    """`generate`'s segment count for a response buffer of `buffer_len` steps:
    min(MAX_DECODE_SEGMENTS, buffer_len // MIN_SEGMENT_STEPS), at least 1."""
    return max(1, min(MAX_DECODE_SEGMENTS, buffer_len // MIN_SEGMENT_STEPS))


def decode_segment_ends(buffer_len: int, segments: int) -> list[int]:
    """The decode steps at which each of `segments` loops ends: [ceil(buffer_len * (j+1) / n)],
    duplicates dropped (more segments than steps), the last always `buffer_len`."""
    if segments < 1 or buffer_len < 1:
        raise ValueError(f"decode_segments={segments} and buffer_len={buffer_len} must be >= 1.")
    return sorted({-(-buffer_len * (j + 1) // segments) for j in range(segments)})


@functools.partial(jax.jit, static_argnames=("graphdef", "num_samples", "buffer_len", "greedy", "use_filter",
                                             "cache_dtype", "decode_segments", "packed_dots"))
def _generate_core(graphdef, state, key, tokens_ps, mask_ps, max_new_tokens, temperature, top_p, top_k,
                   stop_ids_n, pad_id, *, num_samples: int, buffer_len: int, greedy: bool, use_filter: bool,
                   cache_dtype: str | None = None, decode_segments: int | None = None, packed_dots: bool = False):
    TRACE_COUNTS["generate"] += 1
    # Mixed precision: cast the block matrices once per call, not once per decode step.
    model = cast_matmul_weights(nnx.merge(graphdef, state))
    # Per-layer weights, sliced out of the stacked arrays once per call (not once per step),
    # packed for the packed-dot kernel where `generate_core_call` chose it.
    layer_params, unembed = decode_weights(model, model.layers.unstacked(), packed_dots)
    num_prompts, prompt_len = tokens_ps.shape
    batch = num_prompts * num_samples
    segment_ends = decode_segment_ends(buffer_len, decode_segments or default_decode_segments(buffer_len))
    logits_pv, cache = _prefill(model, layer_params, tokens_ps, mask_ps, prompt_len + segment_ends[0], cache_dtype,
                                unembed)
    repeat = lambda x: jnp.repeat(x, num_samples, axis=0)  # noqa: E731  Prompt-major.
    cache = cache._replace(
        keys_bkem=tuple(repeat(k) for k in cache.keys_bkem),
        values_bkme=tuple(repeat(v) for v in cache.values_bkme),
        valid_bm=repeat(cache.valid_bm))
    start_pos_b = repeat(jnp.sum(mask_ps, axis=1, dtype=jnp.int32))

    class Carry(NamedTuple):
        step: jax.Array
        logits_bv: jax.Array
        cache: object
        done_b: jax.Array
        tokens_bt: jax.Array
        logp_bt: jax.Array
        mask_bt: jax.Array

    def emit(c: Carry):
        """Samples step c.step's token from c.logits_bv and records it (pad / 0 / False once done)."""
        step_key = jax.random.fold_in(key, c.step)
        token_b, logp_b = sample_token_and_logprob(step_key, c.logits_bv, temperature=temperature, top_k=top_k,
                                                   top_p=top_p, greedy=greedy, use_filter=use_filter)
        live_b = ~c.done_b
        token_b = jnp.where(live_b, token_b, pad_id)
        tokens_bt = c.tokens_bt.at[:, c.step].set(token_b)
        logp_bt = c.logp_bt.at[:, c.step].set(jnp.where(live_b, logp_b, 0.0))
        mask_bt = c.mask_bt.at[:, c.step].set(live_b)
        done_b = c.done_b | jnp.any(token_b[:, None] == stop_ids_n[None, :], axis=-1)
        return token_b, done_b, tokens_bt, logp_bt, mask_bt

    # The loop emits tokens 0 .. T-2 and runs the model on each; token T-1 (or the no-op emit
    # after every row stopped) is emitted after the loop from the last logits, so the final
    # token costs no forward pass (one of T per call, as in HF `generate`).
    # The loop runs in segments (`decode_segment_ends`): step s writes slot prompt_len + s and
    # its query sees slots <= prompt_len + s, so during a segment ending at step e the cache
    # holds prompt_len + e slots and grows between segments (fewer cache bytes read per step;
    # the slots left out are masked anyway, so only float rounding moves). Reading a static
    # slice of one full-length buffer instead made XLA:CPU copy the cache every step (perf30).
    def run_segment(c: Carry, end: int) -> Carry:
        def cond(c: Carry):
            return (c.step + 1 < max_new_tokens) & (c.step < end) & ~jnp.all(c.done_b)

        def body(c: Carry):
            token_b, done_b, tokens_bt, logp_bt, mask_bt = emit(c)
            logits_b1v, new_cache = model.decode_step(token_b[:, None], (start_pos_b + c.step)[:, None], c.cache,
                                                      last_only=True, layer_params=layer_params, unembed=unembed)
            return Carry(c.step + 1, logits_b1v[:, 0], new_cache, done_b, tokens_bt, logp_bt, mask_bt)
        return jax.lax.while_loop(cond, body, c)

    init = Carry(
        step=jnp.zeros((), jnp.int32),
        logits_bv=repeat(logits_pv),
        cache=cache,
        done_b=jnp.zeros((batch,), bool),
        tokens_bt=jnp.full((batch, buffer_len), pad_id, jnp.int32),
        logp_bt=jnp.zeros((batch, buffer_len), jnp.float32),
        mask_bt=jnp.zeros((batch, buffer_len), bool),
    )
    final = init
    for j, end in enumerate(segment_ends):
        if j:
            final = final._replace(cache=final.cache.grown(prompt_len + end))
        final = run_segment(final, end)
    _, _, tokens_bt, logp_bt, mask_bt = emit(final)
    length_b = jnp.sum(mask_bt, axis=1, dtype=jnp.int32)
    last_b = jnp.take_along_axis(tokens_bt, jnp.maximum(length_b - 1, 0)[:, None], axis=1)[:, 0]
    stopped_b = (length_b > 0) & jnp.any(last_b[:, None] == stop_ids_n[None, :], axis=-1)
    return tokens_bt, logp_bt, mask_bt, length_b, ~stopped_b


def generate(key: jax.Array, model: Decoder, prompt_tokens_ps, prompt_mask_ps, *, num_samples: int = 1,
             max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
             greedy: bool = False, stop_token_ids: Sequence[int] | None = None, pad_id: int = 0,
             bucket: int = DEFAULT_BUCKET, cache_dtype: str | None = None,
             decode_segments: int | None = None, compact: bool | None = None,
             compact_every: int | None = None) -> Rollout:
    """Samples `num_samples` responses per left-padded prompt.

    Args:
      key: PRNG key (same key, model and inputs => same rollout).
      model: the Decoder.
      prompt_tokens_ps: int [P, S] prompts, left-padded.
      prompt_mask_ps: bool [P, S], True = real token; every prompt needs >= 1 real token.
      num_samples: G responses per prompt; rows are prompt-major (b = p * G + g).
      max_new_tokens: response length cap T.
      temperature: softmax temperature (> 0) for sampling; ignored when greedy.
      top_p: nucleus mass in (0, 1]; 1 disables.
      top_k: keep the k most likely tokens; 0 disables.
      greedy: argmax decoding (deterministic, key unused).
      stop_token_ids: ids that end a response (included in it); default the config's EOS ids.
      pad_id: written after the stop token.
      bucket: prompt length and response buffer are rounded up to multiples of this.
      cache_dtype: KV-cache dtype; None = `decoder.default_cache_dtype`: float32 on CPU up to
        512 slots (prompt bucket + response buffer), where a decode step's attention then runs
        in float32 on the cache as it is (faster under bf16 compute too, "perf26" in
        docs/performance.md), else the model's compute dtype. With a bf16 cache, or over more
        slots, the attention dots cast keys and values to the compute dtype.
      decode_segments: the decode loop runs as this many loops over equal parts of the
        response buffer, each attending over only the cache slots written by its end (about
        (n - 1) / 2n of the buffer's slots fewer read per step; one compiled loop body per
        segment). 1 = one loop over the whole cache; None = `default_decode_segments` (4 for
        buffers of 64 steps or more, 1 up to 31). Same distribution: the log-probs move only
        by float rounding, which can flip a sampled token that falls on a boundary.
      compact: decode only the rows still alive (`jaxrl_vr.sampling.compact`): a host-driven
        loop of jitted decode chunks that, as rows stop, gathers the live ones into a smaller
        batch (`compact.batch_bucket`), so finished rows stop costing decode steps. Same rollout (each
        row draws with its own row of the step's uniforms, with or without compaction; float
        rounding aside). None = on for response buffers of more than 64 slots
        (`compact.COMPACT_AUTO_MIN_BUFFER`), off for shorter ones, which keep the one jitted
        program. False = one program that decodes all B rows until the last one stops.
      compact_every: with compaction, decode steps between two looks at which rows are done
        (None = `compact.DEFAULT_COMPACT_EVERY`).

    Returns:
      Rollout with [B, max_new_tokens] responses (see `Rollout`).
    """
    core_args, core_kwargs = generate_core_call(
        key, model, prompt_tokens_ps, prompt_mask_ps, num_samples=num_samples, max_new_tokens=max_new_tokens,
        temperature=temperature, top_p=top_p, top_k=top_k, greedy=greedy, stop_token_ids=stop_token_ids,
        pad_id=pad_id, bucket=bucket, cache_dtype=cache_dtype, decode_segments=decode_segments)
    from jaxrl_vr.sampling import compact as compact_lib  # It builds on this module.
    if compact is None:
        compact = core_kwargs["buffer_len"] >= compact_lib.COMPACT_AUTO_MIN_BUFFER
    if compact:
        tokens_bt, logp_bt, mask_bt, length_b, truncated_b = compact_lib.generate_compact(
            *core_args, **core_kwargs, compact_every=compact_every or compact_lib.DEFAULT_COMPACT_EVERY)
    else:
        tokens_bt, logp_bt, mask_bt, length_b, truncated_b = _generate_core(*core_args, **core_kwargs)
    tokens_ps = np.asarray(prompt_tokens_ps, np.int32)
    prompt_tokens_bs = jnp.asarray(np.repeat(tokens_ps, num_samples, axis=0))
    prompt_mask_bs = jnp.asarray(np.repeat(np.asarray(prompt_mask_ps), num_samples, axis=0))
    return Rollout(tokens_bt[:, :max_new_tokens], logp_bt[:, :max_new_tokens], mask_bt[:, :max_new_tokens],
                   length_b, truncated_b, prompt_tokens_bs, prompt_mask_bs)


def generate_core_call(key, model: Decoder, prompt_tokens_ps, prompt_mask_ps, *, num_samples: int,
                       max_new_tokens: int, temperature: float, top_p: float, top_k: int, greedy: bool,
                       stop_token_ids: Sequence[int] | None, pad_id: int, bucket: int,
                       cache_dtype: str | None, decode_segments: int | None = None
                       ) -> tuple[tuple, dict]:
    """Checks `generate`'s inputs and returns the (args, kwargs) of its jitted core.

    `benchmarks/profile_step.py --what rollout` compiles and traces the core with them.
    """
    tokens_ps = np.asarray(prompt_tokens_ps)
    mask_ps = np.asarray(prompt_mask_ps)
    chex.assert_rank([tokens_ps, mask_ps], 2)
    chex.assert_equal_shape([tokens_ps, mask_ps])
    if mask_ps.dtype != np.bool_:
        raise TypeError(f"prompt_mask_ps must be bool (True = real token), got {mask_ps.dtype}.")
    if not np.issubdtype(tokens_ps.dtype, np.integer):
        raise TypeError(f"prompt_tokens_ps must be integer token ids, got {tokens_ps.dtype}.")
    if not mask_ps.any(axis=1).all():
        raise ValueError(f"Prompts {np.flatnonzero(~mask_ps.any(axis=1)).tolist()} have no real token; "
                         "every prompt needs at least one (e.g. BOS).")
    if (mask_ps[:, 1:] < mask_ps[:, :-1]).any():
        raise ValueError("Prompts must be left-padded: once a row's mask is True it stays True.")
    if max_new_tokens < 1 or num_samples < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} and num_samples={num_samples} must be >= 1.")
    if not greedy and not temperature > 0:
        raise ValueError(f"temperature={temperature} must be > 0 (use greedy=True for argmax decoding).")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p} must lie in (0, 1].")
    if decode_segments is not None and not (isinstance(decode_segments, (int, np.integer)) and decode_segments >= 1):
        raise ValueError(f"decode_segments={decode_segments!r} must be an integer >= 1 (1 = one decode loop) "
                         "or None (the default for the response length).")
    if stop_token_ids is None:
        stop_token_ids = model.config.eos_token_ids
    stop_ids = np.asarray(list(stop_token_ids) or [-1], np.int32)  # -1 never matches a token.

    num_prompts, prompt_len = tokens_ps.shape
    padded_len = round_up(prompt_len, bucket)
    pad_cols = padded_len - prompt_len
    tokens_bucketed = np.pad(tokens_ps.astype(np.int32), ((0, 0), (pad_cols, 0)), constant_values=pad_id)
    mask_bucketed = np.pad(mask_ps, ((0, 0), (pad_cols, 0)), constant_values=False)
    buffer_len = round_up(max_new_tokens, bucket)
    if cache_dtype is None:
        cache_dtype = default_cache_dtype(model.config, padded_len + buffer_len, jax.default_backend()).name
    graphdef, state = nnx.split(model)
    args = (graphdef, state, key, tokens_bucketed, mask_bucketed, np.int32(max_new_tokens), np.float32(temperature),
            np.float32(top_p), np.int32(top_k), stop_ids, np.int32(pad_id))
    kwargs = dict(num_samples=num_samples, buffer_len=buffer_len, greedy=bool(greedy),
                  cache_dtype=cache_dtype, use_filter=bool(not greedy and (top_k > 0 or top_p < 1)),
                  decode_segments=None if decode_segments is None else int(decode_segments),
                  packed_dots=packed_dot.use_packed(state, model.config.matmul_dtype))
    return args, kwargs
