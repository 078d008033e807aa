"""Run metrics: JSON lines + TensorBoard events in the workdir, and a progress bar.

``MetricsWriter.write(step, metrics)`` appends one JSON object per step to
``<workdir>/metrics.jsonl`` (opened in append mode, so a resumed run continues the same
file; rows after the resume step are dropped first so the file never holds a step
twice) and the scalars to TensorBoard (tensorboardX) under ``<workdir>/tb``, with the
``jaxrl_vr.diagnostics.Histogram`` entries as TensorBoard histograms.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any, Mapping

import numpy as np

from jaxrl_vr import layout
from jaxrl_vr.credit import signal_stats
from jaxrl_vr.diagnostics import Histogram, one_positive_frac, prompt_weights, success_bins, weight_stats
from jaxrl_vr.envs.signals import SIGNALS
from jaxrl_vr.trajectory import Trajectory


def to_scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Python floats of every scalar entry (arrays of size 1, numpy/jax scalars, numbers);
    ``Histogram`` entries are left out."""
    out = {}
    for name, value in metrics.items():
        if isinstance(value, Histogram):
            continue
        if isinstance(value, (bool, int, float, np.number, np.bool_)):
            out[name] = float(value)
            continue
        arr = np.asarray(value)
        if arr.size == 1 and arr.dtype.kind in "biuf":
            out[name] = float(arr.reshape(()))
    return out


def _json_value(value: float):
    return value if math.isfinite(value) else str(value)  # NaN/inf as strings: valid JSON


