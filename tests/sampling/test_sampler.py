"""Sampler: HF greedy parity, naive-loop parity, stop tokens, padding, determinism, no recompiles,
one prefill per prompt, log-prob consistency and the filtered sampling distribution."""

import os
import re

import chex
import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_vr import ratios
from jaxrl_vr.models import from_pretrained, set_compute_dtype
from jaxrl_vr.sampling import filter_logits, generate, sample_token
from jaxrl_vr.sampling import sampler as sampler_lib
from jaxrl_vr.sampling.sampler import CDF_BLOCK, argmax_last, categorical_inverse_cdf

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures")
NO_STOP = (-1,)  # A stop id that never occurs (keeps the stop-id array shape fixed: one id).


def load(name):
    path = os.path.join(FIXTURES, name)
    return from_pretrained(path), dict(np.load(os.path.join(path, "reference.npz")))


@pytest.fixture(scope="module")
def llama():
    return load("tiny_llama")


@nnx.jit
def forward(model, tokens_bt, mask_bt):
    return model(tokens_bt, mask_bt=mask_bt)


def test_greedy_matches_transformers_generate(llama):
    model, ref = llama
    rollout = generate(jax.random.key(0), model, ref["input_ids"], ref["attention_mask"], max_new_tokens=8,
                       greedy=True, stop_token_ids=NO_STOP)
    np.testing.assert_array_equal(rollout.tokens_bt, ref["greedy_tokens"])
    assert rollout.tokens_bt.dtype == jnp.int32 and rollout.logp_bt.dtype == jnp.float32
    np.testing.assert_array_equal(rollout.length_b, [8, 8, 8])
    assert rollout.truncated_b.all() and rollout.mask_bt.all()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny_qwen2", "tiny_qwen3"])
def test_greedy_matches_transformers_generate_qwen(name):
    model, ref = load(name)
    rollout = generate(jax.random.key(0), model, ref["input_ids"], ref["attention_mask"], max_new_tokens=8,
                       greedy=True, stop_token_ids=NO_STOP)
    np.testing.assert_array_equal(rollout.tokens_bt, ref["greedy_tokens"])


def test_greedy_matches_naive_full_recompute_loop(llama):
    """Argmax of a full forward over prompt + generated-so-far, one token at a time."""
    model, ref = llama
    prompts, mask = ref["input_ids"], ref["attention_mask"]
    steps, (p, s) = 6, prompts.shape
    # Fixed shape [P, S + steps]: future slots hold 0 and are masked out; causality hides them anyway.
    tokens = np.concatenate([prompts, np.zeros((p, steps), np.int32)], axis=1)
    full_mask = np.concatenate([mask, np.zeros((p, steps), bool)], axis=1)
    for t in range(steps):
        logits = forward(model, tokens, full_mask)
        tokens[:, s + t] = np.argmax(np.asarray(logits[:, s + t - 1]), axis=-1)
        full_mask[:, s + t] = True
    rollout = generate(jax.random.key(0), model, prompts, mask, max_new_tokens=8, greedy=True,
                       stop_token_ids=NO_STOP)
    np.testing.assert_array_equal(rollout.tokens_bt[:, :steps], tokens[:, s:])


def test_stop_tokens_end_responses(llama):
    model, ref = llama
    # Greedy row 0 is [85, 44, 113, 85, 68, ...]: stopping on 68 ends it after 5 tokens; rows 1-2
    # never produce 68 in 8 steps (fixture) and run to the cap.
    assert 68 not in ref["greedy_tokens"][1:]
    rollout = generate(jax.random.key(0), model, ref["input_ids"], ref["attention_mask"], max_new_tokens=8,
                       greedy=True, stop_token_ids=(68,), pad_id=0)
    np.testing.assert_array_equal(rollout.tokens_bt[0], [85, 44, 113, 85, 68, 0, 0, 0])
    np.testing.assert_array_equal(rollout.mask_bt[0], [True] * 5 + [False] * 3)
    np.testing.assert_array_equal(rollout.length_b, [5, 8, 8])
    np.testing.assert_array_equal(rollout.truncated_b, [False, True, True])
    np.testing.assert_array_equal(rollout.tokens_bt[1:], ref["greedy_tokens"][1:])
    assert float(jnp.abs(rollout.logp_bt[0, 5:]).max()) == 0.0


