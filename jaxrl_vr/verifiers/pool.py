"""Scores (item, completion) pairs in killable worker processes with a per-item deadline.

Model output is untrusted input. Each item runs in a worker process; a worker that
passes the item's deadline is killed (SIGKILL) and replaced, so a hanging sympy call or
a C-level big-integer power cannot stall training. An exception scores 0 with status
"error", a deadline scores 0 with "timeout"; `score` never raises for an item's failure.
Counts per status are returned for the metrics. `submit` scores off the training thread.

Errors are never silent: `VerifyResult.errors[i]` holds "ExceptionType: message" for every
item with status "error". `ErrorLog` appends the first few of each step to a JSONL file
(type, message, item id, a truncated completion) and `ErrorStop` says when to stop a run
whose verifier fails on (nearly) every sample for several steps in a row.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import multiprocessing
import multiprocessing.connection
import os
import pickle
import re
import signal
import sys
import threading
import time
from collections.abc import Sequence

import numpy as np

from jaxrl_vr.verifiers import registry

__all__ = ["VerifyResult", "VerifierPool", "score_serial", "ErrorLog", "ErrorStop", "MainGuardError"]

# Messages queued to a busy worker must fit in the pipe buffer (64 KiB on Linux) together,
# or the send would block while that worker hangs: prefetch <= 4 messages of <= 16 KiB.
_PREFETCH_MAX_BYTES = 16 * 1024
_MAX_PREFETCH = 4
# Imported (and warmed up) once in the forkserver, so every fresh worker starts warm.
_PRELOAD = ("jaxrl_vr.verifiers.registry", "jaxrl_vr.verifiers.sandbox", "jaxrl_vr.verifiers._warm")


@dataclasses.dataclass
class VerifyResult:
    """Scores and statuses of a batch, in input order.

    Attributes:
      scores: float32 [N]; 0 wherever status is timeout / error / unparsable.
      statuses: N strings from registry.STATUSES.
      errors: N messages, None where the item did not fail; "ExceptionType: message" for
        status "error" (a worker that died: "WorkerDied: ..."), the limit for "timeout".
      elapsed_s: wall time of the batch.
      test_passed: N entries, each the item's per-test pass flags (a tuple of bools, from
        a test-based verifier such as "code" or "humaneval") or None (no per-test results:
        answer-checking verifiers, and items that errored or timed out in the pool). None
        for the whole batch when the scorer keeps no per-test results.
    """

    scores: np.ndarray
    statuses: list[str]
    errors: list[str | None]
    elapsed_s: float = 0.0
    test_passed: list[tuple[bool, ...] | None] | None = None

    def test_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """(tests passed, tests run): int32 [N] each; both 0 where an item has no per-test results.

        The fraction of tests passed of item i is passed[i] / run[i] where run[i] > 0.
        """
        flags = self.test_passed if self.test_passed is not None else [None] * len(self.statuses)
        passed = np.asarray([sum(f) if f else 0 for f in flags], np.int32).reshape(-1)
        total = np.asarray([len(f) if f else 0 for f in flags], np.int32).reshape(-1)
        return passed, total

    def counts(self) -> dict[str, int]:
        """Number of items per status (every status present, zeros included)."""
        counter = collections.Counter(self.statuses)
        return {status: counter.get(status, 0) for status in registry.STATUSES}

    def metrics(self, prefix: str = "verifier/") -> dict[str, float]:
        """Flat metrics: count and fraction per status, mean score, items per second."""
        n = max(len(self.statuses), 1)
        out = {}
        for status, count in self.counts().items():
            out[f"{prefix}num_{status}"] = float(count)
            out[f"{prefix}frac_{status}"] = count / n
        out[f"{prefix}mean_score"] = float(self.scores.mean()) if len(self.scores) else 0.0
        passed, total = self.test_counts()
        if total.any():  # test-based verifiers: mean fraction of tests passed over tested items
            tested = total > 0
            out[f"{prefix}test_pass_frac"] = float(np.mean(passed[tested] / total[tested]))
        out[f"{prefix}items_per_s"] = len(self.statuses) / self.elapsed_s if self.elapsed_s > 0 else 0.0
        return out

    def failures(self) -> list[tuple[int, str, str]]:
        """(index, exception type, message) of every item with status "error", in input order."""
        out = []
        for index, (status, error) in enumerate(zip(self.statuses, self.errors)):
            if status == "error":
                kind, sep, message = (error or "").partition(": ")
                if not sep or not re.fullmatch(r"[A-Za-z_][\w.]*", kind):
                    kind, message = "Error", error or ""
                out.append((index, kind, message))
        return out


def _describe(exc: BaseException) -> str:
    try:  # the message itself may be pathological (huge sympy objects)
        return f"{type(exc).__name__}: {str(exc)[:300]}"
    except Exception:  # noqa: BLE001
        return type(exc).__name__


def _resolve(fns: dict, name: str):
    """The callable for verifier `name`, imported and warmed up on first use in this process.

    A verifier may carry a `warmup()` attribute (first-call costs such as compiling a
    parser); it runs here, outside the item's deadline.
    """
    fn = fns.get(name)
    if not callable(fn):  # pickled, an import path, or a name registered later: load once per process
        if isinstance(fn, bytes):
            fn = pickle.loads(fn)
        else:
            fn = registry._resolve(name, fn) if fn else registry.get_verifier(name)
        warmup = getattr(fn, "warmup", None)
        if callable(warmup):
            warmup()
        fns[name] = fn
    return fn


def _run_one(fns: dict, item, completion: str, on_resolved=None
             ) -> tuple[float, str, str | None, tuple[bool, ...] | None]:
    """(score, status, error, test_passed) of one pair in the current process; any exception
    becomes status "error"."""
    try:
        if not callable(fns.get(item.verifier)):
            _resolve(fns, item.verifier)
            if on_resolved is not None:
                on_resolved()
        score, status, test_passed = registry.normalize_verdict(fns[item.verifier](item, completion))
        return score, status, None, test_passed
    except Exception as e:  # noqa: BLE001  (any verifier failure scores 0)
        return 0.0, "error", _describe(e), None


def _worker_main(conn, fns: dict) -> None:
    """Worker loop: receive (index, item, completion), send ("result", index, score, status, error,
    test_passed).

    It first sends ("ready", -1). Before the first item of a verifier it sends ("resolved",
    index, name) once the verifier is unpickled or imported and warmed up, so the item's
    deadline starts only then.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when workers stop
    conn.send(("ready", -1))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        index, item, completion = message
        score, status, error, test_passed = _run_one(
            fns, item, completion, on_resolved=lambda: conn.send(("resolved", index, item.verifier)))
        conn.send(("result", index, score, status, error, test_passed))


