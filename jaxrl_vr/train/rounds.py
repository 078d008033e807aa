"""One generation round as a typed value, the round sampler, and the plain batch strategy.

A *round* is P prompts × G samples: sampled by the policy, decoded, scored by the verifiers
and shaped into rewards. Everything downstream (batch strategies, the tracker, the batch
builder, metrics) consumes a ``Round``; ``valid_pg`` is its only padding marker.

Batch strategies share one signature, ``strategy(sample_round, next_prompts) -> Round``:

* ``sample_round(prompt_idx, num_samples) -> Round`` samples and scores the given prompts;
* ``next_prompts(num) -> prompt_idx`` draws the next prompts of the prompt source.

They are plain functions over these two callables (``plain_batch`` here, ``dynamic_batch``
in ``jaxrl_vr.selection.dynamic``, ``two_stage_batch`` in ``jaxrl_vr.selection.two_stage``),
so each is tested on scripted reward streams with no model.
"""

from __future__ import annotations

import time
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np


class Round(NamedTuple):
    """Host (numpy) arrays of one round of P prompts × G samples, B = P·G, prompt-major.

    Attributes:
      prompt_idx_p: int64 [P] indices into the training items.
      prompt_tokens_ps: int32 [P, S] left-padded prompt tokens.
      prompt_mask_ps: bool [P, S].
      tokens_bt: int32 [B, T] response tokens.
      mask_bt: bool [B, T] response tokens that count (incl. the stop token); all False
        in invalid rows.
      sampler_logp_bt: float32 [B, T] log-probs from the sampler (logged only).
      length_b: int32 [B] response lengths (0 in invalid rows).
      truncated_b: bool [B] hit the length cap without a stop token.
      scores_b: float32 [B] verifier scores (success in [0, 1]); 0 in invalid rows.
      rewards_b: float32 [B] shaped rewards (scores − penalties); 0 in invalid rows.
      valid_pg: bool [P, G] real samples (ragged groups and padding groups are False).
      stats: scalar metrics of the round (``generated_tokens``, verifier counts, timings,
        strategy-specific keys); not a pytree leaf set of arrays.
    """

    prompt_idx_p: np.ndarray
    prompt_tokens_ps: np.ndarray
    prompt_mask_ps: np.ndarray
    tokens_bt: np.ndarray
    mask_bt: np.ndarray
    sampler_logp_bt: np.ndarray
    length_b: np.ndarray
    truncated_b: np.ndarray
    scores_b: np.ndarray
    rewards_b: np.ndarray
    valid_pg: np.ndarray
    stats: dict

    @property
    def num_prompts(self) -> int:
        return int(self.prompt_idx_p.shape[0])

    @property
    def group_size(self) -> int:
        return int(self.valid_pg.shape[1])


# Per-response fields zeroed where a sample is invalid.
_ZEROED_WHEN_INVALID = ("mask_bt", "sampler_logp_bt", "length_b", "truncated_b", "scores_b",
                        "rewards_b")
_PER_RESPONSE = ("tokens_bt",) + _ZEROED_WHEN_INVALID
_PER_PROMPT = ("prompt_idx_p", "prompt_tokens_ps", "prompt_mask_ps")


def add_stats(totals: dict, stats: dict) -> dict:
    """Sums two stats dicts key by key (counters and timings add across rounds)."""
    out = dict(totals)
    for name, value in stats.items():
        out[name] = out.get(name, 0.0) + float(value)
    return out


def widen(round_: Round, group_size: int) -> Round:
    """Pads every group to ``group_size`` samples with invalid rows (copies of sample 0
    with zeroed mask, scores and rewards), so rounds of different G can be joined."""
    num_p, num_g = round_.num_prompts, round_.group_size
    if group_size == num_g:
        return round_
    if group_size < num_g:
        raise ValueError(f"cannot widen a round of G={num_g} to {group_size}.")
    extra = group_size - num_g
    fields = {}
    for name in _PER_RESPONSE:
        value = getattr(round_, name)
        value_pg = value.reshape((num_p, num_g) + value.shape[1:])
        pad = np.repeat(value_pg[:, :1], extra, axis=1)
        if name in _ZEROED_WHEN_INVALID:
            pad = np.zeros_like(pad)
        fields[name] = np.concatenate([value_pg, pad], axis=1).reshape(
            (num_p * group_size,) + value.shape[1:])
    valid_pg = np.concatenate([round_.valid_pg, np.zeros((num_p, extra), bool)], axis=1)
    return round_._replace(valid_pg=valid_pg, **fields)


