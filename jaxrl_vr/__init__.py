"""jaxrl_vr: a JAX-first functional framework for RL with verifiable rewards."""

__version__ = "0.1.0"
