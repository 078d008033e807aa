"""Rounds: prompts in, scored trajectories out (sampler → decode → verifiers → rewards).

* ``encode_prompts`` / ``decode_responses``: text ↔ token ids at a fixed width.
* ``make_scorer``: the verifier pool (or in-process scoring) as ``score(items, texts)``.
* ``RoundScorer``: decodes a round's responses, scores them, runs the hack detectors and
  reports every verifier result to the ``VerifierMonitor``.
* ``RewardShaper``: R = R_verifier − λ_len·P_overlong − λ_hack·P_hack (SPEC §5, the
  formulas in ``jaxrl_vr.rewards``), each term kept per sample.
* ``RoundSampler``: ``for_step(model, key)`` gives one RL step's ``sample_round(prompt_idx,
  num_samples) -> Trajectory`` (what batch strategies call) and keeps every round it made
  (``sampled()``: what the tracker and the metrics see). A round is a batch of episodes
  (``jaxrl_vr.envs``): a single-turn task is the one-turn case of the same runner.
* ``VerifierMonitor``: logs verifier errors per step and stops a run whose verifier is broken.
"""

from __future__ import annotations

import json
import os
import time
from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_vr import atomic, layout
from jaxrl_vr import rewards as rewards_lib
from jaxrl_vr import trajectory as traj_lib
from jaxrl_vr.envs import episodes as episodes_lib
from jaxrl_vr.envs.episodes import EpisodeLimits, EpisodeRunner
from jaxrl_vr.envs.library import make_env_factory
from jaxrl_vr.envs.render import Renderer
from jaxrl_vr.envs.tools import make_tool
from jaxrl_vr.hooks import Hook
from jaxrl_vr.sampling import generate
from jaxrl_vr.trajectory import RolloutStats, Trajectory
from jaxrl_vr.verifiers import pool as pool_lib
from jaxrl_vr.envs.signals import episode_signals
from jaxrl_vr.verifiers.hacks import DETECTORS, EPISODE_DETECTORS, episode_hack_flags, hack_penalties

__all__ = ["RewardShaper", "RolloutDump", "RoundSampler", "RoundScorer", "SamplingConfig", "VerifierFailure",
           "VerifierMonitor", "decode_responses", "encode_episode_prompts", "encode_prompts", "episode_runner",
           "make_scorer", "single_turn_runner",
           "render_prompt_text"]


def render_prompt_text(tokenizer, text: str, *, chat: bool = False,
                       system_prompt: str | None = None) -> str:
    """The prompt as the model sees it: the text, or the chat template's rendering of it as
    the user turn (after ``system_prompt``; None = the template's own default)."""
    if not chat:
        return text
    messages = ([{"role": "system", "content": system_prompt}] if system_prompt else [])
    messages.append({"role": "user", "content": text})
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True)


