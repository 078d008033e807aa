"""Evaluation during training: its scalars, the path record and its plot."""

import numpy as np
import pytest

from jaxrl_vr import passk
from jaxrl_vr.eval import passk_scalars, plot_training_path, training_path
from jaxrl_vr.train.loop import PeriodicEval

REACHABLE, OUT = passk.REGIMES.index("reachable"), passk.REGIMES.index("out_of_reach")


def test_passk_scalars_by_hand():
    out = passk_scalars([2, 0, 4], 4, codes_p=[REACHABLE, OUT, REACHABLE])
    # pass@1 = (2/4 + 0 + 4/4)/3; pass@2: c=2 -> 1 − C(2,2)/C(4,2) = 5/6, c=0 -> 0, c=4 -> 1.
    assert out["eval/pass@1"] == pytest.approx(0.5)
    assert out["eval/pass@2"] == pytest.approx((5 / 6 + 1) / 3)
    assert out["eval/pass@4"] == pytest.approx(2 / 3)
    assert out["eval/reachable/count"] == 2 and out["eval/reachable/pass@1"] == pytest.approx(0.75)
    assert out["eval/reachable/pass@4"] == 1.0 and out["eval/out_of_reach/pass@4"] == 0.0
    assert out["eval/boundary/count"] == 0 and np.isnan(out["eval/boundary/pass@1"])
    assert "eval/reachable/pass@2" not in out  # per regime: pass@1 and pass@n only
    with pytest.raises(ValueError, match="codes_p"):
        passk_scalars([1, 2], 4, codes_p=[0])


def test_periodic_eval_is_due_by_step_number():
    assert [s for s in range(1, 11) if PeriodicEval(3, lambda step, model: {}).due(s)] == [3, 6, 9]
    assert not any(PeriodicEval(0, lambda step, model: {}).due(s) for s in range(1, 5))


def _row(step, counts, tokens):
    return {"step": step, "reward": 0.1, **passk_scalars(counts, 4, codes_p=[REACHABLE, OUT, REACHABLE]),
            "eval/samples": 4.0, "eval/generated_tokens": tokens}


def test_training_path_starts_at_the_base_and_keeps_the_evaluated_steps(tmp_path):
    rows = [{"step": 1, "reward": 0.0}, _row(2, [2, 0, 4], 30.0), {"step": 3, "reward": 0.2},
            _row(4, [4, 1, 4], 20.0)]
    rows[1]["eval/boundary/pass@1"] = "nan"  # as metrics.jsonl writes NaN
    record = training_path(rows, base_counts_p=[8, 0, 16], base_n=16, codes_p=[REACHABLE, OUT, REACHABLE],
                           n=4, every=2)
    assert [p["step"] for p in record["points"]] == [0, 2, 4] and record["ks"] == [1, 2, 4]
    base, first, last = record["points"]
    assert base["source"] == "base_eval" and base["n"] == 16 and base["generated_tokens"] is None
    assert base["pass_at_k"]["1"] == pytest.approx((0.5 + 0 + 1) / 3)
    assert first["pass_at_k"]["1"] == pytest.approx(0.5) and first["regimes"]["boundary"]["pass@1"] is None
    assert last["regimes"]["out_of_reach"] == {"count": 1, "pass@1": pytest.approx(0.25), "pass@4": 1.0}
    assert record["evaluations"] == 2 and record["generated_tokens"] == 50.0
    png = plot_training_path(record, tmp_path / "path.png")
    assert png.is_file() and png.stat().st_size > 1000
