"""The embedded end-to-end experiment: SFT base → base pass rates → RL → final pass rates → report.

1. Build (once, cached in ``<workdir>/base``) a base policy: a small Decoder with the
   built-in character tokenizer, warm-started by a short supervised phase on the
   built-in arithmetic task and stopped while imperfect.
2. Estimate the base's per-prompt pass rates on held-out prompts: n samples each for
   pass@k (``<workdir>/base_eval.json``) and an independent calibration set (n = 256 by
   default, ``<workdir>/base_calibration.json``) that assigns the PBA regimes.
3. RL with ``RLTrainer`` (checkpointed, resumable).
4. Evaluate the trained policy on the same prompts; write summary.json, report.md,
   metrics plots and the pass@k plot; return the summary.

Configuration is a tree of frozen dataclasses (``PipelineConfig``) built from a plain
nested dict (``PipelineConfig.from_dict``; unknown keys fail with their dotted name), so
this module never depends on ml_collections (that lives in experiments/).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
import typing
from typing import Any, Callable

import jax
import numpy as np
from flax import nnx

from jaxrl_vr.train.checkpoint import Checkpointer
from jaxrl_vr.train.evaluate import count_successes
from jaxrl_vr.train.loop import RLConfig, RLTrainer
from jaxrl_vr.train.optim import OptimConfig
from jaxrl_vr.train.sft import SFTConfig, train_sft
from jaxrl_vr.train.step import LossConfig, split_model


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """Built-in arithmetic task.

    Attributes:
      name: only "arithmetic" is built in.
      levels: difficulty levels used for training, SFT and evaluation.
      num_train: RL training prompts (train split).
      num_eval: held-out prompts (test split) for base and final evaluation.
      num_sft_examples: (prompt, answer) pairs of the supervised warm start (train split).
    """

    name: str = "arithmetic"
    levels: tuple = (0, 1, 2, 3, 4)
    num_train: int = 1500
    num_eval: int = 80
    num_sft_examples: int = 20000

    def __post_init__(self):
        if self.name != "arithmetic":
            raise ValueError(
                f"task.name={self.name!r}: only the built-in 'arithmetic' task is "
                "available in the embedded pipeline."
            )
        object.__setattr__(self, "levels", tuple(int(v) for v in self.levels))


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Small Llama-style decoder over the character vocabulary."""

    hidden_size: int = 96
    intermediate_size: int = 192
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 4
    head_dim: int = 24


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation: ``num_samples`` (n) samples per prompt at ``temperature``.

    ``base_calibration_samples`` (SPEC §4's frozen-base cache, n = 256 on small tasks) are
    drawn from the base separately from its pass@k samples and give the per-prompt p_base
    that assigns PBA regimes. Taking regimes from the same samples as base pass@k would
    bias the regime split (a prompt called out_of_reach would have base pass@k = 0 by
    construction). 0 falls back to the base pass@k samples.
    """

    num_samples: int = 16
    temperature: float = 1.0
    prompts_per_chunk: int = 40
    base_calibration_samples: int = 256


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Run-level switches (may change between resumes)."""

    progress: bool = True
    tensorboard: bool = True
    print_table: bool = True


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """Everything the embedded experiment needs; ``seed`` drives init, SFT, RL and eval."""

    seed: int = 0
    task: TaskConfig = TaskConfig()
    model: ModelConfig = ModelConfig()
    sft: SFTConfig = SFTConfig()
    rl: RLConfig = RLConfig()
    loss: LossConfig = LossConfig()
    optim: OptimConfig = OptimConfig()
    eval: EvalConfig = EvalConfig()
    run: RunConfig = RunConfig()

    @classmethod
    def from_dict(cls, tree: dict) -> "PipelineConfig":
        """Builds the dataclass tree; an unknown or mistyped key raises naming its dotted path."""
        return _from_dict(cls, tree, "")

    def to_dict(self) -> dict:
        return json.loads(json.dumps(dataclasses.asdict(self)))


def _from_dict(cls, tree: Any, prefix: str):
    if not isinstance(tree, dict):
        raise TypeError(
            f"config {prefix or '<root>'} must be a mapping, got {type(tree).__name__}."
        )
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(tree) - set(fields))
    if unknown:
        names = ", ".join(f"{prefix}{k}" for k in unknown)
        raise KeyError(
            f"unknown config key(s): {names}. Valid keys under "
            f"{prefix.rstrip('.') or 'the root'}: {sorted(fields)}."
        )
    kwargs = {}
    for name, value in tree.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            kwargs[name] = _from_dict(hint, value, f"{prefix}{name}.")
        else:
            kwargs[name] = value
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise type(err)(f"config {prefix.rstrip('.') or '<root>'}: {err}") from err


