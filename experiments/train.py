"""Train and evaluate: ``python -m experiments.train --config=CONFIG[:variant] --workdir=DIR``.

Overrides are dotted keys of the config, e.g. ``--config.rl.estimator.name=loo``,
``--config.rl.batch_strategy=dynamic``, ``--config.rl.anchor.weight=0.1`` (switches PBA on),
``--config.model.system_prompt=None``. Re-running with the same workdir resumes from the
newest complete checkpoint (the config must match; see jaxrl_vr.train.pipeline).

A user's mistake (a config file that does not exist, a mistyped or moved key, a value that
does not parse, a workdir that cannot be a directory, a missing flag) is reported in one
``error: ...`` line on stderr, with a "did you mean" suggestion for keys, and exit status
2, before any model is built; so is a bad model path or data file (before the workdir is
written). SIGINT or SIGTERM stops with one ``stopped: ...`` line and exit status 130
(inside the RL loop after checkpointing the current step). ``-h`` / ``--help`` print this
text and the flags.
"""

from __future__ import annotations

import sys

from experiments import cli

if __name__ == "__main__":  # before the imports below, which take seconds
    cli.exit_on_interrupt()

import os  # noqa: E402
import re  # noqa: E402

from absl import app, flags, logging

from experiments.config_files import ConfigError, build_config
from jaxrl_vr import compilation_cache
from jaxrl_vr.host_memory import HostMemoryPolicy, keep_host_memory, memory_optimized_cpu_schedule
from jaxrl_vr.train.loop import RunInterrupted
from jaxrl_vr.train.pipeline import run_pipeline
from jaxrl_vr.train.config import PipelineConfig
from jaxrl_vr.train.rollout import VerifierFailure
from jaxrl_vr.train.workdir import WorkdirError

_CONFIG = flags.DEFINE_string("config", None, "Config file, e.g. experiments/configs/default.py[:smoke].")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (created; resumable).")
_REEVALUATE = flags.DEFINE_bool(
    "reevaluate", False, "Evaluate a finished run again (into summary_reevaluated.json).")

_OVERRIDES: list[tuple[str, str]] = []  # --config.<key>=<value>, taken out of argv by parse_flags


USAGE_ERROR, INTERRUPTED, fail = cli.USAGE_ERROR, cli.INTERRUPTED, cli.fail


def take_overrides(argv: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """(argv without them, the ``--config.key=value`` / ``--config.key value`` overrides)."""
    rest, overrides, i = [], [], 0
    while i < len(argv):
        match = re.fullmatch(r"--?config\.([^=]+)(=(.*))?", argv[i], re.DOTALL)
        if match is None:
            rest.append(argv[i])
        elif match.group(2) is not None:
            overrides.append((match.group(1), match.group(3)))
        elif i + 1 < len(argv):
            overrides.append((match.group(1), argv[i + 1]))
            i += 1
        else:
            fail(f"--config.{match.group(1)} needs a value, e.g. --config.{match.group(1)}=...")
        i += 1
    return rest, overrides


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing with one-line errors (exit 2) instead of tracebacks and usage dumps;
    the config overrides are kept for ``main``."""
    cli.print_help_if_asked(argv, __doc__)
    rest, overrides = take_overrides(argv)
    _OVERRIDES[:] = overrides
    try:
        return flags.FLAGS(rest)
    except flags.Error as err:  # unknown flag, bad value
        fail(str(err))


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
    try:
        cfg = build_config(_CONFIG.value, _OVERRIDES)
    except ConfigError as err:
        fail(str(err))
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
    except (ValueError, FileNotFoundError) as err:  # config, data and model-path problems
        fail(str(err))
    except RunInterrupted as err:
        print(f"stopped: {err}", file=sys.stderr)
        return INTERRUPTED
    except KeyboardInterrupt:  # a second Ctrl-C inside the RL loop
        print("stopped: interrupted twice; aborted without a checkpoint of the current step. "
              "Re-run the same command to resume from the last one.", file=sys.stderr)
        return INTERRUPTED
    except VerifierFailure as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
