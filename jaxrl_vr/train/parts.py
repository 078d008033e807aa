"""The RL driver's parts, built once from the config by ``build_parts``.

    prompt source    DataOrder, wrapped by the hooks that choose prompts (pairing, DAPO's
                     re-check)
    batch strategy   ``rl.batch_strategy`` (``jaxrl_vr.selection.strategies``)
    round sampler    sampler → verifiers → rewards (``train.rollout.RoundSampler``)
    hooks            the tracker, the strategy, the methods with a section in ``rl``
                     (``train.methods``), the verifier monitor
    builder          ``rl.estimator`` + behaviour / reference log-probs (``train.batch``)
    update           the loop state and num_epochs × num_minibatches jitted train steps
                     (``train.update.make_update``)
    checkpoints      ``train.saving.RunCheckpoints``
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

from jaxrl_vr.estimators import Estimator
from jaxrl_vr.hooks import Hook
from jaxrl_vr.models.lora import has_lora, lora_off
from jaxrl_vr.sampling import generate
from jaxrl_vr.selection.order import DataOrder
from jaxrl_vr.selection.strategies import StrategyContext, make_batch_strategy
from jaxrl_vr.selection.tracker import PromptTracker
from jaxrl_vr.train import step as step_lib
from jaxrl_vr.train.batch import build_batch, rollout_batch
from jaxrl_vr.train.config import PipelineConfig
from jaxrl_vr.train.methods import METHODS, MethodContext, make_methods
from jaxrl_vr.train.rollout import (RewardShaper, RolloutDump, RoundSampler, RoundScorer, SamplingConfig,
                                    VerifierMonitor, encode_episode_prompts, episode_runner, make_scorer)
from jaxrl_vr.train.saving import RunCheckpoints
from jaxrl_vr.train.update import LoopState, make_update, rl_seed, update_on_batch
from jaxrl_vr.trajectory import Trajectory

__all__ = ["Parts", "build_parts", "kl_in_loss", "needs_reference", "method_hook_types"]


class Parts(NamedTuple):
    """Everything the RL driver calls (module docstring); built by ``build_parts``."""

    cfg: PipelineConfig
    workdir: str
    graphdef: Any
    rest: Any
    initial_state: LoopState
    source: Any
    strategy: Hook
    sampler: RoundSampler
    hooks: tuple[Hook, ...]
    estimator: Estimator
    loss_structure: step_lib.LossConfig  # the compiled update's static loss structure
    hyper: step_lib.StepHyper
    build: Callable[[Trajectory, Any, Any], tuple[Trajectory, Any]]
    update: Callable[[step_lib.TrainState, Trajectory, int], tuple[step_lib.TrainState, dict]]
    checkpoints: RunCheckpoints
    close: Callable[[], None]


def kl_in_loss(cfg: PipelineConfig, hooks: Sequence[Any]) -> bool:
    """The loss has its KL term: β > 0, or a hook (PBA's anchor) sets per-prompt KL weights."""
    return cfg.loss.kl_beta > 0 or any(getattr(hook, "sets_kl_weights", False) for hook in hooks)


def needs_reference(cfg: PipelineConfig, hooks: Sequence[Any]) -> bool:
    """The run computes π_ref log-probs: for the loss's KL term or ``rl.log_reference_kl``.
    Without them the logged ``kl`` is to the behaviour policy (``train.batch``), not the base."""
    return kl_in_loss(cfg, hooks) or bool(cfg.rl.log_reference_kl)


def method_hook_types(cfg: PipelineConfig) -> list[type]:
    """The hook classes of the config's methods (their class attributes, without building them)."""
    return [entry.fn for name, entry in METHODS.items() if getattr(cfg.rl, name, None) is not None]


def build_parts(cfg: PipelineConfig, model, tokenizer, items: Sequence[Any], workdir: str, *,
                scorer: Callable | None = None, tracker: PromptTracker | None = None,
                hooks: Sequence[Hook] = (), reference_params=None, mesh=None,
                generate_fn: Callable = generate) -> Parts:
    """The parts of RL on ``model`` over the training ``items`` (TaskItems).

    Args:
      cfg: the run's PipelineConfig (its rl, loss, optim and model prompt format).
      model, tokenizer: the policy (a jaxrl_vr Decoder; its params are the initial policy).
      items: training TaskItems.
      workdir: where metrics, checkpoints and the verifier error log go.
      scorer: ``score(items, completions) -> VerifyResult`` instead of the verifier pool.
      tracker: a PromptTracker over ``items`` (default: a new one).
      hooks: more hooks (``jaxrl_vr.hooks.Hook``), after the methods of the config.
      reference_params: frozen π_ref params (default: the model's own params, which the
        trainer never changes: it trains a copy; with LoRA, its adapters zeroed). Kept only
        when the KL term is in the loss or ``rl.log_reference_kl`` is set; otherwise the
        parts hold no base params.
      mesh: a ``jax.sharding.Mesh``: params and optimizer state are sharded over its
        ``fsdp`` (and ``tensor``) axes by ``jaxrl_vr.parallel``'s rules, minibatches over
        ``data`` × ``fsdp``.
      generate_fn: the sampler (``jaxrl_vr.sampling.generate``).
    """
    rl, seed = cfg.rl, rl_seed(cfg)
    if len(items) < rl.prompts_per_step:
        raise ValueError(f"rl.prompts_per_step={rl.prompts_per_step} exceeds the {len(items)} "
                         "training items.")
    graphdef, params, rest = step_lib.split_model(model)
    # Hooks: the tracker, the batch strategy and the methods choose the prompts.
    tracker = tracker or PromptTracker(len(items), uids=[it.uid for it in items],
                                       success_threshold=rl.success_threshold)
    strategy = make_batch_strategy(rl.batch_strategy.name, rl.batch_strategy.settings,
                                   context=StrategyContext(rl.prompts_per_step, rl.samples_per_prompt,
                                                           len(items), rl.success_threshold))
    methods = [*make_methods(rl, MethodContext(len(items), rl.prompts_per_step, rl.samples_per_prompt,
                                               seed, tracker)), *hooks]
    source = DataOrder(len(items), seed=seed)
    for hook in (tracker, strategy, *methods):
        source = hook.wrap_source(source)
    # Rounds: sampler -> verifiers (watched by the monitor) -> rewards.
    score, close_scorer = ((scorer, lambda: None) if scorer is not None
                           else make_scorer(rl.verifier.workers, rl.verifier.timeout_s))
    monitor = VerifierMonitor(workdir, error_fraction=rl.verifier.error_fraction,
                              error_patience=rl.verifier.error_patience)
    episodes = episode_runner(cfg, tokenizer, generate_fn=generate_fn)
    prompt_tokens_ns, prompt_mask_ns = encode_episode_prompts(episodes, items)  # once; a round gathers rows
    dump = RolloutDump(workdir, tokenizer, cfg.run.dump_rollouts) if cfg.run.dump_rollouts else None
    rewards = rl.rewards
    sampler = RoundSampler(
        prompt_tokens_ns, prompt_mask_ns,
        score=RoundScorer(items, tokenizer, score,
                          hack_detectors=rewards.hack_detectors, on_result=monitor.record,
                          max_tool_calls=rewards.max_tool_calls,
                          truncation_is_hack=rewards.truncation_is_hack),
        shape_rewards=RewardShaper(max_len=rl.max_new_tokens, overlong_cache_len=rewards.overlong_cache_len,
                                   overlong_coef=rewards.overlong_coef, hack_coef=rewards.hack_coef),
        sampling=SamplingConfig(rl.temperature, rl.top_p, rl.top_k),
        min_prompts=rl.prompts_per_step, episodes=episodes, items=items,
        on_episodes=None if dump is None else dump.record)
    all_hooks = (tracker, strategy, *methods, monitor, *((dump,) if dump is not None else ()))
    # The update: the KL term is in the loss for β > 0 or a hook's per-prompt KL weights.
    update = make_update(cfg, graphdef, params, kl_in_loss=kl_in_loss(cfg, all_hooks), mesh=mesh)
    holds_reference = needs_reference(cfg, all_hooks)
    # Held only when read: without it the caller can free the base model once RL starts.
    # With LoRA the params are the adapters and the reference is the base itself: the same
    # model with its adapters zeroed (no second copy of the base weights).
    if reference_params is None:
        reference_params = lora_off(params) if has_lora(model) else params
    reference_params = reference_params if holds_reference else None
    fns, hyper = update.fns, update.hyper

    def logprobs_of(policy_params):
        return lambda *inputs: fns.logprob_fn(policy_params, rest, *inputs, hyper.temperature)[0]

    def build(batch: Trajectory, estimator_state, policy_params):
        return build_batch(
            batch, update.estimator, estimator_state,
            behaviour_logprobs=None if cfg.loss.detach_behaviour else logprobs_of(policy_params),
            reference_logprobs=logprobs_of(reference_params) if holds_reference else None,
            step_credit_coef_n=None if rl.step_credit is None else rl.step_credit.coef_n())

    def train(train_state, batch: Trajectory, step: int):
        return update_on_batch(lambda s, b: fns.train_step(s, b, hyper, rest), train_state,
                               rollout_batch(batch), num_epochs=rl.num_epochs,
                               num_minibatches=rl.num_minibatches, seed=seed, step=step, mesh=mesh,
                               nonfinite_dir=workdir)

    checkpoints = RunCheckpoints(workdir, every=rl.checkpoint_every, max_to_keep=rl.max_to_keep,
                                 budget=rl.budget)

    def close() -> None:
        checkpoints.close()
        close_scorer()
        episodes.close()

    return Parts(cfg, workdir, graphdef, rest, update.initial_state, source, strategy, sampler, all_hooks,
                 update.estimator, update.loss_structure, hyper, build, train, checkpoints, close)
