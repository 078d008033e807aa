"""Keep the host memory that XLA:CPU frees, so the next step does not fault it in again.

XLA:CPU allocates the temporaries of every execution afresh and frees them at its end: one
2.9 GB block per SmolLM2-135M update of the peer workload. glibc hands a block that large
straight back to the kernel (``munmap``), so each update first-touches ~707k fresh pages.
The kernel must zero them, and on a VM with free-page reporting (virtio-balloon) the host has
usually reclaimed them by the time the next update comes. That cost 5-8 s of kernel CPU per
update when a rollout ran between updates, against ~2 s back to back (docs/performance.md at
9f22ea1, "perf17").

``keep_host_memory()`` makes the process keep what it frees:

- CPU executions run inline on the calling thread (``jax_cpu_enable_async_dispatch=False``),
  so XLA's buffers come from glibc's main arena. A worker thread's arena serves blocks from
  heaps of at most 64 MB, so it falls back to ``mmap`` for anything bigger.
- The main arena never ``mmap``\\ s a block (``M_MMAP_MAX = 0``) and never trims its top
  (``M_TRIM_THRESHOLD = SIZE_MAX``), so freed memory is reused by the next step.
- Every thread allocates from that one arena (``M_ARENA_MAX = 1``), so what one thread frees
  serves the next. Orbax's writer threads otherwise kept each checkpoint's buffers in arenas
  of their own: +150 to +330 MB of RSS per save of the SmolLM2-135M train state, +800 MB
  after four (one arena: +300 MB at the first save, nothing after).

What it costs: the resident set never shrinks below its high-water mark while the process
lives. The peak rises a little, because a freed block cannot always serve a request of another
size: 5,858-5,877 MiB against 5,726-5,787 MiB in alternated runs of the peer workload. The
peak of ``make run`` stays at 1.41 GB. Python also no longer overlaps with a running CPU
computation. That overlap is worth nothing when every step blocks on its metrics: with
this policy, ``make run`` took 2:26 against 2:54.

``memory_optimized_cpu_schedule()`` lowers the peak itself: XLA:CPU orders each program for
memory instead of concurrency (-0.5 GB on the SmolLM2-135M update, "perf24").

``release_free_heap()`` is the opposite of keeping, once: ``malloc_trim(0)`` hands back what is free at
that moment. The checkpoint loaders call it after placing the weights, which returns their
freed staging copies (730 MB for SmolLM2-135M; "perf18").
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import platform
import sys
import warnings

import jax

# mallopt parameter numbers (glibc malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_ARENA_MAX = -8
_GLIBC_DEFAULT_MMAP_MAX = 65536
_NEVER = -1  # mallopt takes an int; glibc widens -1 to SIZE_MAX for the trim threshold

# The same malloc policy as GLIBC_TUNABLES, for a process that cannot call keep_host_memory
# (another framework's benchmark run, or one started with the variable exported): no mmap, a
# trim threshold of 2**62 (in effect never; the tunable takes a number, not -1).
KEEP_HOST_MEMORY_TUNABLES = ("glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4611686018427387904"
                             ":glibc.malloc.arena_max=1")


@dataclasses.dataclass(frozen=True)
class HostMemoryPolicy:
    """What ``keep_host_memory`` (or ``memory_optimized_cpu_schedule``) did.

    ``kept`` is True when the policy took effect: for ``keep_host_memory`` inline dispatch and
    both mallopt settings, for ``memory_optimized_cpu_schedule`` the flag added to XLA_FLAGS.
    """

    kept: bool
    reason: str


def _glibc():
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def _backends_initialized() -> bool:
    # No public equivalent. jax reads the dispatch flag when it builds the CPU client.
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


def keep_host_memory() -> HostMemoryPolicy:
    """Run CPU executions inline and stop glibc returning freed memory to the kernel.

    Call it before the first JAX computation; ``jax`` reads the dispatch flag when it creates
    the CPU client. Called later, with asynchronous dispatch already on, it changes nothing,
    warns, and returns ``kept=False``. Doing only half would not help: asynchronously
    dispatched executions still allocate from worker arenas, which ``mmap`` big blocks.
    Without glibc (macOS, musl) it changes nothing and says so.
    """
    libc = _glibc()
    if libc is None:
        libc_name = platform.libc_ver()[0] or sys.platform
        return HostMemoryPolicy(False, f"not glibc ({libc_name}); nothing changed")
    if jax.config.read("jax_cpu_enable_async_dispatch") and _backends_initialized():
        reason = ("JAX's CPU client already exists with asynchronous dispatch on; call "
                  "jaxrl_vr.host_memory.keep_host_memory() before the first JAX computation")
        warnings.warn(reason, RuntimeWarning, stacklevel=2)
        return HostMemoryPolicy(False, reason)
    if libc.mallopt(M_MMAP_MAX, 0) != 1:
        return HostMemoryPolicy(False, "glibc mallopt refused M_MMAP_MAX; nothing changed")
    if libc.mallopt(M_TRIM_THRESHOLD, _NEVER) != 1:
        libc.mallopt(M_MMAP_MAX, _GLIBC_DEFAULT_MMAP_MAX)  # all or nothing
        return HostMemoryPolicy(False, "glibc mallopt refused M_TRIM_THRESHOLD; nothing changed")
    libc.mallopt(M_ARENA_MAX, 1)  # threads created from now on share the main arena
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    return HostMemoryPolicy(True, "inline CPU dispatch; glibc keeps freed memory (no mmap, no trim, one arena)")


CPU_MEMORY_SCHEDULE_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def memory_optimized_cpu_schedule() -> HostMemoryPolicy:
    """Ask XLA:CPU to order each program for memory, not for concurrency.

    XLA:CPU's default scheduler starts operations as early as their inputs allow, so that
    independent ones can run side by side. Operations that depend on nothing, such as the
    zero-filled gradient stacks of the prompt prefix's backward pass, then start with the
    step and stay resident through the micro-batch loop. With the memory-optimized order
    the SmolLM2-135M update of the peer workload needs 2,701 instead of 3,197 MiB of
    temporaries, and its peak RSS falls from 5,806-5,810 to 5,271-5,276 MiB. Its update time
    moved within the VM's noise (29.6-31.2 s against 28.8-30.0 s) and the rollout's not at all
    (docs/performance.md at 9f22ea1, "perf24").

    XLA reads the flag from ``XLA_FLAGS`` when it creates the CPU client (a per-compile
    option is accepted but not used by the CPU scheduler), so this appends it to the
    environment and must run before the first JAX computation. It leaves ``XLA_FLAGS``
    alone if the flag is already there (the caller's own setting wins) and changes nothing
    once the backends exist (it warns). GPUs and TPUs ignore the flag.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_enable_concurrency_optimized_scheduler" in flags:
        return HostMemoryPolicy(False, "XLA_FLAGS already sets the CPU scheduler; left as it is")
    if _backends_initialized():
        reason = ("JAX's backends already exist, so XLA_FLAGS is no longer read; call "
                  "jaxrl_vr.host_memory.memory_optimized_cpu_schedule() before the first JAX computation")
        warnings.warn(reason, RuntimeWarning, stacklevel=2)
        return HostMemoryPolicy(False, reason)
    os.environ["XLA_FLAGS"] = f"{flags} {CPU_MEMORY_SCHEDULE_FLAG}".strip()
    return HostMemoryPolicy(True, "XLA:CPU schedules for memory (" + CPU_MEMORY_SCHEDULE_FLAG + ")")


def release_free_heap() -> int | None:
    """Hands the free pages of glibc's heap back to the kernel (``malloc_trim(0)``).

    Loading a checkpoint leaves the freed staging copies of its tensors in the heap: 730 MB
    for SmolLM2-135M's 540 MB of float32 weights (docs/performance.md at 9f22ea1, "perf18"), resident
    until something reuses them. The loaders call this once they are done. It costs
    milliseconds and frees what is already free, so it is safe under ``keep_host_memory()``
    too, which only stops glibc trimming on its own. Returns 1 if memory was released, 0 if
    none, None without glibc.
    """
    libc = _glibc()
    if libc is None:
        return None
    return int(libc.malloc_trim(0))