class MetricsWriter:
    """JSONL + TensorBoard writer.

    Args:
      workdir: run directory.
      tensorboard: also write TensorBoard events (tensorboardX) to ``workdir/tb``.
      resume_step: if given, rows with ``step > resume_step`` are dropped from an existing
        metrics.jsonl (they belong to the part of a run that the resume replays).
    """

    def __init__(
        self,
        workdir: str,
        *,
        tensorboard: bool = True,
        resume_step: int | None = None,
        filename: str = layout.METRICS,
    ):
        os.makedirs(workdir, exist_ok=True)
        self.path = os.path.join(workdir, filename)
        if resume_step is not None and os.path.exists(self.path):
            with open(self.path) as f:
                rows = [line for line in f if line.strip()]
            keep = [line for line in rows if json.loads(line).get("step", 0) <= resume_step]
            with open(self.path, "w") as f:
                f.writelines(keep)
        elif resume_step is None and os.path.exists(self.path):
            os.remove(self.path)
        self._file = open(self.path, "a")
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter  # imported only when a run writes events

            self._tb = SummaryWriter(os.path.join(workdir, layout.TENSORBOARD))

    def write(self, step: int, metrics: Mapping[str, Any]) -> dict[str, float]:
        scalars = to_scalars(metrics)
        row = {"step": int(step), **{k: _json_value(v) for k, v in scalars.items()}}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._tb is not None:
            for name, value in scalars.items():
                if math.isfinite(value):
                    self._tb.add_scalar(name, value, int(step))
            for name, value in metrics.items():
                values = np.asarray(value.values, np.float64) if isinstance(value, Histogram) else None
                if values is not None and values.size and np.isfinite(values).all():
                    self._tb.add_histogram(name, values, int(step))
            self._tb.flush()
        return scalars

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def read_jsonl(path: str) -> list[dict]:
    """All rows of a metrics.jsonl file."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _duration(seconds: float) -> str:
    """Seconds as "1h02m03s" / "2m03s" / "3s"."""
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(max(seconds, 0.0)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class ProgressBar:
    """Progress with rates (steps/s, generated tokens/s) and ETA.

    On a terminal this is a tqdm bar. When the stream is not a TTY (a log file, a pipe, a
    batch scheduler) it prints one plain line instead, every ``every_steps`` steps or
    ``every_s`` seconds, whichever comes first, and always for the last step, e.g.::

        rl step 120/1000 (12%) | 0.85 step/s | ETA 17m15s | elapsed 2m21s | reward 0.412 kl 0.001 tok/s 1234

    A run that stops at a token budget before ``total`` steps says so: given ``budget_tokens``
    and each step's charged tokens, the total becomes the step at which the budget runs out
    at the rate so far (never more than ``total``), marked "~", with the budget's share spent::

        rl step 6/~24 (25%) | 0.054 step/s | ETA 5m32s | elapsed 1m50s | budget 25% reward 0.266

    Args:
      total: number of steps; initial: steps already done (resume).
      budget_tokens: the run's token budget (0 = none); budget_initial: tokens charged
        before the first step here (resume, or a charged calibration).
      desc: label. unit: what a step is called ("chunk" for evaluation). disable: no output.
      file: the stream (default sys.stderr).
      every_steps, every_s: plain-line interval (non-TTY only).
      tty: force the TTY (True) or plain (False) mode; None = ask the stream.
      clock: seconds as a float (monotonic), injectable for tests.
    """

    def __init__(
        self,
        total: int,
        *,
        initial: int = 0,
        desc: str = "rl",
        unit: str = "step",
        disable: bool = False,
        file=None,
        every_steps: int = 10,
        every_s: float = 30.0,
        tty: bool | None = None,
        clock=time.monotonic,
        budget_tokens: float = 0.0,
        budget_initial: float = 0.0,
    ):
        if every_steps < 1 or every_s <= 0:
            raise ValueError(f"every_steps ({every_steps}) must be >= 1 and every_s ({every_s}) > 0.")
        self._file = sys.stderr if file is None else file
        self._disable = disable
        self._plain = not disable and not (_isatty(self._file) if tty is None else tty)
        self._total, self._initial, self._desc, self._unit = int(total), int(initial), desc, unit
        self._steps = self._total  # the configured number of steps (the total, unless a budget ends first)
        self._budget, self._charged0 = float(budget_tokens), float(budget_initial)
        self._charged = self._charged0
        self._every_steps, self._every_s = int(every_steps), float(every_s)
        self._clock = clock
        self._start = clock()
        self._done = self._initial
        self._tokens = 0.0
        self._post: dict[str, str] = {}
        self._printed_step, self._printed_at = self._initial, self._start
        self._closed = False
        self._bar = None
        if not self._plain:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total,
                initial=initial,
                desc=desc,
                disable=disable,
                dynamic_ncols=True,
                file=self._file,
                unit=unit,
            )

    def update(self, scalars: Mapping[str, float], *, keys=("reward", "pass_rate", "kl"),
               charged: float | None = None) -> None:
        """One step done; ``charged``: tokens charged to the budget so far (with ``budget_tokens``)."""
        self._tokens += scalars.get("generated_tokens", 0.0)
        self._done += 1
        now = self._clock()
        elapsed = max(now - self._start, 1e-9)
        post = {}
        if self._budget > 0 and charged is not None:
            self._charged = float(charged)
            self._total = self._budget_total()
            post["budget"] = f"{min(self._charged / self._budget, 1.0):.0%}"
        post.update({k: f"{scalars[k]:.3f}" for k in keys if k in scalars})
        if self._tokens:  # evaluation chunks report no tokens
            post["tok/s"] = f"{self._tokens / elapsed:.0f}"
        self._post = post
        if self._bar is not None:
            self._bar.total = self._total
            self._bar.set_postfix(post, refresh=False)
            self._bar.update(1)
        elif self._plain and (
            self._done - self._printed_step >= self._every_steps
            or now - self._printed_at >= self._every_s
            or self._done >= self._total
        ):
            self._print_line(now)

    def _budget_total(self) -> int:
        """The step at which the budget runs out at this run's tokens per step (<= the steps)."""
        steps, spent = self._done - self._initial, self._charged - self._charged0
        if self._charged >= self._budget:
            return self._done
        if steps <= 0 or spent <= 0:
            return self._steps
        return min(self._steps, self._done + math.ceil((self._budget - self._charged) * steps / spent))

    def line(self, now: float | None = None) -> str:
        """The plain progress line for the steps done so far."""
        now = self._clock() if now is None else now
        elapsed = max(now - self._start, 1e-9)
        rate = (self._done - self._initial) / elapsed
        remaining = max(self._total - self._done, 0)
        eta = remaining / rate if rate > 0 else (0.0 if remaining == 0 else math.inf)
        percent = 100.0 * self._done / self._total if self._total else 100.0
        post = " ".join(f"{k} {v}" for k, v in self._post.items())
        total = f"~{self._total}" if self._total != self._steps else f"{self._total}"
        return (
            f"{self._desc} {self._unit} {self._done}/{total} ({percent:.0f}%) | "
            f"{rate:.3g} {self._unit}/s | "
            f"ETA {_duration(eta)} | elapsed {_duration(elapsed)}" + (f" | {post}" if post else "")
        )

    def _print_line(self, now: float) -> None:
        print(self.line(now), file=self._file, flush=True)
        self._printed_step, self._printed_at = self._done, now

    def close(self) -> None:
        """Ends the bar; in plain mode prints the last step if it was not printed yet."""
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        elif self._plain and self._done > self._printed_step:
            self._print_line(self._clock())