def score_serial(items: Sequence, completions: Sequence[str]) -> VerifyResult:
    """Scores in this process, one by one, with no deadline (reference and benchmark baseline)."""
    _check_batch(items, completions)
    start = time.perf_counter()
    fns: dict = {}
    results = [_run_one(fns, item, completion) for item, completion in zip(items, completions)]
    return VerifyResult(
        scores=np.asarray([r[0] for r in results], np.float32), statuses=[r[1] for r in results],
        errors=[r[2] for r in results], elapsed_s=time.perf_counter() - start,
        test_passed=[r[3] for r in results])


def _check_batch(items: Sequence, completions: Sequence[str]) -> None:
    if len(items) != len(completions):
        raise ValueError(f"Got {len(items)} items but {len(completions)} completions; pass one completion per item.")
    known = registry.registered_verifiers()
    unknown = sorted({str(item.verifier) for item in items if item.verifier not in known})
    if unknown:
        also = f" Also unknown: {unknown[1:]}." if len(unknown) > 1 else ""
        raise ValueError(registry.unknown_verifier_message(unknown[0]) + also)
    for i, completion in enumerate(completions):
        if not isinstance(completion, str):
            raise TypeError(f"Completion {i} is a {type(completion).__name__}; decode completions to str first.")


class MainGuardError(RuntimeError):
    """A VerifierPool was created at import time of a script that worker processes re-import."""


_GUARD_PATTERN = re.compile(r"""^if\s+__name__\s*==\s*['"]__main__['"]\s*:""", re.MULTILINE)


def _main_script() -> str | None:
    """Path of the script run as `python script.py` / `python -m module`, if any.

    In a worker that is still re-importing it, the script runs as "__mp_main__".
    """
    main = sys.modules.get("__mp_main__") if _bootstrapping() else None
    main = main or sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not isinstance(path, str) or not path.endswith(".py") or os.path.basename(path) == "__main__.py":
        return None  # notebooks, -c, and package __main__ modules (multiprocessing skips those)
    return os.path.abspath(path)


