"""Write tests/fixtures/smollm2_reference.npz: transformers' own reading of the SmolLM2 GGUF.

Run ONCE, in a virtualenv with torch (tests never need torch):

    python3 -m venv /tmp/torchvenv2
    /tmp/torchvenv2/bin/pip install torch==2.13.0 transformers==5.24.0 gguf numpy jinja2
    /tmp/torchvenv2/bin/python scripts/make_gguf_reference.py [--gguf PATH] [--out NPZ]

The GGUF comes from `python experiments/get_smollm2.py`. The fixture holds, per prompt, the
token ids transformers' GGUF tokenizer produces, float32 logits of
`AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)` at every position restricted to a
fixed set of vocabulary columns (every position's top-16 plus 256 random ids), the full-vocab
argmax per position, and the greedy continuation from `generate` (stops at EOS, then
pad_token_id); plus tokenizer cases
(encode / decode / chat template). Kept < 500 KB.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "experiments"))
import get_smollm2  # noqa: E402

PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Question: What is 12 + 35?\nAnswer:",
)
CHAT = ({"role": "user", "content": "What is 2+2?"},)
TOKENIZER_TEXTS = (
    "Hello world!",
    "What is 123+4567? It's 5,690.",
    "  two  spaces\n\nnew\tline ",
    "héllo wörld — 日本語 🙂",
    "<|im_start|>user\nhi<|im_end|>\n",
    "x^2 + y^2 = z^2; \\frac{1}{2}",
)
GREEDY_TOKENS = 12


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", default=get_smollm2.default_path())
    parser.add_argument(
        "--out",
        default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "smollm2_reference.npz"),
    )
    args = parser.parse_args(argv)

    import torch
    import transformers

    directory, name = os.path.split(os.path.abspath(args.gguf))
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory, gguf_file=name)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    model.eval()

    prompts = list(PROMPTS) + [tokenizer.apply_chat_template(list(CHAT), add_generation_prompt=True, tokenize=False)]
    ids = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    max_len = max(map(len, ids))
    ids_ps = np.zeros((len(ids), max_len), np.int32)
    len_p = np.array([len(x) for x in ids], np.int32)
    logits = []
    greedy = np.zeros((len(ids), GREEDY_TOKENS), np.int32)
    with torch.no_grad():
        for p, row in enumerate(ids):
            ids_ps[p, : len(row)] = row
            tokens = torch.tensor([row])
            logits.append(model(tokens).logits[0].float().numpy())
            out = model.generate(tokens, max_new_tokens=GREEDY_TOKENS, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)[0, len(row) :].numpy()
            greedy[p] = np.pad(out, (0, GREEDY_TOKENS - out.size), constant_values=tokenizer.pad_token_id)
    rng = np.random.default_rng(0)
    top = np.concatenate([np.argsort(-lg, axis=-1)[:, :16].reshape(-1) for lg in logits])
    columns = np.unique(np.concatenate([top, rng.choice(logits[0].shape[-1], 256, replace=False)]))
    sub_logits = np.zeros((len(ids), max_len, columns.size), np.float32)
    argmax_ps = np.full((len(ids), max_len), -1, np.int32)
    for p, lg in enumerate(logits):
        sub_logits[p, : lg.shape[0]] = lg[:, columns]
        argmax_ps[p, : lg.shape[0]] = lg.argmax(-1)

    tok_ids = [tokenizer.encode(t, add_special_tokens=False) for t in TOKENIZER_TEXTS]
    np.savez_compressed(
        args.out,
        prompts=np.array(prompts),
        ids_ps=ids_ps,
        len_p=len_p,
        columns=columns.astype(np.int32),
        logits_psc=sub_logits,
        argmax_ps=argmax_ps,
        greedy_pt=greedy,
        tokenizer_texts=np.array(TOKENIZER_TEXTS),
        tokenizer_ids=np.array(json.dumps(tok_ids)),
        tokenizer_decoded=np.array([tokenizer.decode(x, skip_special_tokens=True) for x in tok_ids]),
        chat_messages=np.array(json.dumps(list(CHAT))),
        chat_text=np.array(prompts[-1]),
        versions=np.array(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__})),
    )
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes); columns={columns.size}, prompts={len(ids)}")


if __name__ == "__main__":
    main()
