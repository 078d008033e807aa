"""What the host CPU can do for the precision policy: does it have bf16 dot units?

Mixed precision (``model.compute_dtype="bfloat16"``: bf16 operands, float32 accumulation) is a
speed-up only where the hardware multiplies bf16 natively. On an AMX Xeon XLA:CPU ran a
[768, 576] × [576, 1536] dot at 1,719 GFLOP/s in bf16 against 299 GFLOP/s in float32; on an
AVX2-only EPYC, which converts bf16 operands in software, the same policy reached 47 GFLOP/s
against 72 GFLOP/s in float32 (docs/performance.md at 9f22ea1, "perf20"). A run that asks for bf16 on
such a CPU is told so before it starts (``mixed_precision_advice``), not left to find out.

x86 CPUs with bf16 dot instructions list ``avx512_bf16`` or ``amx_bf16`` in /proc/cpuinfo's
``flags``; Arm CPUs list ``bf16`` in ``Features``. Anything else, or no /proc/cpuinfo, is
"unknown" and gets no advice. ``model.compute_dtype="auto"`` (the trainer's default) picks the
policy from the same facts (``auto_compute_dtype``).
"""

from __future__ import annotations

import os
import re

X86_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
ARM_BF16_FEATURE = "bf16"


def read_cpuinfo(path: str = "/proc/cpuinfo") -> str:
    """The text of /proc/cpuinfo, or "" where there is none (macOS, Windows, a sandbox)."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def cpuinfo_field(cpuinfo: str, name: str) -> str | None:
    """The value of the first ``name : value`` line of /proc/cpuinfo text (the first CPU's),
    stripped; None where there is no such line."""
    match = re.search(rf"^{re.escape(name)}\s*:(.*)$", cpuinfo, re.MULTILINE)
    return match.group(1).strip() if match else None


def bf16_dot_units(cpuinfo: str) -> bool | None:
    """Whether the CPU described by `cpuinfo` (/proc/cpuinfo text) has bf16 dot instructions.

    Returns True or False when the text names x86 ``flags`` or Arm ``Features``, None when it
    says neither (unknown: no advice is better than wrong advice).
    """
    x86 = cpuinfo_field(cpuinfo, "flags")
    if x86 is not None:
        flags = set(x86.split())
        return any(flag in flags for flag in X86_BF16_FLAGS)
    arm = cpuinfo_field(cpuinfo, "Features")
    if arm is not None:
        return ARM_BF16_FEATURE in arm.split()
    return None


def mixed_precision_advice(compute_dtype: str | None, *, backend: str, cpuinfo: str) -> str | None:
    """A warning for a bf16 compute dtype on a CPU backend without bf16 dot units, else None.

    Args:
      compute_dtype: the model's matmul dtype ("bfloat16", "float32", "" or None).
      backend: ``jax.default_backend()``; GPUs and TPUs always get None.
      cpuinfo: /proc/cpuinfo text (``read_cpuinfo()``).
    """
    if compute_dtype != "bfloat16" or backend != "cpu" or bf16_dot_units(cpuinfo) is not False:
        return None
    model = re.search(r"^model name\s*:\s*(.*)$", cpuinfo, re.MULTILINE)
    name = model.group(1).strip() if model else "this CPU"
    return (f"model.compute_dtype=bfloat16 on a CPU without bf16 dot units ({name}: /proc/cpuinfo "
            "lists no bf16 instructions): XLA converts bf16 operands in software, so "
            "mixed precision runs slower than float32 here (AVX2 EPYC: 47 against 72 GFLOP/s). "
            "Leave model.compute_dtype empty for float32 on this machine; keep bfloat16 for "
            "GPUs, TPUs and CPUs with AVX512-BF16 or AMX.")


AUTO_BF16_MIN_HIDDEN = 256
"""``compute_dtype="auto"`` keeps float32 below this hidden size. A model that narrow (the
embedded default's decoder is 96 wide) spends its step on per-op overhead, not matmuls, and
float32 keeps its runs identical on every machine, with or without bf16 units; SmolLM2-135M
(576) and larger get bf16 where it pays."""


def auto_compute_dtype(*, param_dtype: str, hidden_size: int, backend: str, cpuinfo: str) -> tuple[str, str]:
    """What ``model.compute_dtype="auto"`` picks, and why (one line for the run's log).

    bfloat16 (bf16 operands, float32 accumulation, float32 master weights) on GPU and TPU
    and on CPUs with bf16 dot units (``bf16_dot_units``), for float32 models at least
    ``AUTO_BF16_MIN_HIDDEN`` wide; float32 elsewhere. A bf16-parameter model computes in
    bf16 (its parameter dtype), as ``compute_dtype=""`` does.

    Returns:
      ("bfloat16" | "float32", reason).
    """
    if param_dtype == "bfloat16":
        return "bfloat16", "the parameters are bfloat16"
    if hidden_size < AUTO_BF16_MIN_HIDDEN:
        return "float32", f"hidden size {hidden_size} < {AUTO_BF16_MIN_HIDDEN} (a small model stays float32)"
    if backend in ("gpu", "tpu", "cuda", "rocm"):
        return "bfloat16", f"mixed precision on {backend}"
    if backend != "cpu":
        return "float32", f"backend {backend!r}: float32 unless told otherwise"
    units = bf16_dot_units(cpuinfo)
    name = cpuinfo_field(cpuinfo, "model name") or "this CPU"
    if units:
        return "bfloat16", f"mixed precision: {name} has bf16 dot units (avx512_bf16 / amx_bf16 / Arm bf16)"
    if units is False:
        return "float32", f"{name} has no bf16 dot units, where float32 is faster"
    return "float32", "no /proc/cpuinfo to tell whether this CPU has bf16 dot units"


def summary() -> dict:
    """The CPU as benchmark results name it: model, the instruction sets that matter here
    (avx2, avx512f, avx512_bf16, amx_bf16, amx_tile), cores, bf16 dot units ({} off Linux)."""
    text = read_cpuinfo()
    if not text:
        return {}
    flags = set(re.findall(r"\b(avx2|avx512f|avx512_bf16|amx_bf16|amx_tile)\b", text))
    return {"flags": sorted(flags), "model": cpuinfo_field(text, "model name") or "", "cores": os.cpu_count(),
            "bf16_dot_units": bf16_dot_units(text)}
