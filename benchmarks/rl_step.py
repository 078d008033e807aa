"""One GRPO step (rollout + update) through the public API, the peer workload of shared/peers.

The workload (identical to ``shared/peers/bench_trl.py``, see shared/peers/README.md): an HF
safetensors model dir (SmolLM2-135M-Instruct, float32), P = 8 prompts × G = 8 samples from
``--prompts-file`` (one JSON string per line, written by ``shared/peers/prompts.py``; no chat
template, tokenized as the HF tokenizer does by default), 64 new tokens at temperature 1 with
no stop token (every response is 64 tokens; TRL gets the same by suppressing EOS), reward =
fraction of digit characters in the completion, GRPO advantages, one AdamW step per rollout
(lr 1e-6, weight decay 0, grad-norm clip 1.0), β = 0, behaviour log-probs = the step's own
detached forward (TRL ``num_iterations=1``). Every phase runs through the trainer's own parts:
``RoundSampler`` (sampler and scoring), ``jaxrl_vr.estimators``, ``build_batch`` /
``rollout_batch`` and the jitted update of ``make_update_fns`` (the state donated, as in the
trainer), so what it measures is what ``experiments.train`` runs.

The update runs each prompt's prefix once per group of G samples (``LossConfig.
prompt_group_size``: the same loss and gradient with less work, docs/performance.md
"perf19"); ``--no-shared-prefix`` runs every row's full sequence, as TRL does.
``update_fraction_of_matmul_peak`` counts the workload's nominal FLOPs (every row's full
sequence); ``update_executed_fraction_of_matmul_peak`` counts what the update ran.

    python benchmarks/rl_step.py --model-dir $PEERS_ROOT/models/smollm2-135m \\
        --prompts-file prompts.jsonl --warmup 1 --steps 2 --json out.json [--precision bf16]

``--allow-eos`` lets each response stop at the tokenizer's EOS (bench_trl.py ``--allow-eos``:
same prompts and reward; ragged lengths): the JSON then reports the mean and max response
length, and ``gen_tokens_per_s`` counts only real tokens (each response up to its EOS); each
step's ``decode_row_steps`` is the rows × decode steps the rollout ran (with `generate`'s
compaction, live rows only; without, every row until the longest stops).

``--precision bf16`` is the mixed-precision policy: float32 master weights and optimizer
state, bf16 matmul operands with float32 accumulation (``set_compute_dtype(model,
"bfloat16")``). Reported (JSON): median step / rollout / update seconds over the timed steps,
generated tokens/s, peak RSS, this run's dense float32 matmul peak (and the bf16-operand /
f32-accumulation peak), the update's analytic model FLOP/s as a fraction of the f32 peak,
the update's minor page faults and kernel seconds, GLIBC_TUNABLES and XLA_FLAGS, and the
1-minute load average before and after (the machine may be shared). A benchmark, never a
test.

``--lora-rank R`` runs the same workload training rank-R adapters (``--lora-alpha``, default
2R) on all seven block matrices of a frozen base (``jaxrl_vr.models.lora``; float32, or bf16
with ``--lora-base-dtype bfloat16``); the FLOP fractions still count full fine-tuning's work.
Each step record also holds the peak RSS after its rollout and after its update (the peak
only grows, so the two say which phase raised it).

Like ``experiments.train``, it calls ``jaxrl_vr.host_memory.keep_host_memory()`` first, so
the process keeps the memory XLA frees (docs/performance.md at 9f22ea1, "perf17");
``--release-host-memory`` measures JAX's default instead. It also asks XLA:CPU to schedule for
memory (``memory_optimized_cpu_schedule()``, "perf24"); ``--concurrency-schedule`` keeps
XLA's default.
"""

from __future__ import annotations

import argparse
import hashlib
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

from jaxrl_vr.estimators import make_estimator  # noqa: E402
from jaxrl_vr.host_memory import keep_host_memory, memory_optimized_cpu_schedule  # noqa: E402
from jaxrl_vr.models import add_lora, from_pretrained, load_tokenizer, set_compute_dtype  # noqa: E402
from jaxrl_vr.models import packed_dot  # noqa: E402
from jaxrl_vr.train import (  # noqa: E402
    LossConfig,
    OptimConfig,
    StepHyper,
    build_batch,
    init_train_state,
    make_optimizer,
    make_update_fns,
    rollout_batch,
    split_model,
)
from jaxrl_vr.tasks.base import TaskItem  # noqa: E402
from jaxrl_vr.train.rollout import (RewardShaper, RoundSampler, SamplingConfig, Scores,  # noqa: E402
                                    single_turn_runner)
