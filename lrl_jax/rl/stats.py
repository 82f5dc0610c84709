"""Statistics for experiment claims over seeds: bootstrap intervals, paired comparisons, a sign test, verdicts.

Every experiment report in this repository states a claim as "holds", "does not hold" or "inconclusive at 95%"
from an interval, never from two means side by side. Runs are paired by seed (every arm trains the same seeds,
from the same initialisation and warm-up data), so an arm is compared with its baseline on the per-seed
differences, which removes the seed-to-seed spread that both share.

  mean_interval(x)        mean with a 95% percentile-bootstrap interval (Efron & Tibshirani 1993, ch. 13)
  paired(a, b)            mean of a − b over the seeds both have, its bootstrap interval, and the sign test
  sign_test(d)            exact two-sided binomial p of the signs of d (ties dropped)
  verdict(lo, hi, t)      a claim "value >= t" (or "<= t") against an interval
  bands(curves)           per-step mean and bootstrap interval over seeds, for plots with bands
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["Interval", "Paired", "mean_interval", "paired", "sign_test", "verdict", "within", "bands"]

BOOTSTRAP = 10_000


@dataclasses.dataclass(frozen=True)
class Interval:
  """A mean over n values and its bootstrap interval at `level`."""

  mean: float
  lo: float
  hi: float
  n: int
  level: float = 0.95

  def fmt(self, scale: float = 1.0, spec: str = ".1f", sign: bool = False) -> str:
    """'m [lo, hi]' with every number multiplied by scale (100 for percentages)."""
    f = "{:+" + spec + "}" if sign else "{:" + spec + "}"
    if not math.isfinite(self.mean):
      return "n/a"
    if self.n < 2:
      return f.format(scale * self.mean)
    return f"{f.format(scale * self.mean)} [{f.format(scale * self.lo)}, {f.format(scale * self.hi)}]"


@dataclasses.dataclass(frozen=True)
class Paired:
  """a − b over shared seeds: the mean difference, its bootstrap interval, the signs and the sign test's p."""

  diff: Interval
  wins: int  # seeds with a > b
  losses: int  # seeds with a < b
  ties: int
  p_sign: float  # two-sided exact sign test


def _finite(x) -> np.ndarray:
  v = np.asarray(x, np.float64).ravel()
  return v[np.isfinite(v)]


def mean_interval(x, *, level: float = 0.95, n_boot: int = BOOTSTRAP, seed: int = 0) -> Interval:
  """The mean of the finite values of x with a percentile-bootstrap interval (resampling the values).

  One value gives lo = hi = the value; none gives NaNs. The percentile interval of the mean is the plain
  nonparametric bootstrap; with 10 seeds it is somewhat narrower than a t-interval (it does not widen for n − 1).
  """
  if not 0.0 < level < 1.0:
    raise ValueError(f"mean_interval: level must be in (0, 1); got {level}")
  v = _finite(x)
  if v.size == 0:
    return Interval(math.nan, math.nan, math.nan, 0, level)
  m = float(v.mean())
  if v.size == 1:
    return Interval(m, m, m, 1, level)
  rng = np.random.default_rng(seed)
  boot = v[rng.integers(0, v.size, (n_boot, v.size))].mean(axis=1)
  a = (1.0 - level) / 2
  lo, hi = np.quantile(boot, [a, 1.0 - a])
  return Interval(m, float(lo), float(hi), int(v.size), level)


def sign_test(d) -> float:
  """Two-sided exact sign test of the finite differences d against a median of 0 (ties dropped):
  p = min(1, 2 · P[Bin(n, 1/2) <= min(#pos, #neg)]). No non-zero difference gives p = 1."""
  v = _finite(d)
  pos, neg = int(np.sum(v > 0)), int(np.sum(v < 0))
  n = pos + neg
  if n == 0:
    return 1.0
  k = min(pos, neg)
  tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0**n
  return min(1.0, 2.0 * tail)


def paired(
  a: Mapping[int, float], b: Mapping[int, float], *, level: float = 0.95, n_boot: int = BOOTSTRAP, seed: int = 0
) -> Paired:
  """a − b over the seeds present (and finite) in both: mean difference with its bootstrap interval
  (resampling seeds), wins / losses / ties, and the sign test's p. a, b: seed -> value."""
  seeds = sorted(s for s in set(a) & set(b) if math.isfinite(a[s]) and math.isfinite(b[s]))
  d = np.asarray([a[s] - b[s] for s in seeds], np.float64)
  return Paired(
    diff=mean_interval(d, level=level, n_boot=n_boot, seed=seed),
    wins=int(np.sum(d > 0)),
    losses=int(np.sum(d < 0)),
    ties=int(np.sum(d == 0)),
    p_sign=sign_test(d),
  )


def verdict(lo: float, hi: float, threshold: float, *, at_least: bool = True, strict: bool = False) -> str:
  """A claim "value >= threshold" (at_least) or "value <= threshold" against an interval [lo, hi]:
  'holds' if the whole interval is on the claim's side, 'does not hold' if it is wholly on the other,
  'inconclusive at 95%' otherwise (the interval straddles the threshold; NaNs are inconclusive too).
  strict: the claim is "value > threshold" (at_least) or "< threshold": an interval that touches it does not hold
  it ("A helps" is "A − B > 0": a difference of exactly 0 on every seed does not hold)."""
  if not (math.isfinite(lo) and math.isfinite(hi)):
    return "inconclusive at 95%"
  if strict:
    if at_least:
      return "holds" if lo > threshold else "does not hold" if hi <= threshold else "inconclusive at 95%"
    return "holds" if hi < threshold else "does not hold" if lo >= threshold else "inconclusive at 95%"
  if at_least:
    return "holds" if lo >= threshold else "does not hold" if hi < threshold else "inconclusive at 95%"
  return "holds" if hi <= threshold else "does not hold" if lo > threshold else "inconclusive at 95%"


def within(lo: float, hi: float, low: float, high: float) -> str:
  """A claim "value lies in [low, high]" against an interval [lo, hi]: 'holds' if the interval is inside the band,
  'does not hold' if it is wholly outside it, 'inconclusive at 95%' otherwise (it crosses an edge; NaNs too)."""
  if not (math.isfinite(lo) and math.isfinite(hi)):
    return "inconclusive at 95%"
  if low <= lo and hi <= high:
    return "holds"
  if hi < low or lo > high:
    return "does not hold"
  return "inconclusive at 95%"


def bands(
  curves: Sequence[Sequence[float]], *, level: float = 0.95, n_boot: int = 2_000, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Per-step mean and bootstrap interval over seeds of equally long curves [seeds, steps] (seeds resampled
  whole, so the band of every step comes from the same resamples). Returns (mean, lo, hi), each [steps]."""
  c = np.asarray(curves, np.float64)
  if c.ndim != 2 or c.shape[0] == 0:
    raise ValueError(f"bands: curves must be [seeds, steps] with at least one seed; got shape {c.shape}")
  m = c.mean(axis=0)
  if c.shape[0] == 1:
    return m, m.copy(), m.copy()
  rng = np.random.default_rng(seed)
  boot = c[rng.integers(0, c.shape[0], (n_boot, c.shape[0]))].mean(axis=1)  # [n_boot, steps]
  a = (1.0 - level) / 2
  lo, hi = np.quantile(boot, [a, 1.0 - a], axis=0)
  return m, lo, hi
