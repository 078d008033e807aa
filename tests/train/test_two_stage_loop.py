"""Two-stage sampling in the RL loop (MAI-Thinking-1; SPEC §4): probe, continue, budget."""

import jax
import numpy as np
import pytest

from jaxrl_vr.models.tokenizers import CharTokenizer
from jaxrl_vr.tasks import arithmetic
from jaxrl_vr.train.loop import RLConfig, RLTrainer, join_two_stage
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


def _trainer(workdir, scorer, *, steps=1, tracker=None, **overrides):
    rl = RLConfig(
        steps=steps, prompts_per_step=P, samples_per_prompt=G_FULL, max_new_tokens=T,
        num_minibatches=2, num_epochs=1, advantage="grpo", verifier_workers=0,
        checkpoint_every=1, seed=3, two_stage=True, two_stage_probe=G_PROBE, **overrides,
    )
    return RLTrainer(
        lib.tiny_decoder(TOKENIZER.vocab_size), TOKENIZER, ITEMS, rl=rl,
        loss=LossConfig(), optim=OptimConfig(learning_rate=0.05, warmup_steps=1),
        workdir=str(workdir), progress=False, tensorboard=False, scorer=scorer, tracker=tracker,
    )


def _tracker():
    from jaxrl_vr.selection.tracker import PromptTracker

    return PromptTracker(len(ITEMS), uids=[it.uid for it in ITEMS])


def test_nothing_continues_counts_only_probe_samples(tmp_path):
    # Every probe is all wrong (rate 0) and the band is [0.5, 0.5]: nothing continues, so
    # the step generates P·G_probe = 2·2 = 4 samples, and the tracker sees 4 samples.
    tracker = _tracker()
    trainer = _trainer(tmp_path, _by_prompt_scorer(set()), tracker=tracker,
                       two_stage_lo=0.5, two_stage_hi=0.5)
    calls = []
    original = trainer._sample_round
    trainer._sample_round = lambda *a, **k: calls.append(k.get("num_samples")) or original(*a, **k)
    idx, arrays, valid_pg, stats = trainer._sample_batch()
    assert calls == [G_PROBE]
    assert stats["two_stage/continued_frac"] == 0.0
    assert stats["two_stage/generated_samples"] == P * G_PROBE == 4
    # Every [P, G_full] row: 2 valid probe samples + 2 invalid padding slots.
    assert valid_pg.tolist() == [[True, True, False, False]] * P
    mask_pgt = arrays["mask_bt"].reshape(P, G_FULL, T)
    lengths_pg = arrays["length_b"].reshape(P, G_FULL)
    assert not mask_pgt[:, G_PROBE:].any() and (lengths_pg[:, G_PROBE:] == 0).all()
    # Generated tokens = the probe lengths only (hand check: sum of 4 lengths).
    assert stats["generated_tokens"] == float(lengths_pg[:, :G_PROBE].sum())
    assert arrays["tokens_bt"].shape == (P * G_FULL, T)
    total_n, _ = tracker.totals()
    assert int(total_n.sum()) == P * G_PROBE  # one update, valid samples only
    assert tracker.visits(idx).tolist() == [1] * P  # probe + padding = one visit
    trainer.close()


def test_only_prompts_in_band_continue(tmp_path):
    # Band [0, 0.5]: prompts scored all wrong (rate 0) continue to G_full; prompts scored all
    # correct (rate 1) stop with exactly G_probe valid samples.
    trainer = _trainer(tmp_path, None, two_stage_lo=0.0, two_stage_hi=0.5)
    order = trainer._next_prompt_indices()  # the step's prompts, then rewind the data order
    trainer.data_position = 0
    correct = {ITEMS[int(order[0])].uid}  # prompt row 0 solved, row 1 not
    trainer._scorer = _by_prompt_scorer(correct)
    idx, arrays, valid_pg, stats = trainer._sample_batch()
    assert idx.tolist() == order.tolist()
    assert valid_pg.sum(1).tolist() == [G_PROBE, G_FULL]
    assert stats["two_stage/continued_frac"] == 0.5
    # 2·2 probe samples + 1 continued prompt · (4 − 2) = 6 samples generated.
    assert stats["two_stage/generated_samples"] == 6
    lengths_pg = arrays["length_b"].reshape(P, G_FULL)
    assert stats["generated_tokens"] == float(lengths_pg.sum())
    assert arrays["scores_b"].reshape(P, G_FULL).tolist() == [[1, 1, 0, 0], [0, 0, 0, 0]]
    mask_pg = arrays["mask_bt"].reshape(P, G_FULL, T).any(2)
    assert not mask_pg[0, G_PROBE:].any()  # the stopped prompt's padding carries no token
    trainer.close()


