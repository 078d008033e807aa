"""perf31's A/B: the layer block as before (A: JAX's own residuals, as at 2e325d7) against
`_block` with `kept_inputs` pieces and `softmax_keeping_output` (B, what the decoder runs now)."""
import math

import jax
import jax.numpy as jnp

from jaxrl_vr.models import decoder
from jaxrl_vr.models.decoder import _lead, apply_rope, attend, mixed_einsum, rms_norm

_block, _attention_probs = decoder._block, decoder._attention_probs


def _block_before(config, p, x_btd, cos_bte, sin_bte, kv_fn, attend_fn=attend):
    """One pre-norm block; returns (new x, kv_fn's auxiliary output).

    `kv_fn(k_btke, v_btke) -> (keys, values, allowed_bts, aux)` picks the attention context:
    the chunk itself ([B, S, Hkv, Dh], `attend`), or the KV cache after writing the chunk
    (keys [B, Hkv, Dh, S], values [B, Hkv, S, Dh], `attend_cache`; aux = updated cache).
    `attend_fn` must match kv_fn's layout.
    """
    eps = config.rms_norm_eps
    compute = jnp.dtype(config.matmul_dtype)

    def mm(spec, x, w, save="y"):  # Compute-dtype operands, f32 accumulation, residual dtype out.
        # The backward pass keeps the float32 weight slice (the scan forwards it; a bf16 copy
        # would be stacked per layer) and, for the normed input shared by q/k/v and by
        # gate/up ("xy"), one float32 array instead of one bf16 copy per matmul: bf16 compute
        # then needs about the activation memory of float32 (SmolLM2 update: -0.6 GB).
        return mixed_einsum(spec, x, w, dtype=compute, save_inputs=save).astype(x_btd.dtype)

    def project(h, w):  # [D, heads, Dh] weight with its head axes merged (free reshapes), as wo below
        d, heads, e = w.shape
        return mm("btd,df->btf", h, w.reshape(d, heads * e), "xy").reshape(*h.shape[:2], heads, e)

    h_btd = rms_norm(x_btd, p["attn_norm"], eps)
    q, k, v = project(h_btd, p["wq"]), project(h_btd, p["wk"]), project(h_btd, p["wv"])
    if "bq" in p:
        q, k, v = q + _lead(p["bq"], 4), k + _lead(p["bk"], 4), v + _lead(p["bv"], 4)
    if "q_norm" in p:
        q, k = rms_norm(q, p["q_norm"], eps), rms_norm(k, p["k_norm"], eps)
    q, k = apply_rope(q, cos_bte, sin_bte), apply_rope(k, cos_bte, sin_bte)
    keys, values, allowed_bts, aux = kv_fn(k, v)
    attn_bthe = attend_fn(q, keys, values, allowed_bts, compute_dtype=compute)
    # Heads merged into one contraction axis on both sides (free reshapes): with (h, e) kept
    # apart, XLA:CPU chose to contract them in (e, h) order and re-transposed wo on every
    # decode step inside the sampler's loop. The q/k/v projections' input gradients had the
    # same problem in the update (a transposed copy of dq and of wq per layer and micro-batch).
    b, t, h, e = attn_bthe.shape
    out_btd = mm("btf,fd->btd", attn_bthe.reshape(b, t, h * e), p["wo"].reshape(h * e, -1))
    if "bo" in p:
        out_btd = out_btd + _lead(p["bo"], 3)
    x_btd = x_btd + out_btd
    h_btd = rms_norm(x_btd, p["mlp_norm"], eps)
    gate = mm("btd,df->btf", h_btd, p["w_gate"], "xy")
    up = mm("btd,df->btf", h_btd, p["w_up"], "xy")
    return x_btd + mm("btf,fd->btd", jax.nn.silu(gate) * up, p["w_down"]), aux


def _attention_probs_before(logits: jax.Array, allowed: jax.Array, head_dim: int) -> jax.Array:
    """Float32 softmax over the last (key) axis of logits/√Dh, with finfo.min where `allowed`
    (broadcast against logits) is False: every attention form's weights, whatever its layout."""
    logits = jnp.where(allowed, logits * (1.0 / math.sqrt(head_dim)), jnp.finfo(jnp.float32).min)
    return jax.nn.softmax(logits, axis=-1)


def A():
    decoder._block, decoder._attention_probs = _block_before, _attention_probs_before


def B():
    decoder._block, decoder._attention_probs = _block, _attention_probs
