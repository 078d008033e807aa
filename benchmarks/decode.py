"""Decode throughput: jaxrl_vr's jitted sampler vs transformers' `generate` (torch, CPU).

Both sides run the same SmolLM2-135M weights (the Q4_1 GGUF dequantised to float32 when
present, else a random model of the same shape), the same prompts and the same number of new
tokens (greedy, no early stop), batch 1 / 8 / 64. Tokens/s = batch * new tokens / wall time of
one call after a warm-up call (compilation excluded and reported separately).

    python benchmarks/decode.py [--gguf PATH] [--batches 1,8,64] [--new-tokens 32]
                                [--threads N] [--repeats R] [--out FILE]

The torch side needs torch + transformers in the same environment; without torch it is
skipped with a message and only JAX numbers are written. The two sides run in turn, never at
once, on the same `--threads` cores (the process is pinned to them; torch gets N intra-op
threads, XLA's Eigen pool is single-threaded when N = 1). Each number is the best of
`--repeats` timed calls. On a shared machine use `--threads 1`: torch's OpenMP threads
stall badly when another process takes one of their cores, XLA's pool much less, so an
oversubscribed multi-thread run flatters JAX.
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


def bench_jax(config, tensors, batches, prompt_len, new_tokens, repeats=1):
    import jax

    from jaxrl_vr.models.hf_io import from_hf_state_dict
    from jaxrl_vr.sampling import generate

    model = from_hf_state_dict(config, tensors, dtype="float32")
    results = {}
    for batch in batches:
        tokens = make_prompts(batch, prompt_len, config.vocab_size)
        mask = np.ones_like(tokens, bool)

        def run():
            rollout = generate(jax.random.key(0), model, tokens, mask, max_new_tokens=new_tokens, greedy=True,
                               stop_token_ids=(), pad_id=0)
            return jax.block_until_ready(rollout.tokens_bt)

        start = time.perf_counter()
        run()
        first = time.perf_counter() - start
        seconds = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            out = run()
            seconds = min(seconds, time.perf_counter() - start)
        assert out.shape == (batch, new_tokens)
        results[batch] = {"seconds": seconds, "tokens_per_s": batch * new_tokens / seconds,
                          "first_call_s": first, "tokens": np.asarray(out)}
        print(f"jax    batch {batch:3d}: {results[batch]['tokens_per_s']:9.1f} tok/s "
              f"({seconds:.2f} s; first call incl. compile {first:.1f} s)", flush=True)
    return results


def bench_torch(config, tensors, batches, prompt_len, new_tokens, repeats=1, threads=None):
    try:
        import torch
        import transformers
    except ImportError as error:
        print(f"torch side skipped: {error}. Install torch + transformers in this environment to compare.")
        return None
    torch.set_num_threads(threads or len(os.sched_getaffinity(0)))
    model = transformers.AutoModelForCausalLM.from_config(config.to_hf(), dtype=torch.float32)
    state = {k: torch.from_numpy(np.array(v, np.float32)) for k, v in tensors.items()}  # writable copies
    missing, unexpected = model.load_state_dict(state, strict=False)
    if [m for m in missing if m != "lm_head.weight"] or unexpected:
        raise RuntimeError(f"torch model load mismatch: missing={missing}, unexpected={unexpected}")
    model.tie_weights()
    model.eval()
    results = {}
    for batch in batches:
        tokens = torch.from_numpy(make_prompts(batch, prompt_len, config.vocab_size).astype(np.int64))
        kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                      pad_token_id=config.pad_token_id, attention_mask=torch.ones_like(tokens))
        with torch.inference_mode():
            model.generate(tokens, **{**kwargs, "max_new_tokens": 2, "min_new_tokens": 2})  # warm-up
            seconds = float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                out = model.generate(tokens, **kwargs)
                seconds = min(seconds, time.perf_counter() - start)
        results[batch] = {"seconds": seconds, "tokens_per_s": batch * new_tokens / seconds,
                          "tokens": out[:, prompt_len:].numpy()}
        print(f"torch  batch {batch:3d}: {results[batch]['tokens_per_s']:9.1f} tok/s ({seconds:.2f} s)", flush=True)
    return results, {"torch": torch.__version__, "transformers": transformers.__version__,
                     "torch_threads": torch.get_num_threads()}


def main(argv=None) -> None:
    import get_smollm2

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", default=get_smollm2.default_path())
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None, help="cores for both sides (default: all)")
    parser.add_argument("--repeats", type=int, default=2, help="timed calls per point; the best counts")
    parser.add_argument("--out", default="benchmarks/decode_results.json")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    cores = sorted(os.sched_getaffinity(0))
    threads = args.threads or len(cores)
    if threads > len(cores):
        raise SystemExit(f"--threads {threads} but only {len(cores)} cores are available.")
    os.sched_setaffinity(0, cores[:threads])  # Before jax/torch start their thread pools.
    if threads == 1:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()

    import jax

    config, tensors, source = load_weights(args.gguf)
    print(f"model: {source}; {config.num_layers} layers, width {config.hidden_size}; prompt {args.prompt_len}, "
          f"{args.new_tokens} new tokens, greedy; backend {jax.default_backend()}; {threads} thread(s), "
          f"best of {args.repeats}; load average {os.getloadavg()[0]:.1f}", flush=True)
    jax_results = bench_jax(config, tensors, batches, args.prompt_len, args.new_tokens, args.repeats)
    torch_out = bench_torch(config, tensors, batches, args.prompt_len, args.new_tokens, args.repeats, threads)
    torch_results, torch_versions = torch_out if torch_out else (None, {})

    report = {"model": source, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
              "jax": jax.__version__, "backend": jax.default_backend(), "threads": threads,
              "repeats": args.repeats, "load_average_at_end": os.getloadavg(),
              "machine": platform.machine(), **torch_versions, "batches": {}}
    print(f"\n{'batch':>5} {'jax tok/s':>10} {'torch tok/s':>12} {'ratio':>6} {'same tokens':>12}")
    for batch in batches:
        row = {"jax_tokens_per_s": jax_results[batch]["tokens_per_s"], "jax_seconds": jax_results[batch]["seconds"],
               "jax_first_call_s": jax_results[batch]["first_call_s"]}
        line = f"{batch:5d} {row['jax_tokens_per_s']:10.1f}"
        if torch_results:
            t = torch_results[batch]
            agree = float((t["tokens"] == jax_results[batch]["tokens"]).mean())
            row.update(torch_tokens_per_s=t["tokens_per_s"], torch_seconds=t["seconds"],
                       ratio=row["jax_tokens_per_s"] / t["tokens_per_s"], greedy_token_agreement=agree)
            line += f" {t['tokens_per_s']:12.1f} {row['ratio']:6.2f} {agree:12.3f}"
        report["batches"][str(batch)] = row
        print(line)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
