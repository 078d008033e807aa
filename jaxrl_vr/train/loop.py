"""The RL driver: every step, the same calls over the parts of ``train.parts.build_parts``.

    hooks.begin_step → strategy(sample_round, next_prompts) → hooks.observe(every sample)
    → hooks.annotate(batch) → build (advantages, log-probs) → update → metrics
    → [periodic evaluation, on its steps] → checkpoints → hooks.after_step

The driver holds the loop state (train state, PRNG key, estimator state) and the budget;
the host state of the prompt source and of every hook with a ``state_key`` is saved beside
it, so resume is exact. It never branches on a method, estimator or strategy.
"""

from __future__ import annotations

import time
from typing import Callable, NamedTuple

import jax
from flax import nnx

from jaxrl_vr.host_memory import release_free_heap
from jaxrl_vr.train.budget import Budget
from jaxrl_vr.train.metrics import MetricsWriter, ProgressBar, rollout_metrics
from jaxrl_vr.train.parts import Parts
from jaxrl_vr.train.saving import RunInterrupted, catch_signals, restore_signals
from jaxrl_vr.train.update import LoopState
from jaxrl_vr.trajectory import Trajectory

__all__ = ["Collected", "PeriodicEval", "RLTrainer", "RunInterrupted"]


class PeriodicEval(NamedTuple):
    """``evaluate(step, model) -> metrics`` of the policy after every ``every``-th RL step.

    Due by step number, so a resumed run keeps the schedule: the steps it replays after its
    checkpoint are evaluated again (with the same samples when ``evaluate`` keys them by the
    step), the steps before are not. Its samples are not charged to the budget.
    """

    every: int
    evaluate: Callable[[int, nnx.Module], dict]

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0


class Collected(NamedTuple):
    """A step's built batch, every sample it generated, and the seconds the builder took."""

    batch: Trajectory
    sampled: Trajectory
    logprob_s: float


