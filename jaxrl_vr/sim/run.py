"""One call for a method grid × seeds: simulate every method, write JSON and plots."""

from __future__ import annotations

import os
import pathlib

from jaxrl_vr.sim import report
from jaxrl_vr.sim.config import SimConfig, validate
from jaxrl_vr.sim.engine import simulate


def simulate_methods(cfg: SimConfig, workdir: str | os.PathLike | None = None) -> dict:
    """Runs every method of ``cfg.methods`` (all seeds vmapped) and summarises them.

    Args:
      cfg: SimConfig; validated before anything is written.
      workdir: if given, writes workdir/simulation.json and (cfg.plots) the PNG plots.

    Returns:
      The simulation.json document (a dict).
    """
    validate(cfg)
    runs = [simulate(cfg, method) for method in cfg.method_names]
    summary = report.summarize(runs, cfg)
    if workdir is not None:
        workdir = pathlib.Path(workdir)
        report.write_json(summary, workdir)
        if cfg.plots:
            report.write_plots(runs, workdir)
    return summary
