"""Test-wide JAX settings: fail on implicit rank promotion, run on CPU, keep x64 off."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Eight fake CPU devices so sharding tests can build a real mesh (must precede jax import).
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
# Tests compile thousands of small programs and run each a few times: LLVM's optimisation of
# XLA:CPU's generated kernels costs more than it saves there (the dots are library calls
# either way; HLO passes and buffer assignment are unchanged). A user's own setting wins.
if "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"
# XLA:CPU's older elemental emitter builds the loop fusions (norms, softmaxes, the optimizer's
# updates) in about half the time of its MLIR fusion emitters: on the Zen 3 CI-sized VM,
# test_compact.py + test_prompt_prefix.py took 203 s with the default and 123 s without; the
# programs compute the same functions. Skipping LLVM's expensive passes took another 4-9 %
# (117 s). The CLIs that tests start inherit these settings.
if "xla_cpu_use_fusion_emitters" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_cpu_use_fusion_emitters=false"
if "xla_llvm_disable_expensive_passes" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_llvm_disable_expensive_passes=true"

# Training CLIs run by tests keep their compiled programs out of the user's cache
# (run.compilation_cache = "auto" resolves under this directory).
# The process that makes the directory (pytest-xdist's controller, whose workers inherit it)
# removes it when it exits.
if "JAXRL_VR_CACHE_HOME" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["JAXRL_VR_CACHE_HOME"] = tempfile.mkdtemp(prefix="jaxrl_vr_test_cache_")
    atexit.register(shutil.rmtree, os.environ["JAXRL_VR_CACHE_HOME"], ignore_errors=True)

import jax  # noqa: E402

from jaxrl_vr import compilation_cache  # noqa: E402

# The test processes (pytest-xdist's workers inherit the cache home above) share one
# persistent compilation cache, so a program built again by a later test (a resumed pipeline,
# the same tiny model's step) is loaded instead of compiled. Every program is kept and none is
# evicted: JAX's eviction lists and stats the whole directory under a lock at each write, which
# with thousands of small programs looked like it slowed the suite. The CLIs that tests start
# keep their own cache ("auto", under the same home, with eviction).
compilation_cache.enable_compilation_cache(os.path.join(os.environ["JAXRL_VR_CACHE_HOME"], "xla-tests"),
                                           max_bytes=-1, min_compile_time_s=0.0)

jax.config.update("jax_numpy_rank_promotion", "raise")

import hypothesis  # noqa: E402
import pytest  # noqa: E402

# Property tests draw the same examples on every run, so CI never fails by chance.
hypothesis.settings.register_profile("jaxrl_vr", derandomize=True, deadline=None)
hypothesis.settings.load_profile("jaxrl_vr")

import sys  # noqa: E402

# Shared test helpers (tests/*_testlib.py) import from any test folder.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the marks
def pytest_collection_modifyitems(config, items):
    """Tests that read the finished :smoke run (the `smoke_run` fixtures of
    tests/experiments/test_evaluate_compare.py and tests/test_notebooks_eval.py, built once per
    process) share one xdist worker (the Makefile's --dist loadgroup), so it is trained once."""
    for item in items:
        if "smoke_run" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("smoke_run"))
