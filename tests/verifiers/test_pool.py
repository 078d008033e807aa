"""VerifierPool: deadlines, crashes and bad verifiers never stop scoring."""

import json
import os
import subprocess
import sys
import time
import types

import numpy as np
import pytest

from jaxrl_vr.tasks.arithmetic import make_items
from jaxrl_vr.tasks.base import TaskItem
from jaxrl_vr.verifiers import VerifierPool, VerifyResult, register_verifier, score_serial
from jaxrl_vr.verifiers.pool import ErrorLog, ErrorStop


def hang(item, completion):
    while True:
        pass


def sleepy(item, completion):
    time.sleep(float(completion))
    return 1.0


def crash(item, completion):
    os._exit(3)  # the worker process dies without replying


def boom(item, completion):
    raise RuntimeError("verifier bug")


def nan_score(item, completion):
    return float("nan")


def process_id(item, completion):
    return float(os.getpid())


for _name, _fn in [("t_hang", hang), ("t_sleepy", sleepy), ("t_crash", crash), ("t_boom", boom),
                   ("t_nan", nan_score), ("t_pid", process_id)]:
    register_verifier(_name, _fn, overwrite=True)


def _item(verifier, answer="1"):
    return TaskItem(uid=verifier, prompt="p", answer=answer, verifier=verifier)


@pytest.fixture(scope="module")
def pool():
    with VerifierPool(2, timeout_s=1.0, inline=()) as p:  # "exact" through the workers too
        yield p


def test_matches_serial_on_arithmetic(pool):
    items = make_items(0, 12)
    completions = [i.answer if k % 3 == 0 else ("7" + i.answer if k % 3 == 1 else "?") for k, i in enumerate(items)]
    result = pool.score(items, completions)
    reference = score_serial(items, completions)
    np.testing.assert_array_equal(result.scores, reference.scores)
    assert result.statuses == reference.statuses
    assert result.statuses == ["ok", "wrong", "unparsable"] * 4
    assert result.scores.dtype == np.float32 and result.scores.shape == (12,)


def test_failures_are_scored_zero_and_counted(pool):
    items = [_item("exact"), _item("t_hang"), _item("t_boom"), _item("t_crash"), _item("t_nan"), _item("exact")]
    completions = ["1", "", "", "", "", "2"]
    start = time.perf_counter()
    result = pool.score(items, completions)
    elapsed = time.perf_counter() - start
    assert result.statuses == ["ok", "timeout", "error", "error", "error", "wrong"], result.errors
    np.testing.assert_array_equal(result.scores, [1, 0, 0, 0, 0, 0])
    assert result.errors[2] == "RuntimeError: verifier bug" and result.errors[3].startswith("WorkerDied: worker died")
    assert elapsed < 1.0 + 5.0, elapsed  # one deadline (1 s) plus generous start-up of replacement workers
    counts = result.counts()
    assert counts == {"ok": 1, "wrong": 1, "timeout": 1, "error": 3, "unparsable": 0}
    metrics = result.metrics()
    assert metrics["verifier/frac_error"] == pytest.approx(3 / 6) and metrics["verifier/num_timeout"] == 1.0
    # The pool keeps serving after timeouts and crashes.
    again = pool.score([_item("exact")] * 4, ["1", "1", "0", "1"])
    assert again.statuses == ["ok", "ok", "wrong", "ok"]


def test_hangs_run_in_parallel_and_time_out_per_item(pool):
    start = time.perf_counter()
    result = pool.score([_item("t_sleepy")] * 4, ["0.1", "30", "30", "0.1"])
    elapsed = time.perf_counter() - start
    assert result.statuses == ["ok", "timeout", "timeout", "ok"], result.errors
    assert elapsed < 5.0, elapsed  # two workers each kill one sleeper at 1 s; serial would take 60 s


def test_submit_runs_off_thread(pool):
    future = pool.submit(make_items(1, 4), ["0"] * 4)
    result = future.result(timeout=30)
    assert len(result.statuses) == 4


def test_bad_batches_raise_before_work(pool):
    with pytest.raises(ValueError, match="one completion per item"):
        pool.score(make_items(0, 2), ["1"])
    with pytest.raises(ValueError, match="Unknown verifier"):
        pool.score([_item("no_such_verifier")], ["1"])
    with pytest.raises(TypeError, match="decode completions"):
        pool.score(make_items(0, 1), [b"1"])


