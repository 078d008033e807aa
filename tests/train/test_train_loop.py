"""RL loop: exact resume, mid-save kill, NaN stop, verifier failures, metrics rows."""

import json
import os

import chex
import jax
import numpy as np
import pytest

from jaxrl_vr.diagnostics import SUCCESS_BINS
from jaxrl_vr.hooks import Hook
from jaxrl_vr.models.tokenizers import CharTokenizer
from jaxrl_vr.tasks import arithmetic
from jaxrl_vr.train.checkpoint import Checkpointer
from jaxrl_vr.selection.tracker import PromptTracker
from jaxrl_vr.train.config import EstimatorChoice, RLConfig, StrategyChoice, VerifierConfig
from jaxrl_vr.train.methods import AnchorSettings
from jaxrl_vr.train.rollout import VerifierFailure, encode_prompts
from jaxrl_vr.train.update import NonFiniteLossError
from jaxrl_vr.train.metrics import read_jsonl
from jaxrl_vr.train.optim import OptimConfig
from jaxrl_vr.train.step import LossConfig
from jaxrl_vr.verifiers.pool import VerifyResult, score_serial

import trainer_testlib as lib

TOKENIZER = CharTokenizer(arithmetic.ARITHMETIC_ALPHABET)
ITEMS = arithmetic.make_items(0, 6, levels=(0,), split=None)


def _trainer(
    workdir, *, steps=4, scorer=score_serial, advantage="curverl", tracker=None, items=ITEMS,
    kl_beta=0.05, error_patience=3, **rl_overrides,
):
    estimator = (advantage if isinstance(advantage, EstimatorChoice)
                 else EstimatorChoice.of("curverl", window=2) if advantage == "curverl"
                 else EstimatorChoice(advantage))
    rl = RLConfig(
        steps=steps,
        prompts_per_step=2,
        samples_per_prompt=4,
        max_new_tokens=3,
        num_minibatches=2,
        num_epochs=2,
        estimator=estimator,
        verifier=VerifierConfig(workers=0, error_patience=error_patience),
        checkpoint_every=1,
        seed=3,
        **rl_overrides,
    )
    return lib.make_trainer(workdir, TOKENIZER, items, rl=rl,
                            loss=LossConfig(entropy="feedback", kl_beta=kl_beta),
                            optim=OptimConfig(learning_rate=0.05, warmup_steps=1), scorer=scorer,
                            tracker=tracker or _tracker())


def _tracker():
    return PromptTracker(len(ITEMS), uids=[it.uid for it in ITEMS])


@pytest.mark.slow
def test_four_steps_equal_two_plus_resume_plus_two(tmp_path):
    straight_tracker, resumed_tracker = _tracker(), _tracker()
    straight = _trainer(tmp_path / "a", tracker=straight_tracker)
    rows_a = straight.run()
    straight.close()

    first = _trainer(tmp_path / "b", tracker=_tracker())
    first.run(stop_after=2)
    first.close()
    resumed = _trainer(tmp_path / "b", tracker=resumed_tracker)  # fresh objects, state from disk
    rows_b = resumed.run()
    resumed.close()

    assert [r["step"] for r in rows_b] == [3, 4]
    chex.assert_trees_all_equal(resumed.state.train.params, straight.state.train.params)
    chex.assert_trees_all_equal(resumed.state.estimator, straight.state.estimator)
    chex.assert_trees_all_equal(resumed.state.train.controller, straight.state.train.controller)
    assert resumed.parts.source.position == straight.parts.source.position == 8
    chex.assert_trees_all_equal(resumed_tracker.state_dict(), straight_tracker.state_dict())
    assert resumed_tracker.state_dict()["total_n_p"].sum() == 4 * 2 * 4  # 4 steps × P·G
    for key in ("reward", "loss", "kl", "grad_norm"):
        assert rows_b[-1][key] == rows_a[-1][key]
    # metrics.jsonl of the resumed run holds each step once, in order.
    steps = [r["step"] for r in read_jsonl(os.path.join(tmp_path / "b", "metrics.jsonl"))]
    assert steps == [1, 2, 3, 4]
    row = rows_a[-1]
    for key in (
        "reward",
        "pass_rate",
        "adv_mean",
        "adv_std",
        "valid_group_frac",
        "clip_frac_low",
        "clip_frac_high",
        "clip_frac_dual",
        "clip_frac_outer",
        "kl",
        "entropy",
        "grad_norm",
        "response_length",
        "truncation_rate",
        "logp_gap_sampler_trainer",
        "generated_tokens",
        "trained_tokens",
        "time_sample_s",
        "time_verify_s",
        "time_update_s",
        "budget/generated_tokens",
        "estimator/window_fill",
        "tracker/frac_seen",
        "prompt_weights/ess",
        "prompt_weights/prompts",
        "one_positive_frac",
        "prompt_dist/observed/0",
        "prompt_dist/tracked/0.75-1",
    ):
        assert key in row and np.isfinite(row[key]), key
    # The batch's P = 2 prompts: their success bins sum to 1, their weights' ESS is at most 2.
    for source in ("observed", "tracked"):
        assert sum(row[f"prompt_dist/{source}/{b}"] for b in SUCCESS_BINS) == pytest.approx(1.0)
    assert 0.0 <= row["prompt_weights/ess"] <= row["prompt_weights/prompts"] <= 2
    # 2 epochs × 2 minibatches: each token is trained on twice.
    assert row["trained_tokens"] == 2 * row["generated_tokens"]
    assert row["optimizer_steps"] == 4


