"""The layer gradient sink's A/B: plain `jax.grad` of each micro-batch, its stacked layer
gradient added to the accumulator (A, as before 9c8b872's sink), against the sink that each
layer's backward pass adds into in place (B, what `step._accumulate` runs now)."""
from jaxrl_vr.train import step

_layer_sink = step._layer_sink


def A():
    step._layer_sink = lambda graphdef, params, rest: None


def B():
    step._layer_sink = _layer_sink
