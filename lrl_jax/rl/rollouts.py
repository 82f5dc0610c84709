"""From task prompts to a scored `Rollout`: the loop's prompt encoding, generation settings and reward scoring.

Shared by the RL steps, evaluation and the recovery phase, so that all of them sample as the config says.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from lrl_jax.rollout import Rollout
from lrl_jax.sampler import generate
from lrl_jax.sampler.sharding import batch_axis_size

__all__ = ["encode_prompt_batch", "generate_rollout", "score_rollout"]


def encode_prompt_batch(task, prompts) -> tuple[np.ndarray, np.ndarray]:
  """Left-padded (tokens [B, P], valid [B, P]); P = the task's fixed prompt length, else the longest rounded
  up to a multiple of 16 (few distinct shapes under jit)."""
  tok, val = task.encode_prompts(prompts)
  if task.max_prompt_len is None:
    P = tok.shape[1]
    extra = -P % 16
    if extra:
      tok = np.pad(tok, ((0, 0), (extra, 0)), constant_values=task.encoder.pad_id)
      val = np.pad(val, ((0, 0), (extra, 0)), constant_values=False)
  return tok, val


def generate_rollout(served, tokens, valid, setup, cfg, key, *, evaluation: bool, lora=None, group_size=1) -> Rollout:
  """`group_size` completions of each prompt row by the sampler on `served` weights (a `rl.setup.Setup`'s model and
  task, the config's sampler section: rollout or evaluation temperature, slots, FP8 activations, LoRA adapters)."""
  enc = setup.task.encoder
  sampling = cfg.sampler.sampling(eos_id=enc.eos_id, pad_id=enc.pad_id, evaluation=evaluation)
  slots = cfg.sampler.slots
  if not slots:  # the rollout engine with a slot per completion, rounded up to fill the sampler mesh's batch axis
    d, _ = batch_axis_size(served)
    slots = -(-len(tokens) * group_size // d) * d
  return generate(
    served,
    jnp.asarray(tokens),
    jnp.asarray(valid),
    setup.sampler_cfg,
    sampling,
    key,
    group_size=group_size,
    slots=slots,
    cache_dtype=setup.sampler_cfg.dtype,
    act_spec=cfg.quant.act_spec,
    lora=lora,
  )


def score_rollout(task, rollout: Rollout, prompt_len: int, refs, cfg, pool=None):
  """(rewards f32 [B] on the host, stats): the completions are decoded to text, so this runs on the host; in the
  reward worker processes of `pool` (`tasks.RewardPool`) when given, else in threads (`task.score`)."""
  tokens = np.asarray(rollout.tokens)[:, prompt_len:]
  mask = np.asarray(rollout.loss_mask)[:, prompt_len:]
  comps = task.decode_completions(tokens, mask)
  if pool is not None:
    return pool.score(comps, refs, timeout_s=cfg.task.reward_timeout_s)
  return task.score(comps, refs, timeout_s=cfg.task.reward_timeout_s)