def test_incomplete_checkpoint_is_ignored(tmp_path):
    ckpt = Checkpointer(tmp_path, max_to_keep=3)
    state = {"w": np.arange(3, dtype=np.float32), "k": jax.random.key_data(jax.random.key(1))}
    ckpt.save(1, state, {"data_position": 7})
    ckpt.close()
    # What a process killed mid-save leaves: a temporary step directory, never renamed.
    partial = tmp_path / "2.orbax-checkpoint-tmp-1234" / "state"
    partial.mkdir(parents=True)
    (partial / "garbage").write_bytes(b"\x00" * 10)
    again = Checkpointer(tmp_path)
    assert again.latest_step() == 1
    restored, host, step = again.restore(state)
    assert step == 1 and host == {"data_position": 7}
    np.testing.assert_array_equal(restored["w"], state["w"])
    with pytest.raises(ValueError, match="expects"):
        again.restore({"w": np.zeros(4, np.float32), "k": state["k"]})


def _nan_scorer(items, completions):
    return VerifyResult(
        scores=np.full(len(items), np.nan, np.float32),
        statuses=["ok"] * len(items),
        errors=[None] * len(items),
    )


def test_nan_loss_stops_run_and_saves_offending_step(tmp_path):
    # Raw rewards as advantages: the NaN scores reach the loss (a group baseline would zero them).
    trainer = _trainer(tmp_path, scorer=_nan_scorer, advantage=EstimatorChoice.of("reinforce", baseline="none"))
    with pytest.raises(NonFiniteLossError, match="nonfinite_step_0"):
        trainer.run()
    trainer.close()
    saved = tmp_path / "nonfinite_step_0"
    assert saved.is_dir() and Checkpointer(saved).latest_step() == 0


def test_verifier_crash_scores_zero_and_is_counted(tmp_path):
    from jaxrl_vr.verifiers import register_verifier

    register_verifier("test_crashing_verifier", _crashing_verifier, overwrite=True)
    from jaxrl_vr.tasks import TaskItem

    items = [
        TaskItem(
            uid=f"c{i}", prompt=f"{i}+1=", answer=str(i + 1), verifier="test_crashing_verifier"
        )
        for i in range(2)
    ]
    trainer = _trainer(tmp_path, steps=1, scorer=None, items=items, advantage="grpo")
    rows = trainer.run()
    trainer.close()
    assert rows[0]["verifier_errors"] == 8 and rows[0]["reward"] == 0.0
    assert trainer.budget.verifier_errors == 8
    # The first errors of the step are written down with their type, message and item.
    with open(tmp_path / "verifier_errors.jsonl") as f:
        logged = [json.loads(line) for line in f]
    assert 1 <= len(logged) <= 5 and logged[0]["step"] == 0
    assert logged[0]["type"] == "RuntimeError" and "boom" in logged[0]["message"]
    assert logged[0]["item_id"] in {"c0", "c1"}


def test_a_verifier_failing_every_sample_stops_the_run_after_patience_steps(tmp_path):
    from jaxrl_vr.verifiers import register_verifier
    from jaxrl_vr.tasks import TaskItem

    register_verifier("test_crashing_verifier", _crashing_verifier, overwrite=True)
    items = [TaskItem(uid=f"c{i}", prompt=f"{i}+1=", answer=str(i + 1),
                      verifier="test_crashing_verifier") for i in range(2)]
    trainer = _trainer(tmp_path, steps=5, scorer=None, items=items, advantage="grpo",
                       error_patience=2)
    with pytest.raises(VerifierFailure, match="2 steps in a row"):
        trainer.run()
    trainer.close()
    assert Checkpointer(tmp_path / "checkpoints").latest_step() == 2  # nothing written is lost


def _crashing_verifier(item, completion):
    raise RuntimeError("boom")


