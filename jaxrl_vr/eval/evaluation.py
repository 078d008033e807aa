"""One checkpoint's evaluation against the base model: JSON, Markdown report, PNG plots.

``build_evaluation`` turns per-prompt sample counts into the evaluation record written to
``<workdir>/eval/<checkpoint>/evaluation.json`` by ``experiments.evaluate`` (the schema
and every formula are in docs/evaluation.md and under the record's "definitions" key).
It reuses ``passk_report`` (unbiased pass@k, Chen et al. arXiv 2107.03374; PBA regimes,
arXiv 2607.20543) and ``inversion_report`` (lost / newly solved with chance baselines).
Pure host NumPy: no model, no I/O except ``write_evaluation``.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from jaxrl_vr import passk
from jaxrl_vr.eval.inversion import inversion_counts, inversion_report
from jaxrl_vr.eval.passk_eval import headline_ks, passk_report
from jaxrl_vr.eval.plots import plot_delta_by_regime, plot_passk, plot_passk_curves, plot_prompt_scatter
from jaxrl_vr import layout
from jaxrl_vr.atomic import write_text
from jaxrl_vr.eval.report import format_table, to_jsonable
from jaxrl_vr.eval.sensitivity import regime_sensitivity, sensitivity_markdown

__all__ = ["PolicyResult", "REGIME_N", "DEFINITIONS", "build_evaluation", "evaluation_markdown", "evaluation_table",
           "write_evaluation"]

SCHEMA = "jaxrl_vr.evaluation/1"
# The PBA regimes are defined by the reach probability at n = 256 (SPEC §3.6).
REGIME_N = 256

DEFINITIONS = {
    "pass_at_k": "mean over prompts of the unbiased estimator 1 − C(n−c, k)/C(n, k) (1 when n − c < k), "
                 "c correct of n samples (Chen et al., arXiv 2107.03374); k = 1, 2, 4, …, n",
    "delta_pass_at_k": "pass_at_k(evaluated policy) − pass_at_k(base), both from n samples per prompt",
    "regime": "PBA regime of the base pass rate p (jaxrl_vr.passk.regime with n = 256): solved_easy p > 0.6; "
              "reachable 0.10 ≤ p ≤ 0.6; boundary p < 0.10 and 1−(1−p)^256 > 0.4; out_of_reach otherwise. "
              "p from the run's independent base calibration cache when present (regime_source)",
    "lost": "prompts with base count > 0 (of n) and evaluated count = 0 (of n)",
    "newly_solved": "prompts with base count = 0 (of n) and evaluated count > 0 (of n)",
    "lost_expected_by_chance": "Σ over base-solvable prompts of π = S(n): the expected lost count of a policy "
                               "equal to the base, given which prompts the base evaluation solved. "
                               "S(m) = B(a+c, b+N−c+m)/B(a+c, b+N−c) is the posterior mean of (1−p)^m given "
                               "c of all N base samples of the prompt (calibration + base evaluation), under "
                               "a Beta(a, b) prior fitted to all prompts by beta-binomial maximum marginal "
                               "likelihood (inversion.chance_prior)",
    "newly_solved_expected_by_chance": "Σ over base-unsolved prompts of π = 1 − S(n) (same S)",
    "expected_unbiased": "prior-free cross-check when the calibration cache has N_cal ≥ n samples: S(n) "
                         "replaced by C(N_cal−c_cal, n)/C(N_cal, n), unbiased for (1−p)^n (None otherwise)",
    "chance_sd": "√Σ π(1 − π) over the same terms π (Poisson-binomial standard deviation)",
    "chance_p_value": "two-sided: min(1, 2·min(P(X ≥ observed), P(X ≤ observed))) under the Poisson-binomial "
                      "law with those π; ≥ 0.05 is reported as 'no difference from sampling noise detected'",
    "chance_reference_n": "calibration samples per prompt available to the chance baselines (0: none)",
    "entropy": "Σ −log π_T(y_t | prefix) / Σ tokens over the sampled response tokens (π_T: the policy at "
               "the sampling temperature T): a Monte-Carlo estimate of the per-token entropy at T",
    "mean_length": "response tokens per sample, stop token included",
    "truncation_rate": "fraction of samples that reached max_new_tokens without a stop token",
    "regime_sensitivity": "the regime table with the boundary band's edges scaled by 0.5, 1 and 2 "
                          "(cutoff_scales), and the prompts in fixed bins of the base pass rate "
                          "(p_base_bins); jaxrl_vr.eval.sensitivity",
}


class PolicyResult(NamedTuple):
    """Per-prompt results of one policy's n samples per prompt.

    Attributes:
      counts_p: int [P] correct samples.
      n: samples per prompt.
      length_sum_p: int [P] response tokens over the n samples (None if unknown).
      neg_logp_sum_p: float [P] Σ −log π over those tokens (None if unknown).
      truncated_p: int [P] samples that hit the length cap (None if unknown).
    """

    counts_p: np.ndarray
    n: int
    length_sum_p: np.ndarray | None = None
    neg_logp_sum_p: np.ndarray | None = None
    truncated_p: np.ndarray | None = None


def _by_k(ks: Sequence[int], values: Sequence[float] | None) -> dict[str, float] | None:
    return None if values is None else {str(k): float(v) for k, v in zip(ks, values)}


def _ratio(num: Any, den: Any) -> np.ndarray:
    num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
    return np.divide(num, den, out=np.full(np.broadcast(num, den).shape, np.nan), where=den > 0)


def _policy_scalars(result: PolicyResult) -> dict[str, float | None]:
    num = result.counts_p.size * result.n
    out: dict[str, float | None] = {"mean_length": None, "entropy": None, "truncation_rate": None}
    if result.length_sum_p is not None:
        out["mean_length"] = float(np.sum(result.length_sum_p) / max(num, 1))
        if result.neg_logp_sum_p is not None:
            out["entropy"] = float(_ratio(np.sum(result.neg_logp_sum_p), np.sum(result.length_sum_p)))
    if result.truncated_p is not None:
        out["truncation_rate"] = float(np.sum(result.truncated_p) / max(num, 1))
    return out


def _per_prompt_arrays(result: PolicyResult) -> dict[str, np.ndarray | None]:
    n = result.n
    return {
        "mean_length": None if result.length_sum_p is None else np.asarray(result.length_sum_p) / n,
        "entropy": None if result.length_sum_p is None or result.neg_logp_sum_p is None
        else _ratio(result.neg_logp_sum_p, result.length_sum_p),
        "truncation_rate": None if result.truncated_p is None else np.asarray(result.truncated_p) / n,
    }


def build_evaluation(
    policy: PolicyResult,
    *,
    base: PolicyResult | None = None,
    calibration_counts_p: Any | None = None,
    calibration_n: int = 0,
    uids: Sequence[str] | None = None,
    meta: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The evaluation record of a policy, against the base when ``base`` is given.

    Args:
      policy: the evaluated policy's per-prompt results.
      base: the base model's results on the same prompts (same n recommended; None for a
        base-only evaluation, then every comparison field is None).
      calibration_counts_p: [P] independent base samples (regimes and chance baselines);
        None falls back to the base (or the policy's own) counts, named in
        ``regime_source`` and ``inversion.chance_reference``.
      calibration_n: samples per prompt of the calibration cache.
      uids: prompt ids for the per-prompt records.
      meta: extra top-level fields (workdir, checkpoint, step, seeds, …).

    Returns:
      JSON-able dict; see docs/evaluation.md for the schema.
    """
    counts = np.asarray(policy.counts_p, np.int64)
    num = counts.shape[0]
    n = int(policy.n)
    has_cal = calibration_counts_p is not None and calibration_n > 0
    if has_cal:
        cal = np.asarray(calibration_counts_p, np.int64)
        if cal.shape != counts.shape:
            raise ValueError(f"calibration counts have shape {cal.shape}, policy counts {counts.shape}.")
    ref = base if base is not None else policy
    ref_counts = np.asarray(ref.counts_p, np.int64)
    if ref_counts.shape != counts.shape:
        raise ValueError(f"base counts have shape {ref_counts.shape}, policy counts {counts.shape}.")
    if has_cal:
        p_regime, regime_source = cal / calibration_n, {"from": "calibration", "n": int(calibration_n)}
    else:
        p_regime = ref_counts / ref.n
        regime_source = {"from": "base_eval" if base is not None else "self", "n": int(ref.n)}
    regime_source["regime_n"] = REGIME_N
    ks = headline_ks(min(n, int(ref.n)))
    report = passk_report(ref_counts, counts, int(ref.n), p_base=p_regime, final_n=n, ks=ks, regime_n=REGIME_N)
    codes = np.asarray(passk.regime(np.asarray(p_regime, np.float64), n=REGIME_N))
    regime_names = [passk.REGIMES[c] for c in codes]

    inversion = None
    if base is not None:
        reference = dict(reference_counts=cal if has_cal else None, reference_n=int(calibration_n) if has_cal else 0)
        inversion = inversion_report(ref_counts, int(base.n), counts, n, **reference)
        per = inversion_counts(ref_counts, int(base.n), counts, n, **reference)

    regimes = {}
    for code, name in enumerate(passk.REGIMES):
        reg = report["regimes"][name]
        sel = codes == code
        entry = {
            "count": reg["count"],
            "pass_at_k": _by_k(ks, reg["pass_at_k_final"]),
            "base_pass_at_k": _by_k(ks, reg["pass_at_k_base"]) if base is not None else None,
            "delta_pass_at_k": _by_k(ks, reg["delta"]) if base is not None else None,
        }
        if base is not None:
            entry.update(
                lost=int(per.lost_p[sel].sum()),
                lost_expected_by_chance=float(per.lost_chance_p[sel].sum()),
                newly_solved=int(per.newly_solved_p[sel].sum()),
                newly_solved_expected_by_chance=float(per.newly_solved_chance_p[sel].sum()),
            )
        regimes[name] = entry

    arrays = _per_prompt_arrays(policy)
    curve_p = passk.pass_at_k_curve(np.full(num, n), counts, ks) if num else np.zeros((0, len(ks)))
    per_prompt = []
    for i in range(num):
        record = {
            "index": i,
            "uid": None if uids is None else str(uids[i]),
            "count": int(counts[i]),
            "n": n,
            "pass_rate": float(counts[i] / n),
            "pass_at_k": _by_k(ks, curve_p[i]),
            "regime": regime_names[i],
            "base_count": int(ref_counts[i]) if base is not None else None,
            "base_n": int(base.n) if base is not None else None,
            "calibration_count": int(cal[i]) if has_cal else None,
            "calibration_n": int(calibration_n) if has_cal else None,
            "lost": bool(per.lost_p[i]) if base is not None else None,
            "newly_solved": bool(per.newly_solved_p[i]) if base is not None else None,
        }
        for key, values in arrays.items():
            record[key] = None if values is None else float(values[i])
        per_prompt.append(record)

    record: dict[str, Any] = {"schema": SCHEMA, **dict(meta or {})}
    record.update(
        n=n,
        num_prompts=int(num),
        ks=ks,
        pass_at_k=_by_k(ks, report["pass_at_k"]["final"]),
        base=None if base is None else {
            "n": int(base.n),
            "pass_at_k": _by_k(ks, report["pass_at_k"]["base"]),
            **_policy_scalars(base),
        },
        delta_pass_at_k=None if base is None else _by_k(ks, report["pass_at_k"]["delta"]),
        **_policy_scalars(policy),
        regime_source=regime_source,
        regimes=regimes,
        lost=None if inversion is None else inversion["lost"],
        lost_expected_by_chance=None if inversion is None else inversion["lost_expected_by_chance"],
        newly_solved=None if inversion is None else inversion["newly_solved"],
        newly_solved_expected_by_chance=None if inversion is None else inversion["newly_solved_expected_by_chance"],
        inversion=inversion,
        regime_sensitivity=regime_sensitivity(ref_counts, int(ref.n), counts, n, p_regime, ks=ks, regime_n=REGIME_N),
        per_prompt=per_prompt,
        definitions=DEFINITIONS,
    )
    return to_jsonable(record)


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _report_for_table(evaluation: Mapping[str, Any]) -> dict[str, Any]:
    """The evaluation in ``passk_report`` shape, for ``format_table``."""
    ks = list(evaluation["ks"])

    def listed(curve):
        return None if curve is None else [curve[str(k)] for k in ks]

    own = listed(evaluation["pass_at_k"])
    base = listed(evaluation["base"]["pass_at_k"]) if evaluation.get("base") else own
    regimes = {}
    for name, reg in evaluation["regimes"].items():
        final = listed(reg["pass_at_k"])
        regimes[name] = {
            "count": reg["count"],
            "lost": reg.get("lost", "—"),
            "pass_at_k_final": final,
            "pass_at_k_base": listed(reg["base_pass_at_k"]) if reg.get("base_pass_at_k") else final,
        }
    return {
        "ks": ks,
        "headline_ks": ks,
        "num_prompts": evaluation["num_prompts"],
        "lost": evaluation["lost"] if evaluation["lost"] is not None else "—",
        "pass_at_k": {"base": base, "final": own},
        "regimes": regimes,
    }


