"""Fault-tolerant reward evaluation: a reward function that raises or times out scores 0 and is counted.

Mechanism (CPython, any OS; Linux is what is tested): each call runs in a fresh daemon thread that the
caller joins for at most `timeout_s`. On a timeout the caller scores 0 and moves on at once, then asks
the interpreter to raise an exception inside the worker thread (`PyThreadState_SetAsyncExc`), which
stops a pure-Python loop at its next bytecode boundary.

Limits: Python cannot kill a thread. A function blocked inside C code (`time.sleep`, a catastrophic
`re` match, a huge integer power, a C extension) keeps running in the background until that C call
returns, and holds a CPU core (and, for C code that does not release it, the GIL) meanwhile; it never
blocks the caller from continuing. Use a separate process (sandbox) for untrusted or C-heavy verifiers.
Processes are not used here because forking a process that runs JAX's threads is unsafe.
`stats["abandoned_alive"]` reports how many timed-out calls are still running.
"""

from __future__ import annotations

import ctypes
import logging
import math
import threading
from typing import Callable, Literal, Sequence

import numpy as np

__all__ = ["safe_reward", "score_batch", "RewardStatus"]

log = logging.getLogger(__name__)

RewardStatus = Literal["ok", "error", "timeout", "invalid"]
_abandoned: list[threading.Thread] = []  # timed-out workers, pruned when they end
_abandoned_lock = threading.Lock()


class _RewardTimeout(BaseException):
  """Raised inside a timed-out worker; a BaseException so a reward's `except Exception` cannot swallow it."""


def _interrupt(thread: threading.Thread) -> None:
  ident = thread.ident
  if ident is not None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(_RewardTimeout))


def _call(
  fn: Callable[[str, str], float], completion: str, reference: str, timeout_s: float | None
) -> tuple[float, RewardStatus, BaseException | None]:
  """(reward, status, error): the reward as a finite float, or 0.0 with why it is not one."""
  if timeout_s is None:
    try:
      value = fn(completion, reference)
    except Exception as e:  # noqa: BLE001 — any failure of a user verifier scores 0
      return 0.0, "error", e
  else:
    if not timeout_s > 0:
      raise ValueError(f"timeout_s must be > 0 or None; got {timeout_s!r}")
    box: dict = {}
    lock = threading.Lock()  # the caller interrupts only a worker that has not finished

    def work():
      try:
        try:
          box["value"] = fn(completion, reference)
        except _RewardTimeout:
          raise
        except BaseException as e:  # noqa: BLE001
          box["error"] = e
        finally:
          with lock:
            box["done"] = True
      except _RewardTimeout:
        pass

    t = threading.Thread(target=work, daemon=True, name="lrl_jax-reward")
    t.start()
    t.join(timeout_s)
    with lock:
      timed_out = not box.get("done", False)
      if timed_out:
        _interrupt(t)
    if timed_out:
      with _abandoned_lock:
        _abandoned[:] = [a for a in _abandoned if a.is_alive()] + [t]
      return 0.0, "timeout", None
    if "error" in box:
      return 0.0, "error", box["error"]
    value = box["value"]
  try:
    r = float(value)
  except (TypeError, ValueError) as e:
    return 0.0, "invalid", e
  if not math.isfinite(r):
    return 0.0, "invalid", ValueError(f"reward {value!r} is not a finite number")
  return r, "ok", None


def safe_reward(
  fn: Callable[[str, str], float], completion: str, reference: str, *, timeout_s: float | None = 1.0
) -> tuple[float, bool]:
  """Calls `fn(completion, reference)`; (reward, failed). A raise, a timeout, or a result that is not a finite
  number gives (0.0, True) (a bool counts as 1.0 / 0.0). `timeout_s=None` runs inline with no timeout. See the module
  docstring for the timeout mechanism and its limits."""
  r, status, _ = _call(fn, completion, reference, timeout_s)
  return r, status != "ok"


def score_batch(
  task, completions: Sequence[str], references: Sequence[str], *, timeout_s: float | None = 1.0
) -> tuple[np.ndarray, dict]:
  """Rewards of a batch with `task.reward`, never raising on a verifier failure.

  Returns:
    rewards: float32 [B].
    stats: {"errors", "timeouts", "invalid", "failed" (their sum), "abandoned_alive" (timed-out calls
      still running)} as ints. The first error of a batch is logged as a warning.
  """
  if len(completions) != len(references):
    raise ValueError(f"score_batch: {len(completions)} completions but {len(references)} references")
  rewards = np.zeros(len(completions), np.float32)
  counts = {"error": 0, "timeout": 0, "invalid": 0}
  first = None
  for i, (c, ref) in enumerate(zip(completions, references)):
    r, status, err = _call(task.reward, c, ref, timeout_s)
    rewards[i] = r
    if status != "ok":
      counts[status] += 1
      if first is None:
        first = f"sample {i}: {status}" + (f" ({type(err).__name__}: {err})" if err is not None else "")
  if first is not None:
    log.warning(
      "reward function failed on %d of %d samples, scored 0; first: %s", sum(counts.values()), len(completions), first
    )
  with _abandoned_lock:
    _abandoned[:] = [a for a in _abandoned if a.is_alive()]
    alive = len(_abandoned)
  stats = {
    "errors": counts["error"],
    "timeouts": counts["timeout"],
    "invalid": counts["invalid"],
    "failed": sum(counts.values()),
    "abandoned_alive": alive,
  }
  return rewards, stats
