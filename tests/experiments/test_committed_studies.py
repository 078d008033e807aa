"""Committed studies regenerate from their committed per-run files (issue 39's evidence rule)."""

import glob
import json
import os
import re

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


@pytest.mark.parametrize("study, runs", [("passk_study", "passk_study/runs"), ("study", "study/runs"),
                                         ("study/seeds5", "study/runs"), ("study/c4_weights", "study/runs"),
                                         ("smollm2_study", "smollm2_study/runs")])
def test_a_committed_study_regenerates_its_tables(study, runs, tmp_path):
    folder = os.path.join(REPO, "experiments", "results", study)
    settings = compare.recorded_settings(os.path.join(folder, "compare.json"))
    table = compare.collect_table(os.path.join(REPO, "experiments", "results", runs), settings.arms, settings.seeds,
                                  baseline=settings.baseline, num_samples=settings.num_samples,
                                  budget_fractions=settings.budget_fractions, contrasts=settings.contrasts)
    assert all(table["per_run"].get(arm.name) for arm in settings.arms), \
        f"{folder}/runs lacks per-run evidence of some arm (is it committed? .gitignore?)"
    written = compare.write_table(table, str(tmp_path), settings.token_budget)
    with open(written["markdown"]) as f:
        rebuilt = f.read()
    with open(os.path.join(folder, "compare.md")) as f:
        assert rebuilt == f.read()


def _study_tables(folder: str) -> list[str]:
    """The study's compare.md files (its own and those of its sub-comparisons)."""
    tables = []
    for path in sorted(glob.glob(os.path.join(folder, "**", "compare.md"), recursive=True)):
        with open(path) as f:
            tables.append(f.read())
    return tables


@pytest.mark.parametrize("study", ["passk_study", "study", "smollm2_study"])
def test_every_table_row_a_study_readme_quotes_is_a_row_of_its_tables(study):
    # Under the section of the same title, or (for the summary tables) anywhere in them.
    folder = os.path.join(REPO, "experiments", "results", study)
    tables, rows = {}, set()
    for text in _study_tables(folder):
        for title, lines in _sections(text).items():
            tables.setdefault(title, set()).update(lines)
        rows |= set(text.splitlines())
    with open(os.path.join(folder, "README.md")) as f:
        quoted = _sections(f.read())
    checked = 0
    for title, lines in quoted.items():
        for line in lines:
            if line.startswith("|---") or line.startswith("| metric") or line.startswith("| arm"):
                continue
            if title == "Set-up":
                continue  # the table of switches
            assert line in tables.get(title, rows), (title, line)
            checked += 1
    assert checked >= 10


_NUM = r"[+\-−]?\d+(?:\.\d+)?(?:e[+\-]?\d+)?"
_INTERVAL = re.compile(rf"({_NUM}) \[({_NUM}), ({_NUM})\]")
_PLUS_MINUS = re.compile(rf"({_NUM}) ± ({_NUM})")


def _numbers(match) -> tuple[float, ...]:
    return tuple(round(float(g.replace("−", "-")), 6) for g in match.groups())


def quoted_numbers_not_in_tables(readme: str, tables: list[str]) -> list[str]:
    """The README's "m [lo, hi]" intervals and "m ± s" values that no compare.md of the
    study holds (compared as numbers, so −/+ signs and the table's layout do not matter)."""
    known_intervals, known_pm = set(), set()
    for text in tables:
        flat = text.replace(" | [", " [")  # paired rows: | mean | [lo, hi] |
        known_intervals |= {_numbers(m) for m in _INTERVAL.finditer(flat)}
        known_pm |= {_numbers(m) for m in _PLUS_MINUS.finditer(text)}
    bad = [m.group(0) for m in _INTERVAL.finditer(readme) if _numbers(m) not in known_intervals]
    return bad + [m.group(0) for m in _PLUS_MINUS.finditer(readme) if _numbers(m) not in known_pm]


def test_quoted_number_check_catches_a_stale_interval():
    tables = ["| pass@1 | +0.020 | [-0.048, 0.087] | 3 | no difference detected |\n| x | 0.312 ± 0.009 |"]
    assert quoted_numbers_not_in_tables("pass@1 +0.020 [−0.048, +0.087]; 0.312 ± 0.009", tables) == []
    assert quoted_numbers_not_in_tables("pass@1 +0.021 [−0.048, +0.087]", tables) == ["+0.021 [−0.048, +0.087]"]
    assert quoted_numbers_not_in_tables("0.312 ± 0.010", tables) == ["0.312 ± 0.010"]


@pytest.mark.parametrize("study", ["passk_study", "study", "smollm2_study"])
def test_every_interval_a_study_readme_quotes_is_in_its_tables(study):
    folder = os.path.join(REPO, "experiments", "results", study)
    with open(os.path.join(folder, "README.md")) as f:
        assert quoted_numbers_not_in_tables(f.read(), _study_tables(folder)) == []


def test_the_study_numbers_docs_quote_are_in_its_tables():
    with open(os.path.join(REPO, "docs", "methods.md")) as f:
        text = f.read()
    section = text[text.index("## The C1–C5 method study"):]
    section = section[:section.find("\n## ", 4)] if "\n## " in section[4:] else section
    folder = os.path.join(REPO, "experiments", "results", "study")
    assert quoted_numbers_not_in_tables(section, _study_tables(folder)) == []


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


def test_the_precision_readme_rows_are_its_summaries():
    """experiments/results/smollm2_rg_precision/README.md: each table row is rebuilt from the
    run's summary.json (pass@1, wall times) and time_v.txt (peak RSS)."""
    folder = os.path.join(REPO, "experiments", "results", "smollm2_rg_precision")
    with open(os.path.join(folder, "README.md")) as f:
        readme = f.read().splitlines()
    for precision in ("float32", "bfloat16"):
        with open(os.path.join(folder, precision, "summary.json")) as f:
            summary = json.load(f)
        with open(os.path.join(folder, precision, "time_v.txt")) as f:
            rss_kib = int(next(line for line in f if "Maximum resident" in line).split(":")[1])
        wall = summary["wall_time_s"]
        minutes, seconds = divmod(round(wall["total"]), 60)
        row = (f"| {precision} (`matmul_dtype` {summary['matmul_dtype']}) | "
               f"{summary['base_pass_at_1']:.3f} → {summary['final_pass_at_1']:.3f} | {wall['base_eval']:.0f} s | "
               f"{wall['rl']:.0f} s | {wall['final_eval']:.0f} s | {minutes} min {seconds:02d} s | "
               f"{rss_kib / 2**20:.2f} GiB |")
        assert row in readme, row
