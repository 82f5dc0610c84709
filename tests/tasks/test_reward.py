"""safe_reward / score_batch: a reward function that raises, hangs, or returns a non-number scores 0, is
counted, and never stops the caller."""

import math
import threading
import time

import numpy as np
import pytest

from lrl_jax.tasks import ArithmeticTask, safe_reward, score_batch


def _raises(c, r):
  raise RuntimeError("verifier crashed")


def _sleeps(c, r):
  time.sleep(3.0)
  return 1.0


def _spins(c, r):
  while True:  # pure Python: stopped by the asynchronous exception at its next bytecode
    pass


def test_safe_reward_ok_and_raise():
  assert safe_reward(lambda c, r: 0.5, "a", "b") == (0.5, False)
  assert safe_reward(lambda c, r: c == r, "a", "a") == (1.0, False)
  assert safe_reward(_raises, "a", "b") == (0.0, True)
  assert safe_reward(_raises, "a", "b", timeout_s=None) == (0.0, True)
  assert safe_reward(lambda c, r: math.nan, "a", "b") == (0.0, True)
  assert safe_reward(lambda c, r: "high", "a", "b") == (0.0, True)


def test_safe_reward_timeout_returns_promptly():
  t0 = time.perf_counter()
  assert safe_reward(_sleeps, "a", "b", timeout_s=0.2) == (0.0, True)
  assert time.perf_counter() - t0 < 1.0  # the caller does not wait for the 3 s sleep


def test_spinning_reward_is_stopped():
  before = set(threading.enumerate())
  t0 = time.perf_counter()
  assert safe_reward(_spins, "a", "b", timeout_s=0.1) == (0.0, True)
  assert time.perf_counter() - t0 < 1.0
  new = [t for t in threading.enumerate() if t not in before]
  assert new  # the abandoned worker was still spinning when the caller moved on
  for t in new:
    t.join(2.0)
  assert not any(t.is_alive() for t in new)  # ... and then ended


class _FlakyTask(ArithmeticTask):
  def reward(self, completion, reference):
    if completion == "boom":
      raise ValueError("bad completion")
    if completion == "hang":
      while True:
        pass
    if completion == "nan":
      return float("nan")
    return super().reward(completion, reference)


def test_score_batch_counts_failures_and_goes_on():
  t = _FlakyTask()
  completions = ["19", "boom", "18", "hang", "nan", "7"]
  refs = ["19", "19", "19", "19", "19", "7"]
  rewards, stats = score_batch(t, completions, refs, timeout_s=0.2)
  assert rewards.dtype == np.float32
  np.testing.assert_array_equal(rewards, [1, 0, 0, 0, 0, 1])
  assert (stats["errors"], stats["timeouts"], stats["invalid"], stats["failed"]) == (1, 1, 1, 3)
  with pytest.raises(ValueError, match="2 completions but 1 references"):
    score_batch(t, ["1", "2"], ["1"])


def test_score_batch_matches_task_reward_and_is_fast():
  t = ArithmeticTask(seed=0, digits=2)
  prompts, refs = t.prompts(0, 64)
  completions = [r if i % 3 else str(int(r) + 1) for i, r in enumerate(refs)]
  t0 = time.perf_counter()
  rewards, stats = t.score(completions, refs)
  elapsed = time.perf_counter() - t0
  np.testing.assert_array_equal(rewards, [0.0 if i % 3 == 0 else 1.0 for i in range(64)])
  assert stats["failed"] == 0
  assert elapsed < 1.0, elapsed  # one thread per sample: ~0.1 ms each


def test_reward_pool_kills_a_hung_call_and_scores_the_rest():
  """RewardPool (spawned workers): a reward hung in C code past its timeout is killed (its worker replaced), the
  hangs of one batch wait in parallel (about one timeout for the batch, not one per hang), errors and NaN are counted
  failures, and the replaced workers score the next batch."""
  from lrl_jax.tasks import RewardPool  # noqa: PLC0415
  from tests.tasks._rewards import hang_or_score  # noqa: PLC0415  (a module-level function: workers import it)

  with RewardPool(hang_or_score, workers=2) as pool:
    comps = ["1", "hang", "2", "boom", "hang", "nan", "3"]
    refs = ["1", "1", "9", "1", "1", "1", "3"]
    t0 = time.monotonic()
    rewards, stats = pool.score(comps, refs, timeout_s=1.0)
    took = time.monotonic() - t0
    assert list(rewards) == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert (stats["timeouts"], stats["errors"], stats["invalid"], stats["failed"]) == (2, 1, 1, 4)
    assert pool.killed == 2 and stats["abandoned_alive"] == 0
    assert took < 2 * 1.0 + 10  # two hangs on two workers: one timeout in parallel (+ the respawns), not 30 s each
    rewards, stats = pool.score(["4", "5"], ["4", "4"], timeout_s=1.0)
    assert list(rewards) == [1.0, 0.0] and stats["failed"] == 0
