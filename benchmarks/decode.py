"""Decode throughput: jaxrl_vr's jitted sampler vs transformers' `generate` (torch, CPU).

Both sides run the same SmolLM2-135M weights (the Q4_1 GGUF dequantised to float32 when
present, else a random model of the same shape), the same prompts and the same number of new
tokens (greedy, no early stop), batch 1 / 8 / 64. Tokens/s = batch * new tokens / wall time of
one call (prefill included) after a warm-up call (compilation excluded, reported separately).

    python benchmarks/decode.py [--gguf PATH] [--batches 1,8,64] [--new-tokens 32]
                                [--threads 1,2] [--repeats R] [--out FILE]

The torch side needs torch + transformers in the same environment; without torch it is
skipped with a message and only JAX numbers are written. Fairness on a shared machine:
each thread count runs in its own process pinned to that many cores (torch gets N intra-op
threads; XLA's Eigen pool is single-threaded when N = 1), and the two sides' timed calls
alternate (jax, torch, jax, torch, ...) so slow drifts of the machine's load hit both alike.
Each number is the median of `--repeats` timed calls (min and max are written too), with
the 1-minute load average before and after. Torch runs with OMP_WAIT_POLICY=PASSIVE unless
set otherwise (its default busy-waiting OpenMP threads stall badly when another process holds
one of their cores). On a loaded machine multi-thread numbers still swing with the other
processes: read the load averages next to them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "experiments"))

SMOLLM2_SHAPE = dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9, num_kv_heads=3,
    head_dim=64, rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
    max_position_embeddings=8192, bos_token_id=1, eos_token_id=2, pad_token_id=2, model_type="llama",
)


def load_weights(gguf_path: str | None):
    """(DecoderConfig, HF-named float32 tensors, source description)."""
    from jaxrl_vr.models.config import DecoderConfig

    if gguf_path and os.path.isfile(gguf_path):
        from jaxrl_vr.models.gguf_io import read_gguf

        checkpoint = read_gguf(gguf_path, with_tokenizer=False)
        return checkpoint.config, checkpoint.tensors, f"gguf:{os.path.basename(gguf_path)}"
    from flax import nnx

    from jaxrl_vr.models.decoder import Decoder
    from jaxrl_vr.models.hf_io import to_hf_state_dict

    config = DecoderConfig(**SMOLLM2_SHAPE)
    print(f"GGUF not found at {gguf_path!r}: using a random model of SmolLM2-135M's shape.")
    return config, to_hf_state_dict(Decoder(config, rngs=nnx.Rngs(0))), "random"


def make_prompts(batch: int, prompt_len: int, vocab_size: int) -> np.ndarray:
    rng = np.random.default_rng(batch)
    return rng.integers(100, vocab_size, size=(batch, prompt_len)).astype(np.int32)


def jax_runner(config, tensors, new_tokens):
    """batch tokens -> (warm-up fn, timed fn); both return the [B, new_tokens] int32 tokens."""
    import jax

    from jaxrl_vr.models.hf_io import from_hf_state_dict
    from jaxrl_vr.sampling import generate

    model = from_hf_state_dict(config, tensors, dtype="float32")

    def make(tokens):
        mask = np.ones_like(tokens, bool)

        def run():
            rollout = generate(jax.random.key(0), model, tokens, mask, max_new_tokens=new_tokens, greedy=True,
                               stop_token_ids=(), pad_id=0)
            return np.asarray(jax.block_until_ready(rollout.tokens_bt))
        return run, run
    return make


def torch_runner(config, tensors, new_tokens, threads):
    """As `jax_runner` for transformers' generate, or None (with a message) without torch."""
    try:
        import torch
        import transformers
    except ImportError as error:
        print(f"torch side skipped: {error}. Install torch + transformers in this environment to compare.")
        return None, {}
    torch.set_num_threads(threads)
    model = transformers.AutoModelForCausalLM.from_config(config.to_hf(), dtype=torch.float32)
    state = {k: torch.from_numpy(np.array(v, np.float32)) for k, v in tensors.items()}  # writable copies
    missing, unexpected = model.load_state_dict(state, strict=False)
    if [m for m in missing if m != "lm_head.weight"] or unexpected:
        raise RuntimeError(f"torch model load mismatch: missing={missing}, unexpected={unexpected}")
    model.tie_weights()
    model.eval()

    def make(tokens_np):
        tokens = torch.from_numpy(tokens_np.astype(np.int64))
        kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                      pad_token_id=config.pad_token_id, attention_mask=torch.ones_like(tokens))

        def run(n=new_tokens):
            with torch.inference_mode():
                out = model.generate(tokens, **{**kwargs, "max_new_tokens": n, "min_new_tokens": n})
            return out[:, tokens.shape[1]:].numpy()
        return (lambda: run(2)), run
    return make, {"torch": torch.__version__, "transformers": transformers.__version__,
                  "torch_threads": torch.get_num_threads()}


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def bench(config, tensors, batches, prompt_len, new_tokens, repeats, threads):
    """{batch: {side: {...}}}: warm-up each side, then `repeats` alternating timed calls."""
    sides = {"jax": jax_runner(config, tensors, new_tokens)}
    torch_make, versions = torch_runner(config, tensors, new_tokens, threads)
    if torch_make is not None:
        sides["torch"] = torch_make
    results = {}
    for batch in batches:
        tokens = make_prompts(batch, prompt_len, config.vocab_size)
        runs = {name: make(tokens) for name, make in sides.items()}
        row = {}
        for name, (warm, _) in runs.items():
            row[name] = {"first_call_s": timed(warm)[0], "seconds_all": []}
        for _ in range(repeats):
            for name, (_, run) in runs.items():
                seconds, out = timed(run)
                assert out.shape == (batch, new_tokens), out.shape
                row[name]["seconds_all"].append(seconds)
                row[name]["tokens"] = out
        for name, r in row.items():
            r["seconds"] = float(np.median(r["seconds_all"]))
            r["tokens_per_s"] = batch * new_tokens / r["seconds"]
            r["tokens_per_s_min_max"] = [batch * new_tokens / max(r["seconds_all"]),
                                         batch * new_tokens / min(r["seconds_all"])]
            print(f"{name:6s} batch {batch:3d}: {r['tokens_per_s']:8.1f} tok/s median "
                  f"(range {r['tokens_per_s_min_max'][0]:.1f}-{r['tokens_per_s_min_max'][1]:.1f}; "
                  f"first call {r['first_call_s']:.1f} s)", flush=True)
        results[batch] = row
    return results, versions