def test_last_token_emitted_after_the_loop(llama):
    """The final token is sampled from the last logits without another forward pass: budgets of
    1 (no loop iteration at all) and 5 (row 0's stop token 68 is exactly the 5th, emitted after
    the loop) must give the fixture's greedy tokens, lengths and truncation flags."""
    model, ref = llama
    one = generate(jax.random.key(0), model, ref["input_ids"], ref["attention_mask"], max_new_tokens=1,
                   greedy=True, stop_token_ids=NO_STOP)
    np.testing.assert_array_equal(one.tokens_bt, ref["greedy_tokens"][:, :1])
    np.testing.assert_array_equal(one.length_b, [1, 1, 1])
    np.testing.assert_array_equal(one.truncated_b, [True, True, True])
    five = generate(jax.random.key(0), model, ref["input_ids"], ref["attention_mask"], max_new_tokens=5,
                    greedy=True, stop_token_ids=(68,))
    np.testing.assert_array_equal(five.tokens_bt, ref["greedy_tokens"][:, :5])  # Row 0 = [85, 44, 113, 85, 68].
    np.testing.assert_array_equal(five.length_b, [5, 5, 5])
    np.testing.assert_array_equal(five.truncated_b, [False, True, True])


class ArgmaxLastTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_first_maximum_hand_computed(self):
        fn = self.variant(argmax_last)
        x = jnp.array([[1.0, 3.0, 3.0, 2.0],   # Tie at 1 and 2: the first wins, as in jnp.argmax.
                       [-5.0, -5.0, -5.0, -5.0],  # All equal: index 0.
                       [0.0, 0.0, 0.0, 7.0],
                       [1.0, jnp.nan, 0.0, 0.0]])  # NaN: no entry equals the max -> last index, in range.
        out = fn(x)
        assert out.dtype == jnp.int32
        np.testing.assert_array_equal(out, [1, 0, 3, 3])

    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_jnp_argmax_on_finite_rows(self):
        x = jax.random.normal(jax.random.key(1), (16, 1000))
        x = jnp.round(x * 4) / 4  # Coarse values: many ties.
        np.testing.assert_array_equal(self.variant(argmax_last)(x), jnp.argmax(x, axis=-1))


def test_decode_segment_ends_hand_computed():
    segments = sampler_lib.default_decode_segments  # One segment per 16 steps, at most 4.
    assert [segments(n) for n in (1, 16, 31, 32, 48, 64, 512)] == [1, 1, 1, 2, 3, 4, 4]
    ends = sampler_lib.decode_segment_ends
    assert ends(64, 4) == [16, 32, 48, 64]
    assert ends(64, 1) == [64]
    assert ends(10, 4) == [3, 5, 8, 10]  # ceil(2.5), 5, ceil(7.5), 10.
    assert ends(3, 8) == [1, 2, 3]  # More segments than steps: one per step, duplicates dropped.
    with pytest.raises(ValueError, match="decode_segments=0"):
        ends(16, 0)


@pytest.mark.parametrize("segments", [1, 3, 16])
def test_decode_segments_keep_the_rollout(llama, segments):
    """The decode loop in 1, 3 or 16 segments (one per step of the 16-slot buffer): greedy tokens
    are the fixture's (row 0 stops on 68 inside the second of three segments) and the log-probs
    equal the default's up to float rounding (sums over fewer masked slots reassociate)."""
    model, ref = llama
    kwargs = dict(max_new_tokens=8, greedy=True, stop_token_ids=(68,))
    default = generate(jax.random.key(0), model, ref["input_ids"], ref["attention_mask"], **kwargs)
    split = generate(jax.random.key(0), model, ref["input_ids"], ref["attention_mask"], decode_segments=segments,
                     **kwargs)
    np.testing.assert_array_equal(split.tokens_bt[1:], ref["greedy_tokens"][1:])
    np.testing.assert_array_equal(split.tokens_bt[0], [85, 44, 113, 85, 68, 0, 0, 0])
    np.testing.assert_array_equal(split.length_b, [5, 8, 8])
    np.testing.assert_allclose(split.logp_bt, default.logp_bt, atol=1e-5)


