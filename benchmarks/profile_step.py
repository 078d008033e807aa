"""Per-op profile of the RL update (or, with --what rollout, the rollout) on the rl_step workload.

Traces one warm train-step call with `jax.profiler`, sums the XLA:CPU thunk time per HLO
instruction and labels each with its source op (HLO metadata op_name), so one can see where
an update's time goes (dots forward/backward, LM head, softmax/entropy, weight slicing and
gradient accumulation, optimizer). `--by-source` sums the instructions of one source op (every
layer's gate dot as one row); the header gives each thread's traced busy time (a lower bound:
see `busy_by_thread`); `--timeline-ms` prints a window of both threads' ops, which shows what
runs side by side and what runs alone.

    python benchmarks/profile_step.py --model-dir $PEERS_ROOT/models/smollm2-135m \\
        --prompts-file prompts.jsonl [--what update|rollout] [--precision bf16] [--top 30] \\
        [--by-source] [--timeline-ms 10] [--json out.json] [--hlo-out step.hlo]
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import sys
import tempfile
import time
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import decode  # noqa: E402
import rl_step  # noqa: E402
from jaxrl_vr.host_memory import keep_host_memory, memory_optimized_cpu_schedule  # noqa: E402
from jaxrl_vr.models import add_lora, from_pretrained, load_tokenizer, set_compute_dtype  # noqa: E402
from jaxrl_vr.sampling import generate  # noqa: E402
from jaxrl_vr.sampling import sampler  # noqa: E402
from jaxrl_vr.train import (  # noqa: E402
    OptimConfig, RolloutBatch, StepHyper, init_train_state, make_optimizer, make_train_step,
    split_model,
)


PROMPTS, SAMPLES, NEW_TOKENS = 8, 8, 64  # rl_step.py's default workload: P, G, response tokens


def op_labels(hlo_text: str) -> dict[str, str]:
    """HLO instruction name -> a short label from its metadata op_name."""
    labels = {}
    for name, op_name in re.findall(r"%([\w.\-]+) = [^\n]*?metadata=\{op_name=\"([^\"]+)\"", hlo_text):
        op = re.sub(r"jit\(\w+\)/", "", op_name)
        op = op.replace("while/body/closed_call/", "").replace("closed_call/", "")
        labels[name] = op[-90:]
    return labels


SKIPPED_EVENTS = ("end:", "ThunkExecutor", "ThreadpoolListener")
"""Trace events that are not one HLO instruction's work (nested executor spans, listener marks)."""


class Event(NamedTuple):
    thread: str
    start_ns: int
    duration_ns: int
    name: str


def thunk_events(data) -> list[Event]:
    """Every XLA:CPU thunk event of a `jax.profiler.ProfileData`, by thread, in start order."""
    events = []
    for plane in data.planes:
        for line in plane.lines:
            if line.name == "python" or "ThreadpoolListener" in line.name:
                continue
            events.extend(Event(f"{plane.name}/{line.name}", e.start_ns, e.duration_ns, e.name)
                          for e in line.events if not e.name.startswith(SKIPPED_EVENTS))
    return sorted(events, key=lambda e: e.start_ns)


def source_op(name: str, labels: dict[str, str]) -> str:
    """The source op of HLO instruction `name`, without the per-instance numbers
    ("while/body/btd,df->btf/dot_general" for every layer's ynn_fusion.N of that einsum)."""
    return re.sub(r"\.\d+", "", labels.get(name, name))


def sum_events(events: Sequence[Event], key) -> list[tuple[str, float, float, int]]:
    """(key, seconds, share, count) of the events grouped by `key(event.name)`, largest first."""
    seconds, count = collections.Counter(), collections.Counter()
    for event in events:
        seconds[key(event.name)] += event.duration_ns / 1e9
        count[key(event.name)] += 1
    total = sum(seconds.values()) or 1.0
    return [(k, sec, sec / total, count[k]) for k, sec in seconds.most_common()]


def sum_by_source(events: Sequence[Event], labels: dict[str, str]) -> list[dict]:
    """Seconds and instance counts per source op, largest first."""
    return [dict(op=op, seconds=sec, fraction=share, count=n)
            for op, sec, share, n in sum_events(events, lambda name: source_op(name, labels))]


def sum_by_instruction(events: Sequence[Event], labels: dict[str, str]) -> list[dict]:
    """Seconds per HLO instruction, with its source op, largest first."""
    return [dict(name=name, op=labels.get(name, ""), seconds=sec, fraction=share, count=n)
            for name, sec, share, n in sum_events(events, str)]


WAIT_EVENTS = ("SlinkyThreadPool::Await",)
"""Events of a thread waiting for the others' share of an op: listed, but not busy time."""


def busy_by_thread(events: Sequence[Event]) -> dict[str, float]:
    """Seconds each thread spent inside thunks, waits excluded.

    A lower bound on its utilisation: the share of one op that YNNPACK hands to the other
    thread is not traced there (an op that beats one thread's peak rate shows it, e.g. the
    rollout's MLP down dot at 48 GFLOP/s on a CPU with 36 per thread).
    """
    busy = collections.Counter()
    for event in events:
        busy[event.thread] += 0.0 if event.name.startswith(WAIT_EVENTS) else event.duration_ns / 1e9
    return dict(busy.most_common())


