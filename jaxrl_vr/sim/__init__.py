"""Population simulator of RLVR (issue 13): prompt-distribution methods at scale, exact pass@k.

A log-linear policy over a few answer modes per prompt, with parameters shared across
prompts, trained by the same advantage, selection and KL functions the trainer uses.
See docs/simulator.md for the model and its formulas.
"""

from jaxrl_vr.sim.config import SimConfig, validate
from jaxrl_vr.sim.engine import (
    HEADLINE_KS,
    REGIME_ROWS,
    Metrics,
    SimRun,
    SimState,
    StepStats,
    init_state,
    logits,
    measure,
    policy_loss,
    run_chunk,
    sample_modes,
    simulate,
    train_step,
)
from jaxrl_vr.sim.methods import (
    ESTIMATORS,
    PBA_KINDS,
    SELECTIONS,
    Batch,
    MethodSpec,
    Tracker,
    anchor_weights,
    calibration_successes,
    pairing_pools,
    parse_method,
)
from jaxrl_vr.sim.population import (
    PRIVATE_COUPLINGS,
    PolicyParams,
    Population,
    PopulationSpec,
    exact_pass_at_k,
    init_params,
    make_population,
    mode_entropy,
    pass_rate,
    policy_logits,
)
from jaxrl_vr.sim.report import study_table, summarize, write_json, write_plots
from jaxrl_vr.sim.run import simulate_methods

__all__ = [
    "ESTIMATORS", "HEADLINE_KS", "PBA_KINDS", "PRIVATE_COUPLINGS", "REGIME_ROWS", "SELECTIONS",
    "Batch", "MethodSpec", "Metrics", "PolicyParams", "Population", "PopulationSpec", "SimConfig",
    "SimRun", "SimState", "StepStats", "Tracker", "anchor_weights", "calibration_successes",
    "exact_pass_at_k", "init_params", "init_state", "logits", "make_population", "measure", "mode_entropy", "pairing_pools", "parse_method", "pass_rate", "policy_logits",
    "policy_loss", "run_chunk", "sample_modes", "simulate", "simulate_methods", "study_table",
    "summarize", "train_step", "validate", "write_json", "write_plots",
]
