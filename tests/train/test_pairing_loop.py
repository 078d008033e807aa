"""Positive–negative pairing as the RL loop's prompt choice (arXiv 2602.03452; SPEC §3.3)."""

import numpy as np
import pytest

from jaxrl_vr.models.tokenizers import CharTokenizer
from jaxrl_vr.selection.tracker import PromptTracker
from jaxrl_vr.tasks import arithmetic
from jaxrl_vr.train.loop import RLConfig, RLTrainer
from jaxrl_vr.train.optim import OptimConfig
from jaxrl_vr.train.step import LossConfig
from jaxrl_vr.verifiers.pool import score_serial

import trainer_testlib as lib

TOKENIZER = CharTokenizer(arithmetic.ARITHMETIC_ALPHABET)
ITEMS = arithmetic.make_items(0, 6, levels=(0,), split=None)


def _tracker():
    return PromptTracker(len(ITEMS), uids=[it.uid for it in ITEMS])


def _trainer(workdir, tracker, *, steps=1, **overrides):
    rl = RLConfig(
        steps=steps, prompts_per_step=2, samples_per_prompt=4, max_new_tokens=3,
        num_minibatches=1, advantage="grpo", verifier_workers=0, checkpoint_every=1, seed=3,
        pairing=True, pairing_min_count=4, **overrides,
    )
    return RLTrainer(
        lib.tiny_decoder(TOKENIZER.vocab_size), TOKENIZER, ITEMS, rl=rl, loss=LossConfig(),
        optim=OptimConfig(learning_rate=0.05, warmup_steps=1), workdir=str(workdir),
        progress=False, tensorboard=False, scorer=score_serial, tracker=tracker,
    )


def _seeded_tracker():
    # G = 4, c = 2: q⁻ band [1 − 2/4, 1 − 1/4] = [0.5, 0.75]; q⁺ band (0, 0.25].
    # Prompt 4: 1/4 = 0.25 → q⁺ (only one). Prompt 2: 3/4 = 0.75 → q⁻ (only one).
    # Prompt 0: 4/4 = 1 and prompt 1: 0/4 = 0 are in neither pool.
    tracker = _tracker()
    rewards = np.array([[1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]], np.float32)
    tracker.update(np.array([0, 1, 2, 4]), rewards)
    return tracker


def test_pairs_replace_the_data_order_when_both_pools_exist(tmp_path):
    trainer = _trainer(tmp_path, _seeded_tracker())
    idx, paired = trainer._choose_prompts()
    assert paired and idx.tolist() == [4, 2]  # [q⁺, q⁻]
    assert trainer.data_position == 0  # the data order is not consumed
    trainer.close()


def test_empty_pool_falls_back_to_the_data_order(tmp_path):
    tracker = _tracker()
    tracker.update(np.array([0, 4]), np.array([[1, 1, 1, 1], [1, 0, 0, 0]], np.float32))  # no q⁻
    trainer = _trainer(tmp_path, tracker)
    expected = np.random.default_rng([3, 0]).permutation(len(ITEMS))[:2]
    idx, paired = trainer._choose_prompts()
    assert not paired and idx.tolist() == expected.tolist()
    assert trainer.data_position == 2
    trainer.close()


def test_paired_run_completes_and_logs_paired_rounds(tmp_path):
    trainer = _trainer(tmp_path, _seeded_tracker(), steps=1)
    rows = trainer.run()
    trainer.close()
    assert rows[0]["pairing/paired_rounds"] == 1.0
    assert trainer.data_position == 0
    assert np.isfinite(rows[0]["loss"])


def test_pairing_config_is_validated(tmp_path):
    with pytest.raises(ValueError, match="even"):
        RLConfig(prompts_per_step=3, pairing=True)
    with pytest.raises(ValueError, match="pairing_strategy"):
        RLConfig(prompts_per_step=2, pairing=True, pairing_strategy="best")
    with pytest.raises(ValueError, match="PromptTracker"):
        _trainer(tmp_path, None)
