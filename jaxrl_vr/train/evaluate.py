"""Per-prompt success counts of a policy: n samples per prompt, scored by the verifiers.

These counts feed the unbiased pass@k estimator (``jaxrl_vr.passk``) and the regime
report (``jaxrl_vr.eval.passk_report``). Prompts are processed in fixed-size chunks
(the last one padded by repetition) so the sampler compiles once.

``evaluate_policy`` is the resumable form used by ``experiments.evaluate``: chunk c's
sample block j draws with ``fold_in(fold_in(key, c), j)``, so a chunk's samples do not
depend on which chunks ran before it, and finished chunks live in a ``ChunkStore``
(an interrupted evaluation continues where it stopped and ends with the same numbers).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Callable, NamedTuple, Sequence

import jax
import numpy as np

from jaxrl_vr.eval.passk_eval import passk_scalars
from jaxrl_vr.hooks import Hook
from jaxrl_vr.layout import BASE_CALIBRATION, BASE_EVAL
from jaxrl_vr.train.config import PipelineConfig
from jaxrl_vr.envs import episodes as episodes_lib
from jaxrl_vr.envs.episodes import EpisodeRunner, Episodes
from jaxrl_vr.train.metrics import ProgressBar
from jaxrl_vr.train.rollout import encode_episode_prompts, episode_runner, make_scorer, single_turn_runner
from jaxrl_vr.train.workdir import cached_counts, digest
from jaxrl_vr.verifiers.pool import score_serial


def count_successes(
    model,
    tokenizer,
    items: Sequence,
    *,
    num_samples: int,
    max_new_tokens: int,
    key: jax.Array,
    temperature: float = 1.0,
    prompts_per_chunk: int = 16,
    prompt_width: int | None = None,
    chat: bool = False,
    system_prompt: str | None = None,
    scorer: Callable | None = None,
    success_threshold: float = 0.5,
    episodes: EpisodeRunner | None = None,
) -> dict:
    """Samples ``num_samples`` responses per item and counts the correct ones.

    Args:
      model: policy (Decoder).
      tokenizer: Tokenizer.
      items: TaskItems.
      num_samples: n per prompt.
      max_new_tokens: response cap.
      key: PRNG key (split per chunk).
      temperature: sampling temperature (1.0: the policy's own distribution).
      prompts_per_chunk: prompts per sampler call.
      prompt_width: fixed prompt width (default: the longest prompt).
      chat: wrap prompts in the chat template.
      system_prompt: system message of chat prompts (None = the template's default).
      scorer: ``score(items, completions) -> VerifyResult``; default in-process scoring.
      success_threshold: a sample counts as correct when its score is >= this.
      episodes: an `EpisodeRunner` for environment tasks (its final model turn is scored;
        lengths count model tokens); None = one-turn episodes of the prompts.

    Returns:
      {"counts": int64 [P] correct out of n, "n": n, "generated_tokens": int (model tokens),
       "statuses": {status: count}, "mean_length": float}, and for multi-turn episodes
      "episodes": ``episode_totals`` summed.
    """
    scorer = score_serial if scorer is None else scorer
    items = list(items)
    if not items:
        raise ValueError("count_successes needs at least one item.")
    episodes = _runner(episodes, tokenizer, max_new_tokens, chat, system_prompt)
    width = prompt_width or encode_episode_prompts(episodes, items)[0].shape[1]
    chunk = min(prompts_per_chunk, len(items))
    counts = np.zeros(len(items), np.int64)
    statuses: dict[str, int] = {}
    generated = 0
    lengths = []
    totals: dict = {}
    for start in range(0, len(items), chunk):
        part = items[start : start + chunk]
        real = len(part)
        part = part + [part[-1]] * (chunk - real)
        tokens_ps, mask_ps = encode_episode_prompts(episodes, part, width)
        key, sub = jax.random.split(key)
        sampled = _sample(sub, model, part, tokens_ps, mask_ps, num_samples=num_samples, temperature=temperature,
                          episodes=episodes)
        mask_bt = sampled.mask_bt[: real * num_samples]
        texts = sampled.texts[: real * num_samples]
        if episodes.multi_turn:
            for name, value in episode_totals(sampled.episodes, real * num_samples).items():
                totals[name] = totals.get(name, 0) + value
        result = scorer([it for it in part[:real] for _ in range(num_samples)], texts)
        ok = (np.asarray(result.scores) >= success_threshold).reshape(real, num_samples)
        counts[start : start + real] = ok.sum(axis=1)
        for s in result.statuses:
            statuses[s] = statuses.get(s, 0) + 1
        length_b = mask_bt.sum(axis=1)
        generated += int(length_b.sum())
        lengths.append(length_b)
    return {
        "counts": counts,
        "n": int(num_samples),
        "generated_tokens": generated,
        "statuses": statuses,
        "mean_length": float(np.concatenate(lengths).mean()),
        **({"episodes": totals} if totals else {}),
    }


class Sampled(NamedTuple):
    """One evaluation call's samples: the texts the verifier scores, the model's tokens
    (mask), their log-probs and truncation, B = P·n rows, and the episodes."""

    texts: list
    mask_bt: np.ndarray
    logp_bt: np.ndarray
    truncated_b: np.ndarray
    episodes: Episodes


def episode_totals(ep: Episodes, rows: int) -> dict:
    """Model turns, tool calls (made, parsed, run without error), environment tokens and
    errors summed over the first ``rows`` episodes."""
    ep = episodes_lib.head(ep, rows)
    counts = episodes_lib.tool_counts(ep)
    return {"episodes": rows, "turns": int(ep.turns_b.sum()), "tool_calls": counts["calls"],
            "tool_calls_valid": counts["valid"], "tool_calls_ok": counts["ok"],
            "env_tokens": int(ep.env_tokens_b.sum()), "env_errors": counts["errors"]}


def episode_rates(totals: dict) -> dict:
    """Per-episode and per-call rates of ``episode_totals`` (NaN-free: 0 without calls)."""
    n, calls = max(totals["episodes"], 1), max(totals["tool_calls"], 1)
    return {"turns_per_episode": totals["turns"] / n, "tool_calls_per_episode": totals["tool_calls"] / n,
            "tool_call_valid_rate": totals["tool_calls_valid"] / calls,
            "tool_call_ok_rate": totals["tool_calls_ok"] / calls, "env_errors": totals["env_errors"]}


def _runner(episodes, tokenizer, max_new_tokens, chat, system_prompt) -> EpisodeRunner:
    """``episodes``, or one-turn episodes of the prompts as they are (no environment)."""
    if episodes is not None:
        return episodes
    return single_turn_runner(tokenizer, max_new_tokens, chat=chat, system_prompt=system_prompt)


def _sample(key, model, items, tokens_ps, mask_ps, *, num_samples, temperature, episodes) -> Sampled:
    """Plays episodes; the verifier scores each one's final model turn."""
    ep = episodes.run(key, model, items, tokens_ps, mask_ps, num_samples=num_samples, temperature=temperature)
    return Sampled(list(ep.final_texts), ep.loss_mask_bt, ep.logp_bt, ep.truncated_b, ep)


def eval_runner(cfg: PipelineConfig, tokenizer) -> EpisodeRunner:
    """The evaluation's episode runner (``eval.max_new_tokens`` bounds an episode)."""
    return episode_runner(cfg, tokenizer, max_total_tokens=cfg.eval.max_new_tokens or cfg.rl.max_new_tokens)


SANDBOXED_VERIFIERS = ("code", "humaneval")  # verifiers that run the completion as a program


def evaluate_counts(model, tokenizer, items, cfg: PipelineConfig, seed_offset: int, *,
                    num_samples: int | None = None, step: int | None = None) -> dict:
    """``count_successes`` with the run's evaluation settings: ``num_samples`` (default
    eval.num_samples) per prompt, the key ``cfg.seed * 7919 + seed_offset`` (folded with
    ``step`` when given: one stream per RL step).

    Chunks hold about ``prompts_per_chunk * eval.num_samples`` responses whatever
    ``num_samples`` is, so a 256-sample calibration does not build a larger KV cache.
    """
    num_samples = num_samples or cfg.eval.num_samples
    responses_per_chunk = cfg.eval.prompts_per_chunk * cfg.eval.num_samples
    # Programs run in the verifier pool's worker processes: the sandbox forks, and forking
    # this process (JAX's threads) can deadlock. Answer checks stay in-process.
    sandboxed = any(it.verifier in SANDBOXED_VERIFIERS for it in items) and cfg.rl.verifier.workers > 0
    score, close = make_scorer(cfg.rl.verifier.workers if sandboxed else 0, cfg.rl.verifier.timeout_s)
    try:
        key = jax.random.key(cfg.seed * 7919 + seed_offset)
        key = key if step is None else jax.random.fold_in(key, int(step))
        return _evaluate_counts(model, tokenizer, items, cfg, key, num_samples, responses_per_chunk, score)
    finally:
        close()


def _evaluate_counts(model, tokenizer, items, cfg, key, num_samples, responses_per_chunk, score):
    return count_successes(
        model, tokenizer, items, num_samples=num_samples,
        max_new_tokens=cfg.eval.max_new_tokens or cfg.rl.max_new_tokens,
        key=key, temperature=cfg.eval.temperature,
        prompts_per_chunk=max(1, responses_per_chunk // num_samples), chat=cfg.model.chat,
        system_prompt=cfg.model.system_prompt, success_threshold=cfg.rl.success_threshold,
        episodes=eval_runner(cfg, tokenizer), scorer=score)


def cached_evaluation(path: str, key: dict, model, tokenizer, items, cfg: PipelineConfig,
                      seed_offset: int, num_samples: int | None = None) -> dict:
    """``evaluate_counts`` cached in ``path`` under the digest of ``key`` (what produced it)."""
    return cached_counts(path, digest(key), lambda: evaluate_counts(
        model, tokenizer, items, cfg, seed_offset, num_samples=num_samples))


# Seed offsets of the run's evaluations (``evaluate_counts``): base pass@k 1, final 2, PBA's
# calibration 3, the regimes' calibration 4, pairing's calibration 5, during training 6; the
# i-th set of task.eval_paths (i = 0, 1, ...) adds (i + 1) * EVAL_SET_SEED_SHIFT to 1, 2 and 4.
DURING_TRAINING_SEED_OFFSET = 6
EVAL_SET_SEED_SHIFT = 1000


def evaluate_during_training(model, tokenizer, items, cfg: PipelineConfig, step: int, codes_p) -> dict:
    """The policy after ``step`` RL steps on the held-out ``items``: eval.during_samples samples
    per prompt (key folded with the step, so a resumed run draws the same samples), as
    ``eval/pass@k`` for k = 1, 2, 4, …, n, per regime (``codes_p``) ``eval/<regime>/pass@1``
    and ``/pass@n``, with ``eval/samples``, ``eval/generated_tokens`` and ``eval/time_s``."""
    start = time.perf_counter()
    n = cfg.eval.during_samples
    result = evaluate_counts(model, tokenizer, items, cfg, DURING_TRAINING_SEED_OFFSET, num_samples=n, step=step)
    return {**passk_scalars(result["counts"], n, codes_p=codes_p), "eval/samples": float(n),
            "eval/generated_tokens": float(result["generated_tokens"]),
            "eval/time_s": time.perf_counter() - start}


class BaseEvaluation(NamedTuple):
    """The base policy before RL.

    Attributes:
      evaluation: its held-out counts from ``eval.num_samples`` samples each (pass@k;
        ``base_eval.json``).
      calibration: an independent held-out sample that assigns the regimes
        (``base_calibration.json``; ``{"generated_tokens": 0}`` when
        ``eval.base_calibration_samples`` is 0).
      regime_counts, regime_n: the counts and n the regimes come from.
      calibration_tokens: tokens sampled for the hooks' calibrations of the training prompts.
    """

    evaluation: dict
    calibration: dict
    regime_counts: np.ndarray
    regime_n: int
    calibration_tokens: float


def evaluate_base(model, tokenizer, data, cfg: PipelineConfig, workdir: str, base_key: str, *,
                  hooks: Sequence[Hook] = (), log=print, seed_shift: int = 0) -> BaseEvaluation:
    """The base's success counts, each cached in the workdir under what produced it: the
    held-out pass@k samples, the regimes' calibration, and the base samples of every training
    prompt that a hook asks for (``Hook.calibration``: PBA's p_base, pairing's rates), which
    the hook is handed (``Hook.calibrated``). ``seed_shift`` moves the held-out evaluations'
    seed offsets (an extra evaluation set's own streams, cached in its own directory)."""
    n, n_cal = cfg.eval.num_samples, cfg.eval.base_calibration_samples
    heldout = {"base": base_key, "items": [it.uid for it in data.heldout],
               **({"seed_shift": seed_shift} if seed_shift else {})}
    train = {"base": base_key, "items": [it.uid for it in data.train],
             "T": cfg.eval.max_new_tokens or cfg.rl.max_new_tokens}
    # (what for, file, cache key, items, seed offset, samples per prompt)
    requests = [("pass@k", BASE_EVAL, {**heldout, "n": n}, data.heldout, 1 + seed_shift, n)]
    if n_cal > 0:  # else the regimes come from the pass@k samples
        requests.append(("regimes", BASE_CALIBRATION, {**heldout, "n_cal": n_cal}, data.heldout,
                         4 + seed_shift, n_cal))
    for hook in hooks:
        if hook.calibration is not None:
            request = hook.calibration
            requests.append((hook, request.file, {**train, "n": request.samples}, data.train,
                             request.seed_offset, request.samples))
    results, calibration_tokens = [], 0.0
    for purpose, name, key, items, seed_offset, samples in requests:
        log(f"[base] {len(items)} prompts × {samples} samples ({name})")
        result = cached_evaluation(os.path.join(workdir, name), key, model, tokenizer, items, cfg,
                                   seed_offset, num_samples=samples)
        results.append(result)
        if isinstance(purpose, Hook):
            calibration_tokens += float(result.get("generated_tokens", 0.0))
            purpose.calibrated(np.full(len(items), samples), np.asarray(result["counts"], np.int64))
    evaluation = results[0]
    calibration = results[1] if n_cal > 0 else {"generated_tokens": 0}
    regime_counts, regime_n = (calibration["counts"], n_cal) if n_cal > 0 else (evaluation["counts"], n)
    return BaseEvaluation(evaluation, calibration, regime_counts, regime_n, calibration_tokens)


class PromptStats(NamedTuple):
    """Per-prompt sums over a policy's n samples (host NumPy).

    Attributes:
      counts_p: int64 [P] correct samples.
      length_sum_p: int64 [P] response tokens (including the stop token) over all samples.
      neg_logp_sum_p: float64 [P] Σ −log π_T(y_t | prefix) over those tokens (the tempered
        policy they were drawn from); divided by ``length_sum_p`` it is a Monte-Carlo
        estimate of the per-token entropy at the evaluation temperature T.
      truncated_p: int64 [P] samples that hit ``max_new_tokens`` without a stop token.
    """

    counts_p: np.ndarray
    length_sum_p: np.ndarray
    neg_logp_sum_p: np.ndarray
    truncated_p: np.ndarray


class EvalLayout(NamedTuple):
    """How n samples of P prompts are cut into sampler calls (part of the fingerprint)."""

    prompts_per_chunk: int  # prompts of one chunk (the last chunk is padded by repetition)
    samples_per_call: int  # samples per prompt of one sampler call (divides n)
    num_chunks: int


def eval_layout(num_prompts: int, num_samples: int, *, responses_per_call: int = 640) -> EvalLayout:
    """Chunks of about ``responses_per_call`` responses; n is split when it exceeds that."""
    if num_prompts < 1 or num_samples < 1 or responses_per_call < 1:
        raise ValueError(
            f"need num_prompts, num_samples, responses_per_call >= 1, got {num_prompts}, "
            f"{num_samples}, {responses_per_call}."
        )
    per_call = max(d for d in range(1, min(num_samples, responses_per_call) + 1) if num_samples % d == 0)
    prompts = min(num_prompts, max(1, responses_per_call // num_samples))
    return EvalLayout(prompts, per_call, -(-num_prompts // prompts))


class PolicyEval(NamedTuple):
    """Result of ``evaluate_policy``: per-prompt sums and whether every chunk is done."""

    stats: PromptStats | None  # None until complete
    num_samples: int
    chunks_done: int
    num_chunks: int
    chunks_computed: int  # chunks sampled by this call (the rest came from the store)

    @property
    def complete(self) -> bool:
        return self.chunks_done == self.num_chunks


def _sample_chunk(model, tokenizer, items, *, layout, num_samples, max_new_tokens, key, temperature,
                  prompt_width, chat, scorer, success_threshold, episodes=None) -> dict:
    real = len(items)
    padded = items + [items[-1]] * (layout.prompts_per_chunk - real)
    tokens_ps, mask_ps = encode_episode_prompts(episodes, padded, prompt_width)
    per_call = layout.samples_per_call
    counts = np.zeros(real, np.int64)
    length_sum = np.zeros(real, np.int64)
    neg_logp_sum = np.zeros(real, np.float64)
    truncated = np.zeros(real, np.int64)
    for block in range(num_samples // per_call):
        sampled = _sample(jax.random.fold_in(key, block), model, padded, tokens_ps, mask_ps,
                          num_samples=per_call, temperature=temperature, episodes=episodes)
        keep = real * per_call
        mask_bt = sampled.mask_bt[:keep]
        logp_bt = np.asarray(sampled.logp_bt, np.float64)[:keep]
        texts = sampled.texts[:keep]
        result = scorer([it for it in items for _ in range(per_call)], texts)
        ok_pg = (np.asarray(result.scores) >= success_threshold).reshape(real, per_call)
        counts += ok_pg.sum(axis=1)
        length_sum += mask_bt.sum(axis=1).reshape(real, per_call).sum(axis=1)
        neg_logp_sum += -np.where(mask_bt, logp_bt, 0.0).sum(axis=1).reshape(real, per_call).sum(axis=1)
        truncated += sampled.truncated_b[:keep].reshape(real, per_call).sum(axis=1)
    return {"counts": counts, "length_sum": length_sum, "neg_logp_sum": neg_logp_sum, "truncated": truncated}


def evaluate_policy(
    model,
    tokenizer,
    items: Sequence,
    *,
    num_samples: int,
    max_new_tokens: int,
    key: jax.Array,
    temperature: float = 1.0,
    layout: EvalLayout | None = None,
    prompt_width: int | None = None,
    chat: bool = False,
    scorer: Callable | None = None,
    success_threshold: float = 0.5,
    store=None,
    max_chunks: int | None = None,
    progress: bool = False,
    desc: str = "eval",
    episodes: EpisodeRunner | None = None,
) -> PolicyEval:
    """n samples per prompt, chunked and resumable; per-prompt counts, lengths, entropy.

    Args:
      model, tokenizer, items: the policy and the prompts (TaskItems).
      num_samples: n per prompt.
      max_new_tokens: response cap.
      key: PRNG key of this evaluation (chunk c, sample block j use fold_in(fold_in(key, c), j)).
      temperature: sampling temperature.
      layout: chunking (default ``eval_layout(len(items), num_samples)``); results depend
        on it, so keep it in the store's fingerprint.
      prompt_width: fixed prompt width (default: the longest prompt).
      chat: wrap prompts in the chat template.
      scorer: ``score(items, completions) -> VerifyResult``; default in-process scoring.
      success_threshold: a sample is correct when its score is >= this.
      store: optional ``jaxrl_vr.eval.ChunkStore``: finished chunks are read from it and
        new ones written to it.
      max_chunks: compute at most this many new chunks, then return (incomplete).
      progress: show progress over chunks on stderr (a bar on a terminal, plain lines otherwise).
      desc: the bar's label.
      episodes: an `EpisodeRunner` for environment tasks (``count_successes``).

    Returns:
      PolicyEval; ``stats`` is None while chunks are missing.
    """
    scorer = score_serial if scorer is None else scorer
    items = list(items)
    if not items:
        raise ValueError("evaluate_policy needs at least one item.")
    layout = layout or eval_layout(len(items), num_samples)
    if num_samples % layout.samples_per_call:
        raise ValueError(f"layout.samples_per_call={layout.samples_per_call} must divide n={num_samples}.")
    episodes = _runner(episodes, tokenizer, max_new_tokens, chat, None)
    width = prompt_width or encode_episode_prompts(episodes, items)[0].shape[1]
    done = store.done() if store is not None else set()
    results: dict[int, dict] = {}
    todo = [c for c in range(layout.num_chunks) if c not in done]
    if max_chunks is not None:
        todo = todo[: max(0, int(max_chunks))]
    # A bar on a terminal; without one (a log file) a plain line every 10 chunks or 30 s.
    bar = ProgressBar(layout.num_chunks, initial=len(done & set(range(layout.num_chunks))),
                      desc=desc, unit="chunk", disable=not progress, file=sys.stderr)
    try:
        for chunk in todo:
            part = items[chunk * layout.prompts_per_chunk : (chunk + 1) * layout.prompts_per_chunk]
            result = _sample_chunk(
                model, tokenizer, part, layout=layout, num_samples=num_samples,
                max_new_tokens=max_new_tokens, key=jax.random.fold_in(key, chunk),
                temperature=temperature, prompt_width=width, chat=chat, scorer=scorer,
                success_threshold=success_threshold, episodes=episodes,
            )
            if store is not None:
                store.save(chunk, result)
            results[chunk] = result
            bar.update({})
    finally:
        bar.close()
    finished = done | set(results)
    if len(finished) < layout.num_chunks:
        return PolicyEval(None, num_samples, len(finished), layout.num_chunks, len(results))
    parts = [results[c] if c in results else store.load(c) for c in range(layout.num_chunks)]
    stats = PromptStats(
        counts_p=np.concatenate([p["counts"] for p in parts]).astype(np.int64),
        length_sum_p=np.concatenate([p["length_sum"] for p in parts]).astype(np.int64),
        neg_logp_sum_p=np.concatenate([p["neg_logp_sum"] for p in parts]).astype(np.float64),
        truncated_p=np.concatenate([p["truncated"] for p in parts]).astype(np.int64),
    )
    return PolicyEval(stats, num_samples, layout.num_chunks, layout.num_chunks, len(results))
