"""Evaluate a run's checkpoint against its base: ``python -m experiments.evaluate --workdir=DIR``.

    python -m experiments.evaluate --workdir=runs/default                     # final, n = 256
    python -m experiments.evaluate --workdir=runs/default --checkpoint=base
    python -m experiments.evaluate --workdir=runs/default --checkpoint=150 --num_samples=64

Draws n samples per held-out prompt from the checkpoint (and, if not yet done with the same
n, from the base into DIR/eval/base/), in chunks saved as they finish: an interrupted
evaluation continues where it stopped and ends with the same numbers. Writes
DIR/eval/<checkpoint>/{evaluation.json, report.md, passk.png, delta_by_regime.png,
prompt_scatter.png}; docs/evaluation.md describes every field and formula.
``--checkpoint=base --sample_seed=1`` evaluates the unchanged base with independent samples
against DIR/eval/base: the noise floor of every comparison.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable

import jax
from absl import app, flags, logging

from experiments import cli

from jaxrl_vr import eval as eval_lib
from jaxrl_vr import compilation_cache, layout
from jaxrl_vr.train import run_io
from jaxrl_vr.train.evaluate import PolicyEval, eval_layout, evaluate_policy
from jaxrl_vr.train.rollout import episode_runner


def define_flags() -> None:
    """Command-line flags (defined only when run as a script, so modules import side-effect free)."""
    flags.DEFINE_string("workdir", None, "Run directory written by experiments.train.")
    flags.DEFINE_string("checkpoint", "final", "final | base | an RL step number.")
    flags.DEFINE_integer("num_samples", 256, "n samples per held-out prompt (pass@k for k <= n).")
    flags.DEFINE_integer(
        "sample_seed", 0, "Sampling seed; nonzero values write to eval/<checkpoint>-seed<S>/ (independent samples)."
    )
    flags.DEFINE_integer(
        "max_chunks", None, "Stop after this many new chunks (time-slicing; rerun to continue)."
    )
    flags.DEFINE_integer(
        "responses_per_call", 0, "Responses per sampler call (memory against speed); 0 = the run's "
        "eval.prompts_per_chunk x eval.num_samples. Part of the evaluation's fingerprint.")
    flags.DEFINE_bool("progress", True, "Show a progress bar.")


# Tag folded into the run seed so evaluation samples never share a stream with the
# pipeline's own evaluations.
_EVAL_STREAM = 0x5EED_E7A1 % (2**31)


def output_dir(workdir: str, label: str, sample_seed: int = 0) -> str:
    """DIR/eval/<label>[-seed<S>]."""
    name = label if not sample_seed else f"{label}-seed{int(sample_seed)}"
    return os.path.join(os.path.abspath(workdir), layout.EVAL, name)


def _label(checkpoint: str) -> str:
    text = str(checkpoint).strip().lower()
    return text if text in ("final", "base") else str(int(text))


def sampling_key(config_seed: int, step: int | None, sample_seed: int) -> jax.Array:
    """Key of one policy's evaluation: base (step None) and each RL step get separate streams."""
    key = jax.random.fold_in(jax.random.key(int(config_seed)), _EVAL_STREAM)
    key = jax.random.fold_in(key, 0 if step is None else int(step) + 1)
    return jax.random.fold_in(key, int(sample_seed))


def sample_run(
    run: run_io.LoadedRun,
    *,
    is_base: bool,
    num_samples: int,
    sample_seed: int,
    out_dir: str,
    max_chunks: int | None = None,
    progress: bool = False,
    desc: str = "eval",
    responses_per_call: int = 0,
) -> tuple[PolicyEval, str]:
    """Resumable n-sample evaluation of ``run``'s policy; (result, fingerprint digest).

    ``responses_per_call`` sizes the sampler calls (0 = the run's ``eval.prompts_per_chunk *
    eval.num_samples``, the size its own evaluations used); the samples depend on it.
    """
    cfg = run.config
    layout = eval_layout(
        len(run.eval_items),
        num_samples,
        responses_per_call=responses_per_call or max(1, cfg.eval.prompts_per_chunk * cfg.eval.num_samples),
    )
    fingerprint = {
        "version": 1,
        "policy": "base" if is_base else "checkpoint",
        "step": None if is_base else run.step,
        "config": eval_lib.fingerprint_digest(cfg.to_dict()),
        "num_samples": num_samples,
        "sample_seed": sample_seed,
        "layout": list(layout),
        "temperature": run.temperature,
        "max_new_tokens": run.max_new_tokens,
        "prompts": eval_lib.fingerprint_digest({"uids": [it.uid for it in run.eval_items]}),
    }
    store = eval_lib.ChunkStore(os.path.join(out_dir, "partial"), fingerprint)
    result = evaluate_policy(
        run.model,
        run.tokenizer,
        run.eval_items,
        num_samples=num_samples,
        max_new_tokens=run.max_new_tokens,
        key=sampling_key(cfg.seed, None if is_base else run.step, sample_seed),
        temperature=run.temperature,
        layout=layout,
        chat=run.chat,
        store=store,
        max_chunks=max_chunks,
        progress=progress,
        desc=desc,
        episodes=episode_runner(cfg, run.tokenizer, max_total_tokens=run.max_new_tokens),
    )
    return result, eval_lib.fingerprint_digest(fingerprint)


def _policy_result(result: PolicyEval) -> eval_lib.PolicyResult:
    s = result.stats
    return eval_lib.PolicyResult(s.counts_p, result.num_samples, s.length_sum_p, s.neg_logp_sum_p, s.truncated_p)


