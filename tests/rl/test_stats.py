"""lrl_jax.rl.stats against SciPy (an independent implementation): the sign test against `binomtest`, the
percentile bootstrap against `scipy.stats.bootstrap`, and the verdict rule on its three cases."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from lrl_jax.rl import stats


@pytest.mark.parametrize("pos,neg,ties", [(10, 0, 0), (7, 3, 2), (5, 5, 0), (1, 8, 1), (0, 0, 3), (12, 4, 0)])
def test_sign_test_is_the_exact_binomial_test(pos, neg, ties):
  d = [0.3] * pos + [-0.2] * neg + [0.0] * ties + [math.nan]
  p = stats.sign_test(d)
  want = 1.0 if pos + neg == 0 else sps.binomtest(pos, pos + neg, 0.5).pvalue
  assert p == pytest.approx(want, rel=1e-12)


def test_mean_interval_matches_scipys_percentile_bootstrap():
  # Both are Monte-Carlo estimates of the same quantiles of the bootstrap distribution of the mean. For 10
  # standard-normal values that distribution has sd ≈ 0.3; a 2.5% quantile from B = 10^4 resamples has standard
  # error ≈ sqrt(0.025 · 0.975 / B) / density ≈ 0.0016 / 0.19 ≈ 0.008 in each estimate; 0.06 is > 5 of those.
  x = np.random.default_rng(3).standard_normal(10)
  iv = stats.mean_interval(x)
  ref = sps.bootstrap((x,), np.mean, method="percentile", n_resamples=10_000, random_state=1).confidence_interval
  assert iv.mean == pytest.approx(x.mean(), rel=1e-12)
  assert iv.lo == pytest.approx(ref.low, abs=0.06)
  assert iv.hi == pytest.approx(ref.high, abs=0.06)
  assert iv.n == 10 and iv.lo < iv.mean < iv.hi


def test_mean_interval_on_two_values_is_the_exact_bootstrap():
  # Resampling {0, 1} twice gives a mean of 0, 1/2, 1 with probabilities 1/4, 1/2, 1/4: the 2.5% and 97.5%
  # quantiles are exactly 0 and 1.
  iv = stats.mean_interval([0.0, 1.0])
  assert (iv.mean, iv.lo, iv.hi) == (0.5, 0.0, 1.0)


def test_degenerate_inputs():
  one = stats.mean_interval([0.25, math.nan])
  assert (one.mean, one.lo, one.hi, one.n) == (0.25, 0.25, 0.25, 1)
  none = stats.mean_interval([])
  assert none.n == 0 and math.isnan(none.mean) and none.fmt() == "n/a"
  with pytest.raises(ValueError, match="level"):
    stats.mean_interval([1.0, 2.0], level=1.0)
  with pytest.raises(ValueError, match=r"shape \(3,\)"):
    stats.bands([1.0, 2.0, 3.0])


def test_paired_uses_the_shared_seeds_only():
  a = {0: 0.9, 1: 0.5, 2: 0.7, 3: 0.2, 4: math.nan}
  b = {0: 0.8, 1: 0.6, 2: 0.7, 3: 0.1, 5: 0.4}
  p = stats.paired(a, b)
  d = np.asarray([0.1, -0.1, 0.0, 0.1])
  assert (p.wins, p.losses, p.ties, p.diff.n) == (2, 1, 1, 4)
  assert p.diff.mean == pytest.approx(d.mean(), abs=1e-15)
  assert p.p_sign == pytest.approx(sps.binomtest(2, 3, 0.5).pvalue, rel=1e-12)


@pytest.mark.parametrize(
  "lo,hi,at_least,want",
  [
    (0.1, 0.3, True, "holds"),
    (-0.3, -0.1, True, "does not hold"),
    (-0.1, 0.3, True, "inconclusive at 95%"),
    (-0.3, -0.1, False, "holds"),
    (0.1, 0.3, False, "does not hold"),
    (math.nan, 0.3, True, "inconclusive at 95%"),
  ],
)
def test_verdict(lo, hi, at_least, want):
  assert stats.verdict(lo, hi, 0.0, at_least=at_least) == want


def test_strict_verdict_needs_the_interval_off_the_threshold():
  assert stats.verdict(0.0, 0.0, 0.0) == "holds"  # "A − B >= 0"
  assert stats.verdict(0.0, 0.0, 0.0, strict=True) == "does not hold"  # "A − B > 0" ("A helps")
  assert stats.verdict(0.0, 0.2, 0.0, strict=True) == "inconclusive at 95%"
  assert stats.verdict(0.01, 0.2, 0.0, strict=True) == "holds"
  assert stats.verdict(-0.2, -0.01, 0.0, at_least=False, strict=True) == "holds"
  assert stats.verdict(-0.2, 0.0, 0.0, at_least=False, strict=True) == "inconclusive at 95%"


@pytest.mark.parametrize(
  "lo,hi,want",
  [
    (-0.01, 0.01, "holds"),  # the edges belong to the band
    (-0.005, 0.002, "holds"),
    (0.02, 0.05, "does not hold"),
    (-0.05, -0.02, "does not hold"),
    (-0.02, 0.0, "inconclusive at 95%"),  # crosses an edge
    (-0.02, 0.02, "inconclusive at 95%"),  # wider than the band
    (math.nan, 0.0, "inconclusive at 95%"),
  ],
)
def test_within_band(lo, hi, want):
  assert stats.within(lo, hi, -0.01, 0.01) == want


def test_bands_resample_whole_seeds():
  rng = np.random.default_rng(0)
  c = rng.standard_normal((10, 5))
  m, lo, hi = stats.bands(c, n_boot=10_000)
  np.testing.assert_allclose(m, c.mean(axis=0), rtol=0, atol=1e-15)
  assert np.all(lo < m) and np.all(m < hi)
  # The same seed resamples as mean_interval's: every step's band is that step's column's interval, exactly.
  for t in range(5):
    iv = stats.mean_interval(c[:, t], n_boot=10_000)
    assert (lo[t], hi[t]) == pytest.approx((iv.lo, iv.hi), abs=1e-12)
