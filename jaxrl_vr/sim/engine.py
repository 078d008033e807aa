"""The simulator's step, measurement and driver (jitted, vmapped over seeds).

One training step: a selection rule draws a batch of prompts and samples G modes per
prompt from the current policy (categorical over softmax(z_x)); rewards are 1 for a
correct mode; an estimator from ``jaxrl_vr.advantages`` turns them into advantages; the
loss is the score-function policy gradient

    L(θ, ψ) = −(1/N) Σ_b sg(A_b) · log π(m_b | x_b)
              [+ (1/N) Σ_b λ·1[anchor(x_b)] · KL_b]          (PBA)

over the N valid rollouts of the batch (non-anchored rollouts add 0 to the numerator
and count in N), and optax updates θ and ψ. PBA's weight λ·1[anchor(x)] is frozen at
init (``methods.anchor_weights``: the trainer's band and λ on p̂ = c/n from a finite base
calibration for ``pba_trainer``, the exact base pass rate for the ``pba`` oracle) and
KL_b is ``kl.estimate`` (k3 by default) of the sampled mode against the frozen base, or
the exact KL over modes (``pba_kl="exact"``).

With ``sample_budget`` > 0 a step whose run has already generated that many rollouts
(charged calibration included) changes nothing: the run stops learning at an equal
budget, as the trainer's ``rl.budget`` stops it (the step that crosses it still counts).

A measurement evaluates the exact p(x) of every prompt (``population.pass_rate``), so
pass@k = 1 − (1 − p)^k is exact for every k.
"""

from __future__ import annotations

import functools
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_vr import kl, passk
from jaxrl_vr.sim import methods as methods_lib
from jaxrl_vr.sim import population as pop_lib
from jaxrl_vr.sim.config import SimConfig, validate

NUM_REGIMES = len(passk.REGIMES)
# Rows of per-regime metrics: the four regimes, then all prompts.
REGIME_ROWS = tuple(passk.REGIMES) + ("overall",)
# k values tracked over training (the full k = 1..256 curve is computed at the end).
HEADLINE_KS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class SimState(NamedTuple):
    """Everything a run carries from step to step (one seed)."""

    population: pop_lib.Population
    params: pop_lib.PolicyParams
    opt_state: Any
    estimator_state: Any
    tracker: methods_lib.Tracker
    key: jax.Array
    tracked_idx_n: jnp.ndarray  # int32 [num_tracked]: prompts whose p(x) is recorded
    anchor_weight_p: jnp.ndarray  # float32 [P]: PBA's frozen λ·1[anchor(x)] (0 without PBA)
    samples: jnp.ndarray  # float32 []: rollouts generated so far (+ charged calibration)
    updates: jnp.ndarray  # int32 []: optimizer updates applied (< step once over budget)
    step: jnp.ndarray  # int32 []


class StepStats(NamedTuple):
    """Per-step batch diagnostics (averaged over a chunk by the driver)."""

    reward: jnp.ndarray  # mean reward of valid rollouts
    informative: jnp.ndarray  # fraction of batch groups with a non-zero advantage
    paired: jnp.ndarray  # 1 if the batch was made of (q+, q-) pairs
    loss: jnp.ndarray


class Metrics(NamedTuple):
    """Exact population metrics at one point of training (one seed)."""

    passk_rk: jnp.ndarray  # float32 [R+1, K]: mean exact pass@k, HEADLINE_KS, per regime row
    lost_r: jnp.ndarray  # float32 [R+1]: base-solvable prompts now out of reach (regime n)
    declined_r: jnp.ndarray  # float32 [R+1]: prompts with p(x) < p_base(x)
    entropy_r: jnp.ndarray  # float32 [R+1]: mean entropy over modes (nats)
    kl_r: jnp.ndarray  # float32 [R+1]: mean exact KL(π‖π₀) over modes
    p_tracked_n: jnp.ndarray  # float32 [num_tracked]
    samples: jnp.ndarray  # float32 []: rollouts generated so far
    updates: jnp.ndarray  # float32 []: optimizer updates applied so far


