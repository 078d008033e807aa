"""An experiment end to end: task + model source → base pass rates → RL → evaluation → report.

1. Validate the whole config, then create (or check) the workdir.
2. Load the task (``sources.TASK_SOURCES``) and the base policy (``sources.MODEL_SOURCES``:
   the builtin SFT-warm-started decoder, a Hugging Face directory, a GGUF file, SmolLM2).
3. Estimate the base's per-prompt pass rates on held-out prompts: n samples each for
   pass@k (``base_eval.json``) and an independent calibration (``base_calibration.json``)
   that assigns the PBA regimes; training-prompt calibrations for PBA and pairing.
4. RL with ``RLTrainer`` (checkpointed, resumable, stops at rl.steps or rl.token_budget).
5. Evaluate the trained policy on the same prompts; write summary.json, report.md, plots;
   export the policy with ``save_pretrained`` into ``<workdir>/export``.

A finished workdir is not redone: re-running prints where its summary is (pass
``reevaluate=True`` to evaluate again into a new file).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Callable

import jax
import numpy as np

from jaxrl_vr.train.assembly import charged_tokens
from jaxrl_vr.train.config import (EvalConfig, ModelConfig, PipelineConfig, RLConfig, RunConfig,
                                   TaskConfig, validate)
from jaxrl_vr.train.evaluate import count_successes
from jaxrl_vr.train.loop import RLTrainer
from jaxrl_vr.train.sources import TaskData, export_policy, load_policy, load_task
from jaxrl_vr.train.workdir import (WorkdirError, cached_counts, check_workdir, digest,
                                    prepare_workdir, write_json)

__all__ = ["EvalConfig", "ModelConfig", "PipelineConfig", "RLConfig", "RunConfig", "TaskConfig",
           "WorkdirError", "run_pipeline", "evaluate_counts"]

CURVE_KEYS = ("reward", "pass_rate", "valid_group_frac", "kl", "entropy", "grad_norm",
              "clip_frac_low", "clip_frac_high", "response_length", "truncation_rate",
              "logp_gap_sampler_trainer", "adv_std")


def evaluate_counts(model, tokenizer, items, cfg: PipelineConfig, seed_offset: int, *,
                    num_samples: int | None = None) -> dict:
    """Per-prompt success counts from ``num_samples`` (default eval.num_samples) samples.

    Chunks hold about ``prompts_per_chunk * eval.num_samples`` responses whatever
    ``num_samples`` is, so a 256-sample calibration does not build a larger KV cache.
    """
    num_samples = num_samples or cfg.eval.num_samples
    responses_per_chunk = cfg.eval.prompts_per_chunk * cfg.eval.num_samples
    return count_successes(
        model, tokenizer, items, num_samples=num_samples,
        max_new_tokens=cfg.eval.max_new_tokens or cfg.rl.max_new_tokens,
        key=jax.random.key(cfg.seed * 7919 + seed_offset), temperature=cfg.eval.temperature,
        prompts_per_chunk=max(1, responses_per_chunk // num_samples), chat=cfg.model.chat,
        system_prompt=cfg.model.system_prompt, success_threshold=cfg.rl.success_threshold)


def _finished_summary(workdir: str, cfg: PipelineConfig) -> dict | None:
    path = os.path.join(workdir, "summary.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        summary = json.load(f)
    done = summary.get("rl_steps", -1)
    charged = charged_tokens(summary.get("budget", {}), cfg.rl.budget_includes_calibration)
    budget_done = cfg.rl.token_budget and charged >= cfg.rl.token_budget
    return summary if summary.get("finished") and (done >= cfg.rl.steps or budget_done) else None


def _calibrate(policy, items, cfg, workdir, name: str, num_samples: int, seed_offset: int,
               base_key: str) -> tuple[np.ndarray, float]:
    """Base success counts of ``items`` (``num_samples`` each), cached in ``<workdir>/<name>``,
    and the tokens that sampling generated."""
    result = cached_counts(
        os.path.join(workdir, name),
        digest({"base": base_key, "n": num_samples, "items": [it.uid for it in items],
                "T": cfg.eval.max_new_tokens or cfg.rl.max_new_tokens}),
        lambda: evaluate_counts(policy.model, policy.tokenizer, items, cfg, seed_offset,
                                num_samples=num_samples))
    return np.asarray(result["counts"], np.int64), float(result.get("generated_tokens", 0.0))


def _make_tracker(cfg: PipelineConfig, data: TaskData, policy, workdir: str, base_key: str, log):
    """PromptTracker over the training prompts, with the calibrations PBA / pairing need, and
    the tokens those calibrations generated."""
    from jaxrl_vr.selection.tracker import PromptTracker

    rl = cfg.rl
    tracker = PromptTracker(len(data.train), uids=[it.uid for it in data.train],
                            success_threshold=rl.success_threshold)
    tokens = 0.0
    if rl.anchor != "none":  # PBA: p_base of training prompts from their own samples
        n = rl.anchor_calibration_samples
        log(f"[pba] base calibration of {len(data.train)} training prompts × {n} samples")
        counts, used = _calibrate(policy, data.train, cfg, workdir, "base_train_calibration.json", n,
                                  3, base_key)
        tokens += used
        tracker.set_base_counts(np.full(len(data.train), n), counts)
        tracker.freeze_base()
    if rl.pairing:  # pairing: success rates over the whole pool before training
        n = rl.pairing_calibration_samples
        log(f"[pairing] rate calibration of {len(data.train)} training prompts × {n} samples")
        counts, used = _calibrate(policy, data.train, cfg, workdir, "pairing_calibration.json", n, 5,
                                  base_key)
        tokens += used
        tracker.set_calibration_counts(np.full(len(data.train), n), counts)
    return tracker, tokens


def run_pipeline(cfg: PipelineConfig, workdir: str, *, log: Callable[[str], None] = print,
                 stop_after: int | None = None, reevaluate: bool = False) -> dict:
    """Runs (or resumes) the whole experiment; returns the summary dict.

    Args:
      cfg: PipelineConfig (validated here before anything is written).
      workdir: run directory (created; must be empty or hold a run of the same config).
      log: line printer.
      stop_after: stop RL after this many total steps without the final evaluation
        (used to test resume); returns {} then.
      reevaluate: evaluate a finished run again (written to summary_reevaluated.json).
    """
    from jaxrl_vr import eval as eval_lib

    wall_start = time.perf_counter()
    validate(cfg)
    from jaxrl_vr.verifiers.registry import check_verifier

    if cfg.task.name in ("jsonl", "parquet"):
        check_verifier(cfg.task.verifier)
    check_workdir(workdir)
    data = load_task(cfg)
    _need_prompts(cfg, data)
    for name in sorted({it.verifier for it in data.train + data.heldout}):
        check_verifier(name)  # every verifier the items name, before any model is loaded
    workdir = prepare_workdir(workdir, cfg.to_dict(), defaults=PipelineConfig().to_dict())
    finished = _finished_summary(workdir, cfg)
    if finished is not None and not reevaluate:
        log(f"[run] {workdir} holds a finished run; its summary is "
            f"{os.path.join(workdir, 'summary.json')} (pass --reevaluate to evaluate it again).")
        return finished

    t0 = time.perf_counter()
    policy = load_policy(cfg, workdir, data, log=log)
    t_base = time.perf_counter() - t0
    base_key = digest({"base": policy.info, "seed": cfg.seed, "eval": cfg.to_dict()["eval"],
                       "model": cfg.to_dict()["model"]})

    t0 = time.perf_counter()
    n, n_cal = cfg.eval.num_samples, cfg.eval.base_calibration_samples
    base_eval = cached_counts(
        os.path.join(workdir, "base_eval.json"),
        digest({"base": base_key, "items": [it.uid for it in data.heldout], "n": n}),
        lambda: evaluate_counts(policy.model, policy.tokenizer, data.heldout, cfg, 1))
    if n_cal > 0:
        calibration = cached_counts(
            os.path.join(workdir, "base_calibration.json"),
            digest({"base": base_key, "items": [it.uid for it in data.heldout], "n_cal": n_cal}),
            lambda: evaluate_counts(policy.model, policy.tokenizer, data.heldout, cfg, 4,
                                    num_samples=n_cal))
        p_base = calibration["counts"] / n_cal
    else:
        calibration, p_base, n_cal = {"generated_tokens": 0}, base_eval["counts"] / n, n
    t_base_eval = time.perf_counter() - t0
    log(f"[base] held-out pass@1 = {base_eval['counts'].mean() / n:.4f} ({len(data.heldout)} "
        f"prompts × {n} samples; regimes from {n_cal} calibration samples)")

    trainer, rows, t_rl = None, [], 0.0
    final_model = policy.model
    if cfg.rl.steps > 0:
        tracker, calibration_tokens = _make_tracker(cfg, data, policy, workdir, base_key, log)
        rl_cfg = dataclasses.replace(cfg.rl, seed=cfg.seed * 1_000_003 + cfg.rl.seed)
        trainer = RLTrainer(policy.model, policy.tokenizer, data.train, rl=rl_cfg, loss=cfg.loss,
                            optim=cfg.optim, workdir=workdir, chat=cfg.model.chat,
                            system_prompt=cfg.model.system_prompt, tracker=tracker,
                            progress=cfg.run.progress, tensorboard=cfg.run.tensorboard,
                            calibration_tokens=calibration_tokens)
        t0 = time.perf_counter()
        try:
            rows = trainer.run(stop_after=stop_after)
        finally:
            trainer.close()
        t_rl = time.perf_counter() - t0
        if stop_after is not None and stop_after < cfg.rl.steps and not trainer.budget_spent():
            return {}
        final_model = trainer.model()

    t0 = time.perf_counter()
    final_eval = (evaluate_counts(final_model, policy.tokenizer, data.heldout, cfg, 2)
                  if trainer is not None else {**base_eval, "generated_tokens": 0})  # steps=0: base only
    t_final_eval = time.perf_counter() - t0
    report = eval_lib.passk_report(base_eval["counts"], final_eval["counts"], n, p_base=p_base,
                                   regime_n=n_cal)
    # Lost / newly solved next to what sampling noise alone gives (docs/evaluation.md).
    inversion = None
    if trainer is not None:  # with rl.steps = 0 the final counts are the base's own
        inversion = eval_lib.inversion_report(
            base_eval["counts"], n, final_eval["counts"], n,
            reference_counts=calibration.get("counts"),
            reference_n=n_cal if "counts" in calibration else 0)
        for line in inversion["verdict"]:
            log(f"[eval] {line}")
    plots = {"passk": str(eval_lib.plot_passk(report["pass_at_k"]["base"],
                                              report["pass_at_k"]["final"], report["ks"],
                                              os.path.join(workdir, "passk.png")))}
    if rows:
        plots["curves"] = str(eval_lib.plot_training_curves(
            os.path.join(workdir, "metrics.jsonl"), os.path.join(workdir, "reward_curve.png"),
            keys=CURVE_KEYS))
    budget = dataclasses.asdict(trainer.budget) if trainer is not None else {}
    steps_done = int(trainer.checkpointer.latest_step() or 0) if trainer is not None else 0
    export_dir = None
    if cfg.run.export and trainer is not None:
        export_dir = export_policy(final_model, policy.tokenizer, os.path.join(workdir, "export"))
    total = time.perf_counter() - wall_start
    summary = {
        "config": cfg.to_dict(),
        "finished": True,
        "passk": report,
        "base_pass_at_1": report["mean_pass_rate"]["base"],
        "final_pass_at_1": report["mean_pass_rate"]["final"],
        "pass_at_1_delta": report["mean_pass_rate"]["final"] - report["mean_pass_rate"]["base"],
        "regime_counts": report["regime_counts"],
        "inversion": inversion,
        "budget": {**budget, "eval_generated_tokens": base_eval["generated_tokens"]
                   + final_eval["generated_tokens"] + calibration["generated_tokens"]},
        "wall_time_s": {"base": t_base, "base_eval": t_base_eval, "rl": t_rl,
                        "final_eval": t_final_eval, "total": total},
        "wall_time_total_s": total,
        "generated_tokens": budget.get("generated_tokens", 0.0),
        "calibration_tokens": budget.get("calibration_tokens", 0.0),
        "trained_tokens": budget.get("trained_tokens", 0.0),
        "seed": cfg.seed,
        "base_info": policy.info,
        "rl_steps": steps_done,
        "final_train_reward": rows[-1].get("reward") if rows else None,
        "plots": plots,
        "export_dir": export_dir,
    }
    if reevaluate and finished is not None:
        write_json(os.path.join(workdir, "summary_reevaluated.json"), eval_lib.to_jsonable(summary))
    else:
        eval_lib.write_report(summary, workdir, title=f"jaxrl_vr: {cfg.model.source} model on "
                                                      f"{cfg.task.name}")
    if cfg.run.print_table:
        log(eval_lib.format_table(report))
        log(f"held-out pass@1: base {summary['base_pass_at_1']:.4f} -> final "
            f"{summary['final_pass_at_1']:.4f}; wall time {total:.1f}s; summary in "
            f"{os.path.join(workdir, 'summary.json')}")
    return summary


def _need_prompts(cfg: PipelineConfig, data: TaskData) -> None:
    if not data.heldout:
        raise ValueError("the task has no held-out prompts; set task.num_eval, task.eval_path or "
                         "task.eval_fraction.")
    if cfg.rl.steps > 0 and len(data.train) < cfg.rl.prompts_per_step:
        raise ValueError(f"rl.prompts_per_step={cfg.rl.prompts_per_step} exceeds the "
                         f"{len(data.train)} training prompts of the task.")
