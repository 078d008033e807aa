"""Token log-probabilities and importance log-ratios (SPEC §3.4).

Everything returned here is float32, also when logits, hidden states or the unembedding are
bf16. Large-vocabulary work is chunked over the time axis T so that neither the forward nor
the backward pass holds a float32 [B, T, V] array:

- from logits (`token_logprobs`): each chunk is a slice read inside a loop, upcast, reduced
  and dropped; a custom VJP recomputes chunk by chunk and writes the logits gradient into
  one buffer (`map_logits_chunks`).
- from hidden states (`token_logprobs_from_hidden`, what the trainer uses): logits are
  formed chunk by chunk from h @ W; each chunk body is under `jax.checkpoint`
  (`map_time_chunks`), so [B, T, V] logits never exist at all unless the caller asks for
  one chunk of the whole length (then nothing is recomputed in the backward pass).
- per chunk, log π(y) and the entropy share one written-out backward pass
  (`logprob_and_entropy`) that keeps only the logits between the passes.

References: GSPO, Zheng et al. 2025, arXiv 2507.18071 (sequence-level ratio).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import chex
import jax
import jax.numpy as jnp

LOG_RATIO_BOUND = 20.0
"""|log-ratio| cap applied before any exp: exp(20) ≈ 4.9e8 is finite in float32."""

DEFAULT_CHUNK_ELEMENTS = 1 << 24
"""Auto chunking budget: float32 elements of one [B, chunk, V] logits chunk (64 MiB)."""


def mixed_einsum(spec: str, x: jax.Array, y: jax.Array, *, dtype: Any = jnp.float32,
                 precision: jax.lax.PrecisionLike = None, save_inputs: str = "") -> jax.Array:
    """Two-operand einsum with operands cast to `dtype` and float32 accumulation and output.

    The mixed-precision matmul of the house policy (STYLE.md "Precision"): operands are cast
    to `dtype` (bfloat16 for mixed precision) *inside* the function and the product is
    accumulated and returned in float32 (`preferred_element_type=float32`, XLA's fast bf16
    path on CPUs with AVX512-BF16/AMX and the native one on GPU/TPU). The backward pass is
    written out (custom VJP) so it stays on that path too: the float32 cotangent g is cast
    to `dtype` and both gradients are bf16·bf16 dots accumulated in float32,
        dx = einsum(out, y -> x)(g, y),   dy = einsum(x, out -> y)(x, g),
    returned in the dtypes of x and y (float32 master weights get a float32 gradient, never
    one rounded to bf16). JAX's own transpose would instead form float32 × bf16 dots (a
    float32 matmul after an upcast) and round the weight gradient to the operand dtype.

    With `dtype` float32 the values are those of `jnp.einsum(spec, x, y)` in float32, and the
    backward pass is the same two written-out einsums. That is a speed choice, not a
    numerical one: JAX's own transpose of an einsum ends in a transpose that XLA:CPU folds
    into the producer of the cotangent (the SwiGLU backward wrote its output transposed, 27
    ms instead of ~3 ms per layer and micro-batch on SmolLM2) and runs the weight gradient
    as an Eigen dot; the written-out form keeps every dot a YNNPACK fusion
    (docs/performance.md at 9f22ea1, "perf13").

    Args:
      spec: "xsub,ysub->outsub" without ellipsis; every index of x must appear in y or the
        output, and likewise for y (no index summed within a single operand).
      x, y: floating arrays of any float dtype.
      dtype: operand (compute) dtype.
      precision: passed to the float32 einsum only.
      save_inputs: which operands ("x", "y", "xy" or "") the backward pass keeps as they
        came in, casting them again when it runs, instead of keeping their `dtype` copies
        (the default). Same values and gradients either way; only what stays alive between
        the forward and the backward pass changes. Worth it where the original is alive
        anyway: a parameter slice of a layer scan (JAX forwards a scanned input as a
        residual without stacking it, whereas the bf16 copy is stacked per layer), an
        activation that several matmuls read (one residual instead of one copy each), or
        one that another op saves (softmax probabilities).

    Returns:
      float32 array of the output shape.
    """
    dtype = jnp.dtype(dtype)
    _split_spec(spec)  # Validate before tracing the custom VJP.
    if set(save_inputs) - {"x", "y"}:
        raise ValueError(f"save_inputs={save_inputs!r}; expected a combination of 'x' and 'y'.")
    if dtype != jnp.float32:
        precision = None  # bf16 operands: the precision flag has no meaning.
    return _mixed_einsum(spec, dtype, jnp.dtype(x.dtype), jnp.dtype(y.dtype),
                         ("x" in save_inputs, "y" in save_inputs), precision, x, y)


def _split_spec(spec: str) -> tuple[str, str, str]:
    inputs, out = spec.replace(" ", "").split("->")
    x_sub, y_sub = inputs.split(",")
    if "." in spec or not set(x_sub) <= set(y_sub + out) or not set(y_sub) <= set(x_sub + out):
        raise ValueError(f"mixed_einsum needs 'x,y->out' without ellipsis and without indices "
                         f"summed within one operand; got {spec!r}.")
    return x_sub, y_sub, out


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3, 4, 5))
def _mixed_einsum(spec, dtype, x_dtype, y_dtype, save, precision, x, y):
    return _mixed_einsum_fwd(spec, dtype, x_dtype, y_dtype, save, precision, x, y)[0]


def to_stackable(a: jax.Array) -> jax.Array:
    """`a` as it should be written into a larger buffer: 16-bit floats as their raw uint16 bits.

    Residuals kept for the backward pass inside a layer scan are stacked into an [L, ...]
    buffer, and each KV-cache write updates a slice of a layer's cache, both with a
    dynamic-update-slice. XLA:CPU has no bf16 dynamic-update-slice: it converts the whole
    buffer to float32 and back on every write, O(L²) traffic for a stacked residual
    (perf13 in docs/performance.md at 9f22ea1: 5.3 s of a 28 s SmolLM2 update, and a 2.4x slower bf16
    rollout). The same bits as uint16 are stacked in place. A bitcast is
    free on every backend, so this is not CPU-specific code. Inverse: `from_stackable`.
    """
    if a.dtype.itemsize == 2 and jnp.issubdtype(a.dtype, jnp.floating):
        return jax.lax.bitcast_convert_type(a, jnp.uint16)
    return a


def from_stackable(r: jax.Array, dtype: Any) -> jax.Array:
    """Inverse of `to_stackable` for an array that was `dtype`."""
    return jax.lax.bitcast_convert_type(r, dtype) if r.dtype != jnp.dtype(dtype) else r


def _mixed_einsum_fwd(spec, dtype, x_dtype, y_dtype, save, precision, x, y):
    x_c, y_c = x.astype(dtype), y.astype(dtype)
    out = jnp.einsum(spec, x_c, y_c, precision=precision, preferred_element_type=jnp.float32)
    save_x, save_y = save
    return out, (to_stackable(x if save_x else x_c), to_stackable(y if save_y else y_c))


def _mixed_einsum_bwd(spec, dtype, x_dtype, y_dtype, save, precision, residuals, g):
    x_sub, y_sub, out = _split_spec(spec)
    save_x, save_y = save
    x_r, y_r = residuals
    # Operands saved as they came in are cast again here (no-ops for the `dtype` copies).
    x_c = from_stackable(x_r, x_dtype if save_x else dtype).astype(dtype)
    y_c = from_stackable(y_r, y_dtype if save_y else dtype).astype(dtype)
    g_c = g.astype(dtype)
    dx = jnp.einsum(f"{out},{y_sub}->{x_sub}", g_c, y_c, precision=precision,
                    preferred_element_type=jnp.float32)
    dy = jnp.einsum(f"{x_sub},{out}->{y_sub}", x_c, g_c, precision=precision,
                    preferred_element_type=jnp.float32)
    # The barrier keeps XLA from folding a caller's transpose of a gradient (e.g. the tied
    # embedding's [D, V] -> [V, D]) into the dot itself: the folded dot has its lhs
    # contracting dimension first, which XLA:CPU's bf16 (YNNPACK) dot fusion rejects and
    # whose fallback (Eigen DotThunk) has no bf16 x bf16 -> f32 kernel, so it fails at run time.
    dx, dy = jax.lax.optimization_barrier((dx, dy))
    return dx.astype(x_dtype), dy.astype(y_dtype)


_mixed_einsum.defvjp(_mixed_einsum_fwd, _mixed_einsum_bwd)


def narrower_float(*dtypes: Any) -> jnp.dtype:
    """The least precise of the given float dtypes by mantissa bits (bf16 < f16 < f32)."""
    return min((jnp.dtype(d) for d in dtypes), key=lambda d: jnp.finfo(d).nmant)


def auto_chunk_size(batch: int, length: int, vocab: int, *,
                    budget_elements: int = DEFAULT_CHUNK_ELEMENTS) -> int:
    """Largest time chunk whose float32 [batch, chunk, vocab] logits fit `budget_elements`.

    Returns `length` (no chunking) when the whole sequence fits; otherwise a chunk of at
    least 1, rounded down to a multiple of 8 when it is 8 or more.
    """
    chunk = max(1, budget_elements // max(1, batch * vocab))
    if chunk >= length:
        return max(1, length)
    return chunk - chunk % 8 if chunk >= 8 else chunk


def map_time_chunks(fn: Callable[..., Any], arrays_bt: tuple[jax.Array, ...],
                    chunk_size: int) -> Any:
    """Applies `fn` to [B, chunk, ...] slices of `arrays_bt` and concatenates over time.

    Each array has leading axes [B, T]. T is zero-padded up to a multiple of `chunk_size`
    (the padded outputs are dropped). Chunks run sequentially under `jax.lax.map`, each body
    under `jax.checkpoint`, so only one chunk's intermediates are alive at a time in the
    forward and in the backward pass. A single chunk (`chunk_size >= T`) runs as it is,
    without `jax.checkpoint`: its intermediates stay alive from the forward to the backward
    pass (still O(B · chunk · V)), which then recomputes nothing; under bf16 compute XLA
    did not remove the checkpointed recompute of the LM-head dot by itself. `fn` returns a
    pytree of [B, chunk, ...] arrays (`None` leaves are allowed).
    """
    batch, length = arrays_bt[0].shape[:2]
    if chunk_size >= length:
        return fn(*arrays_bt)
    checkpointed_fn = jax.checkpoint(fn)
    num_chunks = -(-length // chunk_size)
    padded_length = num_chunks * chunk_size

    def to_chunks(x):
        pad = [(0, 0), (0, padded_length - length)] + [(0, 0)] * (x.ndim - 2)
        x = jnp.pad(x, pad)
        x = x.reshape((batch, num_chunks, chunk_size) + x.shape[2:])
        return jnp.moveaxis(x, 1, 0)  # [n, B, chunk, ...]

    def from_chunks(y):
        y = jnp.moveaxis(y, 0, 1)  # [B, n, chunk, ...]
        y = y.reshape((batch, padded_length) + y.shape[3:])
        return y[:, :length]

    outputs = jax.lax.map(lambda xs: checkpointed_fn(*xs),
                          tuple(to_chunks(x) for x in arrays_bt))
    return jax.tree.map(from_chunks, outputs)


def _slice_chunk(logits_btv, tokens_bt, start, size):
    """Time slice [start, start + size) of logits and tokens (start may be traced).

    The barrier keeps XLA from rewriting convert(slice(x)) into slice(convert(x)) and then
    hoisting a float32 copy of the whole [B, T, V] array out of the loop.
    """
    logits_bcv = jax.lax.dynamic_slice_in_dim(logits_btv, start, size, axis=1)
    tokens_bc = jax.lax.dynamic_slice_in_dim(tokens_bt, start, size, axis=1)
    return jax.lax.optimization_barrier((logits_bcv, tokens_bc))


def _for_each_chunk(length: int, chunk_size: int, body, carry):
    """carry = body(start, size, carry) over [0, T) in chunks: a loop, then a static tail."""
    num_full, tail = divmod(length, chunk_size)
    if num_full == 1:
        carry = body(0, chunk_size, carry)
    elif num_full > 1:
        carry = jax.lax.fori_loop(
            0, num_full, lambda i, c: body(i * chunk_size, chunk_size, c), carry)
    if tail:
        carry = body(num_full * chunk_size, tail, carry)
    return carry


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3))
def map_logits_chunks(fn: Callable[[jax.Array, jax.Array], tuple[jax.Array, ...]],
                      logits_btv: jax.Array, tokens_bt: jax.Array,
                      chunk_size: int) -> tuple[jax.Array, ...]:
    """Applies fn(logits_bcv, tokens_bc) -> tuple of [B, c] arrays to time slices of logits.

    Unlike `map_time_chunks` this never copies or reshapes the [B, T, V] input: each chunk
    is a `dynamic_slice` read inside a loop (so the compiler cannot hoist an upcast of the
    whole array), and a custom VJP recomputes each chunk in the backward pass and writes
    its logits cotangent (in the logits dtype) into one preallocated buffer. Peak extra
    memory is O(B · chunk · V) float32 plus the gradient itself. `fn` must be a pure
    module-level function (no closed-over arrays); T need not divide by chunk_size.
    """
    return _map_logits_chunks_fwd(fn, logits_btv, tokens_bt, chunk_size)[0]


def _map_logits_chunks_fwd(fn, logits_btv, tokens_bt, chunk_size):
    batch, length = tokens_bt.shape
    out_shapes = jax.eval_shape(
        fn, jax.ShapeDtypeStruct((batch, 1) + logits_btv.shape[2:], logits_btv.dtype),
        jax.ShapeDtypeStruct((batch, 1), tokens_bt.dtype))
    outputs = tuple(jnp.zeros((batch, length), o.dtype) for o in out_shapes)

    def body(start, size, outputs):
        chunk_outputs = fn(*_slice_chunk(logits_btv, tokens_bt, start, size))
        return tuple(jax.lax.dynamic_update_slice_in_dim(o, x, start, axis=1)
                     for o, x in zip(outputs, chunk_outputs))

    outputs = _for_each_chunk(length, chunk_size, body, outputs)
    return outputs, (logits_btv, tokens_bt)


def _map_logits_chunks_bwd(fn, chunk_size, residuals, cotangents):
    logits_btv, tokens_bt = residuals
    length = tokens_bt.shape[1]

    def body(start, size, grad_btv):
        logits_bcv, tokens_bc = _slice_chunk(logits_btv, tokens_bt, start, size)
        _, vjp_fn = jax.vjp(lambda x: fn(x, tokens_bc), logits_bcv)
        chunk_cotangents = tuple(jax.lax.dynamic_slice_in_dim(c, start, size, axis=1)
                                 for c in cotangents)
        (grad_bcv,) = vjp_fn(chunk_cotangents)
        return jax.lax.dynamic_update_slice_in_dim(
            grad_btv, grad_bcv.astype(grad_btv.dtype), start, axis=1)

    grad_btv = _for_each_chunk(length, chunk_size, body, jnp.zeros_like(logits_btv))
    return grad_btv, None


map_logits_chunks.defvjp(_map_logits_chunks_fwd, _map_logits_chunks_bwd)


def _check_tokens(tokens_bt: jax.Array, batch_length: tuple[int, int], name: str) -> None:
    if tokens_bt.shape != batch_length:
        raise ValueError(f"tokens_bt has shape {tokens_bt.shape} but {name} implies [B, T] = "
                         f"{batch_length}; pass the response tokens aligned with {name}.")
    if not jnp.issubdtype(tokens_bt.dtype, jnp.integer):
        raise TypeError(f"tokens_bt must be an integer array, got {tokens_bt.dtype}.")


def logprob_and_entropy(logits_bcv: jax.Array, tokens_bc: jax.Array,
                        with_entropy: bool) -> tuple[jax.Array, jax.Array | None]:
    """float32 log π(token) (and entropy H = −Σ p log p) of float32 logits [..., V] (**contract**).

    The one home of both formulas (`entropy.entropy_from_logits` calls it too). Token ids
    outside [0, V) are clipped (mask them).

    With m = max_v z (held constant), e = exp(z − m) and s = Σ_v e:
        log π(y) = z_y − (m + log s),     H = log s − Σ_v e·(z − m) / s,
    the second being −Σ p log p with p = e / s (terms with e = 0, e.g. −inf logits, add 0).
    The backward pass is written out (`_logprob_entropy_bwd`): it keeps only the logits
    and three per-token numbers, and forms dz in one elementwise pass over V,
        dz = p·(−ḡ_logp − ḡ_H·(log p + H)) + ḡ_logp·onehot(y).
    JAX's own derivative of logsumexp plus entropy kept further [B, c, V] intermediates
    alive until the backward pass (191 MB more in the SmolLM2 update; docs/performance.md
    at 9f22ea1, perf15).
    """
    tokens_bc = jnp.clip(tokens_bc, 0, logits_bcv.shape[-1] - 1)
    return _logprob_entropy(with_entropy, logits_bcv, tokens_bc)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _logprob_entropy(with_entropy, logits_bcv, tokens_bc):
    return _logprob_entropy_fwd(with_entropy, logits_bcv, tokens_bc)[0]


def _logprob_entropy_fwd(with_entropy, logits_bcv, tokens_bc):
    max_bc = jnp.max(logits_bcv, axis=-1)
    max_bc = jnp.where(jnp.isfinite(max_bc), max_bc, 0.0)  # all −inf row: shift by 0, not NaN
    shifted_bcv = logits_bcv - max_bc[..., None]
    exp_bcv = jnp.exp(shifted_bcv)
    sum_bc = jnp.sum(exp_bcv, axis=-1)
    log_sum_bc = jnp.log(sum_bc)
    logsumexp_bc = max_bc + log_sum_bc
    token_logit_bc = jnp.take_along_axis(logits_bcv, tokens_bc[..., None], axis=-1)[..., 0]
    logp_bc = token_logit_bc - logsumexp_bc
    entropy_bc = None
    if with_entropy:
        weighted_bc = jnp.sum(jnp.where(exp_bcv > 0, exp_bcv * shifted_bcv, 0.0), axis=-1)
        entropy_bc = log_sum_bc - weighted_bc / sum_bc
    return (logp_bc, entropy_bc), (logits_bcv, tokens_bc, logsumexp_bc, entropy_bc)


def _logprob_entropy_bwd(with_entropy, residuals, cotangents):
    logits_bcv, tokens_bc, logsumexp_bc, entropy_bc = residuals
    g_logp_bc, g_entropy_bc = cotangents
    logp_bcv = logits_bcv - logsumexp_bc[..., None]
    p_bcv = jnp.exp(logp_bcv)
    scale_bcv = -g_logp_bc[..., None]
    if with_entropy:
        # dH/dz_v = −p_v (log p_v + H); p_v = 0 terms (−inf logits) get 0, not 0·inf.
        scale_bcv = scale_bcv - g_entropy_bc[..., None] * jnp.where(
            p_bcv > 0, logp_bcv + entropy_bc[..., None], 0.0)
    vocab_v = jax.lax.broadcasted_iota(tokens_bc.dtype, logits_bcv.shape, logits_bcv.ndim - 1)
    onehot_bcv = vocab_v == tokens_bc[..., None]
    d_logits_bcv = p_bcv * scale_bcv + jnp.where(onehot_bcv, g_logp_bc[..., None], 0.0)
    return d_logits_bcv, None


_logprob_entropy.defvjp(_logprob_entropy_fwd, _logprob_entropy_bwd)


def token_logprobs(logits_btv: jax.Array, tokens_bt: jax.Array, *,
                   chunk_size: int | None = None) -> jax.Array:
    """float32 log π(token_bt) from logits of any float dtype (SPEC §3.4, **contract**).

    log π(y_t) = z_t[y_t] − logsumexp_v z_t[v], with z upcast to float32 one time-chunk at a
    time, so a bf16 [B, T, V] input never gets a full float32 copy (`map_logits_chunks`;
    the gradient w.r.t. the logits is exact and has the logits dtype). Note: XLA's CPU
    backend itself widens bf16 buffers to float32; the saving shows on GPU/TPU and, on any
    backend, for float32 inputs (no float32 softmax temporary of [B, T, V]).

    Args:
        logits_btv: [B, T, V] logits (float32 or bf16); position t scores token_bt[:, t].
        tokens_bt: [B, T] integer token ids. Ids outside [0, V) are clipped (mask them).
        chunk_size: time steps per chunk; None picks `auto_chunk_size(B, T, V)`.

    Returns:
        logp_bt: [B, T] float32.
    """
    chex.assert_rank(logits_btv, 3)
    chex.assert_type(logits_btv, float)
    _check_tokens(tokens_bt, logits_btv.shape[:2], "logits_btv")
    batch, length, vocab = logits_btv.shape
    if chunk_size is None:
        chunk_size = auto_chunk_size(batch, length, vocab)
    _check_chunk_size(chunk_size)

    (logp_bt,) = map_logits_chunks(_upcast_token_logprobs, logits_btv, tokens_bt, chunk_size)
    return logp_bt


def _upcast_token_logprobs(logits_bcv: jax.Array, tokens_bc: jax.Array) -> tuple[jax.Array]:
    logp_bc, _ = logprob_and_entropy(logits_bcv.astype(jnp.float32), tokens_bc, False)
    return (logp_bc,)


def token_logprobs_from_hidden(
        hidden_btd: jax.Array,
        unembed_dv: jax.Array,
        tokens_bt: jax.Array,
        *,
        chunk_size: int | None = None,
        with_entropy: bool = False,
        precision: jax.lax.PrecisionLike = None,
) -> tuple[jax.Array, jax.Array | None]:
    """float32 log π(token) (and entropy) from final hidden states, never forming [B, T, V].

    Per time chunk c: z_bcv = hidden_bcd @ unembed_dv with operands in the narrower of the
    two dtypes and float32 accumulation (`mixed_einsum`: bf16 hidden states and a float32
    master unembedding give a bf16 matmul and a float32 gradient), then
    log π = z[y] − logsumexp(z) and, optionally, H = −Σ_v p_v log p_v. With several
    chunks each chunk body is under `jax.checkpoint`: the backward pass recomputes one
    chunk's logits at a time, so peak memory is O(B · chunk · V) instead of O(B · T · V).
    A single chunk (chunk_size >= T) is not checkpointed: it keeps its intermediates for
    the backward pass instead of recomputing the LM-head matmul (faster when B · T · V fits;
    see docs/performance.md at 9f22ea1, perf12). (With bf16 *parameters* the unembedding gradient is summed
    over chunks in bf16.)

    Args:
        hidden_btd: [B, T, D] final (normed) hidden states; position t scores token_bt[:, t].
        unembed_dv: [D, V] output projection (the embedding transposed when tied).
        tokens_bt: [B, T] integer token ids; ids outside [0, V) are clipped (mask them).
        chunk_size: time steps per chunk; None picks `auto_chunk_size(B, T, V)`.
        with_entropy: also return the per-token entropy of π (float32).
        precision: matmul precision passed to `jnp.einsum`.

    Returns:
        (logp_bt [B, T] float32, entropy_bt [B, T] float32 or None).
    """
    chex.assert_rank(hidden_btd, 3)
    chex.assert_rank(unembed_dv, 2)
    chex.assert_type([hidden_btd, unembed_dv], [float, float])
    if hidden_btd.shape[-1] != unembed_dv.shape[0]:
        raise ValueError(f"hidden_btd width {hidden_btd.shape[-1]} != unembed_dv rows "
                         f"{unembed_dv.shape[0]}; pass the [D, V] unembedding (transpose a "
                         "[V, D] embedding).")
    _check_tokens(tokens_bt, hidden_btd.shape[:2], "hidden_btd")
    batch, length, _ = hidden_btd.shape
    vocab = unembed_dv.shape[1]
    if chunk_size is None:
        chunk_size = auto_chunk_size(batch, length, vocab)
    _check_chunk_size(chunk_size)

    # Mixed precision: the matmul runs in the narrower of the two dtypes (bf16 hidden states
    # from a bf16-compute decoder and float32 master weights -> bf16 operands, float32
    # accumulation, float32 weight gradient); float32 x float32 stays a float32 einsum.
    compute_dtype = narrower_float(hidden_btd.dtype, unembed_dv.dtype)

    def chunk_fn(hidden_bcd, tokens_bc):
        logits_bcv = mixed_einsum("bcd,dv->bcv", hidden_bcd, unembed_dv, dtype=compute_dtype,
                                  precision=precision)
        return logprob_and_entropy(logits_bcv, tokens_bc, with_entropy)

    return map_time_chunks(chunk_fn, (hidden_btd, tokens_bt), chunk_size)


def _check_chunk_size(chunk_size: int) -> None:
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(
            f"chunk_size must be a positive int (or None for auto), got {chunk_size!r}.")


def clip_log_ratio(log_ratio: jax.Array, bound: float = LOG_RATIO_BOUND) -> jax.Array:
    """Clips a log-ratio to [−bound, bound] so exp() stays finite (float32)."""
    return jnp.clip(jnp.asarray(log_ratio, jnp.float32), -bound, bound)


def token_log_ratio(logp_bt: jax.Array, old_logp_bt: jax.Array) -> jax.Array:
    """Per-token log π_θ − log π_old, clipped to ±20 before any exp (SPEC §3.4). float32."""
    chex.assert_equal_shape([logp_bt, old_logp_bt])
    return clip_log_ratio(logp_bt.astype(jnp.float32) - old_logp_bt.astype(jnp.float32))


def sequence_log_ratio(logp_bt: jax.Array, old_logp_bt: jax.Array,
                       mask_bt: jax.Array) -> jax.Array:
    """GSPO sequence log-ratio log s_i = (1/|y_i|) Σ_t (log π_θ − log π_old) (**contract**).

    s_i = exp(log s_i) is the geometric mean of the token ratios (GSPO, arXiv 2507.18071).
    Masked positions are ignored (also if they hold inf/NaN); a response with no valid token
    gets 0. The result is clipped to ±20.

    Args:
        logp_bt: [B, T] current-policy log-probs.
        old_logp_bt: [B, T] behaviour-policy log-probs (data).
        mask_bt: [B, T] bool, True = response token.

    Returns:
        [B] float32.
    """
    chex.assert_rank([logp_bt, mask_bt], 2)
    chex.assert_equal_shape([logp_bt, old_logp_bt, mask_bt])
    chex.assert_type(mask_bt, bool)
    diff_bt = logp_bt.astype(jnp.float32) - old_logp_bt.astype(jnp.float32)
    diff_bt = jnp.where(mask_bt, diff_bt, 0.0)
    length_b = jnp.sum(mask_bt, axis=1).astype(jnp.float32)
    return clip_log_ratio(jnp.sum(diff_bt, axis=1) / jnp.maximum(length_b, 1.0))


def gspo_token_log_ratio(logp_bt: jax.Array, old_logp_bt: jax.Array,
                         mask_bt: jax.Array) -> jax.Array:
    """GSPO-token log-ratio: value of the sequence, gradient of the token (**contract**).

    log s_{i,t} = sg(log s_i) + log π_θ(y_t) − sg(log π_θ(y_t))   (GSPO, arXiv 2507.18071)

    so exp() of it equals s_i everywhere while ∂/∂ log π_θ(y_t) = s_{i,t} per token. Combined
    with a per-token mean this gives exactly GSPO's sequence-level gradient. Masked positions
    are 0 with zero gradient.

    Args:
        logp_bt, old_logp_bt: [B, T] current / behaviour log-probs.
        mask_bt: [B, T] bool.

    Returns:
        [B, T] float32.
    """
    seq_log_ratio_b = sequence_log_ratio(logp_bt, old_logp_bt, mask_bt)
    logp_bt = logp_bt.astype(jnp.float32)
    token_part_bt = logp_bt - jax.lax.stop_gradient(logp_bt)
    value_bt = jax.lax.stop_gradient(seq_log_ratio_b)[:, None] + token_part_bt
    return jnp.where(mask_bt, value_bt, 0.0)
