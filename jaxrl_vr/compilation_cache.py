"""A persistent cache of compiled XLA programs, one directory per kind of machine.

JAX can keep every compiled program on disk and load it, instead of compiling again, in the
next process that builds the same program for the same backend under the same jaxlib and XLA
flags (JAX's persistent compilation cache). On a Zen 5 EPYC the SmolLM2-135M peer step's first
call took 44 s against 16 s warm; a second process with the cache filled took 29 s
(`benchmarks/rl_step.py`, docs/performance.md "perf33"): the rest of the first step is tracing,
loading the programs, and their first execution (for the update, faulting its heap in).

XLA:CPU compiles for the host's instruction set, and JAX's cache key names the backend but not
the CPU model, so one cache shared between machines (a network home directory) could hand a
program built for AVX-512 to an AVX2 machine. The default directory therefore ends in a key of
the CPU's model and flags (`machine_key`). Entries are trusted code: keep the directory private
(JAX's documentation says the same of any compilation cache).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform

from jaxrl_vr import host_cpu

# LRU eviction above this size (JAX's `jax_compilation_cache_max_size`; needs `filelock`).
DEFAULT_MAX_BYTES = 2 << 30
# Programs that compile faster than this are not written (JAX's default is 1 s too).
DEFAULT_MIN_COMPILE_TIME_S = 1.0
# Where "auto" puts jaxrl_vr's caches when set (tests point it at a temporary directory).
CACHE_HOME_ENV = "JAXRL_VR_CACHE_HOME"


def machine_key(cpuinfo: str | None = None) -> str:
    """A short name for this kind of machine: the architecture, then 12 hex digits of a hash
    of /proc/cpuinfo's model name and instruction-set flags (sorted; the first CPU's). Two
    machines share it only where both would run each other's compiled programs."""
    text = host_cpu.read_cpuinfo() if cpuinfo is None else cpuinfo
    flags = host_cpu.cpuinfo_field(text, "flags") or host_cpu.cpuinfo_field(text, "Features") or ""
    described = " ".join([host_cpu.cpuinfo_field(text, "model name") or "", " ".join(sorted(flags.split()))])
    digest = hashlib.sha256(described.encode()).hexdigest()[:12]
    return f"{platform.machine() or 'unknown'}-{digest}"


def cache_home() -> str:
    """Where jaxrl_vr keeps what it builds: ``$JAXRL_VR_CACHE_HOME``, else
    ``$XDG_CACHE_HOME/jaxrl_vr``, else ``~/.cache/jaxrl_vr``."""
    return os.environ.get(CACHE_HOME_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "jaxrl_vr")


def default_cache_dir(cpuinfo: str | None = None) -> str:
    """`cache_home()` ``/xla/<machine_key>``."""
    return os.path.join(cache_home(), "xla", machine_key(cpuinfo))


def resolve_cache_dir(setting: str) -> str | None:
    """`run.compilation_cache`: "auto" is `default_cache_dir()`, "" is off (None), anything
    else a directory (``~`` expanded)."""
    if not isinstance(setting, str):
        raise ValueError(f"run.compilation_cache must be a string ('auto', '' for off, or a directory), "
                         f"got {setting!r}.")
    if setting == "":
        return None
    return default_cache_dir() if setting == "auto" else os.path.abspath(os.path.expanduser(setting))


def apply_setting(setting: str) -> str | None:
    """`run.compilation_cache` as the CLIs apply it: `resolve_cache_dir`, then
    `enable_compilation_cache` unless off. Returns the directory (None when off)."""
    path = resolve_cache_dir(setting)
    return None if path is None else enable_compilation_cache(path)


def enable_compilation_cache(path: str, *, max_bytes: int = DEFAULT_MAX_BYTES,
                             min_compile_time_s: float = DEFAULT_MIN_COMPILE_TIME_S) -> str:
    """Turns JAX's persistent compilation cache on at `path` (created if missing), capped at
    `max_bytes` (least recently used entries go first; uncapped at -1 or where `filelock` is missing),
    for programs that took at least `min_compile_time_s` to compile. Call it before the first
    compilation: JAX opens the cache once, at its first use. Returns `path`."""
    import jax  # Late: importing this module must not initialise JAX.

    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        raise ValueError(f"the compilation cache directory {path} cannot be created ({err}); set "
                         f"run.compilation_cache to a writable directory, or to '' to turn the cache off.") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"the compilation cache directory {path} is not writable; set run.compilation_cache "
                         f"to a writable directory, or to '' to turn the cache off.")
    jax.config.update("jax_compilation_cache_dir", path)
    if importlib.util.find_spec("filelock") is not None:  # JAX's eviction needs it, else fails at first use.
        jax.config.update("jax_compilation_cache_max_size", int(max_bytes))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_s))
    return path
