"""Population simulator: ``python -m experiments.simulate --config=CONFIG[:smoke] --workdir=DIR``.

Runs every method of ``sim.methods`` on ``sim.num_seeds`` seeds (vmapped) and writes
DIR/simulation.json (per method: exact pass@k per base regime at the end, Δpass@k,
lost prompts, entropy, trajectories) and the PNG plots. Overrides are ml_collections
dotted flags, e.g. ``--config.sim.methods=grpo,pba --config.sim.group_size=16``; an
unknown key or an invalid combination fails before the workdir is touched.
"""

from __future__ import annotations

import sys

from absl import app, flags
from ml_collections import config_flags

from jaxrl_vr.sim import SimConfig, simulate_methods, validate

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file, e.g. experiments/configs/sim.py[:smoke].", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory (created).")


def config_from_flags(config) -> SimConfig:
    """SimConfig from the ConfigDict's ``sim`` block (unknown keys raise naming them)."""
    tree = config.to_dict()
    extra = sorted(set(tree) - {"sim"})
    if extra:
        raise KeyError(f"unknown top-level config key(s) {extra}; everything lives under 'sim'.")
    return SimConfig.from_dict(tree["sim"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _CONFIG.value is None:
        raise app.UsageError("--config is required, e.g. --config=experiments/configs/sim.py")
    if not _WORKDIR.value:
        raise app.UsageError("--workdir is required, e.g. --workdir=runs/sim")
    try:
        cfg = config_from_flags(_CONFIG.value)
        validate(cfg)
    except (KeyError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    summary = simulate_methods(cfg, _WORKDIR.value)
    for method, res in summary["methods"].items():
        d = res["final"]["delta_pass_at_k_headline"]
        lost = res["final"]["lost"]["overall"]["mean"]
        print(f"{method:>16}: Δpass@1 {d['overall']['mean'][0]:+.4f}  Δpass@256 boundary "
              f"{d['boundary']['mean'][-1]:+.4f}  lost {lost:.1f}  ({res['wall_s']:.1f} s)")
    print(f"wrote {_WORKDIR.value}/simulation.json")
    return 0


if __name__ == "__main__":
    app.run(main)
