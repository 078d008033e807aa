"""A rollout A/B (`ab_step.py --what rollout` or `--what long-rollout`): the decode loop as one
loop over the whole KV cache (A, `decode_segments=1`) against `generate`'s default segments
(B: `sampler.default_decode_segments`, 4 for the 64- and 512-token rollouts), each attending
over only the slots written by its end. perf30 measured B faster in 15 of 16 pairs on the
64-token rollout (fp32, Zen 5 EPYC)."""
import functools

from jaxrl_vr.sampling import sampler

_call = sampler.generate_core_call


def A():
    sampler.generate_core_call = functools.partial(_call, decode_segments=1)


def B():
    sampler.generate_core_call = _call
