"""benchmarks/profile_step.py's trace summaries, on hand-made events (no profiler run)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

import profile_step  # noqa: E402
from profile_step import Event  # noqa: E402

LABELS = {"ynn_fusion.7": "while/body/btd,df->btf/dot_general",
          "ynn_fusion.12": "while/body/btd,df->btf/dot_general",
          "ynn_fusion.3": "while/body/btf,fd->btd/dot_general"}
EVENTS = [
    Event("cpu/a", 0, 4_000_000, "ynn_fusion.7"),  # Gate and up dots side by side.
    Event("cpu/b", 0, 3_000_000, "ynn_fusion.12"),
    Event("cpu/a", 4_000_000, 2_000_000, "ynn_fusion.3"),  # Down dot alone on thread a ...
    Event("cpu/a", 6_000_000, 1_000_000, "SlinkyThreadPool::Await"),  # ... then waits.
    Event("cpu/b", 9_000_000, 500_000, "add_fusion.2"),  # No label: its own name, instance dropped.
]


def test_sum_by_source_merges_instances_by_hand():
    rows = {r["op"]: r for r in profile_step.sum_by_source(EVENTS, LABELS)}
    assert rows["while/body/btd,df->btf/dot_general"]["seconds"] == pytest.approx(7e-3)
    assert rows["while/body/btd,df->btf/dot_general"]["count"] == 2
    assert rows["while/body/btf,fd->btd/dot_general"]["count"] == 1
    assert rows["add_fusion"]["seconds"] == pytest.approx(5e-4)
    assert sum(r["fraction"] for r in rows.values()) == pytest.approx(1.0)
    ordered = [r["seconds"] for r in profile_step.sum_by_source(EVENTS, LABELS)]
    assert ordered == sorted(ordered, reverse=True)


def test_busy_by_thread_leaves_out_waits():
    busy = profile_step.busy_by_thread(EVENTS)
    assert busy == pytest.approx({"cpu/a": 6e-3, "cpu/b": 3.5e-3})


def test_timeline_window_from_the_middle():
    lines = profile_step.timeline(EVENTS, LABELS, window_ms=3.5)
    # The middle event (index 2) starts at 4 ms: the window holds it and the wait at 6 ms only.
    assert len(lines) == 2
    assert "thread 0" in lines[0] and "btf,fd->btd" in lines[0] and lines[0].lstrip().startswith("0.000 ms")
    assert "SlinkyThreadPool::Await" in lines[1] and "2.000 ms" in lines[1]
    assert profile_step.timeline([], LABELS, window_ms=5) == []


def test_sum_by_instruction_keeps_instances_apart():
    rows = {r["name"]: r for r in profile_step.sum_by_instruction(EVENTS, LABELS)}
    assert rows["ynn_fusion.7"]["seconds"] == pytest.approx(4e-3)
    assert rows["ynn_fusion.7"]["op"] == rows["ynn_fusion.12"]["op"] == "while/body/btd,df->btf/dot_general"
    assert rows["add_fusion.2"]["op"] == ""
    assert sum(r["fraction"] for r in rows.values()) == pytest.approx(1.0)


@pytest.mark.parametrize("chunk, shared", [(0, True), (16, False)])
def test_the_profiled_update_is_rl_steps(chunk, shared):
    """profile_step.py profiles the update rl_step.py times: one LossConfig for both (perf23
    found the profiler on the pre-shared-prefix workload with LM-head chunks of 16)."""
    import rl_step

    cfg = rl_step.workload_loss_config(8, chunk, 64, 8 if shared else 1)
    assert cfg.logprob_chunk_size == (chunk or 64)
    assert cfg.prompt_group_size == (8 if shared else 1)
    assert cfg.num_microbatches == 8 and cfg.detach_behaviour
    args = ["--model-dir", "m", "--prompts-file", "p"] + ([] if shared else ["--no-shared-prefix"])
    parsed = profile_step.parse_args(args + ["--chunk", str(chunk)])
    assert (parsed.chunk, parsed.no_shared_prefix) == (chunk, not shared)


def test_temp_bytes_counts_the_programs_temporaries():
    """What ab_step.py prints per variant: XLA's temporaries grow with what a program holds
    between its ops (here a [256, 256] float32 intermediate that two outputs read)."""
    import jax
    import jax.numpy as jnp

    def small(x):
        return jnp.sum(x * 2.0)

    def large(x):
        y = jnp.outer(x, x)  # [256, 256] float32: 256 KiB, read by both reductions.
        return jnp.sum(y, axis=0) @ jnp.sum(jnp.sin(y), axis=1)

    x = jnp.ones((256,), jnp.float32)
    small_bytes = profile_step.temp_bytes(jax.jit(small).lower(x).compile())
    large_bytes = profile_step.temp_bytes(jax.jit(large).lower(x).compile())
    assert isinstance(small_bytes, int) and small_bytes >= 0
    assert large_bytes > small_bytes


def test_lora_rank_profiles_a_model_with_adapters_on_every_block_matrix(tmp_path):
    """--lora-rank R: the profiled model carries rank-R adapters on all seven matrices, alpha 2R
    (rl_step.py's default), and without it none."""
    from flax import nnx

    from jaxrl_vr.models import has_lora, lora_targets, save_pretrained
    from jaxrl_vr.models.config import DecoderConfig
    from jaxrl_vr.models.decoder import Decoder
    from jaxrl_vr.models.lora import LORA_TARGETS

    config = DecoderConfig.tiny(64, hidden_size=16, intermediate_size=32, num_layers=2, num_heads=2,
                                num_kv_heads=1, head_dim=8, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    save_pretrained(Decoder(config, rngs=nnx.Rngs(0)), str(tmp_path))
    base = ["--model-dir", str(tmp_path), "--prompts-file", "p"]
    assert not has_lora(profile_step.load_model(profile_step.parse_args(base)))
    model = profile_step.load_model(profile_step.parse_args(base + ["--lora-rank", "4"]))
    assert lora_targets(model) == LORA_TARGETS and model.layers.lora_scale == 2.0
    assert model.layers.wq_lora_a[...].shape == (2, 16, 4)
