"""Does a finding hinge on one threshold? The regime table under shifted cutoffs and in
fixed bins of the base pass rate (SPEC §6).

- Shifted cutoffs: the PBA boundary band is p_lo < p < 0.10, where p_lo ≈ 0.0020 solves
  1 − (1 − p)^256 = 0.4 (``passk.regime``). Scale s moves both of its edges to s·p_lo and
  s·0.10, so the band keeps its width on the log scale (a factor 50) and slides by s;
  out_of_reach (p ≤ s·p_lo) and reachable (s·0.10 ≤ p ≤ 0.6) give or take the prompts in
  between, solved_easy (p > 0.6) stays. s = 1 is ``passk.regime`` itself; the default
  scales 0.5, 1, 2 halve and double both edges, symmetric on the log scale around the
  standard cutoffs (PBA, arXiv 2607.20543): a conclusion about "boundary" prompts should
  hold at all three.
- p_base bins: fixed bins of the base pass rate, exactly 0, then (0, 0.02], (0.02, 0.05],
  (0.05, 0.10], (0.10, 0.20], (0.20, 0.40], (0.40, 0.60], (0.60, 0.80], (0.80, 1]: finer
  where the regimes' cutoffs lie, the same for every run, so runs can be compared bin by bin.

Each cell holds the prompts' count, pass@k of the base and of the evaluated policy (the
unbiased estimator, for the headline k), their difference and the lost prompts (base
count > 0, evaluated count = 0). Pure host NumPy, JSON-able output.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jaxrl_vr import passk
from jaxrl_vr.eval.passk_eval import headline_ks

__all__ = ["CUTOFF_SCALES", "P_BASE_EDGES", "regime_sensitivity", "sensitivity_markdown", "shifted_regime"]

CUTOFF_SCALES = (0.5, 1.0, 2.0)
P_BASE_EDGES = (0.0, 0.02, 0.05, 0.10, 0.20, 0.40, 0.60, 0.80, 1.0)
_SOLVED_EASY, _REACHABLE = passk.REGIMES.index("solved_easy"), passk.REGIMES.index("reachable")


def boundary_band(scale: float, n: int = 256) -> tuple[float, float]:
    """(s·p_lo, s·0.10): the boundary band's edges at scale s (reach n)."""
    return float(scale) * float(-np.expm1(np.log(0.6) / n)), float(scale) * 0.10


def shifted_regime(p_base: Any, *, scale: float, n: int = 256) -> np.ndarray:
    """``passk.regime`` codes with the boundary band's edges scaled by ``scale`` (module
    docstring): the regime of p/s under the standard cutoffs, with solved_easy at p > 0.6
    whatever s (valid for 0 < s < 6)."""
    if not 0.0 < scale < 6.0:
        raise ValueError(f"scale must lie in (0, 6), got {scale}.")
    p = np.asarray(p_base, np.float64)
    codes = np.asarray(passk.regime(p / scale, n=n), np.int32)
    codes = np.where(p > 0.6, _SOLVED_EASY, np.where(codes == _SOLVED_EASY, _REACHABLE, codes))
    return codes.astype(np.int32)


def _cell(sel, base_pk, final_pk, lost, ks) -> dict:
    count = int(sel.sum())

    def by_k(rows):
        return None if not count else {str(k): float(v) for k, v in zip(ks, rows[sel].mean(axis=0))}

    base, final = by_k(base_pk), by_k(final_pk)
    return {"count": count, "pass_at_k_base": base, "pass_at_k_final": final,
            "delta": None if base is None else {k: final[k] - base[k] for k in base},
            "lost": int((lost & sel).sum())}


