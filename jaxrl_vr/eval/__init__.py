"""Evaluation: pass@k curves per regime, chance baselines, reports and plots (SPEC §6)."""

from jaxrl_vr.eval.budget import compare_at_equal_budget, metric_at_budget, metric_vs_tokens
from jaxrl_vr.eval.chunks import ChunkStore, fingerprint_digest
from jaxrl_vr.eval.evaluation import (
    DEFINITIONS,
    REGIME_N,
    PolicyResult,
    build_evaluation,
    evaluation_markdown,
    write_evaluation,
)
from jaxrl_vr.eval.inversion import (
    InversionCounts,
    fit_beta_prior,
    inversion_counts,
    survival_posterior,
    inversion_report,
    poisson_binomial_pmf,
    exact_two_sided_p,
    survival_estimate,
)
from jaxrl_vr.eval.passk_eval import headline_ks, mean_passk_curve, passk_report, passk_scalars
from jaxrl_vr.eval.plots import (
    plot_bars,
    plot_budget_curves,
    plot_delta_by_regime,
    plot_passk,
    plot_passk_curves,
    plot_prompt_scatter,
    plot_regimes,
    plot_tradeoff,
    plot_training_curves,
    plot_training_path,
    read_metrics_jsonl,
)
from jaxrl_vr.eval.training_path import training_path
from jaxrl_vr.eval.report import format_table, to_jsonable, write_report, write_report_md, write_summary
from jaxrl_vr.eval.seeds import PairedDifference, SeedSummary, paired_difference, seed_summary

__all__ = [
    "ChunkStore",
    "DEFINITIONS",
    "InversionCounts",
    "PairedDifference",
    "PolicyResult",
    "REGIME_N",
    "SeedSummary",
    "build_evaluation",
    "compare_at_equal_budget",
    "evaluation_markdown",
    "fingerprint_digest",
    "fit_beta_prior",
    "format_table",
    "headline_ks",
    "inversion_counts",
    "inversion_report",
    "mean_passk_curve",
    "metric_at_budget",
    "metric_vs_tokens",
    "paired_difference",
    "passk_report",
    "passk_scalars",
    "plot_bars",
    "plot_delta_by_regime",
    "plot_passk",
    "plot_budget_curves",
    "plot_passk_curves",
    "plot_prompt_scatter",
    "plot_regimes",
    "plot_tradeoff",
    "plot_training_curves",
    "plot_training_path",
    "poisson_binomial_pmf",
    "exact_two_sided_p",
    "read_metrics_jsonl",
    "seed_summary",
    "survival_estimate",
    "survival_posterior",
    "to_jsonable",
    "training_path",
    "write_evaluation",
    "write_report",
    "write_report_md",
    "write_summary",
]
