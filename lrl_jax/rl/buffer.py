"""RolloutBuffer: the current rollout batch on device, and the row indices of its K minibatches.

The buffer holds the one `Rollout` of the step (on device, as the sampler and `learner.prepare_rollout` left it)
and hands out the rows of each minibatch as index arrays; `learner.train_step(state, rollout, rows=...)` gathers
them on device. Minibatch j holds rows j, j + K, j + 2K, ... of a seeded permutation (sorted), so each
minibatch samples across prompts; the permutation of step k is `default_rng([seed, k])`, the same after a resume.

One-step off-policy (`OffPolicyQueue`): the sampler generates batch k + 1 while the learner trains on
batch k. Here this is expressed by generating batch k with the served weights of the previous sync
(one learner step older), so μ comes from older weights than π_old, which is where mismatch
corrections matter.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

from lrl_jax.rollout import Rollout

__all__ = ["RolloutBuffer", "OffPolicyQueue", "minibatch_rows"]


def minibatch_rows(size: int, minibatches: int, *, seed: int, step: int) -> list[np.ndarray]:
  """Row indices (int32, sorted) of the K minibatches of a batch of `size` rows at RL step `step`."""
  if minibatches == 1:
    return [np.arange(size, dtype=np.int32)]
  perm = np.random.default_rng([seed, step]).permutation(size)
  return [np.sort(perm[j::minibatches]).astype(np.int32) for j in range(minibatches)]


class RolloutBuffer:
  """Holds the current `Rollout` and the row indices of its minibatches.

  Args:
    minibatches: K, optimizer updates per rollout batch (B must be divisible by K).
    seed: seed of the minibatch permutation (per step: `default_rng([seed, step])`).
  """

  def __init__(self, *, minibatches: int = 1, seed: int = 0):
    if not isinstance(minibatches, int) or minibatches < 1:
      raise ValueError(f"RolloutBuffer.minibatches must be a positive int; got {minibatches!r}")
    self.minibatches = minibatches
    self.seed = seed
    self._rollout: Rollout | None = None
    self._step = 0

  def put(self, rollout: Rollout, *, step: int) -> None:
    """Holds `rollout`, the batch of RL step `step` (its minibatch permutation)."""
    if rollout.size % self.minibatches:
      raise ValueError(f"RolloutBuffer: {rollout.size} rollouts do not split into minibatches={self.minibatches}")
    self._rollout, self._step = rollout, step

  @property
  def rollout(self) -> Rollout:
    if self._rollout is None:
      raise ValueError("RolloutBuffer is empty (put a Rollout first)")
    return self._rollout

  def minibatch_rows(self) -> list[np.ndarray] | list[None]:
    """Row indices of the K minibatches of the current batch ([None]: one minibatch, all rows)."""
    if self.minibatches == 1:
      return [None]
    return minibatch_rows(self.rollout.size, self.minibatches, seed=self.seed, step=self._step)

  def clear(self) -> None:
    self._rollout = None


class OffPolicyQueue:
  """The served weights of the last `staleness` syncs: step k generates with the weights synced at step
  k − staleness (the run's first steps, before there are that many: with the first sync's).

  `swap(new, version)` stores `new` and returns the weights step `version` generates with; with staleness 1 the
  sampler of step k generates with the weights synced at step k − 1 (one step off-policy).
  """

  def __init__(self, staleness: int = 1):
    if staleness < 1:
      raise ValueError(f"OffPolicyQueue: staleness must be >= 1; got {staleness}")
    self.staleness = staleness
    self._held: collections.deque = collections.deque()

  @property
  def held(self) -> list[tuple[Any, int]]:
    """[(served weights, version)] kept for the next steps, oldest first ([] before the first swap): what a
    checkpoint of an off-policy run must keep for its resume to generate as the uninterrupted run does."""
    return list(self._held)

  def peek(self):
    """(served weights, version) the next `swap` will hand out (the oldest held): with asynchronous rollouts, what
    the next step generates with before its own sync."""
    return self._held[0]

  def restore(self, held: list[tuple[Any, int]]) -> None:
    """Puts back what `held` gave (a resumed run); keeps the newest `staleness` of them."""
    self._held = collections.deque(list(held)[-self.staleness :])

  def swap(self, served, version: int):
    """(served tree to generate with, its version); keeps `served` for the next `staleness` calls."""
    self._held.append((served, version))
    out = self._held[0]
    if len(self._held) > self.staleness:
      self._held.popleft()
    return out
