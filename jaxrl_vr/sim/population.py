"""A population of prompts with answer modes and a log-linear policy over them.

The two-mode model of PBA (arXiv 2607.20543, SPEC §4) made concrete at population scale:
every prompt x has M answer modes, the first C of them correct. The policy's mode
logits are

    z_{x,m} = b_{x,m} + √ρ · ⟨θ, φ_{x,m}⟩ + √((1−ρ)·κ) · ψ_{x,m}

with b the frozen base logits, θ ∈ R^D *shared* by all prompts, ψ ∈ R^{P×M} *private*
to each prompt, and φ_{x,m} ∈ R^D unit feature vectors. Under SGD the logit-space
kernel is K((x,m),(x',m')) = ρ·⟨φ_{x,m}, φ_{x',m'}⟩ + (1−ρ)·κ·1[x=x', m=m']. ρ
("sharing") moves weight from a prompt's own (private) learning to the shared path,
whose updates leak to every prompt — ρ = 0 is a tabular policy (no drift), ρ = 1 fully
shared. κ (``private_gain``) sets how strong private learning is: a batch of Pb prompts
adds Pb coherent shared terms but only one private term per prompt, so κ ≈ Pb makes a
prompt's own step comparable to the batch's shared step.

``private_coupling`` says whether ρ also sets the private step: "coupled" (the default,
the formula above) scales the private path by √((1−ρ)·κ), so raising ρ shrinks the
private step; "fixed" scales it by √κ alone,

    z_{x,m} = b_{x,m} + √ρ · ⟨θ, φ_{x,m}⟩ + √κ · ψ_{x,m},

so ρ changes only the shared step (kernel ρ·⟨φ, φ'⟩ + κ·1[x = x', m = m']). "fixed" with
κ = (1−ρ₀)·κ₀ has the kernel of "coupled" at (ρ₀, κ₀).

Features: φ_{x,m} = normalise(√β · g_{s(x,m)} + √(1−β) · n_{x,m}), where g_1..g_S are
unit "strategy" vectors common to all prompts, s(x,m) the strategy of mode m of x (for
correct modes drawn from a Zipf law q_s ∝ s^(−a), for wrong modes uniformly) and n_{x,m}
private Gaussian noise. A strategy that is correct on many prompts is pushed up on all
prompts, also where it is a wrong mode: the shared-parameter drift PBA blames for
pass@k inversion on prompts that see no positive rollout.

Base: p_base(x) is drawn from a Beta mixture; the correct mass p_base and the wrong mass
1 − p_base are split over the correct / wrong modes by Dirichlet(1) draws and
b = log(mass), so softmax(b) reproduces p_base exactly. Regimes are
``passk.regime(p_base, n)`` of the exact base pass rate.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from jaxrl_vr import entropy, kl, passk

_LOGIT_MIN = jnp.finfo(jnp.float32).min
# How ρ enters the private path (see the module docstring).
PRIVATE_COUPLINGS = ("coupled", "fixed")


class Population(NamedTuple):
    """A fixed prompt population (one per seed)."""

    base_logits_pm: jnp.ndarray  # float32 [P, M]: frozen base mode logits b
    correct_pm: jnp.ndarray  # bool [P, M]: mode is a correct answer
    features_pmd: jnp.ndarray  # float32 [P, M, D]: unit feature vectors φ
    strategy_pm: jnp.ndarray  # int32 [P, M]: strategy s(x, m) behind each mode
    p_base_p: jnp.ndarray  # float32 [P]: exact base pass rate
    regime_p: jnp.ndarray  # int32 [P]: passk.regime(p_base) code


class PolicyParams(NamedTuple):
    """Trainable parameters; zeros give the base policy exactly."""

    shared_d: jnp.ndarray  # float32 [D]: θ, shared by every prompt
    private_pm: jnp.ndarray  # float32 [P, M]: ψ, one logit offset per prompt and mode


class PopulationSpec(NamedTuple):
    """Static description of a population (hashable; closed over by jit)."""

    num_prompts: int = 10_000  # P
    num_modes: int = 4  # M answer modes per prompt
    num_correct: int = 1  # C correct modes (the first C), 1 <= C < M
    feature_dim: int = 32  # D
    num_strategies: int = 8  # S shared strategy directions
    strategy_weight: float = 0.5  # β: share of a feature on its strategy direction
    strategy_zipf: float = 1.0  # a: correct-mode strategy law q_s ∝ s^(−a) (0 = uniform)
    mixture_weights: tuple = (0.15, 0.30, 0.30, 0.25)  # mixture weights of p_base
    beta_a: tuple = (0.6, 1.5, 2.0, 6.0)  # Kumaraswamy a per component
    beta_b: tuple = (600.0, 60.0, 4.0, 1.5)  # Kumaraswamy b per component
    p_floor: float = 1e-7  # p_base is clipped to [p_floor, 1 − p_floor]
    regime_n: int = 256  # n of passk.regime


def init_params(spec: PopulationSpec) -> PolicyParams:
    """θ = 0, ψ = 0: the policy equals the base."""
    return PolicyParams(
        shared_d=jnp.zeros((spec.feature_dim,), jnp.float32),
        private_pm=jnp.zeros((spec.num_prompts, spec.num_modes), jnp.float32))


def make_population(key: jax.Array, spec: PopulationSpec) -> Population:
    """Draws a population: base pass rates, base logits, strategies and features.

    Args:
      key: PRNG key.
      spec: PopulationSpec (static).

    Returns:
      Population with softmax(base_logits)[correct].sum() == p_base (float32 exact
      up to rounding).
    """
    num_p, num_m, num_c = spec.num_prompts, spec.num_modes, spec.num_correct
    if not 1 <= num_c < num_m:
        raise ValueError(f"need 1 <= num_correct < num_modes, got {num_c} and {num_m}.")
    if not len(spec.mixture_weights) == len(spec.beta_a) == len(spec.beta_b):
        raise ValueError("mixture_weights, beta_a and beta_b need one entry per component.")
    keys = jax.random.split(key, 8)
    weights_c = jnp.asarray(spec.mixture_weights, jnp.float32)
    component_p = jax.random.categorical(keys[0], jnp.log(weights_c), shape=(num_p,))
    a_p = jnp.asarray(spec.beta_a, jnp.float32)[component_p]
    b_p = jnp.asarray(spec.beta_b, jnp.float32)[component_p]
    # Kumaraswamy(a, b) by its closed-form inverse CDF, p = (1 − (1−u)^{1/b})^{1/a} (a
    # Beta-like law on [0, 1]; gamma-based Beta samplers take seconds to compile), and
    # Dirichlet(1, ..., 1) shares as normalised Exp(1) draws.
    u_p = jax.random.uniform(keys[1], (num_p,), minval=1e-12, maxval=1.0 - 1e-7)
    p_target = -jnp.expm1(jnp.log1p(-u_p) / b_p)
    p_target = jnp.exp(jnp.log(jnp.maximum(p_target, 1e-38)) / a_p)
    p_target = jnp.clip(p_target, spec.p_floor, 1.0 - spec.p_floor)
    exp_pm = jax.random.exponential(keys[2], (num_p, num_m)) + 1e-12
    correct_share = exp_pm[:, :num_c] / jnp.sum(exp_pm[:, :num_c], 1, keepdims=True)
    wrong_share = exp_pm[:, num_c:] / jnp.sum(exp_pm[:, num_c:], 1, keepdims=True)
    mass_pm = jnp.concatenate([p_target[:, None] * correct_share,
                               (1.0 - p_target)[:, None] * wrong_share], axis=1)
    mass_pm = jnp.maximum(mass_pm, 1e-30)
    base_logits_pm = jnp.log(mass_pm)
    correct_pm = jnp.broadcast_to(jnp.arange(num_m) < num_c, (num_p, num_m))

    rank_s = jnp.arange(1, spec.num_strategies + 1, dtype=jnp.float32)
    zipf_logits = -spec.strategy_zipf * jnp.log(rank_s)
    correct_strategy = jax.random.categorical(keys[4], zipf_logits, shape=(num_p, num_c))
    wrong_strategy = jax.random.randint(keys[5], (num_p, num_m - num_c), 0, spec.num_strategies)
    strategy_pm = jnp.concatenate([correct_strategy, wrong_strategy], axis=1).astype(jnp.int32)

    directions_sd = jax.random.normal(keys[6], (spec.num_strategies, spec.feature_dim))
    directions_sd = directions_sd / jnp.linalg.norm(directions_sd, axis=1, keepdims=True)
    noise_pmd = jax.random.normal(keys[7], (num_p, num_m, spec.feature_dim))
    noise_pmd = noise_pmd / jnp.sqrt(jnp.float32(spec.feature_dim))
    beta = jnp.float32(spec.strategy_weight)
    raw_pmd = jnp.sqrt(beta) * directions_sd[strategy_pm] + jnp.sqrt(1.0 - beta) * noise_pmd
    features_pmd = raw_pmd / jnp.linalg.norm(raw_pmd, axis=2, keepdims=True)

    p_base_p = pass_rate(base_logits_pm, correct_pm)
    return Population(
        base_logits_pm=base_logits_pm.astype(jnp.float32),
        correct_pm=correct_pm,
        features_pmd=features_pmd.astype(jnp.float32),
        strategy_pm=strategy_pm,
        p_base_p=p_base_p,
        regime_p=passk.regime(p_base_p, n=spec.regime_n),
    )


def policy_logits(
    params: PolicyParams,
    population: Population,
    prompt_idx: jnp.ndarray | None = None,
    *,
    sharing: float,
    private_gain: float = 1.0,
    private_coupling: str = "coupled",
) -> jnp.ndarray:
    """Mode logits z = b + √ρ·⟨θ, φ⟩ + √((1−ρ)·κ)·ψ for all prompts or a batch of them.

    Args:
      params: PolicyParams.
      population: Population.
      prompt_idx: optional int [N] prompt indices (None = all P prompts).
      sharing: ρ in [0, 1] (static or traced).
      private_gain: κ > 0.
      private_coupling: "coupled" (private scale √((1−ρ)·κ)) or "fixed" (√κ: ρ leaves the
        private step unchanged); static.

    Returns:
      float32 [N or P, M].
    """
    base, feats, private = (population.base_logits_pm, population.features_pmd,
                            params.private_pm)
    if prompt_idx is not None:
        chex.assert_rank(prompt_idx, 1)
        base, feats, private = base[prompt_idx], feats[prompt_idx], private[prompt_idx]
    if private_coupling not in PRIVATE_COUPLINGS:
        raise ValueError(f"private_coupling must be one of {PRIVATE_COUPLINGS}, got "
                         f"{private_coupling!r}.")
    sharing = jnp.asarray(sharing, jnp.float32)
    shared_pm = jnp.einsum("pmd,d->pm", feats, params.shared_d)
    private_weight = jnp.asarray(private_gain, jnp.float32)
    if private_coupling == "coupled":
        private_weight = (1.0 - sharing) * private_weight
    private_scale = jnp.sqrt(private_weight)
    return base + jnp.sqrt(sharing) * shared_pm + private_scale * private


def pass_rate(logits_pm: jnp.ndarray, correct_pm: jnp.ndarray) -> jnp.ndarray:
    """Exact p(x) = Σ_{m correct} softmax(z_x)_m, float32 [P] (via log-sum-exp)."""
    chex.assert_equal_shape([logits_pm, correct_pm])
    logp_pm = jax.nn.log_softmax(logits_pm.astype(jnp.float32), axis=-1)
    log_p = jax.nn.logsumexp(jnp.where(correct_pm, logp_pm, _LOGIT_MIN), axis=-1)
    return jnp.clip(jnp.exp(log_p), 0.0, 1.0)


def exact_pass_at_k(p: jnp.ndarray, ks) -> jnp.ndarray:
    """Exact pass@k of a prompt with pass rate p: 1 − (1−p)^k, shape p.shape + [K].

    The limit n → ∞ of ``passk.pass_at_k(n, c = p·n, k)``; computed as
    −expm1(k·log1p(−p)), accurate for tiny p (Chen et al., arXiv 2107.03374).
    """
    p = jnp.clip(jnp.asarray(p, jnp.float32), 0.0, 1.0)[..., None]
    ks_k = jnp.asarray(ks, jnp.float32).reshape((1,) * (p.ndim - 1) + (-1,))
    return -jnp.expm1(ks_k * jnp.log1p(-p))


def mode_entropy(logits_pm: jnp.ndarray) -> jnp.ndarray:
    """Entropy over modes per prompt, float32 [P] (``entropy.entropy_from_logits``)."""
    return entropy.entropy_from_logits(logits_pm[:, None, :].astype(jnp.float32))[:, 0]


def kl_to_base(logits_pm: jnp.ndarray, base_logits_pm: jnp.ndarray) -> jnp.ndarray:
    """Exact KL(π‖π₀) over modes per prompt: Σ_m π_m · k1_m, k1 = log π − log π₀ [P]."""
    logp_pm = jax.nn.log_softmax(logits_pm, axis=-1)
    base_logp_pm = jax.nn.log_softmax(base_logits_pm, axis=-1)
    return jnp.sum(jnp.exp(logp_pm) * kl.estimate(logp_pm, base_logp_pm, "k1"), axis=-1)
