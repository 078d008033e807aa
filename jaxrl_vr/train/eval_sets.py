"""More evaluation sets in one run (``task.eval_paths``), each evaluated and reported apart.

Each file is a set named by its stem. Before RL the base draws eval.num_samples samples of
every prompt (pass@k) and eval.base_calibration_samples more (the regimes), cached in
``<workdir>/eval_sets/<stem>/`` like the held-out prompts' in the workdir; after RL the
trained policy draws eval.num_samples. ``eval_sets/<stem>/`` then holds the set's
evaluation.json, report.md and plots (``jaxrl_vr.eval.write_evaluation``: regimes,
lost / newly solved against chance, the regime table under shifted cutoffs and in p_base
bins), and ``set_summary`` its entry in summary.json. The i-th set (i = 0, 1, …) draws
with its own seed offsets (``evaluate.EVAL_SET_SEED_SHIFT``).
"""

from __future__ import annotations

import os
from typing import Callable, NamedTuple

import numpy as np

from jaxrl_vr import eval as eval_lib
from jaxrl_vr import layout
from jaxrl_vr.train.config import PipelineConfig
from jaxrl_vr.train.evaluate import EVAL_SET_SEED_SHIFT, BaseEvaluation, evaluate_base, evaluate_counts
from jaxrl_vr.train.sources import TaskData

__all__ = ["EvalSet", "evaluate_sets_base", "evaluate_sets_final"]


class EvalSet(NamedTuple):
    """One set of ``task.eval_paths``: its name (file stem), file, items, the base's counts."""

    name: str
    path: str
    items: list
    base: BaseEvaluation
    seed_shift: int


def set_directory(workdir: str, name: str) -> str:
    return os.path.join(workdir, layout.EVAL_SETS, name)


def evaluate_sets_base(model, tokenizer, sets: dict[str, list], cfg: PipelineConfig, workdir: str,
                       base_key: str, *, log: Callable[[str], None] = print) -> list[EvalSet]:
    """The base's counts on each set (``evaluate_base``, cached in the set's directory)."""
    out = []
    for i, (path, (name, items)) in enumerate(zip(cfg.task.eval_paths, sets.items())):
        shift = (i + 1) * EVAL_SET_SEED_SHIFT
        log(f"[base] evaluation set {name} ({path}):")
        base = evaluate_base(model, tokenizer, TaskData([], items, []), cfg, set_directory(workdir, name),
                             base_key, log=log, seed_shift=shift)
        out.append(EvalSet(name, path, items, base, shift))
    return out


def evaluate_sets_final(model, tokenizer, sets: list[EvalSet], cfg: PipelineConfig, workdir: str, *,
                        step: int, trained: bool, log: Callable[[str], None] = print) -> tuple[dict, list[str]]:
    """Evaluates ``model`` on each set and writes its evaluation into ``eval_sets/<name>/``.
    ``trained`` False (rl.steps = 0): the base's own counts are the evaluation, reported
    without a comparison.

    Returns:
      ({name: its summary.json entry}, one Markdown section per set for the run's report).
    """
    n = cfg.eval.num_samples
    summaries, sections = {}, []
    for s in sets:
        base_counts = np.asarray(s.base.evaluation["counts"], np.int64)
        final = (evaluate_counts(model, tokenizer, s.items, cfg, 2 + s.seed_shift) if trained
                 else {"counts": base_counts, "generated_tokens": 0})
        has_cal = "counts" in s.base.calibration
        evaluation = eval_lib.build_evaluation(
            eval_lib.PolicyResult(np.asarray(final["counts"], np.int64), n),
            base=eval_lib.PolicyResult(base_counts, n) if trained else None,
            calibration_counts_p=s.base.calibration["counts"] if has_cal else None,
            calibration_n=s.base.regime_n if has_cal else 0,
            uids=[it.uid for it in s.items],
            meta={"set": s.name, "path": s.path, "workdir": workdir, "checkpoint": "final" if trained else "base",
                  "step": step, "temperature": cfg.eval.temperature,
                  "max_new_tokens": cfg.eval.max_new_tokens or cfg.rl.max_new_tokens,
                  "generated_tokens": int(final["generated_tokens"])})
        paths = eval_lib.write_evaluation(evaluation, set_directory(workdir, s.name))
        base_pk = evaluation["base"]["pass_at_k"] if evaluation["base"] else evaluation["pass_at_k"]
        log(f"[eval] set {s.name}: pass@1 {base_pk['1']:.4f} -> {evaluation['pass_at_k']['1']:.4f} "
            f"({len(s.items)} prompts × {n} samples)")
        summaries[s.name] = {
            "path": s.path,
            "num_prompts": evaluation["num_prompts"],
            "n": n,
            "base_pass_at_k": base_pk,
            "final_pass_at_k": evaluation["pass_at_k"],
            "delta_pass_at_k": evaluation["delta_pass_at_k"],
            "regime_counts": {name: reg["count"] for name, reg in evaluation["regimes"].items()},
            "lost": evaluation["lost"],
            "lost_expected_by_chance": evaluation["lost_expected_by_chance"],
            "newly_solved": evaluation["newly_solved"],
            "newly_solved_expected_by_chance": evaluation["newly_solved_expected_by_chance"],
            "evaluation": os.path.relpath(paths["evaluation"], workdir),
            "report": os.path.relpath(paths["report"], workdir),
            "generated_tokens": float(s.base.evaluation["generated_tokens"] + s.base.calibration["generated_tokens"]
                                      + final["generated_tokens"]),
        }
        report = summaries[s.name]["report"]
        sections.append(f"## Evaluation set {s.name}\n\n{len(s.items)} prompts of {s.path}, n = {n} samples each; "
                        f"regimes from {evaluation['regime_source']['from']} (n = "
                        f"{evaluation['regime_source']['n']}). Lost / newly solved against chance, the "
                        f"shifted cutoffs, p_base bins and plots: [{report}]({report}).\n\n"
                        f"{eval_lib.evaluation_table(evaluation)}\n")
    return summaries, sections
