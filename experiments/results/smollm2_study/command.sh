#!/bin/bash
# The real-model study (issue 39): SmolLM2-135M-Instruct on reasoning-gym arithmetic
# (experiments/configs/smollm2_rg.py, bf16 matmuls where the CPU has them), 4 arms x 3 seeds at
# 32768 generated tokens each (PBA's calibration charged to its budget), a 128-prompt training
# pool disjoint from the 64 held-out prompts (the same for every seed), n = 64 samples per
# held-out prompt for the base and every final policy. The runs' own in-run evaluations are cut
# to n = 1 (experiments.evaluate's n = 64 evaluations, 512 responses per sampler call, are the
# ones the table reads). Resumable.
# Extra flags are passed on, e.g. --report_only --collect_evidence=experiments/results/smollm2_study/runs
# once the runs are done, or --report_only --root=experiments/results/smollm2_study/runs to rebuild
# the tables from the committed per-run files alone.
cd "$(dirname "$0")/../../.."  # the repository root
OUT=experiments/results/smollm2_study
exec .venv/bin/python -m experiments.compare --root=runs/smollm2_study --out=$OUT --seeds=0,1,2 \
  --config=experiments/configs/smollm2_rg.py --token_budget=32768 --num_samples=64 --jobs=2 \
  --eval_responses_per_call=512 \
  --baseline=grpo \
  --common="rl.steps=5000 task.num_train=128 eval.num_samples=1 run.tensorboard=False run.export=False" \
  --arm=grpo \
  --arm="pba_charged=rl.anchor.polarity=above rl.anchor.weight=0.1 rl.anchor.calibration_samples=4 rl.budget.include_calibration=True" \
  --arm="loo_gspo_dapo=rl.estimator=loo loss.ratio=sequence rl.batch_strategy=dynamic" \
  --arm="maxrl=rl.estimator=maxrl" \
  --contrast=pba_charged,maxrl "$@"
