"""keep_host_memory: freed XLA buffers are reused instead of faulted in again; late calls change nothing."""

import json
import os
import resource
import subprocess
import sys
import textwrap

import jax
import pytest

from experiments import train as train_cli
from jaxrl_vr import host_memory
from jaxrl_vr.train.config import PipelineConfig, RunConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = 128 * 2**20 // resource.getpagesize()  # one 128 MB output buffer (above glibc's 32 MB mmap cap)


def _thp_always() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[always]" in f.read()
    except OSError:
        return False

# Each call allocates a fresh 128 MB output, which is then deleted. The process reports the
# minor page faults of every call. A freed buffer comes back to the allocator a call or two
# late (three or four on a loaded machine), so only the last calls show the steady state;
# under load (CI's other test worker) a kept call now and then still faults a fresh block,
# so the kept side is judged on most of its last calls, not every one.
PROBE = textwrap.dedent("""
    import json, resource, sys, time
    import jax, jax.numpy as jnp
    from jaxrl_vr.host_memory import keep_host_memory
    policy = keep_host_memory() if sys.argv[1] == "keep" else None
    CALLS = 16
    f = jax.jit(lambda x: jnp.sin(x) * 2.0)
    x = jnp.ones((32, 1024, 1024), jnp.float32)
    faults = []
    for _ in range(CALLS):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        y = f(x)
        y.block_until_ready()
        y.delete()
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        time.sleep(0.1)
    print(json.dumps({"kept": bool(policy and policy.kept), "faults": faults}))
""")


def run_probe(mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "GLIBC_TUNABLES")}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, env=env,
                          timeout=300, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(host_memory._glibc() is None, reason="glibc malloc only")
@pytest.mark.skipif(_thp_always(), reason="transparent huge pages always on: a fresh mmap faults per 2 MB, "
                    "so fault counts cannot tell reuse from a fresh block")
def test_kept_memory_is_reused_and_released_memory_is_faulted_in_every_call():
    kept, released = run_probe("keep"), run_probe("release")
    assert kept["kept"] and not released["kept"]
    # JAX's default: every 128 MB output is a fresh mmap, first-touched page by page.
    assert all(f >= 0.9 * PAGES for f in released["faults"][-3:]), released
    # Kept: the freed block is reused, so most steady-state calls fault (almost) nothing.
    steady = kept["faults"][-8:]
    assert sum(f <= 0.05 * PAGES for f in steady) >= 6, kept
    assert sum(steady) <= sum(released["faults"][-8:]) / 3, (kept, released)


def test_a_call_after_the_cpu_client_exists_warns_and_changes_nothing():
    jax.devices()  # builds the CPU client with asynchronous dispatch on
    assert jax.config.read("jax_cpu_enable_async_dispatch")
    with pytest.warns(RuntimeWarning, match="before the first JAX computation"):
        policy = host_memory.keep_host_memory()
    assert not policy.kept and "before the first JAX computation" in policy.reason
    assert jax.config.read("jax_cpu_enable_async_dispatch")


def test_without_glibc_nothing_changes(monkeypatch):
    monkeypatch.setattr(host_memory.platform, "libc_ver", lambda: ("", ""))
    policy = host_memory.keep_host_memory()
    assert not policy.kept and policy.reason.startswith("not glibc")
    assert jax.config.read("jax_cpu_enable_async_dispatch")


@pytest.mark.parametrize("keep", [True, False])
def test_the_train_cli_follows_run_keep_host_memory(monkeypatch, keep):
    calls = []
    monkeypatch.setattr(train_cli, "keep_host_memory",
                        lambda: calls.append(1) or host_memory.HostMemoryPolicy(True, "kept"))
    cfg = PipelineConfig(run=RunConfig(keep_host_memory=keep))
    policy = train_cli.apply_host_memory(cfg)
    assert calls == ([1] if keep else [])
    assert (policy is not None) == keep
    assert PipelineConfig().run.keep_host_memory, "on by default"


class _FakeLibc:
    """mallopt that accepts M_MMAP_MAX and refuses M_TRIM_THRESHOLD; records every call."""

    def __init__(self):
        self.calls = []

    def mallopt(self, param, value):
        self.calls.append((param, value))
        return 0 if param == host_memory.M_TRIM_THRESHOLD else 1


def test_a_refused_mallopt_changes_nothing(monkeypatch):
    fake = _FakeLibc()
    monkeypatch.setattr(host_memory, "_glibc", lambda: fake)
    monkeypatch.setattr(host_memory, "_backends_initialized", lambda: False)
    async_before = jax.config.read("jax_cpu_enable_async_dispatch")
    policy = host_memory.keep_host_memory()
    assert not policy.kept and "M_TRIM_THRESHOLD" in policy.reason
    assert jax.config.read("jax_cpu_enable_async_dispatch") == async_before
    # The accepted setting is put back to glibc's default.
    assert fake.calls == [(host_memory.M_MMAP_MAX, 0), (host_memory.M_TRIM_THRESHOLD, -1),
                          (host_memory.M_MMAP_MAX, 65536)]


TRIM_PROBE = textwrap.dedent("""
    import json, numpy as np
    from jaxrl_vr.host_memory import release_free_heap
    def anon_mb():
        text = open("/proc/self/status").read()
        return int(text.split("RssAnon:")[1].split()[0]) / 1024
    # 32 blocks of 16 MB from the heap (the test sets the mmap threshold above them and turns
    # glibc's own trimming off, as keep_host_memory() does), freed: they stay resident.
    blocks = [np.ones(2 * 2**20) for _ in range(32)]
    del blocks
    before = anon_mb()
    released = release_free_heap()
    print(json.dumps({"before": before, "after": anon_mb(), "released": released}))
""")


@pytest.mark.skipif(host_memory._glibc() is None, reason="glibc malloc only")
def test_release_free_heap_returns_freed_pages():
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES",)}
    env.update(PYTHONPATH=REPO,
               GLIBC_TUNABLES="glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967295")
    proc = subprocess.run([sys.executable, "-c", TRIM_PROBE], capture_output=True, text=True, env=env,
                          timeout=120, check=True)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["released"] == 1
    assert result["before"] - result["after"] > 256, result  # of the 512 MB freed
