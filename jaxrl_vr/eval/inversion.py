"""Prompts lost and newly solved, next to the number expected from sampling noise alone.

A prompt is *lost* when the base solved it at least once in its n_b evaluation samples
and the trained policy solved it in none of its n_t samples; *newly solved* is the
reverse. Both happen by chance even for a policy identical to the base: a prompt with
pass rate p fails all n_t samples with probability (1 − p)^{n_t}. To tell an effect from
noise, each count is reported with its expectation and spread under the null hypothesis
"trained = base", conditional on the base evaluation's outcomes (SPEC §6):

  lost_expected_by_chance          = Σ_{x: c_b(x) > 0} S_x(n_t)
  newly_solved_expected_by_chance  = Σ_{x: c_b(x) = 0} (1 − S_x(n_t))
  *_chance_sd                      = √ Σ π_x (1 − π_x)   (π_x the terms above)

where S_x(m) is the posterior-predictive probability (1 − p_x)^m that a policy equal to
the base fails m samples, given all of the base's samples of the prompt (the independent
calibration cache + the base evaluation: c of N correct), under a Beta(a, b) prior on p
fitted to all prompts by maximum marginal likelihood (beta-binomial empirical Bayes):

  S_x(m) = B(a + c, b + N − c + m) / B(a + c, b + N − c)

Given these posteriors the per-prompt indicators are independent Bernoulli(π_x), so the
count's null law is Poisson-binomial: the chance sd and the two-sided p-value are exact
under the fitted model. Sharing the prior across prompts matters: a flat or Jeffreys prior
makes a never-solved prompt look solvable and inflates the newly-solved baseline, and a
plug-in (1 − c/N)^m ignores that a prompt solved once by luck is likely hard. When the
calibration cache has N_cal ≥ m samples, the prior-free unbiased estimate
Σ C(N_cal − c_cal, m)/C(N_cal, m) (Chen et al., arXiv 2107.03374) is reported as well
(``*_expected_unbiased``) as a cross-check of the fitted model.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from jaxrl_vr import passk

__all__ = ["InversionCounts", "fit_beta_prior", "survival_estimate", "survival_posterior", "poisson_binomial_pmf", "exact_two_sided_p", "inversion_counts", "inversion_report"]

# Two-sided level below which a count is called different from chance.
CHANCE_ALPHA = 0.05


def survival_estimate(n: Any, c: Any, m: int) -> np.ndarray:
    """Unbiased estimate of (1 − p)^m from c correct of n i.i.d. samples (needs m ≤ n).

      Ŝ(m) = C(n − c, m) / C(n, m) = 1 − pass@m   (E[Ŝ] = (1 − p)^m exactly)

    Args:
      n: [P] (or scalar) samples per prompt, each ≥ m.
      c: [P] correct samples.
      m: the exponent (samples of the policy being judged).

    Returns:
      float64 [P] in [0, 1].
    """
    c = np.asarray(c, np.int64)
    n = np.broadcast_to(np.asarray(n, np.int64), c.shape)
    if c.size == 0:
        return np.zeros(0)
    if m < 1 or m > int(n.min()):
        raise ValueError(f"the unbiased survival estimate needs 1 <= m <= n, got m={m}, n={int(n.min())}.")
    return 1.0 - passk.pass_at_k(n, c, m)


def fit_beta_prior(n: Any, c: Any) -> tuple[float, float]:
    """Beta(a, b) prior on per-prompt pass rates by maximum beta-binomial marginal likelihood.

      max_{a,b} Σ_x log B(a + c_x, b + n_x − c_x) − log B(a, b)

    Args:
      n: [P] (or scalar) samples per prompt. c: [P] correct samples.

    Returns:
      (a, b), each in [e^-12, e^12] (all-zero counts drive a to its floor: the fitted
      prompts are almost surely unsolvable).
    """
    c = np.asarray(c, np.float64)
    n = np.broadcast_to(np.asarray(n, np.float64), c.shape)
    if c.size == 0:
        return 0.5, 0.5
    from scipy import optimize, special  # noqa: PLC0415 (here: scipy takes a second to import)

    def neg_log_likelihood(theta: np.ndarray) -> float:
        a, b = np.exp(np.clip(theta, -12.0, 12.0))
        return -float(np.sum(special.betaln(c + a, n - c + b) - special.betaln(a, b)))

    mean = (c.sum() + 0.5) / (n.sum() + 1.0)
    start = np.log([2.0 * mean, 2.0 * (1.0 - mean)])
    fit = optimize.minimize(neg_log_likelihood, start, method="Nelder-Mead",
                            options={"xatol": 1e-6, "fatol": 1e-10, "maxiter": 4000})
    a, b = np.exp(np.clip(fit.x, -12.0, 12.0))
    return float(a), float(b)


def survival_posterior(n: Any, c: Any, m: int, *, prior: tuple[float, float]) -> np.ndarray:
    """Posterior mean of (1 − p)^m given c correct of n samples and a Beta(a, b) prior on p.

      p | c ~ Beta(a + c, b + n − c);  E[(1 − p)^m] = B(a + c, b + n − c + m) / B(a + c, b + n − c)
    """
    c = np.asarray(c, np.float64)
    n = np.broadcast_to(np.asarray(n, np.float64), c.shape)
    alpha, beta = c + prior[0], n - c + prior[1]
    from scipy import special  # noqa: PLC0415 (here: scipy takes a second to import)

    return np.exp(special.betaln(alpha, beta + m) - special.betaln(alpha, beta))


def poisson_binomial_pmf(prob_p: Any) -> np.ndarray:
    """pmf [P+1] of a sum of independent Bernoulli(prob_p) (exact recursion, O(P²))."""
    pmf = np.zeros(len(prob_p) + 1)
    pmf[0] = 1.0
    for q in np.asarray(prob_p, np.float64):
        pmf[1:] = pmf[1:] * (1.0 - q) + pmf[:-1] * q
        pmf[0] *= 1.0 - q
    return pmf


def exact_two_sided_p(pmf: np.ndarray, observed: int) -> float:
    """min(1, 2·min(P(X ≥ observed), P(X ≤ observed))) for a count X with null pmf `pmf`
    (the chance p-values here; with `poisson_binomial_pmf(np.full(n, 0.5))`, the sign test)."""
    upper = pmf[observed:].sum()
    lower = pmf[: observed + 1].sum()
    return float(min(1.0, 2.0 * min(upper, lower)))


class InversionCounts(NamedTuple):
    """Observed counts and their null-hypothesis baselines (see the module docstring)."""

    lost_p: np.ndarray  # bool [P] base-solvable and trained 0 of n_t
    newly_solved_p: np.ndarray  # bool [P] base 0 of n_b and trained > 0
    lost_chance_p: np.ndarray  # float64 [P] P(lost | base outcome) under the null (0 off-set)
    newly_solved_chance_p: np.ndarray  # float64 [P] P(newly solved | base outcome) (0 off-set)
    prior: tuple[float, float]  # the fitted Beta(a, b) prior on base pass rates
    lost_unbiased: float | None  # prior-free expected lost count (needs n_t <= reference_n)
    newly_solved_unbiased: float | None


def inversion_counts(
    base_counts: Any,
    base_n: int,
    trained_counts: Any,
    trained_n: int,
    *,
    reference_counts: Any | None = None,
    reference_n: int = 0,
) -> InversionCounts:
    """Per-prompt lost / newly-solved indicators and their chance probabilities.

    Args:
      base_counts: [P] correct out of ``base_n`` samples of the base evaluation.
      base_n: n_b.
      trained_counts: [P] correct out of ``trained_n`` samples of the judged policy.
      trained_n: n_t.
      reference_counts: [P] correct base samples independent of ``base_counts`` (the
        calibration cache), or None.
      reference_n: their samples per prompt.

    The chance probabilities use the empirical-Bayes posterior of every prompt's base pass
    rate given all its base samples (reference + base evaluation); see the module docstring.
    """
    base_c = np.asarray(base_counts, np.int64)
    trained_c = np.asarray(trained_counts, np.int64)
    if base_c.shape != trained_c.shape or base_c.ndim != 1:
        raise ValueError(
            f"base {base_c.shape} and trained {trained_c.shape} counts must be equal-length 1-D arrays "
            "over the same prompts."
        )
    has_ref = reference_counts is not None and reference_n > 0
    ref_c = np.asarray(reference_counts, np.int64) if has_ref else np.zeros_like(base_c)
    if ref_c.shape != base_c.shape:
        raise ValueError(f"reference counts {ref_c.shape} do not match base counts {base_c.shape}.")
    pooled_c = base_c + ref_c
    pooled_n = int(base_n) + (int(reference_n) if has_ref else 0)
    prior = fit_beta_prior(pooled_n, pooled_c)
    survive_p = survival_posterior(pooled_n, pooled_c, int(trained_n), prior=prior)
    unbiased_p = survival_estimate(reference_n, ref_c, int(trained_n)) if has_ref and trained_n <= reference_n else None
    solvable = base_c > 0
    return InversionCounts(
        lost_p=solvable & (trained_c == 0),
        newly_solved_p=~solvable & (trained_c > 0),
        lost_chance_p=np.where(solvable, survive_p, 0.0),
        newly_solved_chance_p=np.where(solvable, 0.0, 1.0 - survive_p),
        prior=prior,
        lost_unbiased=None if unbiased_p is None else float(unbiased_p[solvable].sum()),
        newly_solved_unbiased=None if unbiased_p is None else float((1.0 - unbiased_p[~solvable]).sum()),
    )


def _verdict(name: str, observed: int, expected: float, p_value: float) -> str:
    if p_value >= CHANCE_ALPHA:
        return (f"{name}: {observed} vs {expected:.2f} expected by chance — no difference from "
                "sampling noise detected")
    side = "more" if observed > expected else "fewer"
    return (f"{name}: {observed} vs {expected:.2f} expected by chance — {side} than chance "
            f"(two-sided p = {p_value:.3g})")


def inversion_report(
    base_counts: Any,
    base_n: int,
    trained_counts: Any,
    trained_n: int,
    *,
    reference_counts: Any | None = None,
    reference_n: int = 0,
) -> dict[str, Any]:
    """JSON-able lost / newly-solved counts with their chance baselines.

    Args: as ``inversion_counts``.

    Returns:
      {"lost", "lost_expected_by_chance", "lost_chance_sd", "lost_chance_p_value",
       "newly_solved", "newly_solved_expected_by_chance", "newly_solved_chance_sd",
       "newly_solved_chance_p_value", "base_solvable", "base_unsolved",
       "lost_expected_unbiased", "newly_solved_expected_unbiased" (None unless
       trained_n <= reference_n), "lost_prompts", "newly_solved_prompts" (indices),
       "chance_prior" {"a", "b"}, "chance_reference_n", "verdict": [two sentences]}.
    """
    counts = inversion_counts(
        base_counts, base_n, trained_counts, trained_n, reference_counts=reference_counts,
        reference_n=reference_n,
    )
    out: dict[str, Any] = {}
    verdicts = []
    for name, hit_p, chance_p in (
        ("lost", counts.lost_p, counts.lost_chance_p),
        ("newly_solved", counts.newly_solved_p, counts.newly_solved_chance_p),
    ):
        observed = int(hit_p.sum())
        expected = float(chance_p.sum())
        p_value = exact_two_sided_p(poisson_binomial_pmf(chance_p), observed)
        out[name] = observed
        out[f"{name}_expected_by_chance"] = expected
        out[f"{name}_chance_sd"] = float(np.sqrt((chance_p * (1.0 - chance_p)).sum()))
        out[f"{name}_chance_p_value"] = p_value
        out[f"{name}_expected_unbiased"] = getattr(counts, f"{name}_unbiased")
        out[f"{name}_prompts"] = [int(i) for i in np.flatnonzero(hit_p)]
        verdicts.append(_verdict(name.replace("_", " "), observed, expected, p_value))
    base_c = np.asarray(base_counts)
    out["base_solvable"] = int((base_c > 0).sum())
    out["base_unsolved"] = int((base_c == 0).sum())
    out["chance_prior"] = {"a": counts.prior[0], "b": counts.prior[1]}
    out["chance_reference_n"] = int(reference_n) if reference_counts is not None else 0
    out["verdict"] = verdicts
    return out
