"""Per-prompt success counts of a policy: n samples per prompt, scored by the verifiers.

These counts feed the unbiased pass@k estimator (``jaxrl_vr.passk``) and the regime
report (``jaxrl_vr.eval.passk_report``). Prompts are processed in fixed-size chunks
(the last one padded by repetition) so the sampler compiles once.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import numpy as np

from jaxrl_vr.train.rollout import decode_responses, encode_prompts


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
    scorer: Callable | None = None,
    success_threshold: float = 0.5,
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
      scorer: ``score(items, completions) -> VerifyResult``; default in-process scoring.
      success_threshold: a sample counts as correct when its score is >= this.

    Returns:
      {"counts": int64 [P] correct out of n, "n": n, "generated_tokens": int,
       "statuses": {status: count}, "mean_length": float}.
    """
    from jaxrl_vr.sampling import generate

    if scorer is None:
        from jaxrl_vr.verifiers.pool import score_serial

        scorer = score_serial
    items = list(items)
    if not items:
        raise ValueError("count_successes needs at least one item.")
    width = (
        prompt_width
        or encode_prompts(tokenizer, [it.prompt for it in items], chat=chat)[0].shape[1]
    )
    chunk = min(prompts_per_chunk, len(items))
    counts = np.zeros(len(items), np.int64)
    statuses: dict[str, int] = {}
    generated = 0
    lengths = []
    for start in range(0, len(items), chunk):
        part = items[start : start + chunk]
        real = len(part)
        part = part + [part[-1]] * (chunk - real)
        tokens_ps, mask_ps = encode_prompts(tokenizer, [it.prompt for it in part], width, chat=chat)
        key, sub = jax.random.split(key)
        rollout = generate(
            sub,
            model,
            tokens_ps,
            mask_ps,
            num_samples=num_samples,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            stop_token_ids=(tokenizer.eos_id,),
            pad_id=tokenizer.pad_id or 0,
        )
        tokens_bt = np.asarray(rollout.tokens_bt)[: real * num_samples]
        mask_bt = np.asarray(rollout.mask_bt, bool)[: real * num_samples]
        texts = decode_responses(tokenizer, tokens_bt, mask_bt)
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
    }
