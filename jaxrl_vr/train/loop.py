"""The RL loop: prompts → sampler → verifier → rewards → advantages → updates → metrics → checkpoint.

A plain Python loop drives the jitted pieces (SPEC §1). Per training step:

1. take the next ``P`` prompts (a seeded permutation per data epoch; the position is
   checkpointed), tokenize and left-pad them to a fixed width;
2. sample ``G`` responses each (``jaxrl_vr.sampling.generate``, KV cache);
3. score them on the host (``VerifierPool``; exceptions and timeouts score 0 and are
   counted), subtract the DAPO overlong penalty if configured (``jaxrl_vr.rewards``);
4. advantages from the configured estimator (``jaxrl_vr.advantages``);
5. recompute behaviour log-probs with the trainer (the sampler's are kept only to log
   the sampler/trainer gap) and reference log-probs of the frozen π_ref;
6. ``num_epochs`` × ``num_minibatches`` optimizer steps (``make_train_step``), so ratios
   and clipping actually act;
7. metrics (JSONL + TensorBoard + progress bar) and budget accounting (generated and
   trained tokens, wall time per phase), checkpoint every ``checkpoint_every`` steps.

Resume is exact: params, optimizer state, step, PRNG key, data position, CurveRL window,
entropy controller, prompt tracker and budget counters are all in the checkpoint.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_vr import advantages as adv_lib
from jaxrl_vr.train import step as step_lib
from jaxrl_vr.train.checkpoint import Checkpointer
from jaxrl_vr.train.metrics import MetricsWriter, ProgressBar
from jaxrl_vr.train.optim import OptimConfig, make_optimizer
from jaxrl_vr.train.rollout import (
    ADVANTAGE_ESTIMATORS,
    compute_advantages,
    decode_responses,
    encode_prompts,
    make_scorer,
    masked_stats,
    overlong_penalty,
)


@dataclasses.dataclass(frozen=True)
class RLConfig:
    """Loop settings and per-step hyperparameters of the RL phase.

    Attributes:
      steps: training steps (one rollout batch each).
      prompts_per_step: P prompts per rollout batch.
      samples_per_prompt: G responses per prompt.
      max_new_tokens: response length cap T.
      temperature, top_p, top_k: sampling.
      num_epochs: passes over each rollout batch.
      num_minibatches: optimizer steps per pass (B must divide evenly).
      advantage: one of ADVANTAGE_ESTIMATORS ("dr_grpo" = GRPO without std scaling).
      curverl_window: t₀, batches in the CurveRL reference window.
      eps_low, eps_high, dual_clip, log_ratio_low, log_ratio_high, kl_beta, entropy_coef,
      entropy_target, entropy_step_size, entropy_k_max: StepHyper values (arrays in the step).
      overlong_cache_len: DAPO soft overlong window in tokens (0 = no penalty); the
        penalty's max_len is max_new_tokens.
      overlong_coef: λ_len multiplying the penalty.
      log_reference_kl: compute reference log-probs even when KL is not in the loss (to log
        KL(π‖π_ref)); costs one forward per rollout.
      anchor: PBA (Per-problem Base Anchoring, arXiv 2607.20543): "none" (the KL term, if
        on, applies to every prompt), "above" (KL only on prompts with
        anchor_tau_low <= p_base <= anchor_tau_high) or "below" (the complement). Needs
        loss.use_kl and a tracker with a frozen-base calibration cache.
      anchor_tau_low, anchor_tau_high: the PBA band (inclusive).
      dynamic_sampling: DAPO dynamic sampling (arXiv 2503.14476): drop groups whose
        verifier scores are all equal and sample more rounds until P groups are kept.
      dynamic_max_rounds: generation rounds allowed per batch (the budget).
      two_stage: two-stage sampling (MAI-Thinking-1; SPEC §4): sample two_stage_probe
        responses per prompt, then continue to samples_per_prompt (G_full) only for
        prompts whose probe pass rate (mean verifier score) lies in [two_stage_lo,
        two_stage_hi]; the others keep their probe samples as a ragged group (the rest
        of their [P, G_full] row is invalid padding). Exclusive with dynamic_sampling.
      two_stage_probe: G_probe, 1 <= G_probe <= samples_per_prompt.
      two_stage_lo, two_stage_hi: the continuation band (inclusive), 0 <= lo <= hi <= 1.
      pairing: positive–negative prompt pairing (Weighted GRPO, arXiv 2602.03452; SPEC
        §3.3): each step's P prompts are P/2 (q⁺, q⁻) pairs drawn from the tracker's pools
        (``jaxrl_vr.selection.pairing``) when both pools are non-empty, else the normal
        data order. Only the prompt choice; the advantage is still rl.advantage. Needs a
        tracker and an even prompts_per_step.
      pairing_neg_c: c of the q⁻ band [1 − c/G, 1 − 1/G] (G = samples_per_prompt).
      pairing_pos_max, pairing_pos_min: the q⁺ band (pos_min, pos_max].
      pairing_min_count: tracked samples a prompt needs to enter a pool.
      pairing_strategy: "random" or "extreme" (``select_pairs``).
      verifier_workers, verifier_timeout_s: VerifierPool settings (0 workers = in-process).
      checkpoint_every: save every N steps (0 = only at the end); max_to_keep: checkpoints kept.
      seed: PRNG seed of sampling and data order.
    """

    steps: int = 100
    prompts_per_step: int = 16
    samples_per_prompt: int = 8
    max_new_tokens: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    num_epochs: int = 1
    num_minibatches: int = 1
    advantage: str = "grpo"
    curverl_window: int = 10
    eps_low: float = 0.2
    eps_high: float = 0.28
    dual_clip: float = 3.0
    log_ratio_low: float = -20.0
    log_ratio_high: float = 20.0
    kl_beta: float = 0.0
    entropy_coef: float = 0.0
    entropy_target: float = 0.5
    entropy_step_size: float = 0.01
    entropy_k_max: float = 0.5
    overlong_cache_len: int = 0
    overlong_coef: float = 1.0
    log_reference_kl: bool = True
    anchor: str = "none"
    anchor_tau_low: float = 0.5
    anchor_tau_high: float = 1.0
    dynamic_sampling: bool = False
    dynamic_max_rounds: int = 3
    two_stage: bool = False
    two_stage_probe: int = 4
    two_stage_lo: float = 0.0
    two_stage_hi: float = 0.75
    pairing: bool = False
    pairing_neg_c: int = 2
    pairing_pos_max: float = 0.25
    pairing_pos_min: float = 0.0
    pairing_min_count: int = 4
    pairing_strategy: str = "random"
    verifier_workers: int = 1
    verifier_timeout_s: float = 5.0
    checkpoint_every: int = 0
    max_to_keep: int = 2
    seed: int = 0

    def __post_init__(self):
        if self.anchor not in ("none", "above", "below"):
            raise ValueError(f"rl.anchor={self.anchor!r} is not one of ('none', 'above', 'below').")
        if self.advantage not in ADVANTAGE_ESTIMATORS:
            raise ValueError(
                f"rl.advantage={self.advantage!r} is not one of {ADVANTAGE_ESTIMATORS}."
            )
        for name in (
            "steps",
            "prompts_per_step",
            "samples_per_prompt",
            "max_new_tokens",
            "num_epochs",
            "num_minibatches",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"rl.{name} must be >= 1, got {getattr(self, name)}.")
        batch = self.prompts_per_step * self.samples_per_prompt
        if batch % self.num_minibatches:
            raise ValueError(
                f"rl.num_minibatches={self.num_minibatches} does not divide the "
                f"rollout batch P·G={batch}."
            )
        if self.two_stage:
            if not 1 <= self.two_stage_probe <= self.samples_per_prompt:
                raise ValueError(
                    f"rl.two_stage_probe={self.two_stage_probe} must lie in [1, "
                    f"rl.samples_per_prompt={self.samples_per_prompt}]."
                )
            if not 0.0 <= self.two_stage_lo <= self.two_stage_hi <= 1.0:
                raise ValueError(
                    f"need 0 <= rl.two_stage_lo <= rl.two_stage_hi <= 1, got "
                    f"{self.two_stage_lo}, {self.two_stage_hi}."
                )
            if self.dynamic_sampling:
                raise ValueError(
                    "rl.two_stage and rl.dynamic_sampling are exclusive; turn one off."
                )

        if self.pairing:
            if self.prompts_per_step % 2:
                raise ValueError(
                    f"rl.pairing needs an even rl.prompts_per_step (P/2 pairs), got "
                    f"{self.prompts_per_step}."
                )
            if self.pairing_strategy not in ("random", "extreme"):
                raise ValueError(
                    f"rl.pairing_strategy={self.pairing_strategy!r} is not one of "
                    "('random', 'extreme')."
                )
            num_g, neg_c = self.samples_per_prompt, self.pairing_neg_c
            if num_g < 2 or not 1 <= neg_c <= num_g:
                raise ValueError(
                    f"rl.pairing needs samples_per_prompt >= 2 and 1 <= pairing_neg_c <= "
                    f"samples_per_prompt; got {self.samples_per_prompt}, {self.pairing_neg_c}."
                )
            if not 0.0 <= self.pairing_pos_min < self.pairing_pos_max <= 1.0:
                raise ValueError(
                    f"need 0 <= rl.pairing_pos_min < rl.pairing_pos_max <= 1, got "
                    f"{self.pairing_pos_min}, {self.pairing_pos_max}."
                )

    def hyper(self) -> step_lib.StepHyper:
        return step_lib.StepHyper.create(
            eps_low=self.eps_low,
            eps_high=self.eps_high,
            dual_clip=self.dual_clip,
            log_ratio_low=self.log_ratio_low,
            log_ratio_high=self.log_ratio_high,
            kl_beta=self.kl_beta,
            entropy_coef=self.entropy_coef,
            entropy_target=self.entropy_target,
            entropy_step_size=self.entropy_step_size,
            entropy_k_max=self.entropy_k_max,
        )


class NonFiniteLossError(FloatingPointError):
    """A train step produced a NaN/inf loss or gradient; the offending step was saved."""


@dataclasses.dataclass
class Budget:
    """Cumulative accounting: tokens and seconds per phase (checkpointed)."""

    generated_tokens: float = 0.0
    trained_tokens: float = 0.0
    sample_s: float = 0.0
    verify_s: float = 0.0
    logprob_s: float = 0.0
    update_s: float = 0.0
    total_s: float = 0.0
    verifier_errors: float = 0.0
    verifier_timeouts: float = 0.0


# ------------------------------------------------------------------------------- two-stage


_ZERO_WHEN_INVALID = ("logp_bt", "mask_bt", "length_b", "truncated_b", "scores_b", "rewards_b")


def join_two_stage(
    probe: dict, extra: dict | None, continue_p: np.ndarray, *, g_probe: int, g_full: int
) -> tuple[dict, np.ndarray]:
    """Joins probe and continuation rollouts into fixed [P·G_full, ...] arrays (host numpy).

    Row p of the [P, G_full] layout holds prompt p's G_probe probe samples, then its
    G_full − G_probe continuation samples if ``continue_p[p]``; otherwise those slots are
    padding: a copy of the prompt's first probe sample (so every prompt row stays a real
    prompt for the model call) with mask, log-probs, length, truncation, score and reward
    zeroed. Rewards and validity follow ``merge_probe_and_continuation``.

    Args:
      probe: per-response arrays of the probe round, [P·G_probe, ...] (``_sample_round``).
      extra: per-response arrays of the continued prompts, [P_cont·(G_full − G_probe), ...]
        in prompt order, or None when nothing continued (or G_probe = G_full).
      continue_p: [P] bool.

    Returns:
      (arrays [P·G_full, ...], valid_pg [P, G_full] bool).
    """
    from jaxrl_vr.selection.two_stage import merge_probe_and_continuation

    cont = np.asarray(continue_p, bool)
    num_p, g_extra = cont.shape[0], g_full - g_probe
    if extra is None:
        cont = np.zeros_like(cont)
    elif int(cont.sum()) * g_extra != np.asarray(extra["scores_b"]).shape[0]:
        raise ValueError(
            f"continuation has {np.asarray(extra['scores_b']).shape[0]} samples; expected "
            f"{int(cont.sum())} continued prompts × {g_extra}."
        )
    _, valid_pg = merge_probe_and_continuation(
        np.zeros((num_p, g_probe)),
        np.zeros((num_p, g_extra)),
        cont,
    )
    out = {}
    for name, value in probe.items():
        value = np.asarray(value)
        probe_pg = value.reshape(num_p, g_probe, *value.shape[1:])
        full = np.concatenate(
            [probe_pg, np.repeat(probe_pg[:, :1], g_extra, axis=1)], axis=1
        )
        if extra is not None and cont.any():
            ext = np.asarray(extra[name])
            full[cont, g_probe:] = ext.reshape(-1, g_extra, *ext.shape[1:])
        if name in _ZERO_WHEN_INVALID:
            keep = valid_pg.reshape(valid_pg.shape + (1,) * (full.ndim - 2))
            full = np.where(keep, full, np.zeros((), full.dtype))
        out[name] = full.reshape(num_p * g_full, *value.shape[1:])
    return out, valid_pg


# ------------------------------------------------------------------------------------ loop


@functools.lru_cache(maxsize=8)
def _compiled_fns(
    graphdef, optim: OptimConfig, loss: step_lib.LossConfig, logprob_microbatches: int
):
    """Jitted (train step, log-prob fn), shared by trainers with the same model structure and
    static config, so a resumed or repeated run in one process does not compile again."""
    train_step = step_lib.make_train_step(graphdef, None, make_optimizer(optim), loss)
    logprob_fn = step_lib.make_logprob_fn(
        graphdef, num_microbatches=logprob_microbatches, chunk_size=loss.logprob_chunk_size
    )
    return train_step.jitted, logprob_fn


class RLTrainer:
    """Runs RL on a policy in place of the plain-loop description in the module docstring.

    Args:
      model: the policy (a jaxrl_vr Decoder); its params are the initial policy.
      tokenizer: Tokenizer protocol object (encode/decode/bos_id/eos_id/pad_id).
      items: training TaskItems.
      rl: RLConfig. loss: LossConfig. optim: OptimConfig.
      workdir: where metrics.jsonl, tb/ and checkpoints/ go.
      reference_params: frozen π_ref params (default: a copy of the initial params).
      prompt_width: fixed prompt length S (default: the longest training prompt).
      chat: wrap prompts in the tokenizer's chat template.
      tracker: optional PromptTracker over ``items`` (updated each step, checkpointed).
      progress: show a progress bar.
      tensorboard: also write TensorBoard events.
      scorer: optional ``score(items, completions) -> VerifyResult`` replacing the pool.
      mesh: optional ``jax.sharding.Mesh`` (``jaxrl_vr.parallel.make_mesh``): parameters and
        optimizer state are replicated on it and every minibatch is split over its batch
        axes (data parallelism under jit; the same code runs on one device without it).
    """

    def __init__(
        self,
        model,
        tokenizer,
        items: Sequence[Any],
        *,
        rl: RLConfig,
        loss: step_lib.LossConfig,
        optim: OptimConfig,
        workdir: str,
        reference_params=None,
        prompt_width: int | None = None,
        chat: bool = False,
        tracker=None,
        progress: bool = True,
        tensorboard: bool = True,
        scorer: Callable | None = None,
        mesh=None,
    ):
        if not items:
            raise ValueError("RLTrainer needs at least one training item.")
        if len(items) < rl.prompts_per_step:
            raise ValueError(
                f"rl.prompts_per_step={rl.prompts_per_step} exceeds the {len(items)} "
                "training items."
            )
        self.rl, self.loss_cfg, self.optim_cfg = rl, loss, optim
        self.tokenizer, self.items, self.chat = tokenizer, list(items), chat
        self.workdir = os.path.abspath(workdir)
        self.tracker = tracker
        self.progress, self.tensorboard = progress, tensorboard
        self.graphdef, params, self.rest = step_lib.split_model(model)
        self.reference_params = (
            jax.tree.map(jnp.copy, params) if reference_params is None else reference_params
        )
        self.optimizer = make_optimizer(optim)
        batch = rl.prompts_per_step * rl.samples_per_prompt
        minibatch = batch // rl.num_minibatches
        if minibatch % loss.num_microbatches:
            raise ValueError(
                f"loss num_microbatches={loss.num_microbatches} does not divide the "
                f"minibatch of {minibatch} responses."
            )
        jitted_step, self.logprob_fn = _compiled_fns(
            self.graphdef, optim, loss, loss.num_microbatches * rl.num_minibatches
        )
        self.train_step = lambda state, batch, hyper: jitted_step(state, batch, hyper, self.rest)
        self.hyper = rl.hyper()
        self.prompt_width = prompt_width or max(
            encode_prompts(tokenizer, [it.prompt for it in self.items], chat=chat)[0].shape[1], 1
        )
        if loss.detach_behaviour and rl.num_epochs * rl.num_minibatches != 1:
            raise ValueError(
                "loss.detach_behaviour=True is only exact with one optimizer step per rollout "
                f"batch, but rl.num_epochs × rl.num_minibatches = "
                f"{rl.num_epochs * rl.num_minibatches}; set it False or use 1 × 1."
            )
        if rl.anchor != "none" and not loss.use_kl:
            raise ValueError(
                f"rl.anchor={rl.anchor!r} anchors the reference KL, but loss.use_kl is False; "
                "set loss.use_kl=True and rl.kl_beta > 0."
            )
        if rl.pairing and tracker is None:
            raise ValueError("rl.pairing draws pairs from a PromptTracker (tracker=...).")
        if rl.anchor != "none" and tracker is None:
            raise ValueError("rl.anchor needs a PromptTracker with base counts (tracker=...).")
        self.state = {
            "train": step_lib.init_train_state(params, self.optimizer, loss),
            "key": jax.random.key_data(jax.random.key(rl.seed)),
            "curverl": (
                adv_lib.curverl_init(rl.prompts_per_step, window=rl.curverl_window)
                if rl.advantage == "curverl"
                else ()
            ),
        }
        self.mesh = mesh
        if mesh is not None:
            from jaxrl_vr import parallel

            devices = mesh.shape["data"] * mesh.shape["fsdp"]
            if minibatch % devices:
                raise ValueError(
                    f"minibatch of {minibatch} responses is not divisible by the mesh's "
                    f"{devices} batch devices."
                )
            self.state["train"] = jax.device_put(self.state["train"], parallel.replicated(mesh))
        self.data_position = 0
        self.budget = Budget()
        self._scorer = scorer
        self.checkpointer = Checkpointer(
            os.path.join(self.workdir, "checkpoints"), max_to_keep=rl.max_to_keep
        )

    # ---- state -----------------------------------------------------------------------------

    def params(self):
        return self.state["train"].params

    def model(self):
        """The current policy as an nnx Module."""
        return nnx.merge(self.graphdef, self.params(), self.rest)

    def _host_state(self, rl_step: int) -> dict:
        host = {
            "rl_step": rl_step,
            "data_position": self.data_position,
            "budget": dataclasses.asdict(self.budget),
        }
        if self.tracker is not None:
            host["tracker"] = self.tracker.state_dict()
        return host

    def save(self, rl_step: int) -> None:
        self.checkpointer.save(rl_step, self.state, self._host_state(rl_step))

    def restore(self) -> int:
        """Loads the newest complete checkpoint if any; returns the RL step to continue from."""
        if self.checkpointer.latest_step() is None:
            return 0
        state, host, step = self.checkpointer.restore(self.state)
        self.state = state
        self.data_position = int(host["data_position"])
        self.budget = Budget(**host["budget"])
        if self.tracker is not None and "tracker" in host:
            self.tracker.load_state_dict(host["tracker"])
        return step

    # ---- data ------------------------------------------------------------------------------

    def _next_prompt_indices(self) -> np.ndarray:
        num, per_step = len(self.items), self.rl.prompts_per_step
        out = []
        pos = self.data_position
        while len(out) < per_step:
            epoch, offset = divmod(pos, num)
            order = np.random.default_rng([self.rl.seed, epoch]).permutation(num)
            take = min(per_step - len(out), num - offset)
            out.extend(order[offset : offset + take].tolist())
            pos += take
        self.data_position = pos
        return np.asarray(out, np.int64)

    def _choose_prompts(self) -> tuple[np.ndarray, bool]:
        """The round's P prompt indices and whether they are (q⁺, q⁻) pairs.

        With ``rl.pairing``: P/2 pairs from ``pairs_from_tracker`` laid out
        [q⁺₀, q⁻₀, q⁺₁, q⁻₁, …] (the data position does not move); when either pool is
        empty, the next P prompts of the data order. The draw is seeded by (rl.seed,
        tracker step, data position), all checkpointed, so a resumed run draws the same.
        """
        rl = self.rl
        if rl.pairing:
            from jaxrl_vr.selection.pairing import pairs_from_tracker

            rng = np.random.default_rng([rl.seed, self.tracker.step + 1, self.data_position, 13])
            pairs = pairs_from_tracker(
                self.tracker,
                rng,
                rl.prompts_per_step // 2,
                group_size=rl.samples_per_prompt,
                neg_c=rl.pairing_neg_c,
                pos_max=rl.pairing_pos_max,
                pos_min=rl.pairing_pos_min,
                min_count=rl.pairing_min_count,
                strategy=rl.pairing_strategy,
            )
            if pairs.shape[0]:
                return pairs.reshape(-1).astype(np.int64), True
        return self._next_prompt_indices(), False

    def _next_key(self):
        key = jax.random.wrap_key_data(self.state["key"])
        key, sub = jax.random.split(key)
        self.state["key"] = jax.random.key_data(key)
        return sub

    # ---- one step --------------------------------------------------------------------------

    def _sample_round(
        self, idx: np.ndarray | None = None, num_samples: int | None = None, track: bool = True
    ) -> tuple[np.ndarray, dict, dict]:
        """Sample and score one round of P prompts × G responses (host numpy arrays).

        Args:
          idx: prompt indices to sample (default: the next P of the data order).
          num_samples: responses per prompt (default rl.samples_per_prompt).
          track: record the scores in the tracker (if any).

        Returns (prompt indices [P], per-response arrays [P·G, ...], round stats).
        """
        from jaxrl_vr.sampling import generate

        rl, tok = self.rl, self.tokenizer
        paired = False
        if idx is None:
            idx, paired = self._choose_prompts()
        idx = np.asarray(idx, np.int64)
        num_g = rl.samples_per_prompt if num_samples is None else int(num_samples)
        batch_items = [self.items[i] for i in idx]
        # A partial round (e.g. a two-stage continuation) is padded to a power-of-two prompt
        # count by repeating its last prompt, so the sampler compiles for O(log P) shapes;
        # the padding rows are dropped before scoring and never reach the budget.
        num_real = len(idx)
        num_rows = min(max(rl.prompts_per_step, num_real), 1 << max(num_real - 1, 0).bit_length())
        padded_items = batch_items + batch_items[-1:] * (num_rows - num_real)
        prompt_tokens_ps, prompt_mask_ps = encode_prompts(
            tok, [it.prompt for it in padded_items], self.prompt_width, chat=self.chat
        )
        t0 = time.perf_counter()
        rollout = generate(
            self._next_key(),
            self.model(),
            prompt_tokens_ps,
            prompt_mask_ps,
            num_samples=num_g,
            max_new_tokens=rl.max_new_tokens,
            temperature=rl.temperature,
            top_p=rl.top_p,
            top_k=rl.top_k,
            stop_token_ids=(tok.eos_id,),
            pad_id=tok.pad_id or 0,
        )
        arrays = {
            name: np.asarray(value)[: num_real * num_g] for name, value in rollout._asdict().items()
        }
        t1 = time.perf_counter()
        completions = decode_responses(tok, arrays["tokens_bt"], arrays["mask_bt"])
        items_b = [it for it in batch_items for _ in range(num_g)]
        if self._scorer is None:
            self._scorer, self._close_scorer = make_scorer(
                rl.verifier_workers, rl.verifier_timeout_s
            )
        result = self._scorer(items_b, completions)
        scores_b = np.asarray(result.scores, np.float32)
        t2 = time.perf_counter()
        rewards_b = scores_b.copy()
        if rl.overlong_cache_len > 0:
            rewards_b = rewards_b + rl.overlong_coef * overlong_penalty(
                arrays["length_b"], max_len=rl.max_new_tokens, cache_len=rl.overlong_cache_len
            )
        arrays["scores_b"] = scores_b
        arrays["rewards_b"] = rewards_b.astype(np.float32)
        if track and self.tracker is not None:  # every sample of the current policy, kept or not
            self.tracker.update(idx, scores_b.reshape(len(idx), num_g))
        statuses = list(result.statuses)
        stats = {
            "generated_tokens": float(arrays["length_b"].sum()),
            "verifier_errors": float(sum(s == "error" for s in statuses)),
            "verifier_timeouts": float(sum(s == "timeout" for s in statuses)),
            "verifier_unparsable": float(sum(s == "unparsable" for s in statuses)),
            "time_sample_s": t1 - t0,
            "time_verify_s": t2 - t1,
        }
        if rl.pairing:
            stats["pairing/paired_rounds"] = float(paired)
        return idx, arrays, stats

    def _sample_batch(self) -> tuple[np.ndarray, dict, np.ndarray, dict]:
        """(prompt indices, per-response arrays, valid_pg, stats) of one rollout batch.

        With ``rl.dynamic_sampling`` (DAPO, arXiv 2503.14476): keep only groups whose
        rewards differ, generating more rounds until P groups are kept or
        ``rl.dynamic_max_rounds`` is spent (a short batch is padded with invalid groups).
        Every generated token counts toward the budget.
        """
        rl = self.rl
        num_p, num_g = rl.prompts_per_step, rl.samples_per_prompt
        if rl.two_stage:
            return self._sample_two_stage()
        if not rl.dynamic_sampling:
            idx, arrays, stats = self._sample_round()
            return idx, arrays, np.ones((num_p, num_g), bool), stats
        from jaxrl_vr.selection.dynamic import DynamicBatcher

        batcher = DynamicBatcher(num_p, max_rounds=rl.dynamic_max_rounds)
        totals: dict[str, float] = {}
        while not batcher.done:
            idx, arrays, stats = self._sample_round()
            for name, value in stats.items():
                totals[name] = totals.get(name, 0.0) + value
            batcher.add(
                idx,
                arrays["rewards_b"].reshape(num_p, num_g),
                payload=arrays,
                filter_on_pg=arrays["scores_b"].reshape(num_p, num_g),
            )
        result = batcher.result()
        arrays = dict(result.payload)
        group_b = np.repeat(np.asarray(result.group_mask_p, bool), num_g)
        arrays["mask_bt"] = np.asarray(arrays["mask_bt"], bool) & group_b[:, None]
        # Padding groups still need a real token in each prompt row for the model call.
        arrays["prompt_mask_bs"] = np.where(
            group_b[:, None],
            arrays["prompt_mask_bs"],
            np.arange(arrays["prompt_mask_bs"].shape[1]) == arrays["prompt_mask_bs"].shape[1] - 1,
        )
        totals.update({k: float(v) for k, v in result.stats.items()})
        totals["dynamic/rounds"] = float(batcher.rounds)
        return np.asarray(result.prompt_idx_p), arrays, np.asarray(result.valid_pg, bool), totals

    def _sample_two_stage(self) -> tuple[np.ndarray, dict, np.ndarray, dict]:
        """Two-stage sampling (MAI-Thinking-1; SPEC §4) of one rollout batch.

        Probe the next P prompts with G_probe = ``rl.two_stage_probe`` samples; prompts whose
        probe pass rate (mean verifier score) lies in [``two_stage_lo``, ``two_stage_hi``]
        get G_full − G_probe more (one generation call over the continued prompts only).
        The batch is [P, G_full] in shape; stopped prompts keep their G_probe samples and
        the rest of their row is invalid padding, so the train step never recompiles.
        Generated tokens of both stages count toward the budget; the tracker sees every
        valid sample once.
        """
        from jaxrl_vr.selection.two_stage import probe_continue

        rl = self.rl
        num_p, g_full, g_probe = rl.prompts_per_step, rl.samples_per_prompt, rl.two_stage_probe
        idx, probe, totals = self._sample_round(num_samples=g_probe, track=False)
        continue_p = np.asarray(
            probe_continue(
                probe["scores_b"].reshape(num_p, g_probe), lo=rl.two_stage_lo, hi=rl.two_stage_hi
            ),
            bool,
        )
        extra = None
        if continue_p.any() and g_full > g_probe:
            _, extra, stats = self._sample_round(
                idx[continue_p], num_samples=g_full - g_probe, track=False
            )
            for name, value in stats.items():
                totals[name] = totals.get(name, 0.0) + value
        arrays, valid_pg = join_two_stage(probe, extra, continue_p, g_probe=g_probe, g_full=g_full)
        if self.tracker is not None:
            self.tracker.update(idx, arrays["scores_b"].reshape(num_p, g_full), valid_pg)
        totals["two_stage/continued_frac"] = float(continue_p.mean())
        continued = 0 if extra is None else int(continue_p.sum())
        totals["two_stage/generated_samples"] = float(
            num_p * g_probe + continued * (g_full - g_probe)
        )
        return idx, arrays, valid_pg, totals

    def collect(self) -> tuple[step_lib.RolloutBatch, dict]:
        """Sample, verify, score and compute advantages and log-probs for one rollout batch."""
        rl = self.rl
        num_p, num_g = rl.prompts_per_step, rl.samples_per_prompt
        idx, arrays, valid_pg, stats = self._sample_batch()
        t2 = time.perf_counter()
        tokens_bt = jnp.asarray(arrays["tokens_bt"], jnp.int32)
        mask_np = np.asarray(arrays["mask_bt"], bool)
        mask_bt = jnp.asarray(mask_np)
        prompt_tokens_bs = jnp.asarray(arrays["prompt_tokens_bs"], jnp.int32)
        prompt_mask_bs = jnp.asarray(arrays["prompt_mask_bs"], bool)
        scores_b, rewards_b = arrays["scores_b"], arrays["rewards_b"]
        rewards_pg = rewards_b.reshape(num_p, num_g)
        adv_pg, self.state["curverl"] = compute_advantages(
            rl.advantage,
            rewards_pg,
            valid_pg,
            self.state["curverl"],
            scores_pg=scores_b.reshape(num_p, num_g),
        )
        adv_b = np.asarray(adv_pg, np.float32).reshape(-1)

        behaviour_logp_bt, _ = self.logprob_fn(
            self.params(), self.rest, prompt_tokens_bs, prompt_mask_bs, tokens_bt, mask_bt
        )
        if self.loss_cfg.use_kl or rl.log_reference_kl:
            reference_logp_bt, _ = self.logprob_fn(
                self.reference_params,
                self.rest,
                prompt_tokens_bs,
                prompt_mask_bs,
                tokens_bt,
                mask_bt,
            )
        else:
            reference_logp_bt = behaviour_logp_bt
        behaviour_np = np.asarray(behaviour_logp_bt)
        t3 = time.perf_counter()

        anchor_p = np.ones(num_p, bool)
        if rl.anchor != "none":
            from jaxrl_vr.selection.anchor import anchor_mask

            anchor_p = np.asarray(
                anchor_mask(
                    self.tracker.p_base(idx),
                    tau_low=rl.anchor_tau_low,
                    tau_high=rl.anchor_tau_high,
                    polarity=rl.anchor,
                    calibrated_p=self.tracker.has_base(idx),
                )
            )

        batch = step_lib.RolloutBatch(
            prompt_tokens_bs=prompt_tokens_bs,
            prompt_mask_bs=prompt_mask_bs,
            tokens_bt=tokens_bt,
            mask_bt=mask_bt,
            adv_b=jnp.asarray(adv_b),
            behaviour_logp_bt=behaviour_logp_bt,
            reference_logp_bt=reference_logp_bt,
            kl_mask_b=jnp.asarray(np.repeat(anchor_p, num_g)),
        )

        valid_b = valid_pg.reshape(-1)
        gap_bt = np.asarray(arrays["logp_bt"]) - behaviour_np
        success_pg = (scores_b >= 0.5).reshape(num_p, num_g)
        group_ok = valid_pg.any(axis=1)
        # Ragged groups (two-stage, dynamic padding): statistics over valid samples only.
        spread_p = np.where(valid_pg, rewards_pg, -np.inf).max(1) - np.where(
            valid_pg, rewards_pg, np.inf
        ).min(1)
        valid_group = group_ok & (np.where(group_ok, spread_p, 0.0) > 0)
        length_b = np.asarray(arrays["length_b"])[valid_b]
        info = {
            "reward": float(rewards_b[valid_b].mean()) if valid_b.any() else 0.0,
            "score": float(scores_b[valid_b].mean()) if valid_b.any() else 0.0,
            "pass_rate": float(success_pg[valid_pg].mean()) if valid_b.any() else 0.0,
            "valid_group_frac": float(valid_group.mean()),
            "all_correct_frac": float(((success_pg | ~valid_pg).all(axis=1) & group_ok).mean()),
            "all_wrong_frac": float(((~success_pg | ~valid_pg).all(axis=1) & group_ok).mean()),
            "response_length": float(length_b.mean()) if length_b.size else 0.0,
            "truncation_rate": float(np.asarray(arrays["truncated_b"])[valid_b].mean())
            if valid_b.any()
            else 0.0,
            "logp_gap_sampler_trainer": float(gap_bt[mask_np].mean()) if mask_np.any() else 0.0,
            "logp_gap_abs_max": float(np.abs(gap_bt[mask_np]).max()) if mask_np.any() else 0.0,
            "time_logprob_s": t3 - t2,
            "anchored_frac": float(anchor_p.mean()),
            **stats,
            **masked_stats(adv_b, valid_b, "adv"),
        }
        if self.rl.advantage == "curverl":
            info["curverl_window_fill"] = float(
                np.asarray(self.state["curverl"].window_valid_wn).mean()
            )
        return batch, info

    def update(self, batch: step_lib.RolloutBatch, rl_step: int) -> dict:
        """num_epochs × num_minibatches optimizer steps on one rollout batch; mean metrics."""
        rl = self.rl
        size = batch.tokens_bt.shape[0]
        per = size // rl.num_minibatches
        history = []
        for epoch in range(rl.num_epochs):
            order = np.random.default_rng([rl.seed, rl_step, epoch, 7]).permutation(size)
            for m in range(rl.num_minibatches):
                rows = jnp.asarray(np.sort(order[m * per : (m + 1) * per]))
                minibatch = jax.tree.map(lambda x: x[rows], batch)
                if self.mesh is not None:
                    from jaxrl_vr import parallel

                    minibatch = parallel.shard_batch(minibatch, self.mesh)
                before = self.state["train"]
                new_state, metrics = self.train_step(before, minibatch, self.hyper)
                if float(metrics["nonfinite"]) > 0:
                    path = self._save_nonfinite(rl_step, before, minibatch, metrics)
                    raise NonFiniteLossError(
                        f"non-finite loss/grad at RL step {rl_step} (epoch {epoch}, minibatch {m}): "
                        f"loss={float(metrics['loss'])}, grad_norm={float(metrics['grad_norm'])}. The "
                        f"pre-step state and the minibatch are saved in {path} for inspection."
                    )
                self.state["train"] = new_state
                history.append(metrics)
        out = {k: float(np.mean([float(h[k]) for h in history])) for k in history[0]}
        out["ratio_max"] = float(max(float(h["ratio_max"]) for h in history))
        out["trained_tokens"] = float(sum(float(h["trained_tokens"]) for h in history))
        out["optimizer_steps"] = float(len(history))
        return out

    def _save_nonfinite(self, rl_step, state, minibatch, metrics) -> str:
        path = os.path.join(self.workdir, f"nonfinite_step_{rl_step}")
        ckpt = Checkpointer(path, max_to_keep=None)
        ckpt.save(
            rl_step,
            {"train": state, "batch": minibatch},
            {"metrics": {k: float(v) for k, v in metrics.items()}},
        )
        ckpt.close()
        return path

    # ---- driver ----------------------------------------------------------------------------

    def run(
        self, *, on_step: Callable[[int, dict], None] | None = None, stop_after: int | None = None
    ) -> list[dict]:
        """Train to ``rl.steps`` (resuming from the latest checkpoint); returns per-step metrics.

        Args:
          on_step: optional callback (step, metrics) after each step.
          stop_after: stop (after saving) once this many steps are done in total (tests).
        """
        start = self.restore()
        end = self.rl.steps if stop_after is None else min(self.rl.steps, stop_after)
        writer = MetricsWriter(
            self.workdir, tensorboard=self.tensorboard, resume_step=start if start > 0 else None
        )
        bar = ProgressBar(self.rl.steps, initial=start, disable=not self.progress)
        rows = []
        try:
            for rl_step in range(start, end):
                t_start = time.perf_counter()
                batch, info = self.collect()
                t_update = time.perf_counter()
                metrics = self.update(batch, rl_step)
                update_s = time.perf_counter() - t_update
                step_s = time.perf_counter() - t_start
                b = self.budget
                b.generated_tokens += info["generated_tokens"]
                b.trained_tokens += metrics["trained_tokens"]
                b.sample_s += info["time_sample_s"]
                b.verify_s += info["time_verify_s"]
                b.logprob_s += info["time_logprob_s"]
                b.update_s += update_s
                b.total_s += step_s
                b.verifier_errors += info["verifier_errors"]
                b.verifier_timeouts += info["verifier_timeouts"]
                row = {
                    **info,
                    **metrics,
                    "time_update_s": update_s,
                    "time_step_s": step_s,
                    **{f"budget/{k}": v for k, v in dataclasses.asdict(b).items()},
                }
                if self.tracker is not None:
                    row.update(
                        {
                            (k if k.startswith("tracker/") else f"tracker/{k}"): v
                            for k, v in self.tracker.summary().items()
                            if isinstance(v, (int, float))
                        }
                    )
                scalars = writer.write(rl_step + 1, row)
                rows.append({"step": rl_step + 1, **scalars})
                bar.update(scalars)
                done = rl_step + 1
                if (
                    self.rl.checkpoint_every and done % self.rl.checkpoint_every == 0
                ) or done == end:
                    self.save(done)
                if on_step is not None:
                    on_step(done, scalars)
        finally:
            bar.close()
            writer.close()
        return rows

    def close(self) -> None:
        self.checkpointer.close()
        close = getattr(self, "_close_scorer", None)
        if close is not None:
            close()
