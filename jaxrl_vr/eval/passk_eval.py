"""pass@k curves per PBA regime, base vs trained (SPEC §6).

All estimates use ``jaxrl_vr.passk`` (the unbiased estimator of Chen et al.,
arXiv 2107.03374, and the PBA regimes of arXiv 2607.20543). Everything returned is
JSON-able (lists, ints, floats, None for empty regimes).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jaxrl_vr import passk

__all__ = ["passk_report", "passk_scalars", "headline_ks", "mean_passk_curve"]


def headline_ks(n: int) -> list[int]:
    """k = 1, 2, 4, … (powers of two below n) and n itself."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}.")
    ks = [1 << i for i in range(n.bit_length()) if (1 << i) < n]
    return ks + [n]


def mean_passk_curve(n: Any, c: Any, ks: Sequence[int]) -> np.ndarray:
    """Mean over prompts of the unbiased pass@k, [len(ks)] float64 (zeros if no prompts)."""
    c = np.asarray(c)
    if c.size == 0:
        return np.zeros(len(ks))
    return passk.pass_at_k_curve(np.broadcast_to(n, c.shape), c, ks).mean(axis=0)


def passk_scalars(counts_p: Any, n: int, *, codes_p: Any, ks: Sequence[int] | None = None,
                  prefix: str = "eval") -> dict[str, float]:
    """One evaluation as flat scalars (for metrics.jsonl / TensorBoard).

    Args:
      counts_p: [P] correct samples of n per prompt.
      n: samples per prompt.
      codes_p: [P] regime codes (``passk.regime``) of the prompts.
      ks: k values (default ``headline_ks(n)``), each <= n.
      prefix: name prefix.

    Returns:
      ``{prefix}/pass@{k}`` for every k (mean over prompts), and per regime of
      ``passk.REGIMES`` ``{prefix}/{regime}/count``, ``/pass@1`` and ``/pass@{max k}``
      (NaN for an empty regime).
    """
    counts_p = _as_counts("counts_p", counts_p, None)
    codes_p = np.asarray(codes_p).reshape(-1)
    if codes_p.shape != counts_p.shape:
        raise ValueError(f"codes_p has {codes_p.shape[0]} prompts, counts_p {counts_p.shape[0]}.")
    ks = headline_ks(int(n)) if ks is None else [int(k) for k in ks]
    if not ks or min(ks) < 1 or max(ks) > n:
        raise ValueError(f"ks must be non-empty and within [1, n={n}], got {ks}.")
    curve_pk = (passk.pass_at_k_curve(np.full(counts_p.shape, n), counts_p, ks) if counts_p.size
                else np.zeros((0, len(ks))))
    out = {f"{prefix}/pass@{k}": float(v) for k, v in zip(ks, mean_passk_curve(n, counts_p, ks))}
    for code, name in enumerate(passk.REGIMES):
        sel = codes_p == code
        out[f"{prefix}/{name}/count"] = float(sel.sum())
        for j in sorted({0, len(ks) - 1}):
            out[f"{prefix}/{name}/pass@{ks[j]}"] = float(curve_pk[sel, j].mean()) if sel.any() else float("nan")
    return out


def _as_counts(name: str, c: Any, num: int | None) -> np.ndarray:
    arr = np.asarray(c)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of per-prompt success counts, got shape {arr.shape}.")
    if num is not None and arr.shape[0] != num:
        raise ValueError(f"{name} has {arr.shape[0]} prompts, expected {num}; align prompts first.")
    return arr


def _floats(x: np.ndarray) -> list[float]:
    return [float(v) for v in np.asarray(x).reshape(-1)]


