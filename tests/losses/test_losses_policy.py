"""Policy losses: PPO / DAPO / GRPO / Dr.GRPO, GSPO, KL estimators, entropy, against float64 NumPy."""

import math

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

B, T = 4, 7


def batch(seed, b=B, t=T, spread=0.3):
  rng = np.random.default_rng(seed)
  old = rng.normal(size=(b, t)) * 0.5 - 1.5
  logp = old + rng.normal(size=(b, t)) * spread
  adv = rng.normal(size=(b, t))
  m = rng.random((b, t)) > 0.3
  m[0, 0] = True
  return logp, old, adv, m


def test_ppo_hand_computed():
  # Three tokens, one sequence, token-mean, ε = (0.2, 0.28):
  #   r = 1.5, A = +1: clipped at 1.28 -> ℓ = −1.28, grad 0, counted in clip_frac_high
  #   r = 0.5, A = −1: min(−0.5, −0.8) = −0.8 (clipped at 0.8) -> ℓ = 0.8, counted in clip_frac_low
  #   r = 1.0, A = +2: ℓ = −2, dℓ/dlogp = −r·A = −2
  logp = np.log(np.array([[1.5, 0.5, 1.0]]))
  old = np.zeros((1, 3))
  adv = np.array([[1.0, -1.0, 2.0]])
  m = np.ones((1, 3))
  loss, met = L.ppo_loss(logp, old, adv, m)
  np.testing.assert_allclose(loss, (-1.28 + 0.8 - 2.0) / 3, rtol=1e-6)
  g = jax.jit(jax.grad(lambda lp: L.ppo_loss(lp, old, adv, m)[0]))(jnp.asarray(logp, jnp.float32))
  np.testing.assert_allclose(g, [[0.0, 0.0, -2.0 / 3]], rtol=1e-6, atol=1e-7)
  fm = L.finalize_metrics(met)
  np.testing.assert_allclose(fm["clip_frac_high"], 1 / 3, rtol=1e-6)
  np.testing.assert_allclose(fm["clip_frac_low"], 1 / 3, rtol=1e-6)
  np.testing.assert_allclose(fm["ratio_max"], 1.5, rtol=1e-6)
  np.testing.assert_allclose(fm["ratio_mean"], 1.0, rtol=1e-6)
  # dual clip c = 3: r = 4, A = −1 -> min(−4, −1.28) = −4 -> max(−4, −3) = −3 -> ℓ = 3, grad 0
  loss, met = L.ppo_loss(np.log([[4.0]]), np.zeros((1, 1)), np.array([-1.0]), np.ones((1, 1)), dual_clip_c=3.0)
  np.testing.assert_allclose(loss, 3.0, rtol=1e-6)
  assert float(met["dual_clip_frac"].value) == 1.0


