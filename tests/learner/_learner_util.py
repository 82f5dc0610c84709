"""Shared helpers of the learner tests: a tiny Qwen2-shaped model and random RL batches."""

import jax
import jax.numpy as jnp
import numpy as np

from lrl_jax import learner as L
from lrl_jax import models

B, T, V = 8, 12, 64


_forward = jax.jit(models.forward, static_argnames=("cfg",))


def tiny_cfg(**kw) -> models.ModelConfig:
  base = dict(
    arch="qwen2", vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2
  )
  base.update(kw)
  return models.ModelConfig(**base)


def np_log_softmax(z):
  z = np.asarray(z, np.float64)
  m = z.max(-1, keepdims=True)
  return z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))


def np_token_logprobs(logits_BTV, tokens_BT, valid_BT):
  """float64: log-softmax of the logits at the previous valid position, picked at the token."""
  ls = np_log_softmax(logits_BTV)
  out = np.zeros(tokens_BT.shape)
  for b in range(tokens_BT.shape[0]):
    prev = -1
    for t in range(tokens_BT.shape[1]):
      if valid_BT[b, t]:
        if prev >= 0:
          out[b, t] = ls[b, prev, tokens_BT[b, t]]
        prev = t
  return out


def make_batch(seed: int, model_cfg, params, *, noise: float = 0.3, per_token_adv: bool = False) -> L.Rollout:
  """A batch whose μ and π_old are the model's own log-probs plus noise (so ratios ≠ 1)."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, V, (B, T)).astype(np.int32)
  lengths = rng.integers(T - 4, T + 1, B)  # right padding
  valid = np.arange(T)[None, :] < lengths[:, None]
  prompt = rng.integers(2, 5, B)
  loss_mask = valid & (np.arange(T)[None, :] >= prompt[:, None])
  logits, _ = _forward(params, jnp.asarray(tokens), model_cfg.replace(dtype="float32"), valid_BT=jnp.asarray(valid))
  logp = np_token_logprobs(np.asarray(logits), tokens, valid)
  mu = logp + noise * rng.normal(size=(B, T))
  old = logp + 0.5 * noise * rng.normal(size=(B, T))
  adv = rng.normal(size=(B, T) if per_token_adv else (B,))
  f = lambda x: jnp.asarray(x, jnp.float32)
  return L.Rollout(
    tokens=jnp.asarray(tokens),
    loss_mask=jnp.asarray(loss_mask),
    sampler_logp=f(mu),
    advantages=f(adv),
    valid=jnp.asarray(valid),
    old_logp=f(old),
  )


def host(tree):
  """A NumPy copy of every leaf (the state is donated by train_step)."""
  return jax.tree_util.tree_map(lambda x: np.array(jax.device_get(x)), tree)


def max_abs_diff(a, b) -> float:
  d = jax.tree_util.tree_map(
    lambda x, y: float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)))) if np.size(x) else 0.0,
    a,
    b,
  )
  return max(jax.tree_util.tree_leaves(d))


def first_moment(opt_state):
  """Adam's μ after one step = (1 − b1) · clipped gradient (chain(clip, adamw) state layout)."""
  return opt_state[1][0].mu


def assert_update_close(params_a, opt_a, params_b, opt_b, *, grad_rtol=1e-5, param_atol=1e-5):
  """Same update, to f32 reordering: gradients (via Adam's μ) within grad_rtol of the largest one;
  params within param_atol (1% of lr = 1e-3: Adam divides tiny gradients g ~ 1e-10 by √v + ε
  and so magnifies their f32 reordering noise into the update)."""
  mu_a, mu_b = first_moment(opt_a), first_moment(opt_b)
  scale = max(float(np.max(np.abs(x))) for x in jax.tree_util.tree_leaves(mu_a))
  assert max_abs_diff(mu_a, mu_b) <= grad_rtol * scale
  assert max_abs_diff(params_a, params_b) <= param_atol