from jaxrl_vr.trajectory import RolloutStats  # noqa: E402
from jaxrl_vr.sampling import compact as compact_lib  # noqa: E402

PRECISIONS = {"fp32": None, "bf16": "bfloat16"}
OPTIM = OptimConfig(learning_rate=1e-6, weight_decay=0.0, grad_clip_norm=1.0)  # TRL's AdamW step


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def load_average() -> float:
    return os.getloadavg()[0]


def process_counters() -> tuple[int, float]:
    """(minor page faults, kernel CPU seconds) of this process so far, all threads.

    With ``--release-host-memory`` XLA:CPU maps each execution's temporaries afresh, so
    every update first-touches them: ~(temporary bytes) / (page size) faults, and 5-8 s of
    kernel time per SmolLM2 update once a rollout has run in between (the kernel zeroes the
    pages; the VM's host has reclaimed them). With ``keep_host_memory()`` both are ~0
    (docs/performance.md at 9f22ea1, "perf17").
    """
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_minflt, usage.ru_stime


def matmul_peak_flops(dtype=jnp.float32, repeats: int = 6) -> float:
    """Best dense-matmul FLOP/s over two shapes: 1536² and the model's [768×576]·[576×1536].

    float32: plain f32 dots. bfloat16: bf16 operands with float32 accumulation
    (`preferred_element_type`), the mixed-precision path.
    """
    best_rate = 0.0
    for m, k, n in ((1536, 1536, 1536), (768, 576, 1536)):
        a = jax.random.normal(jax.random.key(0), (m, k)).astype(dtype)
        b = jax.random.normal(jax.random.key(1), (k, n)).astype(dtype)
        mm = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
        mm(a, b).block_until_ready()
        for _ in range(repeats):
            t0 = time.perf_counter()
            mm(a, b).block_until_ready()
            best_rate = max(best_rate, 2.0 * m * k * n / (time.perf_counter() - t0))
    return best_rate


def update_flops(config, batch: int, prompt_len: int, resp_len: int, group: int = 1) -> float:
    """Model FLOPs of one update: 3 × forward (forward + backward) over prompt + response.

    forward = 2·(block matmul params)·L·tokens + causal attention 2·2·L·H·Dh·len²/2·B + LM
    head 2·D·V·(response tokens). Recomputation (remat, chunked LM head) is not counted:
    this is the useful work, as in MFU.

    ``group`` = G > 1 counts what a shared-prefix update runs (``prompt_group_size``): the
    first S − 1 prompt tokens once per prompt (B / G rows), the last prompt token and the
    response once per row, attending to the whole prompt. group = 1 is the workload's
    nominal count (every row's full sequence), the one TRL runs.
    """
    d, f, layers = config.hidden_size, config.intermediate_size, config.num_layers
    q_dim, kv_dim = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    block_params = d * q_dim * 2 + d * kv_dim * 2 + 3 * d * f
    length = prompt_len + resp_len
    prefix_len = prompt_len - 1 if group > 1 else 0
    prefix_rows = batch // group
    own_len = length - prefix_len
    tokens = prefix_rows * prefix_len + batch * own_len
    forward = 2.0 * block_params * layers * tokens
    # Query-key pairs of causal attention: the prefix's own, then each row's rest.
    pairs = prefix_rows * prefix_len ** 2 / 2.0 + batch * (own_len * prefix_len + own_len ** 2 / 2.0)
    forward += 2.0 * 2.0 * layers * q_dim * pairs
    forward += 2.0 * d * config.vocab_size * batch * resp_len
    return 3.0 * forward


def reward_digits(texts):
    """Fraction of digit characters in each completion (shared/peers/bench_common.reward_digits)."""
    return [sum(ch.isdigit() for ch in t) / max(1, len(t)) for t in texts]


def digit_scorer(tokenizer):
    """The trainer's scoring signature over ``reward_digits`` of the decoded completions."""

    def score(prompt_idx_b, completions, truncated_b):
        return Scores(np.asarray(reward_digits(list(completions)), np.float32), None, RolloutStats())

    return score


