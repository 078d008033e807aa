"""Model and task sources from a config: a Hugging Face directory, JSONL rows, reasoning-gym."""

import json
import os

import pytest

from experiments.configs import default as default_config
from jaxrl_vr.train.config import PipelineConfig
from jaxrl_vr.train.pipeline import run_pipeline
from jaxrl_vr.train.sources import load_task


def _smoke_tree(**sections):
    tree = default_config.get_config("smoke").to_dict()
    tree["run"].update(tensorboard=False, print_table=False)
    for section, values in sections.items():
        tree[section].update(values)
    return tree


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A trained builtin policy exported with save_pretrained: an HF directory."""
    workdir = tmp_path_factory.mktemp("builtin")
    tree = _smoke_tree(rl={"steps": 1})
    summary = run_pipeline(PipelineConfig.from_dict(tree), str(workdir), log=lambda line: None)
    return summary["export_dir"]


def _rows_file(tmp_path, name="rows", pairs=((1, 2), (3, 4), (2, 2), (5, 1), (0, 7), (4, 4))):
    path = tmp_path / f"{name}.jsonl"
    rows = [{"question": f"{a}+{b}=", "solution": str(a + b)} for a, b in pairs]
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
        f.write("{not json\n")  # a malformed row is skipped with its line number
    return str(path)


def _eval_rows_file(tmp_path):
    """Held-out rows that share no prompt with ``_rows_file``'s."""
    return _rows_file(tmp_path, "eval_rows", ((6, 1), (2, 5), (3, 3), (1, 8), (5, 4), (0, 9)))


@pytest.mark.slow
def test_hf_directory_and_jsonl_rows_train_evaluate_and_export(exported, tmp_path):
    rows = _rows_file(tmp_path)
    tree = _smoke_tree(
        model={"source": "hf", "path": exported},
        task={"name": "jsonl", "path": rows, "eval_path": _eval_rows_file(tmp_path), "prompt_field": "question",
              "answer_field": "solution", "verifier": "exact", "num_train": 0, "num_eval": 0},
        rl={"steps": 1, "prompts_per_step": 2, "samples_per_prompt": 2, "num_minibatches": 1},
        eval={"base_calibration_samples": 0})
    summary = run_pipeline(PipelineConfig.from_dict(tree), str(tmp_path / "run"),
                           log=lambda line: None)
    assert summary["base_info"]["source"] == "hf"
    assert sum(summary["regime_counts"].values()) == 6
    assert os.path.isfile(os.path.join(summary["export_dir"], "model.safetensors"))
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(summary["export_dir"]).eos_token == "<eos>"


def test_unknown_verifier_fails_before_any_model_is_loaded(tmp_path):
    rows = _rows_file(tmp_path)
    tree = _smoke_tree(model={"source": "hf", "path": str(tmp_path / "no_model_here")},
                       task={"name": "jsonl", "path": rows, "eval_path": _eval_rows_file(tmp_path),
                             "prompt_field": "question", "answer_field": "solution",
                             "verifier": "mathh"})
    with pytest.raises(ValueError, match="mathh"):
        run_pipeline(PipelineConfig.from_dict(tree), str(tmp_path / "run"), log=lambda line: None)
    assert not (tmp_path / "run").exists()


def test_reasoning_gym_items_get_the_instruction_and_the_configured_verifier():
    tree = _smoke_tree(task={"name": "reasoning_gym", "rg_tasks": "chain_sum,basic_arithmetic",
                             "rg_config": json.dumps({"chain_sum": {"min_terms": 2, "max_terms": 2}}),
                             "num_train": 10, "num_eval": 4, "instruction": "Box it.",
                             "verifier": "math"})
    data = load_task(PipelineConfig.from_dict(tree))
    assert len(data.train) == 10 and len(data.heldout) == 4
    assert all(it.prompt.endswith(" Box it.") and it.verifier == "math" for it in data.train)
    assert {it.meta["rg_name"] for it in data.train} == {"chain_sum", "basic_arithmetic"}
    assert not {it.uid for it in data.train} & {it.uid for it in data.heldout}


@pytest.mark.parametrize("remat", [False, True])
def test_model_remat_reaches_the_loaded_policy(exported, tmp_path, remat):
    """``model.remat`` recomputes each layer in the backward pass of the loaded model."""
    from jaxrl_vr.train.sources import load_policy

    tree = _smoke_tree(model={"source": "hf", "path": exported, "remat": remat})
    cfg = PipelineConfig.from_dict(tree)
    policy = load_policy(cfg, str(tmp_path), load_task(cfg), log=lambda line: None)
    assert policy.model.remat is remat


@pytest.mark.parametrize("base_dtype", ["", "bfloat16"])
def test_model_lora_reaches_the_loaded_policy(exported, tmp_path, base_dtype):
    """``model.lora`` adds its adapters (rank, alpha / rank, targets) to the loaded model, and
    ``base_dtype`` stores the frozen base in bf16."""
    import jax
    from flax import nnx

    from jaxrl_vr.models.lora import lora_targets
    from jaxrl_vr.train.sources import load_policy

    lora = {"rank": 3, "alpha": 12.0, "targets": ["wq", "w_down"], "base_dtype": base_dtype}
    tree = _smoke_tree(model={"source": "hf", "path": exported, "lora": lora})
    cfg = PipelineConfig.from_dict(tree)
    model = load_policy(cfg, str(tmp_path), load_task(cfg), log=lambda line: None).model
    assert lora_targets(model) == ("wq", "w_down") and model.layers.lora_scale == 4.0
    assert model.layers.wq_lora_a[...].shape[-1] == 3
    base_dtypes = {str(x.dtype) for x in jax.tree.leaves(nnx.state(model, nnx.Not(nnx.LoRAParam)))}
    assert base_dtypes == {base_dtype or "float32"}