@pytest.mark.parametrize("segments, slots", [(1, {24}), (3, {14, 19, 24}), (4, {12, 16, 20, 24}), (None, {24})])
def test_decode_segments_grow_the_cache_each_loop_reads(llama, segments, slots):
    """What the switch changes: with an 8-slot prompt bucket and a 16-step buffer, the program
    runs one decode loop per segment, each carrying a cache of the slots written by its end
    (8 + ceil(16 j / n)), instead of one loop over all 24 slots (the default for a buffer this
    short: `default_decode_segments(16)` = 1)."""
    model, ref = llama
    prompts = np.asarray(ref["input_ids"], np.int32)[:, -8:]
    graphdef, state = nnx.split(model)
    c = model.config
    text = sampler_lib._generate_core.lower(
        graphdef, state, jax.random.key(0), prompts, np.ones(prompts.shape, bool), np.int32(8), np.float32(1),
        np.float32(1), np.int32(0), np.asarray(NO_STOP, np.int32), np.int32(0), num_samples=2, buffer_len=16,
        greedy=False, use_filter=False, decode_segments=segments).as_text()
    loops = re.findall(r"stablehlo\.while\(.*?\)\s*:(.*?)cond \{", text, flags=re.S)  # The carried types.
    key_shape = rf"tensor<6x{c.num_kv_heads}x{c.head_dim}x(\d+)xf32>"
    carried = [{int(n) for n in re.findall(key_shape, loop)} for loop in loops]
    carried = [found for found in carried if found]  # The sampler's inverse-CDF loops carry no cache.
    assert len(carried) == len(slots) and set().union(*carried) == slots, carried


def test_left_padding_gives_same_result_as_unpadded(llama):
    """Row 2 of the fixture is 5 pads + 5 tokens; alone and unpadded (no bucketing) it must
    produce the same greedy tokens and log-probs."""
    model, ref = llama
    padded = generate(jax.random.key(0), model, ref["input_ids"], ref["attention_mask"], max_new_tokens=8,
                      greedy=True, stop_token_ids=NO_STOP)
    alone = generate(jax.random.key(0), model, ref["input_ids"][2:, 5:], ref["attention_mask"][2:, 5:],
                     max_new_tokens=8, greedy=True, stop_token_ids=NO_STOP, bucket=1)
    np.testing.assert_array_equal(alone.tokens_bt[0], padded.tokens_bt[2])
    np.testing.assert_allclose(alone.logp_bt[0], padded.logp_bt[2], atol=1e-5)


def test_sampling_determinism_recompiles_prefill_and_logp(llama):
    model, ref = llama
    prompts, mask = ref["input_ids"], ref["attention_mask"]
    kwargs = dict(num_samples=4, max_new_tokens=8, temperature=1.0, top_p=0.95, top_k=50, stop_token_ids=(5,))
    first = generate(jax.random.key(1), model, prompts, mask, **kwargs)
    traces = sampler_lib.TRACE_COUNTS["generate"]
    assert sampler_lib.PREFILL_BATCH_SIZES[-1] == 3  # One prefill row per prompt, not per sample (12).
    again = generate(jax.random.key(1), model, prompts, mask, **kwargs)
    chex.assert_trees_all_equal(first, again)
    tokens = np.asarray(first.tokens_bt).reshape(3, 4, 8)
    assert all(len({tuple(row) for row in group}) > 1 for group in tokens)  # Samples of a prompt differ.
    other = generate(jax.random.key(2), model, prompts, mask, **kwargs)
    assert (np.asarray(other.tokens_bt) != np.asarray(first.tokens_bt)).any()
    # New parameter values, temperature, top-p/k and length within the bucket: no recompilation.
    perturbed = nnx.clone(model)
    nnx.update(perturbed, jax.tree.map(lambda x: x * 1.01, nnx.state(perturbed, nnx.Param)))
    changed = generate(jax.random.key(1), perturbed, prompts, mask, **dict(kwargs, temperature=0.7, top_p=0.5,
                                                                           top_k=3, max_new_tokens=6))
    assert sampler_lib.TRACE_COUNTS["generate"] == traces
    assert changed.tokens_bt.shape == (12, 6)

    # Layout and consistency: prompt-major rows, masks, lengths.
    assert first.tokens_bt.shape == (12, 8) and first.prompt_tokens_bs.shape == (12, 10)
    np.testing.assert_array_equal(first.prompt_tokens_bs[4:8], np.repeat(prompts[1:2], 4, axis=0))
    np.testing.assert_array_equal(first.length_b, np.asarray(first.mask_bt).sum(1))
    stopped = np.asarray(first.mask_bt & (first.tokens_bt == 5)).any(1)
    np.testing.assert_array_equal(first.truncated_b, ~stopped)

    # logp_bt is log π_T of each sampled token (T = 1 here): recompute by teacher forcing.
    tokens = jnp.concatenate([first.prompt_tokens_bs, first.tokens_bt], axis=1)
    full_mask = jnp.concatenate([first.prompt_mask_bs, first.mask_bt], axis=1)
    logits = forward(model, tokens, full_mask)[:, 9:-1]
    expected = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), first.tokens_bt[..., None], -1)[..., 0]
    response = np.asarray(first.mask_bt)
    np.testing.assert_allclose(np.asarray(first.logp_bt)[response], np.asarray(expected)[response], atol=1e-5)
    assert float(jnp.abs(jnp.where(first.mask_bt, 0.0, first.logp_bt)).max()) == 0.0