def place_samples(base: Round, extra: Round, rows_p: np.ndarray, start: int) -> Round:
    """``base`` with ``extra``'s samples written into groups ``rows_p`` from sample ``start``.

    ``extra`` holds len(rows_p) groups of G' samples of the same prompts (in order); they
    fill columns [start, start + G') of those groups and become valid there.
    """
    rows_p = np.asarray(rows_p, np.int64)
    if extra.num_prompts != rows_p.shape[0]:
        raise ValueError(f"{extra.num_prompts} extra groups for {rows_p.shape[0]} target rows.")
    num_p, num_g, g_extra = base.num_prompts, base.group_size, extra.group_size
    if start + g_extra > num_g:
        raise ValueError(f"samples [{start}, {start + g_extra}) do not fit groups of {num_g}.")
    fields = {}
    for name in _PER_RESPONSE:
        value = getattr(base, name).copy()
        value_pg = value.reshape((num_p, num_g) + value.shape[1:])
        ext = getattr(extra, name)
        value_pg[rows_p, start:start + g_extra] = ext.reshape((-1, g_extra) + ext.shape[1:])
        fields[name] = value_pg.reshape(value.shape)
    valid_pg = base.valid_pg.copy()
    valid_pg[rows_p, start:start + g_extra] = extra.valid_pg
    return base._replace(valid_pg=valid_pg, stats=add_stats(base.stats, extra.stats), **fields)


def select_groups(round_: Round, keep_p: np.ndarray) -> Round:
    """The round restricted to groups ``keep_p`` (bool [P] or int indices)."""
    keep = np.asarray(keep_p)
    num_p, num_g = round_.num_prompts, round_.group_size
    fields = {name: getattr(round_, name)[keep] for name in _PER_PROMPT}
    for name in _PER_RESPONSE:
        value = getattr(round_, name)
        fields[name] = value.reshape((num_p, num_g) + value.shape[1:])[keep].reshape(
            (-1,) + value.shape[1:])
    return round_._replace(valid_pg=round_.valid_pg[keep], **fields)


def concat_groups(rounds: Sequence[Round], stats: dict | None = None) -> Round:
    """Groups of several rounds (same G, S, T) stacked in order; stats summed unless given."""
    first = rounds[0]
    fields = {name: np.concatenate([getattr(r, name) for r in rounds])
              for name in Round._fields if name != "stats"}
    if stats is None:
        stats = {}
        for r in rounds:
            stats = add_stats(stats, r.stats)
    return first._replace(stats=stats, **fields)


def pad_groups(round_: Round, num_prompts: int) -> Round:
    """Pads to ``num_prompts`` groups with invalid copies of group 0 (a real prompt, so the
    model call stays well defined; every sample of a padding group is invalid)."""
    missing = num_prompts - round_.num_prompts
    if missing <= 0:
        return round_
    filler = select_groups(round_, np.zeros(missing, np.int64))
    filler = filler._replace(
        valid_pg=np.zeros_like(filler.valid_pg),
        **{name: np.zeros_like(getattr(filler, name)) for name in _ZEROED_WHEN_INVALID},
    )
    return concat_groups([round_, filler], stats=round_.stats)


def invalidate(round_: Round, valid_pg: np.ndarray) -> Round:
    """The round with ``valid_pg`` as its validity, per-response fields zeroed where invalid."""
    valid_b = np.asarray(valid_pg, bool).reshape(-1)
    fields = {}
    for name in _ZEROED_WHEN_INVALID:
        value = getattr(round_, name)
        keep = valid_b.reshape((-1,) + (1,) * (value.ndim - 1))
        fields[name] = np.where(keep, value, np.zeros((), value.dtype))
    return round_._replace(valid_pg=np.asarray(valid_pg, bool), **fields)


# ---------------------------------------------------------------------------- sample_round


