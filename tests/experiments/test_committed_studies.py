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