def test_unpicklable_verifier_is_reported_when_used():
    register_verifier("t_lambda", lambda item, completion: 1.0, overwrite=True)
    try:
        with VerifierPool(1, timeout_s=1.0) as pool:
            assert pool.score([_item("exact")], ["1"]).statuses == ["ok"]  # other verifiers still work
            with pytest.raises(TypeError, match="module level"):
                pool.score([_item("t_lambda")], ["1"])
    finally:
        register_verifier("t_lambda", "jaxrl_vr.verifiers.registry:exact_verifier", overwrite=True)


def test_slow_unpickling_does_not_count_against_the_deadline():
    # Registered as a callable, the verifier is unpickled in each worker (its module imported:
    # 1.5 s > timeout_s) before the item's deadline starts; the replacement worker too.
    import _slow_import_verifier

    register_verifier("t_slow_start", _slow_import_verifier.verify, overwrite=True)
    try:
        with VerifierPool(1, timeout_s=1.0, resolve_timeout_s=30.0, inline=()) as pool:
            result = pool.score([_item("t_slow_start"), _item("t_crash"), _item("t_slow_start")], ["1", "", "1"])
        assert result.statuses == ["ok", "error", "ok"], result.errors  # the replacement also starts slowly
    finally:
        register_verifier("t_slow_start", "jaxrl_vr.verifiers.registry:exact_verifier", overwrite=True)


def test_slow_first_import_does_not_count_against_the_deadline():
    # "t_slow_import" resolves by import path; its module sleeps 1.5 s on import (> timeout_s).
    register_verifier("t_slow_import", "_slow_import_verifier:verify", overwrite=True)
    with VerifierPool(1, timeout_s=1.0, resolve_timeout_s=30.0) as pool:
        result = pool.score([_item("t_slow_import")] * 2, ["1", "1"])
    assert result.statuses == ["ok", "ok"], result.errors


def test_items_queued_behind_a_hang_are_not_lost():
    # One worker, prefetch 4: the items behind the sleeper are requeued when it is killed, and
    # the 1 MB completion is not pushed into the pipe of the busy worker (that send would block).
    items = [_item("t_sleepy"), _item("exact"), _item("exact"), _item("exact")]
    completions = ["30", "1", "1" + " " * 1_000_000, "0"]
    with VerifierPool(1, timeout_s=1.0, prefetch=4, inline=()) as pool:
        start = time.perf_counter()
        result = pool.score(items, completions)
        elapsed = time.perf_counter() - start
    assert result.statuses == ["timeout", "ok", "ok", "wrong"], result.errors
    assert elapsed < 5.0, elapsed
    with pytest.raises(ValueError, match="prefetch"):
        VerifierPool(1, prefetch=5)


def test_inline_verifiers_skip_the_workers():
    with VerifierPool(1, timeout_s=1.0, inline=("t_pid", "t_boom")) as pool:
        result = pool.score([_item("t_pid"), _item("t_boom"), _item("exact")], ["", "", "1"])
    assert result.scores[0] == os.getpid()  # ran here
    assert result.statuses[1:] == ["error", "ok"] and "verifier bug" in result.errors[1]
    with VerifierPool(1, timeout_s=1.0, inline=()) as pool:
        assert pool.score([_item("t_pid")], [""]).scores[0] != os.getpid()  # ran in a worker


def test_verifier_that_cannot_load_in_workers_fails_only_its_items():
    module = types.ModuleType("t_parent_only_module")  # importable here, absent in workers
    exec("def verify(item, completion):\n    return 1.0\n", module.__dict__)
    sys.modules[module.__name__] = module
    register_verifier("t_parent_only", module.verify, overwrite=True)
    try:
        with VerifierPool(1, timeout_s=1.0, inline=()) as pool:
            result = pool.score([_item("t_parent_only"), _item("exact")], ["1", "1"])
        assert result.statuses == ["error", "ok"]
        assert "t_parent_only_module" in result.errors[0]
    finally:
        register_verifier("t_parent_only", "jaxrl_vr.verifiers.registry:exact_verifier", overwrite=True)
        del sys.modules[module.__name__]


def test_errors_carry_type_and_message(pool):
    items = [_item("t_boom"), _item("exact"), _item("t_crash"), _item("t_hang")]
    result = pool.score(items, ["", "1", "", ""])
    assert result.statuses == ["error", "ok", "error", "timeout"]
    failures = result.failures()
    assert [(i, kind) for i, kind, _ in failures] == [(0, "RuntimeError"), (2, "WorkerDied")]
    assert failures[0][2] == "verifier bug"
    assert result.errors[1] is None and "killed after" in result.errors[3]  # timeouts are not errors