def make_sample_round(
    *,
    generate: Callable[[np.ndarray, np.ndarray, int], Any],
    encode: Callable[[Sequence[int]], tuple[np.ndarray, np.ndarray]],
    score: Callable[..., tuple[np.ndarray, Any, dict]],
    shape_rewards: Callable[..., tuple[np.ndarray, dict]],
    min_prompts: int,
    observe: Callable[[Round], None] | None = None,
) -> Callable[[np.ndarray, int], Round]:
    """Builds ``sample_round(prompt_idx, num_samples) -> Round`` from the host steps.

    Args:
      generate: ``(prompt_tokens_ps, prompt_mask_ps, num_samples) -> rollout`` with fields
        tokens_bt, mask_bt, logp_bt, length_b, truncated_b (the sampler; it draws its own key).
      encode: ``prompt_idx -> (prompt_tokens_ps, prompt_mask_ps)`` at the fixed width.
      score: ``(prompt_idx_b, tokens_bt, mask_bt, truncated_b) -> (scores_b, hack_b, stats)``
        (``jaxrl_vr.train.rollout.make_round_scorer``).
      shape_rewards: ``(scores_b, length_b, hack_b) -> (rewards_b, stats)`` (penalties
        added; ``jaxrl_vr.train.rollout.make_reward_shaper``).
      min_prompts: a round with fewer prompts is padded (by repeating its last prompt) to
        ``min(min_prompts, next power of two)`` rows for the sampler, so partial rounds
        compile for O(log P) shapes; padding rows never reach scoring or the budget.
      observe: called with every round sampled (the tracker sees all of them).
    """

    def sample_round(prompt_idx: np.ndarray, num_samples: int) -> Round:
        idx = np.asarray(prompt_idx, np.int64).reshape(-1)
        num_real, num_g = idx.shape[0], int(num_samples)
        num_rows = min(max(min_prompts, num_real), 1 << max(num_real - 1, 0).bit_length())
        rows = np.concatenate([idx, np.repeat(idx[-1:], num_rows - num_real)])
        prompt_tokens_ps, prompt_mask_ps = encode(rows)
        t0 = time.perf_counter()
        rollout = generate(prompt_tokens_ps, prompt_mask_ps, num_g)
        real = num_real * num_g
        tokens_bt = np.asarray(rollout.tokens_bt)[:real]
        mask_bt = np.asarray(rollout.mask_bt, bool)[:real]
        length_b = np.asarray(rollout.length_b)[:real].astype(np.int32)
        truncated_b = np.asarray(rollout.truncated_b, bool)[:real]
        t1 = time.perf_counter()
        scores_b, hack_b, verifier_stats = score(np.repeat(idx, num_g), tokens_bt, mask_bt,
                                                 truncated_b)
        scores_b = np.asarray(scores_b, np.float32)
        rewards_b, reward_stats = shape_rewards(scores_b, length_b, hack_b)
        t2 = time.perf_counter()
        round_ = Round(
            prompt_idx_p=idx,
            prompt_tokens_ps=prompt_tokens_ps[:num_real],
            prompt_mask_ps=prompt_mask_ps[:num_real],
            tokens_bt=tokens_bt,
            mask_bt=mask_bt,
            sampler_logp_bt=np.asarray(rollout.logp_bt, np.float32)[:real],
            length_b=length_b,
            truncated_b=truncated_b,
            scores_b=scores_b,
            rewards_b=np.asarray(rewards_b, np.float32),
            valid_pg=np.ones((num_real, num_g), bool),
            stats={
                "generated_tokens": float(length_b.sum()),
                "generated_samples": float(real),
                "time_sample_s": t1 - t0,
                "time_verify_s": t2 - t1,
                **{k: float(v) for k, v in verifier_stats.items()},
                **{k: float(v) for k, v in reward_stats.items()},
            },
        )
        if observe is not None:
            observe(round_)
        return round_

    return sample_round


# -------------------------------------------------------------------------- plain strategy


def plain_batch(sample_round, next_prompts, *, num_prompts: int, num_samples: int) -> Round:
    """The next P prompts, G samples each: one round, every sample valid."""
    return sample_round(next_prompts(num_prompts), num_samples)
