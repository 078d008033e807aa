"""Batch strategies: how one RL step's training batch is sampled, from one registry.

A batch strategy is called once per step as ``strategy(sample_round, next_prompts) ->
Trajectory`` with

* ``sample_round(prompt_idx, num_samples) -> Trajectory``: samples and scores prompts;
* ``next_prompts(num) -> prompt_idx``: the next prompts of the prompt source,

and returns a batch of ``num_prompts`` groups (ragged or padding groups through
``valid_pg``). Strategies are ``jaxrl_vr.hooks.Hook``s, so one with state (DAPO's
re-check schedule) checkpoints it and may filter the prompt source.

    plain       the next P prompts, G samples each
    dynamic     DAPO dynamic sampling (arXiv 2503.14476): rounds until P informative groups
    two_stage   MAI-Thinking-1 probing: G_probe samples, G to prompts in the band (or
                adaptive G under the fixed total)

``rl.batch_strategy`` chooses one (``--config.rl.batch_strategy=dynamic``), its settings
below it (``--config.rl.batch_strategy.max_rounds=4``). Adding a strategy is a factory
``fn(settings, context) -> strategy``, its settings dataclass and one registry line.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import numpy as np

from jaxrl_vr.hooks import Hook
from jaxrl_vr.registry import Entry, NoSettings, Registry
from jaxrl_vr.selection.dynamic import RecheckSchedule, SkipSuspended, dynamic_batch
from jaxrl_vr.selection.two_stage import two_stage_batch
from jaxrl_vr.trajectory import Trajectory

__all__ = ["BATCH_STRATEGIES", "DynamicSettings", "StrategyContext", "TwoStageSettings",
           "batch_group_size", "make_batch_strategy", "plain_batch"]

SampleRound = Callable[[np.ndarray, int], Trajectory]
NextPrompts = Callable[[int], np.ndarray]


class StrategyContext(NamedTuple):
    """What the run tells every strategy."""

    num_prompts: int  # P, groups per batch
    samples_per_prompt: int  # G
    num_items: int  # size of the training pool
    success_threshold: float = 0.5


def plain_batch(sample_round: SampleRound, next_prompts: NextPrompts, *, num_prompts: int,
                num_samples: int) -> Trajectory:
    """The next P prompts, G samples each: one round, every sample valid."""
    return sample_round(next_prompts(num_prompts), num_samples)


class _Plain(Hook):
    def __init__(self, settings: NoSettings, context: StrategyContext):
        self.context = context

    def __call__(self, sample_round: SampleRound, next_prompts: NextPrompts) -> Trajectory:
        return plain_batch(sample_round, next_prompts, num_prompts=self.context.num_prompts,
                           num_samples=self.context.samples_per_prompt)


@dataclasses.dataclass(frozen=True)
class DynamicSettings:
    """DAPO dynamic sampling.

    Attributes:
      max_rounds: generation rounds per batch (the budget; a short batch is padded).
      recheck_interval: a filtered prompt is suspended for this many steps before it may
        be drawn again (0 = off; a verdict on few samples is noisy, SPEC §4).
    """

    max_rounds: int = 3
    recheck_interval: int = 0

    def __post_init__(self):
        if self.max_rounds < 1:
            raise ValueError(f"max_rounds must be >= 1, got {self.max_rounds}.")
        if self.recheck_interval < 0:
            raise ValueError(f"recheck_interval must be >= 0 (0 = off), got {self.recheck_interval}.")


class _Dynamic(Hook):
    state_key = "recheck"

    def __init__(self, settings: DynamicSettings, context: StrategyContext):
        self.settings, self.context, self.step = settings, context, 0
        self.recheck = (RecheckSchedule(context.num_items, interval=settings.recheck_interval)
                        if settings.recheck_interval else None)

    def wrap_source(self, source):
        return source if self.recheck is None else SkipSuspended(source, self.recheck.admissible)

    def begin_step(self, step: int) -> None:
        self.step = step

    def __call__(self, sample_round: SampleRound, next_prompts: NextPrompts) -> Trajectory:
        return dynamic_batch(sample_round, next_prompts, num_prompts=self.context.num_prompts,
                             num_samples=self.context.samples_per_prompt,
                             max_rounds=self.settings.max_rounds,
                             success_threshold=self.context.success_threshold,
                             recheck=self.recheck, step=self.step)

    def state_dict(self):
        return None if self.recheck is None else self.recheck.state_dict()

    def load_state_dict(self, state) -> None:
        if self.recheck is not None and state is not None:
            self.recheck.load_state_dict(state)


@dataclasses.dataclass(frozen=True)
class TwoStageSettings:
    """MAI-Thinking-1 two-stage sampling.

    Attributes:
      probe: G_probe samples per prompt in the probe (<= rl.samples_per_prompt).
      lo, hi: prompts whose probe pass rate lies in [lo, hi] continue to G samples.
      adaptive_g_max: split the fixed total P·G over the probed prompts ∝ p̂(1 − p̂), at most
        this many samples each (0 = off: the fixed continuation); the batch is then
        [P, adaptive_g_max] with ragged groups.
    """

    probe: int = 4
    lo: float = 0.0
    hi: float = 0.75
    adaptive_g_max: int = 0

    def __post_init__(self):
        if self.probe < 1:
            raise ValueError(f"probe must be >= 1, got {self.probe}.")
        if not 0.0 <= self.lo <= self.hi <= 1.0:
            raise ValueError(f"lo, hi need 0 <= lo <= hi <= 1, got lo={self.lo}, hi={self.hi}.")
        if self.adaptive_g_max < 0:
            raise ValueError(f"adaptive_g_max must be >= 0 (0 = off), got {self.adaptive_g_max}.")

    def check(self, rl) -> None:
        if self.probe > rl.samples_per_prompt:
            raise ValueError(f"rl.batch_strategy.probe={self.probe} must be <= "
                             f"rl.samples_per_prompt={rl.samples_per_prompt}.")
        if self.adaptive_g_max and self.adaptive_g_max < rl.samples_per_prompt:
            raise ValueError(f"rl.batch_strategy.adaptive_g_max={self.adaptive_g_max} must be >= "
                             f"rl.samples_per_prompt={rl.samples_per_prompt} (the average G of the "
                             "fixed total), or 0.")

    def group_size(self, samples_per_prompt: int) -> int:
        return self.adaptive_g_max or samples_per_prompt


class _TwoStage(Hook):
    def __init__(self, settings: TwoStageSettings, context: StrategyContext):
        self.settings, self.context = settings, context

    def __call__(self, sample_round: SampleRound, next_prompts: NextPrompts) -> Trajectory:
        s = self.settings
        return two_stage_batch(sample_round, next_prompts, num_prompts=self.context.num_prompts,
                               g_probe=s.probe, g_full=self.context.samples_per_prompt, lo=s.lo,
                               hi=s.hi, adaptive_g_max=s.adaptive_g_max or None)


BATCH_STRATEGIES = Registry("batch strategy", {
    "plain": _Plain,
    "dynamic": Entry(_Dynamic, DynamicSettings),
    "two_stage": Entry(_TwoStage, TwoStageSettings),
})


def make_batch_strategy(name: str, settings=None, *, context: StrategyContext) -> Hook:
    """The registered strategy ``name`` (its settings' defaults when None)."""
    entry = BATCH_STRATEGIES[name]
    return entry.fn(entry.settings() if settings is None else settings, context)


def batch_group_size(settings, samples_per_prompt: int) -> int:
    """G of the batch's [P, G] layout: the strategy's own (adaptive G widens it) or G."""
    group_size = getattr(settings, "group_size", None)
    return group_size(samples_per_prompt) if group_size is not None else samples_per_prompt
