"""episodic_gae and dqn_targets against float64 NumPy references (Schulman et al. 2016; Mnih et al. 2015)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lrl_jax import losses
from lrl_jax.control import dqn_targets, episodic_gae
from tests._fp_bound import rounding_bound


def _gae_np(r, v, d, last_v, gamma, lam):
  r, v, d = (np.asarray(a, np.float64) for a in (r, v, d))
  t_len = r.shape[0]
  adv = np.zeros_like(r)
  a_next = np.zeros(r.shape[1])
  v_next = np.asarray(last_v, np.float64)
  for t in reversed(range(t_len)):
    nd = 1.0 - d[t]
    delta = r[t] + gamma * nd * v_next - v[t]
    adv[t] = delta + gamma * lam * nd * a_next
    a_next, v_next = adv[t], v[t]
  return adv, adv + v


@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.9, 1.0), (1.0, 0.0)])
def test_episodic_gae_matches_numpy(gamma, lam):
  rng = np.random.default_rng(0)
  t_len, e = 13, 5
  r = rng.normal(size=(t_len, e)).astype(np.float32)
  v = rng.normal(size=(t_len, e)).astype(np.float32)
  d = (rng.random((t_len, e)) < 0.2).astype(np.float32)
  last_v = rng.normal(size=(e,)).astype(np.float32)
  adv, ret = jax.jit(lambda *a: episodic_gae(*a, gamma=gamma, lam=lam))(r, v, d, last_v)
  ref_adv, ref_ret = _gae_np(r, v, d, last_v, gamma, lam)
  np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ret, ref_ret, rtol=1e-5, atol=1e-5)


def test_episodic_gae_equals_losses_gae_without_boundaries():
  """No done inside the rollout and a zero bootstrap: the LLM GAE of lrl_jax.losses ([B, T] = transpose)."""
  rng = np.random.default_rng(1)
  r = rng.normal(size=(9, 4)).astype(np.float32)
  v = rng.normal(size=(9, 4)).astype(np.float32)
  adv, ret = episodic_gae(r, v, np.zeros_like(r), np.zeros(4, np.float32), gamma=0.97, lam=0.9)
  ladv, lret = losses.gae_advantages(r.T, v.T, np.ones((4, 9), bool), gamma=0.97, lam=0.9)
  # Two f32 programs for one recursion: each within its first-order rounding bound of the exact values.
  ba = rounding_bound(
    lambda r, v: episodic_gae(r, v, jnp.zeros_like(r), jnp.zeros(4, jnp.float32), gamma=0.97, lam=0.9), r, v
  )
  bl = rounding_bound(lambda r, v: losses.gae_advantages(r, v, np.ones((4, 9), bool), gamma=0.97, lam=0.9), r.T, v.T)
  for b in (ba, bl):
    b.assert_stable()
  np.testing.assert_array_less(np.abs(np.asarray(adv) - np.asarray(ladv).T), ba.err[0] + bl.err[0].T)
  np.testing.assert_array_less(np.abs(np.asarray(ret) - np.asarray(lret).T), ba.err[1] + bl.err[1].T)


def test_episodic_gae_done_cuts_the_episode():
  # A done at t=1: steps 0..1 must not see rewards or values from t >= 2.
  r = np.array([[1.0], [2.0], [100.0]], np.float32)
  v = np.array([[0.5], [0.25], [50.0]], np.float32)
  d = np.array([[0.0], [1.0], [0.0]], np.float32)
  adv, _ = episodic_gae(r, v, d, np.array([7.0], np.float32), gamma=0.5, lam=0.5)
  # t=1: δ = 2 - 0.25 = 1.75; t=0: δ = 1 + 0.5*0.25 - 0.5 = 0.625, A = 0.625 + 0.25*1.75
  np.testing.assert_allclose(np.asarray(adv)[:2, 0], [0.625 + 0.25 * 1.75, 1.75], rtol=1e-6)


def test_episodic_gae_bad_shapes():
  with pytest.raises(ValueError, match="last_value"):
    episodic_gae(np.zeros((3, 2)), np.zeros((3, 2)), np.zeros((3, 2)), np.zeros((3,)))
  with pytest.raises(ValueError, match=r"\[T, E\]"):
    episodic_gae(np.zeros((3,)), np.zeros((3,)), np.zeros((3,)), np.zeros(()))


@pytest.mark.parametrize("double", [False, True])
def test_dqn_targets_match_numpy(double):
  rng = np.random.default_rng(2)
  b, a = 11, 3
  qt = rng.normal(size=(b, a)).astype(np.float32)
  qo = rng.normal(size=(b, a)).astype(np.float32)
  r = rng.normal(size=(b,)).astype(np.float32)
  d = (rng.random(b) < 0.3).astype(np.float32)
  y = jax.jit(lambda *x: dqn_targets(*x, gamma=0.9, q_next_online=qo if double else None))(qt, r, d)
  qt64 = qt.astype(np.float64)
  boot = qt64[np.arange(b), qo.argmax(1)] if double else qt64.max(1)
  np.testing.assert_allclose(y, r + 0.9 * (1.0 - d) * boot, rtol=1e-6, atol=1e-6)
  g = jax.grad(lambda q: jnp.sum(dqn_targets(q, r, d, gamma=0.9)))(jnp.asarray(qt))
  assert not np.any(np.asarray(g))  # targets carry no gradient


def test_dqn_targets_bad_shapes():
  with pytest.raises(ValueError, match="q_next_target"):
    dqn_targets(np.zeros((4,)), np.zeros((4,)), np.zeros((4,)))