def _result(statuses, errors):
    return VerifyResult(scores=np.zeros([len(statuses)], np.float32), statuses=statuses, errors=errors)


def test_error_log_writes_first_errors_per_step(tmp_path):
    path = tmp_path / "run" / "verifier_errors.jsonl"
    log = ErrorLog(path, max_per_step=2, max_completion_chars=10)
    items = [_item(f"v{k}") for k in range(4)]
    completions = ["short", "x" * 50, "fine", "y"]
    result = _result(["error", "error", "ok", "error"],
                     ["ValueError: bad answer", "KeyError: 'k'", None, "ZeroDivisionError: division by zero"])
    assert log.record(3, items, completions, result) == 3  # all counted, two written
    assert log.record(4, items, completions, _result(["ok"] * 4, [None] * 4)) == 0
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == [
        {"step": 3, "index": 0, "item_id": "v0", "verifier": "v0", "type": "ValueError",
         "message": "bad answer", "completion": "short"},
        {"step": 3, "index": 1, "item_id": "v1", "verifier": "v1", "type": "KeyError",
         "message": "'k'", "completion": "xxxxxxxxxx...[50 chars]"},
    ]
    log.record(5, items, completions, result)
    resumed = ErrorLog(path, max_per_step=2, resume_step=4)  # step 5 is replayed after a resume
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [3, 3]
    assert resumed.record(5, items[:1], completions[:1], _result(["error"], ["OSError: disk"])) == 1


def test_error_log_from_a_real_verifier_exception(tmp_path):
    path = tmp_path / "verifier_errors.jsonl"
    result = score_serial([_item("t_boom"), _item("exact")], ["some completion", "1"])
    assert ErrorLog(path).record(0, [_item("t_boom"), _item("exact")], ["some completion", "1"], result) == 1
    (row,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert (row["type"], row["message"], row["item_id"], row["completion"]) == (
        "RuntimeError", "verifier bug", "t_boom", "some completion")


def test_error_stop_after_patience_failing_steps_in_a_row():
    stop = ErrorStop(path="w/verifier_errors.jsonl")  # default: every sample, 3 steps in a row
    assert [stop.update(8, 8), stop.update(8, 8), stop.update(7, 8), stop.update(8, 8), stop.update(8, 8)] == [
        False, False, False, False, False]  # the partly-failing step resets the count
    assert stop.update(8, 8) is True
    assert "w/verifier_errors.jsonl" in stop.message and "8/8" in stop.message and "3 steps" in stop.message
    half = ErrorStop(max_fraction=0.5, patience=1)
    assert half.update(3, 8) is False and half.update(4, 8) is True
    assert ErrorStop(patience=1).update(0, 0) is False  # an empty step never counts as failing
    for bad in [dict(max_fraction=0.0), dict(max_fraction=1.5), dict(patience=0)]:
        with pytest.raises(ValueError):
            ErrorStop(**bad)


def test_unknown_verifier_suggests_the_close_name(pool):
    with pytest.raises(ValueError, match="did you mean 'exact'") as info:
        pool.score([_item("exactt")], ["1"])
    assert "register_verifier('exactt'" in str(info.value)


_POOL_SCRIPT = """
from jaxrl_vr.tasks.arithmetic import make_items
from jaxrl_vr.verifiers import VerifierPool

def main():
    with VerifierPool(1, timeout_s=5.0, inline=(), start_method="{start_method}") as pool:
        print("statuses", pool.score(make_items(0, 2), ["1", "2"]).statuses)
"""


@pytest.mark.parametrize("guarded, start_method", [(False, "forkserver"), (False, "spawn"), (True, "forkserver")])
def test_script_without_main_guard_is_told_so(tmp_path, guarded, start_method):
    script = tmp_path / "user_script.py"
    script.write_text(_POOL_SCRIPT.format(start_method=start_method) + ('if __name__ == "__main__":\n    main()\n' if guarded else "main()\n"))
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": repo}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    if guarded:
        assert proc.returncode == 0, proc.stderr
        assert "statuses" in proc.stdout
    else:
        assert proc.returncode != 0
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("jaxrl_vr.verifiers.pool.MainGuardError:"), proc.stderr[-2000:]
        assert 'if __name__ == "__main__":' in last and str(script) in last