def regime_sensitivity(base_counts: Any, base_n: int, final_counts: Any, final_n: int, p_base: Any, *,
                       ks: Sequence[int] | None = None, regime_n: int = 256,
                       scales: Sequence[float] = CUTOFF_SCALES,
                       edges: Sequence[float] = P_BASE_EDGES) -> dict:
    """The regime table at each cutoff scale and the table by p_base bin.

    Args:
      base_counts, final_counts: [P] correct samples of base_n / final_n per prompt.
      p_base: [P] the base pass rates that assign regimes (the calibration's).
      ks: k values (default ``headline_ks(min(base_n, final_n))``).
      regime_n: n of the regimes' reach probability.
      scales: boundary-band scales; edges: p_base bin edges (first 0, last 1; bin 0 is p = 0).

    Returns:
      {"ks", "regime_n", "cutoff_scales": {"scales", "by_scale": {str(s): {"boundary_band": [lo, hi],
      "regimes": {name: cell}}}}, "p_base_bins": {"edges", "bins": [{"label", "low",
      "high", **cell}]}, "definitions"} with cell = {"count", "pass_at_k_base",
      "pass_at_k_final", "delta" (k -> value, None when empty), "lost"}.
    """
    base_c, final_c = np.asarray(base_counts, np.int64), np.asarray(final_counts, np.int64)
    p = np.asarray(p_base, np.float64).reshape(-1)
    if not base_c.shape == final_c.shape == p.shape:
        raise ValueError(f"base_counts {base_c.shape}, final_counts {final_c.shape} and p_base {p.shape} "
                         "must be [P] over the same prompts.")
    edges = [float(e) for e in edges]
    if edges[0] != 0.0 or edges[-1] != 1.0 or any(b <= a for a, b in zip(edges, edges[1:])):
        raise ValueError(f"edges must rise from 0 to 1, got {edges}.")
    ks = headline_ks(min(int(base_n), int(final_n))) if ks is None else [int(k) for k in ks]
    num = p.shape[0]
    if num:
        base_pk = passk.pass_at_k_curve(np.full(num, base_n), base_c, ks)
        final_pk = passk.pass_at_k_curve(np.full(num, final_n), final_c, ks)
    else:
        base_pk = final_pk = np.zeros((0, len(ks)))
    lost = (base_c > 0) & (final_c == 0)
    by_scale = {}
    for scale in scales:
        codes = shifted_regime(p, scale=float(scale), n=regime_n)
        by_scale[f"{float(scale):g}"] = {
            "boundary_band": list(boundary_band(scale, regime_n)),
            "regimes": {name: _cell(codes == code, base_pk, final_pk, lost, ks)
                        for code, name in enumerate(passk.REGIMES)}}
    bins = [{"label": "0", "low": 0.0, "high": 0.0, **_cell(p <= 0.0, base_pk, final_pk, lost, ks)}]
    for low, high in zip(edges, edges[1:]):
        bins.append({"label": f"({low:g}, {high:g}]", "low": low, "high": high,
                     **_cell((p > low) & (p <= high), base_pk, final_pk, lost, ks)})
    return {
        "ks": ks,
        "regime_n": int(regime_n),
        "cutoff_scales": {"scales": [float(s) for s in scales], "by_scale": by_scale},
        "p_base_bins": {"edges": edges, "bins": bins},
        "definitions": {
            "cutoff_scales": "regimes with the boundary band p_lo < p < 0.10 (p_lo: 1 − (1−p)^256 = 0.4) moved "
                             "to s·p_lo < p < s·0.10; out_of_reach p ≤ s·p_lo, reachable s·0.10 ≤ p ≤ 0.6, "
                             "solved_easy p > 0.6; s = 1 is the standard table",
            "p_base_bins": "prompts by the base pass rate p that assigns the regimes: p = 0, then (low, high]",
            "cell": "count, mean pass@k of base and evaluated policy (unbiased estimator), their difference, "
                    "lost = base count > 0 and evaluated count = 0",
        },
    }


def _change(cell: dict, k: int) -> str:
    if not cell["count"]:
        return "—"
    b, f = cell["pass_at_k_base"][str(k)], cell["pass_at_k_final"][str(k)]
    return f"{b:.3f} → {f:.3f} ({f - b:+.3f})"


def sensitivity_markdown(sensitivity: dict, *, level: str = "##") -> str:
    """Two Markdown tables of ``regime_sensitivity``: regimes per cutoff scale, and p_base bins
    (pass@1 and pass@max k, base → evaluated)."""
    ks = sensitivity["ks"]
    k1, kn = ks[0], ks[-1]
    head = f"| count | lost | pass@{k1} base → evaluated (Δ) | pass@{kn} base → evaluated (Δ) |"
    regime_n = sensitivity.get("regime_n", 256)
    p_lo = boundary_band(1.0, regime_n)[0]
    lines = [f"{level} Regimes under shifted boundary cutoffs", "",
             f"The boundary band p_lo < p < 0.10 (p_lo = {p_lo:.4f}, where 1 − (1−p)^{regime_n} = 0.4) with both "
             "edges scaled by s; out_of_reach below it, reachable from its top to 0.6, solved_easy above 0.6. "
             "s = 1 is the standard table.", "",
             "| s | boundary band | regime |" + head[1:], "|---|---|---|---:|---:|---:|---:|"]
    for scale, entry in sensitivity["cutoff_scales"]["by_scale"].items():
        low, high = entry["boundary_band"]
        for i, (name, cell) in enumerate(entry["regimes"].items()):
            band = f"×{scale} | {low:.4f} – {high:.3f}" if i == 0 else " | "
            lines.append(f"| {band} | {name} | {cell['count']} | {cell['lost']} | "
                         f"{_change(cell, k1)} | {_change(cell, kn)} |")
    lines += ["", f"{level} By base pass rate", "", "| p_base |" + head[1:], "|---|---:|---:|---:|---:|"]
    for cell in sensitivity["p_base_bins"]["bins"]:
        lines.append(f"| {cell['label']} | {cell['count']} | {cell['lost']} | {_change(cell, k1)} | "
                     f"{_change(cell, kn)} |")
    return "\n".join(lines) + "\n"
