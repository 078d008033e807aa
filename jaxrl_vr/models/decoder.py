"""Flax NNX decoder-only transformer covering Llama (incl. SmolLM2), Qwen2 and Qwen3.

Pre-norm blocks: x += Attn(RMSNorm(x)); x += SwiGLU(RMSNorm(x)). Attention is grouped-query
(GQA) with rotary position embeddings in Hugging Face's `rotate_half` convention (the first
and second halves of each head are the rotated pairs), so HF safetensors load without any
permutation. Layer parameters are stacked along a leading layer axis L and the blocks run
under one `jax.lax.scan`, so compile time does not grow with depth.

Precision (`DecoderConfig.param_dtype`, `compute_dtype`): every matmul and einsum casts its
operands to the compute dtype and accumulates in float32 (`ratios.mixed_einsum`, whose
backward pass stays bf16·bf16 -> float32 and gives float32 master weights float32
gradients); the residual stream keeps the parameter dtype; RMSNorm statistics, RoPE,
attention softmax and the logits are float32. float32 params with bfloat16 compute is the
mixed-precision policy (`set_compute_dtype(model, "bfloat16")`); the default (compute =
param dtype = float32) is plain float32. Masked attention logits use `finfo.min`, never
-inf, so fully masked rows (left padding) give finite values, not NaN.

References: Llama (Touvron et al. 2023, arXiv 2302.13971), RoPE (Su et al., arXiv 2104.09864),
GQA (Ainslie et al., arXiv 2305.13245), SwiGLU (Shazeer, arXiv 2002.05202), Llama 3 RoPE
scaling (arXiv 2407.21783), Qwen2 (arXiv 2407.10671), Qwen3 (arXiv 2505.09388).
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any, NamedTuple, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_vr import host_cpu
from jaxrl_vr.models.config import COMPUTE_DTYPES, DecoderConfig
from jaxrl_vr.models.packed_dot import PackedMatrix, pack, pack_transposed, packable, packed_dot
from jaxrl_vr.ratios import from_stackable, mixed_einsum, to_stackable

_INIT_STD = 0.02  # HF initializer_range default.

# Stacked per-layer parameter names (each carries a leading L axis).
LAYER_PARAM_NAMES = (
    "attn_norm", "wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo", "q_norm", "k_norm",
    "mlp_norm", "w_gate", "w_up", "w_down",
)

MATMUL_WEIGHT_NAMES = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
"""Stacked block matrices (the bulk of the parameters): only ever read as matmul operands."""


def lora_names(target: str) -> tuple[str, str]:
    """The stacked adapter names of block matrix `target` (`jaxrl_vr.models.lora`):
    A [L, D_in, r] and B [L, r, D_out], with the head axes of wq/wk/wv (output) and wo
    (input) merged as `_block` merges them."""
    return f"{target}_lora_a", f"{target}_lora_b"


LORA_PARAM_NAMES = tuple(name for target in MATMUL_WEIGHT_NAMES for name in lora_names(target))


class KVCache(NamedTuple):
    """Static-shape key/value cache, one buffer per layer.

    Layouts are the operand layouts of the per-(batch, kv head) attention dots, so a decode
    step reads a layer's cache without a transposing copy: keys [.., Dh, M] (q·K contracts
    Dh), values [.., M, Dh] (p·V contracts M). (With [B, M, Hkv, Dh] for both, XLA's CPU
    backend made a transposing copy of every layer's keys on every step.) One buffer per
    layer rather than one stacked [L, ...] array: a layer's write is then an in-place update
    of its own buffer and its read needs no copy (with a stacked cache read inside a layer
    scan, XLA:CPU copied each layer's block out on every step: ~10 % of a SmolLM2 decode
    step at batch 64).

    Attributes:
      keys_bkem: per layer, [B, Hkv, Dh, M] rotated keys (M = cache length in slots).
      values_bkme: per layer, [B, Hkv, M, Dh] values.
      valid_bm: bool [B, M], True where a slot holds a real token (False for left padding
        and for slots not yet written).
      index: int32 scalar, the next slot to write (shared by the batch).
    """

    keys_bkem: tuple[jax.Array, ...]
    values_bkme: tuple[jax.Array, ...]
    valid_bm: jax.Array
    index: jax.Array

    def grown(self, max_len: int) -> "KVCache":
        """The same cache with `max_len` slots: empty (invalid, zero) slots appended (one copy
        of every buffer). `generate` grows its cache between decode segments."""
        extra = max_len - self.valid_bm.shape[1]
        if extra < 0:
            raise ValueError(f"KVCache.grown({max_len}) would drop slots: the cache holds {self.valid_bm.shape[1]}.")
        pad = lambda x, axis: jnp.pad(x, [(0, extra if a == axis else 0) for a in range(x.ndim)])  # noqa: E731
        return KVCache(tuple(pad(k, 3) for k in self.keys_bkem), tuple(pad(v, 2) for v in self.values_bkme),
                       pad(self.valid_bm, 1), self.index)


class PrefixKV(NamedTuple):
    """Every layer's rotated keys and values of a batch of prompt prefixes.

    What `Decoder.prefix_kv` returns and `Decoder.hidden_states(prefix=...)` attends to:
    a prompt shared by a group of responses runs through the blocks once, and each response
    attends to its keys and values (Prefix Grouper, Liu et al. 2025, arXiv 2506.05433).

    Attributes:
      keys_lbske: [L, B, S, Hkv, Dh] keys after RoPE (and the Qwen3 k-norm).
      values_lbske: [L, B, S, Hkv, Dh] values.
    """

    keys_lbske: jax.Array
    values_lbske: jax.Array

    def rows(self, index_b: jax.Array) -> "PrefixKV":
        """The prefixes of rows `index_b` (int [B']): row b' continues prefix index_b[b']."""
        return PrefixKV(*(jnp.take(x, index_b, axis=1) for x in self))


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """x / sqrt(mean(x²) + eps) · weight, statistics in float32 (HF LlamaRMSNorm order)."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
    return _lead(weight, x.ndim) * normed.astype(x.dtype)


def _lead(w: jax.Array, ndim: int) -> jax.Array:
    """Adds leading unit axes so `w` broadcasts against a rank-`ndim` array explicitly."""
    return w.reshape((1,) * (ndim - w.ndim) + w.shape)


def rope_inv_freq(config: DecoderConfig) -> np.ndarray:
    """Inverse frequencies θ^(−2i/Dh), i < Dh/2, with Llama-3 scaling when configured.

    Llama 3 (arXiv 2407.21783): wavelengths λ = 2π/f longer than L_orig/low_freq_factor are
    divided by `factor`; shorter than L_orig/high_freq_factor kept; in between blended with
    s = (L_orig/λ − low) / (high − low): f' = (1 − s)·f/factor + s·f.
    """
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim))
    scaling = config.rope_scaling_dict
    if scaling is None:
        return inv_freq.astype(np.float32)
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
    return np.where(is_medium, smoothed, scaled).astype(np.float32)


def rope_cos_sin(positions_bt: jax.Array, inv_freq: np.ndarray) -> tuple[jax.Array, jax.Array]:
    """cos, sin of shape [B, T, Dh] (each frequency repeated for both halves), float32."""
    freqs_bte = positions_bt.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)[None, None, :]
    emb_bte = jnp.concatenate([freqs_bte, freqs_bte], axis=-1)
    return jnp.cos(emb_bte), jnp.sin(emb_bte)


def apply_rope(x_bthe: jax.Array, cos_bte: jax.Array, sin_bte: jax.Array) -> jax.Array:
    """x·cos + rotate_half(x)·sin with rotate_half(x) = [−x₂, x₁] (HF convention), float32 math."""
    x = x_bthe.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    out = x * cos_bte[:, :, None, :] + rotated * sin_bte[:, :, None, :]
    return out.astype(x_bthe.dtype)


def _attention_probs(logits: jax.Array, allowed: jax.Array, head_dim: int) -> jax.Array:
    """Float32 softmax over the last (key) axis of logits/√Dh, with finfo.min where `allowed`
    (broadcast against logits) is False: every attention form's weights, whatever its layout."""
    logits = jnp.where(allowed, logits * (1.0 / math.sqrt(head_dim)), jnp.finfo(jnp.float32).min)
    return softmax_keeping_output(logits)


@jax.custom_vjp
def softmax_keeping_output(x: jax.Array) -> jax.Array:
    """`jax.nn.softmax(x, axis=-1)` whose backward pass needs only its output p:
    dx = p ⊙ (g − Σ g ⊙ p) over the last axis. `jax.nn.softmax` differentiates its
    exp-and-divide and keeps exp(x − max), the sum and p; in a layer scan each is stacked per
    layer (docs/performance.md, "perf31"). The attention's p·V dot keeps p anyway."""
    return jax.nn.softmax(x, axis=-1)


def _softmax_fwd(x):
    p = jax.nn.softmax(x, axis=-1)
    return p, p


def _softmax_bwd(p, g):
    return (p * (g - jnp.sum(g * p, axis=-1, keepdims=True)),)


softmax_keeping_output.defvjp(_softmax_fwd, _softmax_bwd)


def attend(q_bthe: jax.Array, k_bske: jax.Array, v_bske: jax.Array, allowed_bts: jax.Array, *,
           compute_dtype: Any = None) -> jax.Array:
    """Grouped-query softmax attention; query head h uses kv head h // (H / Hkv) (HF repeat_kv).

    Both dots take `compute_dtype` operands (default: the query dtype) with float32
    accumulation; logits q·k/√Dh and the softmax are float32, masked with finfo.min where
    `allowed_bts` is False. Returns [B, T, H, Dh] in the query dtype. Float32 compute uses
    `_attend_kv_major`, other dtypes `_attend_grouped`: same math, different layouts, chosen
    for how XLA:CPU runs each precision's dots.
    """
    dtype = jnp.dtype(compute_dtype or q_bthe.dtype)
    if dtype == jnp.float32:
        return _attend_kv_major(q_bthe, k_bske, v_bske, allowed_bts)
    return _attend_grouped(q_bthe, k_bske, v_bske, allowed_bts, dtype)


def _attend_grouped(q_bthe: jax.Array, k_bske: jax.Array, v_bske: jax.Array, allowed_bts: jax.Array,
                    dtype: Any) -> jax.Array:
    """`attend` with the query split as [B, T, Hkv, G, Dh] against keys and values as they
    come ([B, S, Hkv, Dh]). The form bf16 compute takes: its batched bf16 dots stay bf16
    (with float32 accumulation) on XLA:CPU."""
    b, t, h, e = q_bthe.shape
    kv_heads = k_bske.shape[2]
    q_btkge = q_bthe.reshape(b, t, kv_heads, h // kv_heads, e)
    logits = mixed_einsum("btkge,bske->bkgts", q_btkge, k_bske, dtype=dtype)
    probs = _attention_probs(logits, allowed_bts[:, None, None], e)
    # The p·V dot keeps the float32 p that the softmax keeps anyway, not a bf16 copy of its own
    # (28 MiB fewer compiled temporaries in the bf16 SmolLM2 update; docs/performance.md "perf32").
    out = mixed_einsum("bkgts,bske->btkge", probs, v_bske, dtype=dtype, save_inputs="x")
    return out.reshape(b, t, h, e).astype(q_bthe.dtype)


def _attend_kv_major(q_bthe: jax.Array, k_bske: jax.Array, v_bske: jax.Array, allowed_bts: jax.Array
                     ) -> jax.Array:
    """`attend` in float32 with (row, kv head) leading and a query's group and position merged
    into one axis: [B, Hkv, G·T, Dh] · [B, Hkv, S, Dh]. Every dot then has its contracted
    axis last on both sides and its output in the order the next op reads: a float32
    SmolLM2 update on a Zen 5 EPYC ran about 3 % faster, in 13 of 16 alternated pairs
    (docs/performance.md at 9f22ea1, "perf28", "perf29"). Not used for bf16 compute: in this form XLA:CPU ran the batched bf16 dots on
    float32 copies of their operands ("perf27")."""
    b, t, h, e = q_bthe.shape
    s, kv_heads = k_bske.shape[1], k_bske.shape[2]
    g = h // kv_heads
    q_bkme = jnp.transpose(q_bthe.reshape(b, t, kv_heads, g, e), (0, 2, 3, 1, 4)).reshape(b, kv_heads, g * t, e)
    k_bkse = jnp.transpose(k_bske, (0, 2, 1, 3))
    v_bkse = jnp.transpose(v_bske, (0, 2, 1, 3))
    logits = mixed_einsum("bkme,bkse->bkms", q_bkme, k_bkse, dtype=jnp.float32)
    # The mask laid out as the logits (query group and position merged), so that the softmax
    # and the p·V dot keep one and the same p for the backward pass, not two shapes of it.
    allowed_b1ms = jnp.broadcast_to(allowed_bts[:, None, None], (b, 1, g, t, s)).reshape(b, 1, g * t, s)
    probs = _attention_probs(logits, allowed_b1ms, e)
    out_bkme = mixed_einsum("bkms,bkse->bkme", probs, v_bkse, dtype=jnp.float32)
    out = jnp.transpose(out_bkme.reshape(b, kv_heads, g, t, e), (0, 3, 1, 2, 4)).reshape(b, t, h, e)
    return out.astype(q_bthe.dtype)


def attend_cache(q_bthe: jax.Array, k_bkes: jax.Array, v_bkse: jax.Array, allowed_bts: jax.Array, *,
                 compute_dtype: Any = None) -> jax.Array:
    """`attend` with the KV cache layouts: keys [B, Hkv, Dh, S], values [B, Hkv, S, Dh].

    Same math as `attend`. A chunk of several tokens (prefill) uses two dots, written in
    dot_general's natural output order (batch b, k; then t, g; then s or e) so neither the
    cache nor the probabilities are transposed: only the small query and output tensors are.
    A decode step (one token per row) over a float32 cache of at most 512 slots uses
    `_attend_one_token` instead (`one_token_form_pays`), whatever the compute dtype.
    """
    b, t, h, e = q_bthe.shape
    kv_heads = k_bkes.shape[1]
    dtype = compute_dtype or q_bthe.dtype
    q_btkge = q_bthe.reshape(b, t, kv_heads, h // kv_heads, e)
    if one_token_form_pays(t, k_bkes.shape[-1], (k_bkes.dtype, v_bkse.dtype)):
        out_bktge = _attend_one_token(q_btkge, k_bkes, v_bkse, allowed_bts)
    else:
        out_bktge = _attend_two_dots(q_btkge, k_bkes, v_bkse, allowed_bts, dtype)
    return jnp.transpose(out_bktge, (0, 2, 1, 3, 4)).reshape(b, t, h, e).astype(q_bthe.dtype)


# Where `_attend_one_token` beat the two dots, float32, 2-core AVX2 EPYC (docs/performance.md,
# "perf21"): `generate` with SmolLM2-135M ran 1.08-1.09x faster with it at batch 1 and 8 over
# 80 slots, 0.93x over 520 slots (8 samples x 512 tokens); alone, the attention of 30 layers
# took 0.77-0.79x the dots' time at 64 rows over 96-256 slots and 0.96-1.28x over 544 slots.
ONE_TOKEN_MAX_SLOTS = 512


def one_token_form_pays(tokens: int, slots: int, cache_dtypes: Sequence[Any]) -> bool:
    """Whether `attend_cache` uses the multiply-and-sum form: one token per row, a float32
    cache (keys and values), at most ONE_TOKEN_MAX_SLOTS slots (static shapes, so the choice is
    made once per compiled program). The compute dtype does not enter: the form reads the
    cache as it is and computes in float32, so under bf16 compute it also avoids converting
    the cache for the dots on every step (docs/performance.md, "perf26")."""
    return tokens == 1 and all(jnp.dtype(d) == jnp.float32 for d in cache_dtypes) and slots <= ONE_TOKEN_MAX_SLOTS


def default_cache_dtype(config: DecoderConfig, slots: int, backend: str) -> jnp.dtype:
    """The KV-cache dtype `generate` uses unless told: float32 on CPU wherever a decode step
    takes the one-token form (at most ONE_TOKEN_MAX_SLOTS slots), else the compute dtype.

    XLA:CPU cannot update a 16-bit buffer in place and hand it to a dot: the bf16 cache is
    written as uint16 bits, and reading those bits as bf16 costs a copy of each layer's keys
    and values on every step (13 % of the bf16 SmolLM2 rollout's op time on a Zen 5 EPYC,
    perf26). A float32 cache is updated in place and read as it is, at twice the memory (for
    SmolLM2-135M at 64 rows, 283 instead of 142 MB over 96 slots, 1.5 instead of 0.75 GB over
    512). Other backends keep the compute dtype: a bitcast is free there and the cache is the
    memory that limits the batch.
    """
    if backend == "cpu" and one_token_form_pays(1, slots, (jnp.float32, jnp.float32)):
        return jnp.dtype(jnp.float32)
    return jnp.dtype(config.matmul_dtype)


def _attend_two_dots(q_btkge: jax.Array, k_bkes: jax.Array, v_bkse: jax.Array, allowed_bts: jax.Array,
                     dtype: Any) -> jax.Array:
    """`attend_cache`'s dot form: q·K and p·V as two dots in `dtype` (float32 accumulation),
    in dot_general's natural output order; returns [B, Hkv, T, G, Dh]."""
    logits = mixed_einsum("btkge,bkes->bktgs", q_btkge, k_bkes, dtype=dtype)
    probs = _attention_probs(logits, allowed_bts[:, None, :, None, :], q_btkge.shape[-1])
    return mixed_einsum("bktgs,bkse->bktge", probs, v_bkse, dtype=dtype)


def _attend_one_token(q_btkge: jax.Array, k_bkes: jax.Array, v_bkse: jax.Array, allowed_bts: jax.Array
                      ) -> jax.Array:
    """Float32 decode-step attention (T = 1) as broadcast multiplies and sums; [B, Hkv, 1, G, Dh].

    With one query per row, each (row, kv head) pair is a [G, Dh] x [Dh, S] product (G query
    heads per kv head: 3 for SmolLM2): B * Hkv tiny matmuls that a dot library runs far
    below its rate. As one multiply-and-reduce fusion per product the compiled SmolLM2 decode
    step's attention took 40 instead of 69 ms for 30 layers at batch 64 on a 2-core AVX2
    EPYC (docs/performance.md at 9f22ea1, "perf20"); over a long cache the dots win again ("perf21"),
    so `attend_cache` asks `one_token_form_pays`. A float32 cache only: with a bf16 cache the
    two dots read it as it is, where this form would widen each layer's cache to float32 on
    every step.
    """
    q_bktge = jnp.transpose(q_btkge, (0, 2, 1, 3, 4))
    e = q_bktge.shape[-1]
    # [B, K, T, G, Dh, 1] * [B, K, 1, 1, Dh, S], summed over Dh.
    logits = jnp.sum(q_bktge[..., None] * k_bkes[:, :, None, None], axis=-2)
    probs = _attention_probs(logits, allowed_bts[:, None, :, None, :], e)
    # [B, K, T, G, S, 1] * [B, K, 1, 1, S, Dh], summed over S.
    return jnp.sum(probs[..., None] * v_bkse[:, :, None, None], axis=-2)


def default_positions(mask_bt: jax.Array) -> jax.Array:
    """Position ids cumsum(mask) − 1 (0 at left padding): real tokens count 0, 1, 2, ..."""
    return jnp.maximum(jnp.cumsum(mask_bt.astype(jnp.int32), axis=1) - 1, 0)


@functools.partial(jax.jit, static_argnames=("config",))
def init_params(key: jax.Array, config: DecoderConfig) -> dict[str, jax.Array]:
    """Fresh parameters as one jitted computation (eager per-shape init compiles ~1 s per shape).

    Matrices ~ normal(0, 0.02) (HF initializer_range), norms 1, biases 0; parameter dtype.
    Keys: `embed`, `lm_head` (untied only), `final_norm`, and `layers.<name>` stacked [L, ...].
    """
    c = config
    dtype = jnp.dtype(c.param_dtype)
    n, d, f, e, v = c.num_layers, c.hidden_size, c.intermediate_size, c.head_dim, c.vocab_size
    h, k = c.num_heads, c.num_kv_heads
    normal_shapes = {"embed": (v, d), "layers.wq": (n, d, h, e), "layers.wk": (n, d, k, e),
                     "layers.wv": (n, d, k, e), "layers.wo": (n, h, e, d), "layers.w_gate": (n, d, f),
                     "layers.w_up": (n, d, f), "layers.w_down": (n, f, d)}
    if not c.tie_word_embeddings:
        normal_shapes["lm_head"] = (d, v)
    # One flat draw split into pieces: a single RNG kernel compiles much faster than one per shape.
    sizes = [math.prod(shape) for shape in normal_shapes.values()]
    flat = _INIT_STD * jax.random.normal(key, (sum(sizes),), jnp.float32)
    offsets = np.cumsum([0] + sizes)
    params = {name: flat[start:start + size].reshape(shape).astype(dtype)
              for (name, shape), start, size in zip(normal_shapes.items(), offsets, sizes)}
    constants = {"final_norm": (1.0, (d,)), "layers.attn_norm": (1.0, (n, d)), "layers.mlp_norm": (1.0, (n, d))}
    if c.attention_bias:
        constants.update({"layers.bq": (0.0, (n, h, e)), "layers.bk": (0.0, (n, k, e)), "layers.bv": (0.0, (n, k, e))})
    if c.attention_out_bias:
        constants["layers.bo"] = (0.0, (n, d))
    if c.qk_norm:
        constants.update({"layers.q_norm": (1.0, (n, e)), "layers.k_norm": (1.0, (n, e))})
    params.update({name: jnp.full(shape, value, dtype) for name, (value, shape) in constants.items()})
    return params


class DecoderLayers(nnx.Module):
    """All transformer blocks' parameters, stacked along a leading layer axis L.

    Low-rank adapters (`jaxrl_vr.models.lora.add_lora`) are `nnx.LoRAParam` attributes named
    by `lora_names`, stacked the same way; `lora_scale` (alpha / r, static) multiplies their
    term, 0.0 without adapters.
    """

    def __init__(self, params: dict[str, jax.Array]):
        for name in LAYER_PARAM_NAMES:
            value = params.get(f"layers.{name}")
            setattr(self, name, None if value is None else nnx.Param(value))
        self.lora_scale = 0.0
        self.grad_sink = None  # a LayerGradSink while an update differentiates (`train.step._accumulate`)

    def stacked(self) -> dict[str, jax.Array]:
        """Present parameters (and adapters) as a dict of [L, ...] arrays (the xs of the layer scan)."""
        return {name: getattr(self, name)[...] for name in LAYER_PARAM_NAMES + LORA_PARAM_NAMES
                if getattr(self, name, None) is not None}

    def unstacked(self) -> list[dict[str, jax.Array]]:
        """Layer l's parameters as their own arrays, for l = 0 .. L-1 (static slices).

        The sampler takes these once per call, outside its decode loop: a layer scan over the
        stacked arrays inside the loop makes XLA:CPU copy every layer's matrices out of the
        stack on every decode step (>= 12 % of a SmolLM2 decode step at batch 64).
        """
        stacked = self.stacked()
        num_layers = next(iter(stacked.values())).shape[0]
        return [{name: value[layer] for name, value in stacked.items()} for layer in range(num_layers)]


def _block(config: DecoderConfig, p: dict[str, jax.Array], x_btd: jax.Array, cos_bte, sin_bte, kv_fn,
           attend_fn=attend, lora_scale: float = 0.0):
    """One pre-norm block; returns (new x, kv_fn's auxiliary output).

    `kv_fn(k_btke, v_btke) -> (keys, values, allowed_bts, aux)` picks the attention context:
    the chunk itself ([B, S, Hkv, Dh], `attend`), or the KV cache after writing the chunk
    (keys [B, Hkv, Dh, S], values [B, Hkv, S, Dh], `attend_cache`; aux = updated cache).
    `attend_fn` must match kv_fn's layout.

    A block matrix W with adapters in `p` (`lora_names`) computes x·W + lora_scale·(x·A)·B on
    the activation path (LoRA, Hu et al. 2021, arXiv 2106.09685): W + A·B is never formed,
    so the backward pass needs no [D_in, D_out] product and, for a frozen W, forms no weight
    gradient of W.

    A block matrix given as a `PackedMatrix` (the samplers' `pack_layer_params`) runs on the
    packed CPU kernel (`packed_dot`): inference only. A float32 one carries its adapters
    merged (W + lora_scale·A·B formed in the sampler's packed copy), and `p` then has none.
    """
    eps = config.rms_norm_eps
    compute = jnp.dtype(config.matmul_dtype)

    def adapter(name):  # (A, B) of block matrix `name`, or None
        a_name, b_name = lora_names(name)
        return (p[a_name], p[b_name]) if a_name in p else None

    def mm(spec, x, w, save="y", lora=None):  # Compute-dtype operands, f32 accumulation, residual dtype out.
        # Where the backward pass keeps mm's own residuals (gate and up; the other matmuls run
        # in `kept_inputs` pieces or `swiglu_down`, which keep their inputs): the float32 weight
        # slice (the scan forwards it; a bf16 copy would be stacked per layer) and, for the
        # normed input both read ("xy"), one float32 array instead of one bf16 copy per matmul:
        # bf16 compute then needs about the activation memory of float32.
        if isinstance(w, PackedMatrix):
            y = packed_dot(x, w).reshape(*x.shape[:-1], -1)
        else:
            y = mixed_einsum(spec, x, w, dtype=compute, save_inputs=save)
        if lora is not None:  # x·A keeps the x that x·W keeps; the [.., r] product is small
            x_sub, _, out_sub = spec.replace("->", ",").split(",")
            xa = mixed_einsum(f"{x_sub},{x_sub[-1]}r->{x_sub[:-1]}r", x, lora[0], dtype=compute, save_inputs="x")
            y = y + lora_scale * mixed_einsum(f"{x_sub[:-1]}r,r{out_sub[-1]}->{out_sub}", xa, lora[1], dtype=compute)
        return y.astype(x_btd.dtype)

    def project(h, w, lora=None):  # [D, heads, Dh] weight with its head axes merged (free reshapes), as wo below
        if isinstance(w, PackedMatrix):
            return mm("btd,df->btf", h, w, lora=lora).reshape(*h.shape[:2], *w.out_dims)
        d, heads, e = w.shape
        return mm("btd,df->btf", h, w.reshape(d, heads * e), "xy", lora).reshape(*h.shape[:2], heads, e)

    # What the backward pass keeps (docs/performance.md, "perf31"): each `kept_inputs` piece
    # keeps only its inputs and recomputes the rest, all elementwise or free: a norm keeps x,
    # not its statistics and intermediates; the projections keep the weights as the scan
    # hands them in, not reshaped copies that the scan would stack per layer. No matmul is
    # recomputed (its output is not needed by the backward pass, so it is dropped there).
    # `swiglu_down` keeps gate, up and their product, not silu(gate), its sigmoid and more.
    norm = kept_inputs(lambda x, w: rms_norm(x, w, eps))
    h_btd = norm(x_btd, p["attn_norm"])
    q, k, v = kept_inputs(lambda h, ws, loras: tuple(project(h, w, lora) for w, lora in zip(ws, loras)))(
        h_btd, (p["wq"], p["wk"], p["wv"]), tuple(adapter(name) for name in ("wq", "wk", "wv")))
    if "bq" in p:
        q, k, v = q + _lead(p["bq"], 4), k + _lead(p["bk"], 4), v + _lead(p["bv"], 4)
    if "q_norm" in p:
        q, k = norm(q, p["q_norm"]), norm(k, p["k_norm"])
    q, k = apply_rope(q, cos_bte, sin_bte), apply_rope(k, cos_bte, sin_bte)
    keys, values, allowed_bts, aux = kv_fn(k, v)
    attn_bthe = attend_fn(q, keys, values, allowed_bts, compute_dtype=compute)
    # Heads merged into one contraction axis on both sides (free reshapes): with (h, e) kept
    # apart, XLA:CPU chose to contract them in (e, h) order and re-transposed wo on every
    # decode step inside the sampler's loop. The q/k/v projections' input gradients had the
    # same problem in the update (a transposed copy of dq and of wq per layer and micro-batch).
    out_btd = kept_inputs(lambda a, w, lora: mm("btf,fd->btd", a.reshape(*a.shape[:2], -1), merged_rows(w),
                                                lora=lora))(attn_bthe, p["wo"], adapter("wo"))
    if "bo" in p:
        out_btd = out_btd + _lead(p["bo"], 3)
    x_btd = x_btd + out_btd
    h_btd = norm(x_btd, p["mlp_norm"])
    gate = mm("btd,df->btf", h_btd, p["w_gate"], "xy", adapter("w_gate"))
    up = mm("btd,df->btf", h_btd, p["w_up"], "xy", adapter("w_up"))
    down_lora = adapter("w_down")
    if isinstance(p["w_down"], PackedMatrix):  # inference: no custom derivative needed
        down = mm("btf,fd->btd", jax.nn.silu(gate) * up, p["w_down"], lora=down_lora)
    elif down_lora is None:
        down = swiglu_down(gate, up, p["w_down"], compute)
    else:
        down = swiglu_down_lora(gate, up, p["w_down"], *down_lora, compute, lora_scale)
    return x_btd + down.astype(x_btd.dtype), aux


def merged_rows(w):
    """wo [heads, Dh, D] as [heads·Dh, D] (a free reshape); a `PackedMatrix` as it is."""
    return w if isinstance(w, PackedMatrix) else w.reshape(-1, w.shape[-1])


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def swiglu_down(gate: jax.Array, up: jax.Array, w_down: jax.Array, dtype: Any) -> jax.Array:
    """The SwiGLU's output projection (silu(gate) ⊙ up) · w_down as `mixed_einsum` runs it,
    float32 out, whose backward pass keeps gate, up and the product p (and w_down) and
    recomputes silu(gate) and its derivative from gate.

    JAX's own backward pass keeps silu(gate), its sigmoid and more: six [B, T, F] arrays per
    layer where this keeps three (with `_block`'s other pieces, the SmolLM2 update's compiled
    temporaries fell from 1.8 to 1.0 GiB; docs/performance.md, "perf31"). p is kept rather
    than recomputed: XLA:CPU fuses a recomputed p into the transposed copy that the weight
    gradient's dot reads, and that fusion ran 9x slower than the plain transpose (6.5
    instead of 0.7 ms per layer and micro-batch).
    """
    return _swiglu_down_fwd(gate, up, w_down, dtype)[0]


def _swiglu_down_fwd(gate, up, w_down, dtype):
    product = jax.nn.silu(gate) * up
    return mixed_einsum("btf,fd->btd", product, w_down, dtype=dtype), (gate, up, product, w_down)


def _swiglu_down_bwd(dtype, residuals, g):
    gate, up, product, w_down = residuals
    # The dot's forward output is unused here and dropped by XLA; only its VJP runs.
    _, dot_vjp = jax.vjp(lambda x, w: mixed_einsum("btf,fd->btd", x, w, dtype=dtype), product, w_down)
    d_product, d_w_down = dot_vjp(g)
    _, product_vjp = jax.vjp(lambda a, b: jax.nn.silu(a) * b, gate, up)
    d_gate, d_up = product_vjp(d_product)
    return d_gate, d_up, d_w_down


swiglu_down.defvjp(_swiglu_down_fwd, _swiglu_down_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def swiglu_down_lora(gate: jax.Array, up: jax.Array, w_down: jax.Array, lora_a: jax.Array, lora_b: jax.Array,
                     dtype: Any, scale: float) -> jax.Array:
    """`swiglu_down` with a low-rank adapter on w_down: p·w_down + scale·(p·A)·B for
    p = silu(gate) ⊙ up, float32 out; the backward pass keeps what `swiglu_down`'s keeps plus
    A, B and the [B, T, r] product p·A. A [F, r], B [r, D]."""
    return _swiglu_down_lora_fwd(gate, up, w_down, lora_a, lora_b, dtype, scale)[0]


def _swiglu_down_lora_fwd(gate, up, w_down, lora_a, lora_b, dtype, scale):
    out, (gate, up, product, w_down) = _swiglu_down_fwd(gate, up, w_down, dtype)
    pa = mixed_einsum("btf,fr->btr", product, lora_a, dtype=dtype)
    out = out + scale * mixed_einsum("btr,rd->btd", pa, lora_b, dtype=dtype)
    return out, (gate, up, product, w_down, lora_a, lora_b, pa)


def _swiglu_down_lora_bwd(dtype, scale, residuals, g):
    gate, up, product, w_down, lora_a, lora_b, pa = residuals
    # Unused outputs (the frozen w_down's gradient, say) are dropped by XLA.
    _, dot_vjp = jax.vjp(lambda x, w: mixed_einsum("btf,fd->btd", x, w, dtype=dtype), product, w_down)
    d_product, d_w_down = dot_vjp(g)
    _, b_vjp = jax.vjp(lambda x, b: scale * mixed_einsum("btr,rd->btd", x, b, dtype=dtype), pa, lora_b)
    d_pa, d_b = b_vjp(g)
    _, a_vjp = jax.vjp(lambda x, a: mixed_einsum("btf,fr->btr", x, a, dtype=dtype), product, lora_a)
    d_product_lora, d_a = a_vjp(d_pa)
    _, product_vjp = jax.vjp(lambda a, b: jax.nn.silu(a) * b, gate, up)
    d_gate, d_up = product_vjp(d_product + d_product_lora)
    return d_gate, d_up, d_w_down, d_a, d_b


swiglu_down_lora.defvjp(_swiglu_down_lora_fwd, _swiglu_down_lora_bwd)


def kept_inputs(fn):
    """`fn` under `jax.checkpoint`: the backward pass keeps its inputs and recomputes the rest.

    For pieces of `_block` and, with `Decoder(remat=True)`, whole layer-scan bodies.
    `prevent_cse=False`: both run inside a layer scan (or, undifferentiated, the decode loop),
    where XLA cannot merge the recomputation with the forward pass.
    """
    return jax.checkpoint(fn, prevent_cse=False)


class LayerGradSink:
    """Where the layer scan's backward pass adds the gradients of the stacked layer parameters.

    ``acc`` maps names of stacked layer parameters to float32 [L, ...] arrays. With a sink
    set on ``DecoderLayers.grad_sink``, the layer scan carries ``acc`` through its forward
    pass unchanged, and its backward pass adds layer l's gradient into slice l of the
    cotangent flowing back to ``acc`` (an in-place update of one carried buffer). The
    caller differentiates with respect to ``acc`` instead of those parameters and seeds the
    cotangent of the returned ``acc`` with the gradient summed so far: the result is that
    sum plus this pass's gradient. A micro-batched update so holds one [L, ...] gradient
    buffer, not the accumulator plus a stacked gradient per micro-batch that a plain
    ``jax.grad`` of the scan forms (1.5 GiB for the 0.4B model's blocks). Gradients of the
    parameters named in ``acc`` reach only the sink.
    """

    def __init__(self, acc: dict[str, jax.Array]):
        self.acc = acc


@jax.custom_vjp
def _through_sink(acc: dict, layer: jax.Array, p: dict) -> tuple[dict, dict]:
    """(acc, p) unchanged; the backward pass adds p's cotangent into slice `layer` of acc's."""
    return acc, p


def _through_sink_fwd(acc, layer, p):
    return (acc, p), layer


def _through_sink_bwd(layer, cotangents):
    acc_ct, p_ct = cotangents

    def add(acc, g):
        layer_slice = jax.lax.dynamic_index_in_dim(acc, layer, keepdims=False)
        return jax.lax.dynamic_update_index_in_dim(acc, layer_slice + g.astype(acc.dtype), layer, 0)

    return {name: add(acc_ct[name], p_ct[name]) for name in acc_ct}, None, None


_through_sink.defvjp(_through_sink_fwd, _through_sink_bwd)


class Decoder(nnx.Module):
    """Decoder-only transformer (Llama / Qwen2 / Qwen3) with a static-shape KV cache.

    Parameters (state paths): `embed` [V, D], `lm_head` [D, V] (None when tied),
    `final_norm` [D], and `layers.<name>` stacked [L, ...] (see `DecoderLayers`):
    wq [L, D, H, Dh], wk/wv [L, D, Hkv, Dh], wo [L, H, Dh, D], w_gate/w_up [L, D, F],
    w_down [L, F, D], norms [L, D] / [L, Dh], biases [L, H|Hkv, Dh] / [L, D].

    Args:
      config: the architecture.
      rngs: parameter initialisation randomness (normal(0, 0.02) matrices, unit norms, zero biases).
      remat: recompute each block in the backward pass (`jax.checkpoint`), trading compute
        for activation memory.
    """

    def __init__(self, config: DecoderConfig, *, rngs: nnx.Rngs, remat: bool = False):
        self.config = config
        self.remat = remat
        params = init_params(rngs.params(), config)
        self.embed = nnx.Param(params["embed"])
        self.layers = DecoderLayers(params)
        self.final_norm = nnx.Param(params["final_norm"])
        self.lm_head = None if config.tie_word_embeddings else nnx.Param(params["lm_head"])

    # ---- public API -------------------------------------------------------------------------

    def __call__(self, tokens_bt: jax.Array, *, positions_bt: jax.Array | None = None,
                 mask_bt: jax.Array | None = None) -> jax.Array:
        """Float32 logits [B, T, V] with causal attention over the real (mask=True) tokens.

        Args:
          tokens_bt: int [B, T] token ids.
          positions_bt: int [B, T] RoPE positions; default cumsum(mask) − 1 (left padding ok).
          mask_bt: bool [B, T], True = real token; default all True. Padded keys are never
            attended to; outputs at padded query positions are finite but meaningless.
        """
        return self.logits(self.hidden_states(tokens_bt, positions_bt=positions_bt, mask_bt=mask_bt))

    def hidden_states(self, tokens_bt: jax.Array, *, positions_bt: jax.Array | None = None,
                      mask_bt: jax.Array | None = None, prefix: PrefixKV | None = None,
                      prefix_mask_bs: jax.Array | None = None) -> jax.Array:
        """Final-normed hidden states [B, T, D] in the compute dtype (see `__call__`).

        The compute dtype is what the LM-head matmul consumes: bf16 hidden states with the
        float32 `unembed_matrix()` make `ratios.token_logprobs_from_hidden` run that matmul
        in bf16 with float32 accumulation.

        With `prefix` (from `prefix_kv`, one row per row of `tokens_bt`), the tokens continue
        those prefixes: every query also attends to the prefix slots where `prefix_mask_bs`
        (bool [B, S]; default all True) is True, ahead of its own causal context, exactly as if prefix ++ tokens
        ran as one sequence (pass the continuing positions in `positions_bt`).
        """
        tokens_bt, positions_bt, mask_bt = self._check_inputs(tokens_bt, positions_bt, mask_bt)
        b, t = tokens_bt.shape
        causal_tt = jnp.tril(jnp.ones((t, t), dtype=bool))
        allowed_bts = causal_tt[None] & mask_bt[:, None, :]
        extra_xs = None
        if prefix is not None:
            s = prefix.keys_lbske.shape[2]
            chex.assert_shape([prefix.keys_lbske, prefix.values_lbske], (self.config.num_layers, b, s, None, None))
            prefix_mask_bs = jnp.ones((b, s), bool) if prefix_mask_bs is None else prefix_mask_bs.astype(bool)
            chex.assert_shape(prefix_mask_bs, (b, s))
            prefix_bts = jnp.broadcast_to(prefix_mask_bs[:, None, :], (b, t, s))
            allowed_bts = jnp.concatenate([prefix_bts, allowed_bts], axis=2)
            extra_xs = (prefix.keys_lbske, prefix.values_lbske)

        def body(x_btd, p, prefix_kv):
            if prefix_kv is None:
                kv_fn = lambda k, v: (k, v, allowed_bts, None)  # noqa: E731
            else:
                prefix_k, prefix_v = prefix_kv

                def kv_fn(k, v):
                    keys = jnp.concatenate([prefix_k.astype(k.dtype), k], axis=1)
                    values = jnp.concatenate([prefix_v.astype(v.dtype), v], axis=1)
                    return keys, values, allowed_bts, None
            return _block(self.config, p, x_btd, cos, sin, kv_fn, lora_scale=self.layers.lora_scale)

        cos, sin = rope_cos_sin(positions_bt, rope_inv_freq(self.config))
        x_btd, _ = self._scan_layers(body, self._embed(tokens_bt), extra_xs)
        hidden_btd = rms_norm(x_btd, self.final_norm[...], self.config.rms_norm_eps)
        return hidden_btd.astype(self.config.matmul_dtype)

    def prefix_kv(self, tokens_bs: jax.Array, *, positions_bs: jax.Array | None = None,
                  mask_bs: jax.Array | None = None) -> PrefixKV:
        """Every layer's keys and values of the prefixes `tokens_bs` (causal, masked as in
        `__call__`), for `hidden_states(prefix=...)` to continue them."""
        tokens_bs, positions_bs, mask_bs = self._check_inputs(tokens_bs, positions_bs, mask_bs)
        s = tokens_bs.shape[1]
        allowed_bss = jnp.tril(jnp.ones((s, s), dtype=bool))[None] & mask_bs[:, None, :]

        def body(x_bsd, p, _):
            return _block(self.config, p, x_bsd, cos, sin, lambda k, v: (k, v, allowed_bss, (k, v)),
                          lora_scale=self.layers.lora_scale)

        cos, sin = rope_cos_sin(positions_bs, rope_inv_freq(self.config))
        _, (keys_lbske, values_lbske) = self._scan_layers(body, self._embed(tokens_bs))
        return PrefixKV(keys_lbske, values_lbske)

    def _scan_layers(self, body, x, extra_xs=None):
        """(x after every layer, stacked aux): `jax.lax.scan` of ``body(x, layer params,
        layer's extra_xs) -> (x, aux)`` over the layers, under `kept_inputs` with `remat`.

        With ``self.layers.grad_sink`` set (`LayerGradSink`), the sink's accumulators ride the
        scan's carry and the backward pass adds each layer's parameter gradients into them.
        """
        if self.remat:
            body = kept_inputs(body)
        stacked = self.layers.stacked()
        sink = self.layers.grad_sink
        if sink is None:
            return jax.lax.scan(lambda x, xs: body(x, *xs), x, (stacked, extra_xs))

        def sunk(carry, xs):
            x, acc = carry
            p, extra, layer = xs
            acc, trained = _through_sink(acc, layer, {name: p[name] for name in acc})
            x, aux = body(x, {**p, **trained}, extra)
            return (x, acc), aux

        layers = jnp.arange(self.config.num_layers, dtype=jnp.int32)
        (x, sink.acc), aux = jax.lax.scan(sunk, (x, sink.acc), (stacked, extra_xs, layers))
        return x, aux

    def unembed_matrix(self) -> jax.Array:
        """[D, V] output projection (embedding transposed when tied), parameter dtype (the
        master weights; consumers cast it to the compute dtype inside their matmul)."""
        if self.lm_head is None:
            return self.embed[...].T
        return self.lm_head[...]

    def logits(self, hidden_btd: jax.Array, unembed: PackedMatrix | None = None) -> jax.Array:
        """hidden [.., D] @ unembed [D, V] in the compute dtype, float32 accumulation and output.

        Uses the inference copy of the tied unembedding when `cast_matmul_weights` made one
        (same values as casting `unembed_matrix()` here, so the same logits), or `unembed`, the
        packed LM head of a decode loop (`packed_unembed`).
        """
        if unembed is not None:
            return packed_dot(hidden_btd, unembed)
        lead_shape = hidden_btd.shape[:-1]
        hidden_nd = hidden_btd.reshape(-1, hidden_btd.shape[-1])
        copy = getattr(self, "unembed_compute", None)
        unembed_dv = self.unembed_matrix() if copy is None else copy[...]
        logits_nv = mixed_einsum("nd,dv->nv", hidden_nd, unembed_dv, dtype=self.config.matmul_dtype)
        return logits_nv.reshape(lead_shape + logits_nv.shape[-1:])

    def init_cache(self, batch: int, max_len: int, dtype: Any = None) -> KVCache:
        """Empty cache: per layer, zero keys [batch, Hkv, Dh, max_len] and values
        [batch, Hkv, max_len, Dh]; no valid slot, index 0. `dtype` defaults to the compute
        dtype (keys and values are cast to it before every attention dot anyway, so a
        narrower cache loses nothing)."""
        c = self.config
        dtype = jnp.dtype(dtype or c.matmul_dtype)
        lead = (batch, c.num_kv_heads)
        return KVCache(
            keys_bkem=tuple(jnp.zeros(lead + (c.head_dim, max_len), dtype) for _ in range(c.num_layers)),
            values_bkme=tuple(jnp.zeros(lead + (max_len, c.head_dim), dtype) for _ in range(c.num_layers)),
            valid_bm=jnp.zeros((batch, max_len), bool),
            index=jnp.zeros((), jnp.int32),
        )

    def decode_step(self, tokens_bt: jax.Array, positions_bt: jax.Array, cache: KVCache, *,
                    mask_bt: jax.Array | None = None, last_only: bool = False,
                    layer_params: Sequence[dict[str, jax.Array]] | None = None,
                    unembed: PackedMatrix | None = None) -> tuple[jax.Array, KVCache]:
        """Runs T new tokens (prefill T > 1 or decode T = 1) against the cache.

        The chunk is written to slots [index, index + T) (the caller keeps index + T <= M);
        slot validity becomes `mask_bt` (default all True). Query t attends to every valid slot
        s <= index + t, so left-padded prompts work. The layers run as an unrolled loop over
        `layer_params` (default `self.layers.unstacked()`; a decode loop should take those
        once, outside the loop, and pass them in; `pack_layer_params` of them, with `unembed` =
        `packed_unembed(model)`, runs the dots on the packed CPU kernel).

        Returns:
          (float32 logits [B, T, V] — or [B, 1, V] for the last position when `last_only` —,
          the updated cache).
        """
        tokens_bt, positions_bt, mask_bt = self._check_inputs(tokens_bt, positions_bt, mask_bt)
        b, t = tokens_bt.shape
        chex.assert_shape(cache.valid_bm, (b, None))
        max_len = cache.valid_bm.shape[1]
        if t > max_len:
            raise ValueError(f"decode_step got {t} tokens but the cache holds only {max_len} slots.")
        layers = self.layers.unstacked() if layer_params is None else layer_params
        if not len(layers) == len(cache.keys_bkem) == self.config.num_layers:
            raise ValueError(f"decode_step got {len(layers)} layers of parameters and a cache of "
                             f"{len(cache.keys_bkem)} layers for a {self.config.num_layers}-layer model.")
        index = cache.index
        valid_bm = jax.lax.dynamic_update_slice(cache.valid_bm, mask_bt, (0, index))
        slots_m = jnp.arange(max_len, dtype=jnp.int32)
        causal_tm = slots_m[None, :] <= index + jnp.arange(t, dtype=jnp.int32)[:, None]
        allowed_btm = causal_tm[None] & valid_bm[:, None, :]
        cos, sin = rope_cos_sin(positions_bt, rope_inv_freq(self.config))

        def write(buffer, chunk, start):
            # A 16-bit cache is updated as uint16 bits (`to_stackable`): XLA:CPU has no bf16
            # dynamic-update-slice and would widen the whole buffer to float32 and back.
            dtype = buffer.dtype
            return from_stackable(jax.lax.dynamic_update_slice(
                to_stackable(buffer), to_stackable(chunk.astype(dtype)), start), dtype)

        x_btd = self._embed(tokens_bt)
        new_keys, new_values = [], []
        for p, keys_bkem, values_bkme in zip(layers, cache.keys_bkem, cache.values_bkme):
            def kv_fn(k_btke, v_btke, keys_bkem=keys_bkem, values_bkme=values_bkme):
                # In place: the decode loop carries the buffers, so the update aliases them.
                keys = write(keys_bkem, jnp.transpose(k_btke, (0, 2, 3, 1)), (0, 0, 0, index))
                values = write(values_bkme, jnp.transpose(v_btke, (0, 2, 1, 3)), (0, 0, index, 0))
                # Returned in the cache dtype: the attention dots cast to the compute dtype.
                return keys, values, allowed_btm, (keys, values)

            x_btd, (keys, values) = _block(self.config, p, x_btd, cos, sin, kv_fn, attend_cache,
                                           lora_scale=self.layers.lora_scale)
            new_keys.append(keys)
            new_values.append(values)
        if last_only:
            x_btd = x_btd[:, -1:]
        hidden_btd = rms_norm(x_btd, self.final_norm[...], self.config.rms_norm_eps)
        new_cache = KVCache(tuple(new_keys), tuple(new_values), valid_bm, (index + t).astype(jnp.int32))
        return self.logits(hidden_btd, unembed), new_cache

    # ---- helpers ----------------------------------------------------------------------------

    def _embed(self, tokens_bt: jax.Array) -> jax.Array:
        return jnp.take(self.embed[...], tokens_bt, axis=0)

    def _check_inputs(self, tokens_bt, positions_bt, mask_bt):
        tokens_bt = jnp.asarray(tokens_bt)
        chex.assert_rank(tokens_bt, 2)
        chex.assert_type(tokens_bt, int)
        if mask_bt is None:
            mask_bt = jnp.ones(tokens_bt.shape, bool)
        mask_bt = jnp.asarray(mask_bt)
        if mask_bt.dtype != jnp.bool_:
            raise TypeError(f"mask_bt must be bool (True = real token), got {mask_bt.dtype}.")
        chex.assert_equal_shape([tokens_bt, mask_bt])
        if positions_bt is None:
            positions_bt = default_positions(mask_bt)
        positions_bt = jnp.asarray(positions_bt)
        chex.assert_equal_shape([tokens_bt, positions_bt])
        chex.assert_type(positions_bt, int)
        return tokens_bt, positions_bt, mask_bt


def set_compute_dtype(model: Decoder, compute_dtype: str | None) -> Decoder:
    """Sets the matmul precision policy of `model` in place and returns it.

    compute_dtype "bfloat16" with float32 parameters is mixed precision (bf16 operands,
    float32 accumulation, float32 master weights and gradients); "float32" computes in
    float32 (bf16 parameters are then upcast at each matmul); None follows `param_dtype`
    (the default). Parameters are untouched; only the static config changes, so
    `nnx.split(model)` afterwards yields a graphdef that compiles the new policy.

    bfloat16 on a CPU backend whose CPU has no bf16 dot units (an AVX2-only x86, say) warns
    that float32 is faster there (`jaxrl_vr.host_cpu.mixed_precision_advice`).
    """
    if compute_dtype is not None and compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype={compute_dtype!r}; expected one of {COMPUTE_DTYPES} or None.")
    advice = host_cpu.mixed_precision_advice(compute_dtype, backend=jax.default_backend(),
                                             cpuinfo=host_cpu.read_cpuinfo())
    if advice:
        warnings.warn(advice, RuntimeWarning, stacklevel=2)
    model.config = model.config.replace(compute_dtype=compute_dtype)
    return model


class ComputeCopy(nnx.Variable):
    """A compute-dtype copy of a parameter made for inference (`cast_matmul_weights`); not trained."""


def cast_matmul_weights(model: Decoder, *, layers: bool = True) -> Decoder:
    """Casts the matmul-only weights of `model` to its compute dtype; returns `model`.

    For inference under mixed precision (the sampler calls it on its merged copy inside
    jit): every decode step would otherwise re-read the float32 master matrices and convert
    them to bf16 again. Cast: the stacked block matrices, their LoRA adapters (if any) and
    an untied `lm_head`. A tied embedding is also the float32 lookup table of the residual
    stream, so it stays as it is and the LM head gets a separate [D, V] copy in the compute
    dtype (`model.unembed_compute`, used by `Decoder.logits`). That copy is materialised in the
    [D, V] layout on purpose: reading the [V, D] table transposed inside the dot gives a
    bf16 dot whose rhs contracts its last dimension, which XLA:CPU does not run on its bf16
    (YNNPACK) path; it upcast the table to float32 once and ran every decode step's
    [B, D] x [D, V] LM head as a float32 dot instead.

    The numerics are unchanged (`mixed_einsum` casts to the same dtype); norms, biases and
    the embedding table keep the parameter dtype. A no-op when the compute dtype is the
    parameter dtype. Do not differentiate through it: the gradients of the cast matrices
    would be bf16. `layers=False` casts only the LM head, for a caller that casts its own
    per-layer copies (`unstacked_matmul_weights`).

    Each cast weight is a new Variable set on `model`; the Variable it replaces is left as it
    was. `nnx.merge` hands a merged module the very Variables of the State it merges, so
    setting their values instead would cast the caller's State too: outside jit (the
    compacting sampler prepares its model once per rollout) the trainer's float32 master
    weights became bf16 after the first rollout, and Adam then updated bf16 weights.
    """
    dtype = jnp.dtype(model.config.matmul_dtype)

    def cast(owner, name):
        param = getattr(owner, name, None)
        if param is not None and param[...].dtype != dtype:
            setattr(owner, name, param.replace(param[...].astype(dtype)))

    for name in (MATMUL_WEIGHT_NAMES + LORA_PARAM_NAMES) if layers else ():
        cast(model.layers, name)
    if model.lm_head is not None:
        cast(model, "lm_head")
    elif model.embed[...].dtype != dtype:
        # The barrier keeps XLA from folding the transpose back into the LM-head dot.
        model.unembed_compute = ComputeCopy(jax.lax.optimization_barrier(model.embed[...].astype(dtype).T))
    return model


def unstacked_matmul_weights(layers: DecoderLayers, dtype: Any) -> list[dict[str, jax.Array]]:
    """`layers.unstacked()` with the block matrices and adapters in `dtype`: each layer's
    parameters as their own arrays, the decode loop's `layer_params`, cast once. Made from the
    stacked parameters directly, so no cast stacked copy is alive beside them."""
    names = set(MATMUL_WEIGHT_NAMES + LORA_PARAM_NAMES)
    return [{name: value.astype(dtype) if name in names else value for name, value in layer.items()}
            for layer in layers.unstacked()]


def pack_layer_params(layer_params: Sequence[dict[str, jax.Array]], lora_scale: float = 0.0) -> list[dict[str, Any]]:
    """A decode loop's per-layer parameters with every packable block matrix (`packable`:
    float32 or bf16 in the compute dtype, output width a multiple of the panel width) as a
    `PackedMatrix` for the packed CPU kernels; the rest unchanged. Made from the per-layer
    copies, which a sampler then drops: no more memory than they took.

    A packable float32 matrix with adapters (`lora_names`) is packed as W + lora_scale·A·B,
    and its adapters leave the layer: the packed copy is the sampler's second copy of the base
    either way, so the merge costs no memory, and each decode step skips the adapters' two
    small dots per matrix (14 a layer). A matrix left unpacked keeps its adapters on the
    activation path, and so does a bf16 one: a bf16 sum would round most of a small adapter
    update away (`merge_lora`)."""
    def packed_layer(layer):
        out = dict(layer)
        for name in MATMUL_WEIGHT_NAMES:
            if name not in layer:
                continue
            w = layer[name]
            w_in_out = w.reshape(-1, w.shape[-1]) if name == "wo" else w  # wo's head axes are its input
            if not packable(w_in_out):
                continue
            a_name, b_name = lora_names(name)
            if a_name in layer and w_in_out.dtype == jnp.float32:
                delta = jnp.einsum("ir,ro->io", out.pop(a_name), out.pop(b_name), precision=jax.lax.Precision.HIGHEST)
                w_in_out = w_in_out + lora_scale * delta.reshape(w_in_out.shape)
            out[name] = pack(w_in_out, w_in_out.shape[1:])
        return out

    return [packed_layer(layer) for layer in layer_params]


def packed_unembed(model: Decoder) -> PackedMatrix | None:
    """The LM head [D, V] in the compute dtype, packed for `Decoder.logits` (from the copy
    that `cast_matmul_weights` made, `lm_head` or the tied embedding's [V, D] table), or None
    where it is not `packable`."""
    copy = getattr(model, "unembed_compute", None)
    if copy is not None:
        return pack(copy[...]) if packable(copy[...]) else None
    dtype = jnp.dtype(model.config.matmul_dtype)
    if model.lm_head is not None:
        head = model.lm_head[...].astype(dtype)
        return pack(head) if packable(head) else None
    table = model.embed[...].astype(dtype)
    return pack_transposed(table) if packable(table.T) else None


def num_params(model: Decoder) -> int:
    """Total number of parameters."""
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
