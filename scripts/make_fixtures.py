"""Builds tiny random Hugging Face checkpoints + torch reference outputs under tests/fixtures/.

Needs torch + transformers (never imported by the tests). Run in a separate venv:

  python3 -m venv /tmp/torchvenv
  /tmp/torchvenv/bin/pip install torch==2.13.0 transformers==5.24.0 safetensors numpy
  /tmp/torchvenv/bin/python scripts/make_fixtures.py            # writes tests/fixtures/<name>/
  /tmp/torchvenv/bin/python scripts/make_fixtures.py --check DIR  # torch-loads a jaxrl_vr save

Each fixture directory holds config.json + model.safetensors (transformers save_pretrained)
and reference.npz with:
  input_ids [B, S] int32 (left-padded with 0), attention_mask [B, S] bool,
  position_ids [B, S] int32 (cumsum(mask) - 1, 0 at padding),
  logits [B, S, V] float32 (eager attention, fp32),
  greedy_tokens [B, N] int32 (model.generate, do_sample=False, no EOS stop).

`--check DIR` loads DIR (written by `jaxrl_vr.models.save_pretrained`) with
AutoModelForCausalLM and compares its logits on DIR/reference.npz's batch against the
`logits` stored there (the JAX model's); it prints the max abs difference.
"""

from __future__ import annotations

import argparse
import os
import shutil

import numpy as np
import torch
import transformers

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
VOCAB = 128
NEW_TOKENS = 8

_COMMON = dict(vocab_size=VOCAB, num_hidden_layers=2, max_position_embeddings=256, rms_norm_eps=1e-6,
               bos_token_id=1, eos_token_id=2, pad_token_id=0)

CONFIGS = {
    # Llama with Llama-3.1 RoPE scaling (old context 64: wavelengths 16..64 are blended), untied.
    "tiny_llama": transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        tie_word_embeddings=False,
        rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=64),
        **_COMMON),
    # Qwen2: q/k/v bias, tied embeddings (like Qwen2.5-0.5B), GQA 4:1.
    "tiny_qwen2": transformers.Qwen2Config(
        hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=1,
        tie_word_embeddings=True, rope_parameters=dict(rope_type="default", rope_theta=1_000_000.0),
        **_COMMON),
    # Qwen3: per-head q/k RMSNorm, head_dim decoupled from hidden (4*16 != 32), o_proj bias.
    "tiny_qwen3": transformers.Qwen3Config(
        hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        attention_bias=True, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="default", rope_theta=1_000_000.0), **_COMMON),
}


def reference_batch(seed: int = 0, batch: int = 3, length: int = 10):
    """Left-padded batch with 0, 3 and 5 pads; pads hold id 0."""
    rng = np.random.default_rng(seed)
    input_ids = rng.integers(3, VOCAB, size=(batch, length)).astype(np.int64)
    mask = np.ones((batch, length), bool)
    for row, pads in enumerate((0, 3, 5)[:batch]):
        mask[row, :pads] = False
        input_ids[row, :pads] = 0
    position_ids = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    return input_ids, mask, position_ids


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Non-trivial values everywhere (HF inits biases to 0 and norms to 1, hiding mapping bugs)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * noise)
            elif name.endswith("bias"):
                param.copy_(0.2 * noise)
            else:
                param.copy_(0.15 * noise)


def torch_logits(model, input_ids, mask, position_ids) -> np.ndarray:
    with torch.no_grad():
        out = model(input_ids=torch.tensor(input_ids), attention_mask=torch.tensor(mask.astype(np.int64)),
                    position_ids=torch.tensor(position_ids))
    return out.logits.float().numpy()


def make(name: str, config, seed: int) -> None:
    torch.manual_seed(seed)
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").float().eval()
    randomize(model, seed)
    out_dir = os.path.join(FIXTURES, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    input_ids, mask, position_ids = reference_batch()
    logits = torch_logits(model, input_ids, mask, position_ids)
    with torch.no_grad():
        generated = model.generate(
            input_ids=torch.tensor(input_ids), attention_mask=torch.tensor(mask.astype(np.int64)),
            max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None,
            pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    greedy = generated.sequences[:, input_ids.shape[1]:].numpy()
    scores = torch.stack(generated.scores, 1).float()
    top2 = scores.topk(2, dim=-1).values
    margin = float((top2[..., 0] - top2[..., 1]).min())
    np.savez(os.path.join(out_dir, "reference.npz"), input_ids=input_ids.astype(np.int32), attention_mask=mask,
             position_ids=position_ids.astype(np.int32), logits=logits.astype(np.float32),
             greedy_tokens=greedy.astype(np.int32))
    size = sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir))
    print(f"{name}: {size / 1024:.0f} KiB, greedy top-1 margin {margin:.4f}, greedy {greedy.tolist()}")


def check(path: str) -> float:
    model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").float().eval()
    ref = np.load(os.path.join(path, "reference.npz"))
    logits = torch_logits(model, ref["input_ids"].astype(np.int64), ref["attention_mask"],
                          ref["position_ids"].astype(np.int64))
    mask = ref["attention_mask"][..., None]
    diff = float(np.abs(np.where(mask, logits - ref["logits"], 0)).max())
    print(f"{path}: max |torch - jax| logits over real tokens = {diff:.3g}")
    return diff


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", nargs="*", default=None, help="jaxrl_vr-saved dirs to verify with torch")
    args = parser.parse_args()
    if args.check is not None:
        bad = [p for p in args.check if check(p) > 1e-4]
        raise SystemExit(f"mismatch: {bad}" if bad else 0)
    for seed, (name, config) in enumerate(CONFIGS.items()):
        make(name, config, seed)


if __name__ == "__main__":
    main()
