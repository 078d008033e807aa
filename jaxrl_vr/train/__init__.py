"""The trainer: config, parts, the RL driver and the end-to-end pipeline.

Data flow of one RL step (``docs/design.md``): prompt source → batch strategy over the
round sampler (``rollout``; strategies in ``jaxrl_vr.selection.strategies``) → hooks
observe every sample and annotate the batch (``jaxrl_vr.hooks``; methods in ``methods``)
→ batch builder (``batch``; estimators from ``jaxrl_vr.estimators``) → jitted update
(``update``, ``step``) → metrics (``metrics``) → checkpoints (``saving``). ``parts.build_parts``
builds every part once from the config; ``loop.RLTrainer`` drives them;
``pipeline.run_pipeline`` wraps a run with model and task sources (``sources``),
evaluation, report and export; ``config`` holds one dataclass per concern.
"""

from jaxrl_vr.train.batch import build_batch, rollout_batch
from jaxrl_vr.train.budget import Budget, BudgetConfig
from jaxrl_vr.train.checkpoint import (CheckpointDamagedWarning, CheckpointMismatchError, Checkpointer,
                                       Restored)
from jaxrl_vr.train.config import (EstimatorChoice, EvalConfig, ModelConfig, PipelineConfig, RewardConfig,
                                   RLConfig, RunConfig, StrategyChoice, TaskConfig, VerifierConfig,
                                   load_config, validate)
from jaxrl_vr.train.evaluate import count_successes
from jaxrl_vr.train.loop import RLTrainer, RunInterrupted
from jaxrl_vr.train.methods import METHODS, AnchorSettings, PairingSettings
from jaxrl_vr.train.metrics import MetricsWriter, ProgressBar, read_jsonl, rollout_metrics
from jaxrl_vr.train.optim import OptimConfig, learning_rate_schedule, make_optimizer
from jaxrl_vr.train.parts import Parts, build_parts
from jaxrl_vr.train.pipeline import run_pipeline
from jaxrl_vr.train.rollout import RoundSampler, VerifierFailure, decode_responses, encode_prompts
from jaxrl_vr.train.sft import SFTConfig, train_sft
from jaxrl_vr.train.sources import MODEL_SOURCES, TASK_SOURCES, export_policy, load_policy, load_task
from jaxrl_vr.train.step import (
    LossConfig,
    RolloutBatch,
    StepHyper,
    TrainState,
    init_train_state,
    loss_denominators,
    make_eval_loss,
    make_logprob_fn,
    make_train_step,
    response_logprobs,
    split_model,
)
from jaxrl_vr.train.update import LoopState, NonFiniteLossError, make_update_fns
from jaxrl_vr.train.workdir import WorkdirError

__all__ = [
    "AnchorSettings", "Budget", "BudgetConfig", "CheckpointDamagedWarning", "CheckpointMismatchError",
    "Checkpointer", "EstimatorChoice", "EvalConfig", "LoopState", "LossConfig", "METHODS",
    "MODEL_SOURCES", "MetricsWriter", "ModelConfig", "NonFiniteLossError", "OptimConfig",
    "PairingSettings", "Parts", "PipelineConfig", "ProgressBar", "RLConfig", "RLTrainer", "Restored",
    "RewardConfig", "RolloutBatch", "RoundSampler", "RunConfig", "RunInterrupted", "SFTConfig",
    "StepHyper", "StrategyChoice", "TASK_SOURCES", "TaskConfig", "TrainState", "VerifierConfig",
    "VerifierFailure", "WorkdirError", "build_batch", "build_parts", "count_successes",
    "decode_responses", "encode_prompts", "export_policy", "init_train_state", "learning_rate_schedule",
    "load_config", "load_policy", "load_task", "loss_denominators", "make_eval_loss", "make_logprob_fn",
    "make_optimizer", "make_train_step", "make_update_fns", "read_jsonl", "response_logprobs",
    "rollout_batch", "rollout_metrics", "run_pipeline", "split_model", "train_sft", "validate",
]
