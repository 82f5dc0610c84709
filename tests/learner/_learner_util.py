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


def assert_update_close(params_a, opt_a, params_b, opt_b, *, grad_rtol=1e-5, lr=1e-3, b1=0.9, eps=1e-8):
  """Same first Adam update from the same parameters, to f32 reordering.

  Gradients (via Adam's μ) within grad_rtol of the largest one. Parameters: Adam's first step moves each by
  u = lr · g / (|g| + ε) (bias-corrected m̂ = g, √v̂ = |g|; g = μ / (1 − b1), clipped), and |du/dg| = lr · ε / (|g| + ε)²,
  so with g known to ±δ an element may move by lr · min(2, ε · δ / ((|g| − δ)₊ + ε)²) more or less: up to 2 lr
  where |g| is within δ of 0 (there Adam turns reordering noise into a full step), about nothing where |g| >> δ.
  Plus f32 roundings: of p + u (ulps of |p|) and of u's own few operations (ulps of lr).
  `lr`, `b1`, `eps`: the config's (LearnerConfig's defaults but lr).
  """
  mu_a, mu_b = first_moment(opt_a), first_moment(opt_b)
  scale = max(float(np.max(np.abs(x))) for x in jax.tree_util.tree_leaves(mu_a))
  assert max_abs_diff(mu_a, mu_b) <= grad_rtol * scale
  delta = grad_rtol * scale / (1 - b1)
  mu_p = mu_a["policy"] if isinstance(mu_a, dict) and "policy" in mu_a else mu_a  # the trained tree's moments
  assert jax.tree_util.tree_structure(mu_p) == jax.tree_util.tree_structure(params_a)
  for (path, a), b, m in zip(
    jax.tree_util.tree_leaves_with_path(params_a), jax.tree_util.tree_leaves(params_b), jax.tree_util.tree_leaves(mu_p)
  ):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    g = np.abs(np.asarray(m, np.float64)) / (1 - b1)
    bound = lr * np.minimum(2.0, eps * delta / (np.maximum(g - delta, 0.0) + eps) ** 2)
    bound += np.finfo(np.float32).eps * (2 * np.maximum(np.abs(a), np.abs(b)) + 8 * lr)
    bad = np.abs(a - b) > bound
    assert not bad.any(), (
      f"{jax.tree_util.keystr(path)}: {int(bad.sum())} elements moved differently beyond the bound; the worst by "
      f"{float(np.max(np.abs(a - b) - bound)):.3g}"
    )


# The model and rollout shape of the ahead-of-time step tests (test_aot_tpu_step.py, test_aot_gpu_step.py).
# hidden 256, MLP 1024: a layer's matmuls cost 2 * (2 * 256^2 + 2 * 256 * 128 + 3 * 256 * 1024) ~ 2.0 M flops a
# token forward (0.95 G for the step's 160 trunk tokens, forward and backward). What else a layer adds to the count:
# the elementwise work on its activations (norms, SwiGLU, residuals, rotary, a softmax over <= 32 positions: ~10 k
# flops a token forward, about 3x that with the backward, ~1.5%) and AdamW on its 0.98 M parameters (~20 flops
# each: moments, bias corrections, square root, division, decay, clip scale; ~2%). Bound: 10%, twice their sum.
AOT_TINY = models.ModelConfig(
  arch="llama",
  vocab_size=512,
  hidden_size=256,
  intermediate_size=1024,
  num_layers=1,
  num_heads=4,
  num_kv_heads=2,
  head_dim=64,
  max_position_embeddings=64,
  dtype="bfloat16",
)
AOT_SHAPE = dict(batch=8, seq=32, prompt=16, group=4)
