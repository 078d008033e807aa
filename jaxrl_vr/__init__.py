"""jaxrl_vr: a JAX-first functional framework for RL with verifiable rewards (RLVR).

The pure math of SPEC §3 is importable straight from the package; the heavier parts
(models, sampling, verifiers, tasks, train, eval, selection, parallel) are subpackages
imported on their own, so `import jaxrl_vr` stays cheap and never starts a worker pool.
"""

import logging as _logging

from jaxrl_vr import advantages, entropy, kl, losses, passk, ratios, rewards, weighting


class _WithoutTorchNotice(_logging.Filter):
    """Drops transformers' "PyTorch was not found" notice: jaxrl_vr uses transformers for
    tokenizers and configs only, never its torch models."""

    def filter(self, record: _logging.LogRecord) -> bool:
        return not str(record.msg).startswith("PyTorch was not found")


_logging.getLogger("transformers").addFilter(_WithoutTorchNotice())

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
