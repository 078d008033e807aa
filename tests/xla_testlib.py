"""The XLA:CPU settings every test process compiles with (conftest.py, and the subprocesses
that tests start with their own XLA_FLAGS)."""

# Tests compile thousands of small programs and run each a few times, so compile time is what
# counts. LLVM's optimisation of XLA:CPU's generated kernels costs more than it saves (the dots
# are library calls either way; HLO passes and buffer assignment are unchanged). XLA:CPU's older
# elemental emitter builds the loop fusions (norms, softmaxes, the optimizer's updates) in about
# half the time of its MLIR fusion emitters: on the Zen 3 CI-sized VM, test_compact.py +
# test_prompt_prefix.py took 203 s with the default and 123 s without; the programs compute the
# same functions. Skipping LLVM's expensive passes took another 4-9 % (117 s).
FAST_COMPILE_FLAGS = (
    "--xla_backend_optimization_level=0",
    "--xla_cpu_use_fusion_emitters=false",
    "--xla_llvm_disable_expensive_passes=true",
)


def with_fast_compile(xla_flags: str) -> str:
    """`xla_flags` plus each of FAST_COMPILE_FLAGS that it does not set itself."""
    missing = [flag for flag in FAST_COMPILE_FLAGS if flag.split("=")[0] + "=" not in xla_flags]
    return " ".join([xla_flags.strip(), *missing]).strip()