def run_one(args, threads: int) -> dict:
    """One thread count, in this process (call before jax/torch start their thread pools)."""
    cores = sorted(os.sched_getaffinity(0))
    if threads > len(cores):
        raise SystemExit(f"--threads {threads} but only {len(cores)} cores are available.")
    os.sched_setaffinity(0, cores[:threads])
    # Torch's OpenMP threads otherwise busy-wait at every barrier: with another process on one
    # of the cores, a 2-thread transformers run fell from 14 to 2.5 tok/s at batch 1 here.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if threads == 1:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()

    import jax

    batches = [int(b) for b in args.batches.split(",")]
    config, tensors, source = load_weights(args.gguf)
    load_start = os.getloadavg()
    print(f"model: {source}; {config.num_layers} layers, width {config.hidden_size}; prompt {args.prompt_len}, "
          f"{args.new_tokens} new tokens, greedy; backend {jax.default_backend()}; {threads} thread(s), "
          f"median of {args.repeats}; load average {load_start[0]:.1f}", flush=True)
    results, versions = bench(config, tensors, batches, args.prompt_len, args.new_tokens, args.repeats, threads)
    report = {"model": source, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
              "jax": jax.__version__, "backend": jax.default_backend(), "threads": threads,
              "repeats": args.repeats, "statistic": "median", "load_average_at_start": load_start,
              "load_average_at_end": os.getloadavg(), "machine": platform.machine(),
              "omp_wait_policy": os.environ["OMP_WAIT_POLICY"], **versions, "batches": {}}
    print(f"\n{'batch':>5} {'jax tok/s':>10} {'torch tok/s':>12} {'ratio':>6} {'same tokens':>12}")
    for batch in batches:
        j = results[batch]["jax"]
        row = {"jax_tokens_per_s": j["tokens_per_s"], "jax_tokens_per_s_min_max": j["tokens_per_s_min_max"],
               "jax_seconds": j["seconds"], "jax_seconds_all": j["seconds_all"], "jax_first_call_s": j["first_call_s"]}
        line = f"{batch:5d} {row['jax_tokens_per_s']:10.1f}"
        if "torch" in results[batch]:
            t = results[batch]["torch"]
            agree = float((t["tokens"] == j["tokens"]).mean())
            row.update(torch_tokens_per_s=t["tokens_per_s"], torch_tokens_per_s_min_max=t["tokens_per_s_min_max"],
                       torch_seconds=t["seconds"], torch_seconds_all=t["seconds_all"],
                       ratio=row["jax_tokens_per_s"] / t["tokens_per_s"], greedy_token_agreement=agree)
            line += f" {t['tokens_per_s']:12.1f} {row['ratio']:6.2f} {agree:12.3f}"
        report["batches"][str(batch)] = row
        print(line, flush=True)
    return report


def main(argv=None) -> None:
    import get_smollm2

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", default=get_smollm2.default_path())
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", default=None,
                        help="comma-separated thread counts, each run in its own process (default: all cores)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per point; the median counts")
    parser.add_argument("--out", default="benchmarks/decode_results.json")
    parser.add_argument("--single", action="store_true", help=argparse.SUPPRESS)  # Child process: one count.
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.threads.split(",")] if args.threads else [len(os.sched_getaffinity(0))]
    if args.single or len(counts) == 1:
        report = run_one(args, counts[0])
        if not args.single:
            report = {"runs": {str(counts[0]): report}}
    else:
        import subprocess
        import tempfile

        report = {"runs": {}}
        for n in counts:
            with tempfile.TemporaryDirectory() as tmp:
                child_out = os.path.join(tmp, "run.json")
                command = [sys.executable, os.path.abspath(__file__), "--single", "--threads", str(n),
                           "--gguf", str(args.gguf), "--batches", args.batches, "--prompt-len", str(args.prompt_len),
                           "--new-tokens", str(args.new_tokens), "--repeats", str(args.repeats), "--out", child_out]
                print(f"\n=== {n} thread(s) ===", flush=True)
                subprocess.run(command, check=True)
                with open(child_out) as f:
                    report["runs"][str(n)] = json.load(f)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
