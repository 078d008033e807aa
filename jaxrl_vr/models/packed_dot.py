"""The decode loop's dots on packed-weight CPU kernels: float32 (x86 with AVX2 and FMA) and
bf16 with float32 accumulation (x86 with AMX-BF16, Intel's tile matrix unit).

A decode step multiplies few rows (the rollout's live rows) by every weight matrix, and at
such shapes XLA:CPU's dot reaches about 0.6 of a plain register-blocked float32 kernel that
reads each matrix as 16-column panels packed once, and about 0.45 of AMX tiles reading
32-column bf16 panels of K-pairs (`csrc/packed_dot.cc`; measured by
`benchmarks/decode_dots.py --sides jax,packed`). The samplers pack their per-layer weight
copies once per rollout (`pack_layer_params`: the same memory as the unpacked copies they
replace) and `_block` / `Decoder.logits` run a `PackedMatrix` through `packed_dot`, an XLA FFI
custom call on XLA's own thread pool. Inference only: it has no derivative.

The kernel is compiled with g++ at first use into `compilation_cache.cache_home()`/kernels
(``~/.cache/jaxrl_vr/kernels`` by default), keyed by the source, jaxlib version and flags.
`JAXRL_VR_DECODE_DOTS` picks the path: ``auto`` (default: packed where `unavailable_reason`
is None), ``packed`` (an error where it is not available) or ``xla``.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_vr import compilation_cache, host_cpu

PANEL = 16
"""Columns per float32 panel; a packable float32 matrix has a multiple of this many columns."""
PANEL_BF16 = 32
"""Columns per bf16 panel; a packable bf16 matrix has a multiple of this many columns and of
rows (the AMX kernel sums K in steps of 32)."""

TARGET = "jaxrl_vr_packed_dot"
TARGET_BF16 = "jaxrl_vr_packed_dot_amx"
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc", "packed_dot.cc")
FLAGS = ("-O3", "-mavx2", "-mfma", "-std=c++17", "-shared", "-fPIC")
MODES = ("auto", "packed", "xla")


@jax.tree_util.register_pytree_node_class
class PackedMatrix:
    """W [K, N] as float32 panels [N / 16, K, 16] (panel j holds columns 16j .. 16j + 15) or
    bf16 panels [N / 32, K / 2, 64] (panel j holds columns 32j .. 32j + 31, each row pair
    (2p, 2p + 1) as 32 column pairs), and the output axes `out_dims` (product N) the
    product's last axis is split into (for example (heads, head_dim) of a query projection)."""

    def __init__(self, panels: jax.Array, out_dims: tuple[int, ...]):
        self.panels = panels
        self.out_dims = tuple(out_dims)

    @property
    def in_dim(self) -> int:
        return self.panels.shape[1] * (2 if self.panels.dtype == jnp.bfloat16 else 1)

    def tree_flatten(self):
        return (self.panels,), self.out_dims

    @classmethod
    def tree_unflatten(cls, out_dims, children):
        return cls(children[0], out_dims)