def _main_guard_message(script: str | None) -> str:
    where = script or "your main script"
    return (f"A VerifierPool was started while {where} was being imported by a new worker process: the "
            "script creates the pool at module level. With start_method 'forkserver' or 'spawn', every "
            "worker re-imports the main script, so put the code that creates and uses the pool under "
            f'`if __name__ == "__main__":` in {where} (or inside a function called from there).')


def _script_lacks_guard() -> str | None:
    """The main script's path when it has no `if __name__ == "__main__":` line, else None."""
    script = _main_script()
    if script is None:
        return None
    try:
        with open(script, encoding="utf-8", errors="replace") as f:
            source = f.read()
    except OSError:
        return None
    return None if _GUARD_PATTERN.search(source) else script


def _bootstrapping() -> bool:
    """True inside a child process that is still importing the parent's main script."""
    return bool(getattr(multiprocessing.process.current_process(), "_inheriting", False))


@dataclasses.dataclass
class _Worker:
    process: multiprocessing.Process
    conn: multiprocessing.connection.Connection
    queue: collections.deque = dataclasses.field(default_factory=collections.deque)  # sent, unanswered items
    deadline: float = 0.0  # for the item at the head of the queue (the one being worked on)
    resolved: set = dataclasses.field(default_factory=set)  # verifiers it has imported and warmed up