def test_encode_prompts_left_pads_with_bos():
    tokens, mask = encode_prompts(TOKENIZER, ["1+2=", "10+2="], 7)
    assert mask.tolist() == [[False, False] + [True] * 5, [False] + [True] * 6]
    assert tokens[0, 2] == TOKENIZER.bos_id and tokens[0, 0] == TOKENIZER.pad_id
    with pytest.raises(ValueError, match="prompt width"):
        encode_prompts(TOKENIZER, ["123+456="], 4)


def _parity_scorer(items, completions):
    """Reward = 1 for even-length completions: arbitrary but varied, so the policy moves."""
    scores = np.asarray([float(len(c) % 2 == 0) for c in completions], np.float32)
    return VerifyResult(scores=scores, statuses=["ok"] * len(items), errors=[None] * len(items))


@pytest.mark.parametrize("polarity,expected", [("above", 1.0), ("below", 0.0)])
def test_pba_anchor_weights_the_kl_of_anchored_prompts_by_lambda(tmp_path, polarity, expected):
    tracker = _tracker()
    tracker.set_base_counts(np.full(len(ITEMS), 4), np.full(len(ITEMS), 3))  # p_base = 0.75
    tracker.freeze_base()
    trainer = _trainer(tmp_path, steps=2, tracker=tracker, kl_beta=0.0, scorer=_parity_scorer,
                       anchor=AnchorSettings(polarity=polarity, weight=0.7, tau_low=0.5, tau_high=1.0))
    rows = trainer.run()
    trainer.close()
    assert rows[-1]["anchored_frac"] == expected
    # The KL to the base is logged over all tokens whether or not it is in the loss; the
    # loss's KL term is λ_PBA times it when every prompt is anchored (β = 0), else 0.
    assert rows[-1]["kl"] > 0
    np.testing.assert_allclose(rows[-1]["kl_loss"], 0.7 * expected * rows[-1]["kl"], rtol=1e-4)


def test_dynamic_sampling_keeps_only_informative_groups(tmp_path):
    trainer = _trainer(tmp_path, steps=2, advantage="grpo", scorer=_parity_scorer,
                       batch_strategy=StrategyChoice.of("dynamic", max_rounds=3))
    rows = trainer.run()
    trainer.close()
    for row in rows:
        assert 1 <= row["dynamic/rounds"] <= 3
        # Every real group of the trained batch has differing rewards; padding groups
        # (budget spent) are invalid and carry no tokens.
        kept = row["valid_group_frac"] * 2
        assert kept == round(kept) and row["all_correct_frac"] == row["all_wrong_frac"] == 0
        assert row["trained_tokens"] <= 2 * row["generated_tokens"]
    assert trainer.parts.source.position == 2 * sum(int(r["dynamic/rounds"]) for r in rows)
    # The logged reward covers every sampled group; the kept-only value has its own name.
    for row in rows:
        assert "kept/reward" in row and 0.0 <= row["reward"] <= 1.0


class _Recorder(Hook):
    """A method the driver knows nothing about: it weights the KL of even prompts, counts
    what it sees, and checkpoints its count."""

    state_key = "recorder"
    sets_kl_weights = True

    def __init__(self):
        self.calls, self.seen = [], 0

    def begin_step(self, step):
        self.calls.append(("begin", step))

    def observe(self, sampled):
        self.calls.append(("observe", int(sampled.valid_pg.sum())))
        self.seen += int(sampled.valid_pg.sum())

    def annotate(self, batch):
        self.calls.append(("annotate", batch.num_prompts))
        return batch._replace(kl_weight_p=np.where(batch.prompt_idx_p % 2 == 0, 0.5, 0.0).astype(np.float32))

    def metrics(self, batch):
        return {"recorder/seen": float(self.seen)}

    def after_step(self, step):
        self.calls.append(("after", step))

    def state_dict(self):
        return {"seen": np.asarray(self.seen)}

    def load_state_dict(self, state):
        self.seen = int(np.asarray(state["seen"]))


def test_a_hook_is_called_at_every_point_and_its_state_resumes(tmp_path):
    rl = RLConfig(steps=2, prompts_per_step=2, samples_per_prompt=4, max_new_tokens=3,
                  verifier=VerifierConfig(workers=0), checkpoint_every=1, seed=3)
    recorder = _Recorder()
    trainer = lib.make_trainer(tmp_path, TOKENIZER, ITEMS, rl=rl, scorer=_parity_scorer, hooks=(recorder,),
                               optim=OptimConfig(learning_rate=0.05))
    rows = trainer.run(stop_after=1)
    trainer.close()
    assert recorder.calls == [("begin", 0), ("observe", 8), ("annotate", 2), ("after", 1)]
    assert rows[0]["recorder/seen"] == 8.0
    assert trainer.parts.loss_structure.use_kl  # its per-prompt KL weights put the KL term in the loss
    again = _Recorder()
    resumed = lib.make_trainer(tmp_path, TOKENIZER, ITEMS, rl=rl, scorer=_parity_scorer, hooks=(again,),
                               optim=OptimConfig(learning_rate=0.05))
    rows = resumed.run()
    resumed.close()
    assert [r["step"] for r in rows] == [2] and rows[0]["recorder/seen"] == 16.0  # 8 restored + 8


