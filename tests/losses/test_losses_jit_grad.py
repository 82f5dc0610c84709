"""Every public function: jit == eager, and finite gradients when the mask zeroes whole sequences.

The masked-out rows hold NaN / ±inf garbage on purpose: a masked position must never reach
a result or a gradient (the "double where" rule).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lrl_jax.losses as L

B, T, V = 4, 5, 7


def _data():
  rng = np.random.default_rng(0)
  mu = (rng.normal(size=(B, T)) * 0.5 - 1.0).astype(np.float32)
  pi = (mu + rng.normal(size=(B, T)) * 0.2).astype(np.float32)
  logp = (pi + rng.normal(size=(B, T)) * 0.2).astype(np.float32)
  m = rng.random((B, T)) > 0.3
  m[0, :2] = True
  m[2] = False  # a whole sequence masked out
  garbage = lambda x, v: np.where(np.arange(B)[:, None] == 2, v, x).astype(np.float32)
  return dict(
    logp=garbage(logp, np.nan),
    pi=garbage(pi, -np.inf),
    mu=garbage(mu, np.inf),
    adv=garbage(rng.normal(size=(B, T)), np.nan),
    adv_b=rng.normal(size=(B,)).astype(np.float32),
    vals=garbage(rng.normal(size=(B, T)), np.inf),
    rew=garbage(rng.normal(size=(B, T)), np.nan),
    logits=np.where(np.arange(B)[:, None, None] == 2, np.nan, rng.normal(size=(B, T, V))).astype(np.float32),
    m=m,
  )


D = _data()

# name -> (function of one differentiable array x, the x to differentiate at)
CASES = {
  **{
    f"ppo_{agg}": (
      functools.partial(
        lambda x, agg: L.ppo_loss(
          x, D["pi"], D["adv"], D["m"], agg=agg, dual_clip_c=3.0, ref_logp=D["mu"], kl_coef=0.1
        )[0],
        agg=agg,
      ),
      D["logp"],
    )
    for agg in L.AGG_MODES
  },
  "gspo": (lambda x: L.gspo_loss(x, D["pi"], D["adv_b"], D["m"], clip_eps_low=0.05, clip_eps_high=0.05)[0], D["logp"]),
  "kl_k3": (lambda x: jnp.sum(L.kl_penalty(x, D["mu"], D["m"])), D["logp"]),
  "entropy": (lambda x: jnp.sum(L.entropy_from_logits(x, D["m"])), D["logits"]),
  "aggregate": (lambda x: L.aggregate(x, D["m"], agg="seq-mean-token-mean"), D["logp"]),
  "gae": (lambda x: jnp.sum(L.gae_advantages(x, D["vals"], D["m"], gamma=0.99, lam=0.9)[0]), D["rew"]),
  "normalize_advantages": (lambda x: jnp.sum(L.normalize_advantages(x, D["m"]) ** 2), D["adv"]),
  "grpo": (
    lambda x: jnp.sum(L.grpo_advantages(x, group_size=2, mask=np.array([1, 1, 0, 0])) ** 2),
    np.array([1.0, 0.0, np.nan, np.inf], np.float32),
  ),
  "rloo": (
    lambda x: jnp.sum(L.rloo_advantages(x, group_size=2, mask=np.array([1, 1, 0, 0])) ** 2),
    np.array([1.0, 0.0, np.nan, np.inf], np.float32),
  ),
  "tis_token": (lambda x: jnp.sum(L.tis_weights(x, D["mu"], D["m"], batch_normalize=True)[0]), D["pi"]),
  "tis_sequence": (lambda x: jnp.sum(L.tis_weights(x, D["mu"], D["m"], level="sequence")[0]), D["pi"]),
  "mis_geometric": (
    lambda x: jnp.sum(L.mis_weights(x, D["mu"], D["m"], level="geometric", keep_ratio=True)[0]),
    D["pi"],
  ),
  "acrl": (lambda x: jnp.sum(L.acrl_weights(L.acrl_init(), x, D["mu"], D["adv"], D["m"])[0]), D["pi"]),
  "ppo_acrl_weighted": (
    lambda x: L.ppo_loss(
      x,
      D["pi"],
      D["adv"],
      D["m"],
      token_weights=L.acrl_weights(L.acrl_init(0.01), D["pi"], D["mu"], D["adv"], D["m"])[0],
    )[0],
    D["logp"],
  ),
  "value_loss": (lambda x: L.value_loss(x, D["rew"], D["m"])[0], D["vals"]),
  "quantize_value": (lambda x: jnp.sum(L.quantize_value(jnp.where(D["m"], x, 0.0), 0.1) ** 2), D["vals"]),
  "smooth_advantages": (lambda x: jnp.sum(L.smooth_advantages(x, D["m"]) ** 2), D["adv"]),
  "mismatch_metrics": (
    lambda x: sum(jnp.sum(jnp.asarray(v)) for v in jax.tree.leaves(L.mismatch_metrics(x, D["mu"], D["m"]))),
    D["pi"],
  ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_jit_equals_eager_and_gradients_are_finite(name):
  fn, x = CASES[name]
  x = jnp.asarray(x)
  eager = fn(x)
  jitted = jax.jit(fn)(x)
  assert np.isfinite(eager), (name, eager)
  np.testing.assert_allclose(jitted, eager, rtol=2e-6, atol=1e-7)
  g = jax.jit(jax.grad(fn))(x)
  assert np.all(np.isfinite(g)), (name, g)
  if x.ndim >= 2:  # the masked-out sequence gets no gradient
    assert np.all(np.asarray(g)[2] == 0), name


def test_metrics_jit_equals_eager():
  f = lambda pi: L.ppo_loss(D["logp"], pi, D["adv"], D["m"], dual_clip_c=3.0)[1]
  a, b = L.finalize_metrics(f(D["pi"])), L.finalize_metrics(jax.jit(f)(D["pi"]))
  for k in a:
    np.testing.assert_allclose(b[k], a[k], rtol=2e-6, atol=1e-7, err_msg=k)
    assert np.isfinite(a[k]), k
