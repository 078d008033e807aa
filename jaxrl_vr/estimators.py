"""Advantage estimators as optax-style ``(init, update)`` pairs, from one registry.

Every estimator has the same two functions, so the RL loop never branches on its name:

    estimator = make_estimator("curverl", num_prompts=P, window=10)
    state = estimator.init()
    adv_pg, state = estimator.update(rewards_pg, valid_pg, success_pg, state, num_pairs=0)

``rewards_pg`` are the shaped rewards (verifier score minus penalties), ``success_pg`` the
verifier's own success in [0, 1] (what pass rates are made of) and ``valid_pg`` marks the
real samples of ragged groups and ``num_pairs`` says that rows [0, 2·num_pairs) are
(q⁺, q⁻) prompt pairs (only Weighted GRPO reads it). Stateless estimators keep an empty state ``()``; CurveRL's
state is its lagged window (SPEC §3.2). The formulas live in ``jaxrl_vr.advantages``; this
module only adapts them to the one signature.

Adding an estimator is one function and one registry line::

    def _my_estimator(*, scale=1.0):
        return stateless(lambda rewards_pg, valid_pg, success_pg: scale * advantages.loo(
            rewards_pg, valid_pg))

    ESTIMATORS["my_estimator"] = _my_estimator
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax.numpy as jnp

from jaxrl_vr import advantages


class Estimator(NamedTuple):
    """``init() -> state``;
    ``update(rewards_pg, valid_pg, success_pg, state, *, num_pairs=0) -> (adv_pg, state)``."""

    init: Callable[[], Any]
    update: Callable[..., tuple[jnp.ndarray, Any]]


def stateless(fn: Callable[[jnp.ndarray, jnp.ndarray, jnp.ndarray], jnp.ndarray]) -> Estimator:
    """An Estimator with empty state around ``fn(rewards_pg, valid_pg, success_pg) -> adv_pg``."""

    def update(rewards_pg, valid_pg, success_pg, state, *, num_pairs=0):
        del num_pairs
        return fn(rewards_pg, valid_pg, success_pg), state

    return Estimator(init=lambda: (), update=update)


def _grpo(*, scale: str = "std") -> Estimator:
    """GRPO (DeepSeekMath, arXiv 2402.03300): (R − R̄)/(std + eps)."""
    return stateless(lambda r, v, s: advantages.grpo(r, v, scale=scale))


def _dr_grpo() -> Estimator:
    """Dr.GRPO (arXiv 2503.20783): GRPO without the std division, R − R̄."""
    return _grpo(scale="none")


def _loo() -> Estimator:
    """RLOO (arXiv 2402.14740): leave-one-out baseline."""
    return stateless(lambda r, v, s: advantages.loo(r, v))


def _reinforce() -> Estimator:
    """REINFORCE with the group-mean baseline (w(p) = 1)."""
    return stateless(lambda r, v, s: advantages.reinforce(r, v))


def _maxrl() -> Estimator:
    """MaxRL (arXiv 2602.02710): the verifier-success part gets (s − s̄)/(s̄ + eps), the
    shaping part (rewards − success) a plain baseline (``advantages.maxrl``)."""
    return stateless(lambda r, v, s: advantages.maxrl(r, v, success_pg=s))


def _curverl(*, num_prompts: int, window: int = 10) -> Estimator:
    """CurveRL (arXiv 2605.24331): lagged-window reverse-hazard prompt weights (SPEC §3.2)."""

    def update(rewards_pg, valid_pg, success_pg, state, *, num_pairs=0):
        del num_pairs
        return advantages.curverl(rewards_pg, state, valid_pg, success_pg=success_pg)

    return Estimator(init=lambda: advantages.curverl_init(num_prompts, window=window), update=update)


def _pair_weighted(*, neg_weight: float = 1.0, pos_weight: float = 1.0, scope: str = "group",
                   success_threshold: float = 0.5) -> Estimator:
    """Weighted GRPO (arXiv 2602.03452): rows [0, 2·num_pairs) are (q⁺, q⁻) pairs laid out
    [q⁺₀, q⁻₀, …] (the pairing source does this) and get ``advantages.pair_weighted`` with
    row weights [pos_weight, neg_weight]; the remaining (unpaired, data-order) rows get the
    same group z-score of the verifier success without a pair weight (``advantages.grpo``).
    Both read the verifier success, binarised at ``success_threshold``.
    """

    def update(rewards_pg, valid_pg, success_pg, state, *, num_pairs=0):
        num_p, num_g = rewards_pg.shape
        paired = 2 * int(num_pairs)
        success_pg = (success_pg >= success_threshold).astype(jnp.float32)
        parts = []
        if paired:
            parts.append(advantages.pair_weighted(
                success_pg[:paired].reshape(paired // 2, 2, num_g),
                neg_weight=jnp.asarray([pos_weight, neg_weight], jnp.float32), scope=scope,
                valid_2g=valid_pg[:paired].reshape(paired // 2, 2, num_g),
                success_threshold=0.5).reshape(paired, num_g))
        if paired < num_p:
            parts.append(advantages.grpo(success_pg[paired:], valid_pg[paired:]))
        return jnp.concatenate(parts, axis=0), state

    return Estimator(init=lambda: (), update=update)


ESTIMATORS: dict[str, Callable[..., Estimator]] = {
    "grpo": _grpo,
    "dr_grpo": _dr_grpo,
    "loo": _loo,
    "reinforce": _reinforce,
    "maxrl": _maxrl,
    "curverl": _curverl,
    "pair_weighted": _pair_weighted,
}


def make_estimator(name: str, **kwargs) -> Estimator:
    """The registered estimator ``name`` built with ``kwargs`` (its own keyword arguments)."""
    if name not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; registered: {sorted(ESTIMATORS)}.")
    return ESTIMATORS[name](**kwargs)


def estimator_kwargs(name: str, *, num_prompts: int, curverl_window: int, pair_neg_weight: float,
                     pair_scope: str, success_threshold: float) -> dict:
    """The keyword arguments of ``make_estimator`` that the RL config supplies for ``name``."""
    if name == "curverl":
        return {"num_prompts": num_prompts, "window": curverl_window}
    if name == "pair_weighted":
        return {"neg_weight": pair_neg_weight, "scope": pair_scope,
                "success_threshold": success_threshold}
    return {}
