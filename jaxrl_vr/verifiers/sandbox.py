"""Runs untrusted Python programs against assert-style tests, contained.

`run_python(program, tests, timeout_s=...)` executes `program` in a fresh interpreter,
then each test snippet in a forked copy of the program's namespace, so a failing,
crashing or hanging test neither hides nor breaks the others. Containment layers:

* a separate process in its own session, killed with its whole process group at the
  deadline;
* rlimits: CPU seconds, address space, file size, processes, open files, no core dumps;
* when running as root: a fresh unprivileged uid per run (so RLIMIT_NPROC applies and
  the uid can write nowhere but its working directory), and every process of that uid is
  killed at the end, which reaps daemons that left the process group;
* a new network namespace when the kernel allows it (no interfaces, no loopback);
* inside the interpreter, an audit hook (PEP 578) that refuses sockets, ctypes,
  exec/spawn/system, signals to other processes, writes outside the working directory and
  reads of /proc of other processes: the portable fallback when namespaces or uid
  switching are not available;
* an empty environment, a fresh temporary working directory, stdin closed.

Threat model: the program is contained, but it runs in the same interpreter that reports
the results, so a program written to forge the result channel could do so; tests are
counted only when the runner reports them, so exiting early (os._exit(0), sys.exit)
counts every unreported test as failed.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

from jaxrl_vr.verifiers.registry import Verdict

__all__ = ["CodeResult", "run_python", "code_verdict", "code_verifier", "extract_program", "sandbox_capabilities"]

_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1
_OUTPUT_TAIL_CHARS = 2000

# Runs inside the sandbox (via `python -I -c`). Reads {"program", "tests", "timeout_s", "fd"}
# as JSON from stdin, writes one line per event to descriptor "fd": "syntax", "program ok|error <name>",
# "test <i> pass|fail|timeout".
_RUNNER = r'''
import json, os, sys, time
_start = time.monotonic()
_payload = json.loads(sys.stdin.read())
sys.stdin.close()
sys.stdin = open(os.devnull)
_fd = int(_payload["fd"])
def _report(line):
    os.write(_fd, (line + "\n").encode())

def _install_audit_hook(workdir):
    import os.path as osp
    workdir = osp.realpath(workdir)
    killable = set()  # pids the runner may kill: its test processes
    blocked = {"socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.sendto",
               "socket.sendmsg", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "os.system", "os.exec",
               "os.posix_spawn", "os.spawn", "subprocess.Popen", "os.startfile", "pty.spawn", "os.forkpty",
               "os.setuid", "os.setgid", "os.setresuid", "os.setresgid", "sys.remote_exec"}
    path_writes = {"os.rename": 2, "os.replace": 2, "os.remove": 1, "os.unlink": 1, "os.rmdir": 1, "os.mkdir": 1,
                   "os.symlink": 2, "os.link": 2, "os.truncate": 1, "os.chmod": 1, "os.chown": 1, "os.utime": 1,
                   "os.mkfifo": 1, "os.mknod": 1, "shutil.rmtree": 1, "shutil.copyfile": 2, "shutil.move": 2}
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    busy = []

    def inside(path):
        if isinstance(path, int):
            return True  # an already open descriptor
        if isinstance(path, bytes):
            path = path.decode(errors="replace")
        real = osp.realpath(os.fspath(path))  # relative paths resolve against the current directory
        return real == workdir or real.startswith(workdir + os.sep) or real == os.devnull

    def hook(event, args):
        if busy:
            return
        busy.append(1)
        try:
            if event in blocked:
                raise PermissionError(f"sandbox: {event} is not allowed")
            if event == "open":
                path, mode, flags = args
                if path is None:
                    return
                writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                    isinstance(flags, int) and flags & write_flags)
                if writing and not inside(path):
                    raise PermissionError(f"sandbox: writing {path!r} outside the working directory")
                if isinstance(path, (str, bytes)):
                    text = path.decode(errors="replace") if isinstance(path, bytes) else path
                    parts = osp.realpath(text).split(os.sep)
                    if len(parts) > 2 and parts[1] == "proc" and parts[2] not in ("self", "thread-self", str(os.getpid())):
                        raise PermissionError(f"sandbox: reading {text!r} is not allowed")
            elif event in path_writes:
                for path in args[:path_writes[event]]:
                    if not inside(path):
                        raise PermissionError(f"sandbox: {event} outside the working directory")
            elif event in ("os.kill", "os.killpg"):
                if event == "os.killpg" or (args[0] != os.getpid() and args[0] not in killable):
                    raise PermissionError(f"sandbox: {event} is not allowed")
        finally:
            busy.pop()

    sys.addaudithook(hook)
    return killable

_killable = _install_audit_hook(os.getcwd())
_ns = {"__name__": "__main__", "__builtins__": __builtins__}
_deadline = _start + float(_payload["timeout_s"]) - 0.05
try:
    _code = compile(_payload["program"], "<program>", "exec")
except BaseException as _e:
    _report("syntax")
    sys.stderr.write(f"{type(_e).__name__}: {_e}"[:500] + "\n")
    _code = None
_runner_pid = os.getpid()
if _code is not None:
    try:
        exec(_code, _ns)
        _outcome = "program ok"
    except BaseException as _e:
        _outcome = "program error " + type(_e).__name__
        sys.stderr.write(f"{type(_e).__name__}: {_e}"[:500] + "\n")
    if os.getpid() != _runner_pid:
        os._exit(0)  # a process the program forked: it must not run the tests or report
    _report(_outcome)
_tests = _payload["tests"]
for _i, _test in enumerate(_tests):
    _budget = max(0.05, (_deadline - time.monotonic()) / (len(_tests) - _i))
    _read_end = _write_end = None
    try:
        sys.stdout.flush(); sys.stderr.flush()
        _read_end, _write_end = os.pipe()
        _pid = os.fork()
    except BaseException:
        _pid = None  # no process or descriptor left: run the test here
        for _end_fd in (_read_end, _write_end):
            if _end_fd is not None:
                os.close(_end_fd)
    if _pid == 0:
        # Pass = this process writes "P" after the snippet returns; exiting early (os._exit(0)
        # inside a program function) is a failure, whatever the exit code.
        os.close(_fd); os.close(_read_end)
        _test_pid = os.getpid()
        try:
            exec(compile(_test, f"<test {_i}>", "exec"), _ns)
            if os.getpid() == _test_pid:  # not a process the snippet forked
                os.write(_write_end, b"P")
        except BaseException:
            pass
        try:
            sys.stdout.flush(); sys.stderr.flush()
        finally:
            os._exit(0)
    if _pid is not None:
        _killable.add(_pid)
    if _pid is None:
        try:
            exec(compile(_test, f"<test {_i}>", "exec"), _ns)
            _report(f"test {_i} pass")
        except BaseException:
            _report(f"test {_i} fail")
        continue
    os.close(_write_end)
    _end = time.monotonic() + _budget
    _status = None
    while _status is None:
        _done, _code_status = os.waitpid(_pid, os.WNOHANG)
        if _done:
            os.set_blocking(_read_end, False)
            try:
                _mark = os.read(_read_end, 1)
            except BlockingIOError:
                _mark = b""  # a grandchild of the test still holds the pipe without writing
            _status = "pass" if _mark == b"P" else "fail"
        elif time.monotonic() > _end:
            os.kill(_pid, 9)
            os.waitpid(_pid, 0)
            _status = "timeout"
        else:
            time.sleep(0.001)
    os.close(_read_end)
    _report(f"test {_i} {_status}")
sys.stdout.flush(); sys.stderr.flush()
os._exit(0)
'''


@dataclasses.dataclass(frozen=True)
class CodeResult:
    """Outcome of `run_python`.

    Attributes:
      passed: tests that passed.
      total: tests given.
      status: "ok" (all passed), "wrong" (some failed), "timeout" (the deadline cut the run),
        "unparsable" (the program has a syntax error) or "error" (the sandbox could not run).
      test_passed: per-test pass flags (a test never reported counts as failed).
      program_error: exception type name raised by the program itself, else None.
      stdout, stderr: the last characters of each stream.
      elapsed_s: wall time.
    """

    passed: int
    total: int
    status: str
    test_passed: tuple[bool, ...]
    program_error: str | None = None
    stdout: str = ""
    stderr: str = ""
    elapsed_s: float = 0.0


# Loaded here, never between fork and exec (dlopen there could deadlock).
_libc = ctypes.CDLL(None, use_errno=True)


def _unshare_network() -> bool:
    return _libc.unshare(_CLONE_NEWNET) == 0


def _make_preexec(uid: int | None, *, cpu_s: int, memory_bytes: int, file_bytes: int, max_procs: int,
                  network_namespace: bool, require_network_namespace: bool):
    """The function run in the child between fork and exec (only async-signal-safe-ish calls)."""

    def preexec() -> None:
        if network_namespace and not _unshare_network() and require_network_namespace:
            raise OSError("unshare(CLONE_NEWNET) refused")
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NPROC, (max_procs, max_procs))
        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after setuid, which clears it

    return preexec


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


@functools.lru_cache(maxsize=1)
def sandbox_capabilities() -> dict:
    """Which containment layers this machine allows (probed once per process).

    Returns {"python": interpreter used, "uid_switch": bool, "network_namespace": bool}.
    As root the interpreter must be executable by an unprivileged uid: the current one
    is tried first, then /usr/bin/python3.
    """
    candidates = [sys.executable] + [p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.path.exists(p)]
    uid = _fresh_uid() if _is_root() else None  # from the range real runs use
    for require_netns in (True, False):
        for python in candidates:
            try:
                preexec = _make_preexec(uid, cpu_s=5, memory_bytes=1 << 30, file_bytes=1 << 20,
                                        max_procs=_process_limit(uid, 8), network_namespace=True,
                                        require_network_namespace=require_netns)
                done = subprocess.run([python, "-I", "-S", "-c", "import json, os, sys"], env={}, cwd="/",
                                      preexec_fn=preexec, capture_output=True, timeout=30)
            except (OSError, subprocess.SubprocessError):
                continue
            if done.returncode == 0:
                return {"python": python, "uid_switch": uid is not None, "network_namespace": require_netns}
    # No interpreter runs under another uid: only rlimits, the process group and the audit hook.
    return {"python": sys.executable, "uid_switch": False, "network_namespace": False}


_uid_lock = threading.Lock()


def _process_limit(uid: int | None, max_procs: int) -> int:
    """RLIMIT_NPROC for a run: `max_procs` for a fresh uid; else on top of what the user runs now.

    The kernel counts every task (thread) of the real uid, so without a fresh uid the
    limit must include the tasks this user already has.
    """
    if uid is not None:
        return max_procs
    own_uid, tasks = str(os.getuid()), 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as f:
                    fields = dict(line.split(":", 1) for line in f if ":" in line)
            except OSError:
                continue
            if fields.get("Uid", "").split()[:1] == [own_uid]:
                tasks += int(fields.get("Threads", "1"))
    return tasks + max_procs


def _fresh_uid() -> int:
    """A uid no other live run uses (random in a range no real account uses)."""
    with _uid_lock:
        return random.SystemRandom().randrange(3_000_000, 2_000_000_000)


def _kill_uid(uid: int) -> None:
    """SIGKILLs every process of `uid` (kill(-1) as that uid never signals the caller itself)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            for _ in range(1000):  # a fork bomb may refill between rounds; NPROC bounds it
                try:
                    os.kill(-1, signal.SIGKILL)
                except ProcessLookupError:
                    break
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _read_tail(path: str) -> str:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 4 * _OUTPUT_TAIL_CHARS))
        return f.read().decode("utf-8", errors="replace")[-_OUTPUT_TAIL_CHARS:]


