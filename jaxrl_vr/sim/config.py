"""The simulator's configuration: one frozen dataclass, one default per value.

``experiments/configs/sim.py`` mirrors these fields under the ``sim`` key (with a
comment each); ``SimConfig.from_dict`` rejects unknown keys by name and
``validate`` checks cross-field constraints before any work starts.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from jaxrl_vr.sim.population import PRIVATE_COUPLINGS, PopulationSpec


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """Every knob of a simulation (hashable: closed over by jit)."""

    # population (see jaxrl_vr.sim.population)
    num_prompts: int = 10_000
    num_modes: int = 4
    num_correct: int = 1
    feature_dim: int = 32
    num_strategies: int = 8
    strategy_weight: float = 0.5
    strategy_zipf: float = 1.0
    sharing: float = 0.9
    private_gain: float = 256.0
    private_coupling: str = "coupled"
    mixture_weights: tuple = (0.15, 0.30, 0.30, 0.25)
    beta_a: tuple = (0.6, 1.5, 2.0, 6.0)
    beta_b: tuple = (600.0, 60.0, 4.0, 1.5)
    p_floor: float = 1e-7
    regime_n: int = 256
    # training
    methods: str = "grpo,maxrl,curverl,pba,pairing"
    steps: int = 1000
    batch_prompts: int = 256
    group_size: int = 8
    num_seeds: int = 8
    seed: int = 0
    optimizer: str = "sgd"
    learning_rate: float = 1.0
    # estimators
    curverl_window: int = 10
    maxrl_eps: float = 1e-6
    passk_k: int = 4
    # PBA anchored KL
    pba_coef: float = 1.0
    pba_tau_low: float = 0.0
    pba_tau_high: float = 0.1
    pba_polarity: str = "above"
    pba_kl: str = "k3"
    # PBA as the trainer does it (method token "pba_trainer"): the defaults are
    # jaxrl_vr.train.methods.AnchorSettings' (a test checks they agree)
    pba_trainer_coef: float = 0.1
    pba_trainer_tau_low: float = 0.03
    pba_trainer_tau_high: float = 0.6
    pba_calibration_samples: int = 64
    pba_charge_calibration: bool = False
    # selection
    dynamic_rounds: int = 3
    two_stage_probe: int = 4
    two_stage_lo: float = 0.0
    two_stage_hi: float = 0.75
    pairing_neg_c: int = 2
    pairing_pos_max: float = 0.25
    pairing_pos_min: float = 0.0
    pairing_min_count: int = 4
    pairing_neg_weight: float = 1.0
    pairing_scope: str = "group"
    calibration_samples: int = 8
    tracker_decay: float = 1.0
    # budget
    sample_budget: int = 0
    # reporting
    log_every: int = 10
    num_tracked: int = 32
    progress: bool = True
    plots: bool = True

    @classmethod
    def from_dict(cls, tree: Mapping[str, Any]) -> "SimConfig":
        """Builds a config from a (ConfigDict.to_dict()) mapping; unknown keys raise."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(tree) - names)
        if unknown:
            raise KeyError(
                f"unknown simulator config key(s) {', '.join('sim.' + k for k in unknown)}; "
                f"valid keys: {', '.join(sorted(names))}.")
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in tree.items()}
        return cls(**values)

    @property
    def population(self) -> PopulationSpec:
        return PopulationSpec(
            num_prompts=self.num_prompts, num_modes=self.num_modes,
            num_correct=self.num_correct, feature_dim=self.feature_dim,
            num_strategies=self.num_strategies, strategy_weight=self.strategy_weight,
            strategy_zipf=self.strategy_zipf, mixture_weights=tuple(self.mixture_weights),
            beta_a=tuple(self.beta_a), beta_b=tuple(self.beta_b), p_floor=self.p_floor,
            regime_n=self.regime_n)

    @property
    def method_names(self) -> tuple[str, ...]:
        return tuple(name.strip() for name in self.methods.split(",") if name.strip())


