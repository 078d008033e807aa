"""Train step factory, RL loop, checkpoints, metrics and the embedded pipeline."""

from jaxrl_vr.train.checkpoint import Checkpointer
from jaxrl_vr.train.evaluate import count_successes
from jaxrl_vr.train.loop import Budget, NonFiniteLossError, RLConfig, RLTrainer
from jaxrl_vr.train.metrics import MetricsWriter, ProgressBar, read_jsonl
from jaxrl_vr.train.optim import OptimConfig, learning_rate_schedule, make_optimizer
from jaxrl_vr.train.pipeline import (
    EvalConfig,
    ModelConfig,
    PipelineConfig,
    RunConfig,
    TaskConfig,
    WorkdirError,
    run_pipeline,
)
from jaxrl_vr.train.rollout import (
    ADVANTAGE_ESTIMATORS,
    compute_advantages,
    decode_responses,
    encode_prompts,
)
from jaxrl_vr.train.sft import SFTConfig, train_sft
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

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "Budget",
    "Checkpointer",
    "EvalConfig",
    "LossConfig",
    "MetricsWriter",
    "ModelConfig",
    "NonFiniteLossError",
    "OptimConfig",
    "PipelineConfig",
    "ProgressBar",
    "RLConfig",
    "RLTrainer",
    "RolloutBatch",
    "RunConfig",
    "SFTConfig",
    "StepHyper",
    "TaskConfig",
    "TrainState",
    "WorkdirError",
    "compute_advantages",
    "count_successes",
    "decode_responses",
    "encode_prompts",
    "init_train_state",
    "learning_rate_schedule",
    "loss_denominators",
    "make_eval_loss",
    "make_logprob_fn",
    "make_optimizer",
    "make_train_step",
    "read_jsonl",
    "response_logprobs",
    "run_pipeline",
    "split_model",
    "train_sft",
]
