"""An update A/B under bf16 compute (`ab_step.py --what update --precision bf16`): the grouped
attention's p·V dot keeping a bf16 copy of p for its backward pass (A, the form before perf32)
against keeping the float32 p that the softmax keeps anyway (B, `save_inputs="x"`, the current
`decoder._attend_grouped`). Same values and gradients; B stacks one [B, Hkv, G, T, S] array
fewer per layer and micro-batch."""
from jaxrl_vr.models import decoder
from jaxrl_vr.models.decoder import _attention_probs, mixed_einsum

_current = decoder._attend_grouped


def _bf16_copy_of_p(q_bthe, k_bske, v_bske, allowed_bts, dtype):
    b, t, h, e = q_bthe.shape
    kv_heads = k_bske.shape[2]
    q_btkge = q_bthe.reshape(b, t, kv_heads, h // kv_heads, e)
    logits = mixed_einsum("btkge,bske->bkgts", q_btkge, k_bske, dtype=dtype)
    probs = _attention_probs(logits, allowed_bts[:, None, None], e)
    out = mixed_einsum("bkgts,bske->btkge", probs, v_bske, dtype=dtype)
    return out.reshape(b, t, h, e).astype(q_bthe.dtype)


def A():
    decoder._attend_grouped = _bf16_copy_of_p


def B():
    decoder._attend_grouped = _current
