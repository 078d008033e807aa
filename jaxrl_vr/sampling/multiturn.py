"""Multi-turn sampling: a conversation continues on one KV cache that stays on device.

An episode batch runs as three jitted programs over one `Session` (cache, last logits,
per-row position):

* `start`: prefills each prompt once and broadcasts its cache to the prompt's G rows (as
  `generate` does). The cache then grows with the conversation (`GROW_SLOTS` at a time, up
  to `capacity`), so a decode step reads the slots written so far, as `generate`'s
  segments do.
* `decode_turn`: samples one turn per live row until it emits a stop token (EOS), ends with
  a stop sequence (for example the end of a tool call, any of its tokenizations), or reaches
  the turn's token cap. Every sampled token, the stop token included, is written to the
  cache, since the conversation goes on after it. Rows that are not live, or that stopped
  earlier in the turn, write invalid slots and keep their logits and position: they stay
  frozen.
* `append`: writes each row's observation tokens (the environment's reply rendered by the
  chat template, left-padded to a bucketed chunk width) at the next slots with the row's own
  continuing positions, and takes the logits of each row's last observation token as the
  next turn's first-token logits. Nothing is recomputed: a turn costs its own tokens only.

The cache index is shared by the batch, so a row that stops early in a turn leaves invalid
slots (holes) up to the turn's longest row; attention masks them, and positions count real
tokens only, so the trainer, which sees the conversation without holes, scores the same
positions. `capacity` bounds prompt + every turn + every observation.

Log-probabilities are the sampler's contract (`sampling.sampler`): log π of each sampled
token as `sample_token_and_logprob` computes it.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_vr.models import packed_dot
from jaxrl_vr.models.decoder import Decoder, KVCache, cast_matmul_weights, default_cache_dtype
from jaxrl_vr.sampling.sampler import _prefill, decode_weights, round_up, sample_token_and_logprob

__all__ = ["Session", "Turn", "append", "decode_turn", "encode_stop_sequences", "start",
           "STOP_CAP", "STOP_TOKEN", "STOP_SEQUENCE"]

STOP_CAP, STOP_TOKEN, STOP_SEQUENCE = 0, 1, 2
"""How a row's turn ended (`Turn.stop_b`): the token cap, a stop token, a stop sequence."""

TRACE_COUNTS: dict[str, int] = {"start": 0, "decode_turn": 0, "append": 0}


GROW_SLOTS = 64
"""The cache grows in steps of this many slots (each size is one more compiled program)."""


class Session(NamedTuple):
    """Device state of a batch of conversations between calls.

    Attributes:
      cache: the KV cache (`cache.index` = next slot). It holds the conversation so far and
        grows by `GROW_SLOTS` when a turn or an observation needs room, so a decode step
        reads only the slots written so far (plus the turn's own), not the whole capacity.
      logits_bv: float32 [B, V] logits for each row's next token.
      pos_b: int32 [B] each row's next position (= its real tokens so far).
      capacity: int32 scalar, the most slots the cache may grow to.
    """

    cache: KVCache
    logits_bv: jax.Array
    pos_b: jax.Array
    capacity: jax.Array


class Turn(NamedTuple):
    """One turn's samples, [B, W] with W the bucketed turn cap.

    Attributes:
      tokens_bw: int32 sampled tokens (pad where not sampled).
      logp_bw: float32 their log-probs (0 where not sampled).
      mask_bw: bool sampled tokens (a prefix of each row; all False in rows not live).
      stop_b: int32 STOP_CAP | STOP_TOKEN | STOP_SEQUENCE (STOP_CAP in rows not live).
    """

    tokens_bw: jax.Array
    logp_bw: jax.Array
    mask_bw: jax.Array
    stop_b: jax.Array


