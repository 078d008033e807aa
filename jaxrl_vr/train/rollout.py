"""Host steps of a round: prompt encoding, response decoding, scoring and reward shaping.

Every formula lives in ``jaxrl_vr.rewards`` (overlong penalty, total reward) and
``jaxrl_vr.verifiers`` (scores, hack detectors); these helpers adapt them to the round
sampler's callables (``jaxrl_vr.train.rounds.make_sample_round``).
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax.numpy as jnp
import numpy as np

from jaxrl_vr import rewards as rewards_lib


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
    tokens = np.full((len(rows), width), tokenizer.pad_id or 0, np.int32)
    mask = np.zeros((len(rows), width), bool)
    for i, ids in enumerate(rows):
        if ids:
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
    from jaxrl_vr.verifiers import pool as pool_lib

    if num_workers <= 0:
        return pool_lib.score_serial, lambda: None
    verifier_pool = pool_lib.VerifierPool(num_workers=num_workers, timeout_s=timeout_s)
    return verifier_pool.score, verifier_pool.close


def make_round_scorer(items: Sequence, tokenizer, scorer: Callable, *, hack_detectors: Sequence[str] = (),
                      on_result: Callable | None = None):
    """``score(prompt_idx_b, tokens_bt, mask_bt, truncated_b) -> (scores_b, hack_b, stats)``.

    Decodes the responses, scores them with ``scorer(items, completions)`` (a VerifierPool's
    ``score`` or ``score_serial``), and runs the enabled hack detectors (``hack_b`` = 1
    where any fired; None when none are enabled). ``on_result(items, completions, result)``
    sees every verifier result (the error log uses it). Stats count statuses and each
    detector's firing rate.
    """

    def score(prompt_idx_b, tokens_bt, mask_bt, truncated_b):
        completions = decode_responses(tokenizer, tokens_bt, mask_bt)
        items_b = [items[i] for i in prompt_idx_b]
        result = scorer(items_b, completions)
        if on_result is not None:
            on_result(items_b, completions, result)
        statuses = list(result.statuses)
        stats = {}
        stats["verifier_errors"] = float(sum(s == "error" for s in statuses))
        stats["verifier_timeouts"] = float(sum(s == "timeout" for s in statuses))
        stats["verifier_unparsable"] = float(sum(s == "unparsable" for s in statuses))
        hack_b = None
        if hack_detectors:
            from jaxrl_vr.verifiers.hacks import hack_penalties

            hack_b, flags = hack_penalties([it.prompt for it in items_b], completions,
                                           truncated_b=truncated_b,
                                           golds=[it.answer for it in items_b],
                                           enabled=tuple(hack_detectors))
            for name, fired in flags.items():
                stats[f"hack/{name}"] = float(np.sum(fired))
        return np.asarray(result.scores, np.float32), hack_b, stats

    return score


def make_reward_shaper(*, max_len: int, overlong_cache_len: int = 0, overlong_coef: float = 1.0,
                       hack_coef: float = 0.0):
    """``shape(scores_b, length_b, hack_b) -> (rewards_b, stats)``: R = R_verifier −
    λ_len·P_overlong − λ_hack·P_hack (SPEC §5, ``rewards.total_reward``); each term's sum
    is in the stats (``reward_terms/...``) so it is logged separately."""

    def shape(scores_b, length_b, hack_b):
        overlong_b = None
        if overlong_cache_len > 0:
            overlong_b = rewards_lib.overlong_penalty(jnp.asarray(length_b), max_len=max_len,
                                                      cache_len=overlong_cache_len)
        reward_b, terms = rewards_lib.total_reward(
            jnp.asarray(scores_b), overlong_b=overlong_b,
            hack_b=None if hack_coef == 0 or hack_b is None else jnp.asarray(hack_b),
            len_coef=overlong_coef, hack_coef=hack_coef)
        stats = {f"reward_terms/{name}": float(jnp.sum(value)) for name, value in terms.items()}
        return np.asarray(reward_b, np.float32), stats

    return shape
