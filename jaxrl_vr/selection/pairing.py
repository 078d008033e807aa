"""Positive–negative prompt pairing for Weighted GRPO (Sheng/Pang et al., arXiv 2602.03452).

Each update uses pairs (q⁺, q⁻) chosen from per-prompt success rates of the current
policy over the whole training pool (SPEC §3.3):

* q⁺ hard-but-solvable: pos_min < rate <= pos_max (a low, non-zero success rate);
* q⁻ easy-but-brittle: 1 − c/G <= rate <= 1 − 1/G (solved often, but not always).

Rates come from a calibration pass over the pool, refreshed by training rollouts
(``PromptTracker.policy_rate``); ``PairedPromptSource`` draws the pairs step by step and
fills the rest of each batch from the data order, so unmeasured prompts keep entering
and the data position advances. Success is decided where rewards are binarised (the
tracker's ``success_threshold``). The thresholds, c and λ_neg are configurable; the
published values are not known. The advantage side is
``jaxrl_vr.advantages.pair_weighted``.

Two switches reproduce the paper's set-up and its baseline: ``fixed_prompts=n`` trains on
one small set of n prompts (n/2 pairs) chosen once from the calibrated rates and repeated
every step (the paper's "single paired minibatch per update"), and ``select="variance"``
picks the prompts with the highest tracked reward variance p(1 − p) instead of pairs
(the variance-based selection the paper compares against; ``variance_order``), and
``select="random_pairs"`` marks pairs of prompts taken from the data order without the
q⁺/q⁻ criterion (Weighted GRPO's row weights without the pairing: an ablation).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple

import numpy as np

__all__ = [
    "PAIRED_SELECTIONS",
    "PAIRING_SELECTIONS",
    "PairPools",
    "PairedPromptSource",
    "PairedSource",
    "PromptChoice",
    "pairing_pools",
    "pairs_from_tracker",
    "select_pairs",
    "tracker_rates",
    "variance_order",
]

_EPS = 1e-9  # rates are ratios of counts; compare band edges with a tiny tolerance
PAIRING_SELECTIONS = ("pairs", "variance", "random_pairs")
PAIRED_SELECTIONS = ("pairs", "random_pairs")  # the selections that mark (2i, 2i + 1) pairs


class PairPools(NamedTuple):
    """Candidate masks (bool [P]) for the two sides of a pair."""

    positive_p: np.ndarray
    negative_p: np.ndarray


def pairing_pools(
    rate_p: Any,
    count_p: Any,
    *,
    group_size: int,
    neg_c: int = 2,
    pos_max: float = 0.25,
    pos_min: float = 0.0,
    min_count: int = 1,
    eligible_p: Any | None = None,
) -> PairPools:
    """Candidate pools from per-prompt success rates.

    Args:
      rate_p: [P] success rates (``PromptTracker.pass_rate``).
      count_p: [P] samples behind each rate (``PromptTracker.counts()[0]``).
      group_size: G, the samples per prompt in an update.
      neg_c: c in the q⁻ band [1 − c/G, 1 − 1/G] (1 <= c <= G).
      pos_max: q⁺ needs rate <= pos_max.
      pos_min: q⁺ needs rate > pos_min (default 0: "solvable", at least one success).
      min_count: prompts with fewer tracked samples are in neither pool.
      eligible_p: optional [P] bool restricting both pools.

    Returns:
      PairPools(positive_p, negative_p); a prompt may be in at most one of them
      whenever pos_max < 1 − neg_c/G.
    """
    rate = np.asarray(rate_p, np.float64).reshape(-1)
    count = np.asarray(count_p, np.float64).reshape(-1)
    if rate.shape != count.shape:
        raise ValueError(f"rate_p {rate.shape} and count_p {count.shape} must have the same shape.")
    if group_size < 2:
        raise ValueError(f"group_size must be >= 2 for a brittle band, got {group_size}.")
    if not 1 <= neg_c <= group_size:
        raise ValueError(f"neg_c must be in [1, G={group_size}], got {neg_c}.")
    if not 0.0 <= pos_min < pos_max <= 1.0:
        raise ValueError(f"need 0 <= pos_min < pos_max <= 1, got {pos_min}, {pos_max}.")
    ok = count >= min_count
    if eligible_p is not None:
        ok &= np.asarray(eligible_p, bool).reshape(-1)
    positive = ok & (rate > pos_min + _EPS) & (rate <= pos_max + _EPS)
    neg_lo, neg_hi = 1.0 - neg_c / group_size, 1.0 - 1.0 / group_size
    negative = ok & (rate >= neg_lo - _EPS) & (rate <= neg_hi + _EPS)
    return PairPools(positive, negative)


def _pick(rng: np.random.Generator, pool: np.ndarray, rate: np.ndarray, num: int,
          strategy: str, hardest_first: bool) -> np.ndarray:
    idx = np.flatnonzero(pool)
    if strategy == "random":
        return rng.choice(idx, size=num, replace=idx.size < num)
    # "extreme": q⁺ lowest rates first, q⁻ highest rates first; ties by index; cycle if short.
    key = rate[idx] if hardest_first else -rate[idx]
    ordered = idx[np.lexsort((idx, key))]
    return ordered[np.arange(num) % ordered.size]


def select_pairs(
    rng: np.random.Generator,
    pools: PairPools,
    rate_p: Any,
    num_pairs: int,
    *,
    strategy: str = "random",
) -> np.ndarray:
    """Draws ``num_pairs`` (q⁺, q⁻) index pairs: int64 [num_pairs, 2].

    ``"random"``: uniform over each pool, without replacement when the pool is large
    enough, with replacement otherwise. ``"extreme"``: the hardest q⁺ (lowest rate)
    with the most brittle-yet-easy q⁻ (highest rate in band), ties by index.
    Deterministic given ``rng``. If either pool is empty the result is [0, 2]: the
    caller falls back to an unpaired batch.
    """
    if strategy not in ("random", "extreme"):
        raise ValueError(f"strategy must be 'random' or 'extreme', got {strategy!r}.")
    if num_pairs < 0:
        raise ValueError(f"num_pairs must be >= 0, got {num_pairs}.")
    rate = np.asarray(rate_p, np.float64).reshape(-1)
    if not pools.positive_p.any() or not pools.negative_p.any() or num_pairs == 0:
        return np.zeros((0, 2), np.int64)
    pos = _pick(rng, pools.positive_p, rate, num_pairs, strategy, hardest_first=True)
    neg = _pick(rng, pools.negative_p, rate, num_pairs, strategy, hardest_first=False)
    return np.stack([pos, neg], axis=1).astype(np.int64)


def variance_order(rng: np.random.Generator, rate_p: Any, measured_p: Any) -> np.ndarray:
    """Measured prompts with 0 < rate < 1, by reward variance p(1 − p), highest first.

    The variance-based prompt selection that Weighted GRPO (arXiv 2602.03452) compares
    against. Ties (equal rates) are broken by a permutation drawn from ``rng``, so equally
    uncertain prompts take turns instead of the lowest indices always winning.

    Returns:
      int64 [M] prompt indices, M = the number of such prompts.
    """
    rate = np.asarray(rate_p, np.float64).reshape(-1)
    candidates = np.flatnonzero(np.asarray(measured_p, bool).reshape(-1) & (rate > _EPS) & (rate < 1 - _EPS))
    tiebreak = rng.permutation(candidates.size)
    variance = np.round(rate[candidates] * (1.0 - rate[candidates]), 12)  # p and 1 − p tie
    return candidates[np.lexsort((tiebreak, -variance))].astype(np.int64)


def pairs_from_tracker(
    tracker: Any,
    rng: np.random.Generator,
    num_pairs: int,
    *,
    group_size: int,
    neg_c: int = 2,
    pos_max: float = 0.25,
    pos_min: float = 0.0,
    min_count: int = 1,
    eligible_p: Any | None = None,
    strategy: str = "random",
    calibration_cap: float | None = 8.0,
) -> np.ndarray:
    """``select_pairs`` over a ``PromptTracker``'s policy rates (calibration + training).

    A prompt needs ``min_count`` measured samples (calibration plus lifetime training).
    """
    rate_p, measured_p = tracker_rates(tracker, calibration_cap=calibration_cap,
                                       min_count=min_count)()
    pools = pairing_pools(rate_p, measured_p.astype(np.float64), group_size=group_size,
                          neg_c=neg_c, pos_max=pos_max, pos_min=pos_min, min_count=1,
                          eligible_p=eligible_p)
    return select_pairs(rng, pools, rate_p, num_pairs, strategy=strategy)


# ---------------------------------------------------------------- the prompt source

RatesFn = Callable[[], "tuple[np.ndarray, np.ndarray]"]


def tracker_rates(tracker: Any, *, calibration_cap: float | None = 8.0,
                  min_count: int = 1) -> RatesFn:
    """A rates function for ``PairedPromptSource`` reading a ``PromptTracker``.

    Returns ``() -> (rate_p float64 [N], measured_p bool [N])`` with
    ``tracker.policy_rate(calibration_cap=...)`` and ``tracker.measured(min_count=...)``:
    it is called at every draw, so rates refreshed by training are seen immediately.
    """
    def rates() -> tuple[np.ndarray, np.ndarray]:
        return (np.asarray(tracker.policy_rate(calibration_cap=calibration_cap), np.float64),
                np.asarray(tracker.measured(min_count=min_count), bool))
    return rates


class PromptChoice(NamedTuple):
    """One RL step's prompts.

    ``idx_p`` is laid out [q⁺₀, q⁻₀, q⁺₁, q⁻₁, …, then data-order prompts]; the first
    ``2·num_pairs`` rows are pairs (``is_pair_p``), so ``idx_p[:2*num_pairs]`` reshapes to
    [num_pairs, 2] (and the rollout rows to [num_pairs, 2, G] for ``pair_weighted``).
    """

    idx_p: np.ndarray  # int64 [P], distinct prompt indices (a fixed set repeats whole)
    is_pair_p: np.ndarray  # bool [P]: True for the first 2·num_pairs rows
    num_pairs: int


_STATE_VERSION = 1
_SEED_TAG = 2602  # separates the pair draw's stream from the data order's
_FIXED_TAG = 3452  # the one draw of the fixed prompt set


class PairedPromptSource:
    """Chooses each RL step's prompts: pairs from the whole pool plus the data order.

    At step t (Weighted GRPO, arXiv 2602.03452; SPEC §3.3):

    1. Read (rate_p, measured_p) from ``rates_fn`` (e.g. ``tracker_rates(tracker)``:
       calibration pass + training rollouts, newer evidence preferred).
    2. Pools over the whole pool (``pairing_pools`` on measured prompts): q⁺ with
       pos_min < rate <= pos_max, q⁻ with 1 − c/G <= rate <= 1 − 1/G.
    3. num_pairs = min(⌊(P − n_explore)/2⌋, |q⁺|, |q⁻|), n_explore = ⌈explore_frac·P⌉.
       ``"random"``: uniform without replacement within each pool; ``"extreme"``:
       lowest q⁺ / highest q⁻ rates first. A prompt never fills both sides.
    4. The other P − 2·num_pairs rows come from the data order (the same per-epoch
       permutation the unpaired trainer uses, seeded by (seed, epoch)), skipping prompts
       already in this step's pairs; the data position advances past every entry read.
       So unmeasured prompts keep entering and get measured, and rates stay fresh.

    The draw is a deterministic function of (seed, step, number of earlier draws, rates,
    data position): same seed, same draw, also after a resume that restores the tracker
    and ``state_dict()``. Several calls in one step (sampling rounds) draw differently.

    Args:
      num_prompts: N, the size of the training pool.
      rates_fn: ``() -> (rate_p [N] float, measured_p [N] bool)``.
      prompts_per_step: P, rows per step.
      group_size: G, samples per prompt (sets the q⁻ band).
      seed: run seed (data order and pair draws).
      neg_c, pos_max, pos_min: pool bands (``pairing_pools``).
      explore_frac: fraction of each batch taken from the data order (≥ 0; 0 = only
        when the pools run short, and then the data position stalls).
      strategy: ``"random"`` or ``"extreme"``.
      select: ``"pairs"`` (the above) or ``"variance"``: step 2-3 take the P − n_explore
        measured prompts of highest p(1 − p) (``variance_order``), unpaired rows; or
        ``"random_pairs"``: the first 2·⌊(P − n_explore)/2⌋ rows come from the data order,
        in rows (2i, 2i + 1), marked as pairs without reading the rates (the ablation of
        the q⁺/q⁻ choice; with fixed_prompts the set is drawn uniformly from the pool).
      fixed_prompts: n > 0: at the first draw choose n prompts once (n/2 pairs, or the n of
        highest variance) from the rates, then every step is that set repeated P/n times
        (pairs keep their rows (2i, 2i + 1)); the data order is not read. ValueError if the
        rates hold fewer than n candidates. 0 = draw every step.
    """

    def __init__(
        self,
        num_prompts: int,
        rates_fn: RatesFn,
        *,
        prompts_per_step: int,
        group_size: int,
        seed: int = 0,
        neg_c: int = 2,
        pos_max: float = 0.25,
        pos_min: float = 0.0,
        explore_frac: float = 0.25,
        strategy: str = "random",
        select: str = "pairs",
        fixed_prompts: int = 0,
    ):
        if int(num_prompts) < 1:
            raise ValueError(f"num_prompts must be >= 1, got {num_prompts}.")
        if int(prompts_per_step) < 1 or int(prompts_per_step) > int(num_prompts):
            raise ValueError(
                f"prompts_per_step must be in [1, num_prompts={num_prompts}], got "
                f"{prompts_per_step}.")
        if not 0.0 <= float(explore_frac) <= 1.0:
            raise ValueError(f"explore_frac must be in [0, 1], got {explore_frac}.")
        if strategy not in ("random", "extreme"):
            raise ValueError(f"strategy must be 'random' or 'extreme', got {strategy!r}.")
        if int(seed) < 0:
            raise ValueError(f"seed must be >= 0, got {seed}.")
        if select not in PAIRING_SELECTIONS:
            raise ValueError(f"select must be one of {PAIRING_SELECTIONS}, got {select!r}.")
        fixed_prompts = int(fixed_prompts)
        if fixed_prompts < 0 or (fixed_prompts and int(prompts_per_step) % fixed_prompts) or (
                select in PAIRED_SELECTIONS and fixed_prompts % 2):
            raise ValueError(
                f"fixed_prompts={fixed_prompts} must be 0 (off) or a divisor of prompts_per_step="
                f"{prompts_per_step}" + (", and even (pairs)" if select in PAIRED_SELECTIONS else "") + ".")
        # Validates the bands once, before any step.
        pairing_pools(np.zeros(1), np.zeros(1), group_size=group_size, neg_c=neg_c,
                      pos_max=pos_max, pos_min=pos_min)
        self.num_prompts = int(num_prompts)
        self.rates_fn = rates_fn
        self.prompts_per_step = int(prompts_per_step)
        self.group_size = int(group_size)
        self.seed = int(seed)
        self.neg_c, self.pos_max, self.pos_min = int(neg_c), float(pos_max), float(pos_min)
        self.explore_frac = float(explore_frac)
        self.strategy, self.select, self.fixed_prompts = strategy, select, fixed_prompts
        self.data_position = 0
        self.num_draws = 0
        self.fixed_idx: np.ndarray | None = None  # the fixed set, once chosen

    @property
    def num_selected(self) -> int:
        """Rows per step chosen from the rates (the rest explore the data order)."""
        return self.prompts_per_step - int(np.ceil(self.explore_frac * self.prompts_per_step - 1e-9))

    @property
    def max_pairs(self) -> int:
        """Pairs per step when both pools are large enough."""
        return self.num_selected // 2

    def data_order(self, epoch: int) -> np.ndarray:
        """The epoch's permutation of the pool (the unpaired trainer's data order)."""
        return np.random.default_rng([self.seed, int(epoch)]).permutation(self.num_prompts)

    def _take_data_order(self, num: int, exclude: set[int]) -> list[int]:
        out: list[int] = []
        pos = self.data_position
        order, order_epoch = None, -1
        while len(out) < num:
            epoch, offset = divmod(pos, self.num_prompts)
            if epoch != order_epoch:
                order, order_epoch = self.data_order(epoch), epoch
            prompt = int(order[offset])
            pos += 1
            if prompt not in exclude:
                out.append(prompt)
                exclude.add(prompt)
        self.data_position = pos
        return out

    def next_prompts(self, step: int) -> PromptChoice:
        """The prompts of RL step ``step``; advances the data position.

        Raises ValueError if ``rates_fn`` returns arrays of the wrong shape.
        """
        if int(step) < 0:
            raise ValueError(f"step must be >= 0, got {step}.")
        rate_p, measured_p = self.rates_fn()
        rate = np.asarray(rate_p, np.float64).reshape(-1)
        measured = np.asarray(measured_p, bool).reshape(-1)
        if rate.shape != (self.num_prompts,) or measured.shape != (self.num_prompts,):
            raise ValueError(
                f"rates_fn must return two arrays of shape ({self.num_prompts},), got "
                f"{rate.shape} and {measured.shape}.")
        if self.fixed_prompts:
            return self._fixed_choice(rate, measured)
        rng = np.random.default_rng([self.seed, int(step), self.num_draws, _SEED_TAG])
        if self.select == "variance":
            chosen = variance_order(rng, rate, measured)[:self.num_selected]
            rest = self._take_data_order(self.prompts_per_step - chosen.size, set(chosen.tolist()))
            self.num_draws += 1
            return PromptChoice(np.asarray(chosen.tolist() + rest, np.int64),
                                np.zeros(self.prompts_per_step, bool), 0)
        if self.select == "random_pairs":
            paired = self._take_data_order(2 * self.max_pairs, set())
            rest = self._take_data_order(self.prompts_per_step - len(paired), set(paired))
            self.num_draws += 1
            return PromptChoice(np.asarray(paired + rest, np.int64),
                                np.arange(self.prompts_per_step) < len(paired), self.max_pairs)
        positive, negative = self._pools(rate, measured)
        num_pairs = int(min(self.max_pairs, positive.sum(), negative.sum()))
        pairs = np.zeros((0, 2), np.int64)
        if num_pairs > 0:
            pairs = select_pairs(rng, PairPools(positive, negative), rate, num_pairs,
                                 strategy=self.strategy)
        paired = pairs.reshape(-1).tolist()
        rest = self._take_data_order(self.prompts_per_step - len(paired), set(paired))
        idx_p = np.asarray(paired + rest, np.int64)
        is_pair_p = np.arange(self.prompts_per_step) < len(paired)
        self.num_draws += 1
        return PromptChoice(idx_p, is_pair_p, num_pairs)

    def _pools(self, rate: np.ndarray, measured: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pools = pairing_pools(rate, measured.astype(np.float64), group_size=self.group_size,
                              neg_c=self.neg_c, pos_max=self.pos_max, pos_min=self.pos_min,
                              min_count=1)
        return pools.positive_p, pools.negative_p & ~pools.positive_p

    def _fixed_choice(self, rate: np.ndarray, measured: np.ndarray) -> PromptChoice:
        """The fixed set (chosen at the first draw) repeated to fill the batch."""
        size = self.fixed_prompts
        if self.fixed_idx is None:
            rng = np.random.default_rng([self.seed, _FIXED_TAG])
            if self.select == "variance":
                chosen = variance_order(rng, rate, measured)[:size]
                need, found = f"{size} prompts with 0 < rate < 1", f"{chosen.size}"
            elif self.select == "random_pairs":
                chosen = rng.permutation(self.num_prompts)[:size]
                need, found = f"{size} prompts", f"{self.num_prompts}"
            else:
                positive, negative = self._pools(rate, measured)
                num = min(size // 2, int(positive.sum()), int(negative.sum()))
                chosen = select_pairs(rng, PairPools(positive, negative), rate, num,
                                      strategy=self.strategy).reshape(-1)
                need, found = f"{size // 2} q+ and {size // 2} q- prompts", (
                    f"{int(positive.sum())} q+ and {int(negative.sum())} q-")
            if chosen.size < size:
                raise ValueError(
                    f"the fixed prompt set needs {need}, the tracked rates give {found}; lower "
                    "rl.pairing.fixed_prompts, widen the bands (rl.pairing.pos_max, rl.pairing.neg_c) "
                    "or calibrate more prompts.")
            self.fixed_idx = np.asarray(chosen, np.int64)
        repeats = self.prompts_per_step // size
        is_pair = self.select in PAIRED_SELECTIONS
        self.num_draws += 1
        return PromptChoice(np.tile(self.fixed_idx, repeats), np.full(self.prompts_per_step, is_pair),
                            self.prompts_per_step // 2 if is_pair else 0)

    # ------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, np.ndarray]:
        """Mutable state as numpy arrays (orbax-friendly); the rates live in the tracker."""
        return {
            "version": np.asarray(_STATE_VERSION, np.int64),
            "num_prompts": np.asarray(self.num_prompts, np.int64),
            "seed": np.asarray(self.seed, np.int64),
            "data_position": np.asarray(self.data_position, np.int64),
            "num_draws": np.asarray(self.num_draws, np.int64),
            "fixed_idx": np.zeros(0, np.int64) if self.fixed_idx is None else self.fixed_idx.copy(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores ``state_dict()`` output; checks pool size and seed first."""
        missing = set(self.state_dict()) - set(state) - {"fixed_idx"}  # absent before the fixed mode
        if missing:
            raise KeyError(f"pairing checkpoint is missing keys {sorted(missing)}.")
        if int(np.asarray(state["num_prompts"])) != self.num_prompts:
            raise ValueError(
                f"pairing checkpoint has {int(np.asarray(state['num_prompts']))} prompts, this "
                f"source {self.num_prompts}; build it over the same prompt pool.")
        if int(np.asarray(state["seed"])) != self.seed:
            raise ValueError(
                f"pairing checkpoint seed {int(np.asarray(state['seed']))} != {self.seed}; "
                "resume with the run's seed.")
        fixed = np.asarray(state.get("fixed_idx", np.zeros(0)), np.int64).reshape(-1)
        if fixed.size and fixed.size != self.fixed_prompts:
            raise ValueError(f"pairing checkpoint holds a fixed set of {fixed.size} prompts, this source "
                             f"fixed_prompts={self.fixed_prompts}; resume with the run's rl.pairing.fixed_prompts.")
        self.data_position = int(np.asarray(state["data_position"]))
        self.num_draws = int(np.asarray(state["num_draws"]))
        self.fixed_idx = fixed if fixed.size else None


class PairedSource:
    """``PairedPromptSource`` behind the prompt-source interface of the trainer.

    ``next_prompts(num)`` draws the step's prompts (pairs first, then the data order);
    ``is_pair_p`` is the last draw's pair rows, laid out [q⁺₀, q⁻₀, q⁺₁, q⁻₁, …].
    """

    def __init__(self, source: PairedPromptSource):
        self.source, self._step = source, 0
        self.is_pair_p = np.zeros(source.prompts_per_step, bool)

    @property
    def num_items(self) -> int:
        return self.source.num_prompts

    @property
    def position(self) -> int:
        return int(self.source.data_position)

    def begin_step(self, step: int) -> None:
        self._step = int(step)

    def next_prompts(self, num: int) -> np.ndarray:
        choice = self.source.next_prompts(self._step)
        if choice.idx_p.shape[0] != num:
            raise ValueError(f"the pairing source draws {choice.idx_p.shape[0]} prompts per step, "
                             f"asked for {num}.")
        self.is_pair_p = np.asarray(choice.is_pair_p, bool)
        return np.asarray(choice.idx_p, np.int64)

    def state_dict(self) -> dict:
        return self.source.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.source.load_state_dict(state)
