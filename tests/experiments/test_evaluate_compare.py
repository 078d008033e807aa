"""experiments.evaluate and experiments.compare on one smoke run (built once per session)."""

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

from experiments import compare
from experiments import evaluate as evaluate_cli
from experiments.configs import default as default_config
from jaxrl_vr.train import run_io
from jaxrl_vr.train.pipeline import PipelineConfig

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _strip(evaluation):
    return {k: v for k, v in evaluation.items() if k != "workdir"}


def test_load_run_layout_and_errors(smoke_run, tmp_path):
    final = run_io.load_run(smoke_run, "final")
    base = run_io.load_run(smoke_run, "base")
    assert final.step == max(run_io.checkpoint_steps(smoke_run)) and base.step == 0
    assert len(final.eval_items) == final.config.task.num_eval == 10
    assert final.calibration_n == 8 and final.base_calibration_counts.shape == (10,)
    assert final.max_new_tokens == final.config.rl.max_new_tokens
    with pytest.raises(run_io.CheckpointNotFoundError, match="available"):
        run_io.load_run(smoke_run, 99)
    with pytest.raises(run_io.RunNotFoundError, match="does not exist"):
        run_io.load_run(tmp_path / "nope", "final")
    with pytest.raises(ValueError, match="final"):
        run_io.load_run(smoke_run, "latest")
    stats = run_io.read_run_stats(smoke_run)
    assert stats.complete and stats.generated_tokens > 0 and stats.rl_steps == 3


def test_interrupted_evaluation_resumes_to_the_same_result(smoke_run, tmp_path):
    workdir = str(tmp_path / "run")
    shutil.copytree(smoke_run, workdir)
    # n = 8: 2 chunks of 5 prompts for the checkpoint, then 2 for the base.
    assert evaluate_cli.evaluate_run(workdir, "final", num_samples=8, max_chunks=1, log=lambda s: None) is None
    assert evaluate_cli.evaluate_run(workdir, "final", num_samples=8, max_chunks=2, log=lambda s: None) is None
    resumed = evaluate_cli.evaluate_run(workdir, "final", num_samples=8, log=lambda s: None)
    shutil.rmtree(os.path.join(workdir, "eval"))
    fresh = evaluate_cli.evaluate_run(workdir, "final", num_samples=8, log=lambda s: None)
    assert _strip(resumed) == _strip(fresh)
    assert os.path.isfile(os.path.join(workdir, "eval", "base", "evaluation.json"))  # base done too


def test_responses_per_call_sizes_the_chunks_and_is_part_of_the_fingerprint(smoke_run, tmp_path):
    workdir = str(tmp_path / "run")
    shutil.copytree(smoke_run, workdir)
    # 8 responses per call at n = 8: one prompt per chunk, so one chunk leaves the rest to do.
    assert evaluate_cli.evaluate_run(workdir, "final", num_samples=8, max_chunks=1, responses_per_call=8,
                                     log=lambda s: None) is None
    [meta_path] = glob.glob(os.path.join(workdir, "eval", "final", "partial", "*", "meta.json"))
    with open(meta_path) as f:
        assert json.load(f)["layout"][:2] == [1, 8]
    small = evaluate_cli.evaluate_run(workdir, "final", num_samples=8, responses_per_call=8, log=lambda s: None)
    default = evaluate_cli.evaluate_run(workdir, "final", num_samples=8, log=lambda s: None)
    assert small["n"] == default["n"] == 8 and small["fingerprint"] != default["fingerprint"]
    with pytest.raises(ValueError, match="responses_per_call"):
        evaluate_cli.evaluate_run(workdir, "final", num_samples=8, responses_per_call=-1)
    assert compare.evaluate_command("w", 64, responses_per_call=512)[-1] == "--responses_per_call=512"
    assert not any("responses_per_call" in c for c in compare.evaluate_command("w", 64))


def test_unchanged_policy_is_reported_as_noise(smoke_run, tmp_path):
    """checkpoint=base with independent samples vs the base: lost ≈ expected by chance."""
    workdir = str(tmp_path / "run")
    shutil.copytree(smoke_run, workdir)
    ev = evaluate_cli.evaluate_run(workdir, "base", num_samples=16, sample_seed=1, log=lambda s: None)
    assert ev["checkpoint"] == "base" and ev["sample_seed"] == 1
    inv = ev["inversion"]
    for name in ("lost", "newly_solved"):
        gap = abs(inv[name] - inv[f"{name}_expected_by_chance"])
        assert gap <= 3 * inv[f"{name}_chance_sd"] + 1, inv
    own = evaluate_cli.evaluate_run(workdir, "base", num_samples=16, log=lambda s: None)
    assert own["inversion"] is None and own["lost"] is None  # the base alone: no comparison


