#!/usr/bin/env bash
# SmolLM2-135M on reasoning-gym arithmetic, full fine-tuning against LoRA rank 16 at the same budget,
# model.compute_dtype=auto (bf16 on a CPU with bf16 dot units). Run one after the other on a quiet
# 2-core Xeon (family 6 model 207, avx512_bf16 amx_bf16), 2026-12-06, commit 6a0bde3+.
set -euo pipefail
/usr/bin/time -v .venv/bin/python -m experiments.train --config=experiments/configs/smollm2_rg.py --workdir=/tmp/smol_full
/usr/bin/time -v .venv/bin/python -m experiments.train --config=experiments/configs/smollm2_rg.py:lora --workdir=/tmp/smol_lora
for w in full lora; do cp /tmp/smol_$w/summary.json /tmp/smol_$w/config.json experiments/results/smollm2_rg_lora/$w/; done
