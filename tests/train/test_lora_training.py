"""LoRA in the trainer: only the adapters train, the reference is the base, checkpoints hold the
adapters and resume, and ``model.lora`` is validated and reaches the CLI run."""

import json
import os
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_vr.config_tree import ConfigError
from jaxrl_vr.models.config import DecoderConfig
from jaxrl_vr.models.decoder import Decoder, lora_names
from jaxrl_vr.models.lora import LORA_TARGETS, add_lora, lora_off
from jaxrl_vr.models.tokenizers import CharTokenizer
from jaxrl_vr.tasks import arithmetic
from jaxrl_vr.train import step as step_lib
from jaxrl_vr.train.config import PipelineConfig, RLConfig, VerifierConfig
from jaxrl_vr.train.optim import OptimConfig, make_optimizer
from jaxrl_vr.train.step import LossConfig
from jaxrl_vr.verifiers.pool import VerifyResult

import hlo_testlib
import trainer_testlib as lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKENIZER = CharTokenizer(arithmetic.ARITHMETIC_ALPHABET)
ITEMS = arithmetic.make_items(0, 6, levels=(0,), split=None)
ADAPTER_NAMES = {name for target in LORA_TARGETS for name in lora_names(target)}


def _lora_decoder(vocab_size=12, rank=2):
    return add_lora(lib.tiny_decoder(vocab_size), rank=rank, alpha=2.0 * rank, key=jax.random.key(7))


def test_only_the_adapters_are_trained_and_hold_optimizer_state():
    model = _lora_decoder()
    graphdef, params, rest = step_lib.split_model(model)
    assert set(nnx.to_pure_dict(params)["layers"]) == ADAPTER_NAMES and "embed" not in params
    assert "wq" in nnx.to_pure_dict(rest)["layers"] and "embed" in rest
    optimizer = make_optimizer(OptimConfig(learning_rate=1e-2, warmup_steps=0))
    cfg = LossConfig(kl_beta=0.1)
    state = step_lib.init_train_state(params, optimizer, cfg)
    adapter_shapes = sorted(x.shape for x in jax.tree.leaves(params))
    # AdamW's two moments per adapter, and scalars (counts, hyperparameters): nothing else.
    moments = sorted(x.shape for x in jax.tree.leaves(state.opt_state) if x.ndim > 0)
    assert moments == sorted(adapter_shapes * 2)
    base = jax.tree.map(np.asarray, rest)
    train_step = step_lib.make_train_step(graphdef, rest, optimizer, cfg)
    hyper = step_lib.StepHyper.create(kl_beta=0.1)
    state, _ = train_step(state, lib.random_batch(3), hyper)
    state, metrics = train_step(state, lib.random_batch(4), hyper)
    assert train_step.jitted._cache_size() == 1  # the second step did not recompile
    assert np.isfinite(float(metrics["grad_norm"])) and float(metrics["grad_norm"]) > 0
    trained = nnx.to_pure_dict(state.params)["layers"]
    assert all(np.abs(np.asarray(trained[lora_names(t)[1]])).max() > 0 for t in LORA_TARGETS)  # B moved off 0
    chex.assert_trees_all_equal(jax.tree.map(np.asarray, rest), base)