def decode_row_steps(length_b) -> int:
    """Rows × decode steps the rollout ran: each compacted chunk's rows times its steps
    (`compact.LAST_CHUNKS`), or every row for the longest response's steps without compaction."""
    chunks, total, step = compact_lib.LAST_CHUNKS, 0, 0
    if not chunks:
        return int(len(length_b) * max(length_b))
    for rows, _, reached in chunks:
        total, step = total + rows * (reached - step), reached
    return total + chunks[-1][0]  # the last emit


def encode(tokenizer, texts, max_prompt_tokens: int):
    """Left-padded [P, S] ids and mask, special tokens as the HF tokenizer adds them by default."""
    add_bos = bool(getattr(tokenizer, "add_bos_default", False))
    rows = [tokenizer.encode(t, add_bos=add_bos) for t in texts]
    width = max(len(r) for r in rows)
    if width > max_prompt_tokens:
        raise SystemExit(f"a prompt has {width} tokens > --max-prompt-tokens {max_prompt_tokens}.")
    tokens = np.full((len(rows), width), tokenizer.pad_id or 0, np.int32)
    mask = np.zeros((len(rows), width), bool)
    for i, r in enumerate(rows):
        tokens[i, width - len(r):], mask[i, width - len(r):] = r, True
    return tokens, mask


