"""benchmarks/ab_step.py's bookkeeping (no model run) and its example variants file."""

import os
import sys

import jax
import numpy as np
import pytest

BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")
sys.path.insert(0, BENCHMARKS)

import ab_step  # noqa: E402
from jaxrl_vr.models import decoder  # noqa: E402


def test_summarize_by_hand():
    summary = ab_step.summarize([10.0, 12.0, 11.0], [9.0, 12.5, 10.0])
    assert summary["median_a_s"] == 11.0 and summary["median_b_s"] == 10.0
    assert summary["b_over_a"] == pytest.approx(10.0 / 11.0)
    assert summary["b_faster_pairs"] == 2 and summary["pairs"] == 3  # Pairs 1 and 3; a tie would not count.
    assert summary["pair_b_over_a"] == pytest.approx([0.9, 12.5 / 12.0, 10.0 / 11.0])
    assert summary["pair_b_over_a_median"] == pytest.approx(10.0 / 11.0)
    assert summary["pair_b_over_a_range"] == pytest.approx([0.9, 12.5 / 12.0])
    assert summary["sign_test_p"] == 1.0  # 2 of 3: the tail P(at most 1 win) = 4 / 8, doubled.
    # B − A per pair: −1, 0.5, −1; mean −0.5, sd √(1.5 / 2), se 0.5, t(0.975, 2) = 4.303.
    diff = summary["b_minus_a_s"]
    assert diff["mean"] == pytest.approx(-0.5)
    assert [diff["low"], diff["high"]] == pytest.approx([-0.5 - 4.3027 * 0.5, -0.5 + 4.3027 * 0.5], abs=1e-3)
    assert diff["verdict"] == "no difference detected"
    assert ab_step.summarize([2.0, 2.1, 2.0], [1.0, 1.1, 1.05])["b_minus_a_s"]["verdict"] == "lower"
    assert ab_step.summarize([1.0], [1.0])["b_faster_pairs"] == 0
    with pytest.raises(ValueError, match="same positive number"):
        ab_step.summarize([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="same positive number"):
        ab_step.summarize([], [])


def test_sign_test_by_hand():
    assert ab_step.sign_test_p(5, 5) == 2 / 32 and ab_step.sign_test_p(0, 5) == 2 / 32
    assert ab_step.sign_test_p(4, 5) == pytest.approx(2 * 6 / 32)  # P(4 or 5 wins) = (5 + 1) / 32.
    assert ab_step.sign_test_p(8, 8) == pytest.approx(2 / 256)
    assert ab_step.sign_test_p(3, 6) == 1.0 and ab_step.sign_test_p(1, 2) == 1.0


def test_pairs_alternate_which_variant_runs_first():
    assert [ab_step.pair_order(i) for i in range(4)] == [("A", "B"), ("B", "A"), ("A", "B"), ("B", "A")]


def test_load_variants_names_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="ab_variants"):
        ab_step.load_variants(str(tmp_path / "nope.py"))
    only_a = tmp_path / "only_a.py"
    only_a.write_text("def A():\n    pass\nB = 3\n")
    with pytest.raises(ValueError, match=r"defines no B\(\)"):
        ab_step.load_variants(str(only_a))


def test_the_example_variants_switch_the_float32_attention_layout():
    variants = ab_step.load_variants(os.path.join(BENCHMARKS, "ab_variants", "attention_layout.py"))
    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (2, 3, 6, 4))
    k, v = jax.random.normal(keys[1], (2, 5, 2, 4)), jax.random.normal(keys[2], (2, 5, 2, 4))
    allowed = np.ones((2, 3, 5), bool)
    kv_major = decoder._attend_kv_major(q, k, v, allowed)
    grouped = decoder._attend_grouped(q, k, v, allowed, np.float32)
    try:
        variants.A()
        np.testing.assert_array_equal(decoder.attend(q, k, v, allowed), grouped)
    finally:
        variants.B()
    np.testing.assert_array_equal(decoder.attend(q, k, v, allowed), kv_major)
    assert decoder._attend_kv_major is variants._kv_major


_OFFSET = [1.0]


@jax.jit
def _module_level_core(x):  # Like generate's core: one jitted function for the whole process.
    return x + _OFFSET[0]