def encode_stop_sequences(sequences: Sequence[Sequence[int]], width: int | None = None) -> np.ndarray:
    """int32 [N, L] right-aligned token sequences, -1 in front (never matches a token).

    No sequence gives one row of -1s, which never matches (the static shape stays [1, 1]+).
    """
    sequences = [list(s) for s in sequences if len(s)]
    width = width or max([len(s) for s in sequences] + [1])
    out = np.full((max(len(sequences), 1), width), -1, np.int32)
    for i, seq in enumerate(sequences):
        if len(seq) > width:
            raise ValueError(f"stop sequence {seq} is longer than the width {width}.")
        out[i, width - len(seq):] = seq
    return out


def _model(graphdef, state, packed_dots: bool):
    """(model, layer_params, unembed) for `decode_step`, packed with `packed_dots`
    (`sampler.decode_weights`)."""
    model = cast_matmul_weights(nnx.merge(graphdef, state))
    return model, *decode_weights(model, model.layers.unstacked(), packed_dots)


def _packed_dots(model: Decoder, state) -> bool:
    return packed_dot.use_packed(state, model.config.matmul_dtype)


@functools.partial(jax.jit, static_argnames=("graphdef", "num_samples", "slots", "cache_dtype", "packed_dots"))
def _start_core(graphdef, state, tokens_ps, mask_ps, capacity, *, num_samples: int, slots: int, cache_dtype: str,
                packed_dots: bool = False):
    TRACE_COUNTS["start"] += 1
    model, layer_params, unembed = _model(graphdef, state, packed_dots)
    logits_pv, cache = _prefill(model, layer_params, tokens_ps, mask_ps, slots, cache_dtype, unembed)
    repeat = lambda x: jnp.repeat(x, num_samples, axis=0)  # noqa: E731  Prompt-major.
    cache = cache._replace(keys_bkem=tuple(repeat(k) for k in cache.keys_bkem),
                           values_bkme=tuple(repeat(v) for v in cache.values_bkme),
                           valid_bm=repeat(cache.valid_bm))
    pos_b = repeat(jnp.sum(mask_ps, axis=1, dtype=jnp.int32))
    return Session(cache, repeat(logits_pv).astype(jnp.float32), pos_b, capacity)


@functools.partial(jax.jit, static_argnames=("slots",))  # new shapes: nothing to donate to
def _grow_core(session: Session, *, slots: int) -> Session:
    return session._replace(cache=session.cache.grown(slots))


def _with_room(session: Session, needed: int, what: str) -> Session:
    """The session with at least ``needed`` cache slots (grown by GROW_SLOTS steps)."""
    slots, capacity = session.cache.valid_bm.shape[1], int(session.capacity)
    if needed > capacity:
        raise ValueError(f"{what} needs {needed} cache slots but the session's capacity is {capacity}; start it "
                         "with a larger capacity.")
    if needed <= slots:
        return session
    return _grow_core(session, slots=min(round_up(needed, GROW_SLOTS), max(capacity, needed)))


def start(model: Decoder, prompt_tokens_ps, prompt_mask_ps, *, num_samples: int, capacity: int,
          cache_dtype: str | None = None) -> Session:
    """Prefills left-padded prompts [P, S] into a cache for G rows each.

    `capacity` bounds the slots the cache may grow to: S plus every token the turns and
    observations may add (rounded up to a multiple of 16). The KV-cache dtype is chosen
    for `capacity` and kept as the cache grows.
    """
    tokens_ps = np.asarray(prompt_tokens_ps, np.int32)
    mask_ps = np.asarray(prompt_mask_ps, bool)
    if tokens_ps.ndim != 2 or tokens_ps.shape != mask_ps.shape:
        raise ValueError(f"prompts must be [P, S] tokens and mask, got {tokens_ps.shape} and {mask_ps.shape}.")
    if not mask_ps.any(axis=1).all():
        raise ValueError("every prompt needs at least one real token.")
    capacity = round_up(int(capacity), 16)
    if capacity <= tokens_ps.shape[1]:
        raise ValueError(f"capacity={capacity} leaves no slot after {tokens_ps.shape[1]} prompt tokens.")
    if cache_dtype is None:
        cache_dtype = default_cache_dtype(model.config, capacity, jax.default_backend()).name
    graphdef, state = nnx.split(model)
    slots = min(round_up(tokens_ps.shape[1] + 1, GROW_SLOTS), capacity)
    return _start_core(graphdef, state, tokens_ps, mask_ps, np.int32(capacity), num_samples=int(num_samples),
                       slots=slots, cache_dtype=cache_dtype, packed_dots=_packed_dots(model, state))


