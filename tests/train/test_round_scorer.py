"""RoundScorer keeps the verifiers' per-test results: per sample in Scores, summed in the stats."""

import numpy as np

from jaxrl_vr.models.tokenizers import CharTokenizer
from jaxrl_vr.tasks.base import TaskItem
from jaxrl_vr.train.rollout import RoundScorer
from jaxrl_vr.verifiers.pool import VerifyResult


def test_round_scorer_keeps_tests_passed_per_sample_and_their_mean_fraction():
    tokenizer = CharTokenizer("0123456789")
    items = [TaskItem(uid=str(i), prompt="1", answer="1") for i in range(2)]

    def scorer(items_b, completions):
        return VerifyResult(scores=np.array([1.0, 0.0, 0.0], np.float32), statuses=["ok", "wrong", "wrong"],
                            errors=[None] * 3, test_passed=[(True, True), (True, False, False, False), None])

    scores = RoundScorer(items, tokenizer, scorer)(np.array([0, 1, 1]), ["1", "2", "3"], np.zeros(3, bool))
    assert scores.tests_passed_b.tolist() == [2, 1, 0] and scores.tests_total_b.tolist() == [2, 4, 0]
    assert scores.stats.tested_samples == 2 and np.isclose(scores.stats.test_frac_sum, 1.25)


def test_round_scorer_counts_truncation_as_a_hack_only_under_the_hard_rule():
    tokenizer = CharTokenizer("0123456789")
    items = [TaskItem(uid="0", prompt="1+1=", answer="2")]

    def scorer(items_b, completions):
        return VerifyResult(scores=np.ones(len(completions), np.float32), statuses=["ok"] * len(completions),
                            errors=[None] * len(completions))

    truncated = np.array([True, False])
    soft = RoundScorer(items, tokenizer, scorer, hack_detectors=("empty_or_truncated",))
    assert soft(np.array([0, 0]), ["2", "2"], truncated).hack_b.tolist() == [0.0, 0.0]
    hard = RoundScorer(items, tokenizer, scorer, hack_detectors=("empty_or_truncated",), truncation_is_hack=True)
    assert hard(np.array([0, 0]), ["2", "2"], truncated).hack_b.tolist() == [1.0, 0.0]