def evaluation_table(evaluation: Mapping[str, Any]) -> str:
    """The evaluation's regime table (``format_table``: pass@k base → evaluated per regime)."""
    return format_table(_report_for_table(evaluation))


def evaluation_markdown(evaluation: Mapping[str, Any], *, images: Sequence[str] = ()) -> str:
    """Human-readable report of an evaluation record."""
    ev = evaluation
    lines = [f"# Evaluation: checkpoint {ev.get('checkpoint', '?')} (step {ev.get('step', '?')})", ""]
    lines.append(
        f"{ev['num_prompts']} held-out prompts × n = {ev['n']} samples (temperature "
        f"{_fmt(ev.get('temperature'), 2)}, ≤ {ev.get('max_new_tokens', '?')} tokens). Regimes from "
        f"{ev['regime_source']['from']} (n = {ev['regime_source']['n']}); regime reach at n = "
        f"{ev['regime_source']['regime_n']}."
    )
    lines.append("")
    ks = ev["ks"]
    head = "| | " + " | ".join(f"pass@{k}" for k in ks) + " |"
    rule = "|---|" + "---:|" * len(ks)
    rows = ["| evaluated | " + " | ".join(_fmt(ev["pass_at_k"][str(k)]) for k in ks) + " |"]
    if ev.get("base"):
        rows.append("| base | " + " | ".join(_fmt(ev["base"]["pass_at_k"][str(k)]) for k in ks) + " |")
        rows.append("| Δ | " + " | ".join(f"{ev['delta_pass_at_k'][str(k)]:+.3f}" for k in ks) + " |")
    lines += ["## pass@k", "", head, rule, *rows, ""]
    lines += ["## Per base regime", "", format_table(_report_for_table(ev)), ""]
    if ev.get("regime_sensitivity"):
        lines += [sensitivity_markdown(ev["regime_sensitivity"])]
    inv = ev.get("inversion")
    if inv:
        lines += [
            "## Lost and newly solved prompts vs sampling noise",
            "",
            "Chance baselines: the expected counts for a policy equal to the base (empirical-Bayes "
            f"posterior over all base samples, Beta({inv['chance_prior']['a']:.3g}, "
            f"{inv['chance_prior']['b']:.3g}) prior; {inv['chance_reference_n']} calibration samples per "
            "prompt; see docs/evaluation.md).",
            "",
            "| | observed | expected by chance | chance sd | p (two-sided) |",
            "|---|---:|---:|---:|---:|",
            f"| lost (base-solvable → 0 of {ev['n']}) | {inv['lost']} | {inv['lost_expected_by_chance']:.2f} | "
            f"{inv['lost_chance_sd']:.2f} | {inv['lost_chance_p_value']:.3g} |",
            f"| newly solved | {inv['newly_solved']} | {inv['newly_solved_expected_by_chance']:.2f} | "
            f"{inv['newly_solved_chance_sd']:.2f} | {inv['newly_solved_chance_p_value']:.3g} |",
            "",
            *[f"- {v}" for v in inv["verdict"]],
            "",
        ]
    else:
        lines += ["No base comparison (this is the base model's own evaluation).", ""]
    scalars = [("mean response length", "mean_length"), ("entropy (nats/token)", "entropy"),
               ("truncation rate", "truncation_rate")]
    lines += ["## Sampling statistics", "", "| | evaluated | base |", "|---|---:|---:|"]
    for label, key in scalars:
        base_value = ev["base"].get(key) if ev.get("base") else None
        lines.append(f"| {label} | {_fmt(ev.get(key))} | {_fmt(base_value)} |")
    lines.append("")
    if images:
        lines += ["## Plots", ""] + [f"![{name}]({name})" for name in images] + [""]
    return "\n".join(lines)


