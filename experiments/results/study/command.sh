#!/bin/bash
# The C1-C5 study (issues 10, 39): 15 arms x 3 seeds at 400k generated tokens each, n = 256 final
# and half-budget evaluation, the same 80 held-out prompts for every seed (the default); then
# grpo, pba, maxrl and curverl on seeds 3 and 4 (seeds5/); then Weighted GRPO at lambda_neg = 2 with
# and without the q+/q- pairing (c4_weights/). Resumable: complete runs are not re-run. About
# 140 min on 2 CPU cores with --jobs=2.
# Extra flags are passed on, e.g. --report_only --collect_evidence=experiments/results/study/runs
# once the runs are done, or --report_only --root=experiments/results/study/runs to rebuild the
# tables from the committed per-run files alone.
cd "$(dirname "$0")/../../.."  # the repository root
OUT=experiments/results/study
COMMON=(--config=experiments/configs/default.py --token_budget=400000 --num_samples=256
  --budget_fractions=0.5 --jobs=2 --baseline=grpo
  --common="rl.steps=5000 run.tensorboard=False run.export=False")
.venv/bin/python -m experiments.compare --root=runs/study --out=$OUT --seeds=0,1,2 "${COMMON[@]}" \
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
  --arm="grpo_lr1e4=optim.learning_rate=1e-4" \
  --arm="variance_grpo=rl.pairing.select=variance rl.estimator=grpo" \
  --contrast=curverl,maxrl --contrast=pairing_wgrpo,dapo \
  --contrast=pairing_wgrpo,variance_grpo --contrast=variance_grpo,dapo \
  --contrast=gspo,grpo_lr1e4 --contrast=pba,grpo_lr1e4 --contrast=loo_gspo_dapo,grpo_lr1e4 \
  --contrast=loo_gspo,loo --contrast=loo_gspo,gspo --contrast=loo_gspo_dapo,loo_gspo \
  --contrast=pba_charged,pba --contrast=pba8_charged,pba "$@" || exit
# The arms behind C2 and C3 and their baseline on two more seeds: a 5-seed table in seeds5/.
.venv/bin/python -m experiments.compare --root=runs/study --out=$OUT/seeds5 --seeds=0,1,2,3,4 \
  "${COMMON[@]}" --arm=grpo \
  --arm="pba=rl.anchor.polarity=above rl.anchor.weight=0.1" \
  --arm="maxrl=rl.estimator=maxrl" \
  --arm="curverl=rl.estimator=curverl" \
  --contrast=curverl,maxrl "$@" || exit
# C4's decomposition where Weighted GRPO's weights act (lambda_neg = 2; at 1 they are GRPO's
# z-scores): with the q+/q- pairing (wgrpo2), and on data-order pairs without it (wgrpo2_random).
exec .venv/bin/python -m experiments.compare --root=runs/study --out=$OUT/c4_weights --seeds=0,1,2 \
  "${COMMON[@]}" --arm=grpo \
  --arm="pairing_wgrpo=rl.pairing=on rl.estimator=pair_weighted" \
  --arm="wgrpo2=rl.pairing=on rl.estimator=pair_weighted rl.estimator.neg_weight=2" \
  --arm="wgrpo2_random=rl.pairing.select=random_pairs rl.estimator=pair_weighted rl.estimator.neg_weight=2" \
  --contrast=wgrpo2,pairing_wgrpo --contrast=wgrpo2,wgrpo2_random "$@"