def pack(w_kn: jax.Array, out_dims: tuple[int, ...] | None = None) -> PackedMatrix:
    """Packs a [K, ...] weight (trailing axes merged into N): float32 with N a multiple of 16,
    or bf16 with N and K multiples of 32."""
    k = w_kn.shape[0]
    n = int(np.prod(w_kn.shape[1:]))
    if not packable(w_kn):
        raise ValueError(f"pack needs a float32 weight with a multiple of {PANEL} output columns or a bf16 one "
                         f"with multiples of {PANEL_BF16} columns and rows; got {w_kn.dtype} "
                         f"[{k}, {n}]. Keep such a weight unpacked (`packable`).")
    if w_kn.dtype == jnp.bfloat16:
        pairs = jnp.transpose(w_kn.reshape(k // 2, 2, n // PANEL_BF16, PANEL_BF16), (2, 0, 3, 1))
        return PackedMatrix(pairs.reshape(n // PANEL_BF16, k // 2, 2 * PANEL_BF16), out_dims or (n,))
    panels = jnp.transpose(w_kn.reshape(k, n // PANEL, PANEL), (1, 0, 2))
    return PackedMatrix(panels, out_dims or (n,))


def pack_transposed(w_nk: jax.Array) -> PackedMatrix:
    """Packs W = w_nk.T from its [N, K] layout (a tied embedding as the LM head)."""
    n, k = w_nk.shape
    if w_nk.dtype == jnp.bfloat16:
        return pack(w_nk.T)
    if w_nk.dtype != jnp.float32 or n % PANEL:
        raise ValueError(f"pack_transposed needs a float32 [N, K] weight with N a multiple of {PANEL}; "
                         f"got {w_nk.dtype} [{n}, {k}].")
    return PackedMatrix(jnp.transpose(w_nk.reshape(n // PANEL, PANEL, k), (0, 2, 1)), (n,))


def packable(w: jax.Array) -> bool:
    """Whether `pack` takes `w`: [K, ...] float32 with the trailing axes' product a multiple
    of 16, or bf16 with it and K multiples of 32."""
    if w.ndim < 2:
        return False
    n = int(np.prod(w.shape[1:]))
    if w.dtype == jnp.float32:
        return n % PANEL == 0
    return w.dtype == jnp.bfloat16 and n % PANEL_BF16 == 0 and w.shape[0] % PANEL_BF16 == 0


def packed_dot(x: jax.Array, w: PackedMatrix) -> jax.Array:
    """x [..., K] @ W -> [..., *w.out_dims] float32 (the FFI kernel; no derivative). x is cast
    to the panels' dtype (float32, or bf16 as `mixed_einsum` casts it), products summed in
    float32."""
    if x.shape[-1] != w.in_dim:
        raise ValueError(f"packed_dot: x has {x.shape[-1]} features, the packed matrix {w.in_dim}.")
    register()
    bf16 = w.panels.dtype == jnp.bfloat16
    n = w.panels.shape[0] * (PANEL_BF16 if bf16 else PANEL)
    out = jax.ffi.ffi_call(TARGET_BF16 if bf16 else TARGET, jax.ShapeDtypeStruct(x.shape[:-1] + (n,), jnp.float32))(
        x.astype(w.panels.dtype), w.panels)
    return out.reshape(x.shape[:-1] + w.out_dims)


def cache_dir() -> str:
    return os.path.join(compilation_cache.cache_home(), "kernels")


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "g++")) or shutil.which("g++")


def build() -> str:
    """Compiles csrc/packed_dot.cc once per (source, jaxlib, compiler, flags); the library's
    path. Concurrent first uses (test workers) each compile to a temporary file and rename."""
    import jaxlib

    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler (g++, or $CXX) on PATH")
    with open(SOURCE, "rb") as f:
        source = f.read()
    key = hashlib.sha256(b"\0".join([source, jaxlib.__version__.encode(), compiler.encode(),
                                     " ".join(FLAGS).encode()])).hexdigest()[:16]
    os.makedirs(cache_dir(), exist_ok=True)
    library = os.path.join(cache_dir(), f"packed_dot-{key}.so")
    if os.path.exists(library):
        return library
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache_dir())
    os.close(fd)
    try:
        result = subprocess.run([compiler, *FLAGS, "-isystem", jax.ffi.include_dir(), SOURCE, "-o", tmp],
                                capture_output=True, text=True)
        if result.returncode:
            raise RuntimeError(f"{compiler} failed on {SOURCE}:\n{result.stderr[-2000:]}")
        os.replace(tmp, library)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return library


@functools.cache
def register():
    """Builds and loads the kernels and registers them with XLA (once per process); the
    loaded library."""
    import ctypes

    library = ctypes.cdll.LoadLibrary(build())
    jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(library.JaxrlVrPackedDot), platform="cpu")
    jax.ffi.register_ffi_target(TARGET_BF16, jax.ffi.pycapsule(library.JaxrlVrPackedDotAmx), platform="cpu")
    return library


@functools.cache
def unavailable_reason(dtype: str = "float32") -> str | None:
    """Why this process cannot run `packed_dot` on `dtype` weights (None when it can): the
    default backend is not the CPU, the CPU is not x86 with AVX2 and FMA (float32) or with
    AMX-BF16 (bfloat16; Linux must also grant the process the AMX tile state), or the kernel
    does not build."""
    if jnp.dtype(dtype) not in (jnp.float32, jnp.bfloat16):
        return f"there is no packed kernel for {dtype}"
    if jax.default_backend() != "cpu":
        return f"the default backend is {jax.default_backend()}, not cpu"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the CPU is {platform.machine()}, not x86-64"
    flags = set((host_cpu.cpuinfo_field(host_cpu.read_cpuinfo(), "flags") or "").split())
    if not {"avx2", "fma"} <= flags:
        return "the CPU lacks AVX2 or FMA"
    if jnp.dtype(dtype) == jnp.bfloat16 and not {"amx_tile", "amx_bf16"} <= flags:
        return "the CPU lacks AMX-BF16 (the bf16 kernel's tiles)"
    try:
        library = register()
    except (OSError, RuntimeError, subprocess.SubprocessError) as err:
        return f"the kernel did not build or load ({err})"
    if jnp.dtype(dtype) == jnp.bfloat16:
        error = library.JaxrlVrAmxInit()
        if error:
            return f"Linux did not grant the AMX tile state ({os.strerror(error)})"
    return None


def decode_mode() -> str:
    """`JAXRL_VR_DECODE_DOTS` (auto / packed / xla), checked."""
    mode = os.environ.get("JAXRL_VR_DECODE_DOTS", "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"JAXRL_VR_DECODE_DOTS={mode!r}: use one of {', '.join(MODES)}.")
    return mode


def use_packed(arrays, compute_dtype) -> bool:
    """Whether a sampler should pack its decode weights: `decode_mode` allows it, the kernel
    for the compute dtype (float32 or bf16) runs here, and no array of `arrays` (a pytree of
    concrete arrays: the model state) is spread over several devices (the custom call has no
    sharding rule)."""
    mode = decode_mode()
    if mode == "xla":
        return False
    reason = unavailable_reason(str(jnp.dtype(compute_dtype)))
    if reason is not None:
        if mode == "packed":
            raise RuntimeError(f"JAXRL_VR_DECODE_DOTS=packed, but {reason}. Unset it (auto) or use xla.")
        return False
    sharded = [a for a in jax.tree.leaves(arrays)
               if isinstance(a, jax.Array) and len(a.sharding.device_set) > 1]
    if sharded and mode == "packed":
        raise RuntimeError("JAXRL_VR_DECODE_DOTS=packed, but the model is sharded over several devices, "
                           "which the packed kernel does not support. Use auto or xla.")
    return not sharded
