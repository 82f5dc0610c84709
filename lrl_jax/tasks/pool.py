"""RewardPool: a task's reward in worker processes, with a real per-call timeout (a hung call is killed).

The thread mechanism of `tasks.reward` cannot stop a reward blocked in C code (a catastrophic regex, a huge integer
power, `time.sleep`): it keeps running after its timeout. Here each call runs in one of `workers` processes started
with the "spawn" method (never fork: the parent runs JAX's threads); a call that passes its deadline has its worker
killed and replaced, so it stops at once, and the calls of a batch run in parallel, so a batch with hanging rewards
costs about one timeout, not one per hang.

The reward travels to the workers by pickling the task (its `reward` method): a task whose reward does not pickle
(a lambda, a closure) cannot use the pool; `RewardPool.for_task` returns None for it and scoring falls back to
threads (`score_batch` without a pool), with a warning.
"""

from __future__ import annotations

import logging
import math
import multiprocessing as mp
import pickle
import time
from multiprocessing.connection import wait
from typing import Sequence

import numpy as np

__all__ = ["RewardPool"]

log = logging.getLogger(__name__)
_START_S = 120.0  # a worker's start (an interpreter, the reward's imports) on a loaded machine


def _serve(conn, payload: bytes) -> None:
  """A worker: reward(completion, reference) for each (i, completion, reference) received, until None."""
  fn = pickle.loads(payload)
  conn.send("ready")  # a call's timeout runs from here on, not from the process's start
  while True:
    msg = conn.recv()
    if msg is None:
      return
    i, completion, reference = msg
    try:
      value = fn(completion, reference)
      try:
        r = float(value)
        out = (i, "ok", r) if math.isfinite(r) else (i, "invalid", f"reward {value!r} is not a finite number")
      except (TypeError, ValueError) as e:
        out = (i, "invalid", f"{type(e).__name__}: {e}")
    except Exception as e:  # noqa: BLE001 — any failure of a user verifier scores 0
      out = (i, "error", f"{type(e).__name__}: {e}")
    conn.send(out)


class _Worker:
  def __init__(self, ctx, payload: bytes):
    self.conn, child = ctx.Pipe()
    self.proc = ctx.Process(target=_serve, args=(child, payload), daemon=True, name="lrl_jax-reward")
    self.proc.start()
    child.close()
    self.job: int | None = None
    self.deadline = math.inf
    ok = False
    if self.conn.poll(_START_S):
      try:
        ok = self.conn.recv() == "ready"
      except EOFError:  # it died: the reward did not unpickle there (a module the worker cannot import)
        pass
    if not ok:
      self.kill()
      raise RuntimeError("a reward worker did not start (its reward did not unpickle in a fresh process?)")

  def kill(self) -> None:
    self.proc.kill()
    self.proc.join(5)
    self.conn.close()


class RewardPool:
  """`workers` spawned processes scoring with `fn(completion, reference)`; `score` is `score_batch`'s contract.

  Args:
    fn: a picklable reward function (e.g. a task's bound `reward` method).
    workers: processes (each scores one call at a time).
  """

  def __init__(self, fn, *, workers: int = 2):
    if workers < 1:
      raise ValueError(f"RewardPool: workers must be >= 1; got {workers}")
    self._payload = pickle.dumps(fn)
    self._ctx = mp.get_context("spawn")
    self._workers = [_Worker(self._ctx, self._payload) for _ in range(workers)]
    self.killed = 0  # workers killed for a timed-out call, in total

  @classmethod
  def for_task(cls, task, *, workers: int = 2) -> "RewardPool | None":
    """A pool for `task.reward`, or None (with a warning) when the task does not pickle."""
    try:
      pickle.dumps(task.reward)
    except Exception as e:  # noqa: BLE001  (pickle raises many types)
      log.warning(
        "the task's reward does not pickle (%s: %s): rewards run in threads, and a call hung in C code cannot be "
        "stopped (define the reward at module level to run it in worker processes)",
        type(e).__name__,
        e,
      )
      return None
    try:
      return cls(task.reward, workers=workers)
    except RuntimeError as e:
      log.warning("%s: rewards run in threads instead", e)
      return None

  def score(
    self, completions: Sequence[str], references: Sequence[str], *, timeout_s: float | None = 1.0
  ) -> tuple[np.ndarray, dict]:
    """(rewards float32 [B], stats {"errors", "timeouts", "invalid", "failed", "abandoned_alive": 0}): a call that
    raises, returns a non-number or runs past `timeout_s` (its worker killed) scores 0 and is counted."""
    if len(completions) != len(references):
      raise ValueError(f"score: {len(completions)} completions but {len(references)} references")
    if timeout_s is not None and not timeout_s > 0:
      raise ValueError(f"timeout_s must be > 0 or None; got {timeout_s!r}")
    n = len(completions)
    rewards = np.zeros(n, np.float32)
    counts = {"error": 0, "timeout": 0, "invalid": 0}
    first = None
    todo = list(range(n))[::-1]
    done = 0
    while done < n:
      for w in self._workers:
        if w.job is None and todo:
          i = todo.pop()
          w.conn.send((i, completions[i], references[i]))
          w.job, w.deadline = i, (time.monotonic() + timeout_s) if timeout_s is not None else math.inf
      busy = [w for w in self._workers if w.job is not None]
      wait_s = max(0.0, min(w.deadline for w in busy) - time.monotonic())
      ready = wait([w.conn for w in busy], timeout=None if math.isinf(wait_s) else wait_s)
      now = time.monotonic()
      for k, w in enumerate(self._workers):
        if w.job is None:
          continue
        if w.conn in ready:
          try:
            i, status, value = w.conn.recv()
            w.job = None
          except EOFError:  # the worker died (a reward that exits the process, a segfault): a new one takes over
            i, status, value = w.job, "error", "the worker process died"
            self._workers[k] = self._replace(w)
          if status == "ok":
            rewards[i] = value
          else:
            counts[status] += 1
            first = first or f"sample {i}: {status} ({value})"
          done += 1
        elif now >= w.deadline:
          counts["timeout"] += 1
          first = first or f"sample {w.job}: timeout"
          done += 1
          self.killed += 1
          self._workers[k] = self._replace(w)
    if first is not None:
      log.warning("reward function failed on %d of %d samples, scored 0; first: %s", sum(counts.values()), n, first)
    stats = {
      "errors": counts["error"],
      "timeouts": counts["timeout"],
      "invalid": counts["invalid"],
      "failed": sum(counts.values()),
      "abandoned_alive": 0,  # a timed-out call's worker is killed
    }
    return rewards, stats

  def _replace(self, w: _Worker) -> _Worker:
    w.kill()
    return _Worker(self._ctx, self._payload)

  def close(self) -> None:
    for w in self._workers:
      try:
        w.conn.send(None)
      except (BrokenPipeError, OSError):
        pass
    for w in self._workers:
      w.proc.join(2)
      if w.proc.is_alive():
        w.proc.kill()
      w.conn.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
