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
    c.task.name = "arithmetic"  # arithmetic | reasoning_gym | jsonl | parquet
    c.task.levels = (0, 1, 2, 3, 4)  # arithmetic difficulty levels (see jaxrl_vr.tasks.arithmetic)
    c.task.num_train = 1500  # RL training prompts (arithmetic / reasoning_gym; cap for files, 0 = all)
    c.task.num_eval = 80  # held-out prompts for base/final pass@k (cap for files, 0 = all)
    c.task.num_sft_examples = 20000  # supervised warm-start pairs of the builtin model
    c.task.path = ""  # jsonl / parquet: the file of {"prompt", "answer"} rows
    c.task.eval_path = ""  # held-out file ("" = hold out task.eval_fraction of task.path)
    c.task.eval_fraction = 0.1
    c.task.prompt_field = "prompt"  # row field names
    c.task.answer_field = "answer"
    c.task.verifier = "math"  # registered verifier for rows without their own "verifier"
    c.task.instruction = ""  # appended to every prompt, e.g. "Put the final answer in \\boxed{}."
    c.task.rg_tasks = "chain_sum"  # reasoning_gym: comma-separated generator names
    c.task.rg_config = "{}"  # reasoning_gym: JSON generator kwargs (shared, or {task: kwargs})

    c.model = ml_collections.ConfigDict()
    c.model.source = "builtin"  # builtin | hf | gguf | smollm2
    c.model.path = ""  # hf: directory; gguf: file; smollm2: optional GGUF path
    c.model.dtype = "float32"  # parameter dtype: float32 | bfloat16
    c.model.compute_dtype = ""  # matmul dtype ("" = dtype; bfloat16 = bf16 dots, f32 accumulation)
    c.model.chat = False  # wrap prompts in the tokenizer's chat template
    c.model.system_prompt = config_dict.placeholder(str)  # None = the template's default
    c.model.hidden_size = 96  # builtin decoder: width D
    c.model.intermediate_size = 192  # builtin: SwiGLU width
    c.model.num_layers = 2
    c.model.num_heads = 4
    c.model.num_kv_heads = 4
    c.model.head_dim = 24

    c.sft = ml_collections.ConfigDict()  # supervised warm start of the builtin model
    c.sft.steps = 600  # stopped early on purpose: the base must stay imperfect
    c.sft.batch_size = 64
    c.sft.learning_rate = 3e-3  # AdamW peak, cosine decay to 10%
    c.sft.warmup_steps = 20
    c.sft.weight_decay = 0.0
    c.sft.grad_clip_norm = 1.0
    c.sft.seed = 0  # SFT shuffling seed (the run seed also changes the data)

    c.rl = ml_collections.ConfigDict()
    c.rl.steps = 300  # RL steps (one rollout batch each); 0 = evaluate the base only
    c.rl.token_budget = 0  # stop once this many tokens were generated (0 = no budget)
    c.rl.budget_includes_calibration = False  # PBA / pairing calibration tokens count against the budget
    c.rl.budget_fractions = ()  # also keep checkpoints at these fractions of the budget, e.g. (0.25, 0.5)
    c.rl.prompts_per_step = 64  # P
    c.rl.samples_per_prompt = 8  # G
    c.rl.max_new_tokens = 6  # T: answers have <= 4 digits + EOS
    c.rl.temperature = 1.0  # sampling temperature (training log-probs use logits / T too)
    c.rl.top_p = 1.0
    c.rl.top_k = 0  # 0 = off
    c.rl.num_epochs = 1  # passes over each rollout batch
    c.rl.num_minibatches = 4  # optimizer steps per pass (ratios and clipping act)
    c.rl.advantage = "grpo"  # grpo | dr_grpo | loo | maxrl | curverl | reinforce | pair_weighted
    c.rl.curverl_window = 10  # t0 of the CurveRL reference window
    c.rl.pair_neg_weight = 1.0  # Weighted GRPO: lambda_neg on q- rows (needs rl.pairing)
    c.rl.pair_scope = "group"  # Weighted GRPO normalisation: group | pair | mean
    c.rl.success_threshold = 0.5  # a verifier score >= this is a success (everywhere)
    c.rl.overlong_cache_len = 0  # DAPO soft overlong window (tokens); 0 = off
    c.rl.overlong_coef = 1.0  # lambda_len
    c.rl.hack_coef = 0.0  # lambda_hack (0 = off)
    c.rl.hack_detectors = ""  # comma-separated: conflicting_answers,copied_from_prompt,empty_or_truncated
    c.rl.log_reference_kl = True  # log KL to the base even when no KL is in the loss
    c.rl.anchor = "none"  # PBA: none | above | below (anchored KL to the base)
    c.rl.anchor_weight = 0.0  # lambda_PBA (its own coefficient, not loss.kl_beta)
    c.rl.anchor_tau_low = 0.03  # PBA band on the base pass rate (inclusive); the paper's values are unknown
    c.rl.anchor_tau_high = 0.6
    c.rl.anchor_calibration_samples = 64  # base samples per training prompt for p_base
    c.rl.dynamic_sampling = False  # DAPO: keep only groups with differing scores
    c.rl.dynamic_max_rounds = 3  # generation rounds per batch when dynamic_sampling
    c.rl.dynamic_recheck_interval = 0  # suspend filtered prompts this many steps (0 = off)
    c.rl.two_stage = False  # MAI-Thinking-1 two-stage sampling: probe, continue if informative
    c.rl.two_stage_probe = 4  # G_probe samples per prompt in the probe (<= samples_per_prompt)
    c.rl.two_stage_lo = 0.0  # continue to G = samples_per_prompt iff lo <= probe pass rate
    c.rl.two_stage_hi = 0.75  # ... <= hi (inclusive); others keep only their probe samples
    c.rl.adaptive_g_max = 0  # two_stage: split P*G over prompts by p(1-p), <= this each (0 = off)
    c.rl.pairing = False  # Weighted-GRPO prompt choice: P/2 (q+, q-) pairs from tracked rates
    c.rl.pairing_neg_c = 2  # c of the q- band [1 - c/G, 1 - 1/G]
    c.rl.pairing_pos_max = 0.25  # q+ band (pos_min, pos_max] on the tracked success rate
    c.rl.pairing_pos_min = 0.0
    c.rl.pairing_min_count = 4  # tracked samples a prompt needs to enter a pool
    c.rl.pairing_strategy = "random"  # random | extreme (hardest q+ with most-solved q-)
    c.rl.pairing_calibration_samples = 8  # samples per training prompt of the initial rate pass
    c.rl.pairing_calibration_cap = 8.0  # calibration counts weigh at most this many samples
    c.rl.pairing_explore_frac = 0.25  # share of each batch from the data order (new prompts enter)
    c.rl.verifier_workers = 1  # VerifierPool processes (0 = score in-process)
    c.rl.verifier_timeout_s = 5.0
    c.rl.verifier_error_fraction = 1.0  # stop when this fraction of a step's samples error ...
    c.rl.verifier_error_patience = 3  # ... for this many steps in a row
    c.rl.checkpoint_every = 50  # steps between checkpoints (0 = only at the end)
    c.rl.max_to_keep = 2
    c.rl.seed = 0  # extra RL seed (sampling keys / data order use seed and rl.seed)

    c.loss = ml_collections.ConfigDict()
    c.loss.ratio = "token"  # token | sequence (GSPO) | gspo_token
    c.loss.aggregation = "token_mean"  # see jaxrl_vr.losses.aggregate
    c.loss.max_len = config_dict.placeholder(int)  # Dr.GRPO constant (None = T)
    c.loss.eps_low = config_dict.placeholder(float)  # None = 0.2 (token) / 3e-4 (sequence ratios)
    c.loss.eps_high = config_dict.placeholder(float)  # None = 0.28 (token) / 4e-4 (sequence ratios)
    c.loss.dual_clip = config_dict.placeholder(float)  # c > 1 of the dual clip (None = off)
    c.loss.log_ratio_low = config_dict.placeholder(float)  # outer log-ratio truncation (None = off)
    c.loss.log_ratio_high = config_dict.placeholder(float)
    c.loss.kl_beta = 0.0  # beta of the reference KL on every token (0 = off)
    c.loss.kl_kind = "k3"  # k1 | k2 | k3
    c.loss.kl_aggregation = "token_mean"
    c.loss.entropy = "none"  # none | bonus | feedback
    c.loss.entropy_coef = 0.0  # entropy bonus coefficient (entropy = bonus)
    c.loss.entropy_target = 0.5  # H* of the entropy-feedback controller (nats)
    c.loss.entropy_step_size = 0.01  # delta of the controller
    c.loss.entropy_k_max = 0.5  # bound of the controller's k
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
    c.eval.num_samples = 256  # n samples per held-out prompt (pass@k for k = 1..n, as the regimes)
    c.eval.temperature = 1.0
    c.eval.prompts_per_chunk = 40
    c.eval.base_calibration_samples = 256  # independent base samples per prompt for regimes (0 = reuse n)
    c.eval.max_new_tokens = 0  # evaluation response cap (0 = rl.max_new_tokens)

    c.run = ml_collections.ConfigDict()
    c.run.progress = True  # progress bar
    c.run.tensorboard = True  # TensorBoard events in workdir/tb
    c.run.print_table = True
    c.run.export = True  # save_pretrained the final policy into workdir/export
    c.run.keep_host_memory = True  # reuse XLA's freed host memory (docs/performance.md at 9f22ea1, "perf17")
    c.run.cpu_memory_schedule = True  # XLA:CPU orders programs for memory (docs/performance.md at 9f22ea1, "perf24")
    c.run.compilation_cache = "auto"  # compiled programs on disk for the next run ("" = off; "perf33")

    if variant == "smoke":  # seconds of work, and still at least one step with a gradient
        c.task.levels = (0,)  # single-digit sums: the 5-step-cheap base solves some of them
        c.task.num_train = 64
        c.task.num_eval = 10
        c.task.num_sft_examples = 512
        c.model.hidden_size = 32
        c.model.intermediate_size = 64
        c.model.num_layers = 1
        c.model.num_heads = 2
        c.model.num_kv_heads = 2
        c.model.head_dim = 16
        c.sft.steps = 100
        c.sft.batch_size = 16
        c.sft.learning_rate = 1e-2
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
