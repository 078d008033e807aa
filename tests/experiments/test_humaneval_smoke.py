"""task.name=humaneval from a config: a few RL steps of a tiny byte-level model, per-test results logged."""

import json
import os

import pytest
from flax import nnx

from experiments.configs import default as default_config
from jaxrl_vr.models import Decoder, DecoderConfig, save_pretrained
from jaxrl_vr.models import tokenizers as tk
from jaxrl_vr.train.config import PipelineConfig
from jaxrl_vr.train.pipeline import run_pipeline


@pytest.fixture(scope="module")
def tiny_byte_model(tmp_path_factory):
    """An untrained 1-layer decoder with a byte-level tokenizer (every text encodes): an HF directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(tk.byte_to_unicode().values())}
    raw = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    hf = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<|bos|>", eos_token="<|eos|>")
    path = str(tmp_path_factory.mktemp("tiny_bytes"))
    hf.save_pretrained(path)
    config = DecoderConfig.tiny(len(hf), hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                                num_kv_heads=2, head_dim=16, bos_token_id=hf.bos_token_id,
                                eos_token_id=hf.eos_token_id, pad_token_id=hf.eos_token_id)
    save_pretrained(Decoder(config, rngs=nnx.Rngs(params=0)), path)
    return path


@pytest.mark.slow
def test_humaneval_trains_a_few_steps_and_logs_the_fraction_of_tests_passed(tiny_byte_model, tmp_path):
    tree = default_config.get_config("smoke").to_dict()
    tree["run"].update(tensorboard=False, print_table=False, export=False)
    tree["model"] = {"source": "hf", "path": tiny_byte_model}
    tree["task"] = {"name": "humaneval", "eval_fraction": 0.25, "num_train": 4, "num_eval": 2}
    tree["rl"].update(steps=2, prompts_per_step=2, samples_per_prompt=2, num_minibatches=1, max_new_tokens=8,
                      checkpoint_every=1)
    tree["eval"] = {"num_samples": 2, "prompts_per_chunk": 2, "base_calibration_samples": 0}
    summary = run_pipeline(PipelineConfig.from_dict(tree), str(tmp_path / "run"), log=lambda line: None)
    assert sum(summary["regime_counts"].values()) == 2
    with open(os.path.join(tmp_path / "run", "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    steps = [row for row in rows if "test_pass_frac" in row]
    assert len(steps) == 2 and all(0.0 <= row["test_pass_frac"] <= 1.0 for row in steps)
