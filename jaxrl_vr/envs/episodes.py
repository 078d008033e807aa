"""The episode runner: environments and the multi-turn sampler, tokens in, tokens out.

``EpisodeRunner.run`` plays B = P·G episodes at once. Each turn, every live row samples on
the shared KV cache (`jaxrl_vr.sampling.multiturn`) until EOS, a stop string of its
environment (the end of a tool call) or the turn cap; the environments answer the rows
that stopped at a stop string (in a thread pool: tools wait on sandbox processes); their
observations are rendered as template deltas (`Renderer.observation_ids`) and appended to
the cache; rows whose episode ended stay frozen. The result is the conversation after the
prompt as token ids with two masks: every token (attended to) and the model's own tokens
(trained on, with their sampler log-probs); environment and template tokens get loss mask 0.

Bounds: ``max_turns`` model turns, ``max_turn_tokens`` per turn, ``max_total_tokens``
after the prompt (model and environment tokens together), ``max_observation_tokens`` per
observation's content (cut, with a note). A row that hits a token bound is truncated.

Bad environments never stop the run: one that raises, hangs past ``step_timeout_s`` or
returns something other than text messages ends its episode with the error recorded (the
sample scores 0 and counts as a verifier error, so a systemic failure stops the run the
way a broken verifier does).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import numpy as np

from jaxrl_vr.envs.base import StepResult
from jaxrl_vr.envs.library import SingleTurnEnv
from jaxrl_vr.envs.render import Renderer
from jaxrl_vr.sampling import generate
from jaxrl_vr.sampling import multiturn as mt
from jaxrl_vr.sampling.sampler import round_up

__all__ = ["EpisodeLimits", "EpisodeRunner", "Episodes", "TurnRecord"]


@dataclasses.dataclass(frozen=True)
class EpisodeLimits:
    """Bounds of an episode (``task.max_turns`` etc.).

    Attributes:
      max_turns: model turns (1 = single turn).
      max_turn_tokens: tokens per model turn.
      max_total_tokens: tokens after the prompt, model and environment together (the
        trajectory's width T).
      max_observation_tokens: tokens of one observation's content (longer ones are cut).
      step_timeout_s: an environment step taking longer ends the episode with an error.
    """

    max_turns: int = 1
    max_turn_tokens: int = 16
    max_total_tokens: int = 16
    max_observation_tokens: int = 64
    step_timeout_s: float = 30.0

    def __post_init__(self):
        for name in ("max_turns", "max_turn_tokens", "max_total_tokens", "max_observation_tokens"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"task.{name}={getattr(self, name)} must be >= 1.")
        if self.max_turn_tokens > self.max_total_tokens:
            raise ValueError(f"task.max_turn_tokens={self.max_turn_tokens} exceeds task.max_total_tokens="
                             f"{self.max_total_tokens}; a turn cannot be longer than the episode.")


class TurnRecord(NamedTuple):
    """One model turn of an episode, for step-level signals and hack detectors.

    Attributes:
      text: the turn's text as decoded (stop string included, special tokens dropped).
      tool_calls: the tool calls the environment answered this turn with (empty for a
        final answer, a cut turn, or a step that failed).
      info: the environment's ``StepResult.info`` for this turn ({} when it did not step);
        a code environment reports a fraction of tests passed here (``tests_passed``).
    """

    text: str
    tool_calls: tuple = ()
    info: Mapping[str, Any] = {}


class Episodes(NamedTuple):
    """B episodes (row b = p·G + g) after their prompts; host arrays, width T = max_total_tokens.

    Attributes:
      tokens_bt: int32 every token after the prompt (model and environment), right-padded.
      token_mask_bt: bool tokens that exist.
      loss_mask_bt: bool tokens the model sampled.
      logp_bt: float32 the sampler's log-probs (0 off the loss mask).
      length_b: int32 tokens after the prompt.
      truncated_b: bool a token bound cut the episode.
      final_texts: the model's last turn per row (what the task's verifier scores).
      rewards: the environment's own reward per row, or None (the verifier scores it).
      errors: the environment's error per row, or None.
      turns_b, model_tokens_b, env_tokens_b: int32 model turns and tokens of each kind.
      tool_calls: per row, the ToolCalls in order.
      segments: per row, (role "model" | "env", start, end) spans covering the tokens.
      turn_records: per row, one TurnRecord per model turn (the k-th "model" segment is
        turn k).
    """

    tokens_bt: np.ndarray
    token_mask_bt: np.ndarray
    loss_mask_bt: np.ndarray
    logp_bt: np.ndarray
    length_b: np.ndarray
    truncated_b: np.ndarray
    final_texts: list
    rewards: list
    errors: list
    turns_b: np.ndarray
    model_tokens_b: np.ndarray
    env_tokens_b: np.ndarray
    tool_calls: list
    segments: list
    turn_records: list


def stop_sequence_ids(tokenizer, strings: Sequence[str]) -> list[list[int]]:
    """Token sequences that end a turn: each string's encoding alone and after a letter, a
    space and a newline (a BPE tokenizer may merge its first characters with what precedes)."""
    out: list[list[int]] = []
    for s in strings:
        variants = [list(tokenizer.encode(s))]
        for before in ("a", " ", "\n"):
            try:
                head, whole = list(tokenizer.encode(before)), list(tokenizer.encode(before + s))
            except ValueError:  # a character tokenizer without this character
                continue
            if whole[:len(head)] == head:
                variants.append(whole[len(head):])
            elif len(whole) > 1:
                variants.append(whole[1:])
        for v in variants:
            if v and v not in out:
                out.append(v)
    return out


class EpisodeRunner:
    """Plays episodes of ``env_factory()`` environments with a policy.

    Args:
      env_factory: ``() -> Environment``, a fresh instance per episode.
      renderer: the policy's `Renderer`.
      limits: EpisodeLimits.
      eos_ids: ids that end an episode; pad_id: padding.
      max_workers: threads running environment steps.
      sampler: ``start``, ``decode_turn``, ``append`` as in `jaxrl_vr.sampling.multiturn`
        (tests pass a scripted policy).
      generate_fn: samples the one turn of single-turn episodes (``max_turns=1``):
        ``jaxrl_vr.sampling.generate``, which keeps no cache for a continuation.
    """

    def __init__(self, env_factory: Callable, renderer: Renderer, limits: EpisodeLimits, *,
                 eos_ids: Sequence[int], pad_id: int = 0, max_workers: int = 8, sampler=mt,
                 generate_fn: Callable = generate):
        self.env_factory, self.renderer, self.limits, self.sampler = env_factory, renderer, limits, sampler
        self.generate_fn = generate_fn
        self.eos_ids, self.pad_id = tuple(int(i) for i in eos_ids), int(pad_id)
        probe = env_factory()
        self.stop_strings = tuple(probe.stop_strings)
        self.role = getattr(getattr(probe, "settings", None), "role", "tool")
        self.single_turn_env = isinstance(probe, SingleTurnEnv)  # its step always ends: not called
        self.multi_turn = limits.max_turns > 1
        self.observation_overhead = renderer.check(self.role) if self.multi_turn else 0
        self.stop_sequences = mt.encode_stop_sequences(stop_sequence_ids(renderer.tokenizer, self.stop_strings))
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="env")

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def opening(self, item) -> list:
        """The opening messages of an episode of ``item`` (the prompt, rendered once per item)."""
        return list(self.env_factory().reset(item))

    def capacity(self, prompt_len: int) -> int:
        lim = self.limits
        obs = round_up(lim.max_observation_tokens + self.observation_overhead + 8, 16)
        return prompt_len + lim.max_turns * round_up(lim.max_turn_tokens, 16) + (lim.max_turns - 1) * obs

    def _step(self, env, text: str) -> StepResult:
        result = env.step(text)
        if not isinstance(result, StepResult):
            raise TypeError(f"step returned {type(result).__name__}, not a StepResult")
        for m in () if result.done else result.observation:
            if not (isinstance(m, dict) and isinstance(m.get("content"), str) and isinstance(m.get("role"), str)):
                raise TypeError(f"an observation must be {{'role': str, 'content': str}} messages, got {m!r:.200}")
        return result

    def _cut(self, observation) -> list:
        """Each message's content cut to max_observation_tokens tokens (the cut is noted)."""
        cap, tok, out = self.limits.max_observation_tokens, self.renderer.tokenizer, []
        for m in observation:
            m = {**m, "content": self.renderer.encodable(m["content"])}
            ids = tok.encode(m["content"])
            if len(ids) > cap:
                m = {**m, "content": tok.decode(ids[:cap - min(cap // 2, 4)]) + "..."}
                if len(tok.encode(m["content"])) > cap:
                    m = {**m, "content": tok.decode(ids[:cap])}
            out.append(m)
        return out

    def run(self, key: jax.Array, model, items: Sequence, prompt_tokens_ps, prompt_mask_ps, *, num_samples: int,
            temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, greedy: bool = False) -> Episodes:
        lim, tok = self.limits, self.renderer.tokenizer
        num_p, prompt_len = np.asarray(prompt_tokens_ps).shape
        batch, width = num_p * num_samples, lim.max_total_tokens
        envs, histories, errors = [None] * batch, [None] * batch, [None] * batch
        for b in range(batch):
            try:
                envs[b] = self.env_factory()
                histories[b] = list(envs[b].reset(items[b // num_samples]))
            except Exception as err:  # noqa: BLE001
                errors[b] = f"reset raised {type(err).__name__}: {err}"
        ids = [[] for _ in range(batch)]
        loss = [[] for _ in range(batch)]
        logps = [[] for _ in range(batch)]
        segments = [[] for _ in range(batch)]
        calls = [[] for _ in range(batch)]
        records = [[] for _ in range(batch)]
        final_texts, rewards = [""] * batch, [None] * batch
        truncated = np.zeros(batch, bool)
        turns = np.zeros(batch, np.int32)
        live = np.array([e is None for e in errors])
        ended = np.zeros(batch, bool)  # the model emitted EOS: the step's answer is the last
        if self.multi_turn:
            session = self.sampler.start(model, prompt_tokens_ps, prompt_mask_ps, num_samples=num_samples,
                                         capacity=self.capacity(prompt_len))
        for turn_index in range(lim.max_turns):
            used = np.array([len(r) for r in ids])
            cap = int(min(lim.max_turn_tokens, max(width - used[live]))) if live.any() else 0
            if cap < 1:
                break
            key, sub = jax.random.split(key)
            if self.multi_turn:
                session, turn = self.sampler.decode_turn(
                    sub, model, session, live, max_tokens=cap, temperature=temperature, top_p=top_p, top_k=top_k,
                    greedy=greedy, stop_token_ids=self.eos_ids, stop_sequences=self.stop_sequences,
                    pad_id=self.pad_id)
                tokens_bw, logp_bw = np.asarray(turn.tokens_bw), np.asarray(turn.logp_bw)
                mask_bw, stop_b = np.asarray(turn.mask_bw), np.asarray(turn.stop_b)
            else:  # one turn, no continuation: the single-turn sampler (segmented decode, no cache kept)
                rollout = self.generate_fn(sub, model, prompt_tokens_ps, prompt_mask_ps, num_samples=num_samples,
                                           max_new_tokens=cap, temperature=temperature, top_p=top_p, top_k=top_k,
                                           stop_token_ids=self.eos_ids, pad_id=self.pad_id)
                tokens_bw, logp_bw = np.asarray(rollout.tokens_bt), np.asarray(rollout.logp_bt)
                mask_bw = np.asarray(rollout.mask_bt, bool) & live[:, None]
                stop_b = np.where(np.asarray(rollout.truncated_b, bool), mt.STOP_CAP, mt.STOP_TOKEN)
            stepping = []
            for b in np.flatnonzero(live):
                n = int(mask_bw[b].sum())
                room = width - len(ids[b])
                cut = n > room
                n = min(n, room)
                start = len(ids[b])
                ids[b] += tokens_bw[b, :n].tolist()
                loss[b] += [True] * n
                logps[b] += logp_bw[b, :n].tolist()
                segments[b].append(("model", start, start + n))
                turns[b] += 1
                final_texts[b] = tok.decode(tokens_bw[b, :n].tolist())
                records[b].append(TurnRecord(final_texts[b]))
                if cut or stop_b[b] == mt.STOP_CAP:
                    truncated[b], live[b] = True, False
                else:
                    ended[b] = stop_b[b] == mt.STOP_TOKEN
                    stepping.append(b)
            if self.single_turn_env:
                live[stepping], stepping = False, []
            futures = {b: self.pool.submit(self._step, envs[b], final_texts[b]) for b in stepping}
            chunks = [[] for _ in range(batch)]
            for b, future in futures.items():
                try:
                    result = future.result(timeout=lim.step_timeout_s)
                except concurrent.futures.TimeoutError:
                    errors[b], live[b] = f"step timed out after {lim.step_timeout_s:g} s", False
                    continue
                except Exception as err:  # noqa: BLE001
                    errors[b], live[b] = f"step raised {type(err).__name__}: {err}", False
                    continue
                calls[b] += list(result.tool_calls)
                records[b][-1] = TurnRecord(final_texts[b], tuple(result.tool_calls),
                                             dict(result.info) if isinstance(result.info, Mapping) else {})
                if result.done or ended[b] or turn_index == lim.max_turns - 1:
                    rewards[b] = None if result.reward is None else float(result.reward)
                    live[b] = False
                    continue
                observation = self._cut(result.observation)
                try:
                    delta = self.renderer.observation_ids(histories[b], final_texts[b], observation)
                except Exception as err:  # noqa: BLE001
                    errors[b], live[b] = f"rendering the observation raised {type(err).__name__}: {err}", False
                    continue
                if len(ids[b]) + len(delta) + 1 > width:
                    truncated[b], live[b] = True, False
                    continue
                histories[b] += [{"role": "assistant", "content": final_texts[b]}, *observation]
                start = len(ids[b])
                ids[b] += delta
                loss[b] += [False] * len(delta)
                logps[b] += [0.0] * len(delta)
                segments[b].append(("env", start, start + len(delta)))
                chunks[b] = delta
            if not live.any() or turn_index == lim.max_turns - 1:
                break
            session = self.sampler.append(model, session, chunks, pad_id=self.pad_id)
        tokens_bt = np.full((batch, width), self.pad_id, np.int32)
        token_mask_bt = np.zeros((batch, width), bool)
        loss_mask_bt = np.zeros((batch, width), bool)
        logp_bt = np.zeros((batch, width), np.float32)
        for b in range(batch):
            n = len(ids[b])
            tokens_bt[b, :n], token_mask_bt[b, :n] = ids[b], True
            loss_mask_bt[b, :n], logp_bt[b, :n] = loss[b], logps[b]
        model_tokens = loss_mask_bt.sum(1).astype(np.int32)
        length = token_mask_bt.sum(1).astype(np.int32)
        return Episodes(tokens_bt, token_mask_bt, loss_mask_bt, logp_bt, length, truncated, final_texts, rewards,
                        errors, turns, model_tokens, length - model_tokens, calls, segments, records)



def head(ep: Episodes, rows: int) -> Episodes:
    """The first ``rows`` episodes (a round's padding rows dropped)."""
    return Episodes(*(value[:rows] for value in ep))


def tool_counts(ep: Episodes) -> dict:
    """Tool calls made, parsed and run without error, and episodes ended by an error."""
    calls = [c for row in ep.tool_calls for c in row]
    return {"calls": len(calls), "valid": sum(c.parsed for c in calls), "ok": sum(c.ok for c in calls),
            "errors": sum(e is not None for e in ep.errors)}


def episode_records(ep: Episodes, tokenizer, prompt_ids: Sequence[Sequence[int]], rewards_b, reward_terms_b,
                    limit: int) -> list[dict]:
    """The rollout dump's objects (``run.dump_rollouts``) for the first ``limit`` episodes."""
    out = []
    for b in range(min(limit, len(ep.final_texts))):
        n = int(ep.length_b[b])
        ids = ep.tokens_bt[b, :n].tolist()
        out.append({
            "prompt_ids": [int(i) for i in prompt_ids[b]],
            "ids": ids,
            "loss_mask": [int(x) for x in ep.loss_mask_bt[b, :n]],
            "segments": [{"role": role, "start": start, "end": end, "text": tokenizer.decode(ids[start:end])}
                         for role, start, end in ep.segments[b]],
            "tool_calls": [c.record() for c in ep.tool_calls[b]],
            "reward": float(rewards_b[b]),
            "reward_terms": {k: float(v[b]) for k, v in reward_terms_b.items()},
            "final_text": ep.final_texts[b],
            "truncated": bool(ep.truncated_b[b]),
            "error": ep.errors[b],
        })
    return out
