"""Adam with low-precision moments: the first moment as FP8 E4M3 codes with a float32 scale per block, the second
in bfloat16, both re-quantized with stochastic rounding.

The memory write-up this project follows (`../shared/sources/003_*`) cuts a 7B learner from 48 to 18 GB with,
among others, 8-bit Adam (Dettmers et al., "8-bit Optimizers via Block-wise Quantization", ICLR 2022). This is a
simpler scheme on the project's FP8 rule (`lrl_jax.quant`: s = amax / 448, clip to ±448 before the cast, which
would otherwise overflow to NaN):

  * m in blocks of `block` consecutive elements along a parameter's last axis (the largest divisor of it that is at
    most `block`; a block never spans two rows, so the codes keep the parameter's shape and sharding):
    e4m3(m / s_b), s_b = amax_b(|m|) / 448;
  * v in bfloat16;
  * both rounded stochastically (unbiased, Gupta et al. 2015) when stored.

Why not v in 8 bits too. With β₂ = 0.999 a step moves v by about 0.1%, while an E4M3 code is 6% wide (3 mantissa
bits). Rounded to nearest, v sticks to its code (it can neither decay nor grow slowly); rounded stochastically it is
unbiased but its error compounds from step to step (the stored v is the next step's input), a random walk of a few
percent per step. Simulated on 4096 elements x 400 steps of noisy gradients spanning two decades (the update's
relative error against float32 Adam over the last 100 steps): m and sqrt(v) both E4M3, round to nearest 18%,
stochastic 18%; m E4M3 stochastic with v in bfloat16 8% (the same as with v in float32: m's 3 bits are then the
limit). On the quickstart, both moments in E4M3 ended the supervised warm-up at 30% (nearest) and 60% (stochastic)
accuracy where float32 Adam reached 72% (seed 0). So m takes 1 + 4/block bytes and v 2, against 4 + 4: about 2.6x
less optimizer state, not the 4x of a fully 8-bit state.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

__all__ = ["scale_by_adam_8bit", "Adam8State", "block_size", "encode_moment", "decode_moment"]

_E4M3_MAX = 448.0
_FP8 = jnp.float8_e4m3fn
_SR_SEED = 0x8B17  # the stochastic rounding's keys: fold_in(this, Adam's count, leaf): a resumed run draws alike


class Adam8State(NamedTuple):
  """count: int32 []; m_codes: e4m3 trees shaped like the params; m_scale: float32 trees [..., last / block];
  v: bfloat16 trees shaped like the params."""

  count: jax.Array
  m_codes: optax.Updates
  m_scale: optax.Updates
  v: optax.Updates


def block_size(n: int, block: int) -> int:
  """The largest divisor of a last axis of length n that is at most `block` (n itself when n <= block)."""
  for b in range(min(n, block), 0, -1):
    if n % b == 0:
      return b
  return 1


def _blocks(x, block: int):
  last = x.shape[-1] if x.ndim else 1
  b = block_size(last, block)
  return x.reshape(x.shape[:-1] + (last // b, b)) if x.ndim else x.reshape(1, 1), b


def _e4m3_stochastic(y, key):
  """E4M3 codes of y (|y| <= 448) rounded stochastically: up to the next code above |y| with probability
  (|y| − lo) / (hi − lo), else down, so that E[code] = y exactly (Gupta et al. 2015). Codes of one sign are ordered
  like their bit patterns, so the neighbour of a code is its bits ± 1."""
  a = jnp.abs(y)
  near = a.astype(_FP8)  # round to nearest: one of the two neighbours
  bits = jax.lax.bitcast_convert_type(near, jnp.uint8)
  v = near.astype(jnp.float32)
  step = lambda b: jax.lax.bitcast_convert_type(b, _FP8).astype(jnp.float32)  # noqa: E731
  above = step(jnp.minimum(bits + 1, 0x7E))  # 0x7E = 448, the largest finite code
  below = step(jnp.where(bits > 0, bits - 1, 0))
  lo, hi = jnp.where(v <= a, v, below), jnp.where(v <= a, above, v)
  p_up = jnp.where(hi > lo, (a - lo) / jnp.where(hi > lo, hi - lo, 1.0), 0.0)
  mag = jnp.where(jax.random.uniform(key, a.shape) < p_up, hi, lo)
  return jnp.where(y < 0, -mag, mag).astype(_FP8)  # exact: mag is a code


def encode_moment(x, block: int, key=None):
  """(e4m3 codes shaped like x, float32 scales [..., last / b]): blockwise absmax along the last axis; rounded to
  nearest, or stochastically with `key` (unbiased: a moment that moves by less than half a code per step still moves
  on average, where round-to-nearest would leave it stuck)."""
  x = jnp.asarray(x, jnp.float32)
  xb, _ = _blocks(x, block)
  s = jnp.max(jnp.abs(xb), axis=-1, keepdims=True) / _E4M3_MAX
  s = jnp.where(s > 0, s, 1.0)  # an all-zero block: any scale (its codes are 0)
  y = jnp.clip(xb / s, -_E4M3_MAX, _E4M3_MAX)  # clip first: a plain cast overflows to NaN
  codes = y.astype(_FP8) if key is None else _e4m3_stochastic(y, key)
  return codes.reshape(x.shape), s[..., 0].reshape(x.shape[:-1] + (-1,)) if x.ndim else s.reshape(())


def decode_moment(codes, scale, block: int):
  """float32 values of `encode_moment`'s output."""
  cb, _ = _blocks(codes, block)
  s = scale.reshape(cb.shape[:-1] + (1,))
  return (cb.astype(jnp.float32) * s).reshape(codes.shape)