def workload_loss_config(microbatches: int, chunk: int, max_new_tokens: int, group: int) -> LossConfig:
    """The update's LossConfig for this workload (also what `profile_step.py` profiles).

    `chunk` 0 = one LM-head chunk of the whole response; `group` = G shares each prompt's
    prefix across its G rows (`LossConfig.prompt_group_size`), 1 runs every row's full prompt.
    """
    return LossConfig(num_microbatches=microbatches, logprob_chunk_size=chunk or max_new_tokens,
                      detach_behaviour=True, prompt_group_size=group)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True, help="HF safetensors dir (config.json + tokenizer)")
    parser.add_argument("--prompts-file", required=True, help="one JSON string per line (peers/prompts.py)")
    parser.add_argument("--precision", choices=tuple(PRECISIONS), default="fp32")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps (the first compiles)")
    parser.add_argument("--steps", type=int, default=2, help="timed steps")
    parser.add_argument("-P", "--prompts", type=int, default=8)
    parser.add_argument("-G", "--gens", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-prompt-tokens", type=int, default=32)
    parser.add_argument("--allow-eos", action="store_true",
                        help="stop each response at the tokenizer's EOS (ragged lengths, bench_trl.py "
                             "--allow-eos) instead of always generating --max-new-tokens tokens")
    parser.add_argument("--microbatches", type=int, default=8, help="gradient accumulation (one AdamW step)")
    parser.add_argument("--chunk", type=int, default=0,
                        help="LM-head log-softmax time chunk; 0 = one chunk of the whole response, which "
                             "is not rematerialised (measured faster than 16: docs/performance.md at 9f22ea1, perf12)")
    parser.add_argument("--remat", action="store_true", help="recompute each block in the backward pass")
    parser.add_argument("--no-shared-prefix", action="store_true",
                        help="run every row's full prompt in the update (LossConfig.prompt_group_size=1) "
                             "instead of each prompt once per group of G samples")
    parser.add_argument("--release-host-memory", action="store_true",
                        help="let glibc return XLA's freed buffers to the kernel (the JAX default) "
                             "instead of jaxrl_vr.host_memory.keep_host_memory()")
    parser.add_argument("--concurrency-schedule", action="store_true",
                        help="keep XLA:CPU's default (concurrency-optimized) scheduler instead of "
                             "jaxrl_vr.host_memory.memory_optimized_cpu_schedule()")
    parser.add_argument("--lora-rank", type=int, default=0,
                        help="train rank-R LoRA adapters on a frozen base (0 = off)")
    parser.add_argument("--lora-alpha", type=float, default=0.0, help="LoRA alpha (default 2 x rank)")
    parser.add_argument("--lora-base-dtype", choices=("", "bfloat16"), default="",
                        help="store the frozen base in bf16 (the trainer's model.lora.base_dtype); '' keeps float32")
    parser.add_argument("--no-precompile", action="store_true",
                        help="with --allow-eos, do not compile every decode chunk the compacting sampler can "
                             "visit before the warm-up (`compact.precompile`): timed steps then compile the "
                             "(batch bucket, cache length) pairs the warm-up did not reach")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    if not args.concurrency_schedule:
        memory_optimized_cpu_schedule()  # before any computation: XLA reads XLA_FLAGS then
    host_memory = None if args.release_host_memory else keep_host_memory()  # before any computation

    load_start = load_average()
    with open(args.prompts_file) as f:
        all_prompts = [json.loads(line) for line in f if line.strip()]
    needed = args.prompts * (args.warmup + args.steps)
    if len(all_prompts) < needed:
        raise SystemExit(f"{args.prompts_file} has {len(all_prompts)} prompts; {needed} needed.")
    prompts_sha = hashlib.sha256("\n".join(all_prompts).encode()).hexdigest()[:12]
    peak_f32 = matmul_peak_flops(jnp.float32)
    peak_bf16 = matmul_peak_flops(jnp.bfloat16)

    model = from_pretrained(args.model_dir, dtype="float32", remat=args.remat)
    set_compute_dtype(model, PRECISIONS[args.precision])
    lora_alpha = args.lora_alpha or 2.0 * args.lora_rank
    if args.lora_rank:  # all seven block matrices; only the adapters are trained (split_model)
        add_lora(model, rank=args.lora_rank, alpha=lora_alpha, key=jax.random.key(43),
                 base_dtype=args.lora_base_dtype or None)
    tokenizer = load_tokenizer(args.model_dir)
    graphdef, params, rest = split_model(model)
    optim = make_optimizer(OPTIM)
    group = 1 if args.no_shared_prefix else args.gens
    loss_cfg = workload_loss_config(args.microbatches, args.chunk, args.max_new_tokens, group)
    chunk = loss_cfg.logprob_chunk_size
    state = init_train_state(params, optim, loss_cfg)
    # The trainer's own parts: its jitted update (state donated), round sampler, estimator
    # registry and batch builder (jaxrl_vr.train.parts, rollout, estimators, batch).
    fns = make_update_fns(graphdef, OPTIM, loss_cfg)
    estimator = make_estimator("grpo")
    sampling = SamplingConfig(temperature=1.0)
    hyper = StepHyper.create()
    runner = single_turn_runner(tokenizer, args.max_new_tokens,
                                eos_ids=None if args.allow_eos else ())  # None: the tokenizer's EOS
    key = jax.random.key(0)
    precompile = args.allow_eos and not args.no_precompile
    if precompile:
        # Steady state: a long run has compiled every decode chunk its rollouts visit; a few
        # timed steps would otherwise compile each (bucket, cache length) pair not seen before.
        first_ps, first_mask_ps = encode(tokenizer, all_prompts[:args.prompts], args.max_prompt_tokens)
        precompiled = compact_lib.precompile(
            nnx.merge(graphdef, state.params, rest), first_ps, first_mask_ps, num_samples=args.gens,
            max_new_tokens=args.max_new_tokens, stop_token_ids=runner.eos_ids, pad_id=runner.pad_id,
            **sampling._asdict())
        print(f"precompiled {precompiled} decode chunks", flush=True)
    records = []
    for step in range(args.warmup + args.steps):
        texts = all_prompts[step * args.prompts:(step + 1) * args.prompts]
        prompt_ps, prompt_mask_ps = encode(tokenizer, texts, args.max_prompt_tokens)
        sampler = RoundSampler(prompt_ps, prompt_mask_ps, score=digit_scorer(tokenizer),
                               shape_rewards=RewardShaper(max_len=args.max_new_tokens), sampling=sampling,
                               min_prompts=args.prompts, episodes=runner,
                               items=[TaskItem(f"bench/{i}", t) for i, t in enumerate(texts)])
        key, sample_key = jax.random.split(key)
        traces_before = compact_lib.TRACE_COUNTS["decode_chunk"]
        t0 = time.perf_counter()
        traj = sampler.sample(nnx.merge(graphdef, state.params, rest), sample_key, np.arange(args.prompts),
                              args.gens)
        traj, _ = build_batch(traj, estimator, estimator.init(),
                              behaviour_logprobs=None,  # detach_behaviour: the step's own forward
                              reference_logprobs=None)  # β = 0
        batch = rollout_batch(traj)
        t1 = time.perf_counter()
        peak_after_rollout = peak_rss_mb()  # the peak is monotonic: which phase raised it
        faults_before, sys_before = process_counters()
        state, metrics = fns.train_step(state, batch, hyper, rest)
        loss = float(metrics["loss"])  # blocks
        t2 = time.perf_counter()
        faults_after, sys_after = process_counters()
        records.append({"step_s": t2 - t0, "rollout_s": t1 - t0, "update_s": t2 - t1, "loss": loss,
                        "update_minor_faults": faults_after - faults_before,
                        "update_kernel_s": sys_after - sys_before,
                        "gen_tokens": int(traj.length_b.sum()),  # real tokens only (to EOS)
                        "mean_response_len": float(traj.length_b.mean()),
                        "max_response_len": int(traj.length_b.max()),
                        "decode_row_steps": decode_row_steps(traj.length_b),
                        "decode_chunk_compiles": compact_lib.TRACE_COUNTS["decode_chunk"] - traces_before,
                        "prompt_tokens": int(prompt_ps.shape[1]), "load_1m": load_average(),
                        "peak_rss_after_rollout_mb": peak_after_rollout, "peak_rss_after_update_mb": peak_rss_mb(),
                        "phase": "warmup" if step < args.warmup else "timed"})
        print(f"step {step}: " + json.dumps({k: round(v, 3) if isinstance(v, float) else v
                                             for k, v in records[-1].items()}), flush=True)

    peak_f32 = max(peak_f32, matmul_peak_flops(jnp.float32))  # shared machine: best of start and end
    timed = records[args.warmup:] or records

    def median(name):
        return statistics.median(r[name] for r in timed)

    update_s = median("update_s")
    flops = statistics.median(update_flops(model.config, args.prompts * args.gens, r["prompt_tokens"],
                                           args.max_new_tokens) for r in timed)
    executed = statistics.median(update_flops(model.config, args.prompts * args.gens, r["prompt_tokens"],
                                              args.max_new_tokens, group) for r in timed)
    result = {
        "peer": "jaxrl_vr",
        "precision": args.precision,
        "model": os.path.basename(os.path.normpath(args.model_dir)),
        "P": args.prompts, "G": args.gens, "new_tokens": args.max_new_tokens,
        "microbatches": args.microbatches, "logprob_chunk": chunk, "remat": args.remat,
        "lora_rank": args.lora_rank, "lora_alpha": lora_alpha if args.lora_rank else 0.0,
        "lora_base_dtype": (args.lora_base_dtype or "float32") if args.lora_rank else "",
        "prompt_group_size": group,
        "prompts_sha": prompts_sha,
        "allow_eos": args.allow_eos,
        "rollout_precompiled": precompile,
        "mean_response_len": statistics.mean(r["mean_response_len"] for r in timed),
        "max_response_len": max(r["max_response_len"] for r in timed),
        "mean_gen_tokens_per_step": statistics.mean(r["gen_tokens"] for r in timed),  # bench_common's name
        "median_step_s": median("step_s"),
        "median_rollout_s": median("rollout_s"),
        "median_update_s": update_s,
        "gen_tokens_per_s": sum(r["gen_tokens"] for r in timed) / sum(r["rollout_s"] for r in timed),
        "first_step_s": records[0]["step_s"],
        "peak_rss_mb": peak_rss_mb(),
        "matmul_peak_gflops": peak_f32 / 1e9,
        "matmul_peak_bf16_f32acc_gflops": peak_bf16 / 1e9,
        "update_gflop": flops / 1e9,
        "update_gflops_achieved": flops / update_s / 1e9,
        "update_fraction_of_matmul_peak": flops / update_s / peak_f32,
        "update_executed_gflop": executed / 1e9,
        "update_executed_fraction_of_matmul_peak": executed / update_s / peak_f32,
        "median_update_minor_faults": median("update_minor_faults"),
        "median_update_kernel_s": median("update_kernel_s"),
        "load_1m_start": load_start,
        "load_1m_end": load_average(),
        "cpu_count": os.cpu_count(),
        "jax": jax.__version__,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        # Which dots the rollout decoded with (jaxrl_vr.models.packed_dot): packed or xla.
        "decode_dots": "packed" if packed_dot.use_packed(state.params, model.config.matmul_dtype) else "xla",
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
        "keep_host_memory": bool(host_memory and host_memory.kept),
        "host_memory": host_memory.reason if host_memory else "released (JAX default)",
        "steps": records,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "steps"}), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