def validate(cfg: SimConfig) -> None:
    """Cross-field checks with messages naming the key and the fix."""
    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ValueError(msg)

    need(cfg.num_prompts >= 2, f"sim.num_prompts must be >= 2, got {cfg.num_prompts}.")
    need(1 <= cfg.num_correct < cfg.num_modes,
         f"need 1 <= sim.num_correct < sim.num_modes, got {cfg.num_correct}, {cfg.num_modes}.")
    need(0.0 <= cfg.sharing <= 1.0, f"sim.sharing must lie in [0, 1], got {cfg.sharing}.")
    need(cfg.private_gain > 0.0, f"sim.private_gain must be > 0, got {cfg.private_gain}.")
    need(cfg.private_coupling in PRIVATE_COUPLINGS,
         f"sim.private_coupling must be one of {PRIVATE_COUPLINGS}, got {cfg.private_coupling!r}.")
    need(0.0 <= cfg.strategy_weight <= 1.0,
         f"sim.strategy_weight must lie in [0, 1], got {cfg.strategy_weight}.")
    need(len(cfg.mixture_weights) == len(cfg.beta_a) == len(cfg.beta_b) >= 1,
         "sim.mixture_weights, sim.beta_a and sim.beta_b need the same (non-zero) length.")
    need(cfg.steps >= 1 and cfg.log_every >= 1 and cfg.steps % cfg.log_every == 0,
         f"sim.steps ({cfg.steps}) must be a positive multiple of sim.log_every "
         f"({cfg.log_every}).")
    need(2 <= cfg.batch_prompts <= cfg.num_prompts and cfg.batch_prompts % 2 == 0,
         f"sim.batch_prompts must be even and in [2, sim.num_prompts], got {cfg.batch_prompts}.")
    need(cfg.group_size >= 2, f"sim.group_size must be >= 2, got {cfg.group_size}.")
    need(cfg.num_seeds >= 1, f"sim.num_seeds must be >= 1, got {cfg.num_seeds}.")
    need(cfg.optimizer in ("sgd", "adam"),
         f"sim.optimizer must be 'sgd' or 'adam', got {cfg.optimizer!r}.")
    need(cfg.pba_kl in ("k1", "k2", "k3", "exact"),
         f"sim.pba_kl must be k1, k2, k3 or exact, got {cfg.pba_kl!r}.")
    need(cfg.pba_polarity in ("above", "below"),
         f"sim.pba_polarity must be 'above' or 'below', got {cfg.pba_polarity!r}.")
    need(0.0 <= cfg.pba_tau_low <= cfg.pba_tau_high <= 1.0,
         f"need 0 <= sim.pba_tau_low <= sim.pba_tau_high <= 1, got {cfg.pba_tau_low}, "
         f"{cfg.pba_tau_high}.")
    need(0.0 <= cfg.pba_trainer_tau_low <= cfg.pba_trainer_tau_high <= 1.0,
         f"need 0 <= sim.pba_trainer_tau_low <= sim.pba_trainer_tau_high <= 1, got "
         f"{cfg.pba_trainer_tau_low}, {cfg.pba_trainer_tau_high}.")
    need(cfg.pba_trainer_coef > 0.0, f"sim.pba_trainer_coef must be > 0, got {cfg.pba_trainer_coef}.")
    need(cfg.pba_calibration_samples >= 1,
         f"sim.pba_calibration_samples must be >= 1, got {cfg.pba_calibration_samples}.")
    need(cfg.sample_budget >= 0, f"sim.sample_budget must be >= 0 (0 = none), got {cfg.sample_budget}.")
    need(cfg.dynamic_rounds >= 1, f"sim.dynamic_rounds must be >= 1, got {cfg.dynamic_rounds}.")
    need(1 <= cfg.two_stage_probe <= cfg.group_size,
         f"need 1 <= sim.two_stage_probe <= sim.group_size, got {cfg.two_stage_probe}.")
    need(0.0 <= cfg.two_stage_lo <= cfg.two_stage_hi <= 1.0,
         "need 0 <= sim.two_stage_lo <= sim.two_stage_hi <= 1.")
    need(1 <= cfg.pairing_neg_c <= cfg.group_size,
         f"sim.pairing_neg_c must be in [1, group_size], got {cfg.pairing_neg_c}.")
    need(0.0 <= cfg.pairing_pos_min < cfg.pairing_pos_max <= 1.0,
         "need 0 <= sim.pairing_pos_min < sim.pairing_pos_max <= 1.")
    need(cfg.pairing_scope in ("pair", "group", "mean"),
         f"sim.pairing_scope must be pair, group or mean, got {cfg.pairing_scope!r}.")
    need(cfg.pairing_neg_weight >= 0.0, "sim.pairing_neg_weight must be >= 0.")
    need(0.0 < cfg.tracker_decay <= 1.0, "sim.tracker_decay must lie in (0, 1].")
    need(cfg.calibration_samples >= 0, "sim.calibration_samples must be >= 0.")
    need(cfg.num_tracked >= 0, "sim.num_tracked must be >= 0.")
    need(len(cfg.method_names) >= 1, "sim.methods is empty; e.g. --config.sim.methods=grpo,pba.")
    from jaxrl_vr.sim.methods import parse_method  # local: methods imports this module

    for name in cfg.method_names:
        estimator = parse_method(name).estimator
        need(estimator not in ("pkpo", "passk_training") or 1 <= cfg.passk_k <= cfg.group_size,
             f"sim.passk_k={cfg.passk_k} must lie in [1, sim.group_size={cfg.group_size}] for {name!r}.")
        need(estimator != "passk_training" or cfg.passk_k < cfg.group_size,
             f"sim.passk_k={cfg.passk_k} = sim.group_size makes every passk_training advantage 0; "
             "lower it.")
