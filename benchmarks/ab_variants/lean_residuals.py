"""perf31's A/B: the layer block differentiated by JAX alone (A) against `_block` as the decoder
runs it (B: norms and projections in `kept_inputs` pieces, `softmax_keeping_output`,
`swiglu_down`).

A swaps those three pieces back for plain JAX (as tests/models/test_decoder.py's
`_plain_autodiff` does): the block of 2e325d7 but for one later detail both variants share,
the float32 attention's mask laid out as its logits (perf31). perf31's recorded runs
(`benchmarks/results/ab_lean_residuals_epyc_zen5_perf31_update_*.json`) took A from a verbatim copy
of the 2e325d7 block; this A compiles to the same 1,806 MiB of temporaries in fp32.
"""
import jax

from jaxrl_vr.models import decoder
from jaxrl_vr.models.decoder import mixed_einsum

_LEAN = {name: getattr(decoder, name) for name in ("kept_inputs", "swiglu_down", "softmax_keeping_output")}


def _plain_swiglu_down(gate, up, w_down, dtype):
    # As the 2e325d7 block ran it: w_down kept as it came in (the scan forwards the slice).
    return mixed_einsum("btf,fd->btd", jax.nn.silu(gate) * up, w_down, dtype=dtype, save_inputs="y")


_PLAIN = {"kept_inputs": lambda fn: fn, "swiglu_down": _plain_swiglu_down,
          "softmax_keeping_output": lambda x: jax.nn.softmax(x, axis=-1)}


def A():
    for name, fn in _PLAIN.items():
        setattr(decoder, name, fn)


def B():
    for name, fn in _LEAN.items():
        setattr(decoder, name, fn)
