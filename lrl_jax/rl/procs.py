"""The RL loop across JAX processes (`jax.distributed`): which rows a process samples, and what it shares.

`rl.train` runs in every process of a multi-process run (one per host, `learner.initialize_distributed` first),
all on the same config. The learner is one SPMD program on the global mesh. The sampler is not: each process
generates and scores its share of every batch (`share`) on its own first device, with the keys the whole batch
would get in one process (`sampler.row_keys` of the whole batch, sliced), on the served tree gathered whole
(`gather_tree`). The processes then exchange their rows (`gather_rows`), so every process holds the whole rollout
on the host, computes the same records from it, and places it on the learner's mesh (`learner.shard_batch`).
Process 0 alone writes the run directory's files; the checkpoints are orbax's, written by all. The run directory
must be one that every process sees (a shared file system: orbax's checkpoints need one too).

With one process every function here is the identity (or "all rows"): a single-process run is unchanged, and so is
a process that runs one role of a run alone (`solo`: the learner or the sampler of `rl.roles`).
"""

from __future__ import annotations

import contextlib

import jax
import numpy as np
from jax.experimental import multihost_utils

__all__ = [
  "count",
  "index",
  "primary",
  "share",
  "gather_rows",
  "gather_tree",
  "place_like",
  "barrier",
  "check_divides",
  "solo",
]

_SOLO: bool | None = None  # inside `solo`: whether this process writes the run's files


@contextlib.contextmanager
def solo(*, writer: bool):
  """Within: this process acts as the only one (`count()` 1, `index()` 0, no collectives here), and writes the run's
  files iff `writer`. For a process that runs one role of a run on its own devices (`rl.roles`: the learner, or the
  sampler), meeting the other only through the role's own messages."""
  global _SOLO
  before, _SOLO = _SOLO, writer
  try:
    yield
  finally:
    _SOLO = before


def count() -> int:
  return 1 if _SOLO is not None else jax.process_count()


def index() -> int:
  return 0 if _SOLO is not None else jax.process_index()


def primary() -> bool:
  """Whether this process writes the run's files (process 0; within `solo`, the one it names)."""
  return _SOLO if _SOLO is not None else jax.process_index() == 0


def check_divides(n: int, what: str) -> None:
  """Raises ValueError unless `n` (rows of `what`) splits evenly across the processes."""
  if n % count():
    raise ValueError(
      f"{what} = {n} does not split across {count()} processes: each process samples an equal share of the "
      f"rows; make it a multiple of {count()}"
    )


def share(n: int) -> slice:
  """This process's rows of a batch of n (n divisible by the process count: `check_divides`)."""
  per = n // count()
  return slice(index() * per, (index() + 1) * per)


def gather_rows(tree):
  """Every process's rows (a pytree of host arrays, each process holding its `share`) concatenated in process
  order: the whole batch as NumPy on every process. One process: the tree unchanged."""
  if count() == 1:
    return tree
  return jax.tree_util.tree_map(np.asarray, multihost_utils.process_allgather(tree, tiled=True))


def gather_tree(tree):
  """A tree of global arrays (the served weights on the learner's mesh) whole on this process's first device.
  A collective: every process calls it. One process: the tree unchanged."""
  if count() == 1 or tree is None:
    return tree
  whole = multihost_utils.process_allgather(tree, tiled=True)
  return jax.device_put(whole, jax.local_devices()[0])


def place_like(tree, like):
  """A tree every process holds whole (host or local arrays, the same values) placed as `like`'s global arrays are
  (each process supplies the pieces its devices hold). One process: the tree unchanged."""
  if count() == 1:
    return tree

  def put(x, ref):
    whole = np.asarray(x)
    return jax.make_array_from_callback(whole.shape, ref.sharding, lambda idx: whole[idx])

  return jax.tree_util.tree_map(put, tree, like)


def barrier(name: str) -> None:
  """Every process waits here until all have arrived (e.g. process 0 has written a file the others read)."""
  if count() > 1:
    multihost_utils.sync_global_devices(name)
