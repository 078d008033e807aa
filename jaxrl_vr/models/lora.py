"""Low-rank adapters (LoRA) on a Decoder's block matrices: add, merge, switch off.

LoRA (Hu et al. 2021, arXiv 2106.09685) freezes a weight W [D_in, D_out] and trains
y = x·W + (alpha / r)·(x·A)·B with A [D_in, r], B [r, D_out]. Here A and B are stacked over
the layers like the block matrices they adapt (`nnx.LoRAParam`, A [L, D_in, r] and
B [L, r, D_out]; the head axes merged: wq/wk/wv's output, wo's input), and `_block` applies
them on the activation path, never forming W + A·B; the one exception is the float32
packed-dot sampler, whose per-rollout packed copy of the base (its second copy either way)
is packed as W + (alpha / r)·A·B (`decoder.pack_layer_params`). Initialisation as PEFT's default: A ~
U(−1/√D_in, 1/√D_in) (kaiming-uniform with a = √5), B = 0, so the adapted model starts as the
base exactly.

The trainer (`jaxrl_vr.train.step.split_model`) trains only the adapters when a model has
them: the base weights are frozen state that is never differentiated, the optimizer state
and checkpoints hold the adapters alone, and the reference policy is the same model with
the adapters zeroed (`lora_off`), with no second copy of the base.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_vr.models.decoder import MATMUL_WEIGHT_NAMES, Decoder, lora_names

__all__ = ["LORA_TARGETS", "add_lora", "has_lora", "lora_off", "lora_targets", "merge_lora"]

LORA_TARGETS = MATMUL_WEIGHT_NAMES
"""Block matrices that can carry adapters: wq wk wv wo w_gate w_up w_down."""

# How many leading axes (after L) of each stacked matrix are its input: wo [L, H, Dh, D] reads
# the merged heads; every other matrix reads its axis 1 (wq [L, D, H, Dh], w_up [L, D, F], ...).
_INPUT_AXES = {"wo": 2}


def _in_out(weight: jax.Array, target: str) -> tuple[int, int]:
    """(D_in, D_out) of a stacked block matrix with its head axes merged."""
    split = 1 + _INPUT_AXES.get(target, 1)
    return math.prod(weight.shape[1:split]), math.prod(weight.shape[split:])


def lora_targets(model: Decoder) -> tuple[str, ...]:
    """The block matrices of `model` that carry adapters (empty without LoRA)."""
    return tuple(t for t in LORA_TARGETS if getattr(model.layers, lora_names(t)[0], None) is not None)


def has_lora(model: nnx.Module) -> bool:
    """Whether `model` holds any `nnx.LoRAParam`."""
    return len(jax.tree.leaves(nnx.state(model, nnx.LoRAParam))) > 0


def add_lora(model: Decoder, *, rank: int, alpha: float, key: jax.Array,
             targets: Sequence[str] = LORA_TARGETS, base_dtype: str | None = None) -> Decoder:
    """Adds float32 adapters of rank `rank` to `targets` of `model`, in place; returns it.

    Args:
      model: a Decoder without adapters (its weights become the frozen base).
      rank: r >= 1.
      alpha: the adapters' term is scaled by alpha / r.
      key: draws A (B starts at zero, so the model computes the base exactly).
      targets: names among LORA_TARGETS.
      base_dtype: "bfloat16" stores every base parameter in bf16 (and sets the config's
        param_dtype, so matmuls follow in bf16 unless a compute dtype is set); None keeps it.
        The adapters stay float32 either way.
    """
    targets = tuple(targets)
    unknown = sorted(set(targets) - set(LORA_TARGETS))
    if unknown or not targets:
        raise ValueError(f"LoRA targets {list(targets)}: expected a non-empty subset of {list(LORA_TARGETS)}.")
    if rank < 1:
        raise ValueError(f"LoRA rank={rank} must be >= 1 (leave the adapters out for none).")
    if has_lora(model):
        raise ValueError(f"the model already has adapters on {list(lora_targets(model))}; merge them "
                         "first (merge_lora) to stack a second set.")
    if base_dtype is not None:
        dtype = jnp.dtype(base_dtype)
        for _, variable in nnx.iter_graph(model):
            if isinstance(variable, nnx.Param) and variable[...].dtype != dtype:
                variable.set_value(variable[...].astype(dtype))
        model.config = model.config.replace(param_dtype=base_dtype)
    keys = jax.random.split(key, len(targets))
    for target, target_key in zip(targets, keys):
        weight = getattr(model.layers, target)[...]
        d_in, d_out = _in_out(weight, target)
        bound = 1.0 / d_in ** 0.5
        a_name, b_name = lora_names(target)
        setattr(model.layers, a_name, nnx.LoRAParam(jax.random.uniform(
            target_key, (weight.shape[0], d_in, rank), jnp.float32, -bound, bound)))
        setattr(model.layers, b_name, nnx.LoRAParam(jnp.zeros((weight.shape[0], rank, d_out), jnp.float32)))
    model.layers.lora_scale = float(alpha) / rank
    return model


def merge_lora(model: Decoder, *, param_dtype: str | None = None) -> Decoder:
    """A Decoder with plain weights W + (alpha / r)·A·B and no adapters (`model` is unchanged).

    The sum is formed in float32 and stored in `param_dtype` ("float32" or "bfloat16"; None =
    the model's param dtype, in which every other parameter is then stored as well). Merging
    into a bf16 base rounds most of a small update away: an export merges into float32. Only
    the merged matrices are new arrays; the others are shared with `model`.
    """
    merged = nnx.clone(model)
    dtype = jnp.dtype(param_dtype or model.config.param_dtype)
    scale = merged.layers.lora_scale
    for target in lora_targets(merged):
        a_name, b_name = lora_names(target)
        weight = getattr(merged.layers, target)
        a_lir, b_lro = getattr(merged.layers, a_name)[...], getattr(merged.layers, b_name)[...]
        delta_lio = scale * jnp.einsum("lir,lro->lio", a_lir.astype(jnp.float32), b_lro.astype(jnp.float32),
                                       precision=jax.lax.Precision.HIGHEST)
        weight.set_value((weight[...].astype(jnp.float32) + delta_lio.reshape(weight.shape)).astype(dtype))
        delattr(merged.layers, a_name)
        delattr(merged.layers, b_name)
    merged.layers.lora_scale = 0.0
    if param_dtype is not None:
        for _, variable in nnx.iter_graph(merged):
            if isinstance(variable, nnx.Param) and variable[...].dtype != dtype:
                variable.set_value(variable[...].astype(dtype))
        merged.config = merged.config.replace(param_dtype=param_dtype)
    return merged


def lora_off(adapters):
    """The adapters' state (`nnx.state(model, nnx.LoRAParam)`, or the trainer's params) with
    every array zeroed: merged with the same graphdef and base it computes the base model
    exactly (x·W + scale·(x·0)·0 = x·W), so the reference policy needs no second base."""
    return jax.tree.map(jnp.zeros_like, adapters)