class RLTrainer:
    """RL on the policy of ``parts`` (module docstring); ``calibration_tokens`` were spent on
    calibration passes before RL (charged to the budget when ``rl.budget`` says so);
    ``periodic_eval`` adds its metrics to the rows of the steps it is due at."""

    def __init__(self, parts: Parts, *, calibration_tokens: float = 0.0,
                 log: Callable[[str], None] = print, periodic_eval: PeriodicEval | None = None):
        self.parts, self.state, self.log = parts, parts.initial_state, log
        self.budget = Budget(calibration_tokens=float(calibration_tokens))
        self._released_after_first_rollout = False
        self.periodic_eval = periodic_eval

    def model(self):
        """The current policy as an nnx Module."""
        return nnx.merge(self.parts.graphdef, self.state.train.params, self.parts.rest)

    def snapshot(self, step: int) -> tuple[dict, dict]:
        """(loop state, host state) to checkpoint after ``step`` steps."""
        p = self.parts
        host = {"rl_step": step, "source": p.source.state_dict(), "budget": self.budget.as_dict()}
        for hook in p.hooks:
            state = hook.state_dict() if hook.state_key else None
            if state is not None:
                host[hook.state_key] = state
        return self.state._asdict(), host

    def restore(self) -> int:
        """Loads the newest intact checkpoint if any; returns the step to continue from."""
        p = self.parts
        restored = p.checkpoints.restore(self.state._asdict())
        if restored is None:
            return 0
        state, host, step = restored
        self.state = LoopState(**state)
        p.source.load_state_dict(host["source"])
        # Calibration is measured before RL, each run: keep this run's value.
        self.budget = Budget.from_dict({**host["budget"], "calibration_tokens": self.budget.calibration_tokens})
        for hook in p.hooks:
            if hook.state_key in host:
                hook.load_state_dict(host[hook.state_key])
        return step

    def collect(self, step: int) -> Collected:
        """The step's built batch: sample it, let the hooks observe and annotate it, fill its
        advantages and log-probs. Advances the PRNG key and the estimator state."""
        p = self.parts
        p.source.begin_step(step)
        for hook in p.hooks:
            hook.begin_step(step)
        key, sample_key = jax.random.split(jax.random.wrap_key_data(self.state.key))
        rounds = p.sampler.for_step(self.model(), sample_key)
        batch = p.strategy(rounds.sample_round, p.source.next_prompts)
        sampled = rounds.sampled()
        for hook in p.hooks:
            hook.observe(sampled)
        for hook in p.hooks:
            batch = hook.annotate(batch)
        t_build = time.perf_counter()
        batch, estimator_state = p.build(batch, self.state.estimator, self.state.train.params)
        self.state = self.state._replace(key=jax.random.key_data(key), estimator=estimator_state)
        return Collected(batch, sampled, time.perf_counter() - t_build)

    def step(self, step: int) -> dict:
        """One RL step; returns its metrics row."""
        p, t_start = self.parts, time.perf_counter()
        batch, sampled, logprob_s = self.collect(step)
        if not self._released_after_first_rollout:
            # The first rollout compiles (or loads) the sampler; what that freed is not what
            # the update allocates, so hand it back once rather than keep it beside the update
            # (-0.4 to -0.9 GB of peak RSS on SmolLM2-135M; later steps keep their memory).
            release_free_heap()
            self._released_after_first_rollout = True
        t_update = time.perf_counter()
        train, update_metrics = p.update(self.state.train, batch, step)
        t_end = time.perf_counter()
        self.state = self.state._replace(train=train)
        self.budget.add(sampled.stats, trained_tokens=update_metrics["trained_tokens"],
                        logprob_s=logprob_s, update_s=t_end - t_update, total_s=t_end - t_start)
        row = rollout_metrics(batch, sampled, success_threshold=p.cfg.rl.success_threshold,
                              logprob_gap=not p.cfg.loss.detach_behaviour)
        for hook in p.hooks:
            row.update(hook.metrics(batch))
        row.update({f"estimator/{k}": v for k, v in p.estimator.diagnostics(self.state.estimator).items()})
        return {**row, **update_metrics, "time_logprob_s": logprob_s, "time_update_s": t_end - t_update,
                "time_step_s": t_end - t_start, **{f"budget/{k}": v for k, v in self.budget.as_dict().items()}}

    def budget_spent(self) -> bool:
        return self.budget.spent(self.parts.cfg.rl.budget)

    def run(self, *, on_step: Callable[[int, dict], None] | None = None,
            stop_after: int | None = None) -> list[dict]:
        """Trains to ``rl.steps`` or the budget, resuming from the latest checkpoint.

        SIGINT / SIGTERM let the current step finish, checkpoint it and raise
        ``RunInterrupted``; a second signal aborts at once.

        Args:
          on_step: optional callback (step, metrics) after each step.
          stop_after: stop (after saving) once this many steps are done in total (tests).
        """
        p = self.parts
        start = self.restore()
        end = p.cfg.rl.steps if stop_after is None else min(p.cfg.rl.steps, stop_after)
        if start > 0:
            self.log(f"[rl] resuming after step {start} of {p.cfg.rl.steps} from "
                     f"{p.checkpoints.directory}")
        writer = MetricsWriter(p.workdir, tensorboard=p.cfg.run.tensorboard,
                               resume_step=start if start > 0 else None)
        budget = p.cfg.rl.budget
        bar = ProgressBar(p.cfg.rl.steps, initial=start, disable=not p.cfg.run.progress,
                          budget_tokens=budget.tokens, budget_initial=self.budget.charged(budget.include_calibration))
        rows, stop = [], []
        handlers = catch_signals(stop)
        try:
            for step in range(start, end):
                if self.budget_spent():
                    break
                row, done = self.step(step), step + 1
                if self.periodic_eval is not None and self.periodic_eval.due(done):
                    row.update(self.periodic_eval.evaluate(done, self.model()))
                scalars = writer.write(done, row)
                rows.append({"step": done, **scalars})
                bar.update(scalars, keys=("reward", "pass_rate", "kl") + (
                    ("verifier_errors",) if scalars.get("verifier_errors") else ()),
                    charged=self.budget.charged(budget.include_calibration))
                p.checkpoints.after_step(done, final=done == end or self.budget_spent() or bool(stop),
                                         snapshot=lambda: self.snapshot(done), spent=self.budget)
                if on_step is not None:
                    on_step(done, scalars)
                for hook in p.hooks:
                    hook.after_step(done)
                if stop:
                    raise RunInterrupted(
                        f"interrupted by {stop[0]} after step {done}; it is checkpointed in "
                        f"{p.checkpoints.directory}. Re-run the same command to resume.")
        finally:
            restore_signals(handlers)
            bar.close()
            writer.close()
        return rows

    def close(self) -> None:
        self.parts.close()

