"""A rollout A/B (`ab_step.py --what rollout`): the float32 decode step's attention as
broadcast multiplies and sums (A, what `attend_cache` picks for up to 512 cache slots) against
two dots (B). perf29 measured fp32 5.37 -> 5.27 s on a Zen 5 EPYC, faster in 3 of 8 pairs:
noise, so perf21's choice stands. Meant for fp32: with `--precision bf16`, B would also get a
bf16 cache (`default_cache_dtype` asks the same function), another change at once."""
from jaxrl_vr.models import decoder

_pays = decoder.one_token_form_pays


def A():
    decoder.one_token_form_pays = _pays


def B():
    decoder.one_token_form_pays = lambda tokens, slots, cache_dtypes: False
