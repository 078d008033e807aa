"""SmolLM2-135M-Instruct (Q4_1 GGUF) against transformers' own GGUF loader.

The reference (tests/fixtures/smollm2_reference.npz) was written once by
scripts/make_gguf_reference.py with torch + transformers; these tests need neither. They are
skipped when the GGUF is absent: fetch it with `python experiments/get_smollm2.py` or point
$JAXRL_VR_SMOLLM2_GGUF at it.
"""

import importlib.util
import json
import os

import jax
import numpy as np
import pytest

_SPEC = importlib.util.spec_from_file_location(
    "get_smollm2", os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "get_smollm2.py")
)
get_smollm2 = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(get_smollm2)

GGUF_PATH = get_smollm2.default_path()
FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "smollm2_reference.npz")

pytestmark = [
    pytest.mark.skipif(not os.path.isfile(GGUF_PATH),
                       reason=f"SmolLM2 GGUF not at {GGUF_PATH}; run `python experiments/get_smollm2.py`."),
    # One xdist worker loads the checkpoint once (module fixture), not each worker (13 s).
    pytest.mark.xdist_group("smollm2_gguf"),
]


@pytest.fixture(scope="module")
def reference():
    return dict(np.load(FIXTURE))


@pytest.fixture(scope="module")
def loaded():
    from jaxrl_vr.models.gguf_io import from_gguf

    return from_gguf(GGUF_PATH)


@pytest.mark.slow
def test_config_from_metadata(loaded):
    model, _ = loaded
    c = model.config
    # SmolLM2-135M: 30 layers, width 576, 9 query / 3 kv heads of 64, SwiGLU 1536, tied, theta 1e5.
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim) == (30, 576, 9, 3, 64)
    assert (c.intermediate_size, c.vocab_size, c.tie_word_embeddings) == (1536, 49152, True)
    assert (c.rope_theta, c.rms_norm_eps, c.model_type) == (100000.0, 1e-5, "llama")


def _left_padded(reference):
    lengths = reference["len_p"]
    width = int(lengths.max())
    tokens_ps = np.zeros((len(lengths), width), np.int32)
    mask_ps = np.zeros((len(lengths), width), bool)
    for p, length in enumerate(lengths):
        tokens_ps[p, width - length :] = reference["ids_ps"][p, :length]
        mask_ps[p, width - length :] = True
    return tokens_ps, mask_ps


@pytest.mark.slow
def test_logits_match_transformers(loaded, reference):
    """Both sides dequantise the same Q4_1 weights in float32: logits (|x| ~ 30) agree to 2e-3.

    All prompts go in one left-padded batch (one compilation), so this also checks that left
    padding leaves a prompt's logits unchanged.
    """
    model, _ = loaded
    columns = reference["columns"]
    tokens_ps, mask_ps = _left_padded(reference)
    logits_psv = np.asarray(model(tokens_ps, mask_bt=mask_ps))
    width = tokens_ps.shape[1]
    for p, length in enumerate(reference["len_p"]):
        logits_tv = logits_psv[p, width - length :]
        np.testing.assert_allclose(logits_tv[:, columns], reference["logits_psc"][p, :length], atol=2e-3, rtol=0)
        top2 = np.sort(logits_tv, axis=-1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > 1e-2  # argmax is only meaningful without a near-tie
        np.testing.assert_array_equal(logits_tv.argmax(-1)[clear], reference["argmax_ps"][p, :length][clear])


@pytest.mark.slow
def test_greedy_generation_matches_transformers(loaded, reference):
    """jaxrl_vr.sampling.generate(greedy) == transformers' generate(do_sample=False), EOS-padded."""
    from jaxrl_vr.sampling import generate

    model, tokenizer = loaded
    tokens_ps, mask_ps = _left_padded(reference)
    steps = reference["greedy_pt"].shape[1]
    rollout = generate(jax.random.key(0), model, tokens_ps, mask_ps, max_new_tokens=steps, greedy=True,
                       stop_token_ids=(tokenizer.eos_id,), pad_id=tokenizer.pad_id)
    np.testing.assert_array_equal(np.asarray(rollout.tokens_bt), reference["greedy_pt"])


@pytest.mark.slow
def test_tokenizer_matches_transformers(loaded, reference):
    _, tokenizer = loaded
    texts = list(reference["tokenizer_texts"])
    expected = json.loads(str(reference["tokenizer_ids"]))
    for text, ids, decoded in zip(texts, expected, reference["tokenizer_decoded"]):
        assert tokenizer.encode(text) == ids, text
        assert tokenizer.decode(ids) == decoded
    for p, length in enumerate(reference["len_p"]):
        assert tokenizer.encode(str(reference["prompts"][p])) == reference["ids_ps"][p, :length].tolist()
    messages = json.loads(str(reference["chat_messages"]))
    assert tokenizer.apply_chat_template(messages) == str(reference["chat_text"])
    assert (tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id, tokenizer.vocab_size) == (1, 2, 2, 49152)
