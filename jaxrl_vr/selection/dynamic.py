"""DAPO dynamic sampling (Yu et al., arXiv 2503.14476; SPEC §4).

A group whose valid rewards are all equal has zero group-relative advantage and gives
no gradient; DAPO drops such groups and keeps generating until the batch holds
``batch_size`` informative groups, under a budget of generation rounds.

* ``informative_groups``: jittable keep mask.
* ``DynamicBatcher``: host helper that accumulates kept groups over rounds and records
  the filtered fraction.
* ``RecheckSchedule``: filtered prompts are suspended, then re-admitted after a delay,
  because a filter verdict on few samples is noisy: a prompt with pass rate p = 0.2
  is all wrong on G = 4 samples with probability 0.8^4 = 0.4096 (41%); ``SkipSuspended``
  is the data order without the suspended prompts.
* ``dynamic_batch``: the batch strategy (``jaxrl_vr.selection.strategies``) over trajectories.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_vr import trajectory as traj_lib

__all__ = [
    "informative_groups",
    "prob_uninformative",
    "prob_all_wrong",
    "DynamicBatch",
    "DynamicBatcher",
    "DynamicStats",
    "RecheckSchedule",
    "SkipSuspended",
    "dynamic_batch",
]


def informative_groups(
    rewards_pg: chex.Array,
    valid_pg: chex.Array | None = None,
    *,
    atol: float = 0.0,
    min_valid: int = 2,
) -> chex.Array:
    """Keep mask of DAPO dynamic sampling: groups whose valid rewards are not all equal.

    keep_x = (K_x >= min_valid) and (max_i R_{x,i} − min_i R_{x,i} > atol) over valid i.

    Args:
      rewards_pg: [P, G] rewards (pass correctness to filter on accuracy as DAPO does).
      valid_pg: optional [P, G] bool; invalid samples are ignored.
      atol: spreads <= atol count as "all equal" (0 = exact, as in DAPO).
      min_valid: groups with fewer valid samples are dropped (a single sample has no
        group baseline).

    Returns:
      keep_p: [P] bool.
    """
    chex.assert_rank(rewards_pg, 2)
    rewards_pg = jnp.asarray(rewards_pg, jnp.float32)
    if valid_pg is None:
        valid_pg = jnp.ones(rewards_pg.shape, jnp.bool_)
    chex.assert_equal_shape([rewards_pg, valid_pg])
    chex.assert_type(valid_pg, bool)
    big = jnp.finfo(jnp.float32).max
    hi_p = jnp.max(jnp.where(valid_pg, rewards_pg, -big), axis=1)
    lo_p = jnp.min(jnp.where(valid_pg, rewards_pg, big), axis=1)
    enough_p = jnp.sum(valid_pg, axis=1) >= min_valid
    spread_p = jnp.where(enough_p, hi_p - lo_p, 0.0)
    return enough_p & (spread_p > atol)



def _informative_np(rewards_pg, valid_pg, *, atol, min_valid) -> np.ndarray:
    """numpy twin of ``informative_groups`` for the host loop (no device round trip)."""
    rewards_pg = np.asarray(rewards_pg, np.float64)
    hi_p = np.max(np.where(valid_pg, rewards_pg, -np.inf), axis=1)
    lo_p = np.min(np.where(valid_pg, rewards_pg, np.inf), axis=1)
    enough_p = valid_pg.sum(axis=1) >= min_valid
    spread_p = np.where(enough_p, hi_p, 0.0) - np.where(enough_p, lo_p, 0.0)
    return enough_p & (spread_p > atol)


def prob_uninformative(p: Any, num_samples: int) -> np.ndarray:
    """P(all G binary samples equal) = p^G + (1 − p)^G: the chance a group is filtered."""
    p = np.asarray(p, np.float64)
    return p**num_samples + (1.0 - p) ** num_samples


def prob_all_wrong(p: Any, num_samples: int) -> np.ndarray:
    """P(all G binary samples wrong) = (1 − p)^G, e.g. p = 0.2, G = 4: 0.8^4 = 0.4096."""
    return (1.0 - np.asarray(p, np.float64)) ** num_samples


class DynamicStats(NamedTuple):
    """What one dynamic-sampling batch took.

    Attributes:
      rounds: generation rounds used.
      generated_groups, kept_groups: groups sampled, and informative ones among them.
      filtered_fraction: filtered / generated groups.
      filtered_solved_fraction: share of the filtered groups that were all solved.
      batch_fill: real (kept) groups / batch size.
      surplus_groups: kept groups beyond the batch size (dropped).
    """

    rounds: int
    generated_groups: int
    kept_groups: int
    filtered_fraction: float
    filtered_solved_fraction: float
    batch_fill: float
    surplus_groups: int

    def metrics(self) -> dict[str, float]:
        return {f"dynamic/{name}": float(value) for name, value in self._asdict().items()}


class DynamicBatch(NamedTuple):
    """One filled (or budget-exhausted) dynamic-sampling batch.

    Attributes:
      prompt_idx_p: [N] int64 prompt indices (N = batch_size when padded).
      rewards_pg: [N, G] rewards (0 in padding rows).
      valid_pg: [N, G] bool (all False in padding rows).
      group_mask_p: [N] bool, True for real groups, False for padding.
      payload: the added payload pytrees, kept groups concatenated (zeros in padding);
        None if no payload was given.
      stats: DynamicStats.
      filtered_idx: int64 prompt indices of every filtered group (for ``RecheckSchedule``).
    """

    prompt_idx_p: np.ndarray
    rewards_pg: np.ndarray
    valid_pg: np.ndarray
    group_mask_p: np.ndarray
    payload: Any
    stats: DynamicStats
    filtered_idx: np.ndarray


class DynamicBatcher:
    """Accumulates informative groups over generation rounds (DAPO, arXiv 2503.14476).

    Usage::

      batcher = DynamicBatcher(batch_size=32, max_rounds=4)
      while not batcher.done:
          idx = choose_prompts(...)
          rollout = generate(...)                      # [P'*G] responses
          batcher.add(idx, rewards_pg, valid_pg, payload=rollout_arrays)
      batch = batcher.result()                         # then batcher.reset()

    Payload leaves must have leading dimension P' (per group) or P'*G (per response,
    prompt-major); kept groups' rows are selected from each leaf.

    Args:
      batch_size: number of informative groups wanted.
      max_rounds: generation rounds allowed per batch (the budget).
      atol, min_valid: see ``informative_groups``.
      pad: ``result()`` pads a short batch to ``batch_size`` rows with invalid groups
        (fixed shapes, no recompilation); surplus groups beyond ``batch_size`` are dropped.
      success_threshold: filtered groups with reward >= this are counted as all-solved
        in the stats.
    """

    def __init__(
        self,
        batch_size: int,
        *,
        max_rounds: int,
        atol: float = 0.0,
        min_valid: int = 2,
        pad: bool = True,
        success_threshold: float = 0.5,
    ):
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
        if int(max_rounds) < 1:
            raise ValueError(f"max_rounds must be >= 1, got {max_rounds}.")
        self.batch_size = int(batch_size)
        self.max_rounds = int(max_rounds)
        self.atol = float(atol)
        self.min_valid = int(min_valid)
        self.pad = bool(pad)
        self.success_threshold = float(success_threshold)
        self.reset()

    def reset(self) -> None:
        """Starts a new batch."""
        self.rounds = 0
        self._group_size = None
        self._idx, self._rewards, self._valid, self._payloads = [], [], [], []
        self._has_payload = None
        self._template = None  # one generated round, for padding shapes
        self._generated = 0
        self._kept = 0
        self._filtered_idx: list[np.ndarray] = []
        self._filtered_solved = 0

    @property
    def num_kept(self) -> int:
        return self._kept

    @property
    def full(self) -> bool:
        return self._kept >= self.batch_size

    @property
    def exhausted(self) -> bool:
        return self.rounds >= self.max_rounds

    @property
    def done(self) -> bool:
        return self.full or self.exhausted

    @property
    def filtered_fraction(self) -> float:
        """Filtered groups / generated groups so far (0 before any round)."""
        return (self._generated - self._kept) / self._generated if self._generated else 0.0

    def add(
        self,
        prompt_idx: Any,
        rewards_pg: Any,
        valid_pg: Any | None = None,
        payload: Any = None,
        *,
        filter_on_pg: Any | None = None,
    ) -> np.ndarray:
        """Adds one generation round; returns its keep mask [P'] (numpy bool).

        Args:
          prompt_idx: [P'] prompt indices.
          rewards_pg: [P', G] rewards returned in the batch.
          valid_pg: optional [P', G] bool.
          payload: optional pytree of per-group ([P', ...]) or per-response
            ([P'·G, ...], prompt-major) arrays.
          filter_on_pg: optional [P', G] values the keep decision uses instead of the
            rewards (e.g. verifier correctness when rewards carry length penalties,
            as DAPO filters on accuracy).
        """
        if self.done:
            raise RuntimeError(
                "DynamicBatcher is done (batch full or max_rounds spent); call result() "
                "and reset() before adding more rounds."
            )
        idx = np.asarray(prompt_idx).astype(np.int64).reshape(-1)
        rewards_pg = np.asarray(rewards_pg, np.float32)
        if rewards_pg.ndim != 2 or rewards_pg.shape[0] != idx.shape[0]:
            raise ValueError(
                f"rewards_pg must be [P', G] with P' = {idx.shape[0]} prompt indices, got "
                f"{rewards_pg.shape}."
            )
        valid_pg = np.ones(rewards_pg.shape, bool) if valid_pg is None else np.asarray(valid_pg)
        if valid_pg.shape != rewards_pg.shape or valid_pg.dtype != np.bool_:
            raise ValueError(f"valid_pg must be bool {rewards_pg.shape}, got {valid_pg.dtype} {valid_pg.shape}.")
        num_groups, group_size = rewards_pg.shape
        if self._group_size is None:
            self._group_size = group_size
            self._has_payload = payload is not None
        elif group_size != self._group_size:
            raise ValueError(f"group size changed between rounds: {self._group_size} -> {group_size}.")
        if (payload is not None) != self._has_payload:
            raise ValueError("pass a payload in every round or in none.")
        decide_pg = rewards_pg if filter_on_pg is None else np.asarray(filter_on_pg, np.float32)
        if decide_pg.shape != rewards_pg.shape:
            raise ValueError(f"filter_on_pg must have shape {rewards_pg.shape}, got {decide_pg.shape}.")
        keep_p = _informative_np(decide_pg, valid_pg, atol=self.atol, min_valid=self.min_valid)

        def rows(leaf):
            leaf = np.asarray(leaf)
            if leaf.ndim >= 1 and leaf.shape[0] == num_groups:
                return leaf[keep_p]
            if leaf.ndim >= 1 and leaf.shape[0] == num_groups * group_size:
                return leaf.reshape((num_groups, group_size) + leaf.shape[1:])[keep_p].reshape(
                    (-1,) + leaf.shape[1:])
            raise ValueError(
                f"payload leaf with shape {leaf.shape}: leading dim must be P'={num_groups} "
                f"or P'*G={num_groups * group_size}."
            )

        if payload is not None:
            self._payloads.append(jax.tree_util.tree_map(rows, payload))
            if self._template is None:
                self._template = jax.tree_util.tree_map(
                    lambda leaf: np.asarray(leaf)[:1] if np.asarray(leaf).shape[0] == num_groups
                    else np.asarray(leaf)[:group_size], payload)
        self._idx.append(idx[keep_p])
        self._rewards.append(rewards_pg[keep_p])
        self._valid.append(valid_pg[keep_p])
        filtered = ~keep_p
        self._filtered_idx.append(idx[filtered])
        solved = (valid_pg & (decide_pg >= self.success_threshold)).sum(1) == valid_pg.sum(1)
        self._filtered_solved += int((filtered & solved & (valid_pg.sum(1) > 0)).sum())
        self._generated += num_groups
        self._kept += int(keep_p.sum())
        self.rounds += 1
        return keep_p

    def result(self) -> DynamicBatch:
        """The batch: the first ``batch_size`` kept groups, padded if ``pad``."""
        if self.rounds == 0:
            raise RuntimeError("DynamicBatcher.result() before any add(); generate a round first.")
        g = self._group_size
        idx = np.concatenate(self._idx)[: self.batch_size]
        rewards = np.concatenate(self._rewards)[: self.batch_size]
        valid = np.concatenate(self._valid)[: self.batch_size]
        n_real = idx.shape[0]
        num_rows = self.batch_size if self.pad else n_real
        n_pad = num_rows - n_real
        group_mask = np.arange(num_rows) < n_real
        idx = np.concatenate([idx, np.zeros(n_pad, np.int64)])
        rewards = np.concatenate([rewards, np.zeros((n_pad, g), np.float32)])
        valid = np.concatenate([valid, np.zeros((n_pad, g), bool)])
        payload = None
        if self._has_payload:
            def join(template, *parts):
                rows_per = template.shape[0]  # 1 (per-group leaf) or G (per-response leaf)
                data = np.concatenate(parts)[: self.batch_size * rows_per]
                padding = np.zeros((n_pad * rows_per,) + template.shape[1:], template.dtype)
                return np.concatenate([data, padding])

            payload = jax.tree_util.tree_map(join, self._template, *self._payloads)
        filtered_idx = np.concatenate(self._filtered_idx) if self._filtered_idx else np.zeros(0, np.int64)
        num_filtered = self._generated - self._kept
        stats = DynamicStats(
            rounds=self.rounds,
            generated_groups=self._generated,
            kept_groups=self._kept,
            filtered_fraction=self.filtered_fraction,
            filtered_solved_fraction=self._filtered_solved / max(num_filtered, 1),
            batch_fill=n_real / self.batch_size,
            surplus_groups=max(self._kept - self.batch_size, 0),
        )
        return DynamicBatch(idx, rewards, valid, group_mask, payload, stats, filtered_idx)


class RecheckSchedule:
    """Suspends filtered prompts and re-admits them after a delay (SPEC §4).

    A prompt filtered at step t for the k-th consecutive time is suspended until step
    t + min(interval · backoff^(k−1), max_interval); a kept (informative) group resets k.

    Args:
      num_prompts: P.
      interval: base suspension in training steps (>= 1).
      backoff: multiplier per consecutive filter (1 = fixed interval).
      max_interval: cap on the suspension (default: no cap).
    """

    def __init__(self, num_prompts: int, *, interval: int, backoff: float = 1.0,
                 max_interval: int | None = None):
        if int(interval) < 1:
            raise ValueError(f"interval must be >= 1 step, got {interval}.")
        if float(backoff) < 1.0:
            raise ValueError(f"backoff must be >= 1, got {backoff}.")
        self.num_prompts = int(num_prompts)
        self.interval = int(interval)
        self.backoff = float(backoff)
        self.max_interval = None if max_interval is None else int(max_interval)
        self._until_p = np.zeros(self.num_prompts, np.int64)  # admissible when step >= until
        self._strikes_p = np.zeros(self.num_prompts, np.int64)

    def record(self, prompt_idx: Any, filtered: Any, step: int) -> None:
        """Records one round's verdicts: ``filtered`` [N] bool (True = group was dropped)."""
        idx = np.asarray(prompt_idx).astype(np.int64).reshape(-1)
        filtered = np.asarray(filtered, bool).reshape(-1)
        if idx.shape != filtered.shape:
            raise ValueError(f"prompt_idx {idx.shape} and filtered {filtered.shape} must match.")
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_prompts):
            raise IndexError(f"prompt index out of range [0, {self.num_prompts}).")
        kept = idx[~filtered]
        self._strikes_p[kept] = 0
        self._until_p[kept] = 0
        hit = np.unique(idx[filtered])
        hit = hit[~np.isin(hit, kept)]  # kept anywhere this round wins
        self._strikes_p[hit] += 1
        delay = self.interval * self.backoff ** (self._strikes_p[hit] - 1).astype(np.float64)
        if self.max_interval is not None:
            delay = np.minimum(delay, self.max_interval)
        self._until_p[hit] = int(step) + np.ceil(delay).astype(np.int64)

    def admissible(self, step: int) -> np.ndarray:
        """[P] bool: prompts that may be sampled at ``step``."""
        return self._until_p <= int(step)

    def suspended_until(self) -> np.ndarray:
        return self._until_p.copy()

    def choose(self, rng: np.random.Generator, num: int, step: int,
               eligible_p: np.ndarray | None = None) -> np.ndarray:
        """Draws ``num`` distinct prompts, admissible ones first (uniformly, via ``rng``).

        If fewer than ``num`` are admissible, the batch is completed with the suspended
        prompts that are due soonest (ties by index), so batch shapes never change.
        """
        eligible = np.ones(self.num_prompts, bool) if eligible_p is None else np.asarray(eligible_p, bool)
        if int(eligible.sum()) < num:
            raise ValueError(f"asked for {num} prompts but only {int(eligible.sum())} are eligible.")
        ok = np.flatnonzero(eligible & self.admissible(step))
        if ok.size >= num:
            return np.sort(rng.choice(ok, size=num, replace=False))
        waiting = np.flatnonzero(eligible & ~self.admissible(step))
        soonest = waiting[np.argsort(self._until_p[waiting], kind="stable")][: num - ok.size]
        return np.sort(np.concatenate([ok, soonest]))

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"until_p": self._until_p.copy(), "strikes_p": self._strikes_p.copy()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        until = np.asarray(state["until_p"], np.int64)
        strikes = np.asarray(state["strikes_p"], np.int64)
        if until.shape != (self.num_prompts,) or strikes.shape != (self.num_prompts,):
            raise ValueError(
                f"RecheckSchedule checkpoint has shape {until.shape}, expected ({self.num_prompts},)."
            )
        self._until_p, self._strikes_p = until.copy(), strikes.copy()


class SkipSuspended:
    """The data order without suspended prompts (DAPO re-check, ``RecheckSchedule``).

    A drawn prompt that is suspended at this step is deferred; deferred prompts are served
    first once ``admissible(step)`` lets them back in, so a filtered prompt is re-checked
    after its suspension instead of waiting for the next epoch.

    Args:
      order: the prompt source to filter (``next_prompts``, ``num_items``, state).
      admissible: ``step -> bool [num_items]`` (``RecheckSchedule.admissible``).
    """

    def __init__(self, order, admissible: Callable[[int], np.ndarray]):
        self.order, self.admissible = order, admissible
        self.pending: list[int] = []
        self._step = 0

    @property
    def num_items(self) -> int:
        return self.order.num_items

    def begin_step(self, step: int) -> None:
        self._step = int(step)
        self.order.begin_step(step)

    def next_prompts(self, num: int) -> np.ndarray:
        ok = np.asarray(self.admissible(self._step), bool)
        ready = [p for p in self.pending if ok[p]][:num]
        self.pending = [p for p in self.pending if p not in set(ready)]
        out = list(ready)
        while len(out) < num:
            if len(self.pending) >= self.order.num_items:  # everything suspended: take the oldest
                out.append(self.pending.pop(0))
                continue
            for p in self.order.next_prompts(num - len(out)).tolist():
                (out if ok[p] and p not in out else self.pending).append(p)
        return np.asarray(out[:num], np.int64)

    def state_dict(self) -> dict:
        return {**self.order.state_dict(), "pending": list(self.pending)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.order.load_state_dict(state)
        self.pending = [int(p) for p in state.get("pending", [])]


def dynamic_batch(sample_round, next_prompts, *, num_prompts: int, num_samples: int,
                  max_rounds: int, success_threshold: float = 0.5, recheck=None,
                  step: int = 0) -> traj_lib.Trajectory:
    """DAPO dynamic sampling as a batch strategy (``jaxrl_vr.selection.strategies``).

    Samples rounds of ``num_prompts`` prompts until ``num_prompts`` informative groups
    (verifier scores not all equal) are kept or ``max_rounds`` rounds are spent; a short
    batch is padded with invalid groups so shapes never change. Every round's tokens count
    in the budget (their stats add). The keep decision uses the verifier scores, not the
    shaped rewards, as DAPO filters on accuracy.

    Args:
      sample_round: ``(prompt_idx, num_samples) -> Trajectory``.
      next_prompts: ``num -> prompt_idx``.
      recheck: optional ``RecheckSchedule`` that records each round's filter verdicts.
      step: the RL step (for ``recheck``).

    Returns:
      a Trajectory of ``num_prompts`` groups whose ``stats.strategy`` is the DynamicStats.
    """
    batcher = DynamicBatcher(num_prompts, max_rounds=max_rounds,
                             success_threshold=success_threshold)
    kept, stats = [], traj_lib.RolloutStats()
    while not batcher.done:
        round_ = sample_round(next_prompts(num_prompts), num_samples)
        stats = stats + round_.stats
        keep_p = batcher.add(round_.prompt_idx_p, round_.per_group(round_.rewards_b), round_.valid_pg,
                             filter_on_pg=round_.per_group(round_.scores_b))
        if recheck is not None:
            recheck.record(round_.prompt_idx_p, ~keep_p, step)
        if keep_p.any():
            kept.append(traj_lib.select_groups(round_, keep_p))
    stats = dataclasses.replace(stats, strategy=batcher.result().stats)
    if not kept:  # nothing informative: one all-invalid batch of the last round's prompts
        return traj_lib.invalidate(round_, np.zeros_like(round_.valid_pg))._replace(stats=stats)
    batch = traj_lib.concat_groups(kept, stats=stats)
    batch = traj_lib.select_groups(batch, np.arange(min(batch.num_prompts, num_prompts)))
    return traj_lib.pad_groups(batch, num_prompts)
