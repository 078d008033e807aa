"""Host-side helpers of one rollout batch: prompt encoding, response decoding, scoring,
rewards and the advantage-estimator dispatch (every formula lives in jaxrl_vr.advantages /
jaxrl_vr.rewards)."""

from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
import numpy as np

from jaxrl_vr import advantages as adv_lib
from jaxrl_vr import rewards as rewards_lib

ADVANTAGE_ESTIMATORS = ("grpo", "dr_grpo", "loo", "maxrl", "curverl", "reinforce")


def encode_prompts(
    tokenizer, prompts: Sequence[str], width: int | None = None, *, chat: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded int32 [P, S] token ids (BOS first) and bool mask; S = ``width`` or longest."""
    rows = []
    for text in prompts:
        if chat:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True
            )
        ids = tokenizer.encode(text, add_bos=tokenizer.bos_id is not None)
        rows.append(ids)
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
            tokens[i, width - len(ids) :] = ids
            mask[i, width - len(ids) :] = True
    return tokens, mask


def decode_responses(tokenizer, tokens_bt: np.ndarray, mask_bt: np.ndarray) -> list[str]:
    """Response texts (special tokens such as EOS dropped)."""
    return [
        tokenizer.decode([int(t) for t, m in zip(row, row_mask) if m])
        for row, row_mask in zip(tokens_bt, mask_bt)
    ]


def compute_advantages(estimator: str, rewards_pg, valid_pg, curverl_state, *, scores_pg=None):
    """(adv_pg, new_curverl_state) from the configured estimator (SPEC §3.1).

    ``scores_pg`` (verifier scores before penalties) give CurveRL its pass rates, so an
    overlong or hack penalty in ``rewards_pg`` never changes which prompts it weights.
    """
    rewards_pg = jnp.asarray(rewards_pg, jnp.float32)
    valid_pg = jnp.asarray(valid_pg, bool)
    if estimator == "grpo":
        return adv_lib.grpo(rewards_pg, valid_pg), curverl_state
    if estimator == "dr_grpo":
        return adv_lib.grpo(rewards_pg, valid_pg, scale="none"), curverl_state
    if estimator == "loo":
        return adv_lib.loo(rewards_pg, valid_pg), curverl_state
    if estimator == "maxrl":
        return adv_lib.maxrl(rewards_pg, valid_pg), curverl_state
    if estimator == "reinforce":
        return adv_lib.reinforce(rewards_pg, valid_pg), curverl_state
    if estimator == "curverl":
        return adv_lib.curverl(rewards_pg, curverl_state, valid_pg, success_pg=scores_pg)
    raise ValueError(f"unknown advantage estimator {estimator!r}; one of {ADVANTAGE_ESTIMATORS}.")


def overlong_penalty(length_b: np.ndarray, *, max_len: int, cache_len: int) -> np.ndarray:
    """DAPO overlong penalty (``jaxrl_vr.rewards.overlong_penalty``) as host float32."""
    return np.asarray(
        rewards_lib.overlong_penalty(jnp.asarray(length_b), max_len=max_len, cache_len=cache_len),
        np.float32,
    )


def make_scorer(num_workers: int, timeout_s: float):
    """(score(items, completions) -> VerifyResult, close())."""
    from jaxrl_vr.verifiers import pool as pool_lib

    if num_workers <= 0:
        return pool_lib.score_serial, lambda: None
    verifier_pool = pool_lib.VerifierPool(num_workers=num_workers, timeout_s=timeout_s)
    return verifier_pool.score, verifier_pool.close


def masked_stats(values: np.ndarray, mask: np.ndarray, prefix: str) -> dict[str, float]:
    vals = values[mask]
    if vals.size == 0:
        return {f"{prefix}_mean": 0.0, f"{prefix}_std": 0.0, f"{prefix}_abs_max": 0.0}
    return {
        f"{prefix}_mean": float(vals.mean()),
        f"{prefix}_std": float(vals.std()),
        f"{prefix}_abs_max": float(np.abs(vals).max()),
    }
