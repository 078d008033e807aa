"""Train and evaluate: ``python -m experiments.train --config=CONFIG[:variant] --workdir=DIR``.

Overrides use ml_collections dotted flags, e.g. ``--config.rl.advantage=loo``; an unknown
or mistyped key fails before any work starts. Re-running with the same workdir resumes
from the newest complete checkpoint (the config must match; see jaxrl_vr.train.pipeline).
"""

from __future__ import annotations

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from jaxrl_vr.train.pipeline import PipelineConfig, WorkdirError, run_pipeline

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file, e.g. experiments/configs/default.py[:smoke].", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (created; resumable).")


def config_from_flags(config) -> PipelineConfig:
    """PipelineConfig from the ConfigDict (unknown keys raise naming the dotted key)."""
    return PipelineConfig.from_dict(config.to_dict())


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _CONFIG.value is None:
        raise app.UsageError("--config is required, e.g. --config=experiments/configs/default.py")
    if not _WORKDIR.value:
        raise app.UsageError("--workdir is required, e.g. --workdir=runs/default")
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    cfg = config_from_flags(_CONFIG.value)
    try:
        run_pipeline(cfg, _WORKDIR.value)
    except WorkdirError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    app.run(main)
