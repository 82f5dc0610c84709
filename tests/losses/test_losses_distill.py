"""distill_kl against a float64 NumPy KL(p_T ‖ p_S); masks; gradient; shape errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lrl_jax import losses


def _np_kl(s, t, m):
  ls = s - np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1, keepdims=True)) - s.max(-1, keepdims=True)
  lt = t - np.log(np.exp(t - t.max(-1, keepdims=True)).sum(-1, keepdims=True)) - t.max(-1, keepdims=True)
  kl = (np.exp(lt) * (lt - ls)).sum(-1)
  return (kl * m).sum() / m.sum(), kl


def test_distill_kl_matches_numpy_and_masks():
  rng = np.random.default_rng(0)
  s = rng.normal(size=(3, 5, 17)) * 2
  t = rng.normal(size=(3, 5, 17)) * 2
  m = rng.random((3, 5)) < 0.6
  want, per = _np_kl(s, t, m)
  loss, met = losses.distill_kl(jnp.asarray(s, jnp.float32), jnp.asarray(t, jnp.float32), jnp.asarray(m))
  fin = losses.finalize_metrics(met)
  # f32 log-softmax of O(5) logits over 17 terms: a few ulps of 5 per term; 1e-5 absolute is > 10x that
  assert float(loss) == pytest.approx(want, abs=1e-5)
  assert float(fin["distill_kl_max"]) == pytest.approx(per[m].max(), abs=1e-5)
  agree = (s.argmax(-1) == t.argmax(-1))[m].mean()
  assert float(fin["distill_top1_agree"]) == pytest.approx(agree, abs=1e-6)
  same, _ = losses.distill_kl(jnp.asarray(t, jnp.float32), jnp.asarray(t, jnp.float32), jnp.asarray(m))
  assert abs(float(same)) < 1e-6  # KL(p ‖ p) = 0


def test_distill_kl_gradient_is_finite_and_masked():
  rng = np.random.default_rng(1)
  s = jnp.asarray(rng.normal(size=(2, 4, 9)), jnp.float32)
  t = jnp.asarray(rng.normal(size=(2, 4, 9)), jnp.float32).at[0, 0, 3].set(-jnp.inf)  # a token the teacher rules out
  m = jnp.asarray([[True, True, False, False], [False, True, True, False]])
  g = jax.grad(lambda x: losses.distill_kl(x, t, m)[0])(s)
  assert bool(jnp.all(jnp.isfinite(g)))
  assert float(jnp.max(jnp.abs(jnp.where(m[..., None], 0.0, g)))) == 0.0  # masked positions get no gradient
  # ∂KL/∂s = (p_S − p_T) / n at a kept position
  n = float(m.sum())
  want = (jax.nn.softmax(s[0, 1]) - jax.nn.softmax(t[0, 1])) / n
  np.testing.assert_allclose(np.asarray(g[0, 1]), np.asarray(want), atol=1e-6)


def test_distill_kl_rejects_bad_shapes():
  with pytest.raises(ValueError, match="same"):
    losses.distill_kl(jnp.zeros((2, 3, 5)), jnp.zeros((2, 3, 6)), jnp.ones((2, 3)))
  with pytest.raises(ValueError, match="mask"):
    losses.distill_kl(jnp.zeros((2, 3, 5)), jnp.zeros((2, 3, 5)), jnp.ones((2, 4)))
