"""How long the peer workload's sampled responses run: HF `generate` or our sampler on one
step's prompts, a few seeds, counting the rows that reach the token cap without EOS.

The ragged side-by-side (`side_by_side.py --workloads ragged512`) compares generated tokens
per rollout second, which depends on how long the responses run (a batch of long answers
keeps a decode batch full). This checks whether two samplers draw the same lengths on the
same prompts and weights (temperature 1, no top-k/top-p, EOS = the tokenizer's):

    $PEERS_ROOT/venv-trl/bin/python benchmarks/response_lengths.py --framework hf \\
        --model $PEERS_ROOT/models/smollm2-135m --prompts-file prompts.jsonl --step 1 --json hf.json
    .venv/bin/python benchmarks/response_lengths.py --framework jaxrl_vr \\
        --model $PEERS_ROOT/models/smollm2-135m --prompts-file prompts.jsonl --step 1 --json ours.json

`--framework hf` needs torch and transformers (the peers' venv); `jaxrl_vr` needs this repo.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def hf_lengths(args, prompts: list[str], seed: int) -> list[tuple[int, bool]]:
    """(length up to and including EOS, reached the cap without EOS) per row, HF generate."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(os.cpu_count() or 1)
    tok = AutoTokenizer.from_pretrained(args.model)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    enc = tok([p for p in prompts for _ in range(args.gens)], return_tensors="pt", padding=True)
    torch.manual_seed(seed)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
        out = model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             max_new_tokens=args.max_new_tokens, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id)
    rows = []
    for row in out[:, enc["input_ids"].shape[1]:].tolist():
        stop = row.index(tok.eos_token_id) + 1 if tok.eos_token_id in row else None
        rows.append((stop or len(row), stop is None))
    return rows


def jaxrl_vr_lengths(args, prompts: list[str], seed: int) -> list[tuple[int, bool]]:
    """The same with `jaxrl_vr.sampling.generate` (bf16 compute for --precision bf16)."""
    import jax
    import numpy as np

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import rl_step
    from jaxrl_vr.models import from_pretrained, load_tokenizer, set_compute_dtype
    from jaxrl_vr.sampling import generate

    model = from_pretrained(args.model, dtype="float32")
    set_compute_dtype(model, rl_step.PRECISIONS[args.precision])
    tok = load_tokenizer(args.model)
    tokens, mask = rl_step.encode(tok, prompts, 64)
    rollout = generate(jax.random.key(seed), model, tokens, mask, num_samples=args.gens,
                       max_new_tokens=args.max_new_tokens, stop_token_ids=(tok.eos_id,), pad_id=tok.pad_id or 0)
    return list(zip(np.asarray(rollout.length_b).tolist(), np.asarray(rollout.truncated_b).tolist()))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--framework", choices=("hf", "jaxrl_vr"), required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts-file", required=True, help="one JSON string per line (peers' prompts.py)")
    parser.add_argument("--step", type=int, default=1, help="prompts [step * P, (step + 1) * P)")
    parser.add_argument("-P", "--prompts", type=int, default=8)
    parser.add_argument("-G", "--gens", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    with open(args.prompts_file) as f:
        prompts = [json.loads(line) for line in f if line.strip()][args.step * args.prompts:(args.step + 1) * args.prompts]
    if len(prompts) < args.prompts:
        raise SystemExit(f"{args.prompts_file} has too few prompts for step {args.step} at -P {args.prompts}.")
    draw = hf_lengths if args.framework == "hf" else jaxrl_vr_lengths
    seeds = []
    for seed in range(args.seeds):
        start = time.perf_counter()
        rows = draw(args, prompts, seed)
        capped = [cap for _, cap in rows]
        seeds.append({"seed": seed, "seconds": round(time.perf_counter() - start, 1),
                      "mean_length": sum(n for n, _ in rows) / len(rows), "rows_at_cap_without_eos": sum(capped),
                      "per_prompt_at_cap": [sum(capped[p * args.gens:(p + 1) * args.gens])
                                            for p in range(args.prompts)]})
        print(json.dumps(seeds[-1]), flush=True)
    result = {"framework": args.framework, "precision": args.precision, "step": args.step, "P": args.prompts,
              "G": args.gens, "max_new_tokens": args.max_new_tokens, "rows": args.prompts * args.gens,
              "seeds": seeds}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