def timeline(events: Sequence[Event], labels: dict[str, str], window_ms: float) -> list[str]:
    """`window_ms` of both threads' thunks from the middle of the call: which ops run side by side."""
    if not events:
        return []
    t0 = events[len(events) // 2].start_ns
    threads = sorted({e.thread for e in events})
    return [f"{(e.start_ns - t0) / 1e6:8.3f} ms {e.duration_ns / 1e6:7.3f} ms  thread {threads.index(e.thread)}  "
            f"{source_op(e.name, labels)[-70:]}"
            for e in events if t0 <= e.start_ns < t0 + window_ms * 1e6]


def profile(fn, labels, top: int, trace_dir: str, by_source: bool = False, window_ms: float = 0.0):
    jax.profiler.start_trace(trace_dir)
    start = time.perf_counter()
    jax.block_until_ready(fn())
    wall = time.perf_counter() - start
    jax.profiler.stop_trace()
    path = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True))[-1]
    events = thunk_events(jax.profiler.ProfileData.from_file(path))
    rows = (sum_by_source if by_source else sum_by_instruction)(events, labels)[:top]
    busy = busy_by_thread(events)
    print(f"wall {wall:.2f} s, summed op time {sum(r['seconds'] for r in rows):.2f} s in the rows listed "
          "(ops overlap on threads); "
          "busy per thread: " + ", ".join(f"{sec:.2f} s" for sec in busy.values()))
    for row in rows:
        count = f"x{row['count']:<5d}" if by_source else f"{row['name'][:28]:28s}"
        print(f"{row['seconds'] * 1e3:9.1f} ms {100 * row['fraction']:5.1f}%  {count} {row['op']}")
    lines = timeline(events, labels, window_ms)
    for line in lines:
        print(line)
    return wall, rows, busy, lines


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--prompts-file", required=True)
    parser.add_argument("--what", choices=("update", "rollout"), default="update",
                        help="the train step on one rollout, or the rollout itself (generate's jitted core)")
    parser.add_argument("--precision", choices=tuple(rl_step.PRECISIONS), default="fp32")
    parser.add_argument("-P", "--prompts", type=int, default=PROMPTS)
    parser.add_argument("-G", "--gens", type=int, default=SAMPLES)
    parser.add_argument("--max-new-tokens", type=int, default=NEW_TOKENS)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--chunk", type=int, default=0,
                        help="LM-head log-softmax time chunk; 0 = one chunk of the response, as rl_step.py")
    parser.add_argument("--no-shared-prefix", action="store_true",
                        help="every row's full prompt in the update, as rl_step.py --no-shared-prefix")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--warm-calls", type=int, default=2,
                        help="untimed calls before the traced one. The second call of the update still "
                             "faulted in ~230k pages (3 s of kernel time on a Zen 5 EPYC) while the heap "
                             "settled; from the third on, none")
    parser.add_argument("--by-source", action="store_true",
                        help="sum the instructions of each source op (all layers' gate dots as one row)")
    parser.add_argument("--timeline-ms", type=float, default=0.0,
                        help="also print this many ms of both threads' ops from the middle of the call")
    parser.add_argument("--lora-rank", type=int, default=0,
                        help="train rank-R adapters on all seven block matrices of a frozen base, as rl_step.py")
    parser.add_argument("--json", default=None)
    parser.add_argument("--hlo-out", default=None,
                        help="also write the compiled HLO text here (to look up an instruction the profile names)")
    parser.add_argument("--release-host-memory", action="store_true",
                        help="JAX's default host memory handling instead of keep_host_memory(), as rl_step.py")
    parser.add_argument("--concurrency-schedule", action="store_true",
                        help="XLA:CPU's default scheduler instead of memory_optimized_cpu_schedule(), "
                             "as rl_step.py --concurrency-schedule")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if not args.concurrency_schedule:
        memory_optimized_cpu_schedule()  # before any computation, as rl_step.py and experiments.train
    if not args.release_host_memory:
        keep_host_memory()  # before any computation, as rl_step.py and experiments.train

    model, prompt_ps, mask_ps = load_workload(args)
    if args.what == "rollout":
        run = rollout_call(model, prompt_ps, mask_ps, num_samples=args.gens, max_new_tokens=args.max_new_tokens)
    else:
        run = update_call(args, model, workload_rollout(model, prompt_ps, mask_ps, args.gens, args.max_new_tokens))
    if args.hlo_out:
        with open(args.hlo_out, "w") as f:
            f.write(run.hlo_text)
    for _ in range(args.warm_calls):
        jax.block_until_ready(run())
    with tempfile.TemporaryDirectory() as trace_dir:
        wall, rows, busy, lines = profile(run, run.labels, args.top, trace_dir, args.by_source, args.timeline_ms)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"what": args.what, "precision": args.precision, "lora_rank": args.lora_rank, "wall_s": wall,
                       "load_1m": os.getloadavg()[0], "busy_s_by_thread": list(busy.values()),
                       "by_source": args.by_source, "top": rows, "timeline": lines}, f, indent=2)