def _build_core():
    compiled = _module_level_core.lower(np.zeros(3, np.float32)).compile()
    run = lambda: compiled(np.zeros(3, np.float32))  # noqa: E731
    run.hlo_text = compiled.as_text()
    return run


def test_each_variant_is_traced_afresh_even_through_a_module_level_jit():
    class Variants:
        A = staticmethod(lambda: _OFFSET.__setitem__(0, 1.0))
        B = staticmethod(lambda: _OFFSET.__setitem__(0, 100.0))
    _module_level_core(np.zeros(3, np.float32))  # A trace cached before the A/B, as in a real run.
    runs = ab_step.compile_variants(Variants, _build_core)
    np.testing.assert_array_equal(runs["A"](), [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(runs["B"](), [100.0, 100.0, 100.0])


def test_variants_that_compile_the_same_program_are_refused():
    class Same:
        A = B = staticmethod(lambda: None)
    with pytest.raises(ValueError, match="same program"):
        ab_step.compile_variants(Same, _build_core)


def test_a_rollout_variant_traces_generate_core_afresh():
    """The bug compile_variants fixes, on the real path: `generate`'s module-level core, traced
    before the A/B, must be traced again for each variant (the example decode-attention forms
    give different programs) and both programs must decode the same greedy tokens."""
    from jaxrl_vr.models import from_pretrained
    from jaxrl_vr.sampling import sampler

    model = from_pretrained(os.path.join(os.path.dirname(__file__), "..", "fixtures", "tiny_llama"))
    prompts, mask = np.full((2, 4), 3, np.int32), np.ones((2, 4), bool)
    kwargs = dict(num_samples=2, max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=0, greedy=True,
                  stop_token_ids=(-1,), pad_id=0, bucket=4, cache_dtype=None)
    sampler.generate(jax.random.key(0), model, prompts, mask, **kwargs)  # The core's first trace.

    def build():
        args, static = sampler.generate_core_call(jax.random.key(0), model, prompts, mask, **kwargs)
        compiled = sampler._generate_core.lower(*args, **static).compile()
        run = lambda: compiled(*args[1:])  # noqa: E731  graphdef is static
        run.hlo_text = compiled.as_text()
        return run

    variants = ab_step.load_variants(os.path.join(BENCHMARKS, "ab_variants", "decode_attention_form.py"))
    try:
        runs = ab_step.compile_variants(variants, build)
    finally:
        variants.A()
    np.testing.assert_array_equal(runs["A"]()[0], runs["B"]()[0])


def test_the_decode_segments_variants_switch_the_segment_count(monkeypatch):
    """The perf30 example: A runs one decode loop, B the sampler's default segments, four for a
    64-token buffer (both through `generate_core_call`, which profile_step's rollouts call by
    module attribute)."""
    from jaxrl_vr.models import from_pretrained
    from jaxrl_vr.sampling import sampler

    monkeypatch.setattr(sampler, "generate_core_call", sampler.generate_core_call)  # Restored afterwards.
    model = from_pretrained(os.path.join(os.path.dirname(__file__), "..", "fixtures", "tiny_llama"))
    prompts, mask = np.full((2, 4), 3, np.int32), np.ones((2, 4), bool)
    kwargs = dict(num_samples=2, max_new_tokens=64, temperature=1.0, top_p=1.0, top_k=0, greedy=True,
                  stop_token_ids=(-1,), pad_id=0, bucket=4, cache_dtype=None)
    variants = ab_step.load_variants(os.path.join(BENCHMARKS, "ab_variants", "decode_segments.py"))
    segments = {}
    for name in ("A", "B"):
        getattr(variants, name)()
        static = sampler.generate_core_call(jax.random.key(0), model, prompts, mask, **kwargs)[1]
        segments[name] = static["decode_segments"] or sampler.default_decode_segments(static["buffer_len"])
    assert segments == {"A": 1, "B": 4}


def test_only_the_long_rollout_goes_without_a_prompts_file(capsys):
    args = ab_step.parse_args(["v.py", "--model-dir", "m", "--what", "long-rollout"])
    assert args.lora_rank == 0  # profile_step.load_model reads it
    assert args.what == "long-rollout" and args.prompts_file is None
    with pytest.raises(SystemExit):
        ab_step.parse_args(["v.py", "--model-dir", "m", "--what", "rollout"])
    assert "needs --prompts-file" in capsys.readouterr().err
