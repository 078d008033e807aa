"""Positive–negative pairing and Weighted GRPO through the RL loop (arXiv 2602.03452)."""

import numpy as np
import pytest

from jaxrl_vr.models.tokenizers import CharTokenizer
from jaxrl_vr.selection.tracker import PromptTracker
from jaxrl_vr.tasks import arithmetic
from jaxrl_vr.train.config import EstimatorChoice, RLConfig, VerifierConfig
from jaxrl_vr.train.methods import PairingSettings
from jaxrl_vr.train.optim import OptimConfig
from jaxrl_vr.train.step import LossConfig
from jaxrl_vr.verifiers.pool import VerifyResult

import trainer_testlib as lib

TOKENIZER = CharTokenizer(arithmetic.ARITHMETIC_ALPHABET)
ITEMS = arithmetic.make_items(0, 12, levels=(0,), split=None)
G = 4


def _rate_scorer(rate_by_uid):
    """Deterministic scores: sample i of a group succeeds iff i < rate·G (fixed pass rates)."""
    counter = {}

    def score(items, completions):
        out = []
        for it in items:
            i = counter.get(it.uid, 0)
            counter[it.uid] = i + 1
            out.append(float(i % G < rate_by_uid[it.uid] * G))
        return VerifyResult(scores=np.asarray(out, np.float32), statuses=["ok"] * len(items),
                            errors=[None] * len(items))

    return score


def _calibrated_tracker(rates):
    tracker = PromptTracker(len(ITEMS), uids=[it.uid for it in ITEMS])
    tracker.set_calibration_counts(np.full(len(ITEMS), 8), np.round(np.asarray(rates) * 8))
    return tracker


def _trainer(workdir, tracker, scorer, *, steps=2, advantage="pair_weighted", explore_frac=0.0,
             neg_weight=2.0, **pairing):
    estimator = (EstimatorChoice.of("pair_weighted", neg_weight=neg_weight)
                 if advantage == "pair_weighted" else EstimatorChoice(advantage))
    rl = RLConfig(steps=steps, prompts_per_step=4, samples_per_prompt=G, max_new_tokens=3,
                  num_minibatches=1, estimator=estimator, verifier=VerifierConfig(workers=0),
                  checkpoint_every=1, seed=3,
                  pairing=PairingSettings(min_count=4, explore_frac=explore_frac, **pairing))
    return lib.make_trainer(workdir, TOKENIZER, ITEMS, rl=rl, loss=LossConfig(),
                            optim=OptimConfig(learning_rate=0.05, warmup_steps=1), scorer=scorer,
                            tracker=tracker)


# G = 4, c = 2: q− band [0.5, 0.75]; q+ band (0, 0.25]. Prompts 0-3 are q+ (0.25), 4-7 q−
# (0.75), 8-11 always solved (in no pool).
RATES = [0.25] * 4 + [0.75] * 4 + [1.0] * 4


def test_pairs_come_from_the_calibrated_pool_and_the_data_order_advances(tmp_path):
    scorer = _rate_scorer({it.uid: r for it, r in zip(ITEMS, RATES)})
    trainer = _trainer(tmp_path, _calibrated_tracker(RATES), scorer, explore_frac=0.5)
    source = trainer.parts.source
    source.begin_step(0)
    idx = source.next_prompts(4)
    assert source.is_pair_p.tolist() == [True, True, False, False]  # half explores the data order
    assert RATES[idx[0]] == 0.25 and RATES[idx[1]] == 0.75
    assert len(set(idx.tolist())) == 4
    rows = trainer.run()
    trainer.close()
    assert rows[-1]["pairing/pairs"] == 1.0 and np.isfinite(rows[-1]["loss"])
    assert trainer.parts.source.position > 0  # the data order keeps moving under pairing


