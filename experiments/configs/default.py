"""Embedded default: tiny char-level decoder, SFT warm start, GRPO on arithmetic.

    python -m experiments.train --config=experiments/configs/default.py --workdir=runs/default
    python -m experiments.train --config=experiments/configs/default.py:smoke --workdir=/tmp/s
    ... --config.rl.estimator.name=loo --config.loss.ratio=sequence --config.seed=1

Variants (after ":"): "" (the default, < 10 min on 2 CPU cores) and "smoke" (seconds of
work, used by tests). Only what differs from the defaults is here; every key, its default
and its meaning are in jaxrl_vr/train/config.py (docs/usage.md lists them).
"""

from __future__ import annotations

import ml_collections

VARIANTS = ("", "default", "smoke")


def get_config(variant: str | None = None) -> ml_collections.ConfigDict:
    variant = (variant or "").strip()
    if variant not in VARIANTS:
        raise ValueError(f"unknown config variant {variant!r}; choose one of {VARIANTS[1:]} "
                         "(e.g. --config=experiments/configs/default.py:smoke).")
    c = ml_collections.ConfigDict()
    c.sft = dict(steps=600)  # stopped early on purpose: the base must stay imperfect
    c.rl = dict(
        steps=300, prompts_per_step=64,  # P = 64, G = 8 (the default)
        max_new_tokens=6,  # answers have <= 4 digits + EOS
        num_minibatches=4,  # optimizer steps per batch (ratios and clipping act)
        checkpoint_every=50)
    c.optim = dict(learning_rate=2e-4, warmup_steps=5, b2=0.99)  # 1e-3 collapses this tiny policy
    c.eval = dict(num_samples=256,  # pass@k for k = 1..256, as the regimes
                  every=25, during_samples=16)  # and pass@1..16 every 25 steps: the path over training
    if variant == "smoke":  # seconds of work, and still at least one step with a gradient
        c.task = dict(levels=(0,), num_train=64, num_eval=10, num_sft_examples=512)  # 1-digit sums
        c.model = dict(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                       num_kv_heads=2, head_dim=16)
        c.sft = dict(steps=100, batch_size=16, learning_rate=1e-2)
        c.rl.update(steps=3, prompts_per_step=4, samples_per_prompt=4, num_minibatches=2,
                    checkpoint_every=1, verifier=dict(workers=0))
        c.eval = dict(num_samples=4, prompts_per_chunk=10, base_calibration_samples=8)
        c.run = dict(progress=False)
    return c
