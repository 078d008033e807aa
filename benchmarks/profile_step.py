"""Per-op profile of the RL update (or, with --what rollout, the rollout) on the rl_step workload.

Traces one warm train-step call with `jax.profiler`, sums the XLA:CPU thunk time per HLO
instruction and labels each with its source op (HLO metadata op_name), so one can see where
an update's time goes (dots forward/backward, LM head, softmax/entropy, weight slicing and
gradient accumulation, optimizer).

    python benchmarks/profile_step.py --model-dir $PEERS_ROOT/models/smollm2-135m \\
        --prompts-file prompts.jsonl [--what update|rollout] [--precision bf16] [--top 30] [--json out.json]
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

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rl_step  # noqa: E402
from jaxrl_vr.host_memory import keep_host_memory  # noqa: E402
from jaxrl_vr.models import from_pretrained, load_tokenizer, set_compute_dtype  # noqa: E402
from jaxrl_vr.sampling import generate  # noqa: E402
from jaxrl_vr.sampling import sampler  # noqa: E402
from jaxrl_vr.train import (  # noqa: E402
    LossConfig, OptimConfig, RolloutBatch, StepHyper, init_train_state, make_optimizer, make_train_step,
    split_model,
)


def op_labels(hlo_text: str) -> dict[str, str]:
    """HLO instruction name -> a short label from its metadata op_name."""
    labels = {}
    for name, op_name in re.findall(r"%([\w.\-]+) = [^\n]*?metadata=\{op_name=\"([^\"]+)\"", hlo_text):
        op = re.sub(r"jit\(\w+\)/", "", op_name)
        op = op.replace("while/body/closed_call/", "").replace("closed_call/", "")
        labels[name] = op[-90:]
    return labels


def profile(fn, labels, top: int, trace_dir: str) -> tuple[float, list]:
    jax.profiler.start_trace(trace_dir)
    start = time.perf_counter()
    jax.block_until_ready(fn())
    wall = time.perf_counter() - start
    jax.profiler.stop_trace()
    path = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True))[-1]
    data = jax.profiler.ProfileData.from_file(path)
    per_op = collections.Counter()
    for plane in data.planes:
        for line in plane.lines:
            if line.name == "python" or "ThreadpoolListener" in line.name:
                continue
            for event in line.events:
                if not event.name.startswith(("end:", "ThunkExecutor", "ThreadpoolListener")):
                    per_op[event.name] += event.duration_ns / 1e9
    total = sum(per_op.values())
    rows = [(name, seconds, seconds / total, labels.get(name, "")) for name, seconds in per_op.most_common(top)]
    print(f"wall {wall:.2f} s, summed op time {total:.2f} s (ops may overlap on threads)")
    for name, seconds, frac, label in rows:
        print(f"{seconds * 1e3:9.1f} ms {100 * frac:5.1f}%  {name[:28]:28s} {label}")
    return wall, rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--prompts-file", required=True)
    parser.add_argument("--what", choices=("update", "rollout"), default="update",
                        help="the train step on one rollout, or the rollout itself (generate's jitted core)")
    parser.add_argument("--precision", choices=tuple(rl_step.PRECISIONS), default="fp32")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--chunk", type=int, default=16)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--json", default=None)
    parser.add_argument("--release-host-memory", action="store_true",
                        help="JAX's default host memory handling instead of keep_host_memory(), as rl_step.py")
    args = parser.parse_args(argv)
    if not args.release_host_memory:
        keep_host_memory()  # before any computation, as rl_step.py and experiments.train

    with open(args.prompts_file) as f:
        texts = [json.loads(line) for line in f if line.strip()][:8]
    model = set_compute_dtype(from_pretrained(args.model_dir), rl_step.PRECISIONS[args.precision])
    tokenizer = load_tokenizer(args.model_dir)
    prompt_ps, mask_ps = rl_step.encode(tokenizer, texts, 32)
    if args.what == "rollout":
        run = rollout_call(model, prompt_ps, mask_ps)
    else:
        rollout = generate(jax.random.key(0), model, prompt_ps, mask_ps, num_samples=8, max_new_tokens=64,
                           stop_token_ids=(), pad_id=0)
        run = update_call(args, model, rollout)
    jax.block_until_ready(run())
    with tempfile.TemporaryDirectory() as trace_dir:
        wall, rows = profile(run, run.labels, args.top, trace_dir)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"what": args.what, "precision": args.precision, "wall_s": wall, "load_1m": os.getloadavg()[0],
                       "top": [dict(name=n, seconds=s, fraction=fr, op=lb) for n, s, fr, lb in rows]}, f, indent=2)


def rollout_call(model, prompt_ps, mask_ps):
    """generate's compiled core on the rl_step rollout (P = 8, G = 8, 64 tokens, EOS suppressed)."""
    core_args, core_kwargs = sampler.generate_core_call(
        jax.random.key(1), model, prompt_ps, mask_ps, num_samples=8, max_new_tokens=64, temperature=1.0,
        top_p=1.0, top_k=0, greedy=False, stop_token_ids=(), pad_id=0, bucket=sampler.DEFAULT_BUCKET,
        cache_dtype=None)
    compiled = sampler._generate_core.lower(*core_args, **core_kwargs).compile()

    def run():
        return compiled(*core_args[1:])  # graphdef is static
    run.labels = op_labels(compiled.as_text())
    return run


def update_call(args, model, rollout):
    """The compiled train step on `rollout`, as a thunk with its op labels attached."""
    graphdef, params, rest = split_model(model)
    optim = make_optimizer(OptimConfig(learning_rate=1e-6, weight_decay=0.0, grad_clip_norm=1.0))
    loss_cfg = LossConfig(num_microbatches=args.microbatches, logprob_chunk_size=args.chunk, detach_behaviour=True)
    state = init_train_state(params, optim, loss_cfg)
    train_step = make_train_step(graphdef, rest, optim, loss_cfg)
    batch = RolloutBatch(rollout.prompt_tokens_bs, rollout.prompt_mask_bs, rollout.tokens_bt, rollout.mask_bt,
                         jnp.asarray(np.linspace(-1, 1, 64, dtype=np.float32)), rollout.logp_bt, rollout.logp_bt,
                         jnp.zeros((64,), jnp.float32))  # no PBA weight
    hyper = StepHyper.create()
    compiled = train_step.jitted.lower(state, batch, hyper, rest).compile()

    def run():
        return compiled(state, batch, hyper, rest)
    run.labels = op_labels(compiled.as_text())
    return run


if __name__ == "__main__":
    main()
