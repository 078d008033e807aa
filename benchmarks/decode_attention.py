"""Decode-step attention: the two dots vs the multiply-and-sum form, alone and inside `generate`.

`attend_cache` runs a float32 decode step (one query per row) either as two dots or as
broadcast multiplies and sums (`decoder._attend_one_token`); `decoder.one_token_form_pays`
picks by cache slots. This script measures both forms where the choice is made:

  --what kernel    one decode step's attention over 30 SmolLM2-shaped layers (9 query heads,
                   3 kv heads, head dim 64), float32, for each rows x slots in --grid; best of
                   --repeats compiled calls per form, and which form the rule picks.
  --what generate  `generate` end to end with the form forced each way (decode.py's cases:
                   batch 1/8/64 greedy 64 tokens, and G = 8 samples x 512 tokens with EOS),
                   each form in a fresh process, tokens/s as in decode.py.

    python benchmarks/decode_attention.py --what kernel [--grid 1x96,8x544,...] [--out F]
    python benchmarks/decode_attention.py --what generate --model-dir $PEERS_ROOT/models/smollm2-135m

Timings only compare within one run on one machine (the 1-minute load average is recorded).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

LAYERS, HEADS, KV_HEADS, HEAD_DIM = 30, 9, 3, 64
DEFAULT_GRID = "1x96,1x544,8x96,8x160,8x256,8x544,16x96,16x544,32x96,32x544,64x96,64x160,64x256,64x544"
FORMS = ("dots", "one_token")


def kernel(args) -> dict:
    import jax
    import jax.numpy as jnp

    from jaxrl_vr.models import decoder

    forms = {"dots": lambda q, k, v, allowed: decoder._attend_two_dots(q, k, v, allowed, jnp.float32),
             "one_token": decoder._attend_one_token}

    def layers_program(form):
        @jax.jit
        def run(q, ks, vs, allowed):
            def body(carry, kv):  # Each layer's query depends on the last output, as in a model.
                out = form(q + carry, kv[0], kv[1], allowed)
                return carry + 1e-3 * jnp.transpose(out, (0, 2, 1, 3, 4)), None
            return jax.lax.scan(body, jnp.zeros_like(q), (ks, vs))[0]
        return run

    rows_out = []
    for cell in args.grid.split(","):
        rows, slots = (int(x) for x in cell.split("x"))
        rng = np.random.default_rng(0)
        q = jnp.asarray(rng.standard_normal((rows, 1, KV_HEADS, HEADS // KV_HEADS, HEAD_DIM), np.float32))
        ks = jnp.asarray(rng.standard_normal((LAYERS, rows, KV_HEADS, HEAD_DIM, slots), np.float32))
        vs = jnp.asarray(rng.standard_normal((LAYERS, rows, KV_HEADS, slots, HEAD_DIM), np.float32))
        allowed = jnp.asarray(rng.random((rows, 1, slots)) < 0.9)
        row = {"rows": rows, "slots": slots}
        for name, form in forms.items():
            run = layers_program(form)
            run(q, ks, vs, allowed).block_until_ready()
            seconds = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                run(q, ks, vs, allowed).block_until_ready()
                seconds.append(time.perf_counter() - start)
            row[f"{name}_ms"] = 1e3 * min(seconds)
        row["one_token_over_dots"] = row["one_token_ms"] / row["dots_ms"]
        row["rule_picks"] = ("one_token" if decoder.one_token_form_pays(1, slots, (jnp.float32,) * 3)
                             else "dots")
        print(f"rows {rows:3d} slots {slots:5d}  dots {row['dots_ms']:8.2f} ms  one_token "
              f"{row['one_token_ms']:8.2f} ms  ratio {row['one_token_over_dots']:.2f}  rule: {row['rule_picks']}",
              flush=True)
        rows_out.append(row)
    return {"layers": LAYERS, "heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM,
            "repeats": args.repeats, "cells": rows_out}


def generate_child(args) -> None:
    """One form forced for every decode step, decode.py's jax side over its cases."""
    import decode  # benchmarks/decode.py

    from jaxrl_vr.models import decoder

    force = args.form == "one_token"
    decoder.one_token_form_pays = lambda tokens, slots, dtypes: force and tokens == 1
    with open(args.cases) as f:
        cases = json.load(f)
    result = decode.jax_side(argparse.Namespace(release_host_memory=False, precision="fp32",
                                                model_dir=args.model_dir, repeats=args.repeats), cases)
    with open(args.child_out, "w") as f:
        json.dump(result, f)


def generate_ab(args) -> dict:
    sys.path.insert(0, HERE)
    import decode

    from jaxrl_vr.models import load_tokenizer

    cases = decode.make_cases(argparse.Namespace(model_dir=args.model_dir, batches=args.batches,
                                                 new_tokens=64, long_new_tokens=512),
                              load_tokenizer(args.model_dir))
    work = tempfile.mkdtemp(prefix="decode_attention_")
    cases_path = os.path.join(work, "cases.json")
    with open(cases_path, "w") as f:
        json.dump(cases, f)
    forms = {}
    for form in FORMS:
        print(f"=== generate, attention form {form} ===", flush=True)
        out_path = os.path.join(work, f"{form}.json")
        subprocess.run([sys.executable, os.path.abspath(__file__), "--generate-child", "--form", form,
                        "--cases", cases_path, "--child-out", out_path, "--model-dir", args.model_dir,
                        "--repeats", str(args.repeats)], check=True)
        with open(out_path) as f:
            forms[form] = json.load(f)
    rows = {}
    for case in cases:
        name = case["name"]
        dots, one = forms["dots"][name], forms["one_token"][name]
        rows[name] = {"dots_tokens_per_s": dots["tokens_per_s"], "one_token_tokens_per_s": one["tokens_per_s"],
                      "one_token_speedup": one["tokens_per_s"] / dots["tokens_per_s"],
                      "same_first_tokens": dots["tokens"] == one["tokens"],
                      "dots_seconds_all": dots["seconds_all"], "one_token_seconds_all": one["seconds_all"]}
        print(f"{name:>8}: dots {dots['tokens_per_s']:8.1f} tok/s, one_token {one['tokens_per_s']:8.1f} tok/s, "
              f"speed-up {rows[name]['one_token_speedup']:.2f}", flush=True)
    return {"model": os.path.basename(os.path.normpath(args.model_dir)), "repeats": args.repeats,
            "cases": rows}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    peers = os.environ.get("PEERS_ROOT", os.path.expanduser("~/.cache/jaxrl_vr-peers"))
    parser.add_argument("--what", choices=("kernel", "generate"), default="kernel")
    parser.add_argument("--grid", default=DEFAULT_GRID, help="rows x slots cells, comma-separated (kernel)")
    parser.add_argument("--model-dir", default=os.path.join(peers, "models", "smollm2-135m"))
    parser.add_argument("--batches", default="1,8,64", help="generate: decode.py's greedy batch cases")
    parser.add_argument("--repeats", type=int, default=None, help="default 11 (kernel), 3 (generate)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--generate-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--form", choices=FORMS, help=argparse.SUPPRESS)
    parser.add_argument("--cases", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.generate_child:
        sys.path.insert(0, HERE)
        return generate_child(args)
    args.repeats = args.repeats or (11 if args.what == "kernel" else 3)
    load_start = os.getloadavg()[0]
    report = kernel(args) if args.what == "kernel" else generate_ab(args)
    report.update(what=args.what, cpu_count=os.cpu_count(), load_1m_start=load_start,
                  load_1m_end=os.getloadavg()[0])
    out = args.out or os.path.join(HERE, "results", f"decode_attention_{args.what}.json")
    with open(out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