@functools.partial(jax.jit, static_argnames=("graphdef", "width", "greedy", "use_filter", "packed_dots"),
                   donate_argnames=("session",))
def _decode_core(graphdef, state, session: Session, key, live_b, max_tokens, temperature, top_p, top_k,
                 stop_ids_n, stop_seqs_nl, pad_id, *, width: int, greedy: bool, use_filter: bool,
                 packed_dots: bool = False):
    TRACE_COUNTS["decode_turn"] += 1
    model, layer_params, unembed = _model(graphdef, state, packed_dots)
    batch = live_b.shape[0]
    seq_len = stop_seqs_nl.shape[1]

    class Carry(NamedTuple):
        step: jax.Array
        session: Session
        active_b: jax.Array
        stop_b: jax.Array
        tail_bl: jax.Array
        tokens_bw: jax.Array
        logp_bw: jax.Array
        mask_bw: jax.Array

    def cond(c: Carry):
        return (c.step < max_tokens) & jnp.any(c.active_b)

    def body(c: Carry):
        s = c.session
        token_b, logp_b = sample_token_and_logprob(jax.random.fold_in(key, c.step), s.logits_bv,
                                                   temperature=temperature, top_k=top_k, top_p=top_p,
                                                   greedy=greedy, use_filter=use_filter)
        active_b = c.active_b
        token_b = jnp.where(active_b, token_b, pad_id)
        tail_bl = jnp.where(active_b[:, None], jnp.concatenate([c.tail_bl[:, 1:], token_b[:, None]], axis=1),
                            c.tail_bl)
        hit_token_b = jnp.any(token_b[:, None] == stop_ids_n[None, :], axis=-1)
        hit_seq_b = jnp.any(jnp.all((tail_bl[:, None, :] == stop_seqs_nl[None]) | (stop_seqs_nl[None] < 0),
                                    axis=-1) & jnp.any(stop_seqs_nl >= 0, axis=-1)[None], axis=-1)
        stop_b = jnp.where(active_b & hit_token_b, STOP_TOKEN,
                           jnp.where(active_b & hit_seq_b, STOP_SEQUENCE, c.stop_b))
        logits_b1v, cache = model.decode_step(token_b[:, None], s.pos_b[:, None], s.cache,
                                              mask_bt=active_b[:, None], last_only=True,
                                              layer_params=layer_params, unembed=unembed)
        logits_bv = jnp.where(active_b[:, None], logits_b1v[:, 0].astype(jnp.float32), s.logits_bv)
        session = Session(cache, logits_bv, s.pos_b + active_b.astype(jnp.int32), s.capacity)
        return Carry(c.step + 1, session, active_b & ~hit_token_b & ~hit_seq_b, stop_b, tail_bl,
                     c.tokens_bw.at[:, c.step].set(token_b),
                     c.logp_bw.at[:, c.step].set(jnp.where(active_b, logp_b, 0.0)),
                     c.mask_bw.at[:, c.step].set(active_b))

    init = Carry(jnp.zeros((), jnp.int32), session, live_b, jnp.full((batch,), STOP_CAP, jnp.int32),
                 jnp.full((batch, seq_len), -1, jnp.int32), jnp.full((batch, width), pad_id, jnp.int32),
                 jnp.zeros((batch, width), jnp.float32), jnp.zeros((batch, width), bool))
    final = jax.lax.while_loop(cond, body, init)
    return final.session, Turn(final.tokens_bw, final.logp_bw, final.mask_bw, final.stop_b)


