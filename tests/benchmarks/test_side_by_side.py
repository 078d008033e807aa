"""benchmarks/side_by_side.py: rounds alternate the running order; ratios as median [min, max].

No peers or timing here: `run` is replaced by a fake that writes the JSON each peer would.
"""

import importlib.util
import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "benchmarks", "side_by_side.py")


@pytest.fixture()
def side_by_side():
    spec = importlib.util.spec_from_file_location("side_by_side_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_summarise_by_hand(side_by_side):
    summary = side_by_side.summarise([0.5, 0.3, 0.4, 0.9])
    assert summary["median"] == pytest.approx(0.45)  # mean of the middle pair 0.4, 0.5
    assert (summary["min"], summary["max"], summary["n"]) == (0.3, 0.9, 4)
    assert summary["range_coverage_of_median"] == pytest.approx(1 - 2 / 16)
    assert side_by_side.summarise([0.7])["median"] == 0.7


def test_range_coverage_is_distribution_free_order_statistics(side_by_side):
    # P(min <= median <= max) = 1 - P(all above) - P(all below) = 1 - 2 * 2^-n.
    assert side_by_side.range_coverage(1) == 0.0
    assert side_by_side.range_coverage(3) == pytest.approx(0.75)
    assert side_by_side.range_coverage(5) == pytest.approx(0.9375)


def test_median_index_picks_the_middle_round(side_by_side):
    assert side_by_side.median_index([0.9, 0.4, 0.5]) == 2
    assert side_by_side.median_index([0.9, 0.4, 0.5, 0.1]) == 1  # lower middle of 0.4, 0.5


def test_pair_ratios_by_hand(side_by_side):
    ours = {"median_step_s": 50.0, "median_update_s": 38.0, "median_rollout_s": 12.0,
            "update_fraction_of_matmul_peak": 0.75,
            "update_executed_fraction_of_matmul_peak": 0.58, "peak_rss_mb": 5900.0}
    trl = side_by_side.best_of_trl([{"median_step_s": 100.0, "median_rollout_s": 30.0, "peak_rss_mb": 9000.0}])
    ratios = side_by_side.pair_ratios(ours, trl)
    assert ratios["step_ours_over_trl"] == pytest.approx(0.5)
    assert ratios["update_ours_over_trl"] == pytest.approx(38.0 / 70.0)
    assert ratios["rollout_speedup_vs_trl"] == pytest.approx(2.5)
    assert ratios["update_fraction_of_f32_peak"] == 0.58  # the executed FLOPs, not the nominal
    assert ratios["update_nominal_fraction_of_f32_peak"] == 0.75


def test_rounds_alternate_order_and_summarise(side_by_side, tmp_path, monkeypatch):
    peers_root = tmp_path / "peers"
    (peers_root / "models" / "smollm2-135m").mkdir(parents=True)
    (peers_root / "venv-trl" / "bin").mkdir(parents=True)
    (peers_root / "venv-trl" / "bin" / "python").write_text("")
    calls, trl_envs = [], []
    our_steps = iter([45.0, 54.0, 36.0])  # step ratios 0.5, 0.6, 0.4 against TRL's best, 90 s

    def fake_run(cmd, log_path, env=None):
        script = os.path.basename(next(c for c in cmd if c.endswith(".py")))
        out = cmd[cmd.index("--json" if script == "rl_step.py" else "--json-out" if script == "bench_trl.py"
                            else "--out") + 1]
        calls.append(script)
        if script == "rl_step.py":
            step = next(our_steps)
            record = {"median_step_s": step, "median_update_s": step - 10.0, "median_rollout_s": 10.0,
                      "update_fraction_of_matmul_peak": 0.6,
                      "update_executed_fraction_of_matmul_peak": 0.6, "peak_rss_mb": 5000.0, "load_1m_start": 1.0,
                      "prompts_sha": "abc", "steps": []}
            with open(out, "w") as f:
                json.dump(record, f)
        elif script == "bench_trl.py":
            # (micro-batch, malloc) -> (step, rollout): micro-batches of 8 under "keep" have the
            # fastest step and update, all at once under glibc's default the fastest rollout.
            micro_batch = int(cmd[cmd.index("--micro-batch") + 1])
            keep = "mmap_max=0" in ((env or {}).get("GLIBC_TUNABLES") or "")
            trl_envs.append((env or {}).get("GLIBC_TUNABLES"))
            step_s, rollout_s = {(8, False): (100.0, 30.0), (8, True): (90.0, 32.0), (0, False): (120.0, 25.0),
                                 (0, True): (115.0, 26.0)}[micro_batch, keep]
            record = {"median_step_s": step_s, "median_rollout_s": rollout_s}
            with open(out, "w") as f:
                f.write(json.dumps({**record, "micro_batch": micro_batch or 64, "peak_rss_mb": 9000.0,
                                    "prompts_sha": "abc"}) + "\n")
        return {"wall_s": 1.0, "user_s": 1.0, "kernel_s": 0.5, "minor_faults": len(calls)}

    monkeypatch.setattr(side_by_side, "run", fake_run)
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
    out = tmp_path / "result.json"
    result = side_by_side.main(["--peers-root", str(peers_root), "--precisions", "fp32", "--rounds", "3",
                                "--out", str(out)])
    # Each round: ours and TRL in its four default configurations (micro-batches of 8, then all
    # at once, each under glibc's default malloc and under "keep").
    trl = ["bench_trl.py"] * 4
    assert calls == ["prompts.py", "rl_step.py", *trl, *trl, "rl_step.py", "rl_step.py", *trl]
    keep = "glibc.malloc.hugetlb=1:" + side_by_side.TRL_MALLOC["keep"]  # after the exported tunables
    assert trl_envs == [None, keep, None, keep] * 3
    step = result["workloads"]["fixed64"]["ratios"]["fp32"]["step_ours_over_trl"]
    assert (step["median"], step["min"], step["max"]) == (0.5, 0.4, 0.6)
    assert step["range_coverage_of_median"] == pytest.approx(0.75)
    assert [r["step_ours_over_trl"] for r in result["workloads"]["fixed64"]["round_ratios"]["fp32"]] == [0.5, 0.6, 0.4]
    assert result["workloads"]["fixed64"]["runs"]["fp32"]["round"] == 0  # the round with the median step ratio
    assert result["workloads"]["fixed64"]["runs"]["fp32"]["jaxrl_vr"]["ran_first"] is True
    assert json.loads(out.read_text())["rounds"] == 3
    assert result["glibc_tunables"] == "glibc.malloc.hugetlb=1"
    # Against TRL's best: the step of micro-batches of 8 under "keep", the rollout of all at
    # once under glibc's default (25 s against our 10 s), the update of 8 under "keep" (90 − 32
    # = 58 s against our 35 s in round 0).
    first = result["workloads"]["fixed64"]["round_ratios"]["fp32"][0]
    assert first["rollout_speedup_vs_trl"] == pytest.approx(2.5)
    assert first["update_ours_over_trl"] == pytest.approx(35.0 / 58.0)
    best = result["workloads"]["fixed64"]["runs"]["fp32"]["trl"]
    assert (best["micro_batch"], best["malloc"]) == (8, "keep")
    assert [(c["micro_batch"], c["malloc"]) for c in best["configs"]] == [(8, "default"), (8, "keep"),
                                                                         (64, "default"), (64, "keep")]
    assert result["trl_malloc"] == "default,keep"
    # Every run's process cost is recorded with its figures (here: its position in the calls).
    assert [c["process"]["minor_faults"] for c in best["configs"]] == [3, 4, 5, 6]
    assert result["workloads"]["fixed64"]["runs"]["fp32"]["jaxrl_vr"]["process"]["minor_faults"] == 2


def test_best_of_trl_takes_each_figure_from_its_fastest_configuration(side_by_side):
    best = side_by_side.best_of_trl([
        {"micro_batch": 8, "median_step_s": 50.0, "median_rollout_s": 14.0, "peak_rss_mb": 5000.0},
        {"micro_batch": 64, "median_step_s": 51.0, "median_rollout_s": 14.5, "peak_rss_mb": 17000.0},
        {"micro_batch": 16, "median_step_s": 55.0, "median_rollout_s": 20.0, "peak_rss_mb": 8000.0}])
    assert (best["micro_batch"], best["median_step_s"], best["peak_rss_mb"]) == (8, 50.0, 5000.0)
    assert best["best_rollout_s"] == 14.0
    assert best["best_update_s"] == 35.0  # 55 - 20 beats 50 - 14 and 51 - 14.5
    ratios = side_by_side.pair_ratios({"median_step_s": 30.0, "median_update_s": 21.0, "median_rollout_s": 7.0,
                                       "update_fraction_of_matmul_peak": 0.5,
                                       "update_executed_fraction_of_matmul_peak": 0.5, "peak_rss_mb": 6000.0}, best)
    assert ratios["update_ours_over_trl"] == pytest.approx(21.0 / 35.0)
    assert ratios["rollout_speedup_vs_trl"] == pytest.approx(2.0)


def test_a_bad_micro_batch_list_fails_before_any_run(side_by_side):
    with pytest.raises(SystemExit, match="--trl-micro-batch"):
        side_by_side.trl_micro_batches("8,-1")


def test_a_bad_malloc_setting_fails_before_any_run(side_by_side):
    with pytest.raises(SystemExit, match="--trl-malloc 'default,hugepages'"):
        side_by_side.trl_malloc_settings("default,hugepages")
    assert side_by_side.trl_malloc_settings(" keep ") == ["keep"]


def test_trl_env_adds_the_malloc_tunables_after_the_exported_ones(side_by_side):
    keep = side_by_side.TRL_MALLOC["keep"]
    assert "glibc.malloc.mmap_max=0" in keep and "glibc.malloc.trim_threshold=" in keep
    assert side_by_side.trl_env("", "default") is None
    assert side_by_side.trl_env("PASSIVE", "default", "glibc.malloc.hugetlb=1") == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert side_by_side.trl_env("", "keep") == {"GLIBC_TUNABLES": keep}
    assert side_by_side.trl_env("", "keep", "glibc.malloc.hugetlb=1") == {
        "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1:" + keep}


def test_both_peers_inherit_the_environment(side_by_side, tmp_path, monkeypatch):
    # An exported GLIBC_TUNABLES reaches both peers: TRL's run adds its own OMP_WAIT_POLICY
    # on top and must still see it, like our run does.
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
    show = [sys.executable, "-c", "import os; print(os.environ.get('GLIBC_TUNABLES'), "
                                  "os.environ.get('OMP_WAIT_POLICY'))"]
    for env, expected in ((None, "glibc.malloc.hugetlb=1 None"),
                          ({"OMP_WAIT_POLICY": "PASSIVE"}, "glibc.malloc.hugetlb=1 PASSIVE")):
        log = tmp_path / "peer.log"
        usage = side_by_side.run(show, str(log), env=env)
        assert log.read_text().strip() == expected
        # The child's own cost: starting Python faults in pages and takes CPU time.
        assert usage["minor_faults"] > 0 and usage["user_s"] + usage["kernel_s"] > 0 and usage["wall_s"] > 0


def _summary(median, low, high):
    return {"median": median, "min": low, "max": high, "n": 3}


def test_target_verdicts_by_hand(side_by_side):
    fp32 = {"step_ours_over_trl": _summary(0.52, 0.49, 0.61), "update_fraction_of_f32_peak": _summary(0.73, 0.67, 0.79),
            "rollout_speedup_vs_trl": _summary(1.9, 1.7, 2.1), "peak_rss_mb_ours": _summary(5831.0, 5773.0, 5831.0)}
    bf16 = {"step_ours_over_trl": _summary(0.9, 0.8, 1.0), "rollout_speedup_vs_trl": _summary(2.5, 2.2, 2.7),
            "peak_rss_mb_ours": _summary(6100.0, 6050.0, 6150.0)}
    verdicts = {(v["precision"], v["ratio"]): v
                for v in side_by_side.target_verdicts({"fp32": fp32, "bf16": bf16}, bf16_dot_units=False)}
    step = verdicts[("fp32", "step_ours_over_trl")]
    assert (step["met"], step["met_in_every_round"], step["worst_round"]) == (True, False, 0.61)
    update = verdicts[("fp32", "update_fraction_of_f32_peak")]
    assert (update["met"], update["met_in_every_round"], update["worst_round"]) == (True, True, 0.67)
    rollout = verdicts[("fp32", "rollout_speedup_vs_trl")]
    assert (rollout["met"], rollout["met_in_every_round"], rollout["worst_round"]) == (False, False, 1.7)
    assert verdicts[("fp32", "peak_rss_mb_ours")]["met_in_every_round"]
    assert not verdicts[("bf16", "peak_rss_mb_ours")]["met"]
    # Without bf16 units the bf16 step target does not apply; rollout and memory still do.
    assert not verdicts[("bf16", "step_ours_over_trl")]["applies"]
    assert verdicts[("bf16", "rollout_speedup_vs_trl")]["applies"]
    with_units = side_by_side.target_verdicts({"bf16": bf16}, bf16_dot_units=True)
    assert all(v["applies"] for v in with_units)
    assert {v["ratio"] for v in with_units} == {"step_ours_over_trl", "rollout_speedup_vs_trl", "peak_rss_mb_ours"}


def test_issue43_workloads_reach_both_peers_and_their_targets(side_by_side, tmp_path, monkeypatch):
    peers_root = tmp_path / "peers"
    for model in ("smollm2-135m", "wide-qwen2"):
        (peers_root / "models" / model).mkdir(parents=True)
    (peers_root / "venv-trl" / "bin").mkdir(parents=True)
    (peers_root / "venv-trl" / "bin" / "python").write_text("")
    commands = []

    def fake_run(cmd, log_path, env=None):
        script = os.path.basename(next(c for c in cmd if c.endswith(".py")))
        commands.append((script, cmd))
        out = cmd[cmd.index("--json" if script == "rl_step.py" else "--json-out" if script == "bench_trl.py"
                            else "--out") + 1]
        lora = "--lora-rank" in cmd
        if script == "rl_step.py":  # 300 generated tokens in 3 s of rollout: 100 tokens/s
            record = {"median_step_s": 20.0, "median_update_s": 17.0, "median_rollout_s": 3.0,
                      "mean_gen_tokens_per_step": 300.0, "update_fraction_of_matmul_peak": 0.5,
                      "update_executed_fraction_of_matmul_peak": 0.5, "peak_rss_mb": 2000.0 if lora else 4000.0,
                      "load_1m_start": 1.0, "prompts_sha": "abc", "steps": []}
            with open(out, "w") as f:
                json.dump(record, f)
        elif script == "bench_trl.py":  # micro-batch 8: 40 tokens/s and 5 GB; all at once: 50 and 9 GB
            micro_batch = int(cmd[cmd.index("--micro-batch") + 1])
            record = {"median_step_s": 50.0 if micro_batch else 45.0, "median_rollout_s": 10.0 if micro_batch else 8.0,
                      "mean_gen_tokens_per_step": 400.0, "micro_batch": micro_batch,
                      "peak_rss_mb": 5000.0 if micro_batch else 9000.0, "prompts_sha": "abc"}
            with open(out, "w") as f:
                f.write(json.dumps(record) + "\n")
        return {"wall_s": 1.0, "user_s": 1.0, "kernel_s": 0.0, "minor_faults": 0}

    monkeypatch.setattr(side_by_side, "run", fake_run)
    monkeypatch.setattr(side_by_side.host_cpu, "summary", lambda: {"bf16_dot_units": True})
    result = side_by_side.main(["--peers-root", str(peers_root), "--workloads", "ragged512,wide_full,wide_lora16",
                                "--trl-malloc", "keep", "--out", str(tmp_path / "r.json")])
    ragged = [cmd for script, cmd in commands if script != "prompts.py" and "512" in cmd]
    assert ragged and all("--allow-eos" in cmd and "--lora-rank" not in cmd for cmd in ragged)
    assert all(cmd[cmd.index("--precision") + 1] == "bf16" for script, cmd in commands if script == "rl_step.py")
    assert all("--bf16" in cmd for script, cmd in commands if script == "bench_trl.py")  # auto, bf16 units
    lora = [cmd for script, cmd in commands if "--lora-rank" in cmd]
    assert len(lora) == 3 and all(cmd[cmd.index("--lora-rank") + 1] == "16" for cmd in lora)
    assert all(cmd[cmd.index("-P") + 1] == "4" for script, cmd in commands if "wide-qwen2" in " ".join(cmd))
    verdicts = {(v["workload"], v["ratio"]): v for v in result["targets"]}
    rate = verdicts[("ragged512", "rollout_tokens_per_s_over_trl")]
    assert rate["median"] == pytest.approx(100.0 / 50.0) and rate["met"]  # against TRL's faster rollout
    assert verdicts[("ragged512", "step_ours_over_trl")]["median"] == pytest.approx(20.0 / 45.0)
    assert verdicts[("wide_full", "peak_rss_over_trl_leanest")]["median"] == pytest.approx(4000.0 / 5000.0)
    cross = verdicts[("wide_lora16", "peak_rss_mb_ours_over_wide_full")]
    assert cross["median"] == pytest.approx(0.5) and cross["met"]
    assert side_by_side.resolve_precisions("auto", False) == ["fp32"]
    assert side_by_side.resolve_precisions("auto,fp32", None) == ["bf16", "fp32"]
