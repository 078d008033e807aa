"""perf28's A/B: float32 attention in the grouped layout (A, as before b253050) against the
kv-major layout (B, what `attend` runs for float32 compute now)."""
import jax.numpy as jnp

from jaxrl_vr.models import decoder

_kv_major = decoder._attend_kv_major


def _grouped_in_float32(q_bthe, k_bske, v_bske, allowed_bts):
    return decoder._attend_grouped(q_bthe, k_bske, v_bske, allowed_bts, jnp.float32)


def A():
    decoder._attend_kv_major = _grouped_in_float32


def B():
    decoder._attend_kv_major = _kv_major
