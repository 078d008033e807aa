"""benchmarks/decode_dots.py's bookkeeping (no timing): the FLOP count, the summary, the
flags, and the arithmetic of its packed side's dots (the library's packed-dot kernel)."""

import os
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_vr.models import packed_dot

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

import decode_dots  # noqa: E402


def test_step_flops_by_hand():
    # One layer of width 2 (q 2, kv 1, F 3) and a 5-token head, 4 rows:
    # per layer 2·2·2 (q, o) + 2·2·1 (k, v) + 3·2·3 (gate, up, down) = 8 + 4 + 18 = 30 MACs a row,
    # head 2·5 = 10, so (30 + 10) · 4 rows · 2 = 320 FLOPs.
    assert decode_dots.step_flops(4, layers=1, hidden=2, q_width=2, kv_width=1, intermediate=3, vocab=5) == 320
    # SmolLM2-135M at the rollout's 64 rows: 2 · 64 · (30 · 3,538,944 + 576 · 49,152) FLOPs.
    assert decode_dots.step_flops(64, **decode_dots.SMOLLM2_135M) == 2 * 64 * (30 * 3_538_944 + 576 * 49_152)
    # wide-qwen2 at the 0.4B workload's 32 rows: per layer q, o 896·896, k, v 896·128, gate, up,
    # down 896·4864 = 1,605,632 + 229,376 + 13,074,432 = 14,909,440; head 896 · 49,152.
    assert decode_dots.step_flops(32, **decode_dots.WIDE_QWEN2) == 2 * 32 * (24 * 14_909_440 + 896 * 49_152)


def test_the_weight_shapes_are_what_step_flops_counts():
    shapes = decode_dots.layer_weight_shapes(**decode_dots.SMOLLM2_135M)
    per_layer = sum(a * b for a, b in shapes.values())
    s = decode_dots.SMOLLM2_135M
    assert decode_dots.step_flops(1, **s) == 2 * (s["layers"] * per_layer + s["hidden"] * s["vocab"])


def test_summarize_takes_the_median_of_round_medians():
    times = {"jax": [[2.0, 1.0, 3.0], [4.0, 4.0, 4.0]], "torch": [[6.0, 6.0, 7.0], [5.0, 5.0, 5.0]]}
    out = decode_dots.summarize(times, flops=12e9)
    assert out["jax"]["round_median_s"] == [2.0, 4.0] and out["jax"]["median_s"] == 3.0
    assert out["jax"]["gflops"] == pytest.approx(4.0) and out["torch"]["gflops"] == pytest.approx(12 / 5.5)
    assert out["torch_over_jax_gflops"] == pytest.approx((12 / 5.5) / 4.0)


def test_bad_counts_and_a_missing_torch_are_refused(tmp_path):
    with pytest.raises(SystemExit):
        decode_dots.main(["--rows", "0"])
    with pytest.raises(SystemExit):
        decode_dots.main(["--torch-python", str(tmp_path / "no-python")])


def test_summarize_gives_every_side_over_jax():
    times = {"jax": [[4.0]], "torch": [[8.0]], "packed": [[2.0]]}
    out = decode_dots.summarize(times, flops=8e9)
    assert out["packed_over_jax_gflops"] == pytest.approx(2.0) and out["torch_over_jax_gflops"] == pytest.approx(0.5)


@pytest.mark.parametrize("argv", [["--sides", "jax,xla"], ["--sides", "jax,jax"], ["--sides", ""]])
def test_bad_sides_are_refused(argv):
    with pytest.raises(SystemExit):
        decode_dots.main(argv)


@pytest.mark.skipif(packed_dot.unavailable_reason() is not None, reason="the packed-dot kernel cannot run here")
@pytest.mark.parametrize("m, k, n", [(1, 3, 16), (7, 33, 48), (32, 64, 32), (9, 5, 160)])
def test_the_packed_side_runs_a_matmul(m, k, n):
    """The packed side's dots (the library kernel, as it packs them): row counts off the
    register block (1, 7, 9), K not a multiple of anything, several panels."""
    rng = np.random.default_rng(m * 100 + k)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    packed = packed_dot.pack(jnp.asarray(b))
    np.testing.assert_allclose(packed_dot.packed_dot(jnp.asarray(a), packed), a @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(packed_dot.packed_dot(jnp.asarray(2 * a), packed), 2 * (a @ b), rtol=1e-5, atol=1e-5)
    assert packed_dot.packed_dot(jnp.asarray(a[:1]), packed).shape == (1, n)
    head = packed_dot.pack_transposed(jnp.asarray(b.T))  # packed from [N, K], as the LM head's table
    np.testing.assert_allclose(packed_dot.packed_dot(jnp.asarray(a), head), a @ b, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="multiple of 16"):
        packed_dot.pack(jnp.asarray(b[:, :n - 1]))
