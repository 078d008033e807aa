"""The versions a run's numbers depend on: Python, jaxrl_vr (and its git commit), the JAX
stack and the verifiers' libraries. ``versions()`` is recorded in a run's config.json and
summary.json."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess

__all__ = ["DISTRIBUTIONS", "versions"]

# Installed distributions whose version is recorded (None when one is not installed).
DISTRIBUTIONS = ("jaxrl_vr", "jax", "jaxlib", "flax", "optax", "numpy", "math-verify", "sympy",
                 "reasoning-gym")


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    """The commit of the jaxrl_vr source tree ("+dirty" with uncommitted changes), or None
    outside a git checkout."""
    source = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.exists(os.path.join(source, ".git")):
        return None
    try:
        commit = subprocess.run(["git", "-C", source, "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", source, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "") if commit else None


def versions() -> dict[str, str | None]:
    """{"python": ..., "jaxrl_vr_git": commit or None, distribution: version or None}."""
    return {"python": platform.python_version(), "jaxrl_vr_git": _git_commit(),
            **{name: _version(name) for name in DISTRIBUTIONS}}
