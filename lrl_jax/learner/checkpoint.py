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
stored as raw uint32 data (TrainState.rng), which orbax writes like any array. Dtypes: orbax casts an array's values
into the restore target's dtype; `_check_dtypes` reads the saved dtypes first and allows only a float to another float
(the values kept, to the target's precision).

Integrity: orbax does not notice a file truncated by a few bytes, so each complete checkpoint also gets
`lrl_checksums.json` (every file's size and CRC-32) once it is on disk; `restore_latest` verifies the newest
checkpoint against it (and lets orbax read it) and, when either fails, warns with one line naming the damaged
checkpoint and falls back to the next newest. A state whose parameters are not all finite is never written
(`NonFiniteError`): "the last good checkpoint" stays good. Temporary directories a killed save left behind
(`*.orbax-checkpoint-tmp-*`) are removed when a Checkpointer opens the directory (a run owns its directory).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import zlib
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from lrl_jax.learner.state import TrainState

__all__ = ["Checkpointer", "CheckpointError", "abstract_state"]

log = logging.getLogger(__name__)
_CHECKSUMS = "lrl_checksums.json"


class CheckpointError(RuntimeError):
  """No intact checkpoint could be restored (each one tried is named with what was wrong)."""


def _file_sums(step_dir: Path) -> dict[str, list[int]]:
  """{relative path: [size, crc32]} of every file under a checkpoint directory (the checksum file excepted)."""
  out = {}
  for f in sorted(step_dir.rglob("*")):
    if f.is_file() and f.name != _CHECKSUMS:
      crc = 0
      with open(f, "rb") as fh:
        while chunk := fh.read(1 << 22):
          crc = zlib.crc32(chunk, crc)
      out[str(f.relative_to(step_dir))] = [f.stat().st_size, crc]
  return out


def _nonfinite_leaves(tree) -> list[str]:
  bad = []
  for kp, x in jax.tree_util.tree_leaves_with_path(tree):
    if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating) and not bool(jnp.all(jnp.isfinite(x))):
      bad.append(jax.tree_util.keystr(kp))
  return bad


def _names(path) -> tuple[str, ...]:
  """A key path as plain names: the same for a state's tree and for orbax's metadata of it (dicts, lists)."""
  return tuple(str(next(getattr(k, a) for a in ("name", "key", "idx") if hasattr(k, a))) for k in path)


def _is_float(dtype) -> bool:
  return jnp.issubdtype(dtype, jnp.floating)


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
    processes: across processes, the ones whose devices hold the state (None: all): only they save and restore,
      and wait for each other (e.g. the learner's process of a run whose sampler has a process of its own,
      `rl.roles`); the first of them writes the checksums. A state that one process of several holds is saved as
      host (NumPy) arrays and placed back on the target's shardings at restore: orbax serializes only global arrays
      across processes (it refuses one process's arrays as "host local").
  """

  def __init__(
    self,
    directory: str | os.PathLike,
    *,
    save_every: int = 100,
    max_to_keep: int | None = 3,
    async_save: bool = False,
    processes: set[int] | None = None,
  ):
    if not isinstance(save_every, int) or save_every < 1:
      raise ValueError(f"Checkpointer.save_every must be a positive int; got {save_every!r}")
    if max_to_keep is not None and (not isinstance(max_to_keep, int) or max_to_keep < 1):
      raise ValueError(f"Checkpointer.max_to_keep must be None or a positive int; got {max_to_keep!r}")
    self.directory = os.path.abspath(os.fspath(directory))
    self.save_every = save_every
    # The interval is decided here (step % save_every == 0); orbax's own would also save the first step.
    self._writer = 0 if processes is None else min(processes)
    self._host = processes is not None and len(processes) == 1 and jax.process_count() > 1
    multi = ocp.options.MultiprocessingOptions(
      primary_host=self._writer, active_processes=None if processes is None else set(processes)
    )
    options = ocp.CheckpointManagerOptions(
      save_interval_steps=1,
      max_to_keep=max_to_keep,
      enable_async_checkpointing=async_save,
      create=processes is None,  # orbax creates it only when every process takes part: else made below
      multiprocessing_options=multi,
    )
    for tmp in Path(self.directory).glob("*.orbax-checkpoint-tmp-*"):  # a save killed half-way
      log.warning("removing %s: the unfinished save of a killed run", tmp)
      shutil.rmtree(tmp, ignore_errors=True)
    if processes is not None:
      Path(self.directory).mkdir(parents=True, exist_ok=True)
    # The handler named here (the one StandardSave uses anyway) lets `item_metadata` read a checkpoint's dtypes.
    self._mngr = ocp.CheckpointManager(self.directory, options=options, item_handlers=ocp.StandardCheckpointHandler())
    self._async = async_save
    self._unsummed: list[int] = []

  def maybe_save(self, state: TrainState, *, force: bool = False) -> bool:
    """Saves `state` under its step if the step is a multiple of `save_every` (or `force`).

    Returns whether a checkpoint was written (or started, with async_save).
    """
    step = int(jax.device_get(state.step))
    if step in self._mngr.all_steps() or not (force or step % self.save_every == 0):
      return False
    bad = _nonfinite_leaves(state.params) + _nonfinite_leaves(state.lora)
    if bad:
      from lrl_jax.learner.step import NonFiniteError  # noqa: PLC0415  (step imports this module's state)

      raise NonFiniteError(
        f"refusing to checkpoint step {step}: {len(bad)} parameter leaves are not finite ({', '.join(bad[:3])}"
        f"{', ...' if len(bad) > 3 else ''}); the checkpoints in {self.directory} are left as they were"
      )
    item = jax.device_get(state) if self._host else state
    saved = bool(self._mngr.save(step, args=ocp.args.StandardSave(item), force=True))
    if saved:
      self._unsummed.append(step)
      if not self._async:  # a synchronous save is on disk now
        self._write_sums()
    return saved

  def _write_sums(self) -> None:
    # One writer: with several processes every one saves its shards, but the sums of the finished directory are
    # process 0's (or the first of `processes`) to write (two processes renaming the same temporary file race; seen in
    # the 2-process test).
    if jax.process_index() != self._writer:
      self._unsummed = []
      return
    for step in self._unsummed:
      d = Path(self.directory) / str(step)
      if d.is_dir():
        tmp = d / (_CHECKSUMS + ".tmp")
        tmp.write_text(json.dumps(_file_sums(d)))
        tmp.replace(d / _CHECKSUMS)
    self._unsummed = []

  def verify(self, step: int) -> str | None:
    """None if checkpoint `step`'s files match the sizes and CRC-32s written at save (or it has none to compare:
    an older checkpoint), else what differs."""
    d = Path(self.directory) / str(step)
    f = d / _CHECKSUMS
    if not f.is_file():
      return None
    try:
      want = json.loads(f.read_text())
    except (OSError, ValueError) as e:
      return f"its checksum file {_CHECKSUMS} is unreadable ({type(e).__name__})"
    have = _file_sums(d)
    for name, (size, crc) in want.items():
      if name not in have:
        return f"file {name} is missing"
      if have[name][0] != size:
        return f"file {name} has {have[name][0]} bytes, {size} were written"
      if have[name][1] != crc:
        return f"file {name} does not match its CRC-32"
    return None

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
    why = self.verify(step)
    if why is not None:
      raise CheckpointError(f"checkpoint {self.directory}/{step} is damaged: {why}")
    return self._restore(step, abstract_state(target))

  def _restore(self, step: int, tgt):
    self._check_dtypes(step, tgt)
    if not self._host:
      return self._mngr.restore(step, args=ocp.args.StandardRestore(tgt))
    host = jax.tree_util.tree_map(lambda x: np.zeros(x.shape, x.dtype), tgt)
    got = self._mngr.restore(step, args=ocp.args.StandardRestore(host))
    return jax.tree_util.tree_map(lambda x, t: jax.device_put(x, t.sharding), got, tgt)

  def _check_dtypes(self, step: int, tgt) -> None:
    """Refuses a restore that would change a leaf's dtype other than from one float to another.

    orbax restores an array into the target's dtype by casting its values: E4M3 codes read into a uint8 target came
    back as numbers, not bits (0.5 -> 0, -2 -> 254, 448 -> 192; orbax 0.12.8), integers into other integers wrap. So
    the saved dtypes are read first (`item_metadata`). A float meeting another float is cast (the values kept, to
    the target's precision); any other change is refused, naming the leaf.
    """
    meta = self._mngr.item_metadata(step)
    saved_tree = getattr(meta, "tree", meta)
    if saved_tree is None:  # pragma: no cover  (orbax without the handler's metadata: nothing to compare)
      return
    saved = {_names(p): getattr(m, "dtype", None) for p, m in jax.tree_util.tree_flatten_with_path(saved_tree)[0]}
    for path, t in jax.tree_util.tree_flatten_with_path(tgt)[0]:
      s, want = saved.get(_names(path)), np.dtype(t.dtype)
      if s is not None and np.dtype(s) != want and not (_is_float(s) and _is_float(want)):
        raise CheckpointError(
          f"checkpoint {self.directory}/{step}: {jax.tree_util.keystr(path)} {tuple(t.shape)} was saved as"
          f" {np.dtype(s)} and the state holds {want}; restoring would cast its values"
        )

  def restore_latest(self, target: Any, shardings=None) -> TrainState | None:
    """The newest complete checkpoint restored into `target`'s structure, or None if there is none.

    Args:
      target: abstract or concrete TrainState (e.g. `jax.eval_shape` of `create_train_state`).
      shardings: `state_shardings(...)` to place the restored arrays; None: take them from `target`.
    """
    steps = sorted(self._mngr.all_steps(), reverse=True)
    if not steps:
      return None
    tgt = abstract_state(target, shardings)
    tried = []
    for step in steps:
      why = self.verify(step)
      if why is None:
        try:
          return self._restore(step, tgt)
        except Exception as e:  # orbax raises ValueError / OSError / tensorstore errors on damaged or mismatched files
          why = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
      tried.append(f"step {step}: {why}")
      log.warning("checkpoint %s/%d is damaged (%s); trying the next newest", self.directory, step, why)
    raise CheckpointError(f"no intact checkpoint in {self.directory}: " + "; ".join(tried))

  def wait(self) -> None:
    """Blocks until an async save is on disk (and writes its checksums)."""
    self._mngr.wait_until_finished()
    self._write_sums()

  def close(self) -> None:
    self.wait()
    self._mngr.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