def _bf16_stochastic(x, key):
  """bfloat16 of float32 x rounded stochastically: random low 16 bits added, then truncated (E = x, non-negative x)."""
  bits = jax.lax.bitcast_convert_type(jnp.asarray(x, jnp.float32), jnp.uint32)
  noise = jax.random.randint(key, jnp.shape(x), 0, 1 << 16, dtype=jnp.uint32)
  return jax.lax.bitcast_convert_type((bits + noise) & jnp.uint32(0xFFFF0000), jnp.float32).astype(jnp.bfloat16)


def _tie(key, g):
  """`key` itself; on the CPU made to depend on the gradient g (on one element of it: the key changes only where that
  element is NaN, and then the update is NaN anyway).

  The rounding keys depend on Adam's count only, so XLA is free to draw the rounding bits (4 bytes an element, twice
  over the parameters) at the program's start, and XLA:CPU does: they stayed live through the backward pass's peak
  (+23 GiB of temporaries at Qwen2.5-7B shapes with two layers). Tied to g, they are drawn once g exists.
  `lax.optimization_barrier((key, g))` does not do it: XLA:CPU removes barriers before it schedules. XLA:TPU schedules
  the untied draws better than the tied ones (its temporaries at 7B shapes, all three memory techniques: 102.9 GB
  untied, 108.1 GB tied), so the tie is staged for the CPU only (`lax.platform_dependent`: the compiler sees one
  branch); GPU is not measured and keeps the untied draws."""
  if not jnp.size(g):
    return key

  def tied(k, g):
    first = g[(0,) * jnp.ndim(g)]  # an index, not a ravel: a sharded g is not gathered for it
    return jnp.where(jnp.isnan(first), jax.random.fold_in(k, 1), k)

  return jax.lax.platform_dependent(key, g, cpu=tied, default=lambda k, g: k)


def scale_by_adam_8bit(
  b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, *, block: int = 256, nesterov: bool = False
) -> optax.GradientTransformation:
  """Adam's scaling (`optax.scale_by_adam`'s recurrences, bias-corrected) with m in 8 bits and v in bfloat16.

  Args:
    b1, b2, eps: Adam's β₁, β₂, ε.
    block: elements per scale of m (at most; the largest divisor of each parameter's last axis up to it).
    nesterov: NAdam's first-moment look-ahead (Dozat 2016), as `optax.scale_by_adam(nesterov=True)`.
  """
  if block < 1:
    raise ValueError(f"scale_by_adam_8bit: block must be >= 1; got {block}")

  def init_fn(params):
    zeros_scale = lambda p: encode_moment(jnp.zeros(jnp.shape(p), jnp.float32), block)[1]  # noqa: E731
    return Adam8State(
      count=jnp.zeros([], jnp.int32),
      m_codes=jax.tree_util.tree_map(lambda p: jnp.zeros(jnp.shape(p), _FP8), params),
      m_scale=jax.tree_util.tree_map(zeros_scale, params),
      v=jax.tree_util.tree_map(lambda p: jnp.zeros(jnp.shape(p), jnp.bfloat16), params),
    )

  def update_fn(updates, state, params=None):
    del params
    count = optax.safe_increment(state.count)
    t = count.astype(jnp.float32)
    step_key = jax.random.fold_in(jax.random.PRNGKey(_SR_SEED), count)

    def one(i, g, mc, ms, v_prev):
      g = jnp.asarray(g, jnp.float32)
      k_m, k_v = jax.random.split(jax.random.fold_in(_tie(step_key, g), i))  # drawn once g exists (`_tie`)
      m = b1 * decode_moment(mc, ms, block) + (1.0 - b1) * g
      v = b2 * v_prev.astype(jnp.float32) + (1.0 - b2) * g * g
      m_hat = (b1 * m + (1.0 - b1) * g) / (1.0 - b1 ** (t + 1)) if nesterov else m / (1.0 - b1**t)
      v_hat = v / (1.0 - b2**t)
      u = m_hat / (jnp.sqrt(v_hat) + eps)
      mc, ms = encode_moment(m, block, k_m)
      return u, mc, ms, _bf16_stochastic(v, k_v)

    flat_g, treedef = jax.tree_util.tree_flatten(updates)
    parts = [jax.tree_util.tree_leaves(x) for x in (state.m_codes, state.m_scale, state.v)]
    out = [one(i, g, *xs) for i, (g, *xs) in enumerate(zip(flat_g, *parts))]
    unflat = lambda i: jax.tree_util.tree_unflatten(treedef, [o[i] for o in out])  # noqa: E731
    return unflat(0), Adam8State(count, unflat(1), unflat(2), unflat(3))

  return optax.GradientTransformation(init_fn, update_fn)
