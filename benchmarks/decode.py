"""Decode throughput: jaxrl_vr's jitted sampler vs transformers' `generate`, side by side.

Each side runs in its own process and interpreter: ours in this environment, transformers in
the peer TRL venv (which has torch; this project's environment never needs it). Same HF
safetensors model dir, same prompt ids, same new-token counts, both precisions:
fp32, and bf16 = ours with `set_compute_dtype(model, "bfloat16")` (float32 weights, bf16
matmul operands, float32 accumulation) vs torch `autocast(bfloat16)` over float32 weights.

Cases:
  batch B in --batches (default 1, 8, 64): B prompts of 16 random ids, greedy, --new-tokens
    (default 64) with no early stop (torch: min_new_tokens), prefill included;
  long: one real prompt × G = 8 samples at temperature 1 (no top-k/top-p), 512 new tokens,
    EOS allowed (a sequence ends at EOS; the call ends when all have or at 512).
Tokens/s = generated tokens (up to and including EOS) / wall time of one call, median of
--repeats calls after a warm-up call (compilation excluded, reported as first_call_s). Every
case runs in a fresh process on each side, so ``peak_rss_mb`` (the process's high-water mark:
weights, compiled program, KV cache and every intermediate) belongs to that case alone. Ours
calls ``keep_host_memory()`` first, as ``experiments.train`` and ``rl_step.py`` do
(``--release-host-memory`` measures JAX's default). The 1-minute load average is recorded
before and after each side: on a shared machine only the ratios of runs made back to back mean
anything.

    python benchmarks/decode.py --model-dir $PEERS_ROOT/models/smollm2-135m \\
        [--precisions fp32,bf16] [--batches 1,8,64] [--new-tokens 64] [--long-new-tokens 512] \\
        [--repeats 3] [--torch-python $PEERS_ROOT/venv-trl/bin/python] [--out benchmarks/results/decode_results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
LONG_PROMPT = "Write a long story about a robot who learns to count.\n"
LONG_SAMPLES = 8
LONG_NEW_TOKENS = 512


def long_prompt_ids(tokenizer) -> list[int]:
    """The long-response case's one prompt, as token ids."""
    return tokenizer.encode(LONG_PROMPT, add_bos=bool(getattr(tokenizer, "add_bos_default", False)))


def make_cases(args, tokenizer) -> list[dict]:
    rng = np.random.default_rng(0)
    with open(os.path.join(args.model_dir, "config.json")) as f:
        vocab = int(json.load(f)["vocab_size"])
    cases = [{"name": f"batch{b}", "prompts": rng.integers(min(100, vocab // 2), vocab, size=(b, 16)).tolist(),
              "samples": 1,
              "new_tokens": args.new_tokens, "greedy": True, "stop": False}
             for b in (int(x) for x in args.batches.split(",") if x)]
    if args.long_new_tokens > 0:
        cases.append({"name": "long", "prompts": [long_prompt_ids(tokenizer)], "samples": LONG_SAMPLES,
                      "new_tokens": args.long_new_tokens, "greedy": False, "stop": True})
    return cases


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def time_calls(run, repeats: int) -> dict:
    start = time.perf_counter()
    run()
    first = time.perf_counter() - start
    seconds, generated = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        count, tokens = run()
        seconds.append(time.perf_counter() - start)
        generated.append(count)
    median_s = statistics.median(seconds)
    return {"first_call_s": first, "seconds_all": seconds, "generated_all": generated, "seconds": median_s,
            "tokens_per_s": statistics.median(generated) / median_s, "tokens": tokens,
            "peak_rss_mb": peak_rss_mb()}


def jax_side(args, cases) -> dict:
    sys.path.insert(0, os.path.dirname(HERE))
    from jaxrl_vr.host_memory import keep_host_memory

    host_memory = None if args.release_host_memory else keep_host_memory()  # before any computation
    import jax

    from jaxrl_vr.models import from_pretrained, set_compute_dtype
    from jaxrl_vr.sampling import generate

    model = set_compute_dtype(from_pretrained(args.model_dir), "bfloat16" if args.precision == "bf16" else None)
    eos = model.config.eos_token_ids
    out = {"jax": jax.__version__, "keep_host_memory": bool(host_memory and host_memory.kept)}
    for case in cases:
        tokens_ps = np.asarray(case["prompts"], np.int32)
        mask_ps = np.ones_like(tokens_ps, bool)

        def run(case=case, tokens_ps=tokens_ps, mask_ps=mask_ps):
            rollout = generate(jax.random.key(0), model, tokens_ps, mask_ps, num_samples=case["samples"],
                               max_new_tokens=case["new_tokens"], greedy=case["greedy"], temperature=1.0,
                               stop_token_ids=eos if case["stop"] else (), pad_id=0)
            mask_bt = np.asarray(rollout.mask_bt)
            return int(mask_bt.sum()), np.asarray(rollout.tokens_bt)[:, :8].tolist()
        out[case["name"]] = time_calls(run, args.repeats)
        print(case["name"], round(out[case["name"]]["tokens_per_s"], 1), "tok/s", flush=True)
    return out


def torch_side(args, cases) -> dict:
    import torch
    import transformers

    torch.set_num_threads(os.cpu_count())
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32).eval()
    eos = model.generation_config.eos_token_id
    pad = model.generation_config.pad_token_id
    pad = pad if pad is not None else (eos[0] if isinstance(eos, list) else eos)
    out = {"torch": torch.__version__, "transformers": transformers.__version__, "threads": torch.get_num_threads()}
    for case in cases:
        tokens = torch.tensor(case["prompts"], dtype=torch.long)
        n = case["new_tokens"]
        kwargs = dict(max_new_tokens=n, pad_token_id=pad, attention_mask=torch.ones_like(tokens))
        if case["greedy"]:
            kwargs.update(do_sample=False)
        else:
            kwargs.update(do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                          num_return_sequences=case["samples"])
        if not case["stop"]:
            kwargs.update(min_new_tokens=n)

        def run(tokens=tokens, kwargs=kwargs, case=case):
            with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16,
                                                        enabled=args.precision == "bf16"):
                generated = model.generate(tokens, **kwargs)[:, tokens.shape[1]:]
            if case["stop"]:  # Count up to and including the first EOS.
                eos_ids = eos if isinstance(eos, list) else [eos]
                is_eos = torch.isin(generated, torch.tensor(eos_ids))
                ended = torch.cumsum(is_eos.int(), dim=1) - is_eos.int() > 0
                count = int((~ended).sum())
            else:
                count = generated.numel()
            return count, generated[:, :8].tolist()
        out[case["name"]] = time_calls(run, args.repeats)
        print(case["name"], round(out[case["name"]]["tokens_per_s"], 1), "tok/s", flush=True)
    return out