def test_the_lora_update_computes_no_weight_gradient_of_the_frozen_base():
    """The trainer's update (micro-batches, the layer gradient sink), as `test_lora.py` checks
    `jax.grad` of the model: the block matrices' weight gradients are a third of a full
    update's FLOPs. The compiled LoRA update has dots of the adapters' shapes ([in, r] and
    [r, out]) and none of a block matrix's ([in, out]: q and o, k and v, gate and up, down),
    which no other dot has here."""
    config = DecoderConfig.tiny(13, hidden_size=48, intermediate_size=208, num_layers=1, num_heads=2,
                                num_kv_heads=1, head_dim=24, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = add_lora(Decoder(config, rngs=nnx.Rngs(0)), rank=4, alpha=8.0, key=jax.random.key(3))
    graphdef, params, rest = step_lib.split_model(model)
    loss_and_grad = step_lib.make_eval_loss(graphdef, LossConfig(num_microbatches=1))
    compiled = jax.jit(lambda p, r, b, h: loss_and_grad(p, r, b, h, ())).lower(
        params, rest, lib.random_batch(0, vocab=13), step_lib.StepHyper.create()).compile()
    dots = set(hlo_testlib.dot_output_shapes(compiled.as_text()))
    assert {"f32[48,4]", "f32[4,208]"} <= dots, dots  # the adapters' gradients (gate's A and B)
    assert not {"f32[48,48]", "f32[48,24]", "f32[48,208]", "f32[208,48]"} & dots, dots


def test_the_reference_with_adapters_off_is_the_base_policy():
    model = _lora_decoder()
    for target in LORA_TARGETS:  # as after training
        b = getattr(model.layers, lora_names(target)[1])
        b.set_value(0.3 * jax.random.normal(jax.random.key(hash(target) % 997), b.shape))
    batch = lib.random_batch(1)
    inputs = (batch.prompt_tokens_bs, batch.prompt_mask_bs, batch.tokens_bt, batch.mask_bt)
    graphdef, adapters, rest = step_lib.split_model(model)
    logprobs = step_lib.make_logprob_fn(graphdef)
    reference = logprobs(lora_off(adapters), rest, *inputs)[0]
    base_graphdef, base_params, base_rest = step_lib.split_model(lib.tiny_decoder())
    base = step_lib.make_logprob_fn(base_graphdef)(base_params, base_rest, *inputs)[0]
    np.testing.assert_array_equal(np.asarray(reference), np.asarray(base))
    policy = logprobs(adapters, rest, *inputs)[0]
    assert float(jnp.max(jnp.abs(jnp.where(batch.mask_bt, policy - base, 0.0)))) > 1e-3


def _parity_scorer(items, completions):
    """Reward = 1 for even-length completions: arbitrary but varied, so the policy moves."""
    scores = np.asarray([float(len(c) % 2 == 0) for c in completions], np.float32)
    return VerifyResult(scores=scores, statuses=["ok"] * len(items), errors=[None] * len(items))


def _trainer(workdir, steps=2):
    rl = RLConfig(steps=steps, prompts_per_step=2, samples_per_prompt=4, max_new_tokens=3,
                  num_minibatches=1, verifier=VerifierConfig(workers=0), checkpoint_every=1, seed=3)
    return lib.make_trainer(workdir, TOKENIZER, ITEMS, rl=rl, loss=LossConfig(kl_beta=0.1),
                            optim=OptimConfig(learning_rate=0.05, warmup_steps=0),
                            model=_lora_decoder(TOKENIZER.vocab_size), scorer=_parity_scorer)


def _stored_paths(workdir, step):
    with open(os.path.join(workdir, "checkpoints", str(step), "state", "_METADATA")) as f:
        return list(json.load(f)["tree_metadata"])


@pytest.mark.slow
def test_a_checkpoint_holds_only_the_adapters_and_a_resumed_run_continues_exactly(tmp_path):
    straight = _trainer(tmp_path / "a")
    rows = straight.run()
    straight.close()
    assert [row["step"] for row in rows] == [1, 2]
    assert rows[0]["kl"] == 0.0 and rows[1]["kl"] > 0  # π_ref = the base = the policy at step 0 only
    paths = _stored_paths(tmp_path / "a", 2)
    weights = [p for p in paths if "'params'" in p or "'mu'" in p or "'nu'" in p]
    assert weights and all(any(f"'{name}'" in p for name in ADAPTER_NAMES) for p in weights)
    assert not [p for p in paths if "'embed'" in p or "'wq'" in p]

    first = _trainer(tmp_path / "b")
    first.run(stop_after=1)
    first.close()
    resumed = _trainer(tmp_path / "b")
    assert [row["step"] for row in resumed.run()] == [2]
    resumed.close()
    chex.assert_trees_all_equal(resumed.state.train.params, straight.state.train.params)
    chex.assert_trees_all_equal(resumed.state.train.opt_state, straight.state.train.opt_state)


@pytest.mark.parametrize("lora, match", [
    ({"rank": -1}, r"rank must be >= 0"),
    ({"rank": 4, "alpha": -1.0}, r"alpha must be >= 0"),
    ({"rank": 4, "targets": ["wq", "w_dwn"]}, r"unknown names \['w_dwn'\].*did you mean 'w_down'"),
    ({"rank": 4, "targets": []}, r"targets is empty.*rank=0"),
    ({"rank": 4, "base_dtype": "float16"}, r"base_dtype='float16' is not one of"),
    ({"base_dtype": "bfloat16"}, r"set rank >= 1 \(e\.g\. model\.lora\.rank=16\)"),
    ({"rnk": 4}, r"model\.lora\.rnk.*did you mean 'model\.lora\.rank'"),
])
def test_lora_config_mistakes_name_the_key_and_the_fix(lora, match):
    with pytest.raises((ConfigError, ValueError), match=match):
        PipelineConfig.from_dict({"model": {"lora": lora}})


def test_lora_config_defaults_and_alpha():
    cfg = PipelineConfig.from_dict({"model": {"lora": {"rank": 8}}})
    assert cfg.model.lora.targets == LORA_TARGETS and cfg.model.lora.effective_alpha == 16.0
    assert PipelineConfig().model.lora.rank == 0  # off by default
    assert PipelineConfig.from_dict({"model": {"lora": {"rank": 8, "alpha": 4}}}).model.lora.effective_alpha == 4.0


def test_smollm2_rg_lora_variant_is_the_full_run_with_adapters_and_a_lora_learning_rate():
    from experiments.configs import smollm2_rg

    full = PipelineConfig.from_dict(smollm2_rg.get_config("").to_dict())
    lora = PipelineConfig.from_dict(smollm2_rg.get_config("lora").to_dict())
    assert (lora.model.lora.rank, lora.model.lora.effective_alpha, lora.model.lora.targets) == (16, 32.0, LORA_TARGETS)
    assert lora.optim.learning_rate == 10 * full.optim.learning_rate
    # The same budget: everything else is the full fine-tuning run's.
    same = lambda cfg: {**cfg.to_dict(), "model": {**cfg.to_dict()["model"], "lora": None},  # noqa: E731
                        "optim": {**cfg.to_dict()["optim"], "learning_rate": None}}
    assert same(lora) == same(full)


@pytest.mark.slow
def test_cli_run_with_lora_rank_trains_adapters_and_exports_a_merged_model(tmp_path):
    workdir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.train", "--config=experiments/configs/default.py:smoke",
         f"--workdir={workdir}", "--config.model.lora.rank=4", "--config.rl.steps=1", "--config.sft.steps=2",
         "--config.eval.num_samples=2", "--config.eval.base_calibration_samples=0",
         "--config.run.tensorboard=False", "--config.run.print_table=False"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["config"]["model"]["lora"]["rank"] == 4 and summary["rl_steps"] == 1
    paths = _stored_paths(workdir, 1)
    assert any("wq_lora_a" in p for p in paths) and not [p for p in paths if "'wq'" in p]
    from jaxrl_vr.models.hf_io import load_hf_tensors

    tensors = load_hf_tensors(summary["export_dir"])
    assert "model.layers.0.self_attn.q_proj.weight" in tensors and not [k for k in tensors if "lora" in k]
    assert {str(t.dtype) for t in tensors.values()} == {"float32"}