@pytest.mark.parametrize("detach_behaviour", [False, True])
def test_sampler_logprobs_are_the_trainers_at_temperature_below_one(tmp_path, detach_behaviour):
    """At T = 0.7 the sampler records log softmax(z / T), what the trainer scores: before the
    first update (the learning rate does not enter) the logged gap and, with the sampler's
    log-probs as the reference (no reference forward, no KL in the loss), the logged KL are
    float noise. With the untempered log-probs both were ~0.1 nats."""
    rl = RLConfig(steps=1, prompts_per_step=2, samples_per_prompt=4, max_new_tokens=4, temperature=0.7,
                  log_reference_kl=False, verifier=VerifierConfig(workers=0), seed=1)
    trainer = lib.make_trainer(tmp_path, TOKENIZER, ITEMS, rl=rl,
                               loss=LossConfig(detach_behaviour=detach_behaviour),
                               optim=OptimConfig(learning_rate=1e-12), tracker=_tracker())
    (row,) = trainer.run()
    trainer.close()
    assert abs(row["kl"]) < 1e-5, row["kl"]
    if not detach_behaviour:
        assert abs(row["logp_gap_sampler_trainer"]) < 1e-5 and row["logp_gap_abs_max"] < 1e-4, row


def test_a_resumed_run_says_from_which_step(tmp_path):
    rl = RLConfig(steps=2, prompts_per_step=2, samples_per_prompt=2, max_new_tokens=2, num_minibatches=1,
                  verifier=VerifierConfig(workers=0), checkpoint_every=1)
    first = lib.make_trainer(tmp_path, TOKENIZER, ITEMS, rl=rl, tracker=_tracker())
    lines = []
    first.log = lines.append
    first.run(stop_after=1)
    first.close()
    assert lines == []  # a fresh start says nothing
    resumed = lib.make_trainer(tmp_path, TOKENIZER, ITEMS, rl=rl, tracker=_tracker())
    resumed.log = lines.append
    assert [row["step"] for row in resumed.run()] == [2]
    resumed.close()
    assert lines == [f"[rl] resuming after step 1 of 2 from {tmp_path / 'checkpoints'}"], lines


def test_evaluation_progress_without_a_terminal_has_no_carriage_returns(capsys):
    from jaxrl_vr.train.evaluate import eval_layout, evaluate_policy

    items = ITEMS[:4]
    result = evaluate_policy(lib.tiny_decoder(TOKENIZER.vocab_size), TOKENIZER, items, num_samples=2,
                             max_new_tokens=2, key=jax.random.key(0), layout=eval_layout(4, 2, responses_per_call=4),
                             progress=True, desc="final")
    assert result.stats is not None
    err = capsys.readouterr().err  # pytest's capture is not a TTY, like a log file
    assert "\r" not in err and "final chunk 2/2 (100%)" in err, err


@pytest.mark.parametrize("kl_beta,log_reference_kl,holds", [(0.0, False, False), (0.05, False, True),
                                                            (0.0, True, True)])
def test_the_parts_hold_the_base_params_only_when_a_kl_reads_them(tmp_path, kl_beta, log_reference_kl, holds):
    """Without a reference KL (in the loss or logged) nothing built for RL keeps the caller's
    params alive, so the pipeline frees the base model before the first update (issue 41's
    memory: -540 MB on SmolLM2-135M in float32)."""
    import gc
    import weakref

    from flax import nnx

    model = lib.tiny_decoder(TOKENIZER.vocab_size)
    base_leaf = weakref.ref(jax.tree.leaves(nnx.state(model, nnx.Param))[0])
    rl = RLConfig(steps=1, prompts_per_step=2, samples_per_prompt=2, max_new_tokens=3,
                  verifier=VerifierConfig(workers=0), log_reference_kl=log_reference_kl)
    trainer = lib.make_trainer(tmp_path, TOKENIZER, ITEMS, rl=rl, loss=LossConfig(kl_beta=kl_beta),
                               model=model, scorer=score_serial)
    del model
    gc.collect()
    assert (base_leaf() is not None) == holds
    assert trainer.state.train.params is not None  # the trainer's own copy