class VerifierPool:
    """A pool of killable verifier processes with a per-item deadline.

    Args:
      num_workers: worker processes (default: CPU count).
      timeout_s: per-item wall-clock limit. An item whose `meta["timeout_s"]` is set (code
        items) gets max(timeout_s, meta["timeout_s"] + 2 s) so its sandbox can finish first.
      start_method: "forkserver" (default: workers fork from a clean server process that
        has preloaded the verifiers, safe next to JAX threads), "spawn" or "fork".
      preload: extra modules the forkserver imports once (e.g. ("reasoning_gym",)), so
        fresh workers do not pay the import.
      resolve_timeout_s: limit for importing and warming up a verifier in a fresh worker,
        which does not count against the first item's deadline.
      prefetch: items sent ahead to each worker (hides the round-trip latency); the
        deadline of an item starts when its worker starts on it.
      inline: verifiers trusted to be fast and bounded, run in the calling thread without
        a worker round trip (default: the built-in "exact", which reads at most 8 KiB of
        a completion). Exceptions still score 0 with status "error"; there is no deadline.

    The registry is snapshotted at construction: register user verifiers before creating
    the pool. Use as a context manager or call `close()`. As with any multiprocessing pool,
    a script run as `python script.py` needs the `if __name__ == "__main__":` guard (the
    forkserver imports the main script); `python -m module` and notebooks do not.
    Verifiers defined in a notebook cannot be loaded by forkserver workers: register them
    from a module, or use start_method="fork" (before JAX starts threads) or `inline=`.
    """

    def __init__(self, num_workers: int | None = None, timeout_s: float = 5.0, *,
                 start_method: str = "forkserver", preload: Sequence[str] = (), resolve_timeout_s: float = 120.0,
                 prefetch: int = 2, inline: Sequence[str] = ("exact",)):
        self._workers: list[_Worker] = []
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        if _bootstrapping():  # we are a worker re-importing a script that builds a pool at module level
            raise MainGuardError(_main_guard_message(_main_script()))
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}.")
        self.num_workers = int(num_workers or os.cpu_count() or 1)
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}.")
        self.timeout_s = float(timeout_s)
        self.resolve_timeout_s = float(resolve_timeout_s)
        if not 1 <= prefetch <= _MAX_PREFETCH:
            raise ValueError(f"prefetch must lie in [1, {_MAX_PREFETCH}], got {prefetch}.")
        self.prefetch = int(prefetch)
        self.inline = frozenset(inline)
        self._inline_fns = registry.registered_verifiers()
        self._context = multiprocessing.get_context(start_method)
        if start_method == "forkserver":
            self._context.set_forkserver_preload(list(_PRELOAD) + list(preload))
        # What workers get: import paths as they are, callables pickled one by one (a worker
        # unpickles one when first needed, so a verifier that fails to load fails only its items).
        self._fns: dict = {}
        self._unsendable: dict[str, str] = {}  # name -> why it cannot reach the workers
        for name, fn in registry.registered_verifiers().items():
            if isinstance(fn, str) or start_method == "fork":
                self._fns[name] = fn
                continue
            try:
                self._fns[name] = pickle.dumps(fn)
            except Exception as e:  # noqa: BLE001
                self._unsendable[name] = (
                    f"Verifier {name!r} cannot be sent to '{start_method}' workers ({_describe(e)}). Define "
                    "it at module level, register it as a 'module:function' path, or use start_method='fork'.")
        self._lock = threading.Lock()
        starting = []
        try:
            for _ in range(self.num_workers):  # start in parallel, then wait
                starting.append(self._spawn())
            self._workers = [self._await_ready(worker) for worker in starting]
        except RuntimeError as err:
            for worker in starting:
                self._stop(worker)
            if isinstance(err, MainGuardError):
                raise
            if start_method != "fork":
                script = _script_lacks_guard()
                if script is not None:  # the workers died re-importing it (their stderr shows why)
                    raise MainGuardError(_main_guard_message(script)) from None
            raise
        self.restarts = 0  # workers replaced after a timeout or crash, over the pool's life

    def _spawn(self) -> _Worker:
        parent_conn, child_conn = self._context.Pipe(duplex=True)
        process = self._context.Process(target=_worker_main, args=(child_conn, self._fns), daemon=True)
        try:
            process.start()
        except RuntimeError as err:
            if "bootstrapping phase" in str(err):  # multiprocessing's own wording for a missing guard
                raise MainGuardError(_main_guard_message(_main_script())) from None
            raise
        child_conn.close()
        return _Worker(process, parent_conn)

    def _await_ready(self, worker: _Worker) -> _Worker:
        """Waits for the worker's "ready" so its start-up never counts against an item's deadline."""
        problem = None
        try:
            if worker.conn.poll(self.resolve_timeout_s):
                if worker.conn.recv() == ("ready", -1):
                    return worker
                problem = "sent something other than 'ready'"
            else:
                problem = f"was not ready after {self.resolve_timeout_s} s"
        except (EOFError, OSError) as e:
            worker.process.join(timeout=5.0)
            problem = f"died while starting ({_describe(e)}, exit code {worker.process.exitcode})"
        self._stop(worker)
        raise RuntimeError(f"A verifier worker {problem}. A registered verifier may fail to unpickle or import "
                           "in a fresh process; check that its module imports cleanly on its own.")

    def _start_worker(self) -> _Worker:
        for attempt in range(3):
            try:
                return self._await_ready(self._spawn())
            except RuntimeError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    @staticmethod
    def _stop(worker: _Worker) -> None:
        if worker.conn.closed:
            return
        if worker.process.is_alive():
            os.kill(worker.process.pid, signal.SIGKILL)
        worker.process.join(timeout=5.0)
        worker.conn.close()

    def _replace(self, slot: int) -> None:
        self._stop(self._workers[slot])
        self._workers[slot] = self._start_worker()
        self.restarts += 1

    def _deadline_s(self, item) -> float:
        item_timeout = item.meta.get("timeout_s") if isinstance(item.meta, dict) else None
        return max(self.timeout_s, float(item_timeout) + 2.0) if item_timeout else self.timeout_s

    def _check(self, items: Sequence, completions: Sequence[str]) -> None:
        _check_batch(items, completions)
        for name in sorted({item.verifier for item in items} & set(self._unsendable)):
            raise TypeError(self._unsendable[name])

    def score(self, items: Sequence, completions: Sequence[str]) -> VerifyResult:
        """Scores every pair; item failures give score 0 and a status, never an exception."""
        self._check(items, completions)
        with self._lock:
            return self._score(items, completions)

    def submit(self, items: Sequence, completions: Sequence[str]) -> concurrent.futures.Future:
        """Scores in a background thread; returns a Future of the VerifyResult."""
        self._check(items, completions)
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="verifier-pool")
        return self._executor.submit(self.score, list(items), list(completions))

    def _score(self, items: Sequence, completions: Sequence[str]) -> VerifyResult:
        start = time.perf_counter()
        n = len(items)
        scores = np.zeros([n], np.float32)
        statuses = ["error"] * n
        errors: list[str | None] = [None] * n
        test_passed: list[tuple[bool, ...] | None] = [None] * n
        pending = collections.deque()

        def settle(index: int, score: float, status: str, error: str | None,
                   tests: tuple[bool, ...] | None = None) -> None:
            scores[index], statuses[index], errors[index], test_passed[index] = score, status, error, tests

        for index, (item, completion) in enumerate(zip(items, completions)):
            if item.verifier in self.inline:
                settle(index, *_run_one(self._inline_fns, item, completion))
            else:
                pending.append(index)

        def start_head(worker: _Worker) -> None:
            """Starts the deadline of the item the worker is now on (the head of its queue)."""
            if worker.queue:
                item = items[worker.queue[0]]
                limit_s = self._deadline_s(item)
                if item.verifier not in worker.resolved:
                    limit_s += self.resolve_timeout_s  # cut back once the worker reports "resolved"
                worker.deadline = time.monotonic() + limit_s

        def fail_head(slot: int, status: str, error: str) -> None:
            """Scores the worker's current item, requeues the items behind it, replaces the worker."""
            worker = self._workers[slot]
            settle(worker.queue.popleft(), 0.0, status, error)
            pending.extendleft(reversed(worker.queue))
            worker.queue.clear()
            self._replace(slot)

        while pending or any(w.queue for w in self._workers):
            for slot in range(len(self._workers)):
                worker = self._workers[slot]
                while pending and len(worker.queue) < self.prefetch:
                    index = pending[0]
                    try:
                        message = pickle.dumps((index, items[index], completions[index]), pickle.HIGHEST_PROTOCOL)
                    except Exception as e:  # noqa: BLE001  (an item that cannot be pickled)
                        settle(pending.popleft(), 0.0, "error", _describe(e))
                        continue
                    if worker.queue and len(message) > _PREFETCH_MAX_BYTES:
                        break  # a busy worker does not read: a large message waits until it is idle
                    try:
                        worker.conn.send_bytes(message)
                    except (BrokenPipeError, EOFError, OSError):
                        if worker.queue:  # it died while working: its head item crashed it
                            fail_head(slot, "error", "WorkerDied: worker died while scoring this item")
                        else:
                            self._replace(slot)
                        break
                    pending.popleft()
                    worker.queue.append(index)
                    if len(worker.queue) == 1:
                        start_head(worker)
            busy = [slot for slot, w in enumerate(self._workers) if w.queue]
            if not busy:
                continue
            wait_s = max(0.0, min(self._workers[s].deadline for s in busy) - time.monotonic())
            ready = multiprocessing.connection.wait([self._workers[s].conn for s in busy], timeout=wait_s)
            for slot in busy:
                worker = self._workers[slot]
                if worker.conn in ready:
                    self._drain(slot, items, settle, start_head, fail_head)
                elif time.monotonic() >= worker.deadline and not worker.conn.poll():  # none came in late
                    limit_s = self._deadline_s(items[worker.queue[0]])
                    fail_head(slot, "timeout", f"killed after {limit_s:.1f} s")
        return VerifyResult(scores=scores, statuses=statuses, errors=errors,
                            elapsed_s=time.perf_counter() - start, test_passed=test_passed)

    def _drain(self, slot: int, items: Sequence, settle, start_head, fail_head) -> None:
        """Handles every message the worker has sent."""
        worker = self._workers[slot]
        while worker.queue:
            try:
                if not worker.conn.poll():
                    return
                kind, index, *payload = worker.conn.recv()
            except (EOFError, OSError) as e:  # the worker crashed (segfault, OOM kill, os._exit)
                worker.process.join(timeout=1.0)
                fail_head(slot, "error",
                          f"WorkerDied: worker died ({_describe(e)}, exit code {worker.process.exitcode})")
                return
            if index != worker.queue[0]:  # cannot happen with an in-order worker; be safe
                fail_head(slot, "error", "PoolError: worker answered for another item")
                return
            if kind == "resolved":
                worker.resolved.add(payload[0])
                worker.deadline = time.monotonic() + self._deadline_s(items[index])
                continue
            settle(worker.queue.popleft(), *payload)
            start_head(worker)

    def close(self) -> None:
        """Stops the workers (politely, then SIGKILL) and the background thread."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        for worker in self._workers:
            try:
                worker.conn.send(None)
            except Exception:  # noqa: BLE001
                pass
        for worker in self._workers:
            worker.process.join(timeout=1.0)
            if worker.process.is_alive():
                os.kill(worker.process.pid, signal.SIGKILL)
                worker.process.join(timeout=5.0)
            worker.conn.close()
        self._workers = []

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            if self._workers:
                self.close()
        except Exception:  # noqa: BLE001
            pass


class ErrorLog:
    """Appends the first verifier errors of each step to a JSON-lines file.

    One row per logged error: {"step", "index", "item_id", "verifier", "type", "message",
    "completion"} with the completion cut to `max_completion_chars`. At most
    `max_per_step` rows per step, so a verifier that fails on everything cannot fill the disk.

    Args:
      path: the file (e.g. `<workdir>/verifier_errors.jsonl`); its directory is created.
      max_per_step: rows written per step (the rest are only counted).
      max_completion_chars: characters of the completion kept in a row.
      resume_step: when resuming, rows with step > resume_step (written by the part of the
        run that is replayed) are dropped first, so no error is logged twice.
    """

    def __init__(self, path: str | os.PathLike, *, max_per_step: int = 5, max_completion_chars: int = 500,
                 resume_step: int | None = None):
        if max_per_step < 0 or max_completion_chars < 0:
            raise ValueError(f"max_per_step ({max_per_step}) and max_completion_chars ({max_completion_chars}) "
                             "must be >= 0.")
        self.path = os.fspath(path)
        self.max_per_step = int(max_per_step)
        self.max_completion_chars = int(max_completion_chars)
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        if resume_step is not None and os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as f:
                rows = [line for line in f if line.strip()]
            keep = []
            for line in rows:
                try:
                    if int(json.loads(line).get("step", 0)) <= resume_step:
                        keep.append(line)
                except (ValueError, AttributeError):
                    pass  # a row torn by a kill: drop it
            with open(self.path, "w", encoding="utf-8") as f:
                f.writelines(keep)

    def record(self, step: int, items: Sequence, completions: Sequence[str], result: VerifyResult) -> int:
        """Writes the step's first `max_per_step` errors; returns how many items errored."""
        failures = result.failures()
        if failures and self.max_per_step:
            with open(self.path, "a", encoding="utf-8") as f:
                for index, kind, message in failures[: self.max_per_step]:
                    item = items[index]
                    completion = completions[index]
                    if isinstance(completion, str) and len(completion) > self.max_completion_chars:
                        completion = completion[: self.max_completion_chars] + f"...[{len(completion)} chars]"
                    row = {"step": int(step), "index": index, "item_id": str(getattr(item, "uid", index)),
                           "verifier": str(getattr(item, "verifier", "")), "type": kind, "message": message,
                           "completion": completion if isinstance(completion, str) else repr(completion)[:200]}
                    f.write(json.dumps(row) + "\n")
        return len(failures)


