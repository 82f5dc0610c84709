"""Orbax checkpoints of the TrainState: save every N steps and at the end, restore the latest for `--resume`.

Atomicity: orbax writes each checkpoint into a temporary directory
(`<dir>/<step>.orbax-checkpoint-tmp-*`) and renames it to `<dir>/<step>` only when every
file is written (and `_CHECKPOINT_METADATA` marks it finalized). A process killed (even with
SIGKILL) during a save leaves only the temporary directory, which `CheckpointManager`
ignores and cleans up: `restore_latest` returns the last *complete* checkpoint.

Resume semantics (same next-step loss as an uninterrupted run): the whole learner state is
saved — step, fp32 masters, optimizer moments and count, ACRL state, skip counters and the
base key `rng`. Everything a step draws at random must come from `step_key(state)` =
fold_in(rng, step), and the caller must pick the data of step k from k alone (e.g. batch k of
a seeded permutation, or prompts drawn with fold_in(data_key, k)), never from how many
steps this *process* has run. Then the restored state at step k sees the same batch and
keys as the uninterrupted run did, and computes the same numbers.

Saved leaves: every array of the state, including a frozen base (LoRA mode). Keys are
stored as raw uint32 data (TrainState.rng), which orbax writes like any array.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp

from lrl_jax.learner.state import TrainState

__all__ = ["Checkpointer", "abstract_state"]


def abstract_state(state_or_shapes, shardings=None):
  """ShapeDtypeStructs (with shardings) of a state: the restore target.

  Args:
    state_or_shapes: a TrainState, or its `jax.eval_shape` (ShapeDtypeStruct leaves).
    shardings: a matching tree of shardings (`state_shardings`); None: each leaf's own
      sharding (concrete arrays) or the default device.
  """
  if shardings is None:
    return jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), state_or_shapes
    )
  return jax.tree_util.tree_map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state_or_shapes, shardings
  )


class Checkpointer:
  """A thin wrapper over `orbax.checkpoint.CheckpointManager` for TrainStates.

  Args:
    directory: where the step directories go (created if missing).
    save_every: `maybe_save(state)` saves when step % save_every == 0 (and `save(..., force=True)`
      always saves; call it at the end of a run).
    max_to_keep: keep only the newest this many checkpoints (None: all).
    async_save: write in a background thread (call `wait()` before exiting); default off.
  """

  def __init__(
    self, directory: str | os.PathLike, *, save_every: int = 100, max_to_keep: int | None = 3, async_save: bool = False
  ):
    if not isinstance(save_every, int) or save_every < 1:
      raise ValueError(f"Checkpointer.save_every must be a positive int; got {save_every!r}")
    if max_to_keep is not None and (not isinstance(max_to_keep, int) or max_to_keep < 1):
      raise ValueError(f"Checkpointer.max_to_keep must be None or a positive int; got {max_to_keep!r}")
    self.directory = os.path.abspath(os.fspath(directory))
    self.save_every = save_every
    # The interval is decided here (step % save_every == 0); orbax's own would also save the first step.
    options = ocp.CheckpointManagerOptions(
      save_interval_steps=1, max_to_keep=max_to_keep, enable_async_checkpointing=async_save, create=True
    )
    self._mngr = ocp.CheckpointManager(self.directory, options=options)

  def maybe_save(self, state: TrainState, *, force: bool = False) -> bool:
    """Saves `state` under its step if the step is a multiple of `save_every` (or `force`).

    Returns whether a checkpoint was written (or started, with async_save).
    """
    step = int(jax.device_get(state.step))
    if step in self._mngr.all_steps() or not (force or step % self.save_every == 0):
      return False
    return bool(self._mngr.save(step, args=ocp.args.StandardSave(state), force=True))

  def save(self, state: TrainState) -> bool:
    """Saves now whatever the step (the final checkpoint of a run)."""
    return self.maybe_save(state, force=True)

  def latest_step(self) -> int | None:
    """The newest complete checkpoint's step, or None."""
    return self._mngr.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._mngr.all_steps())

  def restore(self, step: int, target: Any) -> TrainState:
    """Restores checkpoint `step` into the structure, dtypes and shardings of `target`.

    Args:
      step: a step from `all_steps()`.
      target: a TrainState of ShapeDtypeStructs with shardings (`abstract_state`), or a
        concrete TrainState whose shardings are reused.
    """
    if step not in self._mngr.all_steps():
      raise ValueError(f"no complete checkpoint for step {step} in {self.directory}; have {self.all_steps()}")
    return self._mngr.restore(step, args=ocp.args.StandardRestore(abstract_state(target)))

  def restore_latest(self, target: Any, shardings=None) -> TrainState | None:
    """The newest complete checkpoint restored into `target`'s structure, or None if there is none.

    Args:
      target: abstract or concrete TrainState (e.g. `jax.eval_shape` of `create_train_state`).
      shardings: `state_shardings(...)` to place the restored arrays; None: take them from `target`.
    """
    step = self.latest_step()
    if step is None:
      return None
    tgt = abstract_state(target, shardings)
    return self._mngr.restore(step, args=ocp.args.StandardRestore(tgt))

  def wait(self) -> None:
    """Blocks until an async save is on disk."""
    self._mngr.wait_until_finished()

  def close(self) -> None:
    self._mngr.wait_until_finished()
    self._mngr.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
