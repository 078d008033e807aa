"""The RL driver: prompt source → batch strategy → batch builder → update → metrics → checkpoint.

Each phase is a part with a typed input and output, built once in ``RLTrainer.__init__``:

* prompt source (``jaxrl_vr.train.prompts``): which prompts, with checkpointable state;
* batch strategy ``strategy(sample_round, next_prompts) -> Round`` (``rounds.plain_batch``,
  ``selection.dynamic.dynamic_batch``, ``selection.two_stage.two_stage_batch``);
* round sampler ``sample_round(prompt_idx, G) -> Round`` (sampler + verifiers + rewards);
* batch builder (``jaxrl_vr.train.batch.build_batch``) with an estimator from
  ``jaxrl_vr.estimators`` (an ``(init, update)`` pair; its state is in the loop state);
* jitted train step (``jaxrl_vr.train.step``), run num_epochs × num_minibatches times.

The driver holds one loop state pytree (train state, PRNG key, estimator state) plus host
state (prompt source, tracker, budget), all checkpointed, so resume is exact. The tracker
sees every sample of the current policy once per RL step.
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

from jaxrl_vr.train import rounds as rounds_lib
from jaxrl_vr.train import step as step_lib
from jaxrl_vr.train.assembly import (Budget, LoopState, _build_fns, _compiled_fns, catch_signals,
                                     charged_tokens,
                                     initial_loop_state, make_batch_strategy, make_prompt_source,
                                     make_rl_estimator, restore_signals)
from jaxrl_vr.train.batch import build_batch
from jaxrl_vr.train.checkpoint import Checkpointer
from jaxrl_vr.train.config import RLConfig
from jaxrl_vr.train.metrics import MetricsWriter, ProgressBar, rollout_metrics
from jaxrl_vr.train.optim import OptimConfig, make_optimizer
from jaxrl_vr.train.prompts import PairedSource
from jaxrl_vr.train.update import NonFiniteLossError, update_on_batch
from jaxrl_vr.train.workdir import BUDGET_CHECKPOINTS, BUDGET_MARKS, read_budget_marks, write_json
from jaxrl_vr.train.rollout import encode_prompts, make_reward_shaper, make_round_scorer, make_scorer
from jaxrl_vr.verifiers.pool import ErrorLog, ErrorStop

__all__ = ["Budget", "LoopState", "NonFiniteLossError", "RLTrainer", "RunInterrupted",
           "VerifierFailure", "initial_loop_state", "make_batch_strategy"]


class RunInterrupted(KeyboardInterrupt):
    """SIGINT/SIGTERM: the last complete step was checkpointed; re-run to resume."""


class VerifierFailure(RuntimeError):
    """Too many verifier errors for too many steps in a row (the verifier is broken)."""


class RLTrainer:
    """RL on a policy, driven by the parts described in the module docstring.

    Args:
      model: the policy (a jaxrl_vr Decoder); its params are the initial policy.
      tokenizer: Tokenizer protocol object (encode/decode/bos_id/eos_id/pad_id).
      items: training TaskItems.
      rl, loss, optim: RLConfig, LossConfig, OptimConfig.
      workdir: where metrics.jsonl, tb/ and checkpoints/ go.
      reference_params: frozen π_ref params (default: a copy of the initial params).
      chat, system_prompt: prompt format (``rollout.render_prompt_text``).
      tracker: optional PromptTracker over ``items`` (updated once per step, checkpointed;
        PBA reads its frozen base rates, pairing its success rates).
      progress, tensorboard: progress bar, TensorBoard events.
      scorer: optional ``score(items, completions) -> VerifyResult`` replacing the pool.
      mesh: optional ``jax.sharding.Mesh``: params and optimizer state are sharded over its
        ``fsdp`` (and ``tensor``) axes by ``jaxrl_vr.parallel``'s rules, minibatches over
        ``data`` × ``fsdp``.
    """

    def __init__(self, model, tokenizer, items: Sequence[Any], *, rl: RLConfig,
                 loss: step_lib.LossConfig, optim: OptimConfig, workdir: str,
                 reference_params=None, chat: bool = False, system_prompt: str | None = None,
                 tracker=None, progress: bool = True,
                 tensorboard: bool = True, scorer: Callable | None = None, mesh=None,
                 calibration_tokens: float = 0.0):
        if len(items) < rl.prompts_per_step:
            raise ValueError(f"rl.prompts_per_step={rl.prompts_per_step} exceeds the {len(items)} "
                             "training items.")
        if (rl.pairing or rl.anchor != "none") and tracker is None:
            raise ValueError("rl.pairing and rl.anchor read per-prompt rates from a PromptTracker "
                             "(tracker=...).")
        self.rl, self.loss_cfg, self.items = rl, loss, list(items)
        self.workdir, self.tracker, self.mesh = os.path.abspath(workdir), tracker, mesh
        self.progress, self.tensorboard = progress, tensorboard
        self.graphdef, params, self.rest = step_lib.split_model(model)
        self.reference_params = (jax.tree.map(jnp.copy, params) if reference_params is None
                                 else reference_params)
        self.kl_in_loss = loss.kl_beta > 0 or rl.anchor != "none"
        state_sharding = None
        if mesh is not None:
            from jaxrl_vr import parallel

            state_sharding = parallel.train_state_shardings(
                step_lib.init_train_state(params, make_optimizer(optim), loss), mesh)
        build = _compiled_fns if state_sharding is None else _build_fns
        structure = loss.structure(kl_term=self.kl_in_loss)
        if rl.num_minibatches == 1:
            # The update's rows are the round's [P, G] prompt-major rows in order, so each
            # prompt's prefix runs once per group (same loss and gradient, less work).
            structure = dataclasses.replace(structure, prompt_group_size=rl.batch_group_size)
        self.loss_structure = structure
        jitted_step, self.logprob_fn = build(
            self.graphdef, optim, structure,
            loss.num_microbatches * rl.num_minibatches, state_sharding,
            logprob_group_size=rl.batch_group_size)  # build_batch's rows: [P, G] prompt-major
        self.train_step = lambda state, batch: jitted_step(state, batch, self.hyper, self.rest)
        self.hyper = loss.hyper(temperature=rl.temperature)
        self.estimator = make_rl_estimator(rl)
        self.state = initial_loop_state(params, rl=rl, loss=loss, optim=optim,
                                        state_sharding=state_sharding)
        # Prompts are tokenized once; a round gathers its rows.
        self.prompt_tokens_ns, self.prompt_mask_ns = encode_prompts(
            tokenizer, [it.prompt for it in self.items], chat=chat, system_prompt=system_prompt)
        self.recheck = None
        if rl.dynamic_recheck_interval:
            from jaxrl_vr.selection.dynamic import RecheckSchedule

            self.recheck = RecheckSchedule(len(self.items), interval=rl.dynamic_recheck_interval)
        self.source = make_prompt_source(rl, len(self.items), tracker=tracker, recheck=self.recheck)
        self.strategy = make_batch_strategy(rl, recheck=self.recheck)
        self._scorer, self._close_scorer = ((scorer, lambda: None) if scorer is not None
                                            else make_scorer(rl.verifier_workers, rl.verifier_timeout_s))
        self._observed: list[rounds_lib.Round] = []
        self.sample_round = rounds_lib.make_sample_round(
            generate=functools.partial(self._generate, tokenizer),
            encode=lambda idx: (self.prompt_tokens_ns[idx], self.prompt_mask_ns[idx]),
            score=make_round_scorer(self.items, tokenizer, self._scorer,
                                    hack_detectors=rl.hack_detector_names if rl.hack_coef else (),
                                    on_result=self._record_errors),
            shape_rewards=make_reward_shaper(max_len=rl.max_new_tokens,
                                             overlong_cache_len=rl.overlong_cache_len,
                                             overlong_coef=rl.overlong_coef, hack_coef=rl.hack_coef),
            min_prompts=rl.prompts_per_step, observe=self._observed.append)
        self.budget = Budget(calibration_tokens=float(calibration_tokens))
        self.checkpointer = Checkpointer(os.path.join(self.workdir, "checkpoints"),
                                         max_to_keep=rl.max_to_keep)
        self.budget_checkpointer = (Checkpointer(os.path.join(self.workdir, BUDGET_CHECKPOINTS),
                                                 max_to_keep=None)
                                    if rl.budget_fractions else None)
        self.budget_marks = read_budget_marks(self.workdir)
        errors_path = os.path.join(self.workdir, "verifier_errors.jsonl")
        self.error_stop = ErrorStop(rl.verifier_error_fraction, rl.verifier_error_patience,
                                    path=errors_path)
        self._errors_path, self.error_log, self._step = errors_path, None, 0

    def _record_errors(self, items, completions, result) -> None:
        if self.error_log is not None:
            self.error_log.record(self._step, items, completions, result)

    # ---- state -----------------------------------------------------------------------------

    def params(self):
        return self.state.train.params

    def model(self):
        """The current policy as an nnx Module."""
        return nnx.merge(self.graphdef, self.params(), self.rest)

    def _host_state(self, rl_step: int) -> dict:
        host = {"rl_step": rl_step, "source": self.source.state_dict(),
                "budget": dataclasses.asdict(self.budget)}
        if self.tracker is not None:
            host["tracker"] = self.tracker.state_dict()
        if self.recheck is not None:
            host["recheck"] = self.recheck.state_dict()
        return host

    def save(self, rl_step: int) -> None:
        self.checkpointer.save(rl_step, self.state._asdict(), self._host_state(rl_step))

    def save_budget_fractions(self, rl_step: int) -> list[float]:
        """Keeps the state for every ``rl.budget_fractions`` entry the budget has just crossed.

        The first step whose cumulative generated tokens reach f · token_budget is saved
        in ``budget_checkpoints/`` (never rotated) and recorded in
        ``budget_checkpoints.json`` as {"fraction", "step", "token_budget", "generated_tokens"}.
        Returns the fractions saved now.
        """
        if self.budget_checkpointer is None:
            return []
        taken = {m["fraction"] for m in self.budget_marks}
        spent = self.spent_tokens()
        new = [f for f in self.rl.budget_fractions
               if f not in taken and spent >= f * self.rl.token_budget]
        if not new:
            return []
        if rl_step not in self.budget_checkpointer.all_steps():
            self.budget_checkpointer.save(rl_step, self.state._asdict(), self._host_state(rl_step))
        self.budget_marks = sorted(
            self.budget_marks + [{"fraction": f, "step": rl_step, "token_budget": int(self.rl.token_budget),
                                  "generated_tokens": float(spent)} for f in new],
            key=lambda m: m["fraction"])
        write_json(os.path.join(self.workdir, BUDGET_MARKS), {"marks": self.budget_marks})
        return new

    def restore(self) -> int:
        """Loads the newest intact checkpoint if any; returns the RL step to continue from.

        A damaged newest step is moved aside (``Checkpointer.restore_latest_intact``) and the
        run resumes from the step before it, with a warning.
        """
        restored = self.checkpointer.restore_latest_intact(self.state._asdict())
        if restored is None:
            return 0
        state, host, step = restored
        self.state = LoopState(**state)
        self.source.load_state_dict(host["source"])
        # Calibration is measured before RL, each run: keep this run's value.
        self.budget = Budget(**{**host["budget"], "calibration_tokens": self.budget.calibration_tokens})
        if self.tracker is not None and "tracker" in host:
            self.tracker.load_state_dict(host["tracker"])
        if self.recheck is not None and "recheck" in host:
            self.recheck.load_state_dict(host["recheck"])
        return step

    # ---- one step --------------------------------------------------------------------------

    def _next_key(self):
        key, sub = jax.random.split(jax.random.wrap_key_data(self.state.key))
        self.state = self.state._replace(key=jax.random.key_data(key))
        return sub

    def _generate(self, tokenizer, prompt_tokens_ps, prompt_mask_ps, num_samples):
        from jaxrl_vr.sampling import generate

        rl = self.rl
        return generate(self._next_key(), self.model(), prompt_tokens_ps, prompt_mask_ps,
                        num_samples=num_samples, max_new_tokens=rl.max_new_tokens,
                        temperature=rl.temperature, top_p=rl.top_p, top_k=rl.top_k,
                        stop_token_ids=(tokenizer.eos_id,), pad_id=tokenizer.pad_id or 0)

    def _logprobs(self, params):
        temperature = self.hyper.temperature
        return lambda *inputs: self.logprob_fn(params, self.rest, *inputs, temperature)[0]

    def _kl_weight_p(self, prompt_idx_p):
        rl = self.rl
        if rl.anchor == "none":
            return None
        from jaxrl_vr.selection.anchor import anchor_mask

        anchored_p = np.asarray(anchor_mask(
            self.tracker.p_base(prompt_idx_p), tau_low=rl.anchor_tau_low,
            tau_high=rl.anchor_tau_high, polarity=rl.anchor,
            calibrated_p=self.tracker.has_base(prompt_idx_p)))
        return rl.anchor_weight * anchored_p.astype(np.float32)

    def _track(self, rl_step: int) -> None:
        """One tracker update per RL step with every sample the step generated."""
        rounds, self._observed[:] = list(self._observed), []
        if self.tracker is None:
            return
        if rounds:
            width = max(r.group_size for r in rounds)
            joined = rounds_lib.concat_groups([rounds_lib.widen(r, width) for r in rounds])
            self.tracker.update(joined.prompt_idx_p, joined.scores_b.reshape(joined.valid_pg.shape),
                                joined.valid_pg)
        self.tracker.advance()

    def collect(self, rl_step: int) -> tuple[step_lib.RolloutBatch, dict]:
        """One rollout batch: strategy → tracker → batch builder; returns (batch, metrics)."""
        self._step = rl_step
        self.source.begin_step(rl_step)
        round_ = self.strategy(self.sample_round, self.source.next_prompts, rl_step)
        self._track(rl_step)
        t0 = time.perf_counter()
        reference = (self._logprobs(self.reference_params)
                     if self.kl_in_loss or self.rl.log_reference_kl else None)
        built = build_batch(round_, self.estimator, self.state.estimator,
                            behaviour_logprobs=(None if self.loss_cfg.detach_behaviour
                                                else self._logprobs(self.params())),
                            reference_logprobs=reference,
                            kl_weight_p=self._kl_weight_p(round_.prompt_idx_p),
                            num_pairs=getattr(self.source, "num_pairs", 0))
        self.state = self.state._replace(estimator=built.estimator_state)
        info = rollout_metrics(round_, np.asarray(built.adv_pg),
                               None if self.loss_cfg.detach_behaviour
                               else np.asarray(built.behaviour_logp_bt),
                               success_threshold=self.rl.success_threshold)
        info.update(round_.stats)
        info["time_logprob_s"] = time.perf_counter() - t0
        samples = max(round_.stats.get("generated_samples", 0.0), 1.0)
        for name in [k for k in info if k.startswith(("reward_terms/", "hack/"))]:
            info[name] = info[name] / samples  # per generated sample
        if built.batch.kl_weight_b is not None and self.rl.anchor != "none":
            info["anchored_frac"] = float(np.mean(np.asarray(built.batch.kl_weight_b) > 0))
        if isinstance(self.source, PairedSource):
            info["pairing/pairs"] = float(self.source.num_pairs)
        window = getattr(self.state.estimator, "window_valid_wn", None)
        if window is not None:
            info["curverl_window_fill"] = float(np.asarray(window).mean())
        return built.batch, info

    def update(self, batch: step_lib.RolloutBatch, rl_step: int) -> dict:
        """num_epochs × num_minibatches optimizer steps on one rollout batch; mean metrics."""
        train, metrics = update_on_batch(
            self.train_step, self.state.train, batch, num_epochs=self.rl.num_epochs,
            num_minibatches=self.rl.num_minibatches, seed=self.rl.seed, step=rl_step,
            mesh=self.mesh, nonfinite_dir=self.workdir)
        self.state = self.state._replace(train=train)
        return metrics

    def _check_verifier_errors(self, info: dict) -> None:
        if self.error_stop.update(int(info.get("verifier_errors", 0)),
                                  int(info.get("generated_samples", 0))):
            raise VerifierFailure(self.error_stop.message)

    def _account(self, info: dict, metrics: dict, update_s: float, step_s: float) -> None:
        b = self.budget
        b.generated_tokens += info["generated_tokens"]
        b.generated_samples += info["generated_samples"]
        b.trained_tokens += metrics["trained_tokens"]
        b.sample_s += info["time_sample_s"]
        b.verify_s += info["time_verify_s"]
        b.logprob_s += info["time_logprob_s"]
        b.update_s += update_s
        b.total_s += step_s
        b.verifier_errors += info.get("verifier_errors", 0.0)
        b.verifier_timeouts += info.get("verifier_timeouts", 0.0)

    def spent_tokens(self) -> float:
        """Tokens charged to ``rl.token_budget``: RL rollouts (+ calibration if so configured)."""
        return charged_tokens(dataclasses.asdict(self.budget), self.rl.budget_includes_calibration)

    def budget_spent(self) -> bool:
        return bool(self.rl.token_budget) and self.spent_tokens() >= self.rl.token_budget

    # ---- driver ----------------------------------------------------------------------------

    def run(self, *, on_step: Callable[[int, dict], None] | None = None,
            stop_after: int | None = None) -> list[dict]:
        """Train to ``rl.steps`` or ``rl.token_budget`` (resuming from the latest checkpoint).

        SIGINT / SIGTERM let the current step finish, checkpoint it and raise
        ``RunInterrupted``; a second signal aborts at once.

        Args:
          on_step: optional callback (step, metrics) after each step.
          stop_after: stop (after saving) once this many steps are done in total (tests).
        """
        start = self.restore()
        end = self.rl.steps if stop_after is None else min(self.rl.steps, stop_after)
        self.error_log = ErrorLog(self._errors_path, resume_step=start)
        writer = MetricsWriter(self.workdir, tensorboard=self.tensorboard,
                               resume_step=start if start > 0 else None)
        bar = ProgressBar(self.rl.steps, initial=start, disable=not self.progress)
        rows, stop = [], []
        handlers = catch_signals(stop)
        try:
            for rl_step in range(start, end):
                if self.budget_spent():
                    break
                t_start = time.perf_counter()
                batch, info = self.collect(rl_step)
                t_update = time.perf_counter()
                metrics = self.update(batch, rl_step)
                update_s = time.perf_counter() - t_update
                step_s = time.perf_counter() - t_start
                self._account(info, metrics, update_s, step_s)
                row = {**info, **metrics, "time_update_s": update_s, "time_step_s": step_s,
                       **{f"budget/{k}": v for k, v in dataclasses.asdict(self.budget).items()}}
                if self.tracker is not None:
                    row.update({(k if k.startswith("tracker/") else f"tracker/{k}"): v
                                for k, v in self.tracker.summary().items()
                                if isinstance(v, (int, float))})
                scalars = writer.write(rl_step + 1, row)
                rows.append({"step": rl_step + 1, **scalars})
                bar.update(scalars, keys=("reward", "pass_rate", "kl") + (
                    ("verifier_errors",) if scalars.get("verifier_errors") else ()))
                done = rl_step + 1
                if ((self.rl.checkpoint_every and done % self.rl.checkpoint_every == 0)
                        or done == end or self.budget_spent() or stop):
                    self.save(done)
                self.save_budget_fractions(done)
                if on_step is not None:
                    on_step(done, scalars)
                self._check_verifier_errors(info)
                if stop:
                    raise RunInterrupted(
                        f"interrupted by {stop[0]} after step {done}; it is checkpointed in "
                        f"{self.checkpointer.directory}. Re-run the same command to resume.")
        finally:
            restore_signals(handlers)
            bar.close()
            writer.close()
        return rows

    def close(self) -> None:
        self.checkpointer.close()
        if self.budget_checkpointer is not None:
            self.budget_checkpointer.close()
        self._close_scorer()
