"""Evaluation: pass@k curves per regime, reports and plots (SPEC §6)."""

from jaxrl_vr.eval.budget import compare_at_equal_budget, metric_at_budget, metric_vs_tokens
from jaxrl_vr.eval.passk_eval import headline_ks, mean_passk_curve, passk_report
from jaxrl_vr.eval.plots import (
    plot_passk,
    plot_passk_curves,
    plot_regimes,
    plot_training_curves,
    read_metrics_jsonl,
)
from jaxrl_vr.eval.report import format_table, to_jsonable, write_report, write_report_md, write_summary

__all__ = [
    "compare_at_equal_budget",
    "format_table",
    "headline_ks",
    "mean_passk_curve",
    "metric_at_budget",
    "metric_vs_tokens",
    "passk_report",
    "plot_passk",
    "plot_passk_curves",
    "plot_regimes",
    "plot_training_curves",
    "read_metrics_jsonl",
    "to_jsonable",
    "write_report",
    "write_report_md",
    "write_summary",
]