def test_mixed_precision_rollout_logp_matches_teacher_forcing():
    """bf16 compute (float32 params): the rollout's log-probs are those of the same
    bf16-compute model's full forward (the trainer's), and greedy decoding stays close to
    float32's. With a bf16 KV cache both sides run the same bf16 attention dots; with the CPU
    default, a float32 cache, the decode step's attention is float32 and the forward's bf16."""
    model, ref = load("tiny_llama")
    set_compute_dtype(model, "bfloat16")
    prompts, mask = ref["input_ids"], ref["attention_mask"]
    for cache_dtype, tolerance, mean_tolerance in (("bfloat16", 2e-3, 1e-3), (None, 2e-2, 5e-3)):
        rollout = generate(jax.random.key(3), model, prompts, mask, num_samples=2, max_new_tokens=8,
                           stop_token_ids=NO_STOP, cache_dtype=cache_dtype)
        assert rollout.logp_bt.dtype == jnp.float32
        tokens = jnp.concatenate([rollout.prompt_tokens_bs, rollout.tokens_bt], axis=1)
        full_mask = jnp.concatenate([rollout.prompt_mask_bs, rollout.mask_bt], axis=1)
        logits = forward(model, tokens, full_mask)[:, 9:-1]
        expected = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), rollout.tokens_bt[..., None], -1)[..., 0]
        # bf16 cache: only float32 accumulation order differs. float32 cache: the attention's
        # bf16 rounding on the forward's side too (bf16 carries 8 significant bits).
        np.testing.assert_allclose(rollout.logp_bt, expected, atol=tolerance)
        gap = float(np.mean(np.abs(np.asarray(rollout.logp_bt) - np.asarray(expected))))
        assert gap < mean_tolerance, (cache_dtype, gap)
    greedy = generate(jax.random.key(0), model, prompts, mask, max_new_tokens=8, greedy=True,
                      stop_token_ids=NO_STOP)
    # The tiny fixture's float32 greedy tokens: bf16 may flip a near-tie late in a row, not early.
    np.testing.assert_array_equal(np.asarray(greedy.tokens_bt)[:, :2], ref["greedy_tokens"][:, :2])


def test_mixed_precision_unembedding_copy_keeps_the_rollout(monkeypatch):
    """The once-per-call bf16 [D, V] copy of the tied unembedding gives the same rollout (same
    tokens for a fixed key, log-probs to float32 accumulation order) as casting it in the dot."""
    model, ref = load("tiny_qwen2")
    assert model.lm_head is None  # Tied: the copy is what is under test.
    set_compute_dtype(model, "bfloat16")
    prompts, mask = ref["input_ids"], ref["attention_mask"]
    kwargs = dict(num_samples=3, max_new_tokens=8, temperature=1.0, stop_token_ids=NO_STOP)
    new = generate(jax.random.key(5), model, prompts, mask, **kwargs)
    original = sampler_lib.cast_matmul_weights

    calls = []

    def without_copy(m):  # The cast before the copy existed: the dot casts embed.T itself.
        calls.append(1)
        m = original(m)
        del m.unembed_compute
        return m

    monkeypatch.setattr(sampler_lib, "cast_matmul_weights", without_copy)
    # Retrace _generate_core with the old cast (its own cache only: jax.clear_caches() would
    # make every later test in this process trace and load its programs again).
    sampler_lib._generate_core.clear_cache()
    try:
        old = generate(jax.random.key(5), model, prompts, mask, **kwargs)
    finally:
        monkeypatch.undo()
        sampler_lib._generate_core.clear_cache()
    assert calls, "the rollout without the copy was not traced anew"
    np.testing.assert_array_equal(new.tokens_bt, old.tokens_bt)
    np.testing.assert_array_equal(new.mask_bt, old.mask_bt)
    np.testing.assert_allclose(new.logp_bt, old.logp_bt, atol=1e-5)