def make_optimizer(cfg: SimConfig) -> optax.GradientTransformation:
    """optax SGD or Adam with the configured learning rate."""
    if cfg.optimizer == "sgd":
        return optax.sgd(cfg.learning_rate)
    return optax.adam(cfg.learning_rate)


def logits(params: pop_lib.PolicyParams, population: pop_lib.Population, cfg: SimConfig,
           prompt_idx: jnp.ndarray | None = None) -> jnp.ndarray:
    """``population.policy_logits`` with the config's ρ, κ and private coupling."""
    return pop_lib.policy_logits(params, population, prompt_idx, sharing=cfg.sharing,
                                 private_gain=cfg.private_gain,
                                 private_coupling=cfg.private_coupling)


def sample_modes(key: jax.Array, params: pop_lib.PolicyParams, population: pop_lib.Population,
                 prompt_idx_n: jnp.ndarray, num_samples: int, *, sharing: float,
                 private_gain: float = 1.0, private_coupling: str = "coupled"):
    """G modes per prompt from the current policy and their 0/1 rewards.

    Returns:
      (modes_ng int32 [N, G], rewards_ng float32 [N, G]).
    """
    logits_nm = pop_lib.policy_logits(params, population, prompt_idx_n, sharing=sharing,
                                      private_gain=private_gain,
                                      private_coupling=private_coupling)
    num_n = prompt_idx_n.shape[0]
    modes_ng = jax.random.categorical(key, logits_nm[:, None, :], shape=(num_n, num_samples))
    correct_nm = population.correct_pm[prompt_idx_n]
    rewards_ng = jnp.take_along_axis(correct_nm, modes_ng, axis=1).astype(jnp.float32)
    return modes_ng.astype(jnp.int32), rewards_ng


def policy_loss(params: pop_lib.PolicyParams, population: pop_lib.Population,
                batch: methods_lib.Batch, adv_pg: jnp.ndarray, cfg: SimConfig,
                pba: bool, anchor_weight_p: jnp.ndarray | None = None) -> jnp.ndarray:
    """Score-function policy-gradient loss (+ PBA's anchored KL) over a batch; see module doc.

    ``anchor_weight_p`` (float32 [P], λ·1[anchor]) is PBA's frozen weight of every prompt;
    None = the oracle's weight of the exact p_base (``methods.anchor_weights("oracle")``).
    """
    idx_p = batch.prompt_idx_p
    logits_pm = logits(params, population, cfg, idx_p)
    logp_pm = jax.nn.log_softmax(logits_pm, axis=-1)
    logp_pg = jnp.take_along_axis(logp_pm, batch.modes_pg, axis=1)
    valid_pg = batch.valid_pg
    count = jnp.maximum(jnp.sum(valid_pg), 1).astype(jnp.float32)
    adv_pg = jax.lax.stop_gradient(adv_pg)
    loss = -jnp.sum(jnp.where(valid_pg, adv_pg * logp_pg, 0.0)) / count
    if pba:
        if anchor_weight_p is None:
            anchor_weight_p = methods_lib.anchor_weights("oracle", population.p_base_p, None, cfg)
        weight_p = anchor_weight_p[idx_p]
        base_logits_pm = population.base_logits_pm[idx_p]
        if cfg.pba_kl == "exact":
            kl_p = pop_lib.kl_to_base(logits_pm, base_logits_pm)
            kl_pg = jnp.broadcast_to(kl_p[:, None], valid_pg.shape)
        else:
            base_logp_pg = jnp.take_along_axis(
                jax.nn.log_softmax(base_logits_pm, axis=-1), batch.modes_pg, axis=1)
            kl_pg = kl.estimate(logp_pg, base_logp_pg, cfg.pba_kl, mask=valid_pg)
        loss = loss + jnp.sum(jnp.where(valid_pg, weight_p[:, None] * kl_pg, 0.0)) / count
    return loss


