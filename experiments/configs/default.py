"""Embedded default: tiny char-level decoder, SFT warm start, GRPO-style RL on arithmetic.

    python -m experiments.train --config=experiments/configs/default.py --workdir=runs/default
    python -m experiments.train --config=experiments/configs/default.py:smoke --workdir=/tmp/s
    ... --config.rl.advantage=loo --config.loss.ratio=sequence --config.seed=1

Variants (the text after ":"): "" (the default, < 10 min on 2 CPU cores) and "smoke"
(a few seconds of work, used by tests). Every field is listed here; an override of an
unknown key fails at once with the key's name.
"""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict

VARIANTS = ("", "default", "smoke")


def get_config(variant: str | None = None) -> ml_collections.ConfigDict:
    variant = (variant or "").strip()
    if variant not in VARIANTS:
        raise ValueError(
            f"unknown config variant {variant!r}; choose one of {VARIANTS[1:]} "
            "(e.g. --config=experiments/configs/default.py:smoke)."
        )
    c = ml_collections.ConfigDict()
    c.seed = 0  # drives model init, SFT order, RL sampling/data order and evaluation keys

    c.task = ml_collections.ConfigDict()
    c.task.name = "arithmetic"  # built-in procedural task with verifiable answers
    c.task.levels = (0, 1, 2, 3, 4)  # difficulty levels (see jaxrl_vr.tasks.arithmetic)
    c.task.num_train = 1500  # RL training prompts (train split, balanced over levels)
    c.task.num_eval = 80  # held-out prompts (test split) for base/final pass@k
    c.task.num_sft_examples = 20000  # supervised warm-start pairs (train split)

    c.model = ml_collections.ConfigDict()
    c.model.hidden_size = 96  # width D
    c.model.intermediate_size = 192  # SwiGLU width
    c.model.num_layers = 2
    c.model.num_heads = 4
    c.model.num_kv_heads = 4
    c.model.head_dim = 24

    c.sft = ml_collections.ConfigDict()
    c.sft.steps = 600  # stopped early on purpose: the base must stay imperfect
    c.sft.batch_size = 64
    c.sft.learning_rate = 3e-3  # AdamW peak, cosine decay to 10%
    c.sft.warmup_steps = 20
    c.sft.weight_decay = 0.0
    c.sft.grad_clip_norm = 1.0
    c.sft.seed = 0  # SFT shuffling seed (the run seed also changes the data)

    c.rl = ml_collections.ConfigDict()
    c.rl.steps = 300  # RL steps (one rollout batch each)
    c.rl.prompts_per_step = 64  # P
    c.rl.samples_per_prompt = 8  # G
    c.rl.max_new_tokens = 6  # T: answers have <= 4 digits + EOS
    c.rl.temperature = 1.0
    c.rl.top_p = 1.0
    c.rl.top_k = 0  # 0 = off
    c.rl.num_epochs = 1  # passes over each rollout batch
    c.rl.num_minibatches = 4  # optimizer steps per pass (ratios and clipping act)
    c.rl.advantage = "grpo"  # grpo | dr_grpo | loo | maxrl | curverl | reinforce
    c.rl.curverl_window = 10  # t0 of the CurveRL reference window
    c.rl.eps_low = 0.2  # ratio clip 1 - eps_low
    c.rl.eps_high = 0.28  # ratio clip 1 + eps_high (DAPO clip-higher)
    c.rl.dual_clip = 3.0  # c of the dual clip (used when loss.dual_clip)
    c.rl.log_ratio_low = -20.0  # outer truncation bounds (used when loss.log_ratio_bounds)
    c.rl.log_ratio_high = 20.0
    c.rl.kl_beta = 0.0  # beta of the reference KL (used when loss.use_kl)
    c.rl.entropy_coef = 0.0  # entropy bonus (used when loss.entropy == "bonus")
    c.rl.entropy_target = 0.5  # H* of the entropy-feedback controller (nats)
    c.rl.entropy_step_size = 0.01  # delta of the controller
    c.rl.entropy_k_max = 0.5  # bound of the controller's k
    c.rl.overlong_cache_len = 0  # DAPO soft overlong window (tokens); 0 = off
    c.rl.overlong_coef = 1.0  # lambda_len
    c.rl.log_reference_kl = True  # log KL to the base even when beta = 0
    c.rl.anchor = "none"  # PBA: none | above | below (KL only on anchored prompts; needs use_kl)
    c.rl.anchor_tau_low = 0.5  # PBA band on the base pass rate (inclusive)
    c.rl.anchor_tau_high = 1.0
    c.rl.dynamic_sampling = False  # DAPO: keep only groups with differing scores
    c.rl.dynamic_max_rounds = 3  # generation rounds per batch when dynamic_sampling
    c.rl.two_stage = False  # MAI-Thinking-1 two-stage sampling: probe, continue if informative
    c.rl.two_stage_probe = 4  # G_probe samples per prompt in the probe (<= samples_per_prompt)
    c.rl.two_stage_lo = 0.0  # continue to G = samples_per_prompt iff lo <= probe pass rate
    c.rl.two_stage_hi = 0.75  # ... <= hi (inclusive); others keep only their probe samples
    c.rl.pairing = False  # Weighted-GRPO prompt choice: P/2 (q+, q-) pairs from the tracker
    c.rl.pairing_neg_c = 2  # c of the q- band [1 - c/G, 1 - 1/G]
    c.rl.pairing_pos_max = 0.25  # q+ band (pos_min, pos_max] on the tracked success rate
    c.rl.pairing_pos_min = 0.0
    c.rl.pairing_min_count = 4  # tracked samples a prompt needs to enter a pool
    c.rl.pairing_strategy = "random"  # random | extreme (hardest q+ with most-solved q-)
    c.rl.verifier_workers = 1  # VerifierPool processes (0 = score in-process)
    c.rl.verifier_timeout_s = 5.0
    c.rl.checkpoint_every = 50  # steps between checkpoints (0 = only at the end)
    c.rl.max_to_keep = 2
    c.rl.seed = 0  # extra RL seed (sampling keys / data order use seed and rl.seed)

    c.loss = ml_collections.ConfigDict()
    c.loss.ratio = "token"  # token | sequence (GSPO) | gspo_token
    c.loss.aggregation = "token_mean"  # see jaxrl_vr.losses.aggregate
    c.loss.max_len = config_dict.placeholder(int)  # Dr.GRPO constant (None = T)
    c.loss.dual_clip = False
    c.loss.log_ratio_bounds = False
    c.loss.use_kl = False
    c.loss.kl_kind = "k3"  # k1 | k2 | k3
    c.loss.kl_aggregation = "token_mean"
    c.loss.entropy = "none"  # none | bonus | feedback
    c.loss.num_microbatches = 1  # gradient accumulation per optimizer step (exact)
    c.loss.logprob_chunk_size = config_dict.placeholder(int)  # LM-head chunk (None = auto)
    c.loss.detach_behaviour = False  # pi_old = sg(pi_theta); only for 1 update per rollout

    c.optim = ml_collections.ConfigDict()
    c.optim.learning_rate = 2e-4  # RL peak learning rate (1e-3 collapses this tiny policy)
    c.optim.warmup_steps = 5
    c.optim.schedule = "constant"  # constant | cosine | linear
    c.optim.decay_steps = 0  # needed by cosine/linear: total optimizer steps
    c.optim.end_lr_ratio = 0.0
    c.optim.b1 = 0.9
    c.optim.b2 = 0.99
    c.optim.eps = 1e-8
    c.optim.weight_decay = 0.0
    c.optim.grad_clip_norm = 1.0  # 0 = off

    c.eval = ml_collections.ConfigDict()
    c.eval.num_samples = 16  # n samples per held-out prompt (pass@k for k = 1..n)
    c.eval.temperature = 1.0
    c.eval.prompts_per_chunk = 40
    c.eval.base_calibration_samples = 256  # independent base samples per prompt for regimes (0 = reuse n)

    c.run = ml_collections.ConfigDict()
    c.run.progress = True  # progress bar
    c.run.tensorboard = True  # TensorBoard events in workdir/tb
    c.run.print_table = True

    if variant == "smoke":
        c.task.num_train = 64
        c.task.num_eval = 10
        c.task.num_sft_examples = 512
        c.model.hidden_size = 32
        c.model.intermediate_size = 64
        c.model.num_layers = 1
        c.model.num_heads = 2
        c.model.num_kv_heads = 2
        c.model.head_dim = 16
        c.sft.steps = 5
        c.sft.batch_size = 16
        c.rl.steps = 3
        c.rl.prompts_per_step = 4
        c.rl.samples_per_prompt = 4
        c.rl.num_minibatches = 2
        c.rl.checkpoint_every = 1
        c.rl.verifier_workers = 0
        c.eval.num_samples = 4
        c.eval.prompts_per_chunk = 10
        c.eval.base_calibration_samples = 8
        c.run.progress = False
        c.run.tensorboard = True
    c.lock()
    return c
