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
    calls = []
    our_steps = iter([50.0, 60.0, 40.0])  # step ratios 0.5, 0.6, 0.4 against TRL's 100 s

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
            # Micro-batches of 8: step 100 s; all at once: a slower step, a faster rollout.
            micro_batch = int(cmd[cmd.index("--micro-batch") + 1])
            record = ({"median_step_s": 100.0, "median_rollout_s": 30.0} if micro_batch == 8 else
                      {"median_step_s": 120.0, "median_rollout_s": 25.0})
            with open(out, "w") as f:
                f.write(json.dumps({**record, "micro_batch": micro_batch or 64, "peak_rss_mb": 9000.0,
                                    "prompts_sha": "abc"}) + "\n")
        return 0.0

    monkeypatch.setattr(side_by_side, "run", fake_run)
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
    out = tmp_path / "result.json"
    result = side_by_side.main(["--peers-root", str(peers_root), "--precisions", "fp32", "--rounds", "3",
                                "--out", str(out)])
    # Each round: ours and TRL in both of its default configurations (8, then all at once).
    trl = ["bench_trl.py", "bench_trl.py"]
    assert calls == ["prompts.py", "rl_step.py", *trl, *trl, "rl_step.py", "rl_step.py", *trl]
    step = result["ratios"]["fp32"]["step_ours_over_trl"]
    assert (step["median"], step["min"], step["max"]) == (0.5, 0.4, 0.6)
    assert step["range_coverage_of_median"] == pytest.approx(0.75)
    assert [r["step_ours_over_trl"] for r in result["round_ratios"]["fp32"]] == [0.5, 0.6, 0.4]
    assert result["runs"]["fp32"]["round"] == 0  # the round with the median step ratio
    assert result["runs"]["fp32"]["jaxrl_vr"]["ran_first"] is True
    assert json.loads(out.read_text())["rounds"] == 3
    assert result["glibc_tunables"] == "glibc.malloc.hugetlb=1"
    # Against TRL's best: the step of micro-batches of 8, the rollout of all-at-once (30 / 25 s
    # against our 10 s), the update of micro-batches of 8 (70 s against our 40 s in round 0).
    first = result["round_ratios"]["fp32"][0]
    assert first["rollout_speedup_vs_trl"] == pytest.approx(2.5)
    assert first["update_ours_over_trl"] == pytest.approx(40.0 / 70.0)
    assert result["runs"]["fp32"]["trl"]["micro_batch"] == 8
    assert [c["micro_batch"] for c in result["runs"]["fp32"]["trl"]["configs"]] == [8, 64]


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


def test_both_peers_inherit_the_environment(side_by_side, tmp_path, monkeypatch):
    # An exported GLIBC_TUNABLES reaches both peers: TRL's run adds its own OMP_WAIT_POLICY
    # on top and must still see it, like our run does.
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
    show = [sys.executable, "-c", "import os; print(os.environ.get('GLIBC_TUNABLES'), "
                                  "os.environ.get('OMP_WAIT_POLICY'))"]
    for env, expected in ((None, "glibc.malloc.hugetlb=1 None"),
                          ({"OMP_WAIT_POLICY": "PASSIVE"}, "glibc.malloc.hugetlb=1 PASSIVE")):
        log = tmp_path / "peer.log"
        side_by_side.run(show, str(log), env=env)
        assert log.read_text().strip() == expected


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
