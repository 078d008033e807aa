"""Scores (item, completion) pairs in killable worker processes with a per-item deadline.

Model output is untrusted input. Each item runs in a worker process; a worker that
passes the item's deadline is killed (SIGKILL) and replaced, so a hanging sympy call or
a C-level big-integer power cannot stall training. An exception scores 0 with status
"error", a deadline scores 0 with "timeout"; `score` never raises for an item's failure.
Counts per status are returned for the metrics. `submit` scores off the training thread.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import threading
import time
from collections.abc import Sequence

import numpy as np

from jaxrl_vr.verifiers import registry

__all__ = ["VerifyResult", "VerifierPool", "score_serial"]

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
      errors: N messages (None when the item did not fail) for debugging.
      elapsed_s: wall time of the batch.
    """

    scores: np.ndarray
    statuses: list[str]
    errors: list[str | None]
    elapsed_s: float = 0.0

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
        out[f"{prefix}items_per_s"] = len(self.statuses) / self.elapsed_s if self.elapsed_s > 0 else 0.0
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


def _run_one(fns: dict, item, completion: str, on_resolved=None) -> tuple[float, str, str | None]:
    """Scores one pair in the current process; any exception becomes status "error"."""
    try:
        if not callable(fns.get(item.verifier)):
            _resolve(fns, item.verifier)
            if on_resolved is not None:
                on_resolved()
        score, status = registry.normalize_output(fns[item.verifier](item, completion))
        return score, status, None
    except Exception as e:  # noqa: BLE001  (any verifier failure scores 0)
        return 0.0, "error", _describe(e)


def _worker_main(conn, fns: dict) -> None:
    """Worker loop: receive (index, item, completion), send ("result", index, score, status, error).

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
        score, status, error = _run_one(
            fns, item, completion, on_resolved=lambda: conn.send(("resolved", index, item.verifier)))
        conn.send(("result", index, score, status, error))


def score_serial(items: Sequence, completions: Sequence[str]) -> VerifyResult:
    """Scores in this process, one by one, with no deadline (reference and benchmark baseline)."""
    _check_batch(items, completions)
    start = time.perf_counter()
    fns: dict = {}
    results = [_run_one(fns, item, completion) for item, completion in zip(items, completions)]
    return VerifyResult(
        scores=np.asarray([r[0] for r in results], np.float32), statuses=[r[1] for r in results],
        errors=[r[2] for r in results], elapsed_s=time.perf_counter() - start)


def _check_batch(items: Sequence, completions: Sequence[str]) -> None:
    if len(items) != len(completions):
        raise ValueError(f"Got {len(items)} items but {len(completions)} completions; pass one completion per item.")
    known = registry.registered_verifiers()
    unknown = sorted({item.verifier for item in items if item.verifier not in known})
    if unknown:
        raise ValueError(f"Unknown verifier(s) {unknown}; registered: {sorted(known)}. "
                         "Register them with jaxrl_vr.verifiers.register_verifier(name, fn) before scoring.")
    for i, completion in enumerate(completions):
        if not isinstance(completion, str):
            raise TypeError(f"Completion {i} is a {type(completion).__name__}; decode completions to str first.")


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
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._workers: list[_Worker] = []
        starting = [self._spawn() for _ in range(self.num_workers)]  # start in parallel, then wait
        try:
            self._workers = [self._await_ready(worker) for worker in starting]
        except RuntimeError:
            for worker in starting:
                self._stop(worker)
            raise
        self.restarts = 0  # workers replaced after a timeout or crash, over the pool's life

    def _spawn(self) -> _Worker:
        parent_conn, child_conn = self._context.Pipe(duplex=True)
        process = self._context.Process(target=_worker_main, args=(child_conn, self._fns), daemon=True)
        process.start()
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
        pending = collections.deque()
        for index, (item, completion) in enumerate(zip(items, completions)):
            if item.verifier in self.inline:
                scores[index], statuses[index], errors[index] = _run_one(self._inline_fns, item, completion)
            else:
                pending.append(index)

        def settle(index: int, score: float, status: str, error: str | None) -> None:
            scores[index], statuses[index], errors[index] = score, status, error

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
                            fail_head(slot, "error", "worker died")
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
                            elapsed_s=time.perf_counter() - start)

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
                fail_head(slot, "error", f"worker died ({_describe(e)}, exit code {worker.process.exitcode})")
                return
            if index != worker.queue[0]:  # cannot happen with an in-order worker; be safe
                fail_head(slot, "error", "worker answered for another item")
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
