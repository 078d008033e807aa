"""An experiment end to end: task + model source → base pass rates → RL → evaluation → report.

1. Validate the whole config, load the task (``sources.TASK_SOURCES``: its verifiers
   checked, its splits non-empty, no prompt twice, no held-out prompt in the training pool:
   what was removed is logged and kept in summary.json's "split"), check the model path, then create (or
   check) the workdir. A workdir whose run stopped before its first RL step takes a
   corrected config (``workdir.prepare_workdir``).
2. Load the base policy (``sources.MODEL_SOURCES``: the builtin SFT-warm-started decoder, a
   Hugging Face directory, a GGUF file, SmolLM2).
3. Build the RL parts (``build_parts``), then estimate the base's per-prompt pass rates:
   n samples of each held-out prompt for pass@k (``base_eval.json``), an independent
   calibration that assigns the regimes (``base_calibration.json``), and the base samples
   of every training prompt that a part asks for (PBA's p_base, pairing's rates).
4. RL with ``RLTrainer`` (checkpointed, resumable, stops at rl.steps or the token budget),
   with ``eval.every``'s evaluations of the current policy (``eval.during_samples`` per
   held-out prompt, by step number, not charged to the budget).
5. Evaluate the trained policy on the same prompts; write summary.json, report.md, plots
   (and eval_during.json / .png: pass@k along training; the regime table under shifted
   cutoffs and by p_base bin); evaluate each ``task.eval_paths`` set before and after RL
   (``train.eval_sets``: eval_sets/<stem>/); export the policy with ``save_pretrained``
   into ``<workdir>/export`` (LoRA adapters merged into float32 weights).

A finished workdir is not redone: re-running prints where its summary is (pass
``reevaluate=True`` to evaluate again into a new file).
"""

from __future__ import annotations

import os
import time
from typing import Callable

from jaxrl_vr import eval as eval_lib
from jaxrl_vr import layout, passk
from jaxrl_vr.atomic import write_json
from jaxrl_vr.config_tree import to_tree
from jaxrl_vr.host_memory import release_free_heap
from jaxrl_vr.train.config import PipelineConfig, upgrade_legacy, validate
from jaxrl_vr.train.eval_sets import evaluate_sets_base, evaluate_sets_final
from jaxrl_vr.train.evaluate import episode_rates, evaluate_base, evaluate_counts, evaluate_during_training
from jaxrl_vr.train.loop import PeriodicEval, RLTrainer
from jaxrl_vr.train.parts import build_parts
from jaxrl_vr.train.sources import check_model_source, export_policy, load_eval_sets, load_policy, load_task
from jaxrl_vr.train.workdir import digest, prepare_workdir
from jaxrl_vr.versions import versions

__all__ = ["run_pipeline"]

CURVE_KEYS = ("reward", "pass_rate", "valid_group_frac", "kl", "entropy", "grad_norm",
              "clip_frac_low", "clip_frac_high", "response_length", "truncation_rate",
              "logp_gap_sampler_trainer", "adv_std")


def report_title(cfg: PipelineConfig) -> str:
    """report.md's title: the model (its file or directory) and the data (its file or task)."""
    model = {"builtin": "the builtin decoder", "smollm2": "SmolLM2-135M-Instruct"}.get(cfg.model.source)
    if cfg.model.path:
        model = os.path.basename(os.path.normpath(cfg.model.path))
    if cfg.task.name in ("jsonl", "parquet"):
        data = os.path.basename(cfg.task.path)
        if cfg.task.eval_path and cfg.task.eval_path != cfg.task.path:
            data += f" (held out: {os.path.basename(cfg.task.eval_path)})"
    elif cfg.task.name == "reasoning_gym":
        data = f"reasoning-gym {cfg.task.rg_tasks}"
    else:
        data = f"the {cfg.task.name} task"
    return f"jaxrl_vr: {model} on {data}"


