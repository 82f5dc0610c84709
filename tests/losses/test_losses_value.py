"""Quantized advantage estimation: LSQ quantized value, Δ schedule, mixed value loss, smoothing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lrl_jax.losses

from . import losses_np_ref as ref
from .losses_testutil import jitted

L = jitted(lrl_jax.losses)  # every array function under jax.jit (see losses_testutil)


def test_quantize_value_forward_and_lsq_gradient():
  v = np.array([0.23, -0.17, 0.049, 1.26, 0.0])
  d = 0.1
  q = L.quantize_value(v, d)
  np.testing.assert_allclose(q, np.round(v / d) * d, rtol=1e-6, atol=1e-8)
  # ∂/∂v = 1 (straight through); ∂/∂Δ = round(v/Δ) − v/Δ (LSQ, Esser et al. 2020)
  gv = jax.jit(jax.grad(lambda x: jnp.sum(L.quantize_value(x, d))))(jnp.asarray(v, jnp.float32))
  np.testing.assert_allclose(gv, np.ones_like(v))
  gd = jax.jit(jax.grad(lambda s: jnp.sum(L.quantize_value(v, s))))(jnp.float32(d))
  np.testing.assert_allclose(gd, np.sum(np.round(v / d) - v / d), rtol=1e-5)
  gd_scaled = jax.jit(jax.grad(lambda s: jnp.sum(L.quantize_value(v, s, grad_scale=0.25))))(jnp.float32(d))
  np.testing.assert_allclose(gd_scaled, 0.25 * gd, rtol=1e-6)
  # hand values: 0.23/0.1 = 2.3 -> 0.2 (grad −0.3); −0.17 -> −0.2 (grad −0.3)
  np.testing.assert_allclose(L.quantize_value(np.array([0.23, -0.17]), 0.1), [0.2, -0.2], rtol=1e-6)
  with pytest.raises(ValueError, match="delta must be a scalar"):
    L.quantize_value(v, np.ones(2))


def test_delta_schedule():
  steps = [0, 999, 1000, 4999, 5000, 10**6]
  got = [float(L.delta_schedule(s)) for s in steps]
  np.testing.assert_allclose(got, [0.3, 0.3, 0.2, 0.2, 0.1, 0.1], rtol=1e-6)
  got = jax.jit(lambda s: L.delta_multiplier(s, boundaries=(10,), multipliers=(4.0, 1.0)))(jnp.int32(10))
  assert float(got) == 1.0
  with pytest.raises(ValueError, match="len\\(multipliers\\)"):
    L.delta_multiplier(0, boundaries=(1,), multipliers=(1.0,))


def test_value_head():
  key = jax.random.key(0)
  p = L.value_head_init(key, 8)
  h = np.random.default_rng(1).normal(size=(2, 3, 8))
  vq, vr = L.value_head_apply(p, h, delta_mult=3.0)
  want_raw = h @ np.asarray(p["kernel"], np.float64)[:, 0] + float(p["bias"][0])
  np.testing.assert_allclose(vr, want_raw, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(vq, np.round(want_raw / 0.3) * 0.3, rtol=1e-5, atol=1e-6)
  g = jax.jit(jax.grad(lambda p: jnp.sum(L.value_head_apply(p, h)[0])))(p)
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(g)) and float(g["delta"]) != 0.0
  p3 = L.value_head_init(key, 8, num_quantiles=3)
  assert L.value_head_apply(p3, h)[0].shape == (2, 3, 3)


def pinball_ref(u, tau):
  return max(tau * u, (tau - 1) * u)


@pytest.mark.parametrize("alpha,taus", [(0.7, (0.5,)), (0.3, (0.1, 0.5, 0.9)), (1.0, (0.25,))])
def test_value_loss_vs_reference(alpha, taus):
  rng = np.random.default_rng(2)
  k = len(taus)
  v = rng.normal(size=(3, 5, k)) if k > 1 else rng.normal(size=(3, 5))
  r = rng.normal(size=(3, 5))
  m = rng.random((3, 5)) > 0.3
  loss, met = L.value_loss(v, r, m, alpha=alpha, quantile_levels=taus, agg="seq-mean-token-mean")
  v3 = v if k > 1 else v[..., None]
  pin = np.zeros((3, 5))
  mse = np.zeros((3, 5))
  for i, j in zip(*np.nonzero(m)):
    pin[i, j] = np.mean([pinball_ref(r[i, j] - v3[i, j, q], taus[q]) for q in range(k)])
    mse[i, j] = (r[i, j] - np.mean(v3[i, j])) ** 2
  want = alpha * ref.aggregate(pin, m, "seq-mean-token-mean") + (1 - alpha) * ref.aggregate(
    mse, m, "seq-mean-token-mean"
  )
  np.testing.assert_allclose(loss, want, rtol=1e-5)
  np.testing.assert_allclose(met["vf_mse"].value, mse[m].mean(), rtol=1e-5)
  np.testing.assert_allclose(met["vf_quantile"].value, pin[m].mean(), rtol=1e-5)


@pytest.mark.parametrize("taus", [(0.5,), (0.1, 0.5, 0.9)])
def test_value_loss_clipped_vs_reference(taus):
  """PPO value clipping: per token, the larger of each term at V and at V_c = V_old + clip(V − V_old, ±ε) (float64
  NumPy, rtol 1e-5: f32 sums of 15 terms); the gradient flows only through the term that wins, so at a token where
  the clipped one wins and V moved beyond ε, V gets no gradient."""
  rng = np.random.default_rng(4)
  k, eps, alpha = len(taus), 0.2, 0.7
  shape = (3, 5, k) if k > 1 else (3, 5)
  v, old = rng.normal(size=shape), rng.normal(size=shape)
  r = rng.normal(size=(3, 5))
  m = rng.random((3, 5)) > 0.3
  loss, met = L.value_loss(v, r, m, alpha=alpha, quantile_levels=taus, old_values=old, clip=eps)
  v3, o3 = (v, old) if k > 1 else (v[..., None], old[..., None])
  vc = o3 + np.clip(v3 - o3, -eps, eps)
  pin, mse, won = np.zeros((3, 5)), np.zeros((3, 5)), np.zeros((3, 5), bool)
  for i, j in zip(*np.nonzero(m)):
    p1 = np.mean([pinball_ref(r[i, j] - v3[i, j, q], taus[q]) for q in range(k)])
    p2 = np.mean([pinball_ref(r[i, j] - vc[i, j, q], taus[q]) for q in range(k)])
    m1, m2 = (r[i, j] - v3[i, j].mean()) ** 2, (r[i, j] - vc[i, j].mean()) ** 2
    pin[i, j], mse[i, j], won[i, j] = max(p1, p2), max(m1, m2), m2 > m1
  want = alpha * pin[m].mean() + (1 - alpha) * mse[m].mean()  # token-mean
  np.testing.assert_allclose(loss, want, rtol=1e-5)
  np.testing.assert_allclose(met["vf_clipfrac"].value, won[m].mean(), rtol=1e-6)
  if k == 1:
    g = np.asarray(jax.grad(lambda x: L.value_loss(x, r, m, alpha=0.0, old_values=old, clip=eps)[0])(v))
    frozen = m & won & (np.abs(v - old) > eps)
    assert frozen.any() and np.all(g[frozen] == 0)
    np.testing.assert_allclose(g[m & ~won], -2 * (r - v)[m & ~won] / m.sum(), rtol=1e-5)
  with pytest.raises(ValueError, match="clip needs old_values"):
    L.value_loss(v, r, m, quantile_levels=taus, clip=eps)


def test_value_loss_hand_and_errors():
  # u = 1 at τ = 0.5: pinball 0.5, MSE 1 -> 0.7·0.5 + 0.3·1 = 0.65
  loss, _ = L.value_loss(np.zeros((1, 1)), np.ones((1, 1)), np.ones((1, 1)))
  np.testing.assert_allclose(loss, 0.65, rtol=1e-6)
  with pytest.raises(ValueError, match="K = len\\(quantile_levels\\)"):
    L.value_loss(np.zeros((1, 2, 3)), np.zeros((1, 2)), np.ones((1, 2)))
  with pytest.raises(ValueError, match="alpha"):
    L.value_loss(np.zeros((1, 2)), np.zeros((1, 2)), np.ones((1, 2)), alpha=1.5)


def smooth_ref(adv, mask, beta):
  out = np.zeros_like(adv)
  for b in range(adv.shape[0]):
    pos = ref.real_positions(mask[b])
    for n, t in enumerate(pos):
      prev = adv[b, pos[n - 1]] if n > 0 else adv[b, t]
      out[b, t] = beta * adv[b, t] + (1 - beta) * prev
  return out


def test_smooth_advantages():
  # hand: A = (1, 3, _, 5) with a hole at 2, β = 0.9 -> (1, 2.8, 0, 4.8)
  got = L.smooth_advantages(np.array([[1.0, 3.0, 99.0, 5.0]]), np.array([[1, 1, 0, 1]]), beta=0.9)
  np.testing.assert_allclose(got, [[1.0, 2.8, 0.0, 4.8]], rtol=1e-6)
  rng = np.random.default_rng(3)
  a = rng.normal(size=(4, 9))
  m = rng.random((4, 9)) > 0.4
  m[3] = False
  np.testing.assert_allclose(L.smooth_advantages(a, m, beta=0.7), smooth_ref(a, m, 0.7), rtol=1e-6, atol=1e-7)
  # padding / batch of one
  ap = np.pad(a, ((0, 0), (0, 2)), constant_values=np.nan)
  mp = np.pad(m, ((0, 0), (0, 2)))
  np.testing.assert_array_equal(
    np.asarray(L.smooth_advantages(ap, mp, beta=0.7))[:, :9], L.smooth_advantages(a, m, beta=0.7)
  )
  np.testing.assert_array_equal(L.smooth_advantages(a[1:2], m[1:2]), np.asarray(L.smooth_advantages(a, m))[1:2])
