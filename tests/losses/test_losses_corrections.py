"""Mismatch corrections: TIS, MIS, ACRL (four-quadrant table), ESS, against float64 NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import lrl_jax.losses

from . import losses_np_ref as ref
from .losses_testutil import jitted

L = jitted(lrl_jax.losses)  # every array function under jax.jit (see losses_testutil)

NEG_INF = -np.inf


def batch(seed, b=4, t=6, spread=0.4):
  rng = np.random.default_rng(seed)
  mu = rng.normal(size=(b, t)) * 0.7 - 1.0
  pi = mu + rng.normal(size=(b, t)) * spread
  m = rng.random((b, t)) > 0.25
  m[:, 0] = True
  return pi, mu, m


# ------------------------------------------------------------------ TIS


def test_tis_hand_computed():
  # token ratios 3, 0.5, 1 -> weights min(r, 2) = 2, 0.5, 1; sequence: Π = 1.5 -> 1.5 on every token
  pi = np.log([[3.0, 0.5, 1.0]])
  mu = np.zeros((1, 3))
  m = np.ones((1, 3))
  w, met = L.tis_weights(pi, mu, m)
  np.testing.assert_allclose(w, [[2.0, 0.5, 1.0]], rtol=1e-6)
  np.testing.assert_allclose(met["frac_truncated"].value, 1 / 3, rtol=1e-6)
  np.testing.assert_allclose(met["ess_token"], 3.5**2 / (3 * 5.25), rtol=1e-6)
  w, _ = L.tis_weights(pi, mu, m, level="sequence")
  np.testing.assert_allclose(w, [[1.5, 1.5, 1.5]], rtol=1e-6)
  w, met = L.tis_weights(pi, mu, m, batch_normalize=True)
  np.testing.assert_allclose(w, [[2 / (3.5 / 3), 0.5 / (3.5 / 3), 1 / (3.5 / 3)]], rtol=1e-6)
  np.testing.assert_allclose(met["weight_mean"].value, 1.0, rtol=1e-6)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from(["token", "sequence"]), st.booleans())
def test_tis_vs_reference(seed, level, normalize):
  pi, mu, m = batch(seed, spread=0.5)
  w, met = L.tis_weights(pi, mu, m, level=level, clip_c=2.0, batch_normalize=normalize)
  want, units = ref.tis(pi, mu, m, level=level, c=2.0, normalize=normalize)
  np.testing.assert_allclose(w, want, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(met[f"ess_{level}"], ref.ess(list(units.values())), rtol=1e-5)
  np.testing.assert_allclose(met["weight_mean"].value, np.mean(list(units.values())), rtol=1e-5)


def test_tis_edge_cases():
  # row 0: μ = 0 (log μ = −inf) on a real token -> ratio inf -> truncated to C
  # row 1: π = 0 -> ratio 0 -> weight 0; row 2: both 0 -> ratio 1; row 3: empty sequence
  pi = np.array([[-1.0, -0.5], [NEG_INF, -0.5], [NEG_INF, -0.5], [np.nan, np.nan]])
  mu = np.array([[NEG_INF, -0.5], [-1.0, -0.5], [NEG_INF, -0.5], [np.inf, 0.0]])
  m = np.array([[1, 1], [1, 1], [1, 1], [0, 0]], bool)
  w, met = L.tis_weights(pi, mu, m)
  np.testing.assert_array_equal(w, [[2.0, 1.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
  assert np.isfinite(met["ess_token"]) and float(met["frac_truncated"].value) == pytest.approx(1 / 6)
  w, met = L.tis_weights(pi, mu, m, level="sequence")
  np.testing.assert_array_equal(w, [[2.0, 2.0], [0.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
  assert float(met["weight_mean"].count) == 3  # the empty sequence does not count
  w, _ = L.tis_weights(pi, mu, m, level="sequence", batch_normalize=True)
  np.testing.assert_allclose(w, np.array([[2.0, 2.0], [0.0, 0.0], [1.0, 1.0], [0, 0]]) / 1.0, rtol=1e-6)
  # +inf and −inf in one sequence: undefined -> weight 0
  w, _ = L.tis_weights(np.array([[NEG_INF, 0.0]]), np.array([[0.0, NEG_INF]]), np.ones((1, 2)), level="sequence")
  np.testing.assert_array_equal(w, [[0.0, 0.0]])
  # all-empty batch: zeros, no NaN
  w, met = L.tis_weights(pi, mu, np.zeros_like(m), batch_normalize=True)
  assert np.all(np.asarray(w) == 0) and np.isfinite(met["ess_token"])


def test_tis_sequence_log_space_no_overflow():
  # Σ log r = 200 over a sequence: exp would overflow f32, the clipped weight is just C
  pi = np.full((1, 100), 2.0)
  mu = np.zeros((1, 100))
  w, met = L.tis_weights(pi, mu, np.ones((1, 100)), level="sequence", clip_c=3.0)
  np.testing.assert_allclose(w, np.full((1, 100), 3.0), rtol=1e-6)


# ------------------------------------------------------------------ MIS


@pytest.mark.parametrize("level", ["sequence", "geometric", "token"])
@pytest.mark.parametrize("keep_ratio", [False, True])
def test_mis_vs_reference(level, keep_ratio):
  pi, mu, m = batch(30, spread=0.3)
  lo, hi = {"sequence": (0.5, 2.0), "geometric": (0.9, 1.1), "token": (0.8, 1.25)}[level]
  w, met = L.mis_weights(pi, mu, m, level=level, lo=lo, hi=hi, keep_ratio=keep_ratio)
  want, rejected = ref.mis(pi, mu, m, level=level, lo=lo, hi=hi, keep_ratio=keep_ratio)
  np.testing.assert_allclose(w, want, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(met["frac_masked"].value, np.mean(rejected), atol=1e-7)
  assert 0 < np.mean(rejected) < 1, "the case should reject some and keep some"


def test_mis_edge_cases():
  pi = np.array([[-1.0, -0.5], [NEG_INF, -0.5], [NEG_INF, -0.5], [0.0, 0.0], [-0.1, -0.1]])
  mu = np.array([[NEG_INF, -0.5], [-1.0, -0.5], [NEG_INF, -0.5], [0.0, 0.0], [0.0, 0.0]])
  m = np.array([[1, 1], [1, 1], [1, 1], [0, 0], [1, 1]], bool)
  w, met = L.mis_weights(pi, mu, m, level="sequence")
  # μ = 0 -> ρ = inf rejected; π = 0 -> ρ = 0 rejected; both 0 -> ρ = 1 kept; empty -> 0; e^−0.2 kept
  np.testing.assert_array_equal(w, [[0, 0], [0, 0], [1, 1], [0, 0], [1, 1]])
  np.testing.assert_allclose(met["frac_masked"].value, 2 / 4)
  np.testing.assert_allclose(met["frac_masked_tokens"].value, 4 / 8)
  w, _ = L.mis_weights(pi, mu, m, level="token")
  np.testing.assert_array_equal(w, [[0, 1], [0, 1], [1, 1], [0, 0], [1, 1]])
  with pytest.raises(ValueError, match="lo < hi"):
    L.mis_weights(pi, mu, m, lo=2.0, hi=1.0)
  # bounds are inclusive (compared in log space): ρ = 2 exactly is kept
  w, _ = L.mis_weights(np.log([[2.0]]), np.zeros((1, 1)), np.ones((1, 1)), hi=2.0)
  assert float(w[0, 0]) == 1.0


# ------------------------------------------------------------------ ACRL

# One sequence, one token per quadrant; r = π/μ = 1.5 (π > μ, HP) or 1/1.5 (π < μ, LP).
QUAD = {"PA&LP": (+1.0, 1 / 1.5), "PA&HP": (+1.0, 1.5), "NA&HP": (-1.0, 1.5), "NA&LP": (-1.0, 1 / 1.5)}
# The paper's table (Fan et al. 2026, Sec. 4 / AGPA): Y > X enhances PA&LP and NA&HP and
# suppresses PA&HP and NA&LP; Y < X reverses all four.
TABLE = {
  "Y>X": {"PA&LP": "enhance", "NA&HP": "enhance", "PA&HP": "suppress", "NA&LP": "suppress"},
  "Y<X": {"PA&LP": "suppress", "NA&HP": "suppress", "PA&HP": "enhance", "NA&LP": "enhance"},
}


def quadrant_batch():
  names = list(QUAD)
  mu = np.log(np.array([[0.4, 0.3, 0.3, 0.45]]))
  r = np.array([[QUAD[n][1] for n in names]])
  pi = mu + np.log(r)
  adv = np.array([[QUAD[n][0] for n in names]])
  return names, pi, mu, adv, np.ones((1, 4), bool)


@pytest.mark.parametrize("case", ["Y>X", "Y<X"])
def test_acrl_quadrant_table(case):
  names, pi, mu, adv, m = quadrant_batch()
  _, y, _ = L.acrl_discrepancy(pi, mu, m)
  y = float(y[0])
  x = y / 2 if case == "Y>X" else 2 * y
  w, state, met = L.acrl_weights(L.acrl_init(x), pi, mu, adv, m, gamma=0.65, clip_c=2.0)
  want, _ = ref.acrl(pi, mu, adv, m, x=x, gamma=0.65, c=2.0)
  np.testing.assert_allclose(w, want, rtol=1e-5)
  for j, name in enumerate(names):
    got = "enhance" if float(w[0, j]) > 1 else "suppress" if float(w[0, j]) < 1 else "neutral"
    assert got == TABLE[case][name], (case, name, float(w[0, j]))
  assert float(state.x) == pytest.approx(x)  # a set reference is never overwritten
  assert float(met["frac_y_above_x"].value) == (1.0 if case == "Y>X" else 0.0)
  # hand value: α = γ·sign(A)·(1 − Y/X); Y > X: 1 − 2 = −1 -> PA&LP: ρ = (1/1.5)^(−0.65) = 1.5^0.65
  if case == "Y>X":
    np.testing.assert_allclose(w[0, 0], 1.5**0.65, rtol=1e-5)


def test_acrl_sets_reference_once_under_jit():
  pi, mu, m = batch(40, spread=0.2)
  adv = np.random.default_rng(41).normal(size=(4,))
  f = jax.jit(L.acrl_weights)
  s0 = L.acrl_init()
  assert not bool(s0.is_set)
  w1, s1, met1 = f(s0, pi, mu, adv, m)
  want1, x1 = ref.acrl(pi, mu, adv, m)  # X measured on this batch
  np.testing.assert_allclose(s1.x, x1, rtol=1e-5)
  assert bool(s1.is_set)
  np.testing.assert_allclose(w1, want1, rtol=1e-5, atol=1e-7)
  pi2, mu2, m2 = batch(42, spread=0.6)
  w2, s2, _ = f(s1, pi2, mu2, adv, m2)
  want2, _ = ref.acrl(pi2, mu2, adv, m2, x=float(s1.x))
  np.testing.assert_allclose(w2, want2, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(s2.x, s1.x)
  # a batch without real tokens leaves an unset state unset
  _, s_empty, _ = f(s0, pi, mu, adv, np.zeros_like(m))
  assert not bool(s_empty.is_set)
  # settable
  s3 = L.acrl_set_reference(s2, 0.05)
  assert float(s3.x) == pytest.approx(0.05) and bool(s3.is_set)


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([0.1, 0.65, 2.0]))
@example(473, 2.0)  # a ρ past f32's range
def test_acrl_vs_reference_random(seed, gamma):
  pi, mu, m = batch(seed, spread=0.5)
  adv = np.random.default_rng(seed + 1).normal(size=pi.shape)
  x = 0.05
  w, _, met = L.acrl_weights(L.acrl_init(x), pi, mu, adv, m, gamma=gamma)
  want, _, alphas, rhos = ref.acrl(pi, mu, adv, m, x=x, gamma=gamma, full=True)
  np.testing.assert_allclose(w, want, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(met["weight_mean"].value, want[m].mean(), rtol=1e-4)
  # how far the control acts: |α| and |ρ − 1| (ρ = r^α in f32: rtol 1e-4 as for w; atol for ρ ≈ 1). A ρ past f32's
  # range is inf there (seed 473, γ = 2: ρ ≈ 1.2e39), so the reference's ρ is rounded to f32 first.
  with np.errstate(over="ignore"):
    dev = np.abs(np.asarray(rhos, np.float64).astype(np.float32).astype(np.float64) - 1.0)
  np.testing.assert_allclose(met["alpha_abs_mean"].value, np.mean(np.abs(alphas)), rtol=1e-5)
  np.testing.assert_allclose(met["rho_dev_mean"].value, dev.mean(), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(met["rho_dev_max"].value, dev.max(), rtol=1e-4, atol=1e-6)


def test_acrl_edge_cases():
  # μ = 0, π = 0, both 0, A = 0, empty row; X = 0 disables the control
  pi = np.array([[-0.5, NEG_INF, NEG_INF, -0.5], [0.0, 0.0, 0.0, 0.0]])
  mu = np.array([[NEG_INF, -0.5, NEG_INF, -1.0], [np.nan, 0.0, 0.0, 0.0]])
  adv = np.array([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
  m = np.array([[1, 1, 1, 1], [0, 0, 0, 0]], bool)
  for x in (0.01, 10.0):
    w, _, met = L.acrl_weights(L.acrl_init(x), pi, mu, adv, m)
    want, _ = ref.acrl(pi, mu, adv, m, x=x)
    np.testing.assert_allclose(w, want, rtol=1e-5)
    assert np.all(np.isfinite(w)) and np.isfinite(met["ess_token"])
  w, _, _ = L.acrl_weights(L.acrl_init(0.0), pi, mu, adv, m)
  np.testing.assert_array_equal(w, m.astype(np.float32))


def test_corrections_feed_ppo_gradient():
  """w multiplies the gradient of the clipped surrogate token by token."""
  pi, mu, m = batch(50, spread=0.2)
  logp = pi + 0.05
  adv = np.random.default_rng(51).normal(size=pi.shape)
  w, _ = L.tis_weights(pi, mu, m)
  lp = jnp.asarray(logp, jnp.float32)
  g = jax.jit(jax.grad(lambda lp: L.ppo_loss(lp, pi, adv, m, token_weights=w)[0]))(lp)
  g1 = jax.jit(jax.grad(lambda lp: L.ppo_loss(lp, pi, adv, m)[0]))(lp)
  np.testing.assert_allclose(g, np.asarray(g1) * np.asarray(w), rtol=1e-5, atol=1e-8)


def test_effective_sample_size():
  np.testing.assert_allclose(L.effective_sample_size(np.zeros(5), np.ones(5, bool)), 1.0)
  lw = np.log([1.0, 2.0, 3.0, 4.0])
  np.testing.assert_allclose(L.effective_sample_size(lw, np.ones(4, bool)), ref.ess([1, 2, 3, 4]), rtol=1e-6)
  # huge log-weights: computed in log space
  np.testing.assert_allclose(L.effective_sample_size(lw + 500.0, np.ones(4, bool)), ref.ess([1, 2, 3, 4]), rtol=1e-6)
  np.testing.assert_allclose(L.effective_sample_size(np.array([np.inf, 0.0, 0.0, np.inf]), np.ones(4, bool)), 0.5)
  assert float(L.effective_sample_size(np.zeros(3), np.zeros(3, bool))) == 0.0


def _acrl_with_x(pi, mu, adv, m):
  w, state, met = L.acrl_weights(L.acrl_init(), pi, mu, adv, m)
  return w, {**met, "x": state.x}


CORRECTIONS = {
  "tis_token": lambda pi, mu, a, m: L.tis_weights(pi, mu, m, batch_normalize=True),
  "tis_sequence": lambda pi, mu, a, m: L.tis_weights(pi, mu, m, level="sequence", batch_normalize=True),
  "mis_sequence": lambda pi, mu, a, m: L.mis_weights(pi, mu, m, keep_ratio=True),
  "mis_token": lambda pi, mu, a, m: L.mis_weights(pi, mu, m, level="token", lo=0.8, hi=1.25),
  "acrl": lambda pi, mu, a, m: _acrl_with_x(pi, mu, a, m),
  "mismatch_metrics": lambda pi, mu, a, m: (m.astype(np.float32), L.mismatch_metrics(pi, mu, m)),
}


@pytest.mark.parametrize("name", sorted(CORRECTIONS))
def test_corrections_padding_and_batch_of_one(name):
  """Garbage padding under mask 0 (tokens and a whole row) == sliced; a row alone == its row."""
  fn = CORRECTIONS[name]
  pi, mu, m = batch(60, spread=0.3)
  adv = np.random.default_rng(61).normal(size=pi.shape)
  w, met = fn(pi, mu, adv, m)
  pad = lambda x, v: np.pad(x, ((0, 1), (0, 2)), constant_values=v)
  wp, metp = fn(pad(pi, np.nan), pad(mu, -np.inf), pad(adv, np.inf), pad(m, False))
  np.testing.assert_allclose(np.asarray(wp)[:4, :6], w, rtol=1e-6)
  assert np.all(np.asarray(wp)[4] == 0) and np.all(np.asarray(wp)[:, 6:] == 0)
  a, b = L.finalize_metrics(met), L.finalize_metrics(metp)
  for k in a:
    np.testing.assert_allclose(b[k], a[k], rtol=1e-5, atol=1e-7, err_msg=k)


def test_sequence_weights_batch_of_one():
  """Per-sequence TIS / MIS weights of a row alone (a batch of one) == its row in the batch."""
  pi, mu, m = batch(62, spread=0.3)
  for fn in (
    lambda *a: L.tis_weights(*a, level="sequence")[0],
    lambda *a: L.mis_weights(*a, keep_ratio=True)[0],
    lambda *a: L.tis_weights(*a)[0],
  ):
    w = np.asarray(fn(pi, mu, m))
    for b in range(pi.shape[0]):
      np.testing.assert_allclose(fn(pi[b : b + 1], mu[b : b + 1], m[b : b + 1]), w[b : b + 1], rtol=1e-6)