def _during_training(model, tokenizer, items, cfg: PipelineConfig, step: int, codes_p, log) -> dict:
    """``eval.every``'s evaluation after ``step`` RL steps, with a log line."""
    metrics = evaluate_during_training(model, tokenizer, items, cfg, step, codes_p)
    n = cfg.eval.during_samples
    log(f"[eval] step {step}: held-out pass@1 {metrics['eval/pass@1']:.4f}, pass@{n} "
        f"{metrics[f'eval/pass@{n}']:.4f} ({len(items)} prompts × {n} samples)")
    return metrics


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
    wall_start = time.perf_counter()
    validate(cfg)
    tree = to_tree(cfg)
    data = load_task(cfg)
    log(f"[task] {data.split.describe()}")
    eval_sets = load_eval_sets(cfg)
    check_model_source(cfg)
    run_versions = versions()
    workdir, finished, replaced = prepare_workdir(
        workdir, tree, defaults=to_tree(PipelineConfig()), upgrade=upgrade_legacy,
        steps=cfg.rl.steps, budget=cfg.rl.budget, record={"versions": run_versions})
    if replaced:
        log(f"[run] {workdir}: its earlier run stopped before its first step; this config replaces "
            f"its config.json ({replaced})")
    if finished is not None and not reevaluate:
        log(f"[run] {workdir} holds a finished run; its summary is "
            f"{os.path.join(workdir, layout.SUMMARY)} (pass --reevaluate to evaluate it again).")
        return finished

    t0 = time.perf_counter()
    policy = load_policy(cfg, workdir, data, log=log)
    t_base = time.perf_counter() - t0
    base_info = policy.info
    # What the base evaluations depend on: not the evaluations during training, and not remat
    # (it changes no sampled token), so runs from before either key keep their base.
    base_eval_keys = {k: v for k, v in tree["eval"].items() if k not in ("every", "during_samples")}
    # Nor the adapters (zero B: the adapted policy is the base), except a bf16 base.
    model_key = {k: v for k, v in tree["model"].items() if k not in ("remat", "lora")}
    if cfg.model.lora.base_dtype:
        model_key["lora_base_dtype"] = cfg.model.lora.base_dtype
    if model_key.get("compute_dtype") == "auto":  # what it picked on this machine
        model_key["compute_dtype"] = f"auto:{policy.model.config.matmul_dtype}"
    base_key = digest({"base": base_info, "seed": cfg.seed, "eval": base_eval_keys, "model": model_key})
    matmul_dtype = str(policy.model.config.matmul_dtype)
    model, tokenizer = policy.model, policy.tokenizer
    del policy  # `model` is the one reference to the base weights (see the release below)

    parts = build_parts(cfg, model, tokenizer, data.train, workdir) if cfg.rl.steps > 0 else None
    trainer, rows, t_rl = None, [], 0.0
    try:
        t0 = time.perf_counter()
        base = evaluate_base(model, tokenizer, data, cfg, workdir, base_key,
                             hooks=parts.hooks if parts else (), log=log)
        t_base_eval = time.perf_counter() - t0
        release_free_heap()  # the base evaluation's compile and sampling memory (-0.5 GB on SmolLM2-135M)
        base_eval, calibration, n = base.evaluation, base.calibration, cfg.eval.num_samples
        log(f"[base] held-out pass@1 = {base_eval['counts'].mean() / n:.4f} ({len(data.heldout)} "
            f"prompts × {n} samples; regimes from {base.regime_n} calibration samples)")
        codes_p = passk.regime(base.regime_counts / base.regime_n, n=base.regime_n)  # the final table's
        t0 = time.perf_counter()
        set_bases = evaluate_sets_base(model, tokenizer, eval_sets, cfg, workdir, base_key, log=log)
        t_sets = time.perf_counter() - t0
        if parts is not None:
            # The trainer holds its own copy of the params (and the parts hold the base params
            # when a KL term reads them): the base model is freed before the first update,
            # whose temporaries reuse its memory (-540 MB of peak for SmolLM2-135M in fp32).
            model = None
            periodic = None
            if cfg.eval.every > 0:
                periodic = PeriodicEval(cfg.eval.every, lambda step, policy: _during_training(
                    policy, tokenizer, data.heldout, cfg, step, codes_p, log))
            trainer = RLTrainer(parts, calibration_tokens=base.calibration_tokens, log=log,
                                periodic_eval=periodic)
            t0 = time.perf_counter()
            rows = trainer.run(stop_after=stop_after)
            t_rl = time.perf_counter() - t0
    finally:
        if parts is not None:
            parts.close()
    if trainer is not None:
        if stop_after is not None and stop_after < cfg.rl.steps and not trainer.budget_spent():
            return {}
        model = trainer.model()

    t0 = time.perf_counter()
    final_eval = (evaluate_counts(model, tokenizer, data.heldout, cfg, 2)
                  if trainer is not None else {**base_eval, "generated_tokens": 0})  # steps=0: base only
    t_final_eval = time.perf_counter() - t0
    report = eval_lib.passk_report(base_eval["counts"], final_eval["counts"], n,
                                   p_base=base.regime_counts / base.regime_n, regime_n=base.regime_n)
    # Lost / newly solved next to what sampling noise alone gives (docs/evaluation.md).
    inversion = None
    if trainer is not None:  # with rl.steps = 0 the final counts are the base's own
        inversion = eval_lib.inversion_report(
            base_eval["counts"], n, final_eval["counts"], n,
            reference_counts=calibration.get("counts"),
            reference_n=base.regime_n if "counts" in calibration else 0)
        for line in inversion["verdict"]:
            log(f"[eval] {line}")
    # The regime table under shifted cutoffs and by p_base bin (jaxrl_vr.eval.sensitivity).
    sensitivity = eval_lib.regime_sensitivity(base_eval["counts"], n, final_eval["counts"], n,
                                              base.regime_counts / base.regime_n, regime_n=base.regime_n)
    t0 = time.perf_counter()
    set_summaries, set_sections = evaluate_sets_final(
        model, tokenizer, set_bases, cfg, workdir, trained=trainer is not None, log=log,
        step=int(trainer.parts.checkpoints.latest_step() or 0) if trainer is not None else 0)
    t_sets += time.perf_counter() - t0
    plots = {"passk": str(eval_lib.plot_passk(report["pass_at_k"]["base"], report["pass_at_k"]["final"],
                                              report["ks"], os.path.join(workdir, layout.PASSK_PLOT)))}
    if rows:
        plots["curves"] = str(eval_lib.plot_training_curves(
            os.path.join(workdir, layout.METRICS), os.path.join(workdir, layout.CURVES_PLOT),
            keys=CURVE_KEYS))
    during = None
    if trainer is not None and cfg.eval.every > 0 and os.path.isfile(os.path.join(workdir, layout.METRICS)):
        path = eval_lib.training_path(
            eval_lib.read_metrics_jsonl(os.path.join(workdir, layout.METRICS)), base_counts_p=base_eval["counts"],
            base_n=n, codes_p=codes_p, n=cfg.eval.during_samples, every=cfg.eval.every)
        if path["evaluations"]:
            write_json(os.path.join(workdir, layout.EVAL_DURING), path)
            plots["eval_during"] = str(eval_lib.plot_training_path(path, os.path.join(workdir, layout.EVAL_DURING_PLOT)))
            last = path["points"][-1]
            during = {"every": path["every"], "n": path["n"], "evaluations": path["evaluations"],
                      "generated_tokens": path["generated_tokens"], "file": layout.EVAL_DURING,
                      "last_step": last["step"], "last_pass_at_k": last["pass_at_k"]}
    budget = trainer.budget.as_dict() if trainer is not None else {}
    steps_done = int(trainer.parts.checkpoints.latest_step() or 0) if trainer is not None else 0
    export_dir = None
    if cfg.run.export and trainer is not None:
        export_dir = export_policy(model, tokenizer, os.path.join(workdir, layout.EXPORT))
    total = time.perf_counter() - wall_start
    summary = {
        "config": tree,
        "finished": True,
        "passk": report,
        "base_pass_at_1": report["mean_pass_rate"]["base"],
        "final_pass_at_1": report["mean_pass_rate"]["final"],
        "pass_at_1_delta": report["mean_pass_rate"]["final"] - report["mean_pass_rate"]["base"],
        "regime_counts": report["regime_counts"],
        "inversion": inversion,
        "budget": {**budget, "eval_generated_tokens": base_eval["generated_tokens"]
                   + final_eval["generated_tokens"] + calibration["generated_tokens"]
                   + (during["generated_tokens"] if during else 0.0)
                   + sum(entry["generated_tokens"] for entry in set_summaries.values())},
        "eval_during": during,
        "regime_sensitivity": sensitivity,
        "eval_sets": set_summaries,
        "wall_time_s": {"base": t_base, "base_eval": t_base_eval, "rl": t_rl,
                        "final_eval": t_final_eval, "eval_sets": t_sets, "total": total},
        "wall_time_total_s": total,
        "generated_tokens": budget.get("generated_tokens", 0.0),
        "calibration_tokens": budget.get("calibration_tokens", 0.0),
        "trained_tokens": budget.get("trained_tokens", 0.0),
        "seed": cfg.seed,
        "split": data.split._asdict(),  # what cleaning the training pool and the held-out set removed
        "base_info": base_info,
        "rl_steps": steps_done,
        "final_train_reward": rows[-1].get("reward") if rows else None,
        "plots": plots,
        "export_dir": export_dir,
        "versions": run_versions,
        "matmul_dtype": matmul_dtype,  # model.compute_dtype as run ("auto" resolved)
    }
    if "episodes" in base_eval:  # multi-turn: how the policy used its tools, before and after
        for when, result in (("base", base_eval), ("final", final_eval)):
            for name, value in episode_rates(result["episodes"]).items():
                summary[f"{when}_{name}"] = value
    if reevaluate and finished is not None:
        write_json(os.path.join(workdir, layout.SUMMARY_REEVALUATED), eval_lib.to_jsonable(summary))
    else:
        eval_lib.write_report(summary, workdir, title=report_title(cfg),
                              sections=[eval_lib.sensitivity_markdown(sensitivity), *set_sections])
    if cfg.run.print_table:
        log(eval_lib.format_table(report))
        log(f"held-out pass@1: base {summary['base_pass_at_1']:.4f} -> final "
            f"{summary['final_pass_at_1']:.4f}; wall time {total:.1f}s; summary in "
            f"{os.path.join(workdir, layout.SUMMARY)}")
    return summary
