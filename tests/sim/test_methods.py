"""jaxrl_vr.sim PBA as the trainer runs it: finite calibration, trainer band and λ, budget."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_vr.sim import engine, methods, population as pop_lib
from jaxrl_vr.sim.config import SimConfig, validate

TINY = SimConfig(num_prompts=64, feature_dim=4, steps=6, log_every=3, batch_prompts=8,
                 group_size=4, num_seeds=2, num_tracked=4, progress=False, plots=False)


def test_trainer_kind_uses_the_trainer_defaults():
    from jaxrl_vr.train.methods import AnchorSettings

    trainer, cfg = AnchorSettings(), SimConfig()
    assert (cfg.pba_trainer_coef, cfg.pba_trainer_tau_low, cfg.pba_trainer_tau_high,
            cfg.pba_calibration_samples, cfg.pba_polarity) == (
        trainer.weight, trainer.tau_low, trainer.tau_high, trainer.calibration_samples,
        trainer.polarity)


def test_trainer_anchor_weights_by_hand():
    # n = 64, band [0.03, 0.6], λ = 0.1: c/n = 0, 1/64, 2/64, 3/64, 38/64, 39/64, 1.
    successes = jnp.array([0, 1, 2, 3, 38, 39, 64], jnp.float32)
    p_base = jnp.full(successes.shape, 0.3, jnp.float32)  # the trainer kind never reads it
    got = methods.anchor_weights("trainer", p_base, successes, SimConfig())
    np.testing.assert_allclose(got, [0.0, 0.0, 0.1, 0.1, 0.1, 0.0, 0.0])
    # The oracle reads only the exact p_base with its own band [0, 0.1] and λ = 1.
    oracle = methods.anchor_weights("oracle", jnp.array([0.0, 0.1, 0.1001, 0.5]), None,
                                    SimConfig())
    np.testing.assert_allclose(oracle, [1.0, 1.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="kind"):
        methods.anchor_weights("exact", p_base, successes, SimConfig())


def test_calibration_counts_are_binomial():
    p = jnp.array([0.0, 1.0, 0.25], jnp.float32)
    counts = np.stack([np.asarray(methods.calibration_successes(jax.random.key(s), p, 8))
                       for s in range(400)])
    assert (counts[:, 0] == 0).all() and (counts[:, 1] == 8).all()
    assert set(np.unique(counts[:, 2])) <= set(range(9))
    assert abs(counts[:, 2].mean() - 2.0) < 0.3  # E c = n·p = 2 (s.e. ≈ 0.06)
    assert abs(counts[:, 2].var() - 1.5) < 0.4  # Var c = n·p·(1 − p) = 1.5


def test_trainer_weights_reduce_to_the_oracle_as_n_grows():
    """With the oracle's band and λ, the estimated anchors converge to the exact ones."""
    population = pop_lib.make_population(jax.random.key(3), SimConfig(num_prompts=4000).population)
    p = np.asarray(population.p_base_p, np.float64)
    cfg0 = dataclasses.replace(SimConfig(), pba_trainer_coef=0.5, pba_trainer_tau_low=0.02,
                               pba_trainer_tau_high=0.3, pba_coef=0.5, pba_tau_low=0.02,
                               pba_tau_high=0.3)
    oracle = np.asarray(methods.anchor_weights("oracle", population.p_base_p, None, cfg0))
    mismatches = []
    for n in (16, 256, 4096, 1 << 16, 1 << 22):
        cfg = dataclasses.replace(cfg0, pba_calibration_samples=n)
        counts = methods.calibration_successes(jax.random.key(n), population.p_base_p, n)
        p_hat = np.asarray(counts, np.float64) / n
        bound = 6.0 * np.sqrt(p * (1 - p) / n) + 2.0 / n
        assert (np.abs(p_hat - p) <= bound).all()
        trainer = np.asarray(methods.anchor_weights("trainer", population.p_base_p, counts, cfg))
        far = (np.abs(p - 0.02) > bound) & (np.abs(p - 0.3) > bound)
        np.testing.assert_array_equal(trainer[far], oracle[far])
        mismatches.append(int((trainer != oracle).sum()))
    assert mismatches[0] > 40 and mismatches[-1] <= 2, mismatches
    assert all(a >= b for a, b in zip(mismatches, mismatches[1:])), mismatches


def _steps(cfg, method, num):
    spec = methods.parse_method(method)
    state = engine.init_state(jax.random.key(0), cfg, spec)
    step = jax.jit(functools.partial(engine.train_step, cfg=cfg, spec=spec))
    states = [state]
    for _ in range(num):
        states.append(step(states[-1])[0])
    return states


def test_pba_trainer_run_equals_the_oracle_run_with_its_band_and_a_huge_calibration():
    cfg = dataclasses.replace(TINY, pba_trainer_coef=TINY.pba_coef,
                              pba_trainer_tau_low=TINY.pba_tau_low,
                              pba_trainer_tau_high=TINY.pba_tau_high,
                              pba_calibration_samples=1 << 24)
    trainer = _steps(cfg, "pba_trainer", 3)
    oracle = _steps(cfg, "pba_oracle", 3)
    np.testing.assert_array_equal(trainer[0].anchor_weight_p, oracle[0].anchor_weight_p)
    assert 0 < int((np.asarray(oracle[0].anchor_weight_p) > 0).sum()) < cfg.num_prompts
    jax.tree.map(np.testing.assert_array_equal, trainer[-1].params, oracle[-1].params)
    # With the trainer's own band and n = 64 the anchors (and so the runs) differ.
    default = _steps(dataclasses.replace(TINY), "pba_trainer", 0)[0]
    assert not np.array_equal(default.anchor_weight_p, oracle[0].anchor_weight_p)


def test_budget_stops_learning_and_charged_calibration_counts():
    per_step = TINY.batch_prompts * TINY.group_size
    cfg = dataclasses.replace(TINY, sample_budget=int(2.5 * per_step))
    states = _steps(cfg, "grpo", 5)
    assert [int(s.updates) for s in states] == [0, 1, 2, 3, 3, 3]
    assert int(states[-1].step) == 5 and float(states[-1].samples) == 3 * per_step
    jax.tree.map(np.testing.assert_array_equal, states[3].params, states[5].params)
    assert not np.array_equal(states[2].params.private_pm, states[3].params.private_pm)
    # Charged PBA calibration: P·n rollouts before the first step, so fewer updates.
    n = 4
    charged = dataclasses.replace(cfg, pba_calibration_samples=n, pba_charge_calibration=True,
                                  sample_budget=TINY.num_prompts * n + int(1.5 * per_step))
    states = _steps(charged, "pba_trainer", 4)
    assert float(states[0].samples) == TINY.num_prompts * n
    assert [int(s.updates) for s in states] == [0, 1, 2, 2, 2]
    uncharged = _steps(dataclasses.replace(charged, pba_charge_calibration=False), "pba_trainer", 0)
    assert float(uncharged[0].samples) == 0.0
    with pytest.raises(ValueError, match="sample_budget"):
        validate(dataclasses.replace(TINY, sample_budget=-1))


def test_parse_pba_kinds():
    assert methods.parse_method("pba_trainer") == methods.MethodSpec("grpo", "uniform", True,
                                                                     "trainer")
    assert methods.parse_method("pba_oracle") == methods.parse_method("pba") == methods.MethodSpec(
        "grpo", "uniform", True, "oracle")
    assert methods.parse_method("maxrl+pba_trainer").estimator == "maxrl"
    with pytest.raises(ValueError, match="repeated"):
        methods.parse_method("pba+pba_trainer")
