#!/bin/bash
# The C1-C5 study (issue 10): 13 arms x 3 seeds at 400k generated tokens each, n = 256 final
# evaluation. Resumable: complete runs are not re-run. About 80 min on 2 CPU cores.
cd "$(dirname "$0")/../../.."  # the repository root
exec .venv/bin/python -m experiments.compare --root=runs/study \
  --config=experiments/configs/default.py --seeds=0,1,2 --token_budget=400000 \
  --num_samples=256 --budget_fractions=0.5 --jobs=2 --baseline=grpo \
  --common="rl.steps=5000 run.tensorboard=False run.export=False" \
  --arm=grpo \
  --arm="dr_grpo=rl.advantage=dr_grpo loss.aggregation=seq_mean_token_sum_norm" \
  --arm="loo=rl.advantage=loo" \
  --arm="gspo=loss.ratio=sequence" \
  --arm="loo_gspo=rl.advantage=loo loss.ratio=sequence" \
  --arm="loo_gspo_dapo=rl.advantage=loo loss.ratio=sequence rl.dynamic_sampling=True" \
  --arm="maxrl=rl.advantage=maxrl" \
  --arm="curverl=rl.advantage=curverl" \
  --arm="pba=rl.anchor=above rl.anchor_weight=0.1" \
  --arm="pairing_wgrpo=rl.pairing=True rl.advantage=pair_weighted" \
  --arm="dapo=rl.dynamic_sampling=True" \
  --arm="pba_charged=rl.anchor=above rl.anchor_weight=0.1 rl.budget_includes_calibration=True" \
  --arm="pba8_charged=rl.anchor=above rl.anchor_weight=0.1 rl.anchor_calibration_samples=8 rl.budget_includes_calibration=True" \
  --contrast=curverl,maxrl --contrast=pairing_wgrpo,dapo \
  --contrast=loo_gspo,loo --contrast=loo_gspo,gspo --contrast=loo_gspo_dapo,loo_gspo \
  --contrast=pba_charged,pba --contrast=pba8_charged,pba
