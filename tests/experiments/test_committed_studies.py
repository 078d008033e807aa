"""Committed studies regenerate from their committed per-run files (issue 39's evidence rule)."""

import os

import pytest

from experiments import compare

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _sections(markdown: str) -> dict[str, list[str]]:
    sections, current = {}, None
    for line in markdown.splitlines():
        if line.lstrip("#").startswith(" ") and line.startswith("#"):
            current = line.lstrip("#").strip()
            sections.setdefault(current, [])
        elif current is not None and line.startswith("|"):
            sections[current].append(line)
    return sections


@pytest.mark.parametrize("study", ["passk_study"])
def test_a_committed_study_regenerates_its_tables_and_quoted_rows(study, tmp_path):
    folder = os.path.join(REPO, "experiments", "results", study)
    settings = compare.recorded_settings(os.path.join(folder, "compare.json"))
    table = compare.collect_table(os.path.join(folder, "runs"), settings.arms, settings.seeds,
                                  baseline=settings.baseline, num_samples=settings.num_samples,
                                  budget_fractions=settings.budget_fractions, contrasts=settings.contrasts)
    assert all(table["per_run"].get(arm.name) for arm in settings.arms), \
        f"{folder}/runs lacks per-run evidence of some arm (is it committed? .gitignore?)"
    written = compare.write_table(table, str(tmp_path), settings.token_budget)
    with open(written["markdown"]) as f:
        rebuilt = f.read()
    with open(os.path.join(folder, "compare.md")) as f:
        assert rebuilt == f.read()
    # Every table row the README quotes is a row of compare.md: under the section of the same
    # title, or (for the summary tables) anywhere in it.
    tables, rows = _sections(rebuilt), set(rebuilt.splitlines())
    with open(os.path.join(folder, "README.md")) as f:
        quoted = _sections(f.read())
    checked = 0
    for title, lines in quoted.items():
        for line in lines:
            if line.startswith("|---") or line.startswith("| metric") or line.startswith("| arm"):
                continue
            if "|" in line and line.split("|")[1].strip() in ("grpo", "pkpo", "passk_training", "pba_charged"):
                continue  # the set-up table of switches
            expected = tables.get(title, rows)
            assert line in expected, (title, line)
            checked += 1
    assert checked >= 30


# The simulator README's tables: label of the "run" column -> folder under results/sim.
SIM_RUN_LABELS = {
    "main (G=8, ρ=0.9)": "main", "G=4": "group_size_4", "G=16": "group_size_16",
    "G=32": "group_size_32", "ρ=0.0": "sharing_0.0", "ρ=0.5": "sharing_0.5", "ρ=1.0": "sharing_1.0",
    "lr 1": "passk", "lr 4": "passk_lr4", "lr 16": "passk_lr16",
    "equal budget": "study_budget", "equal budget, n=64 charged": "study_budget_pba_charged",
    "equal budget, n=8 charged": "study_budget_pba8_charged",
    "κ=64": "kappa_64", "κ=256 (main)": "study_budget", "κ=1024": "kappa_1024",
    "fixed, ρ=0.0": "sharing_fixed_0.0", "fixed, ρ=0.5": "sharing_fixed_0.5",
    "ρ=0.9 (main)": "study_budget",
    "fixed, ρ=1.0": "sharing_fixed_1.0",
}


def test_the_simulator_readme_rows_are_built_from_the_committed_runs():
    """Every table row of experiments/results/sim/README.md is rebuilt from the committed
    simulation.json files (``study_table``) or, for the comparison with the study, from them
    and the study's compare.json (``experiments.sim_vs_study``)."""
    import json

    from experiments import sim_vs_study
    from jaxrl_vr.sim import study_table

    folder = os.path.join(REPO, "experiments", "results", "sim")
    rows = set()
    for label, run in SIM_RUN_LABELS.items():
        with open(os.path.join(folder, run, "simulation.json")) as f:
            rows.update(study_table({label: json.load(f)}).splitlines())
    with open(os.path.join(REPO, "experiments", "results", "study", "compare.json")) as f:
        study = json.load(f)
    sims = sim_vs_study.load_sim(folder)
    rows.update(sim_vs_study.prediction_table(sims, study).splitlines())
    rows.update(sim_vs_study.scale_table(sims, study).splitlines())
    rows.update(sim_vs_study.ratio_table(folder, study).splitlines())
    with open(os.path.join(folder, "README.md")) as f:
        readme = f.read()
    checked = 0
    for line in readme.splitlines():
        if not line.startswith("|") or line.startswith("|---"):
            continue
        assert line in rows, line
        checked += 1
    assert checked >= 90
    for row in sim_vs_study.prediction_table(sims, study).splitlines()[2:]:
        assert row in readme, f"the README lacks the prediction row {row}"
