"""VerifierPool: deadlines, crashes and bad verifiers never stop scoring."""

import os
import sys
import time
import types

import numpy as np
import pytest

from jaxrl_vr.tasks.arithmetic import make_items
from jaxrl_vr.tasks.base import TaskItem
from jaxrl_vr.verifiers import VerifierPool, register_verifier, score_serial


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
    assert "verifier bug" in result.errors[2] and "worker died" in result.errors[3]
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