def child(args) -> None:
    with open(args.cases) as f:
        cases = json.load(f)
    load_start = os.getloadavg()[0]
    result = (jax_side if args.side == "jax" else torch_side)(args, cases)
    result.update(precision=args.precision, load_1m_start=load_start, load_1m_end=os.getloadavg()[0])
    with open(args.child_out, "w") as f:
        json.dump(result, f)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    peers = os.environ.get("PEERS_ROOT", os.path.expanduser("~/.cache/jaxrl_vr-peers"))
    parser.add_argument("--model-dir", default=os.path.join(peers, "models", "smollm2-135m"))
    parser.add_argument("--torch-python", default=os.path.join(peers, "venv-trl", "bin", "python"))
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--long-new-tokens", type=int, default=LONG_NEW_TOKENS, help="0 skips the long-response case")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "decode_results.json"))
    parser.add_argument("--release-host-memory", action="store_true",
                        help="ours: JAX's default host memory handling instead of keep_host_memory()")
    parser.add_argument("--side", choices=("jax", "torch"), help=argparse.SUPPRESS)  # child process
    parser.add_argument("--precision", default="fp32", help=argparse.SUPPRESS)
    parser.add_argument("--cases", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.side:
        return child(args)

    sys.path.insert(0, os.path.dirname(HERE))
    from jaxrl_vr.models import load_tokenizer

    work = tempfile.mkdtemp(prefix="decode_")
    cases = make_cases(args, load_tokenizer(args.model_dir))
    report = {"model": os.path.basename(os.path.normpath(args.model_dir)), "cpu_count": os.cpu_count(),
              "repeats": args.repeats, "cases": {c["name"]: {k: v for k, v in c.items() if k != "prompts"}
                                                 for c in cases}, "runs": {}}
    for precision in args.precisions.split(","):
        sides = {"jax": {}, "torch": {}}
        for case in cases:  # one fresh process per case and side: the peak RSS is that case's own
            cases_path = os.path.join(work, f"case_{case['name']}.json")
            with open(cases_path, "w") as f:
                json.dump([case], f)
            for side, python in (("jax", sys.executable), ("torch", args.torch_python)):
                out_path = os.path.join(work, f"{side}_{precision}_{case['name']}.json")
                print(f"=== {side} {precision} {case['name']} ===", flush=True)
                extra = ["--release-host-memory"] if args.release_host_memory and side == "jax" else []
                subprocess.run([python, os.path.abspath(__file__), "--side", side, "--precision", precision,
                                "--cases", cases_path, "--child-out", out_path, "--model-dir", args.model_dir,
                                "--repeats", str(args.repeats), *extra], check=True)
                with open(out_path) as f:
                    result = json.load(f)
                for key, value in result.items():  # case results by name; process facts keyed per case
                    sides[side][key if key == case["name"] else f"{key}_{case['name']}"] = value
        rows = {}
        for case in cases:
            j, t = sides["jax"][case["name"]], sides["torch"][case["name"]]
            rows[case["name"]] = {"jax_tokens_per_s": j["tokens_per_s"], "torch_tokens_per_s": t["tokens_per_s"],
                                  "ratio": j["tokens_per_s"] / t["tokens_per_s"],
                                  "jax_peak_rss_mb": j["peak_rss_mb"], "torch_peak_rss_mb": t["peak_rss_mb"],
                                  "first8_token_agreement": float(np.mean(np.asarray(j["tokens"]) ==
                                                                          np.asarray(t["tokens"])))
                                  if case["greedy"] else None,
                                  "jax": {k: v for k, v in j.items() if k != "tokens"},
                                  "torch": {k: v for k, v in t.items() if k != "tokens"}}
        report["runs"][precision] = {"cases": rows, **{f"{s}_{k}": v for s in sides for k, v in sides[s].items()
                                                       if not isinstance(v, dict)}}
    print(f"\n{'precision':>9} {'case':>8} {'jax tok/s':>10} {'torch tok/s':>12} {'ratio':>6} "
          f"{'jax MiB':>8} {'torch MiB':>9}")
    for precision, run in report["runs"].items():
        for name, row in run["cases"].items():
            print(f"{precision:>9} {name:>8} {row['jax_tokens_per_s']:10.1f} {row['torch_tokens_per_s']:12.1f} "
                  f"{row['ratio']:6.2f} {row['jax_peak_rss_mb']:8.0f} {row['torch_peak_rss_mb']:9.0f}")
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