def test_mixed_precision_cache_dtype_keeps_the_rollout():
    """bf16 compute: a float32 KV cache (the CPU default up to 512 slots, where the decode
    step's attention runs in float32 on it) and a bf16 one (bf16 attention dots) sample the
    same rollout up to bf16 rounding of the attention."""
    model, ref = load("tiny_qwen2")
    set_compute_dtype(model, "bfloat16")
    prompts, mask = ref["input_ids"], ref["attention_mask"]
    kwargs = dict(num_samples=3, max_new_tokens=8, temperature=1.0, stop_token_ids=NO_STOP)
    f32 = generate(jax.random.key(6), model, prompts, mask, cache_dtype="float32", **kwargs)
    bf16 = generate(jax.random.key(6), model, prompts, mask, cache_dtype="bfloat16", **kwargs)
    default = generate(jax.random.key(6), model, prompts, mask, **kwargs)
    np.testing.assert_array_equal(f32.tokens_bt, bf16.tokens_bt)
    np.testing.assert_allclose(f32.logp_bt, bf16.logp_bt, rtol=1e-2, atol=1e-2)  # bf16: 2**-8 relative
    chex.assert_trees_all_equal(default, f32)


def test_default_cache_dtype_follows_the_slots_on_cpu():
    """`generate`'s default cache under bf16 compute on CPU: float32 while the cache has at most
    512 slots (prompt bucket + response buffer), bf16 beyond; float32 compute keeps float32."""
    model, ref = load("tiny_qwen2")
    prompts, mask = ref["input_ids"], ref["attention_mask"]
    options = dict(num_samples=2, temperature=1.0, top_p=1.0, top_k=0, greedy=False, stop_token_ids=NO_STOP,
                   pad_id=0, bucket=sampler_lib.DEFAULT_BUCKET, cache_dtype=None)

    def cache_dtype(max_new_tokens):
        return sampler_lib.generate_core_call(jax.random.key(0), model, prompts, mask,
                                              max_new_tokens=max_new_tokens, **options)[1]["cache_dtype"]

    assert cache_dtype(8) == "float32" and cache_dtype(520) == "float32"
    set_compute_dtype(model, "bfloat16")
    assert jax.default_backend() == "cpu"
    assert cache_dtype(8) == "float32" and cache_dtype(520) == "bfloat16"
    options["cache_dtype"] = "bfloat16"  # Asked for, it is kept.
    assert cache_dtype(8) == "bfloat16"


def test_bf16_cache_is_written_in_place():
    """The decode step writes a bf16 cache as uint16 bits: XLA:CPU's bf16 dynamic-update-slice
    converts the whole buffer to float32 and back for every write (perf13)."""
    model, _ = load("tiny_qwen2")
    set_compute_dtype(model, "bfloat16")
    cache = model.init_cache(2, 16)
    step = nnx.jit(lambda m, t, p, c: m.decode_step(t, p, c))
    tokens = jnp.ones((2, 1), jnp.int32)
    hlo = step.lower(model, tokens, tokens, cache).compile().as_text()
    cache_shape = ",".join(map(str, cache.keys_bkem[0].shape))
    widened = re.findall(rf"= f32\[{cache_shape}\][^\n]* convert\(", hlo)
    assert not widened, widened
    logits, new_cache = step(model, tokens, tokens, cache)
    assert new_cache.keys_bkem[0].dtype == jnp.bfloat16 and int(new_cache.index) == 1


def _reachable(hlo_text: str, roots) -> set:
    """Names of the computations called (transitively) from `roots` in an HLO module's text."""
    comps = {}
    for block in re.split(r"\n(?=\S)", hlo_text):
        match = re.match(r"(?:ENTRY )?%([\w.\-]+) ", block)
        if match:
            comps[match.group(1)] = block
    seen, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name in seen or name not in comps:
            continue
        seen.add(name)
        todo += re.findall(r"(?:calls|body|condition|to_apply|branch_computations)=\{?%([\w.\-]+)", comps[name])
    return {name: comps[name] for name in seen}