def encode_prompts(
    tokenizer, prompts: Sequence[str], width: int | None = None, *, chat: bool = False,
    system_prompt: str | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded int32 [P, S] token ids (BOS first) and bool mask; S = ``width`` or longest."""
    rows = []
    for text in prompts:
        text = render_prompt_text(tokenizer, text, chat=chat, system_prompt=system_prompt)
        # A chat template already starts with its own BOS-like header.
        rows.append(tokenizer.encode(text, add_bos=tokenizer.bos_id is not None and not chat))
    longest = max(len(r) for r in rows)
    width = longest if width is None else width
    if longest > width:
        raise ValueError(
            f"a prompt has {longest} tokens but the prompt width is {width}; raise "
            "the width (it is fixed so shapes never change)."
        )
    return left_pad(rows, width, tokenizer.pad_id or 0)


def left_pad(rows: Sequence[Sequence[int]], width: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """int32 [N, width] ids right-aligned (left-padded with ``pad_id``) and their bool mask."""
    tokens = np.full((len(rows), width), pad_id, np.int32)
    mask = np.zeros((len(rows), width), bool)
    for i, ids in enumerate(rows):
        if len(ids):
            tokens[i, width - len(ids):] = ids
            mask[i, width - len(ids):] = True
    return tokens, mask


def decode_responses(tokenizer, tokens_bt: np.ndarray, mask_bt: np.ndarray) -> list[str]:
    """Response texts (special tokens such as EOS dropped)."""
    return [
        tokenizer.decode([int(t) for t, m in zip(row, row_mask) if m])
        for row, row_mask in zip(tokens_bt, mask_bt)
    ]


def make_scorer(num_workers: int, timeout_s: float):
    """(score(items, completions) -> VerifyResult, close())."""
    if num_workers <= 0:
        return pool_lib.score_serial, lambda: None
    verifier_pool = pool_lib.VerifierPool(num_workers=num_workers, timeout_s=timeout_s)
    return verifier_pool.score, verifier_pool.close


# ------------------------------------------------------------------------- environments


def episode_runner(cfg, tokenizer, *, max_total_tokens: int | None = None,
                   generate_fn: Callable = generate) -> EpisodeRunner:
    """The run's `EpisodeRunner` (``task.env``, ``task.tools``, the turn and token bounds;
    ``max_total_tokens`` default rl.max_new_tokens). Fails at start-up for an unknown tool
    or environment and for a chat template that cannot render a tool turn."""
    task, rl = cfg.task, cfg.rl
    total = int(max_total_tokens or rl.max_new_tokens)
    tools = [make_tool(name) for name in task.tools]
    factory = make_env_factory(task.env.name, task.env.settings, tools)
    renderer = Renderer(tokenizer, chat=cfg.model.chat, system_prompt=cfg.model.system_prompt,
                        model_name=f"model.source={cfg.model.source} {cfg.model.path}".strip())
    limits = EpisodeLimits(max_turns=task.max_turns, max_turn_tokens=min(task.max_turn_tokens or total, total),
                           max_total_tokens=total, max_observation_tokens=task.max_observation_tokens)
    return EpisodeRunner(factory, renderer, limits, eos_ids=(tokenizer.eos_id,), pad_id=tokenizer.pad_id or 0,
                         generate_fn=generate_fn)


def single_turn_runner(tokenizer, max_new_tokens: int, *, chat: bool = False, system_prompt: str | None = None,
                       eos_ids: Sequence[int] | None = None, generate_fn: Callable = generate) -> EpisodeRunner:
    """An `EpisodeRunner` of one-turn episodes (``SingleTurnEnv``): the prompt, one answer.
    ``eos_ids`` default the tokenizer's EOS; () never stops before ``max_new_tokens``."""
    limits = EpisodeLimits(max_turns=1, max_turn_tokens=max_new_tokens, max_total_tokens=max_new_tokens)
    return EpisodeRunner(make_env_factory("single_turn"), Renderer(tokenizer, chat=chat, system_prompt=system_prompt),
                         limits, eos_ids=(tokenizer.eos_id,) if eos_ids is None else tuple(eos_ids), pad_id=tokenizer.pad_id or 0,
                         generate_fn=generate_fn)


def encode_episode_prompts(runner: EpisodeRunner, items: Sequence, width: int | None = None
                           ) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded int32 [P, S] ids and bool mask of each item's opening messages."""
    rows = [runner.renderer.prompt_ids(runner.opening(it)) for it in items]
    longest = max(len(r) for r in rows)
    width = longest if width is None else width
    if longest > width:
        raise ValueError(f"a prompt has {longest} tokens but the prompt width is {width}.")
    return left_pad(rows, width, runner.pad_id)