def run_python(program: str, tests: Sequence[str], *, timeout_s: float, memory_mb: int = 1024,
               max_file_mb: int = 16, max_procs: int = 32) -> CodeResult:
    """Runs `program` then each test snippet (usually one assert) in a sandbox.

    Args:
      program: Python source, untrusted.
      tests: snippets run one by one after the program, each in a fork of its namespace;
        a test passes when it finishes without an exception.
      timeout_s: wall-clock limit for the whole run; the process group (and, as root, every
        process of the run's uid) is killed at the deadline. Each test gets an equal share
        of the time left when it starts.
      memory_mb: address-space limit per process.
      max_file_mb: largest file a process may write.
      max_procs: processes the run may have at once (RLIMIT_NPROC; exact as root, where the
        run has a uid of its own, else added to the tasks the user already runs).

    Returns:
      CodeResult; the call itself raises only for invalid arguments.
    """
    if not isinstance(program, str) or isinstance(tests, str) or not all(isinstance(t, str) for t in tests):
        raise TypeError("run_python needs program: str and tests: a sequence of str.")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}.")
    tests = list(tests)
    capabilities = sandbox_capabilities()
    uid = _fresh_uid() if capabilities["uid_switch"] else None
    start = time.monotonic()
    io_dir = tempfile.mkdtemp(prefix="jaxrl_sandbox_io_")  # ours: payload and outputs, never visible by path
    workdir = tempfile.mkdtemp(prefix="jaxrl_sandbox_")
    process = None
    try:
        if uid is not None:
            os.chown(workdir, uid, uid)
        os.chmod(workdir, 0o700)
        paths = {name: os.path.join(io_dir, name) for name in ("payload", "stdout", "stderr", "results")}
        files = {name: open(paths[name], "wb") for name in ("stdout", "stderr", "results")}
        try:
            results_fd = files["results"].fileno()
            with open(paths["payload"], "w") as f:
                json.dump({"program": program, "tests": tests, "timeout_s": timeout_s, "fd": results_fd}, f)
            files["payload"] = open(paths["payload"], "rb")
            preexec = _make_preexec(
                uid, cpu_s=max(1, int(timeout_s) + 1), memory_bytes=memory_mb << 20,
                file_bytes=max_file_mb << 20, max_procs=_process_limit(uid, max_procs),
                network_namespace=capabilities["network_namespace"], require_network_namespace=False)
            process = subprocess.Popen(
                [capabilities["python"], "-I", "-S", "-c", _RUNNER], stdin=files["payload"], stdout=files["stdout"],
                stderr=files["stderr"], cwd=workdir, env={}, start_new_session=True, preexec_fn=preexec,
                pass_fds=(results_fd,), close_fds=True)
        finally:
            for f in files.values():
                f.close()
        timed_out = False
        try:
            process.wait(timeout=max(0.0, timeout_s - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            timed_out = True
        _kill_run(process, uid)
        with open(paths["results"], encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
        stdout, stderr = _read_tail(paths["stdout"]), _read_tail(paths["stderr"])
    except (OSError, subprocess.SubprocessError) as e:  # the sandbox itself failed: not the program's fault
        if process is not None:
            _kill_run(process, uid)
        return CodeResult(0, len(tests), "error", (False,) * len(tests), stderr=f"sandbox failure: {e}",
                          elapsed_s=time.monotonic() - start)
    finally:
        shutil.rmtree(io_dir, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)
    return _collect(lines, len(tests), timed_out, stdout, stderr, time.monotonic() - start)


def _kill_run(process: subprocess.Popen, uid: int | None) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if uid is not None:
        _kill_uid(uid)
    process.wait()


def _collect(lines: list[str], total: int, timed_out: bool, stdout: str, stderr: str, elapsed_s: float) -> CodeResult:
    test_passed = [False] * total
    reported = 0
    syntax_error, program_error, program_ended = False, None, False
    for line in lines:
        fields = line.split()
        if fields[:1] == ["syntax"]:
            syntax_error = True
        elif fields[:1] == ["program"]:
            program_ended = True
            if fields[1:2] == ["error"] and len(fields) == 3:
                program_error = fields[2]
        elif len(fields) == 3 and fields[0] == "test" and fields[1].isdigit() and int(fields[1]) < total:
            test_passed[int(fields[1])] = fields[2] == "pass"
            reported += 1
    passed = sum(test_passed)
    if syntax_error:
        status = "unparsable"
    elif timed_out and not program_ended:  # the program itself never finished
        status = "timeout"
    elif passed == total and reported >= total:
        status = "ok"
    elif timed_out:
        status = "timeout"
    else:
        status = "wrong"
    return CodeResult(passed, total, status, tuple(test_passed), program_error, stdout, stderr, elapsed_s)


def code_verdict(item, program: str) -> Verdict:
    """Runs `program` against item.tests: score 1 when every test passes, else 0 (with
    item.meta["partial_credit"]: passed/total), the run's status and its per-test flags.
    item.meta["timeout_s"] (default 5 s) limits the run."""
    if not item.tests:
        raise ValueError(f"Item {item.uid!r}: a code verifier needs tests.")
    meta = item.meta if isinstance(item.meta, dict) else {}
    result = run_python(program, item.tests, timeout_s=float(meta.get("timeout_s", 5.0)))
    if meta.get("partial_credit"):
        score = result.passed / result.total
    else:
        score = 1.0 if result.status == "ok" else 0.0
    return Verdict(score, result.status, result.test_passed)


def code_verifier(item, completion: str) -> Verdict:
    """Built-in "code": runs the completion's program against item.tests.

    The program is the last ```python fenced block of the completion (or the whole text).
    Score 1 when every test passes, else 0; with item.meta["partial_credit"] the score is
    passed/total. item.meta["timeout_s"] (default 5 s) limits the run. The verdict keeps
    the per-test pass flags (``VerifyResult.test_passed``).
    """
    return code_verdict(item, extract_program(completion))


def extract_program(completion: str) -> str:
    """The last fenced ```python (or bare ```) code block of the completion, else the completion."""
    fence = "```"
    end = completion.rfind(fence)
    if end <= 0:
        return completion
    begin = completion.rfind(fence, 0, end)
    if begin < 0:
        return completion
    block = completion[begin + len(fence):end]
    first_line, _, rest = block.partition("\n")
    return rest if first_line.strip().isidentifier() or not first_line.strip() else block
