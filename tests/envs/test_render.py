"""Observations as template deltas, per chat-template family: the prompt ids, the model's ids
and each observation's delta concatenate to the ids of a full render of the conversation."""

import pytest

from jaxrl_vr.envs import Renderer, TemplateError
from jaxrl_vr.models import tokenizers as tk

CHATML = (  # SmolLM2, Qwen2
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LLAMA3 = (
    "<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
QWEN_TOOLS = (  # Qwen2.5 / Qwen3: a tool result is a user turn wrapped in <tool_response>
    "{% for m in messages %}{% if m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}"
    "\n</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
NO_TOOL_ROLE = (
    "{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('roles must be user/assistant') }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
STRIPS = (  # trims the assistant's content: a turn is not rendered verbatim
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eot_id|>"]


def tokenizer(template, eos):
    """A tiny byte-level BPE. No merge across a newline: a tokenizer whose generation prompt
    ends in whitespace that merges with what follows ("\n\n" + text under GPT-2's split)
    tokenizes a full render differently at that boundary, whatever the rendering does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = list(tk.byte_to_unicode().values())
    vocab = {c: i for i, c in enumerate(alphabet)}
    merges = [("p", "r"), ("pr", "i"), ("Ġ", "4"), ("4", "2"), ("4", "Ċ")]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    raw = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    hf = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token=eos,
                                 additional_special_tokens=[s for s in SPECIALS if s != eos], chat_template=template)
    return tk.HFTokenizer(hf)


@pytest.mark.parametrize("template, eos", [(CHATML, "<|im_end|>"), (LLAMA3, "<|eot_id|>"),
                                           (QWEN_TOOLS, "<|im_end|>")], ids=["chatml", "llama3", "qwen"])
def test_concatenated_ids_equal_a_full_render(template, eos):
    tok = tokenizer(template, eos)
    renderer = Renderer(tok, chat=True, system_prompt="Use tools.")
    history = [{"role": "user", "content": "What is 6*7?"}]
    turns = ["<tool_call>print(6*7)</tool_call>", "Again: <tool_call>6*7</tool_call>", "It is 42."]
    outputs = ["42\n", "42"]
    ids = renderer.prompt_ids(history)
    for turn, output in zip(turns, outputs):
        ids += tok.encode(turn)  # the model's ids (here: the encoding of its text)
        observation = [{"role": "tool", "content": output}]
        ids += renderer.observation_ids(history, turn, observation)
        history = [*history, {"role": "assistant", "content": turn}, *observation]
    ids += tok.encode(turns[-1]) + [tok.eos_id]
    conversation = [*history, {"role": "assistant", "content": turns[-1]}]
    full = tok.encode(renderer.text(conversation, add_generation_prompt=False))
    assert full[:len(ids)] == ids
    assert tok.decode(full[len(ids):], skip_special_tokens=False).strip() == ""  # only the template's "\n"
    assert renderer.check("tool") > 0


def test_templates_that_cannot_render_a_tool_turn_fail_at_start_up():
    with pytest.raises(TemplateError, match="task.env.role=user"):
        Renderer(tokenizer(NO_TOOL_ROLE, "<|im_end|>"), chat=True, model_name="m").check("tool")
    assert Renderer(tokenizer(NO_TOOL_ROLE, "<|im_end|>"), chat=True).check("user") > 0
    with pytest.raises(TemplateError, match="verbatim"):
        Renderer(tokenizer(STRIPS, "<|im_end|>"), chat=True).observation_ids(
            [{"role": "user", "content": "q"}], "answer  ", [{"role": "tool", "content": "x"}])


def test_plain_rendering_writes_unknown_characters_as_question_marks():
    tok = tk.CharTokenizer("0123456789{}?")
    renderer = Renderer(tok, chat=False)
    assert renderer.prompt_ids([{"role": "user", "content": "12"}]) == [tok.bos_id, *tok.encode("12")]
    assert renderer.observation_ids([], "1", [{"role": "tool", "content": "{4x2}"}]) == tok.encode("{4?2}")
