"""Advantages: GRPO / Dr.GRPO / RLOO / GAE / whitening against float64 NumPy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lrl_jax.losses

from . import losses_np_ref as ref
from .losses_testutil import jitted

L = jitted(lrl_jax.losses)  # every array function under jax.jit (see losses_testutil)

RTOL, ATOL = 1e-5, 1e-6  # f32 implementation vs f64 reference


def test_grpo_hand_computed():
  # One group of 4: rewards 1, 0, 0, 1 -> mean 0.5, unbiased std sqrt(1/3).
  r = np.array([1.0, 0.0, 0.0, 1.0])
  a = L.grpo_advantages(r, group_size=4, eps=0.0)
  s = 0.5 / np.sqrt(1 / 3)
  np.testing.assert_allclose(a, [s, -s, -s, s], rtol=1e-6)
  np.testing.assert_allclose(L.dr_grpo_advantages(r, group_size=4), [0.5, -0.5, -0.5, 0.5])
  # RLOO: 1 - (0 + 0 + 1)/3 = 2/3; 0 - 2/3 = -2/3.
  np.testing.assert_allclose(L.rloo_advantages(r, group_size=4), [2 / 3, -2 / 3, -2 / 3, 2 / 3], rtol=1e-6)
  # Equal rewards: advantage 0 (no NaN from a zero std).
  np.testing.assert_array_equal(L.grpo_advantages(np.ones(4), group_size=4), np.zeros(4))


@pytest.mark.parametrize("scale_by_std,ddof", [(True, 1), (True, 0), (False, 1)])
def test_grpo_random_with_mask(scale_by_std, ddof):
  rng = np.random.default_rng(1)
  r = rng.normal(size=24)
  keep = rng.random(24) > 0.3
  keep[:4] = [True, False, False, False]  # a group with one kept completion
  got = L.grpo_advantages(r, group_size=4, mask=keep, scale_by_std=scale_by_std, ddof=ddof)
  want = ref.grpo(r, 4, keep, scale_by_std, ddof=ddof)
  np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(L.rloo_advantages(r, group_size=4, mask=keep), ref.rloo(r, 4, keep), rtol=RTOL, atol=ATOL)


@settings(max_examples=20, deadline=None)
@given(st.permutations(range(6)), st.integers(0, 2**31 - 1))
def test_group_permutation_invariance(perm, seed):
  """Permuting the completions of a group permutes their advantages."""
  r = np.random.default_rng(seed).normal(size=12)
  perm = np.array(perm)
  full = np.concatenate([perm, 6 + np.arange(6)])
  for fn in (L.grpo_advantages, L.dr_grpo_advantages, L.rloo_advantages):
    np.testing.assert_allclose(fn(r[full], group_size=6), np.asarray(fn(r, group_size=6))[full], rtol=1e-6, atol=1e-6)


def test_grpo_masked_equals_removed():
  rng = np.random.default_rng(2)
  r = rng.normal(size=8)
  keep = np.array([1, 1, 0, 1, 1, 1, 1, 0], bool)
  a = L.grpo_advantages(r, group_size=4, mask=keep)
  # the groups with the dropped rows removed are groups of 3
  b = L.grpo_advantages(r[keep], group_size=3)
  np.testing.assert_allclose(np.asarray(a)[keep], b, rtol=1e-6)
  assert np.all(np.asarray(a)[~keep] == 0)


def test_grpo_bad_input():
  with pytest.raises(ValueError, match="group_size=3"):
    L.grpo_advantages(np.zeros(8), group_size=3)
  with pytest.raises(ValueError, match=r"rewards must be \[B\]"):
    L.rloo_advantages(np.zeros((2, 4)), group_size=4)


# ------------------------------------------------------------------ GAE


def test_gae_hand_computed():
  # One row, tokens 0..2 real, outcome reward 1 on the last, V = (0.5, 0.6, 0.7), γ = 1, λ = 0.5.
  r = np.array([[0.0, 0.0, 1.0, 0.0]])
  v = np.array([[0.5, 0.6, 0.7, 9.0]])
  m = np.array([[1, 1, 1, 0]])
  # δ = (0 + 0.6 − 0.5, 0 + 0.7 − 0.6, 1 + 0 − 0.7) = (0.1, 0.1, 0.3)
  # A_2 = 0.3; A_1 = 0.1 + 0.5·0.3 = 0.25; A_0 = 0.1 + 0.5·0.25 = 0.225
  adv, ret = L.gae_advantages(r, v, m, gamma=1.0, lam=0.5)
  np.testing.assert_allclose(adv, [[0.225, 0.25, 0.3, 0.0]], rtol=1e-6)
  np.testing.assert_allclose(ret, [[0.725, 0.85, 1.0, 0.0]], rtol=1e-6)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)]))
def test_gae_vs_double_loop(seed, gl):
  gamma, lam = gl
  rng = np.random.default_rng(seed)
  r = rng.normal(size=(3, 7))
  v = rng.normal(size=(3, 7))
  m = rng.random((3, 7)) > 0.35  # holes inside rows (multi-turn) and maybe empty rows
  adv, ret = L.gae_advantages(r, v, m, gamma=gamma, lam=lam)
  want_adv, want_ret = ref.gae_double_loop(r, v, m, gamma, lam)
  np.testing.assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-5)


def test_gae_padding_and_batch_of_one():
  rng = np.random.default_rng(3)
  r, v = rng.normal(size=(2, 5)), rng.normal(size=(2, 5))
  m = np.array([[1, 1, 0, 1, 1], [1, 1, 1, 0, 0]], bool)
  adv, _ = L.gae_advantages(r, v, m)
  # right-padding with garbage under mask 0 changes nothing
  rp = np.concatenate([r, np.full((2, 3), np.nan)], 1)
  vp = np.concatenate([v, np.full((2, 3), np.inf)], 1)
  mp = np.concatenate([m, np.zeros((2, 3), bool)], 1)
  adv_p, _ = L.gae_advantages(rp, vp, mp)
  np.testing.assert_array_equal(np.asarray(adv_p)[:, :5], adv)
  # each row alone (a batch of one) == its row in the batch
  for b in range(2):
    np.testing.assert_allclose(L.gae_advantages(r[b : b + 1], v[b : b + 1], m[b : b + 1])[0], adv[b : b + 1], rtol=1e-7)


def test_normalize_advantages():
  rng = np.random.default_rng(4)
  a = rng.normal(size=(3, 6)) * 3 + 1
  m = rng.random((3, 6)) > 0.3
  got = L.normalize_advantages(a, m)
  x = a[m]
  want = np.zeros_like(a)
  want[m] = (x - x.mean()) / (x.std() + 1e-8)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_gae_gradient_free_values_and_finite_rewards_grad():
  r = jnp.ones((2, 4))
  v = jnp.ones((2, 4))
  m = jnp.array([[1, 1, 1, 1], [0, 0, 0, 0]])
  g = jax.jit(jax.grad(lambda r: jnp.sum(L.gae_advantages(r, v, m)[0])))(r)
  assert np.all(np.isfinite(g)) and np.all(np.asarray(g)[1] == 0)
