"""Test-wide JAX settings: fail on implicit rank promotion, run on CPU, keep x64 off."""

import os
import sys

# Shared test helpers (tests/*_testlib.py) import from any test folder.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from xla_testlib import with_fast_compile  # noqa: E402

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Eight fake CPU devices so sharding tests can build a real mesh (must precede jax import).
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
# Fast to compile (xla_testlib.py); a user's own setting of any of these wins. The CLIs that
# tests start inherit them.
os.environ["XLA_FLAGS"] = with_fast_compile(os.environ["XLA_FLAGS"])

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


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """A finished :smoke run (the workdir experiments.train writes), trained once per process
    for tests/experiments/test_evaluate_compare.py and tests/test_notebooks_eval.py."""
    from experiments.configs import default as default_config
    from jaxrl_vr.train.pipeline import PipelineConfig, run_pipeline

    tree = default_config.get_config("smoke").to_dict()
    tree["run"].update(progress=False, tensorboard=False, print_table=False)
    workdir = str(tmp_path_factory.mktemp("smoke") / "run")
    run_pipeline(PipelineConfig.from_dict(tree), workdir, log=lambda line: None)
    return workdir


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the marks
def pytest_collection_modifyitems(config, items):
    """The tests that read `smoke_run` share one xdist worker (the Makefile's --dist loadgroup),
    so the run is trained once, not once per worker."""
    for item in items:
        if "smoke_run" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("smoke_run"))
