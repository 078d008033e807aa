"""Per-prompt success tracker and frozen-base calibration cache (SPEC §4).

Host-side numpy bookkeeping, never traced. A ``PromptTracker`` holds, for every prompt
of a fixed prompt set (indexed 0..P-1, optionally named by uid):

* training-time sample counts and successes of the *current* policy, with an optional
  recency model: all history (default), exponential decay per training step, or the
  prompt's last ``window`` visits;
* lifetime totals (never decayed) and the step of the last visit;
* current-policy calibration counts: a pass over the whole training pool (n samples per
  prompt) that seeds the pass rates used to choose prompts (positive–negative pairing,
  SPEC §3.3) until training rollouts refresh them (``policy_counts`` / ``policy_rate``);
* a frozen-base calibration cache: n samples per prompt from the initial policy, giving
  ``p_base`` for PBA anchoring (arXiv 2607.20543) and pass@k regimes (SPEC §3.6). It is
  never mixed with training counts; the calibration counts above are (the same data may
  fill both when the calibration pass is run with the initial policy).

Steps: ``tracker.step`` is the current RL step (0 at the start). ``update`` records at
the current step and does not advance it. As a ``jaxrl_vr.hooks.Hook`` the tracker
``observe``s every sample an RL step generated in one update and then advances, so EMA
decay does not depend on how many sampling rounds a step used.

``state_dict()`` returns only numpy arrays (an orbax-friendly pytree) and
``config_dict()`` a JSON-able description; ``load_state_dict`` checks that a checkpoint
belongs to the same prompt set and recency model before touching any state.
"""

from __future__ import annotations

import zlib
from typing import Any, Mapping, Sequence

import numpy as np

from jaxrl_vr.diagnostics import success_bins
from jaxrl_vr.hooks import Hook
from jaxrl_vr.trajectory import Trajectory

__all__ = ["PromptTracker", "success_counts"]

_STATE_VERSION = 2
_RECENCY_CODES = {"all": 0, "ema": 1, "window": 2}