def test_two_stage_run_completes_and_budget_adds_both_stages(tmp_path):
    trainer = _trainer(tmp_path, _by_prompt_scorer({ITEMS[0].uid, ITEMS[1].uid, ITEMS[2].uid}),
                       steps=2, two_stage_lo=0.0, two_stage_hi=0.5)
    rows = trainer.run()
    trainer.close()
    assert len(rows) == 2
    for row in rows:
        assert 0.0 <= row["two_stage/continued_frac"] <= 1.0
        assert np.isfinite(row["loss"])
    assert rows[-1]["budget/generated_tokens"] == pytest.approx(
        sum(r["generated_tokens"] for r in rows)
    )
    assert trainer.data_position == 2 * P


@pytest.mark.slow
def test_two_stage_resume_is_exact(tmp_path):
    scorer = _by_prompt_scorer({ITEMS[0].uid, ITEMS[3].uid})
    straight = _trainer(tmp_path / "a", scorer, steps=2, two_stage_lo=0.0, two_stage_hi=0.5)
    rows_a = straight.run()
    straight.close()
    first = _trainer(tmp_path / "b", scorer, steps=2, two_stage_lo=0.0, two_stage_hi=0.5)
    first.run(stop_after=1)
    first.close()
    resumed = _trainer(tmp_path / "b", scorer, steps=2, two_stage_lo=0.0, two_stage_hi=0.5)
    rows_b = resumed.run()
    resumed.close()
    assert len(rows_b) == 1
    assert rows_b[0]["budget/generated_tokens"] == rows_a[-1]["budget/generated_tokens"]
    assert rows_b[0]["two_stage/continued_frac"] == rows_a[-1]["two_stage/continued_frac"]
    for a, b in zip(jax.tree.leaves(straight.params()), jax.tree.leaves(resumed.params())):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


def test_join_two_stage_places_continuation_rows_and_pads():
    # P = 2, G_probe = 1, G_full = 3; only prompt 1 continues with samples [7, 8].
    probe = {"scores_b": np.array([1.0, 0.5], np.float32), "mask_bt": np.ones((2, 2), bool),
             "prompt_tokens_bs": np.array([[5], [6]])}
    extra = {"scores_b": np.array([0.25, 0.75], np.float32), "mask_bt": np.ones((2, 2), bool),
             "prompt_tokens_bs": np.array([[6], [6]])}
    arrays, valid = join_two_stage(probe, extra, np.array([False, True]), g_probe=1, g_full=3)
    assert valid.tolist() == [[True, False, False], [True, True, True]]
    assert arrays["scores_b"].tolist() == [1.0, 0.0, 0.0, 0.5, 0.25, 0.75]
    assert arrays["mask_bt"].all(1).tolist() == [True, False, False, True, True, True]
    # Padding rows keep the prompt (a real model input).
    assert arrays["prompt_tokens_bs"][:, 0].tolist() == [5, 5, 5, 6, 6, 6]
    with pytest.raises(ValueError, match="continued prompts"):
        join_two_stage(probe, extra, np.array([True, True]), g_probe=1, g_full=3)


def test_two_stage_config_is_validated():
    with pytest.raises(ValueError, match="two_stage_probe"):
        RLConfig(samples_per_prompt=4, two_stage=True, two_stage_probe=5)
    with pytest.raises(ValueError, match="two_stage_lo"):
        RLConfig(two_stage=True, two_stage_lo=0.8, two_stage_hi=0.5)
    with pytest.raises(ValueError, match="exclusive"):
        RLConfig(two_stage=True, dynamic_sampling=True)
    RLConfig(samples_per_prompt=2, two_stage_probe=4)  # ignored while two_stage is off


def test_partial_round_is_padded_to_a_power_of_two_and_trimmed(tmp_path, monkeypatch):
    # 3 of 4 prompts continue: the sampler runs on 4 prompts (one repeated) so the
    # continuation compiles for O(log P) shapes, and only the 3 real prompts come back.
    import jaxrl_vr.sampling

    prompt_batches = []
    real_generate = jaxrl_vr.sampling.generate

    def recording_generate(key, model, prompt_tokens_ps, *args, **kwargs):
        prompt_batches.append(prompt_tokens_ps.shape[0])
        return real_generate(key, model, prompt_tokens_ps, *args, **kwargs)

    monkeypatch.setattr(jaxrl_vr.sampling, "generate", recording_generate)

    rl = RLConfig(
        steps=1, prompts_per_step=4, samples_per_prompt=G_FULL, max_new_tokens=T,
        num_minibatches=2, advantage="grpo", verifier_workers=0, seed=3,
    )
    trainer = RLTrainer(
        lib.tiny_decoder(TOKENIZER.vocab_size), TOKENIZER, ITEMS, rl=rl, loss=LossConfig(),
        optim=OptimConfig(), workdir=str(tmp_path), progress=False, tensorboard=False,
        scorer=_by_prompt_scorer(set()),
    )
    idx, arrays, stats = trainer._sample_round(np.array([0, 1, 2]), num_samples=2, track=False)
    assert prompt_batches == [4]  # padded prompt batch
    assert arrays["tokens_bt"].shape == (3 * 2, T) and arrays["scores_b"].shape == (6,)
    assert stats["generated_tokens"] == float(arrays["length_b"].sum())  # real rows only
    trainer.close()
