"""Two-stage sampling in the RL loop (MAI-Thinking-1; SPEC §4): tracker, budget, resume.

The strategy's decisions are tested without a model in tests/selection/test_strategies.py;
these run it through the trainer with the real sampler.
"""

import jax
import numpy as np
import pytest

from jaxrl_vr.models.tokenizers import CharTokenizer
from jaxrl_vr.tasks import arithmetic
from jaxrl_vr.selection.tracker import PromptTracker
from jaxrl_vr.train.config import RLConfig, StrategyChoice, VerifierConfig
from jaxrl_vr.train.metrics import rollout_metrics
from jaxrl_vr.train.optim import OptimConfig
from jaxrl_vr.train.step import LossConfig
from jaxrl_vr.verifiers.pool import VerifyResult

import trainer_testlib as lib

TOKENIZER = CharTokenizer(arithmetic.ARITHMETIC_ALPHABET)
ITEMS = arithmetic.make_items(0, 6, levels=(0,), split=None)
P, G_PROBE, G_FULL, T = 2, 2, 4, 3


def _by_prompt_scorer(correct_uids):
    """Score 1 for every completion of the items in ``correct_uids``, 0 for the others:
    each prompt's probe pass rate is exactly 1 or 0, so the continuation is decided."""

    def score(items, completions):
        scores = np.asarray([float(it.uid in correct_uids) for it in items], np.float32)
        return VerifyResult(scores=scores, statuses=["ok"] * len(items), errors=[None] * len(items))

    return score


def _trainer(workdir, scorer, *, steps=1, tracker=None, num_minibatches=2, **settings):
    rl = RLConfig(
        steps=steps, prompts_per_step=P, samples_per_prompt=G_FULL, max_new_tokens=T,
        num_minibatches=num_minibatches, num_epochs=1, verifier=VerifierConfig(workers=0),
        checkpoint_every=1, seed=3,
        batch_strategy=StrategyChoice.of("two_stage", probe=G_PROBE, **settings),
    )
    return lib.make_trainer(workdir, TOKENIZER, ITEMS, rl=rl, loss=LossConfig(),
                            optim=OptimConfig(learning_rate=0.05, warmup_steps=1), scorer=scorer,
                            tracker=tracker)


def _collect(trainer):
    """The built batch of step 0 and its rollout metrics."""
    batch, sampled, _ = trainer.collect(0)
    return batch, rollout_metrics(batch, sampled)


def _tracker():
    return PromptTracker(len(ITEMS), uids=[it.uid for it in ITEMS])


def test_nothing_continues_counts_only_probe_samples_and_the_tracker_advances_once(tmp_path):
    # Every probe is all wrong (rate 0) and the band is [0.5, 0.5]: nothing continues, so
    # the step generates P·G_probe = 2·2 = 4 samples, and the tracker sees 4 samples.
    tracker = _tracker()
    trainer = _trainer(tmp_path, _by_prompt_scorer(set()), tracker=tracker, lo=0.5, hi=0.5)
    batch, info = _collect(trainer)
    assert info["two_stage/continued_frac"] == 0.0
    assert info["generated_samples"] == P * G_PROBE == 4
    assert info["sample_rounds"] == 1  # the probe only
    mask_pgt = np.asarray(batch.loss_mask_bt).reshape(P, G_FULL, T)
    assert not mask_pgt[:, G_PROBE:].any()  # padding slots carry no token
    assert info["generated_tokens"] == float(mask_pgt.sum())
    total_n, _ = tracker.totals()
    assert int(total_n.sum()) == P * G_PROBE  # valid samples only
    assert tracker.step == 1  # one advance per RL step, whatever the sampling mode
    trainer.close()


def test_only_prompts_in_band_continue(tmp_path):
    order = np.random.default_rng([3, 0]).permutation(len(ITEMS))[:P]
    correct = {ITEMS[int(order[0])].uid}  # prompt row 0 solved, row 1 not
    trainer = _trainer(tmp_path, _by_prompt_scorer(correct), lo=0.0, hi=0.5)
    batch, info = _collect(trainer)
    assert info["two_stage/continued_frac"] == 0.5
    # 2·2 probe samples + 1 continued prompt · (4 − 2) = 6 samples generated.
    assert info["generated_samples"] == 6
    assert info["sample_rounds"] == 2  # probe, then the continued prompts
    valid_pg = np.asarray(batch.loss_mask_bt).reshape(P, G_FULL, T).any(2)
    assert valid_pg.sum(1).tolist() == [G_PROBE, G_FULL]
    trainer.close()


def test_two_stage_run_completes_and_budget_adds_both_stages(tmp_path):
    trainer = _trainer(tmp_path, _by_prompt_scorer({ITEMS[0].uid, ITEMS[1].uid, ITEMS[2].uid}),
                       steps=2, lo=0.0, hi=0.5)
    rows = trainer.run()
    trainer.close()
    assert len(rows) == 2
    for row in rows:
        assert 0.0 <= row["two_stage/continued_frac"] <= 1.0
        assert np.isfinite(row["loss"])
    assert rows[-1]["budget/generated_tokens"] == pytest.approx(
        sum(r["generated_tokens"] for r in rows))
    assert trainer.parts.source.position == 2 * P


@pytest.mark.slow
def test_two_stage_resume_is_exact(tmp_path):
    scorer = _by_prompt_scorer({ITEMS[0].uid, ITEMS[3].uid})
    straight = _trainer(tmp_path / "a", scorer, steps=2, lo=0.0, hi=0.5)
    rows_a = straight.run()
    straight.close()
    first = _trainer(tmp_path / "b", scorer, steps=2, lo=0.0, hi=0.5)
    first.run(stop_after=1)
    first.close()
    resumed = _trainer(tmp_path / "b", scorer, steps=2, lo=0.0, hi=0.5)
    rows_b = resumed.run()
    resumed.close()
    assert len(rows_b) == 1
    assert rows_b[0]["budget/generated_tokens"] == rows_a[-1]["budget/generated_tokens"]
    assert rows_b[0]["two_stage/continued_frac"] == rows_a[-1]["two_stage/continued_frac"]
    for a, b in zip(jax.tree.leaves(straight.state.train.params), jax.tree.leaves(resumed.state.train.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


def test_adaptive_g_runs_through_the_loop_at_a_fixed_total(tmp_path):
    trainer = _trainer(tmp_path, _by_prompt_scorer({ITEMS[0].uid}), steps=1, lo=0.0, hi=1.0,
                       adaptive_g_max=6, num_minibatches=1)
    rows = trainer.run()
    trainer.close()
    assert rows[0]["generated_samples"] == P * G_FULL  # the fixed total, spread by p(1 − p)
    assert np.isfinite(rows[0]["loss"])
