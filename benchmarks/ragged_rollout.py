"""Where a long, ragged rollout's time goes: the compacting sampler's decode chunks timed per
(batch bucket, cache length), on one step's prompts of the peer workload.

Runs `generate` (compaction on) a few times with one key and reports, for the last run, the
decode steps and milliseconds per step in each (rows, cache slots) pair it visited, the
rollout's seconds and real tokens. The first run compiles. `--cache-dtype` overrides the
sampler's KV-cache dtype (default: `decoder.default_cache_dtype`).

    python benchmarks/ragged_rollout.py --model-dir $PEERS_ROOT/models/smollm2-135m \\
        --prompts-file prompts.jsonl --step 1 [--cache-dtype bfloat16] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rl_step  # noqa: E402
from jaxrl_vr.host_memory import keep_host_memory  # noqa: E402
from jaxrl_vr.models import from_pretrained, load_tokenizer, set_compute_dtype  # noqa: E402
from jaxrl_vr.sampling import compact as compact_lib  # noqa: E402
from jaxrl_vr.sampling import generate  # noqa: E402


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--prompts-file", required=True, help="one JSON string per line (peers' prompts.py)")
    parser.add_argument("--step", type=int, default=1, help="prompts [step * P, (step + 1) * P)")
    parser.add_argument("-P", "--prompts", type=int, default=8)
    parser.add_argument("-G", "--gens", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--precision", choices=tuple(rl_step.PRECISIONS), default="bf16")
    parser.add_argument("--cache-dtype", default=None, help="float32 or bfloat16 (default: the sampler's choice)")
    parser.add_argument("--compact-every", type=int, default=None)
    parser.add_argument("--runs", type=int, default=2, help="rollouts with the same key; the first compiles")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    keep_host_memory()
    model = from_pretrained(args.model_dir, dtype="float32")
    set_compute_dtype(model, rl_step.PRECISIONS[args.precision])
    tokenizer = load_tokenizer(args.model_dir)
    with open(args.prompts_file) as f:
        texts = [json.loads(line) for line in f if line.strip()][args.step * args.prompts:(args.step + 1) * args.prompts]
    tokens, mask = rl_step.encode(tokenizer, texts, 64)

    chunk_seconds = []
    decode_chunk = compact_lib._decode_chunk

    def timed_chunk(*a, **kw):
        start = time.perf_counter()
        out = decode_chunk(*a, **kw)
        out.step.block_until_ready()
        chunk_seconds.append(time.perf_counter() - start)
        return out

    compact_lib._decode_chunk = timed_chunk
    runs = []
    try:
        for _ in range(args.runs):
            chunk_seconds.clear()
            start = time.perf_counter()
            rollout = generate(jax.random.key(args.seed), model, tokens, mask, num_samples=args.gens,
                               max_new_tokens=args.max_new_tokens, stop_token_ids=(tokenizer.eos_id,),
                               pad_id=tokenizer.pad_id or 0, compact=True, cache_dtype=args.cache_dtype,
                               compact_every=args.compact_every)
            rollout.tokens_bt.block_until_ready()
            seconds = time.perf_counter() - start
            real = int(np.asarray(rollout.mask_bt).sum())
            runs.append({"seconds": round(seconds, 2), "real_tokens": real, "tokens_per_s": round(real / seconds, 1)})
            print(json.dumps(runs[-1]), flush=True)
    finally:
        compact_lib._decode_chunk = decode_chunk
    pairs, reached = {}, 0
    for (rows, slots, step), secs in zip(compact_lib.LAST_CHUNKS, chunk_seconds):
        entry = pairs.setdefault((rows, slots), {"rows": rows, "cache_slots": slots, "decode_steps": 0, "seconds": 0.0})
        entry["decode_steps"] += step - reached
        entry["seconds"] += secs
        reached = step
    table = sorted(pairs.values(), key=lambda e: (-e["rows"], e["cache_slots"]))
    for entry in table:
        entry["ms_per_step"] = round(1e3 * entry["seconds"] / max(entry["decode_steps"], 1), 1)
        entry["seconds"] = round(entry["seconds"], 2)
        print(f"  rows {entry['rows']:3d}  cache {entry['cache_slots']:4d}: {entry['decode_steps']:4d} steps "
              f"{entry['seconds']:6.2f} s  {entry['ms_per_step']:6.1f} ms/step")
    result = {"precision": args.precision, "cache_dtype": args.cache_dtype or "default", "step": args.step,
              "P": args.prompts, "G": args.gens, "max_new_tokens": args.max_new_tokens,
              "compact_every": args.compact_every or compact_lib.DEFAULT_COMPACT_EVERY, "runs": runs,
              "last_run_chunks": table}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