def decode_turn(key, model: Decoder, session: Session, live_b, *, max_tokens: int, temperature: float = 1.0,
                top_p: float = 1.0, top_k: int = 0, greedy: bool = False, stop_token_ids: Sequence[int] = (),
                stop_sequences: np.ndarray | None = None, pad_id: int = 0,
                bucket: int = 16) -> tuple[Session, Turn]:
    """One turn of every live row (bool [B]); the session is consumed (donated) and returned.

    Args:
      max_tokens: the turn's token cap (the buffer is rounded up to `bucket`; traced, so
        changing it within a bucket does not recompile).
      stop_token_ids: ids that end the turn (the episode's end: EOS).
      stop_sequences: `encode_stop_sequences` output; a row whose last tokens equal one ends
        its turn (for example at the end of a tool call).
    """
    width = round_up(max(int(max_tokens), 1), bucket)
    session = _with_room(session, int(session.cache.index) + int(max_tokens), f"a turn of {max_tokens} tokens")
    if not greedy and not temperature > 0:
        raise ValueError(f"temperature={temperature} must be > 0 (use greedy=True for argmax decoding).")
    stop_ids = np.asarray(list(stop_token_ids) or [-1], np.int32)
    seqs = encode_stop_sequences([]) if stop_sequences is None else np.asarray(stop_sequences, np.int32)
    graphdef, state = nnx.split(model)
    return _decode_core(graphdef, state, session, key, jnp.asarray(live_b, bool), np.int32(max_tokens),
                        np.float32(temperature), np.float32(top_p), np.int32(top_k), stop_ids, seqs,
                        np.int32(pad_id), width=width, greedy=bool(greedy),
                        use_filter=bool(not greedy and (top_k > 0 or top_p < 1)),
                        packed_dots=_packed_dots(model, state))


@functools.partial(jax.jit, static_argnames=("graphdef", "packed_dots"), donate_argnames=("session",))
def _append_core(graphdef, state, session: Session, tokens_bc, mask_bc, *, packed_dots: bool = False):
    TRACE_COUNTS["append"] += 1
    model, layer_params, unembed = _model(graphdef, state, packed_dots)
    positions_bc = session.pos_b[:, None] + jnp.maximum(jnp.cumsum(mask_bc.astype(jnp.int32), axis=1) - 1, 0)
    logits_b1v, cache = model.decode_step(tokens_bc, positions_bc, session.cache, mask_bt=mask_bc,
                                          last_only=True, layer_params=layer_params, unembed=unembed)
    has_b = jnp.any(mask_bc, axis=1)
    logits_bv = jnp.where(has_b[:, None], logits_b1v[:, 0].astype(jnp.float32), session.logits_bv)
    return Session(cache, logits_bv, session.pos_b + jnp.sum(mask_bc, axis=1, dtype=jnp.int32), session.capacity)


def append(model: Decoder, session: Session, chunks: Sequence[Sequence[int]], *, pad_id: int = 0,
           bucket: int = 16) -> Session:
    """Appends each row's token ids (an empty list leaves the row as it is) after its last token.

    The chunk is left-padded to a multiple of `bucket` (one compiled program per width), so
    each row's last observation token sits in the last column, whose logits start its next turn.
    """
    batch = session.pos_b.shape[0]
    if len(chunks) != batch:
        raise ValueError(f"{len(chunks)} chunks for a batch of {batch} rows.")
    longest = max([len(c) for c in chunks] + [1])
    width = round_up(longest, bucket)
    session = _with_room(session, int(session.cache.index) + width, f"appending {width} slots")
    tokens = np.full((batch, width), pad_id, np.int32)
    mask = np.zeros((batch, width), bool)
    for b, ids in enumerate(chunks):
        if len(ids):
            tokens[b, width - len(ids):] = ids
            mask[b, width - len(ids):] = True
    graphdef, state = nnx.split(model)
    return _append_core(graphdef, state, session, tokens, mask, packed_dots=_packed_dots(model, state))