@pytest.mark.slow
def test_cli_contract_and_errors(smoke_run, tmp_path):
    workdir = str(tmp_path / "run")
    shutil.copytree(smoke_run, workdir)
    cmd = [sys.executable, "-m", "experiments.evaluate", f"--workdir={workdir}", "--checkpoint=final",
           "--num_samples=32"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(os.path.join(workdir, "eval", "final", "evaluation.json")) as f:
        ev = json.load(f)
    assert sorted(int(k) for k in ev["pass_at_k"]) == [1, 2, 4, 8, 16, 32]
    assert all(0.0 <= v <= 1.0 for v in ev["pass_at_k"].values())
    assert len(ev["per_prompt"]) == 10 and all(0 <= r["count"] <= 32 for r in ev["per_prompt"])
    chance = [k for k in ev if "chance" in k]
    assert {"lost_expected_by_chance", "newly_solved_expected_by_chance"} <= set(chance)
    assert isinstance(ev["lost"], int) and isinstance(ev["newly_solved"], int)
    assert "lost_expected_by_chance" in ev["definitions"]
    for name in ("report.md", "passk.png", "delta_by_regime.png", "prompt_scatter.png"):
        assert os.path.isfile(os.path.join(workdir, "eval", "final", name)), name
    for bad, needle in ((f"--workdir={tmp_path / 'missing'}", "does not exist"),
                        (f"--workdir={workdir} --checkpoint=77", "no checkpoint at step 77")):
        proc = subprocess.run([sys.executable, "-m", "experiments.evaluate", *bad.split()], cwd=REPO,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and needle in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_compare_table_paired_differences_and_resume(smoke_run, tmp_path):
    """Two arms × two seeds of finished, evaluated runs: nothing is re-run, the table holds
    mean ± se and the paired difference (arm b = arm a + 0.1 on pass@1 for every seed)."""
    root = tmp_path / "cmp"
    evaluated = str(tmp_path / "evaluated")
    shutil.copytree(smoke_run, evaluated)
    ev = evaluate_cli.evaluate_run(evaluated, "final", num_samples=4, log=lambda s: None)
    arms = [compare.parse_arm("a", "cfg.py"), compare.parse_arm("b=rl.estimator=loo config=x.py:smoke", "cfg.py")]
    assert arms[1] == compare.Arm("b", "x.py:smoke", ("rl.estimator=loo",))
    for arm, shift in (("a", 0.0), ("b", 0.1)):
        for seed in (0, 1):
            workdir = compare.run_dir(str(root), arm, seed)
            os.makedirs(os.path.join(workdir, "eval", "final"))
            for name in ("config.json", "summary.json"):
                shutil.copy(os.path.join(evaluated, name), workdir)
            changed = json.loads(json.dumps(ev))
            changed["pass_at_k"]["1"] = ev["pass_at_k"]["1"] + shift + 0.01 * seed
            with open(os.path.join(workdir, "eval", "final", "evaluation.json"), "w") as f:
                json.dump(changed, f)
            # A kept half-budget checkpoint (step 1) with its own evaluation.
            os.makedirs(os.path.join(workdir, "eval", "1"))
            half = json.loads(json.dumps(changed))
            half["pass_at_k"]["1"] = changed["pass_at_k"]["1"] - 0.05
            with open(os.path.join(workdir, "eval", "1", "evaluation.json"), "w") as f:
                json.dump(half, f)
            with open(os.path.join(workdir, "budget_checkpoints.json"), "w") as f:
                json.dump({"token_budget": 1000, "marks": [
                    {"fraction": 0.5, "step": 1, "token_budget": 1000, "generated_tokens": 520.0}]}, f)
    launched = []
    compare.run_grid(str(root), arms, [0, 1], token_budget=1000, num_samples=4,
                     runner=lambda cmd, log: launched.append(cmd), log=lambda s: None)
    assert launched == []  # complete and evaluated: resumable grid skips them
    table = compare.collect_table(str(root), arms, [0, 1], baseline="a", num_samples=4,
                                  contrasts=[compare.parse_contrast("a,b")], budget_fractions=(0.5,))
    curve = table["budget_curves"]["a"]
    assert curve["fractions"] == [0.0, 0.5, 1.0] and curve["pass@1"]["count"] == [2, 2, 2]
    assert curve["pass@1"]["mean"][0] == pytest.approx(ev["base"]["pass_at_k"]["1"])
    assert curve["pass@1"]["mean"][1] == pytest.approx(ev["pass_at_k"]["1"] + 0.005 - 0.05)
    assert curve["generated_fraction"]["mean"][1] == pytest.approx(0.52)
    assert table["contrasts"]["a − b"]["pass@1"]["mean"] == pytest.approx(-0.1)
    change = table["change_from_base"]["a"]["Δpass@1 vs base"]  # Δ rows: interval around 0
    assert change["mean"] == pytest.approx(ev["delta_pass_at_k"]["1"]) and change["count"] == 2
    with pytest.raises(ValueError, match="two different arm names"):
        compare.parse_contrast("a")
    diff = table["paired_differences"]["b"]["pass@1"]
    assert diff["mean"] == pytest.approx(0.1) and diff["count"] == 2 and diff["verdict"] == "higher"
    same = table["paired_differences"]["b"]["pass@4"]
    assert same["mean"] == pytest.approx(0.0) and same["verdict"] == "no difference detected"
    assert table["summary"]["a"]["pass@1"]["mean"] == pytest.approx(ev["pass_at_k"]["1"] + 0.005)
    assert table["summary"]["a"]["generated_tokens"]["mean"] > 0
    paths = compare.write_table(table, str(root), 1000)
    text = open(paths["markdown"]).read()
    assert "no difference detected" in text and "± " in text
    assert "## a − b (paired" in text and "Change from the base" in text
    assert "| a | 0.5 (0.520) |" in text
    assert os.path.isfile(paths["budget"]) and os.path.isfile(paths["tradeoff"])
    assert os.path.isfile(paths["passk"]) and os.path.isfile(paths["regimes"])
    # The commands a missing run would get: one process per run, seed and budget passed.
    cmd = compare.train_command(arms[1], 3, "/w", 5000)
    assert cmd[-3:] == ["--config.rl.estimator=loo", "--config.seed=3", "--config.rl.budget.tokens=5000"]
    assert "--config=x.py:smoke" in cmd


def test_report_only_rebuilds_the_tables_from_the_collected_per_run_evidence(smoke_run, tmp_path):
    """A tiny study (2 arms × 2 seeds: whole workdirs of one smoke run with their evaluations
    shifted per run): compare writes its tables; --collect_evidence's copy holds only the
    small per-run files (gzip-compressed above the threshold); ``--report_only`` on that copy
    alone, with the settings of the compare.json, writes the same tables again."""
    root, results = tmp_path / "runs", tmp_path / "results"
    evaluated = str(tmp_path / "evaluated")
    shutil.copytree(smoke_run, evaluated)
    ev = evaluate_cli.evaluate_run(evaluated, "final", num_samples=4, log=lambda s: None)
    arms = [compare.parse_arm("a", "cfg.py"), compare.parse_arm("b=rl.estimator=loo", "cfg.py")]
    for arm, shift in (("a", 0.0), ("b", 0.1)):
        for seed in (0, 1):
            workdir = compare.run_dir(str(root), arm, seed)
            shutil.copytree(evaluated, workdir)  # checkpoints, base and export too: none is evidence
            for label, change in (("final", shift + 0.01 * seed), ("1", shift - 0.05)):
                changed = json.loads(json.dumps(ev))
                changed["pass_at_k"]["1"] = ev["pass_at_k"]["1"] + change
                os.makedirs(os.path.join(workdir, "eval", label), exist_ok=True)
                with open(os.path.join(workdir, "eval", label, "evaluation.json"), "w") as f:
                    json.dump(changed, f)
            with open(os.path.join(workdir, "budget_checkpoints.json"), "w") as f:
                json.dump({"token_budget": 1000, "marks": [
                    {"fraction": 0.5, "step": 1, "token_budget": 1000, "generated_tokens": 520.0}]}, f)
    table = compare.collect_table(str(root), arms, [0, 1], baseline="a", num_samples=4, budget_fractions=(0.5,),
                                  contrasts=[("b", "a")])
    written = compare.write_table(table, str(root), 1000)
    assert table["summary"]["a"]["KL to base (last 10 steps)"]["mean"] is not None  # read from metrics.jsonl

    # Files larger than config.json count as large here: every reader meets a .gz.
    threshold = os.path.getsize(os.path.join(evaluated, "config.json"))
    copied = compare.collect_evidence(str(root), arms, [0, 1], str(results / "runs"), gzip_above=threshold)
    run_files = sorted(name.split(os.sep, 2)[2] for name in copied if name.startswith(os.path.join("a", "seed0")))
    assert run_files == sorted(["config.json", "summary.json.gz", "metrics.jsonl.gz", "budget_checkpoints.json",
                                os.path.join("eval", "final", "evaluation.json.gz"),
                                os.path.join("eval", "1", "evaluation.json.gz")])
    on_disk = sorted(os.path.relpath(os.path.join(d, f), results / "runs")
                     for d, _, files in os.walk(results / "runs") for f in files)
    assert on_disk == sorted(copied) and len(copied) == 4 * 6

    # The results folder as committed: the per-run evidence, and a compare.json whose tables
    # are gone (only its settings are read back).
    with open(written["json"]) as f:
        original = json.load(f)
    settings = ("arms", "seeds", "baseline", "num_samples", "budget_fractions", "contrast_pairs", "token_budget")
    with open(results / "compare.json", "w") as f:
        json.dump({key: original[key] for key in settings}, f)
    proc = subprocess.run([sys.executable, "-m", "experiments.compare", "--report_only",
                           f"--root={results / 'runs'}", f"--out={results}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(results / "compare.json") as f:
        rebuilt = json.load(f)
    assert rebuilt["root"] == str(results / "runs")
    assert {k: v for k, v in rebuilt.items() if k != "root"} == {k: v for k, v in original.items() if k != "root"}
    assert (results / "compare.md").read_text() == open(written["markdown"]).read()
    for plot in ("compare_passk.png", "compare_regimes.png", "compare_budget.png", "compare_tradeoff.png"):
        assert (results / plot).is_file()


def test_recorded_settings_of_the_study_and_a_missing_table():
    study = compare.recorded_settings(os.path.join(REPO, "experiments", "results", "study", "compare.json"))
    assert len(study.arms) == 15 and study.seeds == [0, 1, 2] and study.baseline == "grpo"
    assert study.num_samples == 256 and study.budget_fractions == [0.5] and len(study.contrasts) == 12
    assert study.token_budget == 400000
    with pytest.raises(ValueError, match="--arm flags"):
        compare.recorded_settings(os.path.join(REPO, "no_such_dir", "compare.json"))


def test_compare_grid_schedules_donors_first_shares_bases_and_evaluates_fractions(tmp_path):
    """A scripted runner stands in for the processes: with two jobs, an arm that shares the
    seed's base starts only after the donor trained, from a copy of its base files; an arm
    that changes a base section builds its own; kept budget checkpoints are evaluated; a
    rerun launches nothing."""
    import threading

    root = str(tmp_path / "grid")
    arms = compare.with_common(
        [compare.parse_arm("a", "cfg.py"), compare.parse_arm("b=rl.estimator=loo", "cfg.py"),
         compare.parse_arm("c=sft.steps=5", "cfg.py")], "rl.steps=9", "cfg.py")
    assert arms[1].overrides == ("rl.steps=9", "rl.estimator=loo")
    assert compare.shares_base(arms[1], arms[0]) and not compare.shares_base(arms[2], arms[0])
    plan = compare.plan_jobs(root, arms, [0, 1], share_base=True)
    assert [(j.arm.name, j.seed, j.donor is not None) for j in plan] == [
        ("a", 0, False), ("c", 0, False), ("a", 1, False), ("c", 1, False), ("b", 0, True), ("b", 1, True)]

    lock, events, seen_base = threading.Lock(), [], {}

    def flag(cmd, name):
        return next(c.split("=", 1)[1] for c in cmd if c.startswith(f"--{name}="))

    def runner(cmd, log_path):
        workdir = flag(cmd, "workdir")
        kind = cmd[2].split(".")[-1]
        with lock:
            events.append((kind, workdir, "start"))
        if kind == "train":
            assert any(c.startswith("--config.rl.budget.fractions=(0.5,") for c in cmd)
            seen_base[workdir] = sorted(os.listdir(workdir)) if os.path.isdir(workdir) else []
            os.makedirs(os.path.join(workdir, "base"), exist_ok=True)
            for name, tree in (("config.json", {}), ("base_eval.json", {"digest": workdir}),
                               ("summary.json", {"rl_steps": 8, "budget": {"generated_tokens": 100}}),
                               ("budget_checkpoints.json", {"token_budget": 100, "marks": [
                                   {"fraction": 0.5, "step": 4, "token_budget": 100, "generated_tokens": 52}]})):
                if not os.path.exists(os.path.join(workdir, name)):
                    with open(os.path.join(workdir, name), "w") as f:
                        json.dump(tree, f)
        else:
            label = flag(cmd, "checkpoint")
            os.makedirs(os.path.join(workdir, "eval", label))
            with open(os.path.join(workdir, "eval", label, "evaluation.json"), "w") as f:
                json.dump({"n": 4}, f)
        with lock:
            events.append((kind, workdir, "end"))

    compare.run_grid(root, arms, [0, 1], token_budget=100, num_samples=4, budget_fractions=(0.5,),
                     jobs=2, share_base=True, runner=runner, log=lambda s: None)
    for seed in (0, 1):
        a, b, c = (compare.run_dir(root, name, seed) for name in "abc")
        assert events.index(("train", a, "end")) < events.index(("train", b, "start"))
        assert seen_base[b] == ["base", "base_eval.json"]  # copied from a (no calibration there)
        with open(os.path.join(b, "base_eval.json")) as f:
            assert json.load(f)["digest"] == a
        assert seen_base[a] == [] and seen_base[c] == []
        for workdir in (a, b, c):
            for label in ("final", "4"):
                assert os.path.isfile(os.path.join(workdir, "eval", label, "evaluation.json"))
    assert len(events) == 2 * 3 * 2 * 3  # train + final + fraction evaluation, start and end
    events.clear()
    compare.run_grid(root, arms, [0, 1], token_budget=100, num_samples=4, budget_fractions=(0.5,),
                     jobs=2, share_base=True, runner=runner, log=lambda s: None)
    assert events == []


def test_compare_grid_stops_on_a_failed_run(tmp_path):
    arms = [compare.parse_arm("a", "cfg.py"), compare.parse_arm("b=rl.estimator=loo", "cfg.py")]
    launched = []

    def runner(cmd, log_path):
        launched.append(cmd)
        raise RuntimeError("command failed (exit 1)")

    with pytest.raises(RuntimeError, match="exit 1"):
        compare.run_grid(str(tmp_path), arms, [0], token_budget=None, num_samples=4, jobs=2,
                         share_base=True, runner=runner, log=lambda s: None)
    assert len(launched) == 1  # b waits for its donor a, which failed: b never starts


def test_compare_checks_every_arm_before_any_run(tmp_path):
    """A mistyped or moved key in one arm fails at once, naming the arm and the key."""
    smoke = "experiments/configs/default.py:smoke"
    good = compare.parse_arm("good=rl.estimator=loo", smoke)
    compare.check_arm(good, 0, 1000, (0.5,))
    with pytest.raises(ValueError, match=r"--arm=typo: unknown config key 'rl.estimatr'"):
        compare.check_arm(compare.parse_arm("typo=rl.estimatr=loo", smoke), 0, None)
    with pytest.raises(ValueError, match=r"--arm=old: config key 'rl.advantage' moved: rl.estimator.name"):
        compare.check_arm(compare.parse_arm("old=rl.advantage=loo", smoke), 0, None)
    proc = subprocess.run([sys.executable, "-m", "experiments.compare", f"--root={tmp_path / 'r'}",
                           f"--config={smoke}", "--arm=a", "--arm=b=rl.advantag=loo"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--arm=b" in proc.stderr and "rl.advantag" in proc.stderr
    assert not (tmp_path / "r").exists()  # nothing trained


def test_kl_to_base_is_reported_only_for_runs_that_held_the_reference(tmp_path):
    """Without a reference policy the trainer's "kl" is to the behaviour policy: compare shows
    no KL to base for such a run rather than a number that looks like one."""
    def run_with(**rl_loss):
        tree = default_config.get_config("smoke").to_dict()
        tree["rl"]["log_reference_kl"] = rl_loss.get("log_reference_kl", False)
        tree.setdefault("loss", {})["kl_beta"] = rl_loss.get("kl_beta", 0.0)
        if rl_loss.get("anchor"):
            tree["rl"]["anchor"] = {"polarity": "above"}
        workdir = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        workdir.mkdir()
        (workdir / "config.json").write_text(json.dumps(PipelineConfig.from_dict(tree).to_dict()))
        with open(workdir / "metrics.jsonl", "w") as f:
            f.write(json.dumps({"step": 1, "kl": 0.25}) + "\n")
        return str(workdir)

    assert not compare._reference_kl_logged(run_with())
    assert compare._reference_kl_logged(run_with(log_reference_kl=True))
    assert compare._reference_kl_logged(run_with(kl_beta=0.01))
    assert compare._reference_kl_logged(run_with(anchor=True))
    evaluation = {"n": 2, "pass_at_k": {"1": 0.5, "2": 0.75},
                  "regimes": {name: {"count": 0} for name in compare.passk.REGIMES}}
    stats = run_io.RunStats(*([0] * len(run_io.RunStats._fields)))
    assert compare._run_metrics(evaluation, stats, run_with())["KL to base (last 10 steps)"] is None
    assert compare._run_metrics(evaluation, stats, run_with(kl_beta=0.01))["KL to base (last 10 steps)"] == 0.25