CURVE_KEYS = (
    "reward",
    "pass_rate",
    "valid_group_frac",
    "kl",
    "entropy",
    "grad_norm",
    "clip_frac_low",
    "clip_frac_high",
    "response_length",
    "truncation_rate",
    "logp_gap_sampler_trainer",
    "adv_std",
)

# Keys that may differ between the run that wrote a workdir and a resume of it.
RESUMABLE_KEYS = (
    "run.",
    "rl.steps",
    "rl.checkpoint_every",
    "rl.max_to_keep",
    "rl.verifier_workers",
    "rl.verifier_timeout_s",
)


class WorkdirError(RuntimeError):
    """The workdir cannot be used for this config (wrong directory or config mismatch)."""


def _flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _digest(tree: Any) -> str:
    return hashlib.sha256(json.dumps(tree, sort_keys=True).encode()).hexdigest()[:16]


def prepare_workdir(workdir: str, cfg: PipelineConfig) -> str:
    """Creates the workdir or checks it belongs to this config; writes config.json.

    Raises:
      WorkdirError: ``workdir`` is a file, or holds a run whose config differs in a key that
        changes results (the message lists each differing key with both values).
    """
    workdir = os.path.abspath(workdir)
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise WorkdirError(f"--workdir {workdir} exists and is not a directory; pass a directory.")
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "config.json")
    current = cfg.to_dict()
    if os.path.exists(path):
        with open(path) as f:
            stored = json.load(f)
        a, b = _flatten(stored), _flatten(current)
        diffs = [
            k
            for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k) and not any(k.startswith(p) for p in RESUMABLE_KEYS)
        ]
        if diffs:
            lines = "; ".join(
                f"{k}: workdir has {a.get(k)!r}, config has {b.get(k)!r}" for k in diffs
            )
            raise WorkdirError(
                f"--workdir {workdir} holds a run with a different config ({lines}). Resume with "
                "the original config, or choose a new --workdir."
            )
    elif os.path.isdir(os.path.join(workdir, "checkpoints")) and os.listdir(
        os.path.join(workdir, "checkpoints")
    ):
        raise WorkdirError(
            f"--workdir {workdir} has checkpoints but no config.json: it was not "
            "written by this pipeline. Choose a new --workdir."
        )
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(current, f, indent=2, sort_keys=True)
    os.replace(tmp, path)
    return workdir


# -------------------------------------------------------------------------- building blocks


def make_tokenizer():
    from jaxrl_vr.models.tokenizers import CharTokenizer
    from jaxrl_vr.tasks.arithmetic import ARITHMETIC_ALPHABET

    return CharTokenizer(ARITHMETIC_ALPHABET)


def make_model(cfg: ModelConfig, tokenizer, seed: int):
    from jaxrl_vr.models.config import DecoderConfig
    from jaxrl_vr.models.decoder import Decoder

    decoder_cfg = DecoderConfig.tiny(
        tokenizer.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        bos_token_id=tokenizer.bos_id,
        eos_token_id=tokenizer.eos_id,
        pad_token_id=tokenizer.pad_id,
    )
    return Decoder(decoder_cfg, rngs=nnx.Rngs(params=seed))


