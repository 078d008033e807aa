"""jaxrl_vr: a JAX-first functional framework for RL with verifiable rewards (RLVR).

The pure math of SPEC §3 is importable straight from the package; the heavier parts
(models, sampling, verifiers, tasks, train, eval, selection, parallel) are subpackages
imported on their own, so `import jaxrl_vr` stays cheap and never starts a worker pool.
"""

from jaxrl_vr import advantages, entropy, kl, losses, passk, ratios, rewards, weighting

__version__ = "0.1.0"

__all__ = [
    "advantages",
    "entropy",
    "kl",
    "losses",
    "passk",
    "ratios",
    "rewards",
    "weighting",
    "__version__",
]
