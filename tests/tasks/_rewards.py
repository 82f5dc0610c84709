"""Reward functions for the RewardPool tests (module level: the worker processes import them by name)."""

import math
import time


def hang_or_score(completion: str, reference: str) -> float:
  """Sleeps 30 s in C (time.sleep: a thread cannot interrupt it) on "hang"; raises on "boom"; NaN on "nan"."""
  if completion == "hang":
    time.sleep(30)
  if completion == "boom":
    raise RuntimeError("verifier crashed")
  if completion == "nan":
    return math.nan
  return float(completion == reference)
