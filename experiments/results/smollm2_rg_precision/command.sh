#!/usr/bin/env bash
# The SmolLM2 config (experiments/configs/smollm2_rg.py: 24 RL steps of 8 prompts x 8 samples, held-out
# pass@1 from 8 samples on 64 prompts) in float32 and in bf16 mixed precision, one after the other
# on a 2-core Xeon (family 6 model 207; avx512_bf16, amx_bf16, amx_tile), 2026-12-06, commit e9b5e54.
set -euo pipefail
for p in float32 bfloat16; do
  /usr/bin/time -v -o /tmp/smol_prec_$p.time_v.txt .venv/bin/python -m experiments.train \
      --config=experiments/configs/smollm2_rg.py --workdir=/tmp/smol_prec_$p --config.model.compute_dtype=$p
  mkdir -p experiments/results/smollm2_rg_precision/$p
  cp /tmp/smol_prec_$p/summary.json /tmp/smol_prec_$p/config.json experiments/results/smollm2_rg_precision/$p/
  cp /tmp/smol_prec_$p.time_v.txt experiments/results/smollm2_rg_precision/$p/time_v.txt
done