def load_model(args):
    """The model in `args.model_dir` at `args.precision`, with rank-`args.lora_rank` adapters if set."""
    model = set_compute_dtype(from_pretrained(args.model_dir), rl_step.PRECISIONS[args.precision])
    if args.lora_rank:
        add_lora(model, rank=args.lora_rank, alpha=2.0 * args.lora_rank, key=jax.random.key(43))
    return model


def load_workload(args):
    """(model at `args.precision`, prompt tokens [P, S], prompt mask) of rl_step.py's workload."""
    with open(args.prompts_file) as f:
        texts = [json.loads(line) for line in f if line.strip()][:args.prompts]
    model = load_model(args)
    prompt_ps, mask_ps = rl_step.encode(load_tokenizer(args.model_dir), texts, 32)
    return model, prompt_ps, mask_ps


def workload_rollout(model, prompt_ps, mask_ps, num_samples: int = SAMPLES, max_new_tokens: int = NEW_TOKENS):
    """One rollout of the workload (G samples of `max_new_tokens`, EOS suppressed): the update's input."""
    return generate(jax.random.key(0), model, prompt_ps, mask_ps, num_samples=num_samples,
                    max_new_tokens=max_new_tokens, stop_token_ids=(), pad_id=0)


def rollout_call(model, prompt_ps, mask_ps, *, num_samples: int = SAMPLES, max_new_tokens: int = NEW_TOKENS,
                 stop_token_ids: Sequence[int] | None = ()):
    """generate's compiled core on the rl_step rollout (P = 8, G = 8, 64 tokens, EOS suppressed),
    or on other prompts, sample counts, lengths and stop ids (None = the model's EOS)."""
    core_args, core_kwargs = sampler.generate_core_call(
        jax.random.key(1), model, prompt_ps, mask_ps, num_samples=num_samples, max_new_tokens=max_new_tokens,
        temperature=1.0,
        top_p=1.0, top_k=0, greedy=False, stop_token_ids=stop_token_ids, pad_id=0, bucket=sampler.DEFAULT_BUCKET,
        cache_dtype=None)
    compiled = sampler._generate_core.lower(*core_args, **core_kwargs).compile()

    def run():
        return compiled(*core_args[1:])  # graphdef is static
    run.hlo_text = compiled.as_text()
    run.labels = op_labels(run.hlo_text)
    run.temp_bytes = temp_bytes(compiled)
    return run


def long_rollout_call(model, model_dir: str):
    """generate's compiled core on decode.py's long-response case: its one prompt, G = 8 samples
    at temperature 1, 512 new tokens, EOS allowed (the call ends when every row has stopped)."""
    ids = np.asarray([decode.long_prompt_ids(load_tokenizer(model_dir))], np.int32)
    return rollout_call(model, ids, np.ones(ids.shape, bool), num_samples=decode.LONG_SAMPLES,
                        max_new_tokens=decode.LONG_NEW_TOKENS, stop_token_ids=None)


def temp_bytes(compiled) -> int | None:
    """The compiled program's temporary buffers in bytes (XLA's buffer assignment: the
    activations, residuals and gradients it holds beside its arguments and outputs), or None
    where the backend does not say."""
    analysis = compiled.memory_analysis()
    return None if analysis is None else int(analysis.temp_size_in_bytes)


def update_call(args, model, rollout):
    """The compiled train step on `rollout`, as a thunk with its op labels attached (the
    trainer's make_train_step and loss structure, without donation so it can run again)."""
    graphdef, params, rest = split_model(model)
    optim = make_optimizer(OptimConfig(learning_rate=1e-6, weight_decay=0.0, grad_clip_norm=1.0))
    loss_cfg = rl_step.workload_loss_config(args.microbatches, args.chunk, rollout.tokens_bt.shape[1],
                                            1 if args.no_shared_prefix else args.gens)
    state = init_train_state(params, optim, loss_cfg)
    train_step = make_train_step(graphdef, rest, optim, loss_cfg)
    adv_b = jnp.asarray(np.linspace(-1, 1, args.prompts * args.gens, dtype=np.float32))
    batch = RolloutBatch(rollout.prompt_tokens_bs, rollout.prompt_mask_bs, rollout.tokens_bt, rollout.mask_bt,
                         rollout.mask_bt, jnp.broadcast_to(adv_b[:, None], rollout.mask_bt.shape),
                         rollout.logp_bt, rollout.logp_bt,
                         jnp.zeros((args.prompts * args.gens,), jnp.float32))  # no PBA weight
    hyper = StepHyper.create()
    compiled = train_step.jitted.lower(state, batch, hyper, rest).compile()

    def run():
        return compiled(state, batch, hyper, rest)
    run.hlo_text = compiled.as_text()
    run.labels = op_labels(run.hlo_text)
    run.temp_bytes = temp_bytes(compiled)
    return run


if __name__ == "__main__":
    main()