def test_weighted_grpo_lambda_changes_the_q_minus_advantages(tmp_path):
    scorer = _rate_scorer({it.uid: r for it, r in zip(ITEMS, RATES)})
    advs = []
    for lam in (1.0, 3.0):
        trainer = _trainer(tmp_path / str(lam), _calibrated_tracker(RATES), scorer, steps=1,
                           neg_weight=lam)
        batch = trainer.collect(0).batch
        trainer.close()
        assert batch.paired_p.tolist() == [True] * 4
        advs.append(np.asarray(batch.adv_bt)[:, 0].reshape(4, G))
    np.testing.assert_allclose(advs[0][0::2], advs[1][0::2], atol=1e-6)  # q+ rows: weight 1
    np.testing.assert_allclose(3.0 * advs[0][1::2], advs[1][1::2], rtol=1e-5)  # q− rows ∝ λ
    assert np.abs(advs[0][1::2]).max() > 0


def test_pairing_state_resumes_with_the_data_position(tmp_path):
    scorer = _rate_scorer({it.uid: r for it, r in zip(ITEMS, RATES)})
    trainer = _trainer(tmp_path, _calibrated_tracker(RATES), scorer, steps=1,
                       advantage="grpo", explore_frac=0.5)
    trainer.run()
    trainer.close()
    again = _trainer(tmp_path, _calibrated_tracker(RATES), scorer, steps=1, advantage="grpo",
                     explore_frac=0.5)
    assert again.restore() == 1 and again.parts.source.position == trainer.parts.source.position > 0
    again.close()


def test_pairing_that_can_form_no_pair_is_a_config_error_naming_the_fix():
    # P = 2 with explore_frac = 0.25: ceil(0.5) = 1 data-order row leaves 1 row, max_pairs = 0:
    # the run would be plain GRPO with pairing/pairs reading 0.
    from jaxrl_vr.train.config import PipelineConfig, validate

    def cfg(**rl):
        return PipelineConfig.from_dict({"rl": {"samples_per_prompt": G, **rl}})

    with pytest.raises(ValueError, match=r"selects no prompt.*prompts_per_step to >= 4.*explore_frac to <= 0"):
        validate(cfg(prompts_per_step=2, pairing={}, estimator="pair_weighted"))
    validate(cfg(prompts_per_step=2, pairing={"explore_frac": 0.0}, estimator="pair_weighted"))
    validate(cfg(prompts_per_step=4, pairing={}, estimator="pair_weighted"))
    # The fixed tiny set does not read the data order; the variance baseline forms no pairs.
    validate(cfg(prompts_per_step=2, pairing={"fixed_prompts": 2}, estimator="pair_weighted"))
    validate(cfg(prompts_per_step=4, pairing={"select": "variance", "fixed_prompts": 2}))
    with pytest.raises(ValueError, match="multiple"):
        validate(cfg(prompts_per_step=6, pairing={"fixed_prompts": 4}))
    with pytest.raises(ValueError, match="rl.estimator=grpo"):
        validate(cfg(prompts_per_step=4, pairing={"select": "variance"}, estimator="pair_weighted"))
    validate(cfg(prompts_per_step=4, pairing={"select": "random_pairs"},
                 estimator={"name": "pair_weighted", "neg_weight": 2.0}))
    # Random pairs change nothing unless Weighted GRPO reads them with non-unit weights.
    with pytest.raises(ValueError, match="only Weighted GRPO reads"):
        validate(cfg(prompts_per_step=4, pairing={"select": "random_pairs"}))
    with pytest.raises(ValueError, match="neg_weight"):
        validate(cfg(prompts_per_step=4, pairing={"select": "random_pairs"}, estimator="pair_weighted"))
    with pytest.raises(ValueError, match="even"):
        validate(cfg(prompts_per_step=4, pairing={"select": "random_pairs", "fixed_prompts": 1}))


def test_fixed_pair_trains_on_the_same_prompts_every_step(tmp_path):
    scorer = _rate_scorer({it.uid: r for it, r in zip(ITEMS, RATES)})
    trainer = _trainer(tmp_path, _calibrated_tracker(RATES), scorer, steps=2, fixed_prompts=2)
    batches = [trainer.collect(step).batch for step in range(2)]
    trainer.close()
    first = batches[0].prompt_idx_p.tolist()
    assert RATES[first[0]] == 0.25 and RATES[first[1]] == 0.75 and first == first[:2] * 2
    assert batches[1].prompt_idx_p.tolist() == first
    assert batches[1].paired_p.tolist() == [True] * 4
