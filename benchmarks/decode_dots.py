"""The decode loop's dots alone, XLA against torch, side by side: how fast each library runs
the rollout's small-M matmuls on this CPU.

One decode step of a SmolLM2-135M-shaped model (`--shapes wide-qwen2`: the peers' 0.4B model)
at `--rows` rows (the RL rollout's 64) is, as far as the dots go, per layer q, k, v, o, gate,
up and down, then the LM head. This runs only those dots (random float32 weights, a residual
chain so no step can be skipped) for `--steps` steps in each library: XLA through `jax.jit` of a `fori_loop` in this environment,
torch in the peer TRL venv (`--torch-python`), each in a fresh process, alternated `--rounds`
times. Neither side attends, samples or normalises, so the result bounds what any rollout
built on that library can reach here: perf29 (docs/performance.md) measured XLA at 260 and
torch at 128 GFLOP/s (fp32, 64 rows) on a Zen 5 EPYC, where our rollout leads TRL's 3×; perf18 measured a
torch MLP stack 11 % faster than XLA's on an AMX Xeon, where the lead was 1.6×.

    python benchmarks/decode_dots.py [--shapes wide-qwen2] [--rows 64] [--steps 63] [--rounds 2] [--precision bf16] \\
        [--sides jax,torch,packed] [--torch-python $PEERS_ROOT/venv-trl/bin/python] [--out benchmarks/results/decode_dots.json]

`--sides packed` adds a third side (g++; fp32 on x86 with AVX2 and FMA, bf16 on x86 with
AMX-BF16): the jax side's step with every dot on the library's packed-dot decode kernel
(`jaxrl_vr.models.packed_dot`, weights packed once, outside the timed calls), the dots the
samplers run on such a CPU.

bf16: bf16 weights (cast once, outside the timed calls) on both sides; bf16 operands with
float32 accumulation on ours (`preferred_element_type`), autocast's bf16 matmuls on torch's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

SMOLLM2_135M = dict(layers=30, hidden=576, q_width=576, kv_width=192, intermediate=1536, vocab=49152)
"""The dot shapes of SmolLM2-135M: 9 query heads and 3 kv heads of 64, tied 49,152-token head."""

WIDE_QWEN2 = dict(layers=24, hidden=896, q_width=896, kv_width=128, intermediate=4864, vocab=49152)
"""The dot shapes of the peers' `wide-qwen2` (Qwen2.5-0.5B's layers): 14 query and 2 kv heads of 64."""

SHAPES = {"smollm2-135m": SMOLLM2_135M, "wide-qwen2": WIDE_QWEN2}


def layer_weight_shapes(layers: int, hidden: int, q_width: int, kv_width: int, intermediate: int,
                        vocab: int) -> dict[str, tuple[int, int]]:
    """One layer's dot weights as [in, out]: q, k, v, o, gate, up, down."""
    del layers, vocab  # The same for every layer; the head is separate.
    return dict(q=(hidden, q_width), k=(hidden, kv_width), v=(hidden, kv_width), o=(q_width, hidden),
                gate=(hidden, intermediate), up=(hidden, intermediate), down=(intermediate, hidden))


def step_flops(rows: int, **model) -> int:
    """Multiply-adds × 2 of one decode step's dots: every layer's weights, then the LM head (D·V)."""
    per_layer = sum(a * b for a, b in layer_weight_shapes(**model).values())
    return 2 * rows * (model["layers"] * per_layer + model["hidden"] * model["vocab"])


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def host_cpu():
    """`jaxrl_vr.host_cpu`, imported here only: the torch side runs this file in the peer
    venv, which has no jaxrl_vr (nor jax)."""
    sys.path.insert(0, REPO)
    from jaxrl_vr import host_cpu as module
    return module


def random_weights(shapes: str, rng):
    """Every layer's dot weights ([in, out], float32 numpy, `layer_weight_shapes`) and the LM
    head [V, D], drawn from `rng` in that order: the jax and packed sides run the same numbers."""
    import numpy as np

    s = SHAPES[shapes]
    weights = [{name: 0.02 * rng.standard_normal(shape, np.float32) for name, shape in layer_weight_shapes(**s).items()}
               for _ in range(s["layers"])]
    return weights, 0.02 * rng.standard_normal((s["vocab"], s["hidden"]), np.float32)