def test_mixed_precision_decode_loop_runs_a_bf16_lm_head_without_recasting():
    """Compiled sampler, tied bf16-compute model: no [V, D] / [D, V] convert inside the decode
    loop, and its [B, D] x [D, V] LM-head dot takes bf16 operands (XLA:CPU's bf16 dot path)
    rather than a float32 upcast of the table."""
    model, ref = load("tiny_qwen2")
    set_compute_dtype(model, "bfloat16")
    vocab, width = model.config.vocab_size, model.config.hidden_size
    graphdef, state = nnx.split(model)
    prompts = np.asarray(ref["input_ids"], np.int32)[:, -8:]
    mask = np.ones(prompts.shape, bool)
    num_samples = 3
    batch = prompts.shape[0] * num_samples
    hlo = sampler_lib._generate_core.lower(
        graphdef, state, jax.random.key(0), prompts, mask, np.int32(8), np.float32(1), np.float32(1),
        np.int32(0), np.asarray(NO_STOP, np.int32), np.int32(0), num_samples=num_samples, buffer_len=16,
        greedy=False, use_filter=False).compile().as_text()
    bodies = re.findall(r"while\(.*?body=%([\w.\-]+)", hlo)
    assert bodies
    loop = "\n".join(_reachable(hlo, bodies).values())
    table = rf"\[({vocab},{width}|{width},{vocab})\]"
    assert not re.search(rf"= \w+{table}\S* convert\(", loop), "the unembedding is converted in the loop"
    types = dict(re.findall(r"%([\w.\-]+) = (\w+)\[", hlo))
    lm_head = re.findall(rf"= f32\[{batch},{vocab}\]\S* dot\(%([\w.\-]+), %([\w.\-]+)\)", loop)
    assert lm_head and {(types[a], types[b]) for a, b in lm_head} == {("bf16", "bf16")}, lm_head


@pytest.mark.parametrize("compute_dtype", ("float32", "bfloat16"))
def test_decode_loop_reads_the_weights_without_copying_them(compute_dtype):
    """Compiled sampler: inside the decode loop no instruction but a parameter, tuple access
    or bitcast has the shape of a block matrix. A layer scan over the stacked [L, ...] weights
    made XLA:CPU copy every layer's matrices out of the stack on every step, and contracting
    wo's (head, dim) axes apart made it re-transpose wo on every step (perf14)."""
    model, ref = load("tiny_qwen2")
    set_compute_dtype(model, compute_dtype)
    c = model.config
    d, f, q, kv = c.hidden_size, c.intermediate_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    graphdef, state = nnx.split(model)
    prompts = np.asarray(ref["input_ids"], np.int32)[:, -8:]
    hlo = sampler_lib._generate_core.lower(
        graphdef, state, jax.random.key(0), prompts, np.ones(prompts.shape, bool), np.int32(8), np.float32(1),
        np.float32(1), np.int32(0), np.asarray(NO_STOP, np.int32), np.int32(0), num_samples=3, buffer_len=16,
        greedy=False, use_filter=False).compile().as_text()
    bodies = re.findall(r"while\(.*?body=%([\w.\-]+)", hlo)
    loop = "\n".join(_reachable(hlo, bodies).values())
    matrix_shapes = {(d, f), (f, d), (d, q), (q, d), (d, kv), (kv, d), (d, c.num_heads, c.head_dim),
                     (c.num_heads, c.head_dim, d), (c.head_dim, c.num_heads, d), (d, c.num_kv_heads, c.head_dim)}
    assert 3 * prompts.shape[0] not in {d, f, q, kv}  # Activations [B, ..] cannot pass for weights.
    copies = []
    for name, shape, op in re.findall(r"%([\w.\-]+) = \w+\[([\d,]*)\]\S* ([\w\-]+)\(", loop):
        dims = tuple(int(n) for n in shape.split(",") if n)
        if dims in matrix_shapes and op not in ("parameter", "get-tuple-element", "bitcast", "tuple"):
            copies.append(f"{name} {op} {dims}")
    assert not copies, copies


class FilterLogitsTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_top_k_then_top_p_hand_computed(self):
        logits = jnp.log(jnp.array([[0.05, 0.5, 0.15, 0.3]]))
        neg = jnp.finfo(jnp.float32).min
        fn = self.variant(filter_logits)
        # top-p 0.83 alone: mass before each sorted token = 0, .5, .8, .95 -> keep .5, .3, .15.
        kept = fn(logits, top_k=jnp.int32(0), top_p=jnp.float32(0.83)) > neg
        np.testing.assert_array_equal(kept, [[False, True, True, True]])
        # top-k 3 first renormalises to .5/.95, .3/.95, .15/.95: mass before .15 is .842 >= .83 -> drop it.
        kept = fn(logits, top_k=jnp.int32(3), top_p=jnp.float32(0.83)) > neg
        np.testing.assert_array_equal(kept, [[False, True, False, True]])
        kept = fn(logits, top_k=jnp.int32(1), top_p=jnp.float32(1.0)) > neg
        np.testing.assert_array_equal(kept, [[False, True, False, False]])
        # A tiny top_p still keeps the most likely token.
        kept = fn(logits, top_k=jnp.int32(0), top_p=jnp.float32(1e-6)) > neg
        np.testing.assert_array_equal(kept, [[False, True, False, False]])


def test_sample_token_distribution():
    """Frequencies over 20000 draws match softmax(logits / T) restricted to the nucleus."""
    logits = jnp.log(jnp.array([[0.05, 0.5, 0.15, 0.3]]))
    keys = jax.random.split(jax.random.key(0), 20000)
    draw = jax.jit(jax.vmap(lambda k: sample_token(k, logits, temperature=jnp.float32(0.5), top_k=jnp.int32(0),
                                                   top_p=jnp.float32(0.9), greedy=False, use_filter=True)[0]))
    counts = np.bincount(np.asarray(draw(keys)), minlength=4) / 20000
    # T = 0.5 squares the probabilities: .0025, .25, .0225, .09 (sum .365) -> .0068, .685, .0616, .247.
    # Nucleus 0.9: mass before sorted tokens 0, .685, .932 -> keep .685 and .247, renormalised:
    expected = np.array([0.0, 0.25, 0.0, 0.09]) / 0.34
    np.testing.assert_allclose(counts, expected, atol=0.015)


def test_inverse_cdf_draws_match_probabilities_across_blocks():
    """Mass spread over three vocabulary blocks, zero-probability tokens in between and at the
    block edges (filtered logits at finfo.min): frequencies match, zero-mass tokens never drawn."""
    vocab = 2 * CDF_BLOCK + 50
    probs = np.zeros(vocab)
    probs[[3, CDF_BLOCK - 1, CDF_BLOCK, 2 * CDF_BLOCK + 49]] = [0.1, 0.2, 0.3, 0.4]
    logits = jnp.where(probs > 0, jnp.log(jnp.asarray(probs, jnp.float32)), jnp.finfo(jnp.float32).min)[None]
    keys = jax.random.split(jax.random.key(0), 20000)
    draws = np.asarray(jax.jit(jax.vmap(lambda k: categorical_inverse_cdf(k, logits)[0]))(keys))
    counts = np.bincount(draws, minlength=vocab) / len(draws)
    assert set(np.flatnonzero(counts)) <= set(np.flatnonzero(probs))
    np.testing.assert_allclose(counts, probs, atol=0.015)  # 4.5 binomial sd at n = 20000.
    # Same key, same draw; a batch of rows draws each row independently.
    batch = jnp.concatenate([logits, logits[:, ::-1]], axis=0)
    first = categorical_inverse_cdf(jax.random.key(3), batch)
    np.testing.assert_array_equal(first, categorical_inverse_cdf(jax.random.key(3), batch))
    assert first.dtype == jnp.int32 and probs[int(first[0])] > 0 and probs[::-1][int(first[1])] > 0