def make_items(cfg: PipelineConfig):
    """(train items, held-out items, SFT examples), deterministic from cfg.seed."""
    from jaxrl_vr.tasks import arithmetic

    train = []
    per_level = max(cfg.task.num_train // len(cfg.task.levels), 1)
    for level in cfg.task.levels:  # balanced; a level with few distinct problems gives fewer
        count = per_level
        while True:
            try:
                train += arithmetic.make_items(
                    1000 + 10 * cfg.seed + level, count, levels=(level,), split="train"
                )
                break
            except ValueError:
                if count <= 1:
                    raise
                count = count * 3 // 4
    train = [train[i] for i in np.random.default_rng(cfg.seed).permutation(len(train))]
    heldout = arithmetic.make_items(
        2000 + cfg.seed, cfg.task.num_eval, levels=cfg.task.levels, split="test"
    )
    sft = arithmetic.make_sft_examples(
        3000 + cfg.seed, cfg.task.num_sft_examples, levels=cfg.task.levels, split="train"
    )
    return train, heldout, sft


def _base_task_fields(task: TaskConfig) -> dict:
    """The task fields the SFT base depends on (not the RL prompt count)."""
    return {
        "name": task.name,
        "levels": list(task.levels),
        "num_sft_examples": task.num_sft_examples,
    }


def build_base(
    cfg: PipelineConfig,
    workdir: str,
    tokenizer,
    sft_examples,
    *,
    log: Callable[[str], None] = print,
):
    """The SFT base policy, loaded from ``<workdir>/base`` when already built for this config."""
    model = make_model(cfg.model, tokenizer, cfg.seed)
    _, params, _ = split_model(model)
    key = _digest(
        {
            "seed": cfg.seed,
            "task": _base_task_fields(cfg.task),
            "model": dataclasses.asdict(cfg.model),
            "sft": dataclasses.asdict(cfg.sft),
        }
    )
    ckpt = Checkpointer(os.path.join(workdir, "base"), max_to_keep=1)
    try:
        if ckpt.latest_step() is not None:
            params, host, _ = ckpt.restore(params)
            if host.get("digest") != key:
                raise WorkdirError(
                    f"{workdir}/base was built with another model/SFT config; "
                    "delete it or choose a new --workdir."
                )
            nnx.update(model, params)
            log(f"[base] loaded cached SFT base from {ckpt.directory}")
            return model, dict(host.get("info", {}))
        start = time.perf_counter()
        history = train_sft(
            model,
            tokenizer,
            sft_examples,
            cfg.sft,
            log_fn=lambda s, value: log(f"[sft] step {s:4d}  loss {value:.4f}"),
        )
        info = {"sft_final_loss": history[-1], "sft_seconds": time.perf_counter() - start}
        _, params, _ = split_model(model)
        ckpt.save(0, params, {"digest": key, "info": info})
        return model, info
    finally:
        ckpt.close()


def evaluate(
    model, tokenizer, items, cfg: PipelineConfig, seed_offset: int, *, num_samples: int | None = None
) -> dict:
    """Per-prompt success counts from ``num_samples`` (default n) samples per prompt.

    Chunks hold about ``prompts_per_chunk * n`` responses whatever ``num_samples`` is, so a
    256-sample calibration does not build a 16x larger KV cache.
    """
    num_samples = num_samples or cfg.eval.num_samples
    responses_per_chunk = cfg.eval.prompts_per_chunk * cfg.eval.num_samples
    return count_successes(
        model,
        tokenizer,
        items,
        num_samples=num_samples,
        max_new_tokens=cfg.rl.max_new_tokens,
        key=jax.random.key(cfg.seed * 7919 + seed_offset),
        temperature=cfg.eval.temperature,
        prompts_per_chunk=max(1, responses_per_chunk // num_samples),
    )


def _cached_eval(path: str, digest: str, fn: Callable[[], dict]) -> dict:
    if os.path.exists(path):
        with open(path) as f:
            stored = json.load(f)
        if stored.get("digest") == digest:
            stored["counts"] = np.asarray(stored["counts"], np.int64)
            return stored
    result = fn()
    with open(path + ".tmp", "w") as f:
        json.dump({**result, "counts": result["counts"].tolist(), "digest": digest}, f)
    os.replace(path + ".tmp", path)
    return result


# -------------------------------------------------------------------------------- pipeline


def run_pipeline(
    cfg: PipelineConfig,
    workdir: str,
    *,
    log: Callable[[str], None] = print,
    stop_after: int | None = None,
) -> dict:
    """Runs (or resumes) the whole experiment; returns the summary dict.

    Args:
      cfg: PipelineConfig.
      workdir: run directory (created; must be empty or hold a run of the same config).
      log: line printer.
      stop_after: stop RL after this many total steps without the final evaluation
        (used to test resume); returns {} then.
    """
    from jaxrl_vr import eval as eval_lib
    from jaxrl_vr.selection.tracker import PromptTracker

    wall_start = time.perf_counter()
    workdir = prepare_workdir(workdir, cfg)
    tokenizer = make_tokenizer()
    train_items, heldout, sft_examples = make_items(cfg)

    t0 = time.perf_counter()
    model, base_info = build_base(cfg, workdir, tokenizer, sft_examples, log=log)
    t_sft = time.perf_counter() - t0

    t0 = time.perf_counter()
    eval_digest = _digest(
        {
            "base": base_info,
            "cfg": cfg.to_dict()["eval"],
            "seed": cfg.seed,
            "task": _base_task_fields(cfg.task),
            "num_eval": cfg.task.num_eval,
            "T": cfg.rl.max_new_tokens,
        }
    )
    base_eval = _cached_eval(
        os.path.join(workdir, "base_eval.json"),
        eval_digest,
        lambda: evaluate(model, tokenizer, heldout, cfg, 1),
    )
    n = cfg.eval.num_samples
    n_cal = cfg.eval.base_calibration_samples
    if n_cal > 0:
        calibration = _cached_eval(
            os.path.join(workdir, "base_calibration.json"),
            _digest({"eval": eval_digest, "n_cal": n_cal}),
            lambda: evaluate(model, tokenizer, heldout, cfg, 4, num_samples=n_cal),
        )
        p_base = calibration["counts"] / n_cal
    else:
        calibration, p_base, n_cal = {"generated_tokens": 0}, base_eval["counts"] / n, n
    t_base_eval = time.perf_counter() - t0
    log(
        f"[base] held-out pass@1 = {base_eval['counts'].mean() / n:.4f} "
        f"({len(heldout)} prompts × {n} samples; regimes from {n_cal} calibration samples)"
    )

    tracker = PromptTracker(len(train_items), uids=[it.uid for it in train_items])
    if cfg.rl.anchor != "none":  # PBA needs the frozen base's pass rate on training prompts
        train_eval = _cached_eval(
            os.path.join(workdir, "base_train_eval.json"),
            _digest({"base": base_info, "eval": cfg.to_dict()["eval"], "seed": cfg.seed,
                     "num_train": cfg.task.num_train, "T": cfg.rl.max_new_tokens}),
            lambda: evaluate(model, tokenizer, train_items, cfg, 3),
        )
        tracker.set_base_counts(np.full(len(train_items), n), train_eval["counts"])
        tracker.freeze_base()
    rl_cfg = dataclasses.replace(cfg.rl, seed=cfg.seed * 1_000_003 + cfg.rl.seed)
    trainer = RLTrainer(
        model,
        tokenizer,
        train_items,
        rl=rl_cfg,
        loss=cfg.loss,
        optim=cfg.optim,
        workdir=workdir,
        tracker=tracker,
        progress=cfg.run.progress,
        tensorboard=cfg.run.tensorboard,
    )
    t0 = time.perf_counter()
    try:
        rows = trainer.run(stop_after=stop_after)
    finally:
        trainer.close()
    t_rl = time.perf_counter() - t0
    if stop_after is not None and stop_after < cfg.rl.steps:
        return {}

    t0 = time.perf_counter()
    final_model = trainer.model()
    final_eval = evaluate(final_model, tokenizer, heldout, cfg, 2)
    t_final_eval = time.perf_counter() - t0

    report = eval_lib.passk_report(
        base_eval["counts"], final_eval["counts"], n, p_base=p_base, regime_n=n_cal
    )
    metrics_path = os.path.join(workdir, "metrics.jsonl")
    plots = {}
    plots["passk"] = str(
        eval_lib.plot_passk(
            report["pass_at_k"]["base"],
            report["pass_at_k"]["final"],
            report["ks"],
            os.path.join(workdir, "passk.png"),
        )
    )
    plots["curves"] = str(
        eval_lib.plot_training_curves(
            metrics_path, os.path.join(workdir, "reward_curve.png"), keys=CURVE_KEYS
        )
    )
    budget = dataclasses.asdict(trainer.budget)
    last = rows[-1] if rows else {}
    summary = {
        "config": cfg.to_dict(),
        "passk": report,
        "base_pass_at_1": report["mean_pass_rate"]["base"],
        "final_pass_at_1": report["mean_pass_rate"]["final"],
        "regime_counts": report["regime_counts"],
        "budget": {
            **budget,
            "eval_generated_tokens": base_eval["generated_tokens"]
            + final_eval["generated_tokens"]
            + calibration["generated_tokens"],
        },
        "wall_time_s": {
            "sft": t_sft,
            "base_eval": t_base_eval,
            "rl": t_rl,
            "final_eval": t_final_eval,
            "total": time.perf_counter() - wall_start,
        },
        "pass_at_1_delta": report["mean_pass_rate"]["final"] - report["mean_pass_rate"]["base"],
        "wall_time_total_s": time.perf_counter() - wall_start,
        "generated_tokens": budget["generated_tokens"],
        "trained_tokens": budget["trained_tokens"],
        "seed": cfg.seed,
        "base_info": base_info,
        "rl_steps": cfg.rl.steps,
        "final_train_reward": last.get("reward"),
        "plots": plots,
    }
    eval_lib.write_report(summary, workdir, title="jaxrl_vr embedded default: arithmetic RLVR")
    if cfg.run.print_table:
        log(eval_lib.format_table(report))
        log(
            f"held-out pass@1: base {summary['base_pass_at_1']:.4f} -> final "
            f"{summary['final_pass_at_1']:.4f}; wall time {summary['wall_time_s']['total']:.1f}s; "
            f"summary in {os.path.join(workdir, 'summary.json')}"
        )
    return summary