def _meta(workdir: str, label: str, run: run_io.LoadedRun, sample_seed: int, digest: str,
          result: PolicyEval) -> dict[str, Any]:
    return {
        "workdir": os.path.abspath(workdir),
        "checkpoint": label,
        "step": run.step,
        "sample_seed": int(sample_seed),
        "temperature": run.temperature,
        "max_new_tokens": run.max_new_tokens,
        "generated_tokens": int(result.stats.length_sum_p.sum()),
        "fingerprint": digest,
    }


def _stored_fingerprint(out_dir: str) -> str | None:
    path = os.path.join(out_dir, layout.EVALUATION)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            return json.load(f).get("fingerprint")
    except (OSError, ValueError):
        return None


def evaluate_run(
    workdir: str,
    checkpoint: str = "final",
    *,
    num_samples: int = 256,
    sample_seed: int = 0,
    max_chunks: int | None = None,
    progress: bool = False,
    log: Callable[[str], None] = print,
    responses_per_call: int = 0,
) -> dict | None:
    """Evaluates ``checkpoint`` of the run in ``workdir`` (and the base, if needed).

    Returns the evaluation record (also written to ``output_dir(workdir, label, seed)``),
    or None when ``max_chunks`` stopped it before the end (rerun to continue).

    Raises:
      run_io.RunNotFoundError, run_io.CheckpointNotFoundError: bad workdir / checkpoint.
    """
    if num_samples < 1:
        raise ValueError(f"--num_samples must be >= 1, got {num_samples}.")
    if responses_per_call < 0:
        raise ValueError(f"--responses_per_call must be >= 0 (0 = the run's eval settings), got {responses_per_call}.")
    label = _label(checkpoint)
    is_base = label == "base"
    run = run_io.load_run(workdir, label)
    out_dir = output_dir(workdir, label, sample_seed)
    budget = max_chunks
    result, digest = sample_run(run, is_base=is_base, num_samples=num_samples, sample_seed=sample_seed,
                                out_dir=out_dir, max_chunks=budget, progress=progress, desc=label,
                                responses_per_call=responses_per_call)
    if budget is not None:
        budget = max(0, budget - result.chunks_computed)

    base_run, base_result, base_digest, base_dir = None, None, None, output_dir(workdir, "base", 0)
    if not (is_base and sample_seed == 0):
        base_run = run if is_base else run_io.load_run(workdir, "base")
        base_result, base_digest = sample_run(base_run, is_base=True, num_samples=num_samples, sample_seed=0,
                                              out_dir=base_dir, max_chunks=budget, progress=progress,
                                              desc="base", responses_per_call=responses_per_call)
    if not result.complete or (base_result is not None and not base_result.complete):
        done = result.chunks_done + (base_result.chunks_done if base_result else 0)
        total = result.num_chunks + (base_result.num_chunks if base_result else 0)
        log(f"[evaluate] stopped after {done}/{total} chunks; rerun the same command to continue.")
        return None

    uids = [it.uid for it in run.eval_items]
    calibration = dict(calibration_counts_p=run.base_calibration_counts, calibration_n=run.calibration_n)
    if base_result is not None and _stored_fingerprint(base_dir) != base_digest:
        base_ev = eval_lib.build_evaluation(
            _policy_result(base_result), uids=uids, **calibration,
            meta=_meta(workdir, "base", base_run, 0, base_digest, base_result),
        )
        eval_lib.write_evaluation(base_ev, base_dir)
    evaluation = eval_lib.build_evaluation(
        _policy_result(result),
        base=None if base_result is None else _policy_result(base_result),
        uids=uids,
        **calibration,
        meta=_meta(workdir, label, run, sample_seed, digest, result),
    )
    paths = eval_lib.write_evaluation(evaluation, out_dir)
    n = evaluation["n"]
    line = f"[evaluate] {label} (step {run.step}): pass@1 {evaluation['pass_at_k']['1']:.4f}, pass@{n} " \
           f"{evaluation['pass_at_k'][str(n)]:.4f}"
    if evaluation["base"]:
        line += f" (base {evaluation['base']['pass_at_k']['1']:.4f}, {evaluation['base']['pass_at_k'][str(n)]:.4f})"
    log(line)
    if evaluation["inversion"]:
        for verdict in evaluation["inversion"]["verdict"]:
            log(f"[evaluate] {verdict}")
    log(f"[evaluate] wrote {paths['evaluation']}")
    return evaluation


def apply_run_compilation_cache(workdir: str) -> str | None:
    """The run's own ``run.compilation_cache`` (experiments.train's default, "auto", for runs
    written before it existed): an evaluation continued with ``--max_chunks`` reruns load the
    sampler instead of compiling it each time. Returns the directory (None when off or when the
    workdir holds no run, which `evaluate_run` then reports)."""
    try:
        cfg = run_io.read_config(workdir)
    except run_io.RunNotFoundError:
        return None
    return compilation_cache.apply_setting(cfg.run.compilation_cache)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not flags.FLAGS.workdir:
        raise app.UsageError("--workdir is required, e.g. --workdir=runs/default")
    logging.set_verbosity(logging.WARNING)
    try:
        apply_run_compilation_cache(flags.FLAGS.workdir)
        evaluate_run(
            flags.FLAGS.workdir,
            flags.FLAGS.checkpoint,
            num_samples=flags.FLAGS.num_samples,
            sample_seed=flags.FLAGS.sample_seed,
            max_chunks=flags.FLAGS.max_chunks,
            progress=flags.FLAGS.progress,
            responses_per_call=flags.FLAGS.responses_per_call,
        )
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    cli.exit_on_interrupt()
    define_flags()
    app.run(main, flags_parser=cli.flags_parser(__doc__))
