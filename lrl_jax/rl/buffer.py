"""RolloutBuffer: raw float rollout data between the sampler and the learner.

The buffer stores what the sampler and the reward produced, as host NumPy arrays (tokens, μ log-probs,
masks, rewards, advantages, optional π_old / π_ref / returns), and hands the learner `learner.Batch`es:
the whole batch, or K minibatches for K optimizer updates per rollout batch. Rows keep their order
within a minibatch; minibatch j holds rows j, j + K, j + 2K, ... of a seeded permutation, so each
minibatch samples across prompts.

One-step off-policy (`OffPolicyQueue`): the sampler generates batch k + 1 while the learner trains on
batch k. Here this is expressed by generating batch k with the served weights of the previous sync
(one learner step older), so μ comes from older weights than π_old, which is where mismatch
corrections matter.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import jax.numpy as jnp
import numpy as np

from lrl_jax.learner import Batch

__all__ = ["RolloutBatch", "RolloutBuffer", "OffPolicyQueue"]


@dataclasses.dataclass(kw_only=True)
class RolloutBatch:
  """One RL step's rollouts, host-side (B = prompts × G completions, T = P + N).

  Attributes:
    tokens: int32 [B, T] prompt + completion.
    valid: bool [B, T] real tokens.
    mask: bool [B, T] generated tokens (EOS included): where the loss is taken.
    sampler_logp: float32 [B, T] log μ of each generated token (0 elsewhere).
    rewards: float32 [B] outcome rewards.
    advantages: float32 [B] (group advantages) or [B, T] (GAE).
    old_logp, ref_logp, returns: float32 [B, T] or None.
    step: the RL step these rollouts were generated for.
    policy_version: the RL step whose weights generated them (step − 1 in off-policy mode).
  """

  tokens: np.ndarray
  valid: np.ndarray
  mask: np.ndarray
  sampler_logp: np.ndarray
  rewards: np.ndarray
  advantages: np.ndarray | None = None
  old_logp: np.ndarray | None = None
  ref_logp: np.ndarray | None = None
  returns: np.ndarray | None = None
  step: int = 0
  policy_version: int = 0

  def __post_init__(self):
    self.tokens = np.asarray(self.tokens, np.int32)
    if self.tokens.ndim != 2:
      raise ValueError(f"RolloutBatch.tokens must be [B, T]; got shape {self.tokens.shape}")
    B, T = self.tokens.shape
    self.valid = np.asarray(self.valid, bool)
    self.mask = np.asarray(self.mask, bool)
    self.sampler_logp = np.asarray(self.sampler_logp, np.float32)
    self.rewards = np.asarray(self.rewards, np.float32)
    for name in ("valid", "mask", "sampler_logp"):
      if getattr(self, name).shape != (B, T):
        raise ValueError(f"RolloutBatch.{name} must be [B, T] = {(B, T)}; got {getattr(self, name).shape}")
    if self.rewards.shape != (B,):
      raise ValueError(f"RolloutBatch.rewards must be [B] = {(B,)}; got {self.rewards.shape}")
    for name in ("advantages", "old_logp", "ref_logp", "returns"):
      self._set_float(name, getattr(self, name))

  def _set_float(self, name: str, value):
    if value is None:
      setattr(self, name, None)
      return
    value = np.asarray(value, np.float32)
    B, T = self.tokens.shape
    ok = value.shape in ((B,), (B, T)) if name == "advantages" else value.shape == (B, T)
    if not ok:
      raise ValueError(f"RolloutBatch.{name} must be [B, T] = {(B, T)}"
                       f"{' or [B]' if name == 'advantages' else ''}; got {value.shape}")
    setattr(self, name, value)

  def set(self, **fields) -> "RolloutBatch":
    """Sets advantages / old_logp / ref_logp / returns (checked), in place; returns self."""
    for name, value in fields.items():
      if name not in ("advantages", "old_logp", "ref_logp", "returns"):
        raise ValueError(f"RolloutBatch.set: unknown field {name!r}")
      self._set_float(name, value)
    return self

  @property
  def size(self) -> int:
    return self.tokens.shape[0]

  def to_batch(self, rows: np.ndarray | None = None) -> Batch:
    """The learner `Batch` of these rollouts (all rows, or `rows`)."""
    if self.advantages is None:
      raise ValueError("RolloutBatch.to_batch: advantages are not set (set(advantages=...) first)")
    take = (lambda x: x) if rows is None else (lambda x: x[rows])
    opt = lambda x: None if x is None else jnp.asarray(take(x))
    return Batch(tokens=jnp.asarray(take(self.tokens)), loss_mask=jnp.asarray(take(self.mask)),
                 sampler_logp=jnp.asarray(take(self.sampler_logp)), advantages=jnp.asarray(take(self.advantages)),
                 valid=jnp.asarray(take(self.valid)), old_logp=opt(self.old_logp), ref_logp=opt(self.ref_logp),
                 returns=opt(self.returns))


class RolloutBuffer:
  """Holds the current rollout batch and hands out learner batches.

  Args:
    minibatches: K, optimizer updates per rollout batch (B must be divisible by K).
    seed: seed of the minibatch permutation (per step: `default_rng([seed, step])`).
  """

  def __init__(self, *, minibatches: int = 1, seed: int = 0):
    if not isinstance(minibatches, int) or minibatches < 1:
      raise ValueError(f"RolloutBuffer.minibatches must be a positive int; got {minibatches!r}")
    self.minibatches = minibatches
    self.seed = seed
    self._batch: RolloutBatch | None = None

  def put(self, batch: RolloutBatch) -> None:
    if batch.size % self.minibatches:
      raise ValueError(f"RolloutBuffer: {batch.size} rollouts do not split into minibatches={self.minibatches}")
    self._batch = batch

  @property
  def batch(self) -> RolloutBatch:
    if self._batch is None:
      raise ValueError("RolloutBuffer is empty (put a RolloutBatch first)")
    return self._batch

  def full_batch(self) -> Batch:
    """All rollouts as one learner `Batch` (for π_old / π_ref / values)."""
    return self.batch.to_batch()

  def minibatch_rows(self) -> list[np.ndarray]:
    """Row indices of the K minibatches of the current batch (sorted within each)."""
    b = self.batch
    K = self.minibatches
    if K == 1:
      return [np.arange(b.size)]
    perm = np.random.default_rng([self.seed, b.step]).permutation(b.size)
    return [np.sort(perm[j::K]) for j in range(K)]

  def minibatches_iter(self) -> Iterator[Batch]:
    """The K learner `Batch`es of the current rollouts (one optimizer update each)."""
    b = self.batch
    if self.minibatches == 1:
      yield b.to_batch()
      return
    for rows in self.minibatch_rows():
      yield b.to_batch(rows)

  def clear(self) -> None:
    self._batch = None


class OffPolicyQueue:
  """The served weights of the last sync, handed to the *next* step's generation (one step stale).

  `swap(new)` stores `new` and returns what was stored before (or `new` itself on the first call), so the
  sampler of step k generates with the weights synced at step k − 1.
  """

  def __init__(self):
    self._held: Any = None
    self._version: int | None = None

  def swap(self, served, version: int):
    """(served tree to generate with, its version); keeps `served` for the next call."""
    if self._held is None:
      out, v = served, version
    else:
      out, v = self._held, self._version
    self._held, self._version = served, version
    return out, v