def success_counts(
    rewards_pg: np.ndarray,
    valid_pg: np.ndarray | None = None,
    *,
    success_threshold: float = 0.5,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-group (num valid samples, num successes); success = reward >= threshold.

    Args:
      rewards_pg: [P, G] rewards (pass verifier scores, not shaped rewards).
      valid_pg: optional [P, G] bool; invalid samples count for nothing.
      success_threshold: a sample succeeds when its reward is >= this value.

    Returns:
      (n_p, c_p), both int64 [P].
    """
    rewards_pg = np.asarray(rewards_pg)
    if rewards_pg.ndim != 2:
        raise ValueError(
            f"rewards_pg must be [P, G], got shape {rewards_pg.shape}; reshape flat "
            "prompt-major rewards with rewards_b.reshape(P, G)."
        )
    if valid_pg is None:
        valid_pg = np.ones(rewards_pg.shape, bool)
    valid_pg = np.asarray(valid_pg)
    if valid_pg.shape != rewards_pg.shape or valid_pg.dtype != np.bool_:
        raise ValueError(
            f"valid_pg must be a bool array of shape {rewards_pg.shape}, got "
            f"{valid_pg.dtype} {valid_pg.shape}."
        )
    n_p = valid_pg.sum(axis=1).astype(np.int64)
    c_p = (valid_pg & (rewards_pg >= success_threshold)).sum(axis=1).astype(np.int64)
    return n_p, c_p


def _uid_fingerprint(uids: Sequence[str] | None, num_prompts: int) -> int:
    """A stable 32-bit fingerprint of the prompt set (crc32 of the joined uids)."""
    if uids is None:
        text = f"<anonymous:{num_prompts}>"
    else:
        text = "\x1f".join(uids)
    return zlib.crc32(text.encode("utf-8"))


class PromptTracker(Hook):
    """Per-prompt pass-rate statistics over training plus a frozen-base cache.

    Recency models (``recency``):
      * ``"all"``: n_x, c_x are sums over every visit.
      * ``"ema"``: counts decay by ``decay`` per training step,
        n_x(t) = Σ_visits decay^(t − t_visit) · n_visit (same for c). Decay is applied
        lazily, so a read at step t is exact without touching unseen prompts.
      * ``"window"``: sums over the prompt's last ``window`` visits (a ring buffer).

    Pass rate with a Beta(α, β) prior: p̂_x = (c_x + α) / (n_x + α + β).

    Policy rate for prompt choice (``policy_rate``): training counts plus the
    calibration counts, the latter scaled down to at most ``calibration_cap`` samples
    (and, under ``"ema"``, decayed from the step they were set at), so a fresh training
    visit outweighs the calibration pass while unvisited prompts keep their calibrated
    rate.

    Args:
      num_prompts: P, the size of the prompt set.
      uids: optional P distinct uids (``TaskItem.uid``), for ``index_of`` and for
        checking that a checkpoint belongs to the same prompt set.
      recency: ``"all"``, ``"ema"`` or ``"window"``.
      decay: per-step decay in (0, 1] for ``recency="ema"``.
      window: number of visits kept for ``recency="window"``.
      prior: (α, β) pseudo-counts used by ``pass_rate`` unless overridden.
      success_threshold: a sample succeeds when its reward is >= this value.
    """

    def __init__(
        self,
        num_prompts: int,
        *,
        uids: Sequence[str] | None = None,
        recency: str = "all",
        decay: float | None = None,
        window: int | None = None,
        prior: tuple[float, float] = (0.0, 0.0),
        success_threshold: float = 0.5,
    ):
        if int(num_prompts) < 1:
            raise ValueError(f"num_prompts must be >= 1, got {num_prompts}.")
        self.num_prompts = int(num_prompts)
        if uids is not None:
            uids = [str(u) for u in uids]
            if len(uids) != self.num_prompts:
                raise ValueError(f"got {len(uids)} uids for num_prompts={self.num_prompts}.")
            if len(set(uids)) != len(uids):
                raise ValueError("uids must be distinct; deduplicate the prompt set first.")
        self.uids = uids
        self._uid_index = None if uids is None else {u: i for i, u in enumerate(uids)}
        if recency not in ("all", "ema", "window"):
            raise ValueError(f"recency must be 'all', 'ema' or 'window', got {recency!r}.")
        if recency == "ema":
            if decay is None or not 0.0 < float(decay) <= 1.0:
                raise ValueError(f"recency='ema' needs decay in (0, 1], got {decay!r}.")
        elif decay is not None:
            raise ValueError(f"decay={decay!r} is only used with recency='ema'.")
        if recency == "window":
            if window is None or int(window) < 1:
                raise ValueError(f"recency='window' needs window >= 1, got {window!r}.")
        elif window is not None:
            raise ValueError(f"window={window!r} is only used with recency='window'.")
        alpha, beta = (float(v) for v in prior)
        if alpha < 0 or beta < 0:
            raise ValueError(f"prior pseudo-counts must be >= 0, got {prior!r}.")
        self.recency = recency
        self.decay = None if decay is None else float(decay)
        self.window = None if window is None else int(window)
        self.prior = (alpha, beta)
        self.success_threshold = float(success_threshold)
        self._fingerprint = _uid_fingerprint(self.uids, self.num_prompts)
        self._init_state()

    # ------------------------------------------------------------------ state
    def _init_state(self) -> None:
        p = self.num_prompts
        self.step = 0  # current RL step: update() records here, advance() moves it
        self._n_p = np.zeros(p, np.float64)  # recency-weighted (as of _last_step_p for ema)
        self._c_p = np.zeros(p, np.float64)
        self._total_n_p = np.zeros(p, np.int64)
        self._total_c_p = np.zeros(p, np.int64)
        self._visits_p = np.zeros(p, np.int64)
        self._last_step_p = np.full(p, -1, np.int64)
        w = self.window or 1
        self._win_n_pw = np.zeros((p, w), np.int64)
        self._win_c_pw = np.zeros((p, w), np.int64)
        self._base_n_p = np.zeros(p, np.int64)
        self._base_c_p = np.zeros(p, np.int64)
        self._base_frozen = False
        self._cal_n_p = np.zeros(p, np.int64)
        self._cal_c_p = np.zeros(p, np.int64)
        self._cal_step = 0  # step the calibration counts describe (for EMA decay)

    def _as_index(self, prompt_idx: Any) -> np.ndarray:
        idx = np.asarray(prompt_idx)
        if idx.dtype.kind not in "iu":
            raise TypeError(
                f"prompt indices must be integers, got dtype {idx.dtype}; map uids with "
                "tracker.index_of(uids)."
            )
        idx = idx.astype(np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_prompts):
            raise IndexError(
                f"prompt index out of range [0, {self.num_prompts}): min {idx.min()}, "
                f"max {idx.max()}."
            )
        return idx

    def _select(self, values_p: np.ndarray, prompt_idx: Any) -> np.ndarray:
        return values_p if prompt_idx is None else values_p[self._as_index(prompt_idx)]

    def index_of(self, uids: Sequence[str] | str) -> np.ndarray:
        """Indices of the given uids (int64 [N]); raises KeyError naming unknown uids."""
        if self._uid_index is None:
            raise ValueError("this tracker was built without uids; pass uids= to PromptTracker.")
        if isinstance(uids, str):
            uids = [uids]
        missing = [u for u in uids if u not in self._uid_index]
        if missing:
            raise KeyError(f"unknown prompt uids (first 5): {missing[:5]}")
        return np.asarray([self._uid_index[u] for u in uids], np.int64)

    # --------------------------------------------------------------- the hook
    state_key = "tracker"

    def observe(self, sampled: Trajectory) -> None:
        """One update per RL step with every sample the step generated, then ``advance``."""
        if sampled.num_prompts:
            self.update(sampled.prompt_idx_p, sampled.per_group(sampled.scores_b), sampled.valid_pg)
        self.advance()

    def metrics(self, batch: Trajectory) -> dict[str, float]:
        """``summary()`` and the tracked pass rates of the batch's prompts (those with a valid
        sample, this step's samples included) in ``jaxrl_vr.diagnostics.SUCCESS_BINS``, under
        ``prompt_dist/tracked``."""
        rate_p = self.pass_rate(batch.prompt_idx_p, prior=(0.0, 0.0))
        return {**self.summary(), **success_bins(rate_p, np.asarray(batch.valid_pg).any(axis=1),
                                                 "prompt_dist/tracked")}

    # --------------------------------------------------------------- training
    def advance(self, step: int | None = None) -> int:
        """Moves to the next RL step (or to ``step``, non-decreasing); returns the new step.

        Call once per RL step, however many sampling rounds (dynamic sampling, two-stage
        probing) the step used: EMA decay is per RL step.
        """
        new_step = self.step + 1 if step is None else int(step)
        if new_step < self.step:
            raise ValueError(f"step must be non-decreasing: got {new_step} after {self.step}.")
        self.step = new_step
        return new_step

    def update(
        self,
        prompt_idx: Any,
        rewards_pg: np.ndarray,
        valid_pg: np.ndarray | None = None,
        *,
        step: int | None = None,
    ) -> None:
        """Records one batch of rollouts of the current policy.

        Args:
          prompt_idx: [P'] int prompt indices of the batch's groups (repeats allowed;
            repeats within one call count as one visit).
          rewards_pg: [P', G] rewards (verifier scores; success = >= success_threshold).
          valid_pg: optional [P', G] bool.
          step: training step (non-decreasing); default: the current ``self.step``
            (not advanced; call ``advance()`` once per RL step). An explicit step larger
            than the current one advances the tracker to it.
        """
        idx = self._as_index(prompt_idx)
        n_b, c_b = success_counts(rewards_pg, valid_pg, success_threshold=self.success_threshold)
        if idx.shape[0] != n_b.shape[0]:
            raise ValueError(
                f"{idx.shape[0]} prompt indices for {n_b.shape[0]} reward groups; pass one "
                "index per row of rewards_pg."
            )
        step = self.step if step is None else int(step)
        if step < self.step:
            raise ValueError(f"step must be non-decreasing: got {step} after {self.step}.")
        # Merge repeated prompts of this batch into one visit.
        uniq, inverse = np.unique(idx, return_inverse=True)
        n_u = np.zeros(uniq.shape[0], np.int64)
        c_u = np.zeros(uniq.shape[0], np.int64)
        np.add.at(n_u, inverse, n_b)
        np.add.at(c_u, inverse, c_b)

        if self.recency == "ema":
            seen = self._last_step_p[uniq] >= 0
            age = np.where(seen, step - self._last_step_p[uniq], 0)
            factor = np.power(self.decay, age.astype(np.float64))
            self._n_p[uniq] = self._n_p[uniq] * factor + n_u
            self._c_p[uniq] = self._c_p[uniq] * factor + c_u
        elif self.recency == "window":
            slot = self._visits_p[uniq] % self.window
            self._win_n_pw[uniq, slot] = n_u
            self._win_c_pw[uniq, slot] = c_u
        else:
            self._n_p[uniq] += n_u
            self._c_p[uniq] += c_u
        self._total_n_p[uniq] += n_u
        self._total_c_p[uniq] += c_u
        self._visits_p[uniq] += 1
        self._last_step_p[uniq] = step
        self.step = step

    def counts(self, prompt_idx: Any = None, *, step: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Recency-weighted training (n_x, c_x), float64, as of ``step`` (default: current)."""
        if self.recency == "window":
            n_p = self._win_n_pw.sum(axis=1).astype(np.float64)
            c_p = self._win_c_pw.sum(axis=1).astype(np.float64)
        elif self.recency == "ema":
            now = self.step if step is None else int(step)
            age = np.maximum(now - self._last_step_p, 0).astype(np.float64)
            factor = np.where(self._last_step_p >= 0, np.power(self.decay, age), 0.0)
            n_p, c_p = self._n_p * factor, self._c_p * factor
        else:
            n_p, c_p = self._n_p.copy(), self._c_p.copy()
        return self._select(n_p, prompt_idx), self._select(c_p, prompt_idx)

    def totals(self, prompt_idx: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """Lifetime (never decayed) sample and success counts, int64."""
        return (self._select(self._total_n_p, prompt_idx).copy(),
                self._select(self._total_c_p, prompt_idx).copy())

    def seen(self, prompt_idx: Any = None) -> np.ndarray:
        """bool: the prompt has at least one recorded valid sample."""
        return self._select(self._total_n_p > 0, prompt_idx)

    def visits(self, prompt_idx: Any = None) -> np.ndarray:
        return self._select(self._visits_p, prompt_idx).copy()

    def last_step(self, prompt_idx: Any = None) -> np.ndarray:
        """Step of the prompt's last visit, -1 if never visited."""
        return self._select(self._last_step_p, prompt_idx).copy()

    def pass_rate(
        self,
        prompt_idx: Any = None,
        *,
        prior: tuple[float, float] | None = None,
        fill: float = 0.0,
        step: int | None = None,
    ) -> np.ndarray:
        """p̂_x = (c_x + α) / (n_x + α + β) of the current policy, float64.

        Where the denominator is 0 (no samples and no prior) the result is ``fill``;
        use ``seen()`` to tell "unseen" from "never solved".
        """
        alpha, beta = self.prior if prior is None else (float(prior[0]), float(prior[1]))
        n_p, c_p = self.counts(prompt_idx, step=step)
        den = n_p + alpha + beta
        return np.where(den > 0, (c_p + alpha) / np.where(den > 0, den, 1.0), fill)

    # ----------------------------------------------------- policy calibration
    def record_calibration(
        self,
        prompt_idx: Any,
        rewards_pn: np.ndarray,
        valid_pn: np.ndarray | None = None,
    ) -> None:
        """Adds calibration samples of the current policy (may be called in chunks).

        The calibration pass samples every training prompt n times before (or early in)
        training; its counts seed ``policy_rate`` for prompts training has not visited.
        Success = reward >= ``success_threshold``. Stamped with the current step.
        """
        idx = self._as_index(prompt_idx)
        n_b, c_b = success_counts(rewards_pn, valid_pn, success_threshold=self.success_threshold)
        if idx.shape[0] != n_b.shape[0]:
            raise ValueError(f"{idx.shape[0]} prompt indices for {n_b.shape[0]} reward groups.")
        np.add.at(self._cal_n_p, idx, n_b)
        np.add.at(self._cal_c_p, idx, c_b)
        self._cal_step = self.step

    def set_calibration_counts(self, cal_n_p: Any, cal_c_p: Any) -> None:
        """Replaces the calibration counts with precomputed (n, c) for all P prompts.

        E.g. a cached calibration pass (``n = np.full(P, 64)``, ``c`` = successes).
        These are *not* the frozen-base counts of PBA (``set_base_counts``); pass the
        same arrays to both only if the pass was sampled from the initial policy.
        Stamped with the current step.
        """
        n_p, c_p = self._check_counts(cal_n_p, cal_c_p, "calibration")
        self._cal_n_p[:] = n_p
        self._cal_c_p[:] = c_p
        self._cal_step = self.step

    def calibration_counts(self, prompt_idx: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """(n, c) int64 of the current-policy calibration pass."""
        return (self._select(self._cal_n_p, prompt_idx).copy(),
                self._select(self._cal_c_p, prompt_idx).copy())

    def measured(self, prompt_idx: Any = None, *, min_count: int = 1) -> np.ndarray:
        """bool: calibration plus lifetime training samples >= ``min_count``."""
        return self._select(self._cal_n_p + self._total_n_p >= max(int(min_count), 1), prompt_idx)

    def policy_counts(
        self,
        prompt_idx: Any = None,
        *,
        calibration_cap: float | None = 8.0,
        step: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Training counts plus down-weighted calibration counts, float64 (n, c).

        n = n_train + s·n_cal·d,  c = c_train + s·c_cal·d, where (n_train, c_train) follow
        the recency model (``counts``), s = min(1, calibration_cap / n_cal) caps the
        calibration pass at ``calibration_cap`` samples' worth (None: full weight), and
        d = decay^(step − calibration step) under ``recency="ema"`` (else 1). Newer
        evidence is therefore preferred: one visit of G ≥ cap samples outweighs the
        calibration pass, while an unvisited prompt keeps c_cal/n_cal exactly.
        """
        n_p, c_p = self.counts(step=step)
        cal_n = self._cal_n_p.astype(np.float64)
        cal_c = self._cal_c_p.astype(np.float64)
        if calibration_cap is not None:
            if float(calibration_cap) < 0:
                raise ValueError(f"calibration_cap must be >= 0 or None, got {calibration_cap}.")
            scale = np.minimum(1.0, float(calibration_cap) / np.maximum(cal_n, 1.0))
            cal_n, cal_c = cal_n * scale, cal_c * scale
        if self.recency == "ema":
            now = self.step if step is None else int(step)
            factor = self.decay ** max(now - self._cal_step, 0)
            cal_n, cal_c = cal_n * factor, cal_c * factor
        return self._select(n_p + cal_n, prompt_idx), self._select(c_p + cal_c, prompt_idx)

    def policy_rate(
        self,
        prompt_idx: Any = None,
        *,
        calibration_cap: float | None = 8.0,
        fill: float = 0.0,
        step: int | None = None,
    ) -> np.ndarray:
        """Current-policy pass rate c/n from ``policy_counts`` (no prior), float64.

        ``fill`` where nothing was measured (see ``measured``). Used to choose
        positive–negative pairs (``selection.pairing.PairedPromptSource``).
        """
        n_p, c_p = self.policy_counts(prompt_idx, calibration_cap=calibration_cap, step=step)
        return np.where(n_p > 0, c_p / np.where(n_p > 0, n_p, 1.0), fill)

    def _check_counts(self, n_arr: Any, c_arr: Any, what: str) -> tuple[np.ndarray, np.ndarray]:
        n_p = np.asarray(n_arr, np.int64).reshape(-1)
        c_p = np.asarray(c_arr, np.int64).reshape(-1)
        if n_p.shape != (self.num_prompts,) or c_p.shape != (self.num_prompts,):
            raise ValueError(
                f"{what} counts must have shape ({self.num_prompts},), got {n_p.shape}, {c_p.shape}."
            )
        if np.any(n_p < 0) or np.any(c_p < 0) or np.any(c_p > n_p):
            raise ValueError(f"{what} counts need 0 <= c <= n for every prompt.")
        return n_p, c_p

    # ------------------------------------------------------------ base cache
    def record_base(
        self,
        prompt_idx: Any,
        rewards_pn: np.ndarray,
        valid_pn: np.ndarray | None = None,
    ) -> None:
        """Adds frozen-base samples (may be called in chunks until ``freeze_base()``)."""
        if self._base_frozen:
            raise RuntimeError(
                "the base calibration cache is frozen; build a new PromptTracker (or load "
                "a checkpoint) to recalibrate."
            )
        idx = self._as_index(prompt_idx)
        n_b, c_b = success_counts(rewards_pn, valid_pn, success_threshold=self.success_threshold)
        if idx.shape[0] != n_b.shape[0]:
            raise ValueError(f"{idx.shape[0]} prompt indices for {n_b.shape[0]} reward groups.")
        np.add.at(self._base_n_p, idx, n_b)
        np.add.at(self._base_c_p, idx, c_b)

    def set_base_counts(self, base_n_p: np.ndarray, base_c_p: np.ndarray) -> None:
        """Replaces the base cache with precomputed (n, c) for all P prompts."""
        if self._base_frozen:
            raise RuntimeError("the base calibration cache is frozen.")
        n_p, c_p = self._check_counts(base_n_p, base_c_p, "base")
        self._base_n_p[:] = n_p
        self._base_c_p[:] = c_p

    def freeze_base(self) -> None:
        """Locks the base cache: it describes the initial policy and never changes."""
        self._base_frozen = True

    @property
    def base_frozen(self) -> bool:
        return self._base_frozen

    def base_counts(self, prompt_idx: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """(n, c) int64 of the frozen-base cache."""
        return (self._select(self._base_n_p, prompt_idx).copy(),
                self._select(self._base_c_p, prompt_idx).copy())

    def has_base(self, prompt_idx: Any = None) -> np.ndarray:
        """bool: the prompt has at least one base calibration sample."""
        return self._select(self._base_n_p > 0, prompt_idx)

    def p_base(self, prompt_idx: Any = None, *, fill: float = 0.0) -> np.ndarray:
        """Base pass rate c/n (float64); ``fill`` where uncalibrated (see ``has_base``)."""
        n_p, c_p = self.base_counts(prompt_idx)
        return np.where(n_p > 0, c_p / np.maximum(n_p, 1), fill)

    # ------------------------------------------------------------- summaries
    def summary(self) -> dict[str, float]:
        """Scalar statistics for metrics logging (JSON-able)."""
        seen = self.seen()
        rate = self.pass_rate(prior=(0.0, 0.0))
        n_seen = int(seen.sum())
        out = {
            "tracker/frac_seen": n_seen / self.num_prompts,
            "tracker/frac_measured": float(self.measured().mean()),
            "tracker/mean_pass_rate": float(rate[seen].mean()) if n_seen else 0.0,
            "tracker/frac_all_solved": float((seen & (rate >= 1.0)).sum() / max(n_seen, 1)),
            "tracker/frac_none_solved": float((seen & (rate <= 0.0)).sum() / max(n_seen, 1)),
        }
        has_base = self.has_base()
        if has_base.any():
            out["tracker/mean_p_base"] = float(self.p_base()[has_base].mean())
        return out

    # ------------------------------------------------------------ checkpoint
    def config_dict(self) -> dict[str, Any]:
        """JSON-able constructor arguments (``PromptTracker(**config_dict())`` rebuilds it)."""
        return {
            "num_prompts": self.num_prompts,
            "uids": None if self.uids is None else list(self.uids),
            "recency": self.recency,
            "decay": self.decay,
            "window": self.window,
            "prior": list(self.prior),
            "success_threshold": self.success_threshold,
        }

    def state_dict(self) -> dict[str, np.ndarray]:
        """All mutable state as a flat dict of numpy arrays (orbax-friendly)."""
        return {
            "version": np.asarray(_STATE_VERSION, np.int64),
            "num_prompts": np.asarray(self.num_prompts, np.int64),
            "fingerprint": np.asarray(self._fingerprint, np.int64),
            "recency": np.asarray(_RECENCY_CODES[self.recency], np.int64),
            "window": np.asarray(self.window or 0, np.int64),
            "step": np.asarray(self.step, np.int64),
            "n_p": self._n_p.copy(),
            "c_p": self._c_p.copy(),
            "total_n_p": self._total_n_p.copy(),
            "total_c_p": self._total_c_p.copy(),
            "visits_p": self._visits_p.copy(),
            "last_step_p": self._last_step_p.copy(),
            "win_n_pw": self._win_n_pw.copy(),
            "win_c_pw": self._win_c_pw.copy(),
            "base_n_p": self._base_n_p.copy(),
            "base_c_p": self._base_c_p.copy(),
            "base_frozen": np.asarray(self._base_frozen, np.bool_),
            "cal_n_p": self._cal_n_p.copy(),
            "cal_c_p": self._cal_c_p.copy(),
            "cal_step": np.asarray(self._cal_step, np.int64),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores ``state_dict()`` output; validates everything before assigning."""
        arr = {k: np.asarray(state[k]) for k in state}
        if "version" in arr and int(arr["version"]) == 1:  # before calibration counts
            arr.setdefault("cal_n_p", np.zeros(self.num_prompts, np.int64))
            arr.setdefault("cal_c_p", np.zeros(self.num_prompts, np.int64))
            arr.setdefault("cal_step", np.asarray(0, np.int64))
            arr["version"] = np.asarray(_STATE_VERSION, np.int64)
            arr["step"] = np.asarray(max(int(arr["step"]), 0), np.int64)
        missing = set(self.state_dict()) - set(arr)
        if missing:
            raise KeyError(f"tracker checkpoint is missing keys {sorted(missing)}.")
        if int(arr["version"]) != _STATE_VERSION:
            raise ValueError(f"tracker checkpoint version {int(arr['version'])} != {_STATE_VERSION}.")
        if int(arr["num_prompts"]) != self.num_prompts:
            raise ValueError(
                f"tracker checkpoint has {int(arr['num_prompts'])} prompts, this tracker "
                f"{self.num_prompts}; build the tracker over the same prompt set."
            )
        if int(arr["fingerprint"]) != self._fingerprint:
            raise ValueError(
                "tracker checkpoint belongs to a different prompt set (uid fingerprint "
                "mismatch); build the tracker with the uids used when it was saved."
            )
        if int(arr["recency"]) != _RECENCY_CODES[self.recency]:
            saved = {v: k for k, v in _RECENCY_CODES.items()}.get(int(arr["recency"]), "?")
            raise ValueError(
                f"tracker checkpoint recency={saved!r}, this tracker recency={self.recency!r}; "
                "use the same recency settings."
            )
        if int(arr["window"]) != (self.window or 0):
            raise ValueError(
                f"tracker checkpoint window={int(arr['window'])}, this tracker "
                f"window={self.window or 0}; use the same recency settings."
            )
        fresh = self.state_dict()
        for key, ref in fresh.items():
            if arr[key].shape != ref.shape:
                raise ValueError(f"tracker checkpoint '{key}' has shape {arr[key].shape}, expected {ref.shape}.")
        self.step = int(arr["step"])
        self._n_p = arr["n_p"].astype(np.float64).copy()
        self._c_p = arr["c_p"].astype(np.float64).copy()
        self._total_n_p = arr["total_n_p"].astype(np.int64).copy()
        self._total_c_p = arr["total_c_p"].astype(np.int64).copy()
        self._visits_p = arr["visits_p"].astype(np.int64).copy()
        self._last_step_p = arr["last_step_p"].astype(np.int64).copy()
        self._win_n_pw = arr["win_n_pw"].astype(np.int64).copy()
        self._win_c_pw = arr["win_c_pw"].astype(np.int64).copy()
        self._base_n_p = arr["base_n_p"].astype(np.int64).copy()
        self._base_c_p = arr["base_c_p"].astype(np.int64).copy()
        self._base_frozen = bool(arr["base_frozen"])
        self._cal_n_p = arr["cal_n_p"].astype(np.int64).copy()
        self._cal_c_p = arr["cal_c_p"].astype(np.int64).copy()
        self._cal_step = int(arr["cal_step"])