class SampleTokenAndLogprobTest(chex.TestCase):
    """The decode loop's draw and log-prob: `sample_token`'s token, `ratios.token_logprobs`'s value."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_same_draw_and_tempered_logprob(self):
        """The log-prob is log softmax(z / T) of the drawn token, the trainer's (greedy: T = 1)."""
        logits = 4.0 * jax.random.normal(jax.random.key(0), (5, 3 * CDF_BLOCK + 7))
        fn = self.variant(sampler_lib.sample_token_and_logprob, static_argnames=("greedy", "use_filter"))
        for temperature, greedy, use_filter in ((1.0, False, False), (0.7, False, False), (1.3, False, True),
                                                (0.5, True, False)):
            hyper = dict(temperature=jnp.float32(temperature), top_k=jnp.int32(5), top_p=jnp.float32(0.9),
                         greedy=greedy, use_filter=use_filter)
            scored = logits if greedy else logits / temperature
            for seed in range(3):
                token, logp = fn(jax.random.key(seed), logits, **hyper)
                np.testing.assert_array_equal(token, sample_token(jax.random.key(seed), logits, **hyper))
                expected = ratios.token_logprobs(scored[:, None, :], token[:, None])[:, 0]
                np.testing.assert_allclose(logp, expected, atol=1e-5, rtol=1e-6)
                assert token.dtype == jnp.int32 and logp.dtype == jnp.float32

    def test_hand_computed(self):
        """Two tokens with logits (log 3, log 1): π_1 = (3/4, 1/4); at T = 0.5, π ∝ (9, 1)."""
        logits = jnp.log(jnp.asarray([[3.0, 1.0]]))
        for temperature, probs in ((1.0, (0.75, 0.25)), (0.5, (0.9, 0.1))):
            for seed in range(4):
                token, logp = sampler_lib.sample_token_and_logprob(
                    jax.random.key(seed), logits, temperature=jnp.float32(temperature), top_k=jnp.int32(0),
                    top_p=jnp.float32(1.0), greedy=False, use_filter=False)
                np.testing.assert_allclose(logp, np.log([probs[int(token[0])]]), rtol=1e-6)

    def test_the_normaliser_reuses_the_draws_probabilities(self):
        """Without a filter, at any temperature, the log-normaliser comes from the draw's mass:
        one exp over the vocabulary in all (no second pass)."""
        jaxpr = jax.make_jaxpr(lambda z, t: sampler_lib.sample_token_and_logprob(
            jax.random.key(0), z, temperature=t, top_k=jnp.int32(0), top_p=jnp.float32(1.0), greedy=False,
            use_filter=False))(jnp.zeros((2, 8)), jnp.float32(0.7))

        def exps(jaxpr):  # exp equations, nested calls included.
            return sum((eqn.primitive.name == "exp") + sum(
                exps(sub) for sub in jax.extend.core.jaxprs_in_params(eqn.params)) for eqn in jaxpr.eqns)

        assert exps(jaxpr.jaxpr) == 1


def test_input_errors(llama):
    model, ref = llama
    ok_tokens, ok_mask = ref["input_ids"], ref["attention_mask"]
    with pytest.raises(ValueError, match="left-padded"):
        generate(jax.random.key(0), model, ok_tokens, ok_mask[:, ::-1], max_new_tokens=4)
    empty = ok_mask.copy()
    empty[1] = False
    with pytest.raises(ValueError, match=r"Prompts \[1\] have no real token"):
        generate(jax.random.key(0), model, ok_tokens, empty, max_new_tokens=4)
    with pytest.raises(ValueError, match="temperature=0"):
        generate(jax.random.key(0), model, ok_tokens, ok_mask, max_new_tokens=4, temperature=0.0)
    with pytest.raises(TypeError, match="must be bool"):
        generate(jax.random.key(0), model, ok_tokens, ok_mask.astype(np.int32), max_new_tokens=4)
    with pytest.raises(ValueError, match="decode_segments=0"):
        generate(jax.random.key(0), model, ok_tokens, ok_mask, max_new_tokens=4, decode_segments=0)


def test_generate_core_call_is_the_call_generate_makes():
    """`generate_core_call` (what benchmarks/profile_step.py compiles) checks the inputs as
    `generate` does and returns exactly the arguments `generate` runs its core with."""
    model, ref = load("tiny_qwen2")
    prompts = np.asarray(ref["input_ids"], np.int32)[:, -8:]
    mask = np.ones(prompts.shape, bool)
    options = dict(num_samples=2, max_new_tokens=5, temperature=0.7, top_p=1.0, top_k=0, greedy=False,
                   stop_token_ids=NO_STOP, pad_id=0, bucket=sampler_lib.DEFAULT_BUCKET, cache_dtype=None)
    rollout = generate(jax.random.key(3), model, prompts, mask, **options)
    core_args, core_kwargs = sampler_lib.generate_core_call(jax.random.key(3), model, prompts, mask, **options)
    tokens_bt = sampler_lib._generate_core(*core_args, **core_kwargs)[0]
    np.testing.assert_array_equal(np.asarray(tokens_bt)[:, :5], np.asarray(rollout.tokens_bt))
    with pytest.raises(ValueError, match="left-padded"):
        holed = mask.copy()
        holed[:, 1] = False  # a real token after padding
        sampler_lib.generate_core_call(jax.random.key(3), model, prompts, holed, **options)
