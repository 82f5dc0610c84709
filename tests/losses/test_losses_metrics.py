"""Mismatch metrics and aggregation / metric combinators against float64 NumPy."""

import math

import numpy as np
import pytest

import lrl_jax.losses

from . import losses_np_ref as ref
from .losses_testutil import jitted

L = jitted(lrl_jax.losses)  # every array function under jax.jit (see losses_testutil)


def test_mismatch_metrics_vs_reference():
  rng = np.random.default_rng(0)
  mu = rng.normal(size=(3, 8)) * 0.8 - 1.2
  pi = mu + rng.normal(size=(3, 8)) * 0.3
  m = rng.random((3, 8)) > 0.3
  m[2] = False  # an empty row
  got = L.finalize_metrics(L.mismatch_metrics(pi, mu, m))
  a, b = pi[m], mu[m]
  lr = a - b
  r = np.exp(lr)
  np.testing.assert_allclose(got["prob_abs_diff_mean"], np.mean(np.abs(np.exp(a) - np.exp(b))), rtol=1e-5)
  np.testing.assert_allclose(got["prob_abs_diff_max"], np.max(np.abs(np.exp(a) - np.exp(b))), rtol=1e-5)
  np.testing.assert_allclose(got["log_abs_diff_mean"], np.mean(np.abs(lr)), rtol=1e-5)
  np.testing.assert_allclose(got["kl_k1"], np.mean(-lr), rtol=1e-5)
  np.testing.assert_allclose(got["kl_k3"], np.mean(r - 1 - lr), rtol=1e-4)
  lpp = [np.mean(mu[i][m[i]] - pi[i][m[i]]) for i in range(2)]
  np.testing.assert_allclose(got["log_ppl_ratio"], np.mean(lpp), rtol=1e-5)
  np.testing.assert_allclose(got["ess_token"], ref.ess(r), rtol=1e-5)
  np.testing.assert_allclose(got["pearson_logp"], np.corrcoef(a, b)[0, 1], rtol=1e-5)
  assert float(got["nonfinite_frac"]) == 0.0


def test_mismatch_metrics_hand_and_nonfinite():
  # π = (0.5, 0.25), μ = (0.25, 0.25): |Δp| = (0.25, 0), log r = (ln 2, 0)
  pi = np.log([[0.5, 0.25, 0.1]])
  mu = np.array([[np.log(0.25), np.log(0.25), -np.inf]])  # third token: μ = 0
  m = np.array([[1, 1, 1]])
  got = L.finalize_metrics(L.mismatch_metrics(pi, mu, m))
  np.testing.assert_allclose(got["prob_abs_diff_mean"], (0.25 + 0 + 0.1) / 3, rtol=1e-6)
  np.testing.assert_allclose(got["kl_k1"], -math.log(2) / 2, rtol=1e-6)  # finite tokens only
  np.testing.assert_allclose(got["kl_k3"], (1 - math.log(2)) / 2, rtol=1e-6)
  np.testing.assert_allclose(got["nonfinite_frac"], 1 / 3, rtol=1e-6)
  np.testing.assert_allclose(got["ess_token"], 1 / 3, rtol=1e-6)  # one infinite weight dominates
  assert all(np.isfinite(v) for v in got.values())


@pytest.mark.parametrize("agg", L.AGG_MODES)
def test_aggregate_vs_reference(agg):
  rng = np.random.default_rng(1)
  x = rng.normal(size=(4, 6))
  m = rng.random((4, 6)) > 0.4
  m[1] = False
  np.testing.assert_allclose(L.aggregate(x, m, agg=agg, norm_len=10), ref.aggregate(x, m, agg, 10), rtol=1e-6)
  assert float(L.aggregate(x, np.zeros_like(m), agg=agg)) == 0.0


def test_aggregate_hand():
  x = np.array([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
  m = np.array([[1, 1, 1], [1, 0, 0]])
  assert float(L.aggregate(x, m, agg="token-mean")) == pytest.approx(10 / 4)
  assert float(L.aggregate(x, m, agg="seq-mean-token-mean")) == pytest.approx((2 + 4) / 2)
  assert float(L.aggregate(x, m, agg="seq-mean-token-sum")) == pytest.approx((6 + 4) / 2)
  assert float(L.aggregate(x, m, agg="seq-mean-token-sum-norm", norm_len=5)) == pytest.approx(10 / (2 * 5))
  with pytest.raises(ValueError, match="agg must be one of"):
    L.aggregate(x, m, agg="sum")


def test_merge_and_finalize():
  a = {"m": L.Mean(np.float32(3.0), np.float32(2.0)), "x": L.Max(np.float32(1.0)), "s": np.float32(0.5)}
  b = {"m": L.Mean(np.float32(5.0), np.float32(6.0)), "x": L.Max(np.float32(4.0)), "s": np.float32(1.5)}
  got = L.finalize_metrics(L.merge_metrics([a, b]))
  assert float(got["m"]) == pytest.approx(1.0) and float(got["x"]) == 4.0 and float(got["s"]) == 1.0
  assert float(L.Mean(np.float32(0), np.float32(0)).value) == 0.0
