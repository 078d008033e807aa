#!/bin/bash
# The C1-C5 study (issue 10): 13 arms x 3 seeds at 400k generated tokens each, n = 256 final
# evaluation. Resumable: complete runs are not re-run. About 80 min on 2 CPU cores.
# Each seed draws its own held-out prompts, as the study did (task.eval_seed=None). Extra flags
# are passed on, e.g. --report_only --out=experiments/results/study
# --collect_evidence=experiments/results/study/runs once the runs are done (README.md).
cd "$(dirname "$0")/../../.."  # the repository root
exec .venv/bin/python -m experiments.compare --root=runs/study \
  --config=experiments/configs/default.py --seeds=0,1,2 --token_budget=400000 \
  --num_samples=256 --budget_fractions=0.5 --jobs=2 --baseline=grpo \
  --common="rl.steps=5000 run.tensorboard=False run.export=False task.eval_seed=None" \
  --arm=grpo \
  --arm="dr_grpo=rl.estimator=dr_grpo loss.aggregation=seq_mean_token_sum_norm" \
  --arm="loo=rl.estimator=loo" \
  --arm="gspo=loss.ratio=sequence" \
  --arm="loo_gspo=rl.estimator=loo loss.ratio=sequence" \
  --arm="loo_gspo_dapo=rl.estimator=loo loss.ratio=sequence rl.batch_strategy=dynamic" \
  --arm="maxrl=rl.estimator=maxrl" \
  --arm="curverl=rl.estimator=curverl" \
  --arm="pba=rl.anchor.polarity=above rl.anchor.weight=0.1" \
  --arm="pairing_wgrpo=rl.pairing=on rl.estimator=pair_weighted" \
  --arm="dapo=rl.batch_strategy=dynamic" \
  --arm="pba_charged=rl.anchor.polarity=above rl.anchor.weight=0.1 rl.budget.include_calibration=True" \
  --arm="pba8_charged=rl.anchor.polarity=above rl.anchor.weight=0.1 rl.anchor.calibration_samples=8 rl.budget.include_calibration=True" \
  --contrast=curverl,maxrl --contrast=pairing_wgrpo,dapo \
  --contrast=loo_gspo,loo --contrast=loo_gspo,gspo --contrast=loo_gspo_dapo,loo_gspo \
  --contrast=pba_charged,pba --contrast=pba8_charged,pba "$@"