def time_calls(call, repeats: int) -> list[float]:
    """One warm-up call (compilation, first touches), then `repeats` timed calls."""
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def jax_side(args, packed: bool = False) -> list[float]:
    sys.path.insert(0, REPO)
    from jaxrl_vr.host_memory import keep_host_memory
    keep_host_memory()
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxrl_vr.models import packed_dot

    s = SHAPES[args.shapes]
    dtype = jnp.bfloat16 if args.precision == "bf16" else jnp.float32
    rng = np.random.default_rng(0)
    # Weights in the compute dtype once, as the sampler's `cast_matmul_weights` does per call
    # (or packed once, as `sampler.decode_weights` does per rollout).
    weights, head = random_weights(args.shapes, rng)
    weights = [{name: jnp.asarray(w, dtype) for name, w in layer.items()} for layer in weights]
    head = jnp.asarray(head, dtype)
    if packed:
        weights = [{name: packed_dot.pack(w) for name, w in layer.items()} for layer in weights]
        head = packed_dot.pack_transposed(head)
    repeats = s["q_width"] // s["kv_width"]

    def dot(x, w):
        if packed:
            return packed_dot.packed_dot(x, w)
        return jnp.matmul(x.astype(dtype), w, preferred_element_type=jnp.float32)

    def head_dot(x, head):
        if packed:
            return packed_dot.packed_dot(x, head)
        return jnp.matmul(x.astype(dtype), head.T, preferred_element_type=jnp.float32)

    @jax.jit
    def run(x, weights, head):
        def step(_, x):
            for w in weights:
                attn = dot(x, w["q"]) + jnp.tile(dot(x, w["k"]) + dot(x, w["v"]), (1, repeats))
                x = x + dot(attn, w["o"])
                x = 0.5 * (x + dot(jax.nn.silu(dot(x, w["gate"])) * dot(x, w["up"]), w["down"]))
            return x + 1e-3 * head_dot(x, head)[:, :s["hidden"]]
        return jax.lax.fori_loop(0, args.steps, step, x)

    x = jnp.asarray(rng.standard_normal((args.rows, s["hidden"]), np.float32))
    return time_calls(lambda: jax.block_until_ready(run(x, weights, head)), args.repeats)


def packed_side(args) -> list[float]:
    """The jax side's step, every dot on the packed-dot kernel (fp32: AVX2 + FMA; bf16: AMX)."""
    sys.path.insert(0, REPO)
    from jaxrl_vr.models import packed_dot

    reason = packed_dot.unavailable_reason("bfloat16" if args.precision == "bf16" else "float32")
    if reason is not None:
        raise SystemExit(f"--sides packed needs the packed-dot kernel, but {reason}.")
    return jax_side(args, packed=True)


def torch_side(args) -> list[float]:
    import contextlib

    import torch

    s = SHAPES[args.shapes]
    gen = torch.Generator().manual_seed(0)
    shapes = layer_weight_shapes(**s)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32  # cast once, as on our side
    weights = [{name: (0.02 * torch.randn(shape, generator=gen)).to(dtype) for name, shape in shapes.items()}
               for _ in range(s["layers"])]
    head = (0.02 * torch.randn(s["vocab"], s["hidden"], generator=gen)).to(dtype)
    repeats = s["q_width"] // s["kv_width"]
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if args.precision == "bf16"
                else contextlib.nullcontext())

    @torch.no_grad()
    def run(x):
        with autocast:
            for _ in range(args.steps):
                for w in weights:
                    attn = x @ w["q"] + (x @ w["k"] + x @ w["v"]).repeat(1, repeats)
                    x = x + (attn @ w["o"]).float()
                    x = 0.5 * (x + ((torch.nn.functional.silu(x @ w["gate"]) * (x @ w["up"])) @ w["down"]).float())
                x = x + 1e-3 * (x @ head.T)[:, :s["hidden"]].float()
        return x

    x = torch.randn(args.rows, s["hidden"], generator=gen)
    return time_calls(lambda: run(x), args.repeats)


