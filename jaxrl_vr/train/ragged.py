"""Trimming a batch's response axis to its longest response, host-side, before the jit.

A rollout's response buffer holds `max_new_tokens` columns; with a stop token most rows end
much earlier (512-token buffers, 60-token answers). The update and the log-prob pass run
the model over every column they are given, so `trim_response` cuts the columns after the
batch's last real token, keeping a width rounded up to a multiple of TRIM_MULTIPLE (so the
jitted update compiles once per bucket of widths, at most T / TRIM_MULTIPLE of them).

Exact: every loss term, token count and per-row statistic reads only masked columns, and
the columns cut are masked in every row. The one exception is Dr.GRPO's normaliser
(`seq_mean_token_sum_norm`) with ``LossConfig.max_len`` None, which is the array's width T:
`width_is_read` says so, and the trainer then leaves the batch as it is.
"""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
import numpy as np

from jaxrl_vr.train.step import LossConfig, RolloutBatch

__all__ = ["TRIM_MULTIPLE", "trim_response", "trimmed_logprob_fn", "trimmed_train_step", "trimmed_width",
           "width_is_read"]

TRIM_MULTIPLE = 64
"""Trimmed widths are multiples of this (or the full width): buffers of <= 64 columns are
never cut, so short rollouts keep their one compiled update."""


def trimmed_width(mask_bt, *, multiple: int = TRIM_MULTIPLE) -> int:
    """The columns to keep: the last column any row uses, rounded up to `multiple`, at most
    T (at least 1, so a batch without a token keeps one column).

    Args:
      mask_bt: bool [B, T] the tokens that exist (host or device array; read on the host).
      multiple: the width bucket.
    """
    mask_bt = np.asarray(mask_bt)
    if mask_bt.ndim != 2:
        raise ValueError(f"mask_bt must be [B, T], got shape {mask_bt.shape}.")
    if multiple < 1:
        raise ValueError(f"multiple={multiple} must be >= 1.")
    used_t = np.flatnonzero(mask_bt.any(axis=0))
    last = int(used_t[-1]) + 1 if used_t.size else 1
    return min(mask_bt.shape[1], -(-last // multiple) * multiple)


def width_is_read(cfg: LossConfig) -> bool:
    """True when the loss reads the response axis' width: Dr.GRPO (`seq_mean_token_sum_norm`,
    policy or KL term) without ``max_len``, which then divides by T
    (``LossConfig.reads_response_width``)."""
    return cfg.reads_response_width


def trim_response(batch: RolloutBatch, *, multiple: int = TRIM_MULTIPLE) -> RolloutBatch:
    """`batch` with its [B, T] fields cut to `trimmed_width` of the tokens that exist (mask_bt
    or loss_mask_bt); the same batch when nothing would be cut."""
    width = trimmed_width(np.asarray(batch.mask_bt) | np.asarray(batch.loss_mask_bt), multiple=multiple)
    if width == batch.tokens_bt.shape[1]:
        return batch
    return batch._replace(**{name: getattr(batch, name)[:, :width]
                             for name in RolloutBatch._fields if name.endswith("_bt")})


def trimmed_train_step(jitted: Callable, cfg: LossConfig, *, multiple: int = TRIM_MULTIPLE) -> Callable:
    """``(state, batch, hyper, rest) -> jitted(state, trim_response(batch), hyper, rest)``;
    `jitted` itself when the loss reads the width (`width_is_read`). The result keeps `jitted`
    as its ``.jitted``."""
    if width_is_read(cfg):
        return jitted

    def train_step(state, batch: RolloutBatch, hyper, rest):
        return jitted(state, trim_response(batch, multiple=multiple), hyper, rest)

    train_step.jitted = jitted
    return train_step


def trimmed_logprob_fn(jitted: Callable, *, multiple: int = TRIM_MULTIPLE) -> Callable:
    """A log-prob function ``(params, rest, prompt_tokens_bs, prompt_mask_bs, tokens_bt,
    mask_bt, temperature) -> (logp_bt, entropy_bt)`` run on the columns up to
    `trimmed_width(mask_bt)`; the columns cut come back as zeros (they are masked)."""

    def logprobs(params, rest, prompt_tokens_bs, prompt_mask_bs, tokens_bt, mask_bt, temperature=1.0):
        full = tokens_bt.shape[1]
        width = trimmed_width(mask_bt, multiple=multiple)
        if width == full:
            return jitted(params, rest, prompt_tokens_bs, prompt_mask_bs, tokens_bt, mask_bt, temperature)
        outputs = jitted(params, rest, prompt_tokens_bs, prompt_mask_bs, tokens_bt[:, :width], mask_bt[:, :width],
                         temperature)
        return tuple(jnp.pad(x, ((0, 0), (0, full - width))) for x in outputs)

    logprobs.jitted = jitted
    return logprobs
