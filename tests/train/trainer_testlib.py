"""Shared tiny builders for the trainer tests (imported by test modules in this folder)."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_vr.models.config import DecoderConfig
from jaxrl_vr.models.decoder import Decoder
from jaxrl_vr.train import step as step_lib


def tiny_decoder(vocab_size: int = 12, seed: int = 0) -> Decoder:
    cfg = DecoderConfig.tiny(
        vocab_size,
        hidden_size=16,
        intermediate_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=2,
        head_dim=8,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return Decoder(cfg, rngs=nnx.Rngs(seed))


def random_batch(
    seed: int = 0, *, batch: int = 8, prompt_len: int = 4, resp_len: int = 5, vocab: int = 12
) -> step_lib.RolloutBatch:
    rng = np.random.default_rng(seed)
    left_pad = rng.integers(0, prompt_len - 1, (batch, 1))
    lengths = rng.integers(1, resp_len + 1, (batch, 1))
    mask_bt = np.arange(resp_len)[None] < lengths
    mask_bt[0] = False  # one empty response: must contribute nothing
    return step_lib.RolloutBatch(
        prompt_tokens_bs=jnp.asarray(rng.integers(3, vocab, (batch, prompt_len)), jnp.int32),
        prompt_mask_bs=jnp.asarray(np.arange(prompt_len)[None] >= left_pad),
        tokens_bt=jnp.asarray(rng.integers(3, vocab, (batch, resp_len)), jnp.int32),
        mask_bt=jnp.asarray(mask_bt),
        loss_mask_bt=jnp.asarray(mask_bt),
        adv_bt=jnp.asarray(np.broadcast_to(rng.normal(size=(batch, 1)), (batch, resp_len)), jnp.float32),
        behaviour_logp_bt=jnp.asarray(
            -np.log(vocab) + 0.3 * rng.normal(size=(batch, resp_len)), jnp.float32
        ),
        reference_logp_bt=jnp.asarray(
            -np.log(vocab) + 0.3 * rng.normal(size=(batch, resp_len)), jnp.float32
        ),
        kl_weight_b=jnp.asarray(0.5 * (rng.random(batch) < 0.7), jnp.float32),
    )


class CausalBagModel(nnx.Module):
    """A cheap causal policy for step-mechanics tests (compiles in a fraction of a Decoder).

    hidden_t = tanh(W · mean_{s<=t, mask} embed(token_s)); logits = hidden @ U.
    """

    def __init__(self, vocab_size: int = 12, width: int = 8, seed: int = 0):
        k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
        self.embed = nnx.Param(jax.random.normal(k1, (vocab_size, width)))
        self.dense = nnx.Param(jax.random.normal(k2, (width, width)) / np.sqrt(width))
        self.unembed = nnx.Param(jax.random.normal(k3, (width, vocab_size)) / np.sqrt(width))

    def hidden_states(self, tokens_bt, *, positions_bt=None, mask_bt=None):
        del positions_bt
        if mask_bt is None:
            mask_bt = jnp.ones(tokens_bt.shape, bool)
        x_btd = jnp.take(self.embed[...], tokens_bt, axis=0) * mask_bt[:, :, None]
        count_bt = jnp.maximum(jnp.cumsum(mask_bt, axis=1), 1).astype(jnp.float32)
        mean_btd = jnp.cumsum(x_btd, axis=1) / count_bt[:, :, None]
        return jnp.tanh(jnp.einsum("btd,de->bte", mean_btd, self.dense[...]))

    def unembed_matrix(self):
        return self.unembed[...]


def make_trainer(workdir, tokenizer, items, *, rl, loss=None, optim=None, model=None, scorer=None,
                 tracker=None, mesh=None, reference_params=None, chat=False, seed=0, hooks=()):
    """An RLTrainer over ``build_parts`` of a PipelineConfig with these sections (no progress
    bar, no TensorBoard)."""
    from jaxrl_vr.train.config import ModelConfig, PipelineConfig, RunConfig
    from jaxrl_vr.train.loop import RLTrainer
    from jaxrl_vr.train.optim import OptimConfig
    from jaxrl_vr.train.parts import build_parts
    from jaxrl_vr.train.step import LossConfig

    cfg = PipelineConfig(seed=seed, rl=rl, loss=loss or LossConfig(), optim=optim or OptimConfig(),
                         model=ModelConfig(chat=chat), run=RunConfig(progress=False, tensorboard=False))
    model = tiny_decoder(tokenizer.vocab_size) if model is None else model
    return RLTrainer(build_parts(cfg, model, tokenizer, items, str(workdir), scorer=scorer,
                                 tracker=tracker, mesh=mesh, reference_params=reference_params, hooks=hooks))
