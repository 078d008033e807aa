"""Scripted rounds for tests of batch strategies and the batch builder: no model."""

import numpy as np

from jaxrl_vr.trajectory import RolloutStats, Trajectory

T, S = 3, 2


def scripted(outcome_fn):
    """``sample_round`` whose sample g of prompt p scores outcome_fn(p, g, call) (0 or 1);
    ``.calls`` lists (prompt indices, num_samples) of every call."""
    calls = []

    def sample_round(prompt_idx, num_samples):
        idx = np.asarray(prompt_idx, np.int64)
        call = len(calls)
        calls.append((idx.tolist(), int(num_samples)))
        num_b = len(idx) * num_samples
        scores = np.asarray([outcome_fn(int(p), g, call) for p in idx for g in range(num_samples)],
                            np.float32)
        length_b = np.full(num_b, 2, np.int32)
        return Trajectory.single_turn(
            prompt_idx_p=idx,
            prompt_tokens_ps=np.repeat(idx[:, None], S, axis=1).astype(np.int32),
            prompt_mask_ps=np.ones((len(idx), S), bool),
            tokens_bt=np.repeat(np.repeat(idx, num_samples)[:, None], T, axis=1).astype(np.int32),
            mask_bt=np.arange(T)[None, :] < length_b[:, None],
            sampler_logp_bt=np.full((num_b, T), -0.5, np.float32),
            length_b=length_b,
            truncated_b=np.zeros(num_b, bool),
            scores_b=scores,
            rewards_b=scores - 0.1,  # shaped rewards differ from scores
            overlong_b=np.full(num_b, -0.1, np.float32),
            stats=RolloutStats(generated_tokens=float(length_b.sum()), generated_samples=float(num_b),
                               rounds=1),
        )

    sample_round.calls = calls
    return sample_round
