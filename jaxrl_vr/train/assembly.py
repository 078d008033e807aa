"""Assembly of the RL driver's parts from the config: loop state, estimator, batch strategy,
prompt source, compiled functions, budget, signal handling (used by ``train/loop.py``)."""

from __future__ import annotations

import dataclasses
import functools
import signal
from typing import Any, Callable, Mapping, NamedTuple

import jax

from jaxrl_vr import estimators as estimators_lib
from jaxrl_vr.train import rounds as rounds_lib
from jaxrl_vr.train import step as step_lib
from jaxrl_vr.train.config import RLConfig
from jaxrl_vr.train.optim import OptimConfig, make_optimizer
from jaxrl_vr.train.prompts import DataOrder, PairedSource, SkipSuspended


@dataclasses.dataclass
class Budget:
    """Cumulative accounting: tokens and seconds per phase (checkpointed)."""

    generated_tokens: float = 0.0  # RL rollouts: every sampled token (probes, dropped groups, padding)
    calibration_tokens: float = 0.0  # training-prompt calibration passes before RL (PBA, pairing)
    generated_samples: float = 0.0
    trained_tokens: float = 0.0
    sample_s: float = 0.0
    verify_s: float = 0.0
    logprob_s: float = 0.0
    update_s: float = 0.0
    total_s: float = 0.0
    verifier_errors: float = 0.0
    verifier_timeouts: float = 0.0


def charged_tokens(budget: Mapping[str, float], include_calibration: bool) -> float:
    """Tokens counted against ``rl.token_budget``: RL rollouts, plus the calibration passes
    when ``rl.budget_includes_calibration``. ``budget`` is a Budget as a dict."""
    extra = budget.get("calibration_tokens", 0.0) if include_calibration else 0.0
    return budget.get("generated_tokens", 0.0) + extra


class LoopState(NamedTuple):
    """The device side of the loop: everything jitted code updates (checkpointed as is)."""

    train: step_lib.TrainState
    key: jax.Array  # raw key data (jax.random.key_data)
    estimator: Any


def initial_loop_state(params, *, rl: RLConfig, loss: step_lib.LossConfig, optim: OptimConfig,
                       state_sharding=None) -> LoopState:
    """The loop state before step 0 (also the template a checkpoint is restored into)."""
    estimator = make_rl_estimator(rl)
    train_state = step_lib.init_train_state(params, make_optimizer(optim), loss)
    if state_sharding is not None:
        train_state = jax.device_put(train_state, state_sharding)
    return LoopState(train_state, jax.random.key_data(jax.random.key(rl.seed)), estimator.init())


def make_rl_estimator(rl: RLConfig) -> estimators_lib.Estimator:
    """The configured advantage estimator (``jaxrl_vr.estimators``)."""
    return estimators_lib.make_estimator(rl.advantage, **estimators_lib.estimator_kwargs(
        rl.advantage, num_prompts=rl.prompts_per_step, curverl_window=rl.curverl_window,
        pair_neg_weight=rl.pair_neg_weight, pair_scope=rl.pair_scope,
        success_threshold=rl.success_threshold))


def make_batch_strategy(rl: RLConfig, *, recheck=None) -> Callable:
    """The configured ``strategy(sample_round, next_prompts, step) -> Round``."""
    if rl.dynamic_sampling:
        from jaxrl_vr.selection.dynamic import dynamic_batch

        return lambda sample_round, next_prompts, step: dynamic_batch(
            sample_round, next_prompts, num_prompts=rl.prompts_per_step,
            num_samples=rl.samples_per_prompt, max_rounds=rl.dynamic_max_rounds,
            success_threshold=rl.success_threshold, recheck=recheck, step=step)
    if rl.two_stage:
        from jaxrl_vr.selection.two_stage import two_stage_batch

        return lambda sample_round, next_prompts, step: two_stage_batch(
            sample_round, next_prompts, num_prompts=rl.prompts_per_step,
            g_probe=rl.two_stage_probe, g_full=rl.samples_per_prompt, lo=rl.two_stage_lo,
            hi=rl.two_stage_hi, adaptive_g_max=rl.adaptive_g_max or None)
    return lambda sample_round, next_prompts, step: rounds_lib.plain_batch(
        sample_round, next_prompts, num_prompts=rl.prompts_per_step,
        num_samples=rl.samples_per_prompt)


def _build_fns(graphdef, optim: OptimConfig, loss_structure: step_lib.LossConfig,
               logprob_microbatches: int, state_sharding=None, logprob_group_size: int = 1):
    """Jitted (train step, log-prob fn) for one model structure and static loss config."""
    train_step = step_lib.make_train_step(graphdef, None, make_optimizer(optim), loss_structure,
                                          state_sharding=state_sharding)
    logprob_fn = step_lib.make_logprob_fn(graphdef, num_microbatches=logprob_microbatches,
                                          chunk_size=loss_structure.logprob_chunk_size,
                                          prompt_group_size=logprob_group_size)
    return train_step.jitted, logprob_fn


# Shared by trainers with the same structure, so a resumed or repeated run in one process
# does not compile again (sharded runs build their own: shardings are not hashable).
_compiled_fns = functools.lru_cache(maxsize=8)(_build_fns)


def make_prompt_source(rl: RLConfig, num_items: int, *, tracker=None, recheck=None):
    """The configured prompt source: the data order, re-checked (dynamic sampling with a
    re-check interval) or paired from the tracker's rates (``rl.pairing``)."""
    order = DataOrder(num_items, seed=rl.seed)
    if recheck is not None:
        return SkipSuspended(order, recheck.admissible)
    if not rl.pairing:
        return order
    from jaxrl_vr.selection.pairing import PairedPromptSource, tracker_rates

    return PairedSource(PairedPromptSource(
        num_items, tracker_rates(tracker, calibration_cap=rl.pairing_calibration_cap,
                                 min_count=rl.pairing_min_count),
        prompts_per_step=rl.prompts_per_step, group_size=rl.samples_per_prompt, seed=rl.seed,
        neg_c=rl.pairing_neg_c, pos_max=rl.pairing_pos_max, pos_min=rl.pairing_pos_min,
        explore_frac=rl.pairing_explore_frac, strategy=rl.pairing_strategy))


def catch_signals(stop: list) -> dict:
    """SIGINT/SIGTERM append their name to ``stop`` (the step finishes); a second one aborts."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum, frame):
        name = signal.Signals(signum).name
        if stop:
            raise KeyboardInterrupt(f"second {name}: aborting without a checkpoint")
        stop.append(name)

    return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}


def restore_signals(handlers: dict) -> None:
    for sig, previous in handlers.items():
        signal.signal(sig, previous)
