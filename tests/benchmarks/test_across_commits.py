"""benchmarks/across_commits.py's bookkeeping (no model run, no worktree)."""

import os
import subprocess
import sys

import pytest

BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")
sys.path.insert(0, BENCHMARKS)

import across_commits  # noqa: E402

IN_GIT = subprocess.run(("git", "rev-parse", "--git-dir"), cwd=across_commits.REPO,
                        capture_output=True).returncode == 0
needs_git = pytest.mark.skipif(not IN_GIT, reason="not a git checkout")


def test_round_order_rotates_so_each_revision_runs_first_equally_often():
    orders = [across_commits.round_order(3, r) for r in range(6)]
    assert orders[:3] == [[0, 1, 2], [1, 2, 0], [2, 0, 1]] and orders[3:] == orders[:3]
    assert [o[0] for o in orders] == [0, 1, 2, 0, 1, 2]
    assert across_commits.round_order(2, 1) == [1, 0]


@needs_git
def test_resolve_revs_checks_every_revision_before_any_run():
    head = across_commits.git("rev-parse", "HEAD")
    resolved = across_commits.resolve_revs(["worktree", "HEAD"])
    assert resolved == [{"rev": "worktree", "sha": None}, {"rev": "HEAD", "sha": head}]
    with pytest.raises(ValueError, match="at least two"):
        across_commits.resolve_revs(["HEAD"])
    with pytest.raises(ValueError, match="not a commit"):
        across_commits.resolve_revs(["HEAD", "no-such-revision-xyz"])
    with pytest.raises(ValueError, match="same code"):
        across_commits.resolve_revs(["HEAD", head[:10]])


@needs_git
def test_resolve_revs_rejects_a_commit_without_rl_step():
    root = across_commits.git("rev-list", "--max-parents=0", "HEAD").split()[-1]
    if subprocess.run(("git", "cat-file", "-e", f"{root}:benchmarks/rl_step.py"), cwd=across_commits.REPO).returncode == 0:
        pytest.skip("this checkout's oldest commit already has rl_step.py (a shallow clone)")
    with pytest.raises(ValueError, match="no benchmarks/rl_step.py"):
        across_commits.resolve_revs(["HEAD", root])


def _run(rev, round_index, step, rollout, precision="fp32"):
    return {"rev": rev, "precision": precision, "round": round_index, "median_step_s": step,
            "median_rollout_s": rollout, "median_update_s": step - rollout, "peak_rss_mb": 5000.0}


def test_compare_to_reference_by_hand():
    revs = [{"rev": "new", "sha": None}, {"rev": "old", "sha": "abc"}]
    runs = [_run("new", 0, 10.0, 4.0), _run("old", 0, 12.0, 4.0),
            _run("new", 1, 11.0, 5.0), _run("old", 1, 11.0, 4.5),
            _run("new", 2, 9.0, 3.0), _run("old", 2, 13.5, 6.0),
            _run("old", 3, 20.0, 9.0),              # no reference run in round 3: left out of the pairs
            _run("new", 0, 1.0, 0.5, "bf16")]       # another precision: left out
    summary = across_commits.compare_to_reference(runs, revs, "fp32")
    assert summary["new"]["runs"] == 3 and "vs_reference" not in summary["new"]
    assert summary["new"]["median_step_s"] == {"median": 10.0, "min": 9.0, "max": 11.0}
    assert summary["old"]["runs"] == 4 and summary["old"]["median_step_s"]["max"] == 20.0
    step = summary["old"]["vs_reference"]["median_step_s"]
    assert step["pairs"] == 3 and step["a_s"] == [10.0, 11.0, 9.0] and step["b_s"] == [12.0, 11.0, 13.5]
    assert step["pair_b_over_a_median"] == pytest.approx(1.2) and step["b_faster_pairs"] == 0
    assert step["b_minus_a_s"]["mean"] == pytest.approx((2.0 + 0.0 + 4.5) / 3)
    rollout = summary["old"]["vs_reference"]["median_rollout_s"]
    assert rollout["b_s"] == [4.0, 4.5, 6.0] and rollout["b_faster_pairs"] == 1
    assert summary["old"]["peak_rss_mb"]["median"] == 5000.0 and "first_step_s" not in summary["old"]


def test_parse_args_names_what_is_wrong(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('"x"\n')
    base = ["--revs", "HEAD", "worktree", "--model-dir", str(tmp_path), "--prompts-file", str(prompts)]
    args = across_commits.parse_args(base + ["--precisions", "fp32,bf16"])
    assert args.precisions == ["fp32", "bf16"] and args.rounds == 6
    for extra in (["--precisions", "fp16"], ["--rounds", "0"]):
        with pytest.raises(SystemExit):
            across_commits.parse_args(base + extra)
    with pytest.raises(SystemExit):
        across_commits.parse_args(["--revs", "HEAD", "worktree", "--model-dir", str(tmp_path / "missing"),
                                   "--prompts-file", str(prompts)])