class ErrorStop:
    """Stop rule: verifier errors in >= `max_fraction` of a step's samples, `patience` steps in a row.

    The default (1.0, 3) stops a run whose verifier fails on every sample for three
    consecutive steps: it would otherwise train on all-zero rewards. A step with fewer
    erroring samples resets the count.

    Args:
      max_fraction: fraction of a step's samples in (0, 1] that counts as a failing step.
      patience: failing steps in a row that stop the run (>= 1).
      path: the error log (named in the message).
    """

    def __init__(self, max_fraction: float = 1.0, patience: int = 3, *, path: str | os.PathLike | None = None):
        if not 0.0 < max_fraction <= 1.0:
            raise ValueError(f"max_fraction must lie in (0, 1], got {max_fraction}.")
        if patience < 1:
            raise ValueError(f"patience must be >= 1, got {patience}.")
        self.max_fraction = float(max_fraction)
        self.patience = int(patience)
        self.path = None if path is None else os.fspath(path)
        self.failing_steps = 0  # consecutive steps at or above max_fraction
        self._last = (0, 0)

    def update(self, num_errors: int, num_samples: int) -> bool:
        """Counts one step; True when the run should stop now."""
        failing = num_samples > 0 and num_errors > 0 and num_errors >= self.max_fraction * num_samples
        self.failing_steps = self.failing_steps + 1 if failing else 0
        self._last = (int(num_errors), int(num_samples))
        return self.failing_steps >= self.patience

    @property
    def message(self) -> str:
        """Why the run stopped: the rule, the last step's counts and where the errors are."""
        errors, samples = self._last
        where = f"the first errors of each step are in {self.path}" if self.path else "see VerifyResult.errors"
        return (f"the verifier raised on {errors}/{samples} samples of the last step and on >= "
                f"{self.max_fraction:.0%} of the samples for {self.failing_steps} steps in a row; {where}. Fix "
                "the verifier (or the task's answers) and rerun the same command: it resumes from the last "
                "checkpoint.")
