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

`--sides packed` adds a third side (fp32, x86 with AVX2 and FMA, gcc): the same step on
`packed_gemm.c`, a plain register-blocked kernel over weights packed once into 16-column
panels, OpenMP over the panels (compiled into a temporary directory; numpy for the few
elementwise ops). It is not the library's; it shows how far the CPU's small-M dots are from
what XLA's and torch's kernels reach, i.e. what a custom decode kernel could gain.

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


def jax_side(args) -> list[float]:
    sys.path.insert(0, REPO)
    from jaxrl_vr.host_memory import keep_host_memory
    keep_host_memory()
    import jax
    import jax.numpy as jnp
    import numpy as np

    s = SHAPES[args.shapes]
    dtype = jnp.bfloat16 if args.precision == "bf16" else jnp.float32
    rng = np.random.default_rng(0)
    # Weights in the compute dtype once, as the sampler's `cast_matmul_weights` does per call.
    weights, head = random_weights(args.shapes, rng)
    weights = [{name: jnp.asarray(w, dtype) for name, w in layer.items()} for layer in weights]
    head = jnp.asarray(head, dtype)
    repeats = s["q_width"] // s["kv_width"]

    def dot(x, w):
        return jnp.matmul(x.astype(dtype), w, preferred_element_type=jnp.float32)

    @jax.jit
    def run(x, weights, head):
        def step(_, x):
            for w in weights:
                attn = dot(x, w["q"]) + jnp.tile(dot(x, w["k"]) + dot(x, w["v"]), (1, repeats))
                x = x + dot(attn, w["o"])
                x = 0.5 * (x + dot(jax.nn.silu(dot(x, w["gate"])) * dot(x, w["up"]), w["down"]))
            logits = jnp.matmul(x.astype(dtype), head.T, preferred_element_type=jnp.float32)
            return x + 1e-3 * logits[:, :s["hidden"]]
        return jax.lax.fori_loop(0, args.steps, step, x)

    x = jnp.asarray(rng.standard_normal((args.rows, s["hidden"]), np.float32))
    return time_calls(lambda: jax.block_until_ready(run(x, weights, head)), args.repeats)


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


def aligned_empty(shape: tuple[int, ...], alignment: int = 64):
    """A float32 numpy array whose data starts on an `alignment`-byte boundary."""
    import numpy as np

    size = int(np.prod(shape))
    raw = np.empty(size + alignment // 4, np.float32)
    offset = (-raw.ctypes.data % alignment) // 4
    return raw[offset:offset + size].reshape(shape)


def cpu_flags() -> set[str]:
    """The instruction-set flags of /proc/cpuinfo (empty off Linux)."""
    cpu = host_cpu()
    return set((cpu.cpuinfo_field(cpu.read_cpuinfo(), "flags") or "").split())


def build_packed_kernel(work: str) -> str:
    """Compiles packed_gemm.c into `work`; the path of the shared library."""
    import shutil

    if not {"avx2", "fma"} <= cpu_flags():
        raise SystemExit("--sides packed needs an x86 CPU with AVX2 and FMA (see /proc/cpuinfo flags).")
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise SystemExit("--sides packed needs gcc (or cc) to compile benchmarks/packed_gemm.c.")
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "packed_gemm.c")
    library = os.path.join(work, "packed_gemm.so")
    subprocess.run([compiler, "-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC", source, "-o", library],
                   check=True)
    return library


class PackedKernel:
    """packed_gemm.c, compiled into `work` and loaded: `pack(w)` packs a [K, N] weight once,
    `dot(x, packed)` returns x @ w ([M, N], into a buffer owned by `packed`, reused by the
    next dot against the same weight)."""

    def __init__(self, work: str, max_rows: int, max_k: int):
        import ctypes

        self.lib = ctypes.CDLL(build_packed_kernel(work))
        pointer, c_int = ctypes.c_void_p, ctypes.c_int
        self.lib.pack_b.argtypes = [pointer, c_int, c_int, pointer]
        self.lib.gemm_packed.argtypes = [pointer, c_int, c_int, pointer, c_int, pointer, pointer]
        rows_per_block = self.lib.rows_per_block()
        self.max_rows, self.max_k = max_rows, max_k
        self.a_work = aligned_empty((-(-max_rows // rows_per_block) * rows_per_block * max_k,))

    def pack(self, w):
        import numpy as np

        k, n = w.shape
        if n % 16 or k > self.max_k:
            raise ValueError(f"packed_gemm.c takes [K <= {self.max_k}, N divisible by 16] weights, got {w.shape}.")
        panels = aligned_empty((n // 16, k, 16))
        w = np.ascontiguousarray(w, np.float32)  # held here: a temporary's memory would be freed before the call
        self.lib.pack_b(w.ctypes.data, k, n, panels.ctypes.data)
        return panels, k, n, aligned_empty((self.max_rows, n))

    def dot(self, x, packed):
        import numpy as np

        panels, k, n, out = packed
        x = np.ascontiguousarray(x, np.float32)
        if x.shape[1] != k or x.shape[0] > self.max_rows:
            raise ValueError(f"x {x.shape} against a packed [{k}, {n}] weight (at most {self.max_rows} rows).")
        self.lib.gemm_packed(x.ctypes.data, x.shape[0], k, panels.ctypes.data, n, out.ctypes.data,
                             self.a_work.ctypes.data)
        return out[:x.shape[0]]


def packed_side(args) -> list[float]:
    """The jax side's step, every dot on packed_gemm.c (weights packed once, outside the timing)."""
    import numpy as np

    s = SHAPES[args.shapes]
    rng = np.random.default_rng(0)
    shapes = layer_weight_shapes(**s)
    weights, head = random_weights(args.shapes, rng)
    repeats = s["q_width"] // s["kv_width"]
    kernel = PackedKernel(tempfile.mkdtemp(prefix="packed_gemm_"), args.rows, max(k for k, _ in shapes.values()))
    packed = [{name: kernel.pack(w) for name, w in layer.items()} for layer in weights]
    packed_head = kernel.pack(head.T)
    del weights, head

    def silu(x):
        return x / (1.0 + np.exp(-x))

    def run(x):
        dot = kernel.dot
        for _ in range(args.steps):
            for w in packed:
                attn = dot(x, w["q"]) + np.tile(dot(x, w["k"]) + dot(x, w["v"]), (1, repeats))
                x = x + dot(attn, w["o"])
                x = 0.5 * (x + dot(silu(dot(x, w["gate"])) * dot(x, w["up"]), w["down"]))
            x = x + 1e-3 * dot(x, packed_head)[:, :s["hidden"]]
        return x

    x = rng.standard_normal((args.rows, s["hidden"])).astype(np.float32)
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
                        help="comma-separated, of jax, torch and packed (packed_gemm.c; fp32, AVX2 + FMA)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--side", choices=tuple(SIDES), help=argparse.SUPPRESS)  # child process
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.rows, args.steps, args.repeats, args.rounds) < 1:
        parser.error("--rows, --steps, --repeats and --rounds must all be at least 1.")
    sides = [side.strip() for side in args.sides.split(",") if side.strip()]
    if not sides or any(side not in SIDES for side in sides) or len(set(sides)) < len(sides):
        parser.error(f"--sides {args.sides!r}: name each of {', '.join(SIDES)} at most once, comma-separated.")
    if "packed" in sides + [args.side] and args.precision != "fp32":
        parser.error("--sides packed runs fp32 only; drop it or use --precision fp32.")
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
