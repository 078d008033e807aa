"""Tokenizer protocol: CharTokenizer ids by hand, HFTokenizer parity with transformers, dispatch."""

import pytest

from jaxrl_vr.models import tokenizers as tk

# ----------------------------------------------------------------------------- CharTokenizer


def test_char_ids_by_hand():
    tok = tk.CharTokenizer("0123456789+=")
    # ids: 0 pad, 1 bos, 2 eos, '0' -> 3, ..., '9' -> 12, '+' -> 13, '=' -> 14.
    assert tok.encode("12+3=") == [4, 5, 13, 6, 14]
    assert tok.encode("12+3=", add_bos=True) == [1, 4, 5, 13, 6, 14]
    assert tok.encode("") == []
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    assert tok.vocab_size == 3 + 12


def test_char_decode_skips_specials_by_default():
    tok = tk.CharTokenizer("ab")
    assert tok.decode([1, 3, 4, 3, 2, 0, 0]) == "aba"
    assert tok.decode([1, 3, 2, 0], skip_special_tokens=False) == "<bos>a<eos><pad>"


def test_char_roundtrip_every_char():
    alphabet = "0123456789+-*/=() xyz"
    tok = tk.CharTokenizer(alphabet)
    ids = tok.encode(alphabet)
    assert ids == list(range(3, 3 + len(alphabet)))
    assert tok.decode(ids) == alphabet


def test_char_unknown_char_names_it():
    tok = tk.CharTokenizer("0123456789")
    with pytest.raises(ValueError, match=r"'a'.*not in the alphabet"):
        tok.encode("1a2")


def test_char_rejects_bad_alphabet_and_bad_ids():
    with pytest.raises(ValueError, match="repeats 'a'"):
        tk.CharTokenizer("aba")
    with pytest.raises(ValueError, match="non-empty"):
        tk.CharTokenizer("")
    with pytest.raises(ValueError, match="outside"):
        tk.CharTokenizer("ab").decode([5])


def test_char_chat_template_is_plain_text():
    tok = tk.CharTokenizer("0123456789+=")
    messages = [{"role": "system", "content": "1+"}, {"role": "user", "content": "2="}]
    assert tok.apply_chat_template(messages) == "1+2="
    assert tok.apply_chat_template(messages, add_generation_prompt=False) == "1+2="
    with pytest.raises(TypeError, match="role"):
        tok.apply_chat_template("1+2=")


def test_char_satisfies_protocol():
    assert isinstance(tk.CharTokenizer("ab"), tk.Tokenizer)


# ----------------------------------------------------------------------------- HF directory

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A tiny byte-level BPE tokenizer saved the transformers way (tokenizer.json + config)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = list(tk.byte_to_unicode().values())
    vocab = {c: i for i, c in enumerate(alphabet)}
    merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("Ġ", "w"), ("o", "r")]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    raw = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    hf = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token="<|bos|>",
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"],
        chat_template=CHAT_TEMPLATE,
    )
    path = tmp_path_factory.mktemp("hf_tok")
    hf.save_pretrained(path)
    return path


def test_hf_dir_matches_transformers(hf_dir):
    from transformers import AutoTokenizer

    ours = tk.load_tokenizer(str(hf_dir))
    ref = AutoTokenizer.from_pretrained(hf_dir)
    assert isinstance(ours, tk.HFTokenizer) and isinstance(ours, tk.Tokenizer)
    texts = ["hello world", "  hello\n\nworld ", "héllo 🙂", "<|im_start|>user\nhello<|im_end|>"]
    for text in texts:
        ids = ours.encode(text)
        assert ids == ref.encode(text, add_special_tokens=False)
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True)
        assert ours.decode(ids, skip_special_tokens=False) == ref.decode(ids)
    assert ours.encode("hello", add_bos=True) == [ref.bos_token_id, *ref.encode("hello", add_special_tokens=False)]
    # 'hello' -> he+ll merge -> 'hell', then 'o': two tokens (256 bytes + 5 merges: hell = 258).
    assert ours.encode("hello") == [258, ref.convert_tokens_to_ids("o")]
    assert (ours.eos_id, ours.bos_id) == (ref.eos_token_id, ref.bos_token_id)
    assert ours.pad_id == ours.eos_id  # No pad token: falls back to EOS.
    assert ours.vocab_size == len(ref)
    messages = [{"role": "user", "content": "hello"}]
    assert ours.apply_chat_template(messages) == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    assert ours.apply_chat_template(messages, add_generation_prompt=False) == ref.apply_chat_template(
        messages, add_generation_prompt=False, tokenize=False
    )


def test_hf_add_bos_without_bos_token_raises(hf_dir):
    ours = tk.load_tokenizer(str(hf_dir))
    ours.bos_id = None
    with pytest.raises(ValueError, match="no bos_token"):
        ours.encode("hello", add_bos=True)


# ----------------------------------------------------------------------------- dispatch


def test_load_tokenizer_dispatch_and_errors(tmp_path):
    char = tk.load_tokenizer("char:0123456789+=")
    assert isinstance(char, tk.CharTokenizer) and char.alphabet == "0123456789+="
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        tk.load_tokenizer(str(tmp_path))  # An empty directory.
    with pytest.raises(FileNotFoundError, match="does not exist"):
        tk.load_tokenizer(str(tmp_path / "missing.gguf"))
    with pytest.raises(ValueError, match="cannot tell"):
        tk.load_tokenizer(str(tmp_path / "nothing_here"))


def test_byte_to_unicode_is_a_printable_bijection():
    table = tk.byte_to_unicode()
    assert len(table) == 256 and len(set(table.values())) == 256
    assert table[ord("a")] == "a" and table[ord("!")] == "!"
    # Space (0x20) is the 33rd non-printable byte (0..32) -> chr(256 + 32) = 'Ġ'.
    assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ"
    assert all(c.isprintable() for c in table.values())
