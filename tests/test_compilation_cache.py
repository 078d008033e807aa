"""jaxrl_vr.compilation_cache: one cache directory per machine kind; the train CLI's switch."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from experiments import train as train_cli
from jaxrl_vr import compilation_cache
from jaxrl_vr.train.config import PipelineConfig, RunConfig

ZEN5 = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"
ZEN5_REORDERED = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: avx512_bf16 fpu avx512f avx2\n"
ZEN3 = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2\n"
XEON = "processor\t: 0\nmodel name\t: Intel Xeon\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"


def test_machine_key_separates_instruction_sets_and_models_not_flag_order():
    key = compilation_cache.machine_key(ZEN5)
    assert key == compilation_cache.machine_key(ZEN5_REORDERED)
    assert len({key, compilation_cache.machine_key(ZEN3), compilation_cache.machine_key(XEON)}) == 3
    assert key.split("-")[-1] != "" and len(key.split("-")[-1]) == 12
    assert compilation_cache.machine_key("") == compilation_cache.machine_key("nothing useful")


def test_default_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(compilation_cache.CACHE_HOME_ENV, str(tmp_path / "mine"))
    key = compilation_cache.machine_key(ZEN3)
    assert compilation_cache.default_cache_dir(ZEN3) == str(tmp_path / "mine" / "xla" / key)
    monkeypatch.delenv(compilation_cache.CACHE_HOME_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compilation_cache.default_cache_dir(ZEN3) == str(tmp_path / "xdg" / "jaxrl_vr" / "xla" / key)
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert compilation_cache.default_cache_dir(ZEN3) == str(tmp_path / "home" / ".cache" / "jaxrl_vr" / "xla" / key)


def test_resolve_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv(compilation_cache.CACHE_HOME_ENV, str(tmp_path))
    assert compilation_cache.resolve_cache_dir("") is None
    assert compilation_cache.resolve_cache_dir("auto") == compilation_cache.default_cache_dir()
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert compilation_cache.resolve_cache_dir("~/c") == str(tmp_path / "h" / "c")
    with pytest.raises(ValueError, match="must be a string"):
        compilation_cache.resolve_cache_dir(None)


def test_an_unusable_directory_is_named_with_the_fix(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(ValueError, match=r"cannot be created.*run.compilation_cache"):
        compilation_cache.enable_compilation_cache(str(blocker / "cache"))


_COMPILE_TWICE = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp
    from jaxrl_vr.compilation_cache import enable_compilation_cache
    hits = []
    jax.monitoring.register_event_listener(
        lambda event, **kw: hits.append(1) if event == "/jax/compilation_cache/cache_hits" else None)
    enable_compilation_cache(sys.argv[1], min_compile_time_s=0.0)
    f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum())
    print(float(f(jnp.ones((8, 8)))), len(hits))
""")


def test_a_second_process_loads_the_program_the_first_compiled(tmp_path):
    cache = str(tmp_path / "cache")
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    first = subprocess.run([sys.executable, "-c", _COMPILE_TWICE, cache], capture_output=True, text=True, env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout.split()[1] == "0" and os.listdir(cache), "compiled and written, no hit"
    second = subprocess.run([sys.executable, "-c", _COMPILE_TWICE, cache], capture_output=True, text=True, env=env)
    assert second.returncode == 0, second.stderr[-2000:]
    value, hits = second.stdout.split()
    assert value == first.stdout.split()[0] and int(hits) >= 1, "same value, loaded from the cache"


@pytest.mark.parametrize("setting", ["", "DIR"])
def test_the_train_cli_follows_run_compilation_cache(monkeypatch, tmp_path, setting):
    calls = []
    monkeypatch.setattr(compilation_cache, "enable_compilation_cache", lambda path: calls.append(path) or path)
    setting = setting.replace("DIR", str(tmp_path / "c"))
    assert train_cli.apply_compilation_cache(PipelineConfig(run=RunConfig(compilation_cache=setting))) == (setting or None)
    assert calls == ([setting] if setting else [])
    assert PipelineConfig().run.compilation_cache == "auto", "on by default"


def test_a_truncated_entry_costs_a_compilation_not_the_run(tmp_path):
    cache = str(tmp_path / "cache")
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    first = subprocess.run([sys.executable, "-c", _COMPILE_TWICE, cache], capture_output=True, text=True, env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    for name in os.listdir(cache):  # As a process killed while writing would leave them.
        if name.endswith("-cache"):
            with open(os.path.join(cache, name), "r+b") as f:
                f.truncate(7)
    again = subprocess.run([sys.executable, "-c", _COMPILE_TWICE, cache], capture_output=True, text=True, env=env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.split() == [first.stdout.split()[0], "0"]
    assert "Error reading persistent compilation cache entry" in again.stderr


def test_evaluate_follows_the_runs_own_setting(monkeypatch, tmp_path):
    from experiments import evaluate as evaluate_cli

    calls = []
    monkeypatch.setattr(compilation_cache, "enable_compilation_cache", lambda path: calls.append(path) or path)
    assert evaluate_cli.apply_run_compilation_cache(str(tmp_path / "no_run")) is None
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"run": {"compilation_cache": ""}}))
    assert evaluate_cli.apply_run_compilation_cache(str(tmp_path)) is None
    config.write_text(json.dumps({"run": {"compilation_cache": str(tmp_path / "c")}}))
    assert evaluate_cli.apply_run_compilation_cache(str(tmp_path)) == str(tmp_path / "c")
    config.write_text(json.dumps({"seed": 0, "run": {"progress": True}}))  # a run from before the switch
    monkeypatch.setenv(compilation_cache.CACHE_HOME_ENV, str(tmp_path / "home"))
    assert evaluate_cli.apply_run_compilation_cache(str(tmp_path)) == compilation_cache.default_cache_dir()
    assert calls == [str(tmp_path / "c"), compilation_cache.default_cache_dir()]
