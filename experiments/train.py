"""Train and evaluate: ``python -m experiments.train --config=CONFIG[:variant] --workdir=DIR``.

Overrides use ml_collections dotted flags, e.g. ``--config.rl.advantage=loo``. Re-running
with the same workdir resumes from the newest complete checkpoint (the config must match;
see jaxrl_vr.train.pipeline).

A user's mistake (a config file that does not exist, a mistyped key, a workdir that cannot
be a directory, a missing flag) is reported in one ``error: ...`` line on stderr, with a
"did you mean" suggestion for keys, and exit status 2, before any model is built.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import sys
import typing
from typing import NoReturn

from absl import app, flags, logging
from ml_collections import config_flags

from jaxrl_vr import compilation_cache
from jaxrl_vr.host_memory import HostMemoryPolicy, keep_host_memory, memory_optimized_cpu_schedule
from jaxrl_vr.train.loop import RunInterrupted, VerifierFailure
from jaxrl_vr.train.pipeline import PipelineConfig, WorkdirError, run_pipeline

USAGE_ERROR = 2  # exit status for a user's mistake

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file, e.g. experiments/configs/default.py[:smoke].", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (created; resumable).")
_REEVALUATE = flags.DEFINE_bool(
    "reevaluate", False, "Evaluate a finished run again (into summary_reevaluated.json).")
INTERRUPTED = 130  # exit status after SIGINT / SIGTERM (the last complete step is checkpointed)


def fail(message: str) -> NoReturn:
    """Prints ``error: <message>`` (one line) to stderr and exits with status 2."""
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr, flush=True)
    sys.exit(USAGE_ERROR)


# ---- config keys and suggestions ---------------------------------------------------------------


def config_keys(cls: type = PipelineConfig, prefix: str = "") -> dict[str, bool]:
    """Every dotted key of the config dataclass tree -> whether it is a section (a dataclass)."""
    hints = typing.get_type_hints(cls)
    out: dict[str, bool] = {}
    for field in dataclasses.fields(cls):
        hint = hints.get(field.name)
        is_section = isinstance(hint, type) and dataclasses.is_dataclass(hint)
        out[prefix + field.name] = is_section
        if is_section:
            out.update(config_keys(hint, f"{prefix}{field.name}."))
    return out


def suggest_key(key: str, keys: dict[str, bool] | None = None) -> str | None:
    """The valid dotted key closest to a mistyped one (same section first), or None."""
    keys = config_keys() if keys is None else keys
    parent, _, leaf = key.rpartition(".")
    siblings = {k.rpartition(".")[2]: k for k in keys if k.rpartition(".")[0] == parent}
    close = difflib.get_close_matches(leaf, list(siblings), n=1, cutoff=0.6)
    if close:
        return siblings[close[0]]
    elsewhere = [k for k in keys if k.rpartition(".")[2] == leaf]  # right name, wrong section
    if elsewhere:
        return elsewhere[0]
    close = difflib.get_close_matches(key, list(keys), n=1, cutoff=0.6)
    return close[0] if close else None


def key_problem(key: str, keys: dict[str, bool] | None = None) -> str | None:
    """Why the dotted ``key`` is not a config value (with a suggestion), or None when it is."""
    keys = config_keys() if keys is None else keys
    parts = key.split(".")
    for depth in range(1, len(parts) + 1):
        prefix = ".".join(parts[:depth])
        if prefix not in keys:
            hint = suggest_key(prefix, keys)
            return f"unknown config key '{prefix}'" + (f"; did you mean '{hint}'?" if hint else "")
        if not keys[prefix] and depth < len(parts):
            return f"config key '{prefix}' is a value, not a section: '{key}' does not exist"
    if keys[key]:
        return f"config key '{key}' is a section; set one of its keys, e.g. '{key}.<name>'"
    return None


def unknown_keys(tree: dict, prefix: str = "") -> list[str]:
    """Dotted keys of a config dict that the config dataclasses do not have."""
    keys = config_keys()
    out = []
    for name, value in tree.items():
        key = f"{prefix}{name}"
        if key not in keys:
            out.append(key)
        elif keys[key] and isinstance(value, dict):
            out.extend(unknown_keys(value, f"{key}."))
    return out


# ---- flags -----------------------------------------------------------------------------------


def _flag_value(argv: list[str], name: str) -> str | None:
    """The last ``--name=value`` / ``--name value`` in argv (None when absent)."""
    value = None
    for i, arg in enumerate(argv):
        match = re.fullmatch(rf"--?{name}(=(.*))?", arg)
        if match:
            value = match.group(2) if match.group(1) else (argv[i + 1] if i + 1 < len(argv) else "")
    return value


def _overrides(argv: list[str]) -> list[str]:
    """``rl.advantage`` for every ``--config.rl.advantage[=value]`` in argv."""
    out = []
    for arg in argv:
        match = re.match(r"--?config\.([^=]+)", arg)
        if match:
            out.append(match.group(1))
    return out


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing with one-line errors (exit 2) instead of tracebacks and usage dumps."""
    config = _flag_value(argv[1:], "config")
    if config is not None:
        path = config.split(":", 1)[0]
        if not path:
            fail("--config needs a file, e.g. --config=experiments/configs/default.py[:variant].")
        if not os.path.isfile(path):
            what = "is a directory, not a config file" if os.path.isdir(path) else "does not exist"
            fail(f"config file {path} {what} (from --config={config}; relative to {os.getcwd()}).")
    try:
        return flags.FLAGS(argv)
    except (AttributeError, KeyError) as err:  # ml_collections: an override names no config field
        for key in _overrides(argv):
            problem = key_problem(key)
            if problem:
                fail(f"{problem} (in --config.{key}).")
        fail(str(err.args[0] if err.args else err).splitlines()[0])
    except flags.Error as err:  # unknown flag, bad value for an override
        fail(str(err))