def passk_report(
    base_counts: Any,
    final_counts: Any,
    n: int,
    p_base: Any | None = None,
    *,
    final_n: int | None = None,
    ks: Sequence[int] | None = None,
    regime_n: int = 256,
) -> dict[str, Any]:
    """pass@k of the base and the trained policy, overall and per PBA regime.

    Args:
      base_counts: [P] correct samples out of ``n`` for the base policy.
      final_counts: [P] correct samples out of ``final_n`` (default ``n``) for the
        trained policy, same prompt order.
      n: samples per prompt of the base evaluation.
      p_base: optional [P] base pass rates defining the regimes (e.g. the tracker's
        calibration cache, ``PromptTracker.p_base()``); default base_counts / n.
      final_n: samples per prompt of the trained evaluation (default ``n``).
      ks: k values for the curves (default 1..min(n, final_n)).
      regime_n: the n of the regimes' reach probability 1 − (1−p)^n.

    Returns:
      dict with
        ``num_prompts``, ``n``, ``final_n``, ``ks``, ``headline_ks``;
        ``pass_at_k``: {"base": [K], "final": [K], "delta": [K]} (means over prompts);
        ``mean_pass_rate``: {"base", "final"} (= pass@1);
        ``regimes``: {name: {"count", "pass_at_k_base", "pass_at_k_final", "delta",
          "lost", "gained"}} for every name in ``passk.REGIMES`` (curves None if empty);
        ``regime_counts``: {name: count};
        ``lost``: base-solvable prompts lost (base c > 0, trained c = 0);
        ``gained``: prompts newly solved (base c = 0, trained c > 0).
    """
    n = int(n)
    final_n = n if final_n is None else int(final_n)
    base_c = _as_counts("base_counts", base_counts, None)
    num = base_c.shape[0]
    final_c = _as_counts("final_counts", final_counts, num)
    if np.any(base_c < 0) or np.any(base_c > n):
        raise ValueError(f"base_counts must lie in [0, n={n}].")
    if np.any(final_c < 0) or np.any(final_c > final_n):
        raise ValueError(f"final_counts must lie in [0, final_n={final_n}].")
    max_k = min(n, final_n)
    ks = list(range(1, max_k + 1)) if ks is None else [int(k) for k in ks]
    if not ks or min(ks) < 1 or max(ks) > max_k:
        raise ValueError(f"ks must be non-empty and within [1, {max_k}], got {ks}.")
    if p_base is None:
        p_base = base_c / max(n, 1)
    p_base = np.asarray(p_base, np.float64).reshape(-1)
    if p_base.shape[0] != num:
        raise ValueError(f"p_base has {p_base.shape[0]} prompts, expected {num}.")

    base_pk = passk.pass_at_k_curve(np.full(num, n), base_c, ks) if num else np.zeros((0, len(ks)))
    final_pk = passk.pass_at_k_curve(np.full(num, final_n), final_c, ks) if num else np.zeros((0, len(ks)))
    codes = np.asarray(passk.regime(p_base, n=regime_n)) if num else np.zeros(0, np.int32)
    lost = (base_c > 0) & (final_c == 0)
    gained = (base_c == 0) & (final_c > 0)

    def mean(rows: np.ndarray) -> list[float] | None:
        return _floats(rows.mean(axis=0)) if rows.shape[0] else None

    regimes = {}
    for code, name in enumerate(passk.REGIMES):
        sel = codes == code
        b, f = mean(base_pk[sel]), mean(final_pk[sel])
        regimes[name] = {
            "count": int(sel.sum()),
            "pass_at_k_base": b,
            "pass_at_k_final": f,
            "delta": None if b is None else [fv - bv for bv, fv in zip(b, f)],
            "lost": int((lost & sel).sum()),
            "gained": int((gained & sel).sum()),
        }
    base_curve = base_pk.mean(axis=0) if num else np.zeros(len(ks))
    final_curve = final_pk.mean(axis=0) if num else np.zeros(len(ks))
    return {
        "num_prompts": int(num),
        "n": n,
        "final_n": final_n,
        "regime_n": int(regime_n),
        "ks": ks,
        "headline_ks": [k for k in headline_ks(max_k) if k in ks],
        "pass_at_k": {
            "base": _floats(base_curve),
            "final": _floats(final_curve),
            "delta": _floats(final_curve - base_curve),
        },
        "mean_pass_rate": {
            "base": float(base_c.sum() / (n * num)) if num else 0.0,
            "final": float(final_c.sum() / (final_n * num)) if num else 0.0,
        },
        "regimes": regimes,
        "regime_counts": {name: regimes[name]["count"] for name in passk.REGIMES},
        "lost": int(lost.sum()),
        "gained": int(gained.sum()),
    }