# ------------------------------------------------------------------------- rollout metrics


def masked_stats(values: np.ndarray, mask: np.ndarray, prefix: str) -> dict[str, float]:
    """``{prefix}_mean``, ``_std`` and ``_abs_max`` over the masked entries (0 when empty)."""
    vals = np.asarray(values)[np.asarray(mask, bool)]
    if vals.size == 0:
        return {f"{prefix}_mean": 0.0, f"{prefix}_std": 0.0, f"{prefix}_abs_max": 0.0}
    return {
        f"{prefix}_mean": float(vals.mean()),
        f"{prefix}_std": float(vals.std()),
        f"{prefix}_abs_max": float(np.abs(vals).max()),
    }


def _mean(values) -> float:
    return float(np.mean(values)) if np.size(values) else 0.0


def rollout_metrics(batch: Trajectory, sampled: Trajectory, *, success_threshold: float = 0.5,
                    logprob_gap: bool = True) -> dict[str, float]:
    """Scalars of one RL step's samples (host numpy), over valid samples only.

    Args:
      batch: the built training batch (advantages and behaviour log-probs set).
      sampled: every sample the step generated (filtered groups and probes too).
      success_threshold: a verifier score >= this is a success.
      logprob_gap: compare the sampler's log-probs with the trainer's behaviour log-probs
        (False when the trainer did not recompute them).

    Returns:
      ``reward`` and ``pass_rate`` over every sampled group (``kept/...``: the batch's), the
      reward terms and hack-detector rates per generated sample, group fractions, length,
      truncation, the sampler/trainer log-prob gap, advantage statistics, the cost of the
      step (tokens, samples, seconds, verifier statuses) and the strategy's own record; for
      environment episodes, per intermediate signal ``credit/<signal>/mean`` (over the turns
      where it applies) and ``credit/<signal>/corr_verdict`` (Pearson's r with success over
      the episodes that have it; NaN when undefined); the batch's prompt weights
      (``prompt_weights/ess``, ``ess_frac``, ``max_over_mean``, ``prompts``), its prompts'
      success in fixed bins (``prompt_dist/observed/<bin>``, and a ``Histogram``) and
      ``one_positive_frac`` (``jaxrl_vr.diagnostics``).
    """
    valid_pg = np.asarray(batch.valid_pg, bool)
    valid_b = valid_pg.reshape(-1)
    rewards_pg = batch.per_group(batch.rewards_b)
    success_pg = batch.per_group(batch.scores_b) >= success_threshold
    group_ok = valid_pg.any(axis=1)
    spread_p = (np.where(valid_pg, rewards_pg, -np.inf).max(1)
                - np.where(valid_pg, rewards_pg, np.inf).min(1))
    informative = group_ok & (np.where(group_ok, spread_p, 0.0) > 0)
    sampled_b = sampled.valid_b
    stats = sampled.stats
    samples = max(stats.generated_samples, 1.0)
    out = {
        "reward": _mean(sampled.rewards_b[sampled_b]),
        "pass_rate": _mean(sampled.scores_b[sampled_b] >= success_threshold),
        "kept/reward": _mean(rewards_pg[valid_pg]),
        "kept/pass_rate": _mean(success_pg[valid_pg]),
        "score": _mean(batch.scores_b[valid_b]),
        "valid_group_frac": float(informative.mean()),
        "all_correct_frac": float(((success_pg | ~valid_pg).all(1) & group_ok).mean()),
        "all_wrong_frac": float(((~success_pg | ~valid_pg).all(1) & group_ok).mean()),
        "response_length": _mean(batch.length_b[valid_b]),
        "truncation_rate": _mean(batch.truncated_b[valid_b]),
        "valid_sample_frac": float(valid_b.mean()),
        "reward_terms/verifier": float(np.sum(sampled.scores_b[sampled_b])) / samples,
        "reward_terms/overlong": float(np.sum(sampled.overlong_b[sampled_b])) / samples,
        "reward_terms/hack": float(np.sum(sampled.hack_b[sampled_b])) / samples,
        "generated_tokens": stats.generated_tokens,
        "generated_samples": stats.generated_samples,
        "sample_rounds": stats.rounds,
        "time_sample_s": stats.sample_s,
        "time_verify_s": stats.verify_s,
        "verifier_errors": stats.verifier_errors,
        "verifier_timeouts": stats.verifier_timeouts,
        "verifier_unparsable": stats.verifier_unparsable,
        **{f"hack/{name}": count / samples for name, count in stats.detector_counts},
    }
    if stats.tool_calls or stats.env_tokens or stats.turns > stats.generated_samples:
        calls = max(stats.tool_calls, 1.0)
        out.update({
            "env/turns_per_episode": stats.turns / samples,
            "env/tokens": stats.env_tokens,
            "env/tool_calls_per_episode": stats.tool_calls / samples,
            "env/tool_call_valid_rate": stats.tool_calls_valid / calls,
            "env/tool_call_ok_rate": stats.tool_calls_ok / calls,
            "env/errors": stats.env_errors,
        })
    if stats.tested_samples:  # code tasks: mean fraction of unit tests passed per tested sample
        out["test_pass_frac"] = stats.test_frac_sum / stats.tested_samples
    if sampled.signals_bkn is not None:
        mean_n, corr_n = signal_stats(sampled.signals_bkn, sampled.scores_b >= success_threshold, sampled_b)
        for name, mean, corr in zip(SIGNALS, mean_n, corr_n):
            out[f"credit/{name}/mean"], out[f"credit/{name}/corr_verdict"] = float(mean), float(corr)
    if batch.stats.strategy is not None:
        out.update(batch.stats.strategy.metrics())
    loss_mask_bt = np.asarray(batch.loss_mask_bt, bool)
    if logprob_gap:
        gap_bt = np.asarray(batch.sampler_logp_bt) - np.asarray(batch.behaviour_logp_bt)
        out["logp_gap_sampler_trainer"] = _mean(gap_bt[loss_mask_bt])
        out["logp_gap_abs_max"] = float(np.abs(gap_bt[loss_mask_bt]).max()) if loss_mask_bt.any() else 0.0
    tokens_b = np.maximum(loss_mask_bt.sum(axis=1), 1)
    adv_b = np.where(loss_mask_bt, np.asarray(batch.adv_bt), 0.0).sum(axis=1) / tokens_b
    out.update(masked_stats(adv_b, valid_b, "adv"))
    # What reached the update (jaxrl_vr.diagnostics): prompt weights, success bins, one-positive groups.
    out.update(weight_stats(*prompt_weights(batch.per_group(adv_b), rewards_pg, valid_pg)))
    rate_p = np.where(valid_pg, success_pg, False).sum(axis=1) / np.maximum(valid_pg.sum(axis=1), 1)
    out.update(success_bins(rate_p, group_ok, "prompt_dist/observed"))
    out["one_positive_frac"] = one_positive_frac(success_pg, valid_pg)
    return out