class RolloutDump(Hook):
    """``run.dump_rollouts=N``: the first N episodes of each step to
    ``WORKDIR/rollouts/step_<S>.jsonl`` (``envs.episodes.episode_records``' objects: ids,
    loss mask, segments, tool calls, reward and its terms), written when the step ends."""

    def __init__(self, workdir: str, tokenizer, limit: int):
        self.directory = os.path.join(workdir, layout.ROLLOUTS)
        self.tokenizer, self.limit = tokenizer, int(limit)
        self.step, self.records = 0, []

    def begin_step(self, step: int) -> None:
        self.step, self.records = step, []

    def record(self, prompt_idx_b, prompt_tokens_ps, prompt_mask_ps, num_g, ep, traj: Trajectory) -> None:
        room = self.limit - len(self.records)
        if room <= 0:
            return
        prompt_ids = [prompt_tokens_ps[b // num_g][prompt_mask_ps[b // num_g]] for b in range(min(room, len(ep.final_texts)))]
        terms = {"verifier": traj.scores_b, "overlong": traj.overlong_b, "hack": traj.hack_b}
        self.records += episodes_lib.episode_records(ep, self.tokenizer, prompt_ids, traj.rewards_b, terms, room)

    def after_step(self, step: int) -> None:
        if self.records:
            os.makedirs(self.directory, exist_ok=True)
            text = "".join(json.dumps(r) + "\n" for r in self.records)
            atomic.write_text(os.path.join(self.directory, f"step_{step}.jsonl"), text)


# --------------------------------------------------------------------- verifier monitor


class VerifierFailure(RuntimeError):
    """Too many verifier errors for too many steps in a row (the verifier is broken)."""


class VerifierMonitor(Hook):
    """Writes each step's first verifier errors to ``verifier_errors.jsonl`` and stops the
    run (``VerifierFailure``, after the step is saved) when at least ``error_fraction`` of
    a step's samples raise for ``error_patience`` steps in a row."""

    def __init__(self, workdir: str, *, error_fraction: float, error_patience: int):
        self.path = os.path.join(workdir, layout.VERIFIER_ERRORS)
        self.stop = pool_lib.ErrorStop(error_fraction, error_patience, path=self.path)
        self.log, self.step, self.failed = None, 0, False

    def begin_step(self, step: int) -> None:
        if self.log is None:  # the first step of this process: drop rows a resume replays
            self.log = pool_lib.ErrorLog(self.path, resume_step=step)
        self.step = step

    def record(self, items, completions, result) -> None:
        if self.log is not None:
            self.log.record(self.step, items, completions, result)

    def observe(self, sampled: Trajectory) -> None:
        self.failed = self.stop.update(int(sampled.stats.verifier_errors),
                                       int(sampled.stats.generated_samples))

    def after_step(self, step: int) -> None:
        if self.failed:
            raise VerifierFailure(self.stop.message)


# ------------------------------------------------------------------- scoring and shaping


class Scores(NamedTuple):
    """A round's verifier scores [B], hack flags [B] (None when no detector runs) and counts;
    int32 [B] unit tests passed / run (0 / 0 where the verifier reports no per-test results;
    None from a scorer that keeps none)."""

    scores_b: np.ndarray
    hack_b: np.ndarray | None
    stats: RolloutStats
    tests_passed_b: np.ndarray | None = None
    tests_total_b: np.ndarray | None = None


class RoundScorer:
    """``score(prompt_idx_b, completions, truncated_b) -> Scores``.

    Scores the completions (each episode's final model turn) with ``scorer(items, completions)`` (a VerifierPool's
    ``score`` or ``score_serial``), runs the enabled hack detectors (``hack_b`` = 1 where
    any fired) and hands every verifier result to ``on_result`` (the verifier monitor).
    ``episodes`` does the same for environment episodes, with the episode detectors
    (``hacks.EPISODE_DETECTORS``, ``max_tool_calls`` for ``tool_spam``) too.
    ``truncation_is_hack``: ``empty_or_truncated`` also fires on every truncated answer.
    """

    def __init__(self, items: Sequence, tokenizer, scorer: Callable, *,
                 hack_detectors: Sequence[str] = (), on_result: Callable | None = None, max_tool_calls: int = 4,
                 truncation_is_hack: bool = False):
        self.items, self.tokenizer, self.scorer = list(items), tokenizer, scorer
        self.hack_detectors, self.on_result = tuple(hack_detectors), on_result
        self.max_tool_calls, self.truncation_is_hack = int(max_tool_calls), bool(truncation_is_hack)

    def __call__(self, prompt_idx_b, completions: Sequence[str], truncated_b, *, turn_records=None) -> Scores:
        """Scores completions (each episode's final model turn); with ``turn_records`` (per
        episode, its ``TurnRecord``s) the episode detectors run too."""
        completions = list(completions)
        items_b = [self.items[i] for i in prompt_idx_b]
        result = self.scorer(items_b, completions)
        if self.on_result is not None:
            self.on_result(items_b, completions, result)
        statuses = list(result.statuses)
        hack_b, counts = None, ()
        text_detectors = [d for d in self.hack_detectors if d in DETECTORS]
        episode_detectors = [d for d in self.hack_detectors if d in EPISODE_DETECTORS]
        if episode_detectors and turn_records is None:
            raise ValueError(f"hack detectors {episode_detectors} read episodes; this task has none "
                             "(set task.env=tools or drop them from rl.rewards.hack_detectors).")
        if self.hack_detectors:
            prompts, golds = [it.prompt for it in items_b], [it.answer for it in items_b]
            hack_b, flags = hack_penalties(prompts, completions, truncated_b=truncated_b, golds=golds,
                                           enabled=text_detectors, truncation_is_hack=self.truncation_is_hack)
            if episode_detectors:
                flags.update(episode_hack_flags(turn_records, prompts, golds, enabled=episode_detectors,
                                                max_tool_calls=self.max_tool_calls))
                for fired in flags.values():
                    hack_b = np.maximum(hack_b, fired.astype(np.float32))
            counts = tuple(sorted((name, float(np.sum(fired))) for name, fired in flags.items()))
        tests_passed_b, tests_total_b = result.test_counts()
        tested_b = tests_total_b > 0
        stats = RolloutStats(verifier_errors=float(statuses.count("error")),
                             verifier_timeouts=float(statuses.count("timeout")),
                             verifier_unparsable=float(statuses.count("unparsable")),
                             tested_samples=float(tested_b.sum()),
                             test_frac_sum=float(np.sum(tests_passed_b[tested_b] / tests_total_b[tested_b])),
                             detector_counts=counts)
        return Scores(np.asarray(result.scores, np.float32), hack_b, stats, tests_passed_b, tests_total_b)

    def environment_errors(self, prompt_idx_b, completions: Sequence[str], errors: Sequence[str | None]) -> None:
        """Hands the episodes an environment ended with an error (raised, hung, returned
        non-text) to ``on_result``, so they are logged like verifier errors."""
        rows = [b for b, error in enumerate(errors) if error is not None]
        if rows and self.on_result is not None:
            result = pool_lib.VerifyResult(np.zeros(len(rows), np.float32), ["error"] * len(rows),
                                           [f"environment: {errors[b]}" for b in rows])
            self.on_result([self.items[prompt_idx_b[b]] for b in rows], [completions[b] for b in rows], result)


class RewardShaper:
    """``(scores_b, length_b, hack_b) -> (rewards_b, overlong_b, hack_term_b)``: the reward
    and its penalty terms −λ_len·P_overlong and −λ_hack·P_hack (``rewards.total_reward``)."""

    def __init__(self, *, max_len: int, overlong_cache_len: int = 0, overlong_coef: float = 1.0,
                 hack_coef: float = 0.0):
        self.max_len, self.overlong_cache_len = max_len, overlong_cache_len
        self.overlong_coef, self.hack_coef = overlong_coef, hack_coef

    def __call__(self, scores_b, length_b, hack_b):
        overlong_b = None
        if self.overlong_cache_len > 0:
            overlong_b = rewards_lib.overlong_penalty(jnp.asarray(length_b), max_len=self.max_len,
                                                      cache_len=self.overlong_cache_len)
        reward_b, terms = rewards_lib.total_reward(
            jnp.asarray(scores_b), overlong_b=overlong_b,
            hack_b=None if self.hack_coef == 0 or hack_b is None else jnp.asarray(hack_b),
            len_coef=self.overlong_coef, hack_coef=self.hack_coef)
        return (np.asarray(reward_b, np.float32), np.asarray(terms["overlong"], np.float32),
                np.asarray(terms["hack"], np.float32))


# ------------------------------------------------------------------------- the sampler


class SamplingConfig(NamedTuple):
    """How tokens are drawn in a round (the token bounds, stop ids and padding belong to the
    `EpisodeRunner`)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0


class RoundSampler:
    """Samples and scores rounds of the training prompts (tokenized once).

    Args:
      prompt_tokens_ns, prompt_mask_ns: every training prompt, left-padded to one width.
      score: ``RoundScorer`` (or any callable with its signature).
      shape_rewards: ``RewardShaper`` (or any callable with its signature).
      sampling: SamplingConfig.
      min_prompts: a round with fewer prompts is padded (by repeating its last prompt) to
        ``min(min_prompts, next power of two)`` rows for the sampler, so partial rounds
        compile for O(log P) shapes; padding rows never reach scoring or the budget.
      episodes: the `EpisodeRunner` that plays a round (single-turn tasks are one-turn
        episodes; its ``generate_fn`` is a stub in tests).
      items: the training TaskItems (what the environments are reset with).
      on_episodes: called with each round's episodes (the rollout dump).
    """

    def __init__(self, prompt_tokens_ns, prompt_mask_ns, *, score: Callable, shape_rewards: Callable,
                 sampling: SamplingConfig, min_prompts: int, episodes: EpisodeRunner, items: Sequence,
                 on_episodes: Callable | None = None):
        self.prompt_tokens_ns, self.prompt_mask_ns = prompt_tokens_ns, prompt_mask_ns
        self.score, self.shape_rewards, self.sampling = score, shape_rewards, sampling
        self.min_prompts = int(min_prompts)
        self.episodes, self.items, self.on_episodes = episodes, list(items), on_episodes

    def for_step(self, model, key: jax.Array) -> "StepRounds":
        """The round sampler of one RL step: this policy, keys split from ``key``."""
        return StepRounds(self, model, key)

    def sample(self, model, key: jax.Array, prompt_idx: np.ndarray, num_samples: int) -> Trajectory:
        """G = ``num_samples`` scored samples of each prompt in ``prompt_idx``."""
        idx = np.asarray(prompt_idx, np.int64).reshape(-1)
        num_real, num_g = idx.shape[0], int(num_samples)
        num_rows = min(max(self.min_prompts, num_real), 1 << max(num_real - 1, 0).bit_length())
        rows = np.concatenate([idx, np.repeat(idx[-1:], num_rows - num_real)])
        prompt_tokens_ps, prompt_mask_ps = self.prompt_tokens_ns[rows], self.prompt_mask_ns[rows]
        t0 = time.perf_counter()
        return self._sample_episodes(model, key, idx, rows, prompt_tokens_ps, prompt_mask_ps, num_g, t0)

    def _sample_episodes(self, model, key, idx, rows, prompt_tokens_ps, prompt_mask_ps, num_g, t0) -> Trajectory:
        """``sample`` for environment episodes: the final model turn is what the verifier
        scores (unless the environment gave the reward); environment errors score 0."""
        s = self.sampling
        ep = self.episodes.run(key, model, [self.items[i] for i in rows], prompt_tokens_ps, prompt_mask_ps,
                               num_samples=num_g, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k)
        real = idx.shape[0] * num_g
        ep = episodes_lib.head(ep, real)
        t1 = time.perf_counter()
        prompt_idx_b = np.repeat(idx, num_g)
        multi_turn = self.episodes.multi_turn
        scored = (self.score(prompt_idx_b, ep.final_texts, ep.truncated_b, turn_records=ep.turn_records)
                  if multi_turn else self.score(prompt_idx_b, ep.final_texts, ep.truncated_b))
        if hasattr(self.score, "environment_errors"):
            self.score.environment_errors(prompt_idx_b, ep.final_texts, ep.errors)
        scores_b = np.asarray(scored.scores_b, np.float32).copy()
        for b in range(real):
            if ep.errors[b] is not None:
                scores_b[b] = 0.0
            elif ep.rewards[b] is not None:
                scores_b[b] = ep.rewards[b]
        rewards_b, overlong_b, hack_b = self.shape_rewards(scores_b, ep.model_tokens_b, scored.hack_b)
        t2 = time.perf_counter()
        counts = episodes_lib.tool_counts(ep)
        stats = scored.stats + RolloutStats(
            generated_tokens=float(ep.model_tokens_b.sum()), generated_samples=float(real), rounds=1,
            sample_s=t1 - t0, verify_s=t2 - t1, verifier_errors=float(counts["errors"]),
            env_tokens=float(ep.env_tokens_b.sum()), turns=float(ep.turns_b.sum()),
            tool_calls=float(counts["calls"]), tool_calls_valid=float(counts["valid"]),
            tool_calls_ok=float(counts["ok"]), env_errors=float(counts["errors"]))
        num_real = idx.shape[0]
        traj = Trajectory.single_turn(
            prompt_idx_p=idx, prompt_tokens_ps=prompt_tokens_ps[:num_real], prompt_mask_ps=prompt_mask_ps[:num_real],
            tokens_bt=ep.tokens_bt, mask_bt=ep.token_mask_bt, sampler_logp_bt=ep.logp_bt, length_b=ep.length_b,
            truncated_b=ep.truncated_b, scores_b=scores_b, rewards_b=rewards_b, overlong_b=overlong_b,
            hack_b=hack_b, tests_passed_b=scored.tests_passed_b,
            tests_total_b=scored.tests_total_b, stats=stats)
        traj = traj._replace(loss_mask_bt=ep.loss_mask_bt.copy())
        if multi_turn:  # per-turn signals for step-level credit (single-turn rounds have none)
            signals_bkn, turn_bt = episode_signals(ep, self.episodes.limits.max_turns)
            traj = traj._replace(turn_bt=turn_bt, signals_bkn=signals_bkn)
        if self.on_episodes is not None:
            self.on_episodes(prompt_idx_b, prompt_tokens_ps, prompt_mask_ps, num_g, ep, traj)
        return traj


class StepRounds:
    """One RL step's rounds: ``sample_round`` for the batch strategy; ``sampled()`` joins
    every round it made (groups widened to the largest G)."""

    def __init__(self, sampler: RoundSampler, model, key: jax.Array):
        self.sampler, self.model, self.key = sampler, model, key
        self.rounds: list[Trajectory] = []

    def sample_round(self, prompt_idx: np.ndarray, num_samples: int) -> Trajectory:
        self.key, sub = jax.random.split(self.key)
        round_ = self.sampler.sample(self.model, sub, prompt_idx, num_samples)
        self.rounds.append(round_)
        return round_

    def sampled(self) -> Trajectory:
        """Every sample of the step as one trajectory."""
        if not self.rounds:
            raise ValueError("the batch strategy sampled no round this step.")
        width = max(r.group_size for r in self.rounds)
        return traj_lib.concat_groups([traj_lib.widen(r, width) for r in self.rounds])

