#!/bin/bash
# Training for pass@k next to GRPO and PBA (issue 40): 4 arms x 3 seeds on the embedded task at
# 400k generated tokens each, n = 256 final evaluation on the same 80 held-out prompts for every
# run (task.eval_seed=0). Resumable: complete runs are not re-run. About 30 min on 2 CPU cores.
# Then: --report_only --out=experiments/results/passk_study
#       --collect_evidence=experiments/results/passk_study/runs (README.md).
cd "$(dirname "$0")/../../.."  # the repository root
exec .venv/bin/python -m experiments.compare --root=runs/passk_study \
  --config=experiments/configs/default.py --seeds=0,1,2 --token_budget=400000 \
  --num_samples=256 --jobs=2 --baseline=grpo \
  --common="rl.steps=5000 run.tensorboard=False run.export=False eval.every=0" \
  --arm=grpo \
  --arm="pkpo=rl.estimator=pkpo rl.estimator.k=4" \
  --arm="passk_training=rl.estimator=passk_training rl.estimator.k=4" \
  --arm="pba_charged=rl.anchor.polarity=above rl.anchor.weight=0.1 rl.budget.include_calibration=True" \
  --contrast=pkpo,pba_charged --contrast=passk_training,pba_charged "$@"
