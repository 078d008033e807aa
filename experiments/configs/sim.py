"""Population simulator of RLVR (jaxrl_vr.sim; docs/simulator.md).

    python -m experiments.simulate --config=experiments/configs/sim.py --workdir=runs/sim
    python -m experiments.simulate --config=experiments/configs/sim.py:smoke --workdir=/tmp/s
    ... --config.sim.methods=grpo,pba --config.sim.group_size=16 --config.sim.sharing=1.0

Variants (the text after ":"): "" (10,000 prompts, 1,000 steps, 8 seeds, five methods)
and "smoke" (seconds; used by tests). Every field is listed here with one comment; the
values and their meaning are those of ``jaxrl_vr.sim.SimConfig``. An override of an
unknown key fails at once with the key's name.
"""

from __future__ import annotations

import ml_collections

from jaxrl_vr.sim.config import SimConfig

VARIANTS = ("", "default", "smoke")


def get_config(variant: str | None = None) -> ml_collections.ConfigDict:
    variant = (variant or "").strip()
    if variant not in VARIANTS:
        raise ValueError(
            f"unknown config variant {variant!r}; choose one of {VARIANTS[1:]} "
            "(e.g. --config=experiments/configs/sim.py:smoke).")
    d = SimConfig()  # the single source of the defaults
    c = ml_collections.ConfigDict()
    s = c.sim = ml_collections.ConfigDict()

    # --- population: P prompts, M modes each, log-linear policy over shared + private params
    s.num_prompts = d.num_prompts  # P
    s.num_modes = d.num_modes  # M answer modes per prompt
    s.num_correct = d.num_correct  # C correct modes per prompt (1 <= C < M)
    s.feature_dim = d.feature_dim  # D, width of the shared parameter θ and of the features φ
    s.num_strategies = d.num_strategies  # S strategy directions shared by all prompts
    s.strategy_weight = d.strategy_weight  # β: weight of a mode's strategy direction in φ
    s.strategy_zipf = d.strategy_zipf  # a: correct-mode strategies follow q_s ∝ s^-a (0 = uniform)
    s.sharing = d.sharing  # ρ in [0, 1]: weight of the shared path in the kernel (0 = tabular)
    s.private_gain = d.private_gain  # κ: weight of a prompt's own (private) path (≈ batch_prompts)
    # coupled: private kernel weight (1-ρ)·κ, so ρ also shrinks the private step (the original
    # model); fixed: κ alone, so ρ changes only the shared step (fixed with κ = (1-ρ0)·κ0 has
    # the kernel of coupled at ρ0, κ0)
    s.private_coupling = d.private_coupling
    s.mixture_weights = d.mixture_weights  # p_base mixture: component weights
    s.beta_a = d.beta_a  # ... Kumaraswamy a of each component (a Beta-like law on [0, 1])
    s.beta_b = d.beta_b  # ... Kumaraswamy b of each component
    s.p_floor = d.p_floor  # p_base is clipped to [p_floor, 1 - p_floor]
    s.regime_n = d.regime_n  # n of passk.regime (regimes and "lost" use reach at n samples)

    # --- training
    s.methods = d.methods  # comma-separated method names; tokens joined by "+" (see below)
    # estimators (jaxrl_vr.estimators): grpo dr_grpo loo maxrl curverl reinforce pair_weighted
    # pkpo passk_training;
    # selections: uniform dapo (dynamic) two_stage pairing; regulariser: pba_trainer (PBA as
    # the trainer runs it) or pba = pba_oracle (exact p_base, its own band and λ: an oracle).
    # e.g. "grpo,maxrl,curverl,pba,pairing,dapo,two_stage,curverl+pba"
    s.steps = d.steps  # training steps (one batch and one optimizer update each)
    s.batch_prompts = d.batch_prompts  # Pb prompts per batch (even: pairing uses Pb/2 pairs)
    s.group_size = d.group_size  # G rollouts per prompt
    s.num_seeds = d.num_seeds  # seeds, vmapped; seed s draws its own population and rollouts
    s.seed = d.seed  # base seed (seed s uses split(key(seed), num_seeds)[s]); same for all methods
    s.optimizer = d.optimizer  # sgd | adam
    s.learning_rate = d.learning_rate  # optimizer step size (the default is tuned for sgd)

    # --- estimators (jaxrl_vr.advantages)
    s.curverl_window = d.curverl_window  # t0: CurveRL's lagged reference window (batches)
    s.maxrl_eps = d.maxrl_eps  # eps of MaxRL's (R - mean)/(mean + eps)
    s.passk_k = d.passk_k  # k of the pass@k objectives pkpo and passk_training (<= group_size)

    # --- PBA anchored KL (selection.anchor; kl.estimate)
    # the oracle (method token pba / pba_oracle): exact p_base, no calibration cost
    s.pba_coef = d.pba_coef  # λ of the oracle's anchored KL (its own value, not a global β)
    s.pba_tau_low = d.pba_tau_low  # oracle's anchor band on the exact p_base, inclusive
    s.pba_tau_high = d.pba_tau_high  # ... (default [0, 0.1]: out-of-reach and boundary prompts)
    s.pba_polarity = d.pba_polarity  # above (anchor inside the band) | below (outside it); both kinds
    s.pba_kl = d.pba_kl  # k1 | k2 | k3 on the sampled mode, or exact (Σ_m π log π/π0); both kinds
    # as the trainer does it (method token pba_trainer; defaults = train.methods.AnchorSettings)
    s.pba_trainer_coef = d.pba_trainer_coef  # λ (rl.anchor.weight)
    s.pba_trainer_tau_low = d.pba_trainer_tau_low  # band on p̂ = c/n, inclusive (rl.anchor.tau_low)
    s.pba_trainer_tau_high = d.pba_trainer_tau_high  # ... (rl.anchor.tau_high)
    s.pba_calibration_samples = d.pba_calibration_samples  # n base rollouts per prompt for p̂
    s.pba_charge_calibration = d.pba_charge_calibration  # the P·n rollouts count against the budget

    # --- selection (jaxrl_vr.selection)
    s.dynamic_rounds = d.dynamic_rounds  # DAPO: at most this many generation rounds per batch
    s.two_stage_probe = d.two_stage_probe  # G_probe rollouts of the probe (<= group_size)
    s.two_stage_lo = d.two_stage_lo  # continue to G iff lo <= probe pass rate <= hi
    s.two_stage_hi = d.two_stage_hi
    s.pairing_neg_c = d.pairing_neg_c  # c of the q- band [1 - c/G, 1 - 1/G]
    s.pairing_pos_max = d.pairing_pos_max  # q+ band (pos_min, pos_max] on the tracked rate
    s.pairing_pos_min = d.pairing_pos_min
    s.pairing_min_count = d.pairing_min_count  # tracked rollouts a prompt needs to enter a pool
    s.pairing_neg_weight = d.pairing_neg_weight  # λ_neg of advantages.pair_weighted
    s.pairing_scope = d.pairing_scope  # group | pair | mean (advantages.pair_weighted scope)
    s.calibration_samples = d.calibration_samples  # base rollouts per prompt seeding the tracker
    s.tracker_decay = d.tracker_decay  # per-step decay of tracked counts (1 = all history)

    # --- budget
    s.sample_budget = d.sample_budget  # rollouts after which a run stops learning (0 = none)

    # --- reporting
    s.log_every = d.log_every  # steps between exact measurements (steps must be a multiple)
    s.num_tracked = d.num_tracked  # prompts whose p(x) trajectory is recorded (spread over regimes)
    s.progress = d.progress  # tqdm progress bar
    s.plots = d.plots  # write the PNG plots next to simulation.json

    if variant == "smoke":
        s.num_prompts = 400
        s.steps = 20
        s.batch_prompts = 32
        s.num_seeds = 2
        s.log_every = 5
        s.num_tracked = 8
        s.progress = False
    c.lock()
    return c
