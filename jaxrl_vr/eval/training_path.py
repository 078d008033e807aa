"""pass@k of the policy along training (``eval.every``): the record behind a run's
``eval_during.json`` and ``eval_during.png``.

Each periodic evaluation left ``eval/pass@k`` (k = 1, 2, 4, …, n), per regime
``eval/<regime>/pass@1`` and ``/pass@n``, ``eval/samples`` (n) and ``eval/generated_tokens``
in its step's metrics row (``jaxrl_vr.train.evaluate.evaluate_during_training``). Step 0 is
the base model, from the run's base evaluation (its own n samples per prompt: the unbiased
pass@k estimates the same quantity with less noise). Pure host code: no model, no I/O.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, Sequence

import numpy as np

from jaxrl_vr import passk
from jaxrl_vr.eval.passk_eval import headline_ks, passk_scalars

__all__ = ["training_path"]

SCHEMA = "jaxrl_vr.eval_during/1"
_PASS_AT = re.compile(r"eval/pass@(\d+)")


def _number(value: Any) -> float | None:
    """A finite float, or None (metrics.jsonl writes NaN as a string)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _point(step: int, scalars: Mapping[str, Any], *, source: str, n: int,
           generated_tokens: float | None) -> dict:
    ks = sorted(int(m.group(1)) for key in scalars if (m := _PASS_AT.fullmatch(key)))
    regimes = {}
    for name in passk.REGIMES:
        count = _number(scalars.get(f"eval/{name}/count"))
        regimes[name] = {"count": int(count or 0),
                         **{f"pass@{k}": _number(scalars.get(f"eval/{name}/pass@{k}"))
                            for k in sorted({ks[0], ks[-1]})}} if ks else {"count": int(count or 0)}
    return {"step": int(step), "source": source, "n": int(n),
            "pass_at_k": {str(k): _number(scalars[f"eval/pass@{k}"]) for k in ks},
            "regimes": regimes, "generated_tokens": generated_tokens}


def training_path(rows: Sequence[Mapping[str, Any]], *, base_counts_p: Any, base_n: int, codes_p: Any,
                  n: int, every: int) -> dict:
    """The pass@k path over training.

    Args:
      rows: the run's metrics rows (metrics.jsonl), in step order; those with
        ``eval/pass@1`` are the periodic evaluations.
      base_counts_p: [P] correct samples of the base evaluation, ``base_n`` per prompt.
      codes_p: [P] regime codes of the held-out prompts (as the final evaluation's).
      n: eval.during_samples; every: eval.every.

    Returns:
      JSON-able {"schema", "every", "n", "ks", "points": [{"step", "source" ("base_eval" |
      "during_training"), "n", "pass_at_k": {k: v}, "regimes": {name: {"count", "pass@1",
      "pass@n"}}, "generated_tokens"}], "evaluations", "generated_tokens", "definitions"};
      point 0 is the base (step 0) with the k <= base_n of ``ks``.
    """
    ks = headline_ks(int(n))
    base_ks = [k for k in ks if k <= base_n]
    base = passk_scalars(base_counts_p, int(base_n), codes_p=codes_p, ks=base_ks)
    points = [_point(0, base, source="base_eval", n=base_n, generated_tokens=None)]
    for row in rows:
        if "eval/pass@1" in row and "step" in row:
            points.append(_point(int(row["step"]), row, source="during_training",
                                 n=int(_number(row.get("eval/samples")) or n),
                                 generated_tokens=_number(row.get("eval/generated_tokens"))))
    during = points[1:]
    return {
        "schema": SCHEMA,
        "every": int(every),
        "n": int(n),
        "ks": ks,
        "points": points,
        "evaluations": len(during),
        "generated_tokens": float(np.sum([p["generated_tokens"] or 0.0 for p in during])),
        "definitions": {
            "pass_at_k": "mean over the held-out prompts of the unbiased 1 − C(n−c, k)/C(n, k), c correct "
                         "of n samples of the policy after `step` RL steps (Chen et al., arXiv 2107.03374)",
            "regimes": "the final evaluation's regimes of the base pass rate (regime_source of summary.json)",
            "step 0": "the base model from the run's base evaluation (its own n per prompt)",
            "generated_tokens": "tokens the evaluation sampled; not charged to rl.budget",
        },
    }