def write_evaluation(evaluation: Mapping[str, Any], out_dir: str | os.PathLike) -> dict[str, pathlib.Path]:
    """Writes evaluation.json, report.md and the PNG plots into ``out_dir`` (atomically).

    Plots: passk.png (evaluated vs base pass@k; both lines visible when they coincide),
    and with a base: delta_by_regime.png (Δpass@k by regime) and prompt_scatter.png
    (per-prompt base vs evaluated pass rate, coloured by regime).
    """
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ev = evaluation
    ks = ev["ks"]
    own = [ev["pass_at_k"][str(k)] for k in ks]
    paths: dict[str, pathlib.Path] = {}
    label = f"checkpoint {ev.get('checkpoint', '')}".strip()
    if ev.get("base"):
        base = [ev["base"]["pass_at_k"][str(k)] for k in ks]
        paths["passk"] = plot_passk(base, own, ks, out_dir / "passk.png", labels=("base", label))
        table = _report_for_table(ev)
        table["pass_at_k"]["delta"] = [ev["delta_pass_at_k"][str(k)] for k in ks]
        for name, reg in ev["regimes"].items():
            delta = reg.get("delta_pass_at_k")
            table["regimes"][name]["delta"] = None if not delta else [delta[str(k)] for k in ks]
        paths["delta_by_regime"] = plot_delta_by_regime(table, out_dir / "delta_by_regime.png")
        records = ev["per_prompt"]
        paths["prompt_scatter"] = plot_prompt_scatter(
            [r["base_count"] / r["base_n"] for r in records],
            [r["pass_rate"] for r in records],
            out_dir / "prompt_scatter.png",
            groups_p=[r["regime"] for r in records],
            labels=("base pass rate", f"{label} pass rate"),
        )
    else:
        paths["passk"] = plot_passk_curves({label: own}, ks, out_dir / "passk.png")
    text = json.dumps(to_jsonable(dict(ev)), indent=1, sort_keys=True, allow_nan=False)
    paths["evaluation"] = write_text(out_dir / layout.EVALUATION, text + "\n")
    images = [p.name for key, p in paths.items() if key != "evaluation"]
    paths["report"] = write_text(out_dir / layout.REPORT, evaluation_markdown(ev, images=images))
    return paths
