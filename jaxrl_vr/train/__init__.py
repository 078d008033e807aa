"""The trainer as composable parts (SPEC §1), the RL driver and the end-to-end pipeline.

Data flow of one RL step: prompt source (``prompts``) → batch strategy over a round sampler
(``rounds``; dynamic / two-stage strategies live next to ``jaxrl_vr.selection``) → batch
builder (``batch``, estimators from ``jaxrl_vr.estimators``) → jitted train step (``step``)
→ metrics (``metrics``) → checkpoint (``checkpoint``). ``loop.RLTrainer`` drives them;
``pipeline.run_pipeline`` wraps a run with model/task sources (``sources``), base
calibration, evaluation, report and export; ``config`` holds one dataclass per concern.
"""

from jaxrl_vr.train.batch import BuiltBatch, build_batch
from jaxrl_vr.train.checkpoint import (CheckpointDamagedWarning, CheckpointMismatchError, Checkpointer,
                                       Restored)
from jaxrl_vr.train.config import (EvalConfig, ModelConfig, PipelineConfig, RLConfig, RunConfig,
                                   TaskConfig, validate)
from jaxrl_vr.train.evaluate import count_successes
from jaxrl_vr.train.loop import (Budget, LoopState, NonFiniteLossError, RLTrainer, RunInterrupted,
                                 VerifierFailure, make_batch_strategy)
from jaxrl_vr.train.metrics import MetricsWriter, ProgressBar, read_jsonl, rollout_metrics
from jaxrl_vr.train.optim import OptimConfig, learning_rate_schedule, make_optimizer
from jaxrl_vr.train.pipeline import run_pipeline
from jaxrl_vr.train.prompts import DataOrder, PairedSource, SkipSuspended
from jaxrl_vr.train.rollout import decode_responses, encode_prompts
from jaxrl_vr.train.rounds import Round, make_sample_round, plain_batch
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
from jaxrl_vr.train.workdir import WorkdirError

__all__ = [
    "Budget", "BuiltBatch", "CheckpointDamagedWarning", "CheckpointMismatchError", "Checkpointer",
    "Restored", "DataOrder", "EvalConfig", "LoopState", "LossConfig",
    "MODEL_SOURCES", "MetricsWriter", "ModelConfig", "NonFiniteLossError", "OptimConfig",
    "PairedSource", "PipelineConfig", "ProgressBar", "RLConfig", "RLTrainer", "RolloutBatch",
    "Round", "RunConfig", "RunInterrupted", "SFTConfig", "SkipSuspended", "StepHyper",
    "TASK_SOURCES", "TaskConfig", "TrainState", "VerifierFailure", "WorkdirError", "build_batch",
    "count_successes", "decode_responses", "encode_prompts", "export_policy", "init_train_state",
    "learning_rate_schedule", "load_policy", "load_task", "loss_denominators", "make_batch_strategy",
    "make_eval_loss", "make_logprob_fn", "make_optimizer", "make_sample_round", "make_train_step",
    "plain_batch", "read_jsonl", "response_logprobs", "rollout_metrics", "run_pipeline",
    "split_model", "train_sft", "validate",
]