SIDES = {"jax": jax_side, "torch": torch_side, "packed": packed_side}


def summarize(times: dict[str, list[list[float]]], flops: int) -> dict:
    """Per side: every round's median seconds, the median over rounds, its GFLOP/s; and each
    other side's GFLOP/s over ours (`torch_over_jax_gflops`, above 1: torch's dots are faster
    on this CPU; `packed_over_jax_gflops` likewise)."""
    out = {}
    for side, rounds in times.items():
        medians = [statistics.median(r) for r in rounds]
        out[side] = {"round_median_s": medians, "median_s": statistics.median(medians),
                     "gflops": flops / statistics.median(medians) / 1e9}
    for side in times:
        if side != "jax" and "jax" in times:
            out[f"{side}_over_jax_gflops"] = out[side]["gflops"] / out["jax"]["gflops"]
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    peers = os.environ.get("PEERS_ROOT", os.path.expanduser("~/.cache/jaxrl_vr-peers"))
    parser.add_argument("--torch-python", default=os.path.join(peers, "venv-trl", "bin", "python"))
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--shapes", choices=sorted(SHAPES), default="smollm2-135m", help="whose dot shapes")
    parser.add_argument("--steps", type=int, default=63, help="decode steps per call (the rollout's 64 tokens)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per process, after one warm-up")
    parser.add_argument("--rounds", type=int, default=2, help="processes per side, alternated")
    parser.add_argument("--sides", default="jax,torch",
                        help="comma-separated, of jax, torch and packed (the packed-dot kernel: fp32 on AVX2 + FMA, "
                             "bf16 on AMX-BF16)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--side", choices=tuple(SIDES), help=argparse.SUPPRESS)  # child process
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.rows, args.steps, args.repeats, args.rounds) < 1:
        parser.error("--rows, --steps, --repeats and --rounds must all be at least 1.")
    sides = [side.strip() for side in args.sides.split(",") if side.strip()]
    if not sides or any(side not in SIDES for side in sides) or len(set(sides)) < len(sides):
        parser.error(f"--sides {args.sides!r}: name each of {', '.join(SIDES)} at most once, comma-separated.")
    if args.side:
        times = SIDES[args.side](args)
        with open(args.child_out, "w") as f:
            json.dump(times, f)
        return {}
    if "torch" in sides and not os.path.exists(args.torch_python):
        parser.error(f"--torch-python {args.torch_python} not found; build the peer venv with "
                     "`bash ../shared/peers/setup.sh trl` or point the flag at a Python with torch.")

    work = tempfile.mkdtemp(prefix="decode_dots_")
    times = {side: [] for side in sides}
    load = [os.getloadavg()[0]]
    for index in range(args.rounds):
        for side in (sides if index % 2 == 0 else sides[::-1]):
            out_path = os.path.join(work, f"{side}_{index}.json")
            python = args.torch_python if side == "torch" else sys.executable
            subprocess.run([python, os.path.abspath(__file__), "--side", side, "--child-out", out_path,
                            "--precision", args.precision, "--shapes", args.shapes, "--rows", str(args.rows),
                            "--steps", str(args.steps), "--repeats", str(args.repeats)], check=True)
            with open(out_path) as f:
                times[side].append(json.load(f))
            print(f"round {index + 1}/{args.rounds} {side}: " + ", ".join(f"{t:.2f}" for t in times[side][-1])
                  + " s", flush=True)
            load.append(os.getloadavg()[0])
    flops = args.steps * step_flops(args.rows, **SHAPES[args.shapes])
    report = {"precision": args.precision, "shapes": args.shapes, "rows": args.rows, "steps": args.steps,
              "flops": flops, "cpu": host_cpu().summary(), "cpu_count": os.cpu_count(), "load_1m": load, "times_s": times, **summarize(times, flops)}
    print(f"{args.precision} dots at {args.rows} rows: "
          + ", ".join(f"{side} {report[side]['gflops']:.0f} GFLOP/s" for side in sides)
          + "".join(f" ({side} / jax {report[f'{side}_over_jax_gflops']:.2f})" for side in sides
                    if f"{side}_over_jax_gflops" in report))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    main()