# ---- checks before any work ------------------------------------------------------------------


def workdir_problem(workdir: str) -> str | None:
    """Why ``workdir`` cannot be used as a run directory (nothing is created), or None."""
    path = os.path.abspath(workdir)
    if os.path.exists(path):
        if not os.path.isdir(path):
            return f"--workdir={workdir} is a file, not a directory; pass a directory path."
        if not os.access(path, os.W_OK | os.X_OK):
            return f"--workdir={workdir} is not writable by this user."
        return None
    parent = os.path.dirname(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"--workdir={workdir} cannot be created: {parent} is a file, not a directory."
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"--workdir={workdir} cannot be created: {parent} is not writable by this user."
    return None


def config_from_flags(config) -> PipelineConfig:
    """PipelineConfig from the ConfigDict; a bad key or value exits with one error line."""
    try:
        tree = config.to_dict()
    except OSError as err:  # ml_collections defers a failed load to the first access
        fail(f"cannot load --config: {str(err).splitlines()[0]}")
    try:
        return PipelineConfig.from_dict(tree)
    except KeyError as err:
        message = str(err.args[0] if err.args else err)
        if "did you mean" not in message.lower():
            hints = [(k, suggest_key(k)) for k in unknown_keys(tree)]
            hints = [f"'{k}' -> '{h}'" for k, h in hints if h]
            if hints:
                message = f"{message.rstrip('.')}. Did you mean: {', '.join(hints)}?"
        fail(message)
    except (TypeError, ValueError) as err:
        fail(str(err))


def apply_host_memory(cfg: PipelineConfig) -> HostMemoryPolicy | None:
    """``run.keep_host_memory``: keep XLA's freed host memory; ``run.cpu_memory_schedule``:
    XLA:CPU orders programs for memory. Both must precede any computation; returns the
    first's policy (None when off)."""
    if cfg.run.cpu_memory_schedule:
        memory_optimized_cpu_schedule()
    if not cfg.run.keep_host_memory:
        return None
    policy = keep_host_memory()
    if not policy.kept:
        print(f"note: host memory not kept: {policy.reason}", file=sys.stderr, flush=True)
    return policy


def apply_compilation_cache(cfg: PipelineConfig) -> str | None:
    """``run.compilation_cache``: JAX's persistent compilation cache in that directory ("auto":
    one per machine kind under ~/.cache/jaxrl_vr/xla; "" off). Must precede any compilation;
    returns the directory (None when off)."""
    return compilation_cache.apply_setting(cfg.run.compilation_cache)


def main(argv):
    if len(argv) > 1:
        fail(f"unexpected arguments: {argv[1:]}; options are --config=... --workdir=... --config.<key>=...")
    if _CONFIG.value is None:
        fail("--config is required, e.g. --config=experiments/configs/default.py")
    if not _WORKDIR.value:
        fail("--workdir is required, e.g. --workdir=runs/default")
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    cfg = config_from_flags(_CONFIG.value)
    problem = workdir_problem(_WORKDIR.value)
    if problem:
        fail(problem)
    apply_host_memory(cfg)
    try:
        apply_compilation_cache(cfg)
    except ValueError as err:
        fail(str(err))
    try:
        run_pipeline(cfg, _WORKDIR.value, reevaluate=_REEVALUATE.value)
    except WorkdirError as err:
        print(f"error: {err}", file=sys.stderr)
        return USAGE_ERROR
    except ValueError as err:  # config validation (before any work) and data problems
        fail(str(err))
    except RunInterrupted as err:
        print(f"stopped: {err}", file=sys.stderr)
        return INTERRUPTED
    except VerifierFailure as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
