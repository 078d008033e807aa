"""Multi-turn rollouts on one KV cache vs single-turn rollouts of the same length vs re-prefilling.

Issue 42 item 3: a conversation continued on the device cache (`sampling.multiturn`) should
cost about what one single-turn rollout of the same total length costs (target: within
1.3x), and far less than the naive loop that calls `generate` on the whole conversation so
far every turn. Three ways to produce P prompts x G samples of T tokens after the prompt,
EOS suppressed (stop ids that never occur, no stop sequences), temperature 1:

  (a) single:    `generate(max_new_tokens=T)`.
  (b) continued: `multiturn.start`, then K times `decode_turn(max_tokens=M)` with an
                 `append` of O fixed observation ids between turns (K - 1 of them), so
                 K * M + (K - 1) * O = T. Each turn's tokens are fetched to the host, as an
                 environment must read them.
  (c) re-prefill: turn 1 is `generate(max_new_tokens=M)` on the prompts; every later turn is
                 `generate(max_new_tokens=M, num_samples=1)` on each row's whole conversation
                 so far (prompt + turns + observations) as its prompt: the prefix is
                 recomputed every turn.

Every program is compiled and run once before timing (warm-up excluded). Then --rounds
rounds each run (a), (b), (c) once, in an order that rotates every round, so the three see
the same machine load; the ratios (b)/(a) and (c)/(b) are taken within a round and reported
as the median over rounds with [min, max] and a bootstrap 95 % interval of the median. The
1-minute load average is read before every round. Only the ratios mean anything on a shared
machine.

    python benchmarks/multiturn.py [--quick] [--models small,smollm2] [--rounds 7] [--append]
        [--out benchmarks/results/multiturn.json]

Writes {cpu, runs: [...]} as JSON (`--append` adds a run to the file's runs, e.g. SmolLM2 with
--quick after the small model in full) and a PNG bar chart of every row's median times
next to it (`multiturn.png`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from jaxrl_vr import host_cpu  # noqa: E402
from jaxrl_vr.host_memory import keep_host_memory  # noqa: E402

PROMPT_LEN = 16
OBS_ID = 7  # every observation token (a fixed id; EOS is suppressed anyway)

# (P, G, T, K, O): T = K * M + (K - 1) * O with M an integer.
CONFIGS = [(8, 4, 128, 2, 16), (8, 4, 256, 4, 16), (8, 4, 256, 4, 32), (8, 8, 256, 4, 16), (8, 4, 256, 8, 16)]
QUICK_CONFIGS = [(8, 4, 128, 2, 16), (8, 4, 256, 4, 16)]


def load_model(name: str):
    from flax import nnx

    from jaxrl_vr.models import Decoder, DecoderConfig, from_gguf
    from jaxrl_vr.models import smollm2

    if name == "small":
        return Decoder(DecoderConfig.small(128), rngs=nnx.Rngs(params=0))
    if name == "smollm2":
        path = smollm2.default_path()
        if not os.path.exists(path):
            return None
        return from_gguf(path)[0]
    raise ValueError(f"unknown model {name!r}; use small or smollm2.")


def make_runners(model, P: int, G: int, T: int, K: int, O: int):
    """The three ways (a), (b), (c) as zero-argument callables returning host token arrays."""
    import jax

    from jaxrl_vr.sampling import generate
    from jaxrl_vr.sampling import multiturn as mt

    M = (T - (K - 1) * O) // K
    assert K * M + (K - 1) * O == T, (T, K, O)
    vocab = model.config.vocab_size
    rng = np.random.default_rng(0)
    tokens_ps = rng.integers(min(100, vocab // 2), vocab, size=(P, PROMPT_LEN)).astype(np.int32)
    mask_ps = np.ones_like(tokens_ps, bool)
    B = P * G
    obs = [[OBS_ID] * O for _ in range(B)]
    capacity = PROMPT_LEN + K * M + (K - 1) * O
    counter = iter(range(1 << 30))

    def single():
        rollout = generate(jax.random.key(next(counter)), model, tokens_ps, mask_ps, num_samples=G,
                           max_new_tokens=T, stop_token_ids=(), pad_id=0)
        return np.asarray(rollout.tokens_bt)

    def continued():
        key = jax.random.key(next(counter))
        session = mt.start(model, tokens_ps, mask_ps, num_samples=G, capacity=capacity)
        live = np.ones(B, bool)
        parts = []
        for k in range(K):
            session, turn = mt.decode_turn(jax.random.fold_in(key, k), model, session, live, max_tokens=M,
                                           stop_token_ids=())
            parts.append(np.asarray(turn.tokens_bw)[:, :M])  # the environment reads the turn
            if k + 1 < K:
                session = mt.append(model, session, obs)
                parts.append(np.asarray(obs, np.int32))
        return np.concatenate(parts, axis=1)

    def reprefill():
        key = jax.random.key(next(counter))
        rollout = generate(jax.random.fold_in(key, 0), model, tokens_ps, mask_ps, num_samples=G, max_new_tokens=M,
                           stop_token_ids=(), pad_id=0)
        convo_bs = np.repeat(tokens_ps, G, axis=0)
        parts = [np.asarray(rollout.tokens_bt)]
        for k in range(1, K):
            parts.append(np.asarray(obs, np.int32))
            convo_bs = np.concatenate([convo_bs, parts[-2], parts[-1]], axis=1)
            rollout = generate(jax.random.fold_in(key, k), model, convo_bs, np.ones_like(convo_bs, bool),
                               num_samples=1, max_new_tokens=M, stop_token_ids=(), pad_id=0)
            parts.append(np.asarray(rollout.tokens_bt))
        return np.concatenate(parts, axis=1)

    return M, {"single": single, "continued": continued, "reprefill": reprefill}


def bootstrap_median_ci(values, *, draws: int = 2000, seed: int = 0) -> list[float]:
    values = np.asarray(values, np.float64)
    rng = np.random.default_rng(seed)
    medians = np.median(values[rng.integers(0, len(values), size=(draws, len(values)))], axis=1)
    return [float(np.percentile(medians, 2.5)), float(np.percentile(medians, 97.5))]


def spread(values) -> dict:
    return {"median": float(statistics.median(values)), "min": float(min(values)), "max": float(max(values)),
            "ci95_median": bootstrap_median_ci(values)}


def measure(model, cfg, rounds: int) -> dict:
    P, G, T, K, O = cfg
    M, runners = make_runners(model, *cfg)
    names = list(runners)
    compile_s = {}
    for name, run in runners.items():  # compile (and run) everything once
        start = time.perf_counter()
        out = run()
        compile_s[name] = time.perf_counter() - start
        assert out.shape == (P * G, T), (name, out.shape)
    for run in runners.values():  # a second untimed call: heaps faulted in
        run()
    seconds = {n: [] for n in names}
    loads, orders = [], []
    for r in range(rounds):
        loads.append(os.getloadavg()[0])
        order = names[r % 3:] + names[:r % 3]
        orders.append(order)
        for name in order:
            start = time.perf_counter()
            runners[name]()
            seconds[name].append(time.perf_counter() - start)
    b_over_a = [b / a for a, b in zip(seconds["single"], seconds["continued"])]
    c_over_b = [c / b for b, c in zip(seconds["continued"], seconds["reprefill"])]
    row = {"P": P, "G": G, "T": T, "K": K, "O": O, "M_per_turn": M, "model_tokens": K * M,
           "observation_tokens": (K - 1) * O, "prompt_len": PROMPT_LEN,
           "first_call_s": compile_s, "seconds": seconds, "orders": orders, "load_1m_per_round": loads,
           "median_s": {n: float(statistics.median(v)) for n, v in seconds.items()},
           "continued_over_single": spread(b_over_a), "reprefill_over_continued": spread(c_over_b)}
    return row


def label(row) -> str:
    return f"{row['model']} P{row['P']}xG{row['G']} T{row['T']} K{row['K']} O{row['O']}"


def write(out: str, cpu: dict, run: dict, *, append: bool) -> dict:
    """Writes {cpu, runs: [...]} to `out` (with `append`, after the runs already there, which
    must come from the same CPU) and the bar chart of every row to `out`'s .png."""
    report = {"cpu": cpu, "runs": []}
    if append and os.path.exists(out):
        with open(out) as f:
            report = json.load(f)
        if report.get("cpu") != cpu:
            raise ValueError(f"{out} was measured on {report.get('cpu')}, not on this CPU ({cpu}); "
                             "write to another --out.")
    report["runs"].append(run)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(report, f, indent=2)
    rows = [row for r in report["runs"] for row in r["rows"]]
    if rows:
        from jaxrl_vr.eval.plots import plot_bars

        series = {"(a) single-turn": "single", "(b) multi-turn continued": "continued",
                  "(c) multi-turn re-prefill": "reprefill"}
        # Each row's times over its own (a): the models differ by 100x in seconds.
        name = lambda r: label(r).replace(" ", "\n", 2)  # noqa: E731
        values = {s: {name(r): r["median_s"][k] / r["median_s"]["single"] for r in rows} for s, k in series.items()}
        errors = {s: {name(r): (max(r["seconds"][k]) - min(r["seconds"][k])) / 2 / r["median_s"]["single"]
                      for r in rows} for s, k in series.items()}
        png = os.path.splitext(out)[0] + ".png"
        plot_bars(values, png, errors=errors, ylabel="median time / median (a) time",
                  title=f"same total length; bars: half the range over rounds; {cpu.get('model', '')}")
        print(f"wrote {out} and {png}")
    return report


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="small,smollm2", help="small (DecoderConfig.small) and/or smollm2 "
                        "(the GGUF at jaxrl_vr.models.smollm2.default_path(); skipped when absent)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="two configurations, 3 rounds")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "multiturn.json"))
    parser.add_argument("--append", action="store_true",
                        help="add this run to --out's runs (same CPU) instead of replacing the file")
    args = parser.parse_args(argv)
    host_memory = keep_host_memory()  # before any computation, as experiments.train does
    import jax

    rounds = 3 if args.quick else args.rounds
    configs = QUICK_CONFIGS if args.quick else CONFIGS
    run = {"command": " ".join([os.path.relpath(__file__, os.getcwd()), *(argv if argv is not None else sys.argv[1:])]),
           "jax": jax.__version__, "backend": jax.default_backend(),
           "keep_host_memory": bool(host_memory and host_memory.kept), "rounds": rounds, "quick": args.quick,
           "load_1m_start": os.getloadavg()[0], "rows": [], "skipped": []}
    cpu = host_cpu.summary()
    print(f"cpu: {cpu.get('model')} {cpu.get('flags')}; load {run['load_1m_start']:.2f}", flush=True)
    for name in args.models.split(","):
        model = load_model(name)
        if model is None:
            run["skipped"].append(name)
            print(f"{name}: no weights, skipped", flush=True)
            continue
        for cfg in configs:
            row = {"model": name, **measure(model, cfg, rounds)}
            run["rows"].append(row)
            ba, cb = row["continued_over_single"], row["reprefill_over_continued"]
            print(f"{label(row):<36} single {row['median_s']['single']:.3f}s continued "
                  f"{row['median_s']['continued']:.3f}s reprefill {row['median_s']['reprefill']:.3f}s | "
                  f"(b)/(a) {ba['median']:.2f} [{ba['min']:.2f}, {ba['max']:.2f}] "
                  f"(c)/(b) {cb['median']:.2f} [{cb['min']:.2f}, {cb['max']:.2f}] "
                  f"load {min(row['load_1m_per_round']):.1f}-{max(row['load_1m_per_round']):.1f}", flush=True)
    run["load_1m_end"] = os.getloadavg()[0]
    report = write(args.out, cpu, run, append=args.append)
    return report


if __name__ == "__main__":
    main()