@pytest.mark.parametrize(
  "agg,dual_c,weighted",
  [
    ("token-mean", None, False),
    ("seq-mean-token-mean", 3.0, True),
    ("seq-mean-token-sum", 3.0, False),
    ("seq-mean-token-sum-norm", None, True),
  ],
)
def test_ppo_vs_reference(agg, dual_c, weighted):
  logp, old, adv, m = batch(10, spread=0.5)
  w = np.random.default_rng(11).uniform(0.0, 2.0, size=logp.shape) if weighted else None
  kw = dict(clip_eps_low=0.2, clip_eps_high=0.28, dual_clip_c=dual_c, agg=agg, norm_len=12)
  loss, _ = L.ppo_loss(logp, old, adv, m, token_weights=w, **kw)
  want, want_grad = ref.ppo_loss(
    logp, old, adv, m, eps_low=0.2, eps_high=0.28, dual_c=dual_c, agg=agg, norm_len=12, weights=w
  )
  np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-7)
  grad_fn = jax.jit(jax.grad(lambda lp: L.ppo_loss(lp, old, adv, m, token_weights=w, **kw)[0]))
  g = grad_fn(jnp.asarray(logp, jnp.float32))
  np.testing.assert_allclose(g, want_grad, rtol=1e-4, atol=1e-7)


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from(["token-mean", "seq-mean-token-mean"]))
def test_ppo_random_batches(seed, agg):
  logp, old, adv, m = batch(seed, spread=0.4)
  adv_seq = adv[:, 0]
  loss, met = L.ppo_loss(logp, old, adv_seq, m, agg=agg)
  want, _ = ref.ppo_loss(logp, old, adv_seq, m, agg=agg)
  np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-7)
  ratio = np.exp(logp - old)[m]
  a = np.repeat(adv_seq[:, None], T, 1)[m]
  fm = L.finalize_metrics(met)
  np.testing.assert_allclose(fm["clip_frac_high"], np.mean((a > 0) & (ratio > 1.28)), atol=1e-7)
  np.testing.assert_allclose(fm["clip_frac_low"], np.mean((a < 0) & (ratio < 0.8)), atol=1e-7)
  np.testing.assert_allclose(fm["approx_kl"], np.mean(ratio - 1 - np.log(ratio)), rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(fm["ratio_max"], ratio.max(), rtol=1e-6)


def test_ppo_regularizers():
  logp, old, adv, m = batch(12)
  ref_logp = old + 0.2
  ent = np.abs(np.random.default_rng(13).normal(size=logp.shape))
  loss, met = L.ppo_loss(
    logp, old, adv, m, ref_logp=ref_logp, kl_coef=0.1, entropy=ent, entropy_coef=0.01, agg="seq-mean-token-mean"
  )
  pg, _ = ref.ppo_loss(logp, old, adv, m, agg="seq-mean-token-mean")
  kl = ref.kl(logp, ref_logp, m, "k3")
  want = pg + 0.1 * ref.aggregate(kl, m, "seq-mean-token-mean") - 0.01 * ref.aggregate(ent, m, "seq-mean-token-mean")
  np.testing.assert_allclose(loss, want, rtol=1e-5)
  np.testing.assert_allclose(met["kl_ref"].value, kl[m].mean(), rtol=1e-5)
  np.testing.assert_allclose(met["entropy"].value, ent[m].mean(), rtol=1e-5)
  with pytest.raises(ValueError, match="needs ref_logp"):
    L.ppo_loss(logp, old, adv, m, kl_coef=0.1)


def test_ppo_denom_sums_micro_batches():
  """With a global denominator, micro-batch losses add up to the full-batch loss."""
  logp, old, adv, m = batch(14)
  full, _ = L.ppo_loss(logp, old, adv, m)
  n = m.sum()
  parts = [L.ppo_loss(logp[i : i + 2], old[i : i + 2], adv[i : i + 2], m[i : i + 2], denom=n)[0] for i in (0, 2)]
  np.testing.assert_allclose(sum(parts), full, rtol=1e-6)
  mets = [L.ppo_loss(logp[i : i + 2], old[i : i + 2], adv[i : i + 2], m[i : i + 2])[1] for i in (0, 2)]
  merged = L.finalize_metrics(L.merge_metrics(mets))
  np.testing.assert_allclose(
    merged["ratio_mean"], L.finalize_metrics(L.ppo_loss(logp, old, adv, m)[1])["ratio_mean"], rtol=1e-6
  )


@pytest.mark.parametrize("agg", L.AGG_MODES)
def test_ppo_padding_invariance(agg):
  """Garbage under mask 0 (extra tokens, an extra all-padding row) == the sliced batch."""
  logp, old, adv, m = batch(15)
  kw = dict(agg=agg, norm_len=T)
  want, wm = L.ppo_loss(logp, old, adv, m, **kw)
  pad = lambda x, v: np.pad(x, ((0, 1), (0, 3)), constant_values=v)
  got, gm = L.ppo_loss(pad(logp, np.nan), pad(old, -np.inf), pad(adv, np.inf), pad(m, False), **kw)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  for k in wm:
    np.testing.assert_allclose(L.finalize_metrics(gm)[k], L.finalize_metrics(wm)[k], rtol=1e-6)


def test_ppo_batch_of_one_equals_single_sequence():
  logp, old, adv, m = batch(16)
  for agg in ("seq-mean-token-mean", "token-mean"):
    one, _ = L.ppo_loss(logp[1:2], old[1:2], adv[1:2], m[1:2], agg=agg)
    l, _ = ref.ppo_loss(logp[1:2], old[1:2], adv[1:2], m[1:2], agg="token-mean")
    np.testing.assert_allclose(one, l, rtol=1e-6)


def test_ppo_computes_in_f32_from_bf16():
  logp, old, adv, m = batch(17, spread=0.01)
  lb, ob = jnp.asarray(logp, jnp.bfloat16), jnp.asarray(old, jnp.bfloat16)
  loss, _ = L.ppo_loss(lb, ob, adv, m)
  want, _ = ref.ppo_loss(np.asarray(lb, np.float64), np.asarray(ob, np.float64), adv, m)
  assert loss.dtype == jnp.float32
  np.testing.assert_allclose(loss, want, rtol=1e-5)


def test_ppo_bad_shapes():
  logp, old, adv, m = batch(18)
  with pytest.raises(ValueError, match="old_logp must have the shape of mask"):
    L.ppo_loss(logp, old[:, :3], adv, m)
  with pytest.raises(ValueError, match=r"adv must be \[B\] or \[B, T\]"):
    L.ppo_loss(logp, old, adv[:, :2], m)
  with pytest.raises(ValueError, match="agg must be one of"):
    L.ppo_loss(logp, old, adv, m, agg="mean")


# ------------------------------------------------------------------ GSPO


def test_gspo_vs_reference_value_and_gradient():
  logp, old, adv, m = batch(20, spread=0.2)
  adv_seq = adv[:, 0]
  eps = dict(eps_low=0.05, eps_high=0.08)  # wide enough that some sequences are not clipped
  loss, met = L.gspo_loss(logp, old, adv_seq, m, clip_eps_low=0.05, clip_eps_high=0.08)
  np.testing.assert_allclose(loss, ref.gspo_loss(logp, old, adv_seq, m, **eps), rtol=1e-5)
  # gradient of the GSPO-token form == numerical gradient of the paper's sequence-level objective
  g = jax.jit(jax.grad(lambda lp: L.gspo_loss(lp, old, adv_seq, m, clip_eps_low=0.05, clip_eps_high=0.08)[0]))(
    jnp.asarray(logp, jnp.float32)
  )
  num = np.zeros_like(logp)
  h = 1e-6
  for i, j in zip(*np.nonzero(m)):
    e = np.zeros_like(logp)
    e[i, j] = h
    up = ref.gspo_loss(logp + e, old, adv_seq, m, **eps)
    num[i, j] = (up - ref.gspo_loss(logp - e, old, adv_seq, m, **eps)) / (2 * h)
  np.testing.assert_allclose(g, num, rtol=1e-4, atol=1e-6)
  s = np.array([np.exp(np.mean((logp - old)[i][m[i]])) for i in range(B)])
  np.testing.assert_allclose(met["seq_ratio_mean"].value, s.mean(), rtol=1e-5)
  np.testing.assert_allclose(met["seq_ratio_max"].value, s.max(), rtol=1e-5)
  np.testing.assert_allclose(met["clip_frac_high"].value, np.mean((adv_seq > 0) & (s > 1.08)), atol=1e-7)


def test_gspo_padding_and_token_weights():
  logp, old, adv, m = batch(21, spread=0.01)
  want, _ = L.gspo_loss(logp, old, adv[:, 0], m)
  pad = lambda x, v: np.pad(x, ((0, 0), (0, 2)), constant_values=v)
  got, _ = L.gspo_loss(pad(logp, np.nan), pad(old, np.inf), adv[:, 0], pad(m, False))
  np.testing.assert_allclose(got, want, rtol=1e-6)
  w2, _ = L.gspo_loss(logp, old, adv[:, 0], m, token_weights=np.full(m.shape, 2.0))
  np.testing.assert_allclose(w2, 2 * want, rtol=1e-6)


# ------------------------------------------------------------------ KL, entropy


@pytest.mark.parametrize("est", ["k1", "k2", "k3"])
def test_kl_estimators(est):
  logp, _, _, m = batch(22)
  ref_logp = logp + np.random.default_rng(23).normal(size=logp.shape) * 0.5
  got = L.kl_penalty(logp, ref_logp, m, estimator=est)
  np.testing.assert_allclose(got, ref.kl(logp, ref_logp, m, est), rtol=1e-5, atol=1e-6)
  # hand value: log r = ln 2 -> k1 = −ln 2, k2 = ln²2 / 2, k3 = 1 − ln 2
  one = L.kl_penalty(np.zeros((1, 1)), np.log([[2.0]]), np.ones((1, 1)), estimator=est)
  want = {"k1": -math.log(2), "k2": 0.5 * math.log(2) ** 2, "k3": 1 - math.log(2)}[est]
  np.testing.assert_allclose(one, [[want]], rtol=1e-6)


def test_kl_k3_gradient():
  # d k3 / d logp = d/dlogp [(exp(ref − logp) − 1) − (ref − logp)] = 1 − exp(ref − logp)
  logp, _, _, m = batch(24)
  ref_logp = logp + 0.3
  g = jax.jit(jax.grad(lambda lp: jnp.sum(L.kl_penalty(lp, ref_logp, m))))(jnp.asarray(logp, jnp.float32))
  np.testing.assert_allclose(g, np.where(m, 1 - np.exp(0.3), 0.0), rtol=1e-5, atol=1e-7)


def test_entropy_from_logits():
  rng = np.random.default_rng(25)
  z = rng.normal(size=(2, 3, 11)) * 3
  m = np.array([[1, 1, 0], [0, 1, 1]], bool)
  np.testing.assert_allclose(L.entropy_from_logits(z, m), ref.entropy(z, m), rtol=1e-5, atol=1e-6)
  # uniform logits: ln V; one-hot-like (−inf elsewhere): 0; bf16 logits upcast
  np.testing.assert_allclose(L.entropy_from_logits(np.zeros((1, 1, 8)), np.ones((1, 1))), [[math.log(8)]], rtol=1e-6)
  zi = np.full((1, 1, 4), -np.inf)
  zi[..., 2] = 0.0
  assert float(L.entropy_from_logits(zi, np.ones((1, 1)))[0, 0]) == 0.0
  zb = jnp.asarray(z, jnp.bfloat16)
  np.testing.assert_allclose(
    L.entropy_from_logits(zb, m), ref.entropy(np.asarray(zb, np.float64), m), rtol=1e-5, atol=1e-6
  )


@pytest.mark.parametrize("peak", [0.0, 40.0])
def test_softmax_entropy_within_its_rounding_bound(peak):
  """softmax_entropy(z) against H = −Σ p log p in float64 of the same f32 z, within the worst-case first-order rounding
  bound of its own program (`tests/_fp_bound.rounding_bound`: every exp, sum, product and division, any summation
  order); with one logit 40 above the rest (H ~1e-11) too, where the rounding of lse (~40·2⁻²⁴) dominates, as it
  does in lse − Σ p·z. Given the lse it would take itself, the result is the same bits (the learner's call)."""
  from tests._fp_bound import rounding_bound  # noqa: PLC0415

  rng = np.random.default_rng(26)
  z = (rng.normal(size=(3, 2048)) * 3).astype(np.float32)
  z[:, 7] += peak
  z64 = z.astype(np.float64)
  lse = np.log(np.exp(z64 - z64.max(-1, keepdims=True)).sum(-1)) + z64.max(-1)
  p = np.exp(z64 - lse[:, None])
  want = -(p * (z64 - lse[:, None])).sum(-1)
  zj = jnp.asarray(z)
  f = jax.jit(lrl_jax.losses.softmax_entropy)
  got = np.asarray(f(zj), np.float64)
  err = np.asarray(rounding_bound(lrl_jax.losses.softmax_entropy, zj, model="worst").err, np.float64)
  np.testing.assert_array_less(np.abs(got - want), err)
  with_lse = jax.jit(lambda z: lrl_jax.losses.softmax_entropy(z, jax.nn.logsumexp(z, axis=-1)))(zj)
  np.testing.assert_array_equal(np.asarray(with_lse), np.asarray(f(zj)))
