"""Multi-turn sampling: a continued conversation scores exactly as one full forward pass over
the conversation without holes, stop sequences end a turn per row, frozen rows stay frozen,
the append-prefill is the same under jit and without it, and nothing recompiles per turn."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_vr import ratios
from jaxrl_vr.models import Decoder, DecoderConfig
from jaxrl_vr.sampling import multiturn as mt


@pytest.fixture(scope="module")
def model():
    return Decoder(DecoderConfig.tiny(32, eos_token_id=2), rngs=nnx.Rngs(params=3))


def prompts():
    tokens = np.array([[0, 0, 1, 5, 6], [1, 7, 8, 9, 10]], np.int32)
    return tokens, tokens > 0


def full_logprobs(model, prompt_s, seq):
    """log π of each token of `seq` after the prompt, from one forward pass without a cache."""
    ids = np.concatenate([prompt_s, seq]).astype(np.int32)[None]
    logits = model(jnp.asarray(ids))
    return np.asarray(ratios.token_logprobs(logits[:, len(prompt_s) - 1:-1], jnp.asarray(ids[:, len(prompt_s):])))[0]


def test_continued_conversation_matches_a_full_forward(model):
    tokens_ps, mask_ps = prompts()
    session = mt.start(model, tokens_ps, mask_ps, num_samples=2, capacity=96)
    live = np.ones(4, bool)
    session, turn1 = mt.decode_turn(jax.random.key(0), model, session, live, max_tokens=6,
                                    stop_token_ids=(-1,))
    observations = [[11, 12, 13], [], [14], [15, 16, 17, 18, 19]]  # row 1 gets none: frozen
    session = mt.append(model, session, observations)
    live2 = np.array([True, False, True, True])
    session, turn2 = mt.decode_turn(jax.random.key(1), model, session, live2, max_tokens=5,
                                    stop_token_ids=(-1,))
    assert not np.asarray(turn2.mask_bw)[1].any()
    for b in (0, 2, 3):
        p = b // 2
        prompt = tokens_ps[p][mask_ps[p]]
        t1 = np.asarray(turn1.tokens_bw)[b][np.asarray(turn1.mask_bw)[b]]
        t2 = np.asarray(turn2.tokens_bw)[b][np.asarray(turn2.mask_bw)[b]]
        seq = np.concatenate([t1, observations[b], t2])
        logp = full_logprobs(model, prompt, seq)
        sampled = np.concatenate([np.asarray(turn1.logp_bw)[b][:len(t1)], np.asarray(turn2.logp_bw)[b][:len(t2)]])
        policy = np.concatenate([logp[:len(t1)], logp[len(t1) + len(observations[b]):]])
        np.testing.assert_allclose(sampled, policy, atol=2e-5)
    assert np.asarray(session.pos_b).tolist() == [
        int(mask_ps[b // 2].sum()) + int(np.asarray(turn1.mask_bw)[b].sum()) + len(observations[b])
        + int(np.asarray(turn2.mask_bw)[b].sum()) for b in range(4)]


def test_stop_sequence_and_stop_token_end_a_row_s_turn(model):
    tokens_ps, mask_ps = prompts()
    # Greedy rows are deterministic: find what row 0 emits, then stop on its 2nd-3rd tokens.
    session = mt.start(model, tokens_ps, mask_ps, num_samples=1, capacity=64)
    _, free = mt.decode_turn(jax.random.key(0), model, session, np.ones(2, bool), max_tokens=8, greedy=True)
    row0 = np.asarray(free.tokens_bw)[0]
    session = mt.start(model, tokens_ps, mask_ps, num_samples=1, capacity=64)
    seqs = mt.encode_stop_sequences([[int(row0[1]), int(row0[2])]])
    _, turn = mt.decode_turn(jax.random.key(0), model, session, np.ones(2, bool), max_tokens=8, greedy=True,
                             stop_sequences=seqs, stop_token_ids=(int(np.asarray(free.tokens_bw)[1][0]),))
    first_hit = next(i for i in range(1, 8) if row0[i - 1] == row0[1] and row0[i] == row0[2])
    assert np.asarray(turn.mask_bw)[0].sum() == first_hit + 1
    assert int(turn.stop_b[0]) == mt.STOP_SEQUENCE
    assert np.asarray(turn.mask_bw)[1].sum() == 1 and int(turn.stop_b[1]) == mt.STOP_TOKEN


def test_cap_and_overflow(model):
    tokens_ps, mask_ps = prompts()
    session = mt.start(model, tokens_ps, mask_ps, num_samples=1, capacity=16)
    session, turn = mt.decode_turn(jax.random.key(0), model, session, np.ones(2, bool), max_tokens=4,
                                   stop_token_ids=(-1,))
    assert np.asarray(turn.mask_bw).sum(1).tolist() == [4, 4] and np.asarray(turn.stop_b).tolist() == [0, 0]
    with pytest.raises(ValueError, match="capacity is 16"):
        mt.append(model, session, [[3] * 20, []])


def test_append_prefill_jit_and_no_jit_agree(model):
    tokens_ps, mask_ps = prompts()
    chunks = [[11, 12], [13, 14, 15]]
    session = mt.start(model, tokens_ps, mask_ps, num_samples=1, capacity=48)
    jitted = mt.append(model, session, chunks)
    session = mt.start(model, tokens_ps, mask_ps, num_samples=1, capacity=48)
    tokens = np.zeros((2, 16), np.int32)
    mask = np.zeros((2, 16), bool)
    for b, ids in enumerate(chunks):
        tokens[b, 16 - len(ids):], mask[b, 16 - len(ids):] = ids, True
    graphdef, state = nnx.split(model)
    with jax.disable_jit():
        plain = mt._append_core.__wrapped__(graphdef, state, session, jnp.asarray(tokens), jnp.asarray(mask))
    np.testing.assert_allclose(np.asarray(jitted.logits_bv), np.asarray(plain.logits_bv), atol=1e-5)
    assert np.asarray(jitted.pos_b).tolist() == np.asarray(plain.pos_b).tolist() == [5, 8]


def test_turns_do_not_recompile(model):
    tokens_ps, mask_ps = prompts()
    counts = []
    for seed in range(2):
        session = mt.start(model, tokens_ps, mask_ps, num_samples=2, capacity=80)
        for turn in range(3):
            session, _ = mt.decode_turn(jax.random.key(seed * 10 + turn), model, session, np.ones(4, bool),
                                        max_tokens=5 + turn, stop_token_ids=(2,))
            session = mt.append(model, session, [[3] * (turn + 1)] * 4)
        counts.append(dict(mt.TRACE_COUNTS))
    assert counts[0] == counts[1]


def test_the_cache_grows_with_the_conversation_up_to_its_capacity(model):
    tokens_ps, mask_ps = prompts()
    session = mt.start(model, tokens_ps, mask_ps, num_samples=1, capacity=200)
    assert session.cache.valid_bm.shape[1] == mt.GROW_SLOTS  # the prompt and a first turn's room
    session, _ = mt.decode_turn(jax.random.key(0), model, session, np.ones(2, bool), max_tokens=60,
                                stop_token_ids=(-1,))
    assert session.cache.valid_bm.shape[1] == 2 * mt.GROW_SLOTS and int(session.cache.index) == 5 + 60
    session = mt.append(model, session, [[3] * 40, [4]])
    assert session.cache.valid_bm.shape[1] == 2 * mt.GROW_SLOTS
    session = mt.append(model, session, [[3] * 40, []])
    assert session.cache.valid_bm.shape[1] == 3 * mt.GROW_SLOTS and int(session.cache.index) == 161
    session, _ = mt.decode_turn(jax.random.key(1), model, session, np.ones(2, bool), max_tokens=36,
                                stop_token_ids=(-1,))
    assert session.cache.valid_bm.shape[1] == 208  # capped at the capacity (200, rounded up to 16)
    with pytest.raises(ValueError, match="capacity is 208"):
        mt.append(model, session, [[3], []])
