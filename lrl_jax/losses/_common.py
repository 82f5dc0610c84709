"""Private helpers of lrl_jax.losses: trace-time shape checks, f32 casts, masked reductions.

Masked positions may hold anything (padding garbage, NaN, ±inf). Every function
replaces them with a harmless value *before* any nonlinear op (`jnp.where`, never
`x * mask`): `0 * inf` is NaN, and a NaN in an unused branch of `where` still
poisons the gradient (the "double where" rule).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

F32 = jnp.float32


def f32(x) -> jax.Array:
  """Casts to float32 (log-probs, ratios and losses are f32 whatever the input dtype)."""
  return jnp.asarray(x).astype(F32)


def check_rank(fn: str, name: str, x, ndim: int, what: str) -> None:
  if jnp.ndim(x) != ndim:
    raise ValueError(f"{fn}: {name} must be {what} (rank {ndim}); got shape {jnp.shape(x)}")


def check_same(fn: str, ref_name: str, ref_shape, **arrays) -> None:
  """Raises ValueError unless every array has shape `ref_shape`."""
  for name, x in arrays.items():
    if x is not None and tuple(jnp.shape(x)) != tuple(ref_shape):
      raise ValueError(f"{fn}: {name} must have the shape of {ref_name} {tuple(ref_shape)}; got {tuple(jnp.shape(x))}")


def bt_mask(fn: str, mask, **arrays) -> tuple[jax.Array, jax.Array]:
  """Checks mask is [B, T] and each array matches it; returns (mask as bool, mask as f32)."""
  check_rank(fn, "mask", mask, 2, "[B, T]")
  check_same(fn, "mask", jnp.shape(mask), **arrays)
  m = jnp.asarray(mask)
  m_bool = m if m.dtype == jnp.bool_ else m != 0
  return m_bool, m_bool.astype(F32)


def seq_or_token(fn: str, name: str, x, mask_shape) -> jax.Array:
  """A [B] or [B, T] per-sequence / per-token array -> f32 [B, T] (explicit broadcast)."""
  x = f32(x)
  b, t = mask_shape
  if x.ndim == 1 and x.shape[0] == b:
    return jnp.broadcast_to(x[:, None], (b, t))
  if x.shape == (b, t):
    return x
  raise ValueError(f"{fn}: {name} must be [B] or [B, T] with [B, T] = {tuple(mask_shape)}; got {x.shape}")


def clean(x, m_bool, fill=0.0) -> jax.Array:
  """f32(x) with masked positions replaced by `fill` (safe for any later op and its gradient)."""
  return jnp.where(m_bool, f32(x), jnp.asarray(fill, F32))


def log_ratio(logp_num, logp_den, m_bool) -> jax.Array:
  """log(p_num / p_den) per token, f32, 0 where masked.

  Both -inf (p_num = p_den = 0) is read as ratio 1 (log-ratio 0): equal
  probabilities, no evidence of mismatch. p_den = 0 < p_num gives +inf and
  p_num = 0 < p_den gives -inf, as the formula says.
  """
  a, b = clean(logp_num, m_bool), clean(logp_den, m_bool)
  both_zero = jnp.isneginf(a) & jnp.isneginf(b)
  return jnp.where(both_zero, 0.0, a) - jnp.where(both_zero, 0.0, b)


def msum(x, m_bool, axis=None) -> jax.Array:
  """Sum of x over the masked-in positions (masked-out values never touch the result)."""
  return jnp.sum(jnp.where(m_bool, x, jnp.zeros((), F32)), axis=axis)


def safe_div(num, den) -> jax.Array:
  """num / den, and 0 where den == 0 (gradient-safe)."""
  ok = den != 0
  return jnp.where(ok, num / jnp.where(ok, den, 1.0), 0.0)


def check_positive(fn: str, **scalars) -> None:
  for name, v in scalars.items():
    if isinstance(v, (int, float)) and not v > 0:
      raise ValueError(f"{fn}: {name} must be > 0; got {v}")
