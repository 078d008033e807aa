"""The trajectory: P prompts × G samples of one round or one training batch, as one type.

Every phase of an RL step reads and writes a ``Trajectory``: the round sampler makes
one per generation round, batch strategies join, select and pad them, methods annotate
them (per-prompt KL weights, prompt pairs), the batch builder fills the advantages and
the behaviour / reference log-probs, and the update trains on its rows
(``jaxrl_vr.train.batch.rollout_batch``). Host (numpy) arrays, but for the builder's fields
(device arrays); B = P·G rows, prompt-major (row b = p·G + g); ``valid_pg`` is the only
padding marker.

Tokens after the prompt are a sequence of segments: tokens the policy sampled
(``loss_mask_bt`` True: they are trained on and scored by the policy's log-probs) and, in
multi-turn episodes, tokens an environment or tool wrote (``token_mask_bt`` True,
``loss_mask_bt`` False: attended to, never trained on). A single-turn response is one
sampled segment, so the two masks are equal.

The group operations (``widen``, ``place_samples``, ``select_groups``, ``concat_groups``,
``pad_groups``, ``invalidate``) keep every field consistent; batch strategies are written
with them and nothing else.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Sequence

import numpy as np

__all__ = [
    "RolloutStats",
    "Trajectory",
    "concat_groups",
    "invalidate",
    "pad_groups",
    "place_samples",
    "select_groups",
    "widen",
]


@dataclasses.dataclass(frozen=True)
class RolloutStats:
    """What producing a trajectory cost and what went wrong, summed over its rounds.

    Attributes:
      generated_tokens: every sampled token (probes, filtered groups, padding rows excluded).
      generated_samples: every sampled response.
      rounds: generation rounds (sampler calls).
      sample_s, verify_s: seconds in the sampler and in scoring (decode, verifiers, shaping).
      verifier_errors, verifier_timeouts, verifier_unparsable: samples per verifier status.
      tested_samples: samples whose verifier reported per-test results (code tasks).
      test_frac_sum: their fractions of tests passed, summed (mean = sum / tested_samples).
      detector_counts: (detector name, samples it fired on) per enabled hack detector.
      env_tokens: tokens environments and templates wrote into episodes (not sampled, not
        charged to the token budget, counted on their own).
      turns: model turns over every episode (= generated_samples for single-turn tasks).
      tool_calls, tool_calls_valid, tool_calls_ok: tool calls made, those that parsed
        (a known tool, readable arguments) and those that ran without an error.
      env_errors: episodes ended by an environment that raised, hung or returned non-text.
      strategy: the batch strategy's own typed record (e.g. ``DynamicStats``), or None.
    """

    generated_tokens: float = 0.0
    generated_samples: float = 0.0
    rounds: int = 0
    sample_s: float = 0.0
    verify_s: float = 0.0
    verifier_errors: float = 0.0
    verifier_timeouts: float = 0.0
    verifier_unparsable: float = 0.0
    tested_samples: float = 0.0
    test_frac_sum: float = 0.0
    detector_counts: tuple = ()
    env_tokens: float = 0.0
    turns: float = 0.0
    tool_calls: float = 0.0
    tool_calls_valid: float = 0.0
    tool_calls_ok: float = 0.0
    env_errors: float = 0.0
    strategy: Any = None

    def __add__(self, other: "RolloutStats") -> "RolloutStats":
        counts = dict(self.detector_counts)
        for name, value in other.detector_counts:
            counts[name] = counts.get(name, 0.0) + value
        summed = {f.name: getattr(self, f.name) + getattr(other, f.name)
                  for f in dataclasses.fields(self) if f.name not in ("detector_counts", "strategy")}
        return RolloutStats(**summed, detector_counts=tuple(sorted(counts.items())),
                            strategy=other.strategy if other.strategy is not None else self.strategy)


class Trajectory(NamedTuple):
    """Host arrays of P prompts × G samples, B = P·G rows, prompt-major.

    Attributes:
      prompt_idx_p: int64 [P] indices into the training items (the group ids).
      prompt_tokens_ps: int32 [P, S] left-padded prompt tokens.
      prompt_mask_ps: bool [P, S].
      tokens_bt: int32 [B, T] every token after the prompt (sampled or written by an
        environment), right-padded.
      token_mask_bt: bool [B, T] tokens that exist (attended to); all False in invalid rows.
      loss_mask_bt: bool [B, T] tokens the policy sampled (incl. its stop token): the loss,
        the KL and the entropy count these only; all False in invalid rows.
      sampler_logp_bt: float32 [B, T] the sampler's log-probs (0 off the loss mask).
      length_b: int32 [B] tokens after the prompt (0 in invalid rows).
      truncated_b: bool [B] hit the length cap without a stop token.
      scores_b: float32 [B] verifier success in [0, 1] (0 in invalid rows).
      overlong_b, hack_b: float32 [B] the reward's penalty terms, −λ_len·P_overlong and
        −λ_hack·P_hack (SPEC §5; 0 when off), so rewards_b = scores_b + overlong_b + hack_b.
      rewards_b: float32 [B] shaped rewards (0 in invalid rows).
      valid_pg: bool [P, G] real samples (ragged and padding groups are False).
      kl_weight_p: float32 [P] extra KL weight per prompt on top of loss.kl_beta (PBA's
        λ on anchored prompts); 0 unless a method sets it.
      paired_p: bool [P] rows of (q⁺, q⁻) prompt pairs, laid out as rows (2i, 2i + 1)
        (Weighted GRPO); False unless a method sets it.
      stats: RolloutStats.
      turn_bt: int32 [B, T] the model turn of each policy token, −1 on environment tokens
        and padding (−1 everywhere in invalid rows); None for single-turn rounds.
      signals_bkn: float32 [B, K, N] intermediate signals of each model turn (N =
        ``jaxrl_vr.envs.signals.SIGNALS``, K = task.max_turns), NaN where a signal does not
        apply or the turn does not exist (NaN everywhere in invalid rows); None for
        single-turn rounds. Step-level credit (``jaxrl_vr.credit``) reads both.
      adv_bt: float32 [B, T] per-token advantages (0 off the loss mask), or None before
        the batch builder ran. An outcome estimator broadcasts a sample's advantage to
        its tokens; step-level credit may give tokens of one sample different values.
      behaviour_logp_bt: float32 [B, T] log π_old recomputed by the trainer (or the
        sampler's when the loss detaches its own forward), None before the builder.
      reference_logp_bt: float32 [B, T] log π_ref, None before the builder (and the
        behaviour log-probs when no KL is computed).
      tests_passed_b, tests_total_b: int32 [B] unit tests passed / run by the sample's
        verifier (code tasks: an intermediate signal for step-level credit; the fraction
        passed is their ratio where tests_total_b > 0); 0 where the verifier runs no tests
        and in invalid rows.
    """

    prompt_idx_p: np.ndarray
    prompt_tokens_ps: np.ndarray
    prompt_mask_ps: np.ndarray
    tokens_bt: np.ndarray
    token_mask_bt: np.ndarray
    loss_mask_bt: np.ndarray
    sampler_logp_bt: np.ndarray
    length_b: np.ndarray
    truncated_b: np.ndarray
    scores_b: np.ndarray
    overlong_b: np.ndarray
    hack_b: np.ndarray
    rewards_b: np.ndarray
    valid_pg: np.ndarray
    kl_weight_p: np.ndarray
    paired_p: np.ndarray
    stats: RolloutStats = RolloutStats()
    turn_bt: np.ndarray | None = None
    signals_bkn: np.ndarray | None = None
    adv_bt: np.ndarray | None = None
    behaviour_logp_bt: np.ndarray | None = None
    reference_logp_bt: np.ndarray | None = None
    tests_passed_b: np.ndarray | None = None
    tests_total_b: np.ndarray | None = None

    @property
    def num_prompts(self) -> int:
        return int(self.prompt_idx_p.shape[0])

    @property
    def group_size(self) -> int:
        return int(self.valid_pg.shape[1])

    @property
    def valid_b(self) -> np.ndarray:
        return self.valid_pg.reshape(-1)

    def per_group(self, values_b: np.ndarray) -> np.ndarray:
        """[B] values as [P, G]."""
        return np.asarray(values_b).reshape(self.valid_pg.shape)

    @classmethod
    def single_turn(cls, *, prompt_idx_p, prompt_tokens_ps, prompt_mask_ps, tokens_bt, mask_bt,
                    sampler_logp_bt, length_b, truncated_b, scores_b, rewards_b, overlong_b=None,
                    hack_b=None, tests_passed_b=None, tests_total_b=None,
                    stats: RolloutStats = RolloutStats()) -> "Trajectory":
        """A round of single-turn responses: one sampled segment each, every sample valid."""
        num_p = int(np.asarray(prompt_idx_p).shape[0])
        num_b = int(np.asarray(tokens_bt).shape[0])
        mask_bt = np.asarray(mask_bt, bool)
        zeros_b = np.zeros(num_b, np.float32)
        no_tests_b = np.zeros(num_b, np.int32)
        return cls(
            prompt_idx_p=np.asarray(prompt_idx_p, np.int64),
            prompt_tokens_ps=np.asarray(prompt_tokens_ps, np.int32),
            prompt_mask_ps=np.asarray(prompt_mask_ps, bool),
            tokens_bt=np.asarray(tokens_bt, np.int32),
            token_mask_bt=mask_bt,
            loss_mask_bt=mask_bt.copy(),
            sampler_logp_bt=np.where(mask_bt, np.asarray(sampler_logp_bt, np.float32), 0.0).astype(np.float32),
            length_b=np.asarray(length_b, np.int32),
            truncated_b=np.asarray(truncated_b, bool),
            scores_b=np.asarray(scores_b, np.float32),
            overlong_b=zeros_b if overlong_b is None else np.asarray(overlong_b, np.float32),
            hack_b=zeros_b.copy() if hack_b is None else np.asarray(hack_b, np.float32),
            rewards_b=np.asarray(rewards_b, np.float32),
            valid_pg=np.ones((num_p, num_b // max(num_p, 1)), bool),
            kl_weight_p=np.zeros(num_p, np.float32),
            paired_p=np.zeros(num_p, bool),
            stats=stats,
            tests_passed_b=no_tests_b if tests_passed_b is None else np.asarray(tests_passed_b, np.int32),
            tests_total_b=no_tests_b.copy() if tests_total_b is None else np.asarray(tests_total_b, np.int32),
        )


# Fields with one row per group, per sample, and those cleared where a sample is invalid
# (0, or the fill of _INVALID_FILL).
_PER_PROMPT = ("prompt_idx_p", "prompt_tokens_ps", "prompt_mask_ps", "kl_weight_p", "paired_p")
_CLEARED_WHEN_INVALID = ("token_mask_bt", "loss_mask_bt", "sampler_logp_bt", "length_b", "truncated_b",
                         "scores_b", "overlong_b", "hack_b", "rewards_b", "turn_bt", "signals_bkn", "adv_bt",
                         "behaviour_logp_bt", "reference_logp_bt", "tests_passed_b",
                         "tests_total_b")
_PER_SAMPLE = ("tokens_bt",) + _CLEARED_WHEN_INVALID
# What an invalid sample holds, where it is not 0: no turn, no signal.
_INVALID_FILL = {"turn_bt": -1, "signals_bkn": np.nan}


def _invalid_like(name: str, value: np.ndarray) -> np.ndarray:
    return np.full_like(value, _INVALID_FILL.get(name, 0))


def _samples(traj: Trajectory):
    """(name, [P, G, ...] view) of every per-sample field that is set."""
    shape = traj.valid_pg.shape
    for name in _PER_SAMPLE:
        value = getattr(traj, name)
        if value is not None:
            value = np.asarray(value)
            yield name, value.reshape(shape + value.shape[1:])


def _check_same_fields(trajs: Sequence[Trajectory]) -> None:
    """Trajectories to be joined set the same optional per-sample fields."""
    for name in _PER_SAMPLE:
        has = {getattr(t, name) is not None for t in trajs}
        if len(has) > 1:
            raise ValueError(f"cannot join trajectories where only some have {name} (a single-turn round "
                             "with an episode round?); every round of a run must be of one kind.")


def _flat(value_pg: np.ndarray) -> np.ndarray:
    return value_pg.reshape((-1,) + value_pg.shape[2:])


def widen(traj: Trajectory, group_size: int) -> Trajectory:
    """Every group padded to ``group_size`` samples with invalid rows (copies of sample 0
    with zeroed masks, scores and rewards), so trajectories of different G can be joined."""
    num_p, num_g = traj.valid_pg.shape
    if group_size == num_g:
        return traj
    if group_size < num_g:
        raise ValueError(f"cannot widen a trajectory of G={num_g} to {group_size}.")
    extra = group_size - num_g
    fields = {}
    for name, value_pg in _samples(traj):
        pad = np.repeat(value_pg[:, :1], extra, axis=1)
        if name in _CLEARED_WHEN_INVALID:
            pad = _invalid_like(name, pad)
        fields[name] = _flat(np.concatenate([value_pg, pad], axis=1))
    valid_pg = np.concatenate([traj.valid_pg, np.zeros((num_p, extra), bool)], axis=1)
    return traj._replace(valid_pg=valid_pg, **fields)


def place_samples(base: Trajectory, extra: Trajectory, rows_p: np.ndarray, start: int) -> Trajectory:
    """``base`` with ``extra``'s samples written into groups ``rows_p`` from sample ``start``.

    ``extra`` holds len(rows_p) groups of G' samples of the same prompts (in order); they
    fill columns [start, start + G') of those groups and become valid there. Stats add.
    """
    rows_p = np.asarray(rows_p, np.int64)
    if extra.num_prompts != rows_p.shape[0]:
        raise ValueError(f"{extra.num_prompts} extra groups for {rows_p.shape[0]} target rows.")
    g_extra = extra.group_size
    if start + g_extra > base.group_size:
        raise ValueError(f"samples [{start}, {start + g_extra}) do not fit groups of {base.group_size}.")
    _check_same_fields([base, extra])
    extra_fields = dict(_samples(extra))
    fields = {}
    for name, value_pg in _samples(base):
        value_pg = value_pg.copy()
        value_pg[rows_p, start:start + g_extra] = extra_fields[name]
        fields[name] = _flat(value_pg)
    valid_pg = base.valid_pg.copy()
    valid_pg[rows_p, start:start + g_extra] = extra.valid_pg
    return base._replace(valid_pg=valid_pg, stats=base.stats + extra.stats, **fields)


def select_groups(traj: Trajectory, keep_p: np.ndarray) -> Trajectory:
    """The trajectory restricted to groups ``keep_p`` (bool [P] or int indices)."""
    keep = np.asarray(keep_p)
    fields = {name: np.asarray(getattr(traj, name))[keep] for name in _PER_PROMPT}
    fields.update({name: _flat(value_pg[keep]) for name, value_pg in _samples(traj)})
    return traj._replace(valid_pg=traj.valid_pg[keep], **fields)


def concat_groups(trajs: Sequence[Trajectory], stats: RolloutStats | None = None) -> Trajectory:
    """Groups of several trajectories (same G, S, T) stacked in order; stats summed unless given."""
    first = trajs[0]
    _check_same_fields(trajs)
    names = _PER_PROMPT + ("valid_pg",) + tuple(n for n in _PER_SAMPLE if getattr(first, n) is not None)
    fields = {name: np.concatenate([np.asarray(getattr(t, name)) for t in trajs]) for name in names}
    if stats is None:
        stats = RolloutStats()
        for t in trajs:
            stats = stats + t.stats
    return first._replace(stats=stats, **fields)


def invalidate(traj: Trajectory, valid_pg: np.ndarray) -> Trajectory:
    """The trajectory with ``valid_pg`` as its validity, per-sample fields zeroed where invalid."""
    valid_pg = np.asarray(valid_pg, bool)
    fields = {}
    for name, value_pg in _samples(traj):
        if name in _CLEARED_WHEN_INVALID:
            keep = valid_pg.reshape(valid_pg.shape + (1,) * (value_pg.ndim - 2))
            fields[name] = _flat(np.where(keep, value_pg, np.asarray(_INVALID_FILL.get(name, 0), value_pg.dtype)))
    return traj._replace(valid_pg=valid_pg, **fields)


def pad_groups(traj: Trajectory, num_prompts: int) -> Trajectory:
    """Padded to ``num_prompts`` groups with invalid copies of group 0 (a real prompt, so the
    model call stays well defined; every sample of a padding group is invalid)."""
    missing = num_prompts - traj.num_prompts
    if missing <= 0:
        return traj
    filler = select_groups(traj, np.zeros(missing, np.int64))
    filler = invalidate(filler, np.zeros_like(filler.valid_pg))._replace(
        kl_weight_p=np.zeros(missing, np.float32), paired_p=np.zeros(missing, bool))
    return concat_groups([traj, filler], stats=traj.stats)