def _tracked_prompts(key: jax.Array, regime_p: jnp.ndarray, num_tracked: int) -> jnp.ndarray:
    """num_tracked prompts spread over the regimes (random within each regime)."""
    per_regime = -(-num_tracked // NUM_REGIMES)
    noise_p = jax.random.uniform(key, regime_p.shape)
    picks = [jnp.argsort(noise_p + 2.0 * (regime_p != r))[:per_regime]
             for r in range(NUM_REGIMES)]
    return jnp.concatenate(picks)[:num_tracked].astype(jnp.int32)


def init_state(key: jax.Array, cfg: SimConfig, spec: methods_lib.MethodSpec,
               population: pop_lib.Population | None = None) -> SimState:
    """Population (drawn from the key unless given), base policy, optimizer/estimator
    state, calibrated tracker and PBA's frozen anchor weights."""
    key_pop, key_cal, key_track, key_run = jax.random.split(key, 4)
    if population is None:
        population = pop_lib.make_population(key_pop, cfg.population)
    params = pop_lib.init_params(cfg.population)
    n_cal = cfg.calibration_samples
    draws_pn = jax.random.uniform(key_cal, population.p_base_p.shape + (n_cal,))
    successes_p = jnp.sum(draws_pn < population.p_base_p[:, None], axis=1)
    tracker = methods_lib.Tracker(  # calibration: n_cal base rollouts per prompt
        successes_p=successes_p.astype(jnp.float32),
        counts_p=jnp.full(population.p_base_p.shape, n_cal, jnp.float32))
    anchor_weight_p = jnp.zeros_like(population.p_base_p)
    samples = jnp.zeros((), jnp.float32)
    if spec.pba:
        anchor_successes_p = None
        if spec.pba_kind == "trainer":  # PBA's own base calibration (its own key)
            anchor_successes_p = methods_lib.calibration_successes(
                jax.random.fold_in(key_cal, 1), population.p_base_p, cfg.pba_calibration_samples)
            if cfg.pba_charge_calibration:
                samples = jnp.float32(population.p_base_p.shape[0] * cfg.pba_calibration_samples)
        anchor_weight_p = methods_lib.anchor_weights(spec.pba_kind, population.p_base_p,
                                                     anchor_successes_p, cfg)
    return SimState(
        population=population,
        params=params,
        opt_state=make_optimizer(cfg).init(params),
        estimator_state=methods_lib.make_sim_estimator(spec.estimator, cfg).init(),
        tracker=tracker,
        key=key_run,
        tracked_idx_n=_tracked_prompts(key_track, population.regime_p, cfg.num_tracked),
        anchor_weight_p=anchor_weight_p,
        samples=samples,
        updates=jnp.zeros((), jnp.int32),
        step=jnp.zeros((), jnp.int32),
    )


def _update_tracker(tracker: methods_lib.Tracker, batch: methods_lib.Batch,
                    decay: float) -> methods_lib.Tracker:
    valid_pg = batch.valid_pg.astype(jnp.float32)
    add_counts = jnp.zeros_like(tracker.counts_p).at[batch.prompt_idx_p].add(
        jnp.sum(valid_pg, axis=1))
    add_successes = jnp.zeros_like(tracker.successes_p).at[batch.prompt_idx_p].add(
        jnp.sum(valid_pg * batch.rewards_pg, axis=1))
    return methods_lib.Tracker(successes_p=decay * tracker.successes_p + add_successes,
                               counts_p=decay * tracker.counts_p + add_counts)


def train_step(state: SimState, cfg: SimConfig,
               spec: methods_lib.MethodSpec) -> tuple[SimState, StepStats]:
    """One selection → sampling → advantage → optax update step (pure, jittable)."""
    key, key_select = jax.random.split(state.key)
    sample_fn = functools.partial(sample_modes, params=state.params,
                                  population=state.population, sharing=cfg.sharing,
                                  private_gain=cfg.private_gain,
                                  private_coupling=cfg.private_coupling)
    batch = methods_lib.SELECTIONS[spec.selection](
        key_select, lambda k, idx, g: sample_fn(k, prompt_idx_n=idx, num_samples=g),
        state.tracker, cfg)
    paired_p = jnp.broadcast_to(batch.paired, batch.prompt_idx_p.shape)
    adv_pg, estimator_state = methods_lib.make_sim_estimator(spec.estimator, cfg).update(
        batch.rewards_pg, batch.valid_pg, batch.rewards_pg, state.estimator_state, paired_p=paired_p)
    loss, grads = jax.value_and_grad(policy_loss)(
        state.params, state.population, batch, adv_pg, cfg, spec.pba, state.anchor_weight_p)
    updates, opt_state = make_optimizer(cfg).update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    valid_pg = batch.valid_pg
    stats = StepStats(
        reward=jnp.sum(jnp.where(valid_pg, batch.rewards_pg, 0.0)) / jnp.maximum(
            jnp.sum(valid_pg), 1),
        informative=jnp.mean(jnp.any(adv_pg != 0.0, axis=1).astype(jnp.float32)),
        paired=batch.paired.astype(jnp.float32),
        loss=loss)
    learned = state._replace(
        params=params, opt_state=opt_state, estimator_state=estimator_state,
        tracker=_update_tracker(state.tracker, batch, cfg.tracker_decay),
        samples=state.samples + batch.samples.astype(jnp.float32), updates=state.updates + 1)
    if cfg.sample_budget > 0:  # over budget: keep the old state (key and step still advance)
        within = state.samples < jnp.float32(cfg.sample_budget)
        learned = jax.tree.map(lambda new, old: jnp.where(within, new, old), learned, state)
    return learned._replace(key=key, step=state.step + 1), stats


def _by_regime(values_p: jnp.ndarray, onehot_pr: jnp.ndarray, mean: bool) -> jnp.ndarray:
    sums = jnp.einsum("p...,pr->r...", values_p.astype(jnp.float32), onehot_pr)
    if not mean:
        return sums
    counts_r = jnp.sum(onehot_pr, axis=0)
    counts_r = counts_r.reshape(counts_r.shape + (1,) * (sums.ndim - 1))
    return sums / jnp.maximum(counts_r, 1.0)


def measure(state: SimState, cfg: SimConfig) -> Metrics:
    """Exact population metrics of the current policy (one seed)."""
    population = state.population
    logits_pm = logits(state.params, population, cfg)
    p_p = pop_lib.pass_rate(logits_pm, population.correct_pm)
    onehot_pr = jnp.concatenate(
        [jax.nn.one_hot(population.regime_p, NUM_REGIMES, dtype=jnp.float32),
         jnp.ones((p_p.shape[0], 1), jnp.float32)], axis=1)
    out_of_reach = passk.regime(p_p, n=cfg.regime_n) == passk.OUT_OF_REACH
    lost_p = (population.regime_p != passk.OUT_OF_REACH) & out_of_reach
    return Metrics(
        passk_rk=_by_regime(pop_lib.exact_pass_at_k(p_p, HEADLINE_KS), onehot_pr, True),
        lost_r=_by_regime(lost_p, onehot_pr, False),
        declined_r=_by_regime(p_p < population.p_base_p, onehot_pr, False),
        entropy_r=_by_regime(pop_lib.mode_entropy(logits_pm), onehot_pr, True),
        kl_r=_by_regime(pop_lib.kl_to_base(logits_pm, population.base_logits_pm),
                        onehot_pr, True),
        p_tracked_n=p_p[state.tracked_idx_n],
        samples=state.samples,
        updates=state.updates.astype(jnp.float32),
    )


def run_chunk(state: SimState, cfg: SimConfig, spec: methods_lib.MethodSpec,
              num_steps: int) -> tuple[SimState, Metrics, StepStats]:
    """num_steps training steps (lax.scan), then a measurement; stats are chunk means."""
    state, stats = jax.lax.scan(lambda s, _: train_step(s, cfg, spec), state, None,
                                length=num_steps)
    return state, measure(state, cfg), jax.tree.map(jnp.mean, stats)


def final_pass_rates(state: SimState, cfg: SimConfig) -> jnp.ndarray:
    """Exact p(x) of every prompt under the current policy, float32 [P]."""
    return pop_lib.pass_rate(logits(state.params, state.population, cfg),
                             state.population.correct_pm)


class SimRun(NamedTuple):
    """Host-side (NumPy) record of one method over all seeds."""

    method: str
    spec: methods_lib.MethodSpec
    steps_l: np.ndarray  # int [L]: step of each measurement (0 = base)
    metrics: Metrics  # each field with leading [S, L]
    stats: StepStats  # each field [S, L-1]: chunk means
    p_base_sp: np.ndarray  # [S, P]
    p_final_sp: np.ndarray  # [S, P]
    regime_sp: np.ndarray  # [S, P]
    tracked_idx_sn: np.ndarray  # [S, num_tracked]
    wall_s: float  # wall time of the run, compilation included


def seed_keys(cfg: SimConfig) -> jax.Array:
    """One key per seed, independent of the method (runs of two methods are paired)."""
    return jax.random.split(jax.random.key(cfg.seed), cfg.num_seeds)


def population_key(seed_key: jax.Array) -> jax.Array:
    """The population's key inside a seed's key (as init_state splits it)."""
    return jax.random.split(seed_key, 4)[0]


@functools.lru_cache(maxsize=8)
def _populations_fn(spec: pop_lib.PopulationSpec):
    return jax.jit(jax.vmap(lambda key: pop_lib.make_population(population_key(key), spec)))


def populations(spec: pop_lib.PopulationSpec, keys: jax.Array) -> pop_lib.Population:
    """The seeds' populations (compiled once per PopulationSpec, shared by all methods)."""
    return _populations_fn(spec)(keys)


@functools.lru_cache(maxsize=32)
def compiled(cfg: SimConfig, spec: methods_lib.MethodSpec):
    """(init, measure, chunk, final) jitted and vmapped over seeds, cached per config."""
    init_fn = jax.jit(jax.vmap(functools.partial(init_state, cfg=cfg, spec=spec)))
    init = lambda keys: init_fn(keys, population=populations(cfg.population, keys))  # noqa: E731
    meas = jax.jit(jax.vmap(functools.partial(measure, cfg=cfg)))
    chunk = jax.jit(jax.vmap(functools.partial(run_chunk, cfg=cfg, spec=spec,
                                               num_steps=cfg.log_every)), donate_argnums=0)
    final = jax.jit(jax.vmap(functools.partial(final_pass_rates, cfg=cfg)))
    return init, meas, chunk, final


def simulate(cfg: SimConfig, method: str, *, progress: bool | None = None) -> SimRun:
    """Runs one method for cfg.steps steps on cfg.num_seeds seeds (vmapped).

    Args:
      cfg: SimConfig (validated here).
      method: a method name (see ``methods.parse_method``).
      progress: show a tqdm bar (default cfg.progress).

    Returns:
      SimRun with NumPy arrays.
    """
    validate(cfg)
    spec = methods_lib.parse_method(method)
    init, meas, chunk, final = compiled(cfg, spec)
    start = time.perf_counter()
    state = init(seed_keys(cfg))
    p_base_sp = np.asarray(state.population.p_base_p)
    regime_sp = np.asarray(state.population.regime_p)
    tracked_idx_sn = np.asarray(state.tracked_idx_n)
    records, stats = [jax.device_get(meas(state))], []
    num_chunks = cfg.steps // cfg.log_every
    show = cfg.progress if progress is None else progress
    bar = None
    if show:
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.steps, desc=method, unit="step", leave=False)
    for _ in range(num_chunks):
        state, metrics, chunk_stats = chunk(state)
        records.append(jax.device_get(metrics))
        stats.append(jax.device_get(chunk_stats))
        if bar is not None:
            bar.update(cfg.log_every)
    p_final_sp = np.asarray(final(state))
    wall_s = time.perf_counter() - start
    if bar is not None:
        bar.close()
    stack = lambda items: jax.tree.map(lambda *xs: np.stack(xs, axis=1), *items)  # noqa: E731
    return SimRun(
        method=method, spec=spec,
        steps_l=np.arange(num_chunks + 1) * cfg.log_every,
        metrics=stack(records), stats=stack(stats),
        p_base_sp=p_base_sp, p_final_sp=p_final_sp, regime_sp=regime_sp,
        tracked_idx_sn=tracked_idx_sn, wall_s=wall_s)
