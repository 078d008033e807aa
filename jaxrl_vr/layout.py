"""The workdir layout: the name of every file and folder a run writes, in one place.

    config.json              the run's PipelineConfig (written once the run is known to start)
    base/                    the builtin model's SFT base (other sources reload model.path)
    base_eval.json           the base's held-out success counts (n samples per prompt)
    base_calibration.json    independent base samples of the held-out prompts (regimes)
    base_train_calibration.json, pairing_calibration.json
                             base samples of every training prompt, for the methods
                             that ask for them (PBA's p_base, pairing's rates)
    checkpoints/             the loop state and host state, rotated
    budget_checkpoints/      the same at rl.budget.fractions, kept for good
    budget_checkpoints.json  {"marks": [{"fraction", "step", "token_budget", "generated_tokens"}]}
    metrics.jsonl, tb/       per-step metrics (JSON lines, TensorBoard)
    verifier_errors.jsonl    every verifier error, with its sample
    nonfinite_step_<S>/      the state and minibatch of a non-finite update
    summary.json, report.md, passk.png, reward_curve.png
                             the finished run; summary_reevaluated.json for --reevaluate
    eval_during.json, eval_during.png
                             pass@k along training (eval.every), from metrics.jsonl
    export/                  the final policy, loadable by transformers
    eval/<label>/            experiments.evaluate's evaluation.json, report.md and plots
    eval_sets/<stem>/        a task.eval_paths set: its base_eval.json, base_calibration.json,
                             evaluation.json, report.md and plots
"""

CONFIG = "config.json"
BASE = "base"
BASE_EVAL = "base_eval.json"
BASE_CALIBRATION = "base_calibration.json"
ANCHOR_CALIBRATION = "base_train_calibration.json"
PAIRING_CALIBRATION = "pairing_calibration.json"
TRAIN_CALIBRATIONS = (ANCHOR_CALIBRATION, PAIRING_CALIBRATION)
CHECKPOINTS = "checkpoints"
BUDGET_CHECKPOINTS = "budget_checkpoints"
BUDGET_MARKS = BUDGET_CHECKPOINTS + ".json"
METRICS = "metrics.jsonl"
TENSORBOARD = "tb"
VERIFIER_ERRORS = "verifier_errors.jsonl"
ROLLOUTS = "rollouts"  # rollouts/step_<S>.jsonl: run.dump_rollouts episodes of each step
NONFINITE_PREFIX = "nonfinite_step_"
SUMMARY = "summary.json"
SUMMARY_REEVALUATED = "summary_reevaluated.json"
REPORT = "report.md"
PASSK_PLOT = "passk.png"
CURVES_PLOT = "reward_curve.png"
EVAL_DURING = "eval_during.json"
EVAL_DURING_PLOT = "eval_during.png"
EXPORT = "export"
EVAL = "eval"
EVAL_SETS = "eval_sets"
EVALUATION = "evaluation.json"
