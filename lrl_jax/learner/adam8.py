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

The update's memory. Both roundings take their randomness from one 32-bit word per element (jax.random.bits: its low
16 bits for m, its high 16 for v). A stacked leaf (rank >= 3: the decoder's per-layer tensors, [layers, ...], whose
layers axis is never sharded) is updated whole layers at a time in a `lax.fori_loop` (at most `_SLICE` elements a
slice): the update goes into its own carry, the codes, scales and v are overwritten in place (on the CPU after the
slice's new values are computed, `_apart`), and the gradient is read (and clipped, with `clip`) slice by slice. Its
bits are drawn per layer (fold_in of the leaf's key and the layer's index), so the numbers do not depend on how many
layers a slice takes. The whole-leaf update it replaces wrote m in f32, the rounding bits (a uniform, and a randint
that draws twice: 12 bytes an element) and XLA:CPU's threefry carries (it runs the rounds as a loop over full-size
arrays) for every element at once, and the clipped gradient beside the gradient: at Qwen2.5-7B shapes and 16 x 72
tokens the 8-bit step peaked at 188 GiB against f32 Adam's 142; now 117 (`lrl_jax/learner/README.md`, "Memory of a
GRPO step"). Rank 1 and 2 leaves (norms, biases, the embedding and the LM head, whose first axis may be sharded)
are updated whole. The bits come from `_bits` (Threefry-2x32 written out: jax.random.bits's bits without the CPU's
rolled loop) and the codes are read back by integer arithmetic (`qarray._e4m3_value`): the same numbers as
jax.random.bits and an f8 convert, in half the CPU time. They are written by arithmetic too
(`_e4m3_stochastic_bits`): the update makes no f8 value but the state's own (the update alone, SmolLM2's tree:
1.55 -> 1.10 s).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from lrl_jax.quant.qarray import _e4m3_bits, _e4m3_value

__all__ = ["scale_by_adam_8bit", "Adam8State", "block_size", "encode_moment", "decode_moment"]

_E4M3_MAX = 448.0
_FP8 = jnp.float8_e4m3fn
_SR_SEED = 0x8B17  # rounding keys: fold_in(this, Adam's count, leaf[, layer]): a resumed run draws alike
_SLICE = 1 << 22  # at most this many elements of a stacked leaf are updated at once (layers at a time; at least one)


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


def _as(x, dtype):
  """x's bits as `dtype` (of the same width)."""
  return lax.bitcast_convert_type(x, dtype)


def _layers_per_slice(shape) -> int:
  """Layers of a stacked leaf [layers, ...] that one slice of its update takes: the most that divide the layers and
  stay within `_SLICE` elements (one layer where a layer alone is more)."""
  per_layer = math.prod(shape[1:])
  return max((n for n in range(1, shape[0] + 1) if shape[0] % n == 0 and n * per_layer <= _SLICE), default=1)


def _blocks(x, block: int):
  last = x.shape[-1] if x.ndim else 1
  b = block_size(last, block)
  return x.reshape(x.shape[:-1] + (last // b, b)) if x.ndim else x.reshape(1, 1), b


def _e4m3_stochastic_bits(y, noise):
  """E4M3 codes of y (|y| <= 448), as uint8 bit patterns, rounded stochastically: up to the next code above |y| with
  probability (|y| − lo) / (hi − lo), else down (Gupta et al. 2015). The uniform is the low 16 bits of `noise`
  (uint32, shaped like y) over 2^16, so the probability is rounded up to a multiple of 2^-16: E[code] = y to within
  2^-16 of the gap between the two codes. A zero code is +0 (0x00) whatever y's sign; a NaN stores 448's (0x7E).

  By float and integer arithmetic, with no f8 convert (a software routine on XLA:CPU: with converts to find and read
  back the neighbours, the update alone on SmolLM2's tree took 1.55 s, with this 1.10 s). The neighbours of |y| are
  lo = |y| cut to the E4M3 grid and hi = lo + step, step the grid's spacing in |y|'s binade (2^(max(e, -6) - 3));
  p_up = (|y| − lo) / step is exact (step is a power of two). The chosen value's code is `qarray._e4m3_bits`'s."""
  a = jnp.abs(y)
  e = (_as(a, jnp.int32) >> 23) & 0xFF
  step = _as((jnp.maximum(e, 127 - 6) - 3) << 23, jnp.float32)
  lo = jnp.floor(a / step) * step  # exact: a / step < 16, and an integer times a power of two
  uniform = (noise & jnp.uint32(0xFFFF)).astype(jnp.float32) * 2.0**-16
  mag = jnp.where(uniform < (a - lo) / step, lo + step, lo)  # a code: lo + step <= 448 whenever a > lo
  mag = jnp.where(jnp.isnan(a), _E4M3_MAX, mag)
  # one zero code, whatever the sign of a y that rounds to 0 (−0.0, or an f32 subnormal, which XLA:CPU flushes to 0)
  return _as(_e4m3_bits(jnp.where((y < 0) & (mag > 0), -mag, mag)), jnp.uint8)


def encode_moment(x, block: int, key=None, *, noise=None, as_bits=False):
  """(e4m3 codes shaped like x, float32 scales [..., last / b]): blockwise absmax along the last axis; rounded to
  nearest, or stochastically with `key` or `noise` (uint32 bits shaped like x, of which the low 16 are used; `key`
  draws them): unbiased to 2^-16 of a code's gap, so a moment that moves by less than half a code per step still
  moves on average, where round-to-nearest would leave it stuck (`_e4m3_stochastic_bits`). With `as_bits`
  (stochastic only) the codes come as their uint8 bit patterns, as the update carries them."""
  x = jnp.asarray(x, jnp.float32)
  if key is not None and noise is None:
    noise = jax.random.bits(key, x.shape, jnp.uint32)
  xb, _ = _blocks(x, block)
  s = jnp.max(jnp.abs(xb), axis=-1, keepdims=True) / _E4M3_MAX
  s = jnp.where(s > 0, s, 1.0)  # an all-zero block: any scale (its codes are 0)
  y = jnp.clip(xb / s, -_E4M3_MAX, _E4M3_MAX)  # clip first: a plain cast overflows to NaN
  if noise is None:
    codes = y.astype(_FP8)
  else:
    codes = _e4m3_stochastic_bits(y, noise.reshape(y.shape))
    codes = codes if as_bits else _as(codes, _FP8)
  return codes.reshape(x.shape), s[..., 0].reshape(x.shape[:-1] + (-1,)) if x.ndim else s.reshape(())


def decode_moment(codes, scale, block: int):
  """float32 values of `encode_moment`'s output."""
  cb, _ = _blocks(codes, block)
  s = scale.reshape(cb.shape[:-1] + (1,))
  return (_e4m3_value(cb) * s).reshape(codes.shape)  # not .astype: XLA:CPU's f8 convert is a software routine


def _bf16_stochastic(x, noise):
  """bfloat16 of float32 x rounded stochastically: the high 16 bits of `noise` (uint32, shaped like x) added to x's
  low 16 bits, then truncated (E = x exactly, non-negative x)."""
  bits = jax.lax.bitcast_convert_type(jnp.asarray(x, jnp.float32), jnp.uint32)
  return jax.lax.bitcast_convert_type((bits + (noise >> 16)) & jnp.uint32(0xFFFF0000), jnp.float32).astype(jnp.bfloat16)


_ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)  # Threefry-2x32's, round r uses [r % 8] (Salmon et al. 2011, table 4)


def _threefry2x32(k0, k1, c0, c1, rounds: int = 20):
  """Threefry-2x32 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011): the key (k0, k1) and
  counters (c0, c1), uint32, broadcast together; each round adds, rotates and xors the two words, and every fourth
  injects the key schedule (k0, k1, k0 ^ k1 ^ 0x1BD11BDA) in turn with the injection's index. 20 rounds: jax's
  and Random123's default. Straight-line code: XLA fuses it into its consumer."""
  ks = (k0, k1, k0 ^ k1 ^ jnp.uint32(0x1BD11BDA))
  x0, x1 = c0 + ks[0], c1 + ks[1]
  for r in range(rounds):
    rot = _ROTATIONS[r % 8]
    x0 = x0 + x1
    x1 = ((x1 << rot) | (x1 >> (32 - rot))) ^ x0
    if r % 4 == 3:
      i = (r + 1) // 4
      x0, x1 = x0 + ks[i % 3], x1 + ks[(i + 1) % 3] + jnp.uint32(i)
  return x0, x1


@functools.partial(jax.jit, static_argnums=1)  # one call in a jaxpr: tests find the draws by name
def _bits(key, shape):
  """uint32 bits shaped `shape` from a threefry2x32 key: `jax.random.bits(key, shape, jnp.uint32)`, bit for bit
  (jax_threefry_partitionable, jax's default: element i's bits are the xor of Threefry's two words at counter
  (0, i), i its row-major index), as straight-line code. jax runs the rounds on the CPU as a loop over full-size
  arrays (to compile faster); straight-line, XLA:CPU fuses them into their consumers (SmolLM2's tree, the update
  alone in one run: 2.85 -> 1.60 s with jax's own rounds unrolled, `lrl_jax/learner/README.md`). Written here from
  the paper rather than through jax's private lowering, with the counters' high word a constant 0 (jax builds both
  words per element): the same bits and about 10% less update time on the CPU (1.11-1.13 -> 0.98-1.00 s)."""
  n = math.prod(shape)
  if n >= 2**32:  # pragma: no cover -- the index needs the counter's high word
    return jax.random.bits(key, shape, jnp.uint32)
  k0, k1 = jax.random.key_data(key)
  strides = [math.prod(shape[d + 1 :]) for d in range(len(shape))]
  i = sum(
    (lax.broadcasted_iota(jnp.uint32, shape, d) * jnp.uint32(st) for d, st in enumerate(strides)),
    jnp.zeros(shape, jnp.uint32),
  )
  b0, b1 = _threefry2x32(k0, k1, jnp.uint32(0), i)
  return b0 ^ b1


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


def _apart(f, *args, live):
  """f(*args); on the CPU computed apart from what its results are written into: inside a conditional on `live`, a
  predicate that is always true but not known to the compiler (its other branch gives zeros).

  A slice's new state is written into the whole leaf's buffers in place (dynamic update slices), and the update reads
  the old slice of the same buffers. XLA:CPU fused the computation into each write, left the order of the reads and
  the writes open, and so copied the whole leaf's codes, scales and v in every slice: a [30, 576, 1536] leaf in 10
  slices moved 5.7 GB an update, 2.1 GB of it copies (`traffic.op_bytes`). XLA does not fuse across a conditional:
  its results are slice-sized buffers, computed from the old slices before any write (3.5 GB, no copies). At
  Qwen2.5-7B shapes, 16 x 72, the 8-bit step's peak went from 119.54 to 117.24 GiB (`lrl_jax/learner/README.md`).
  Other backends keep the fused writes (`lax.platform_dependent`: the compiler sees one branch): the TPU v5p target's
  update compiles to the same instructions as before, where the conditional would write and read each slice's
  results once more."""

  def cpu(*a):
    zeros = lambda *a: jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(f, *a))  # noqa: E731
    return lax.cond(live, f, zeros, *a)

  return lax.platform_dependent(*args, cpu=cpu, default=f)


def scale_by_adam_8bit(
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
  *,
  block: int = 256,
  nesterov: bool = False,
  clip: float | None = None,
) -> optax.GradientTransformation:
  """Adam's scaling (`optax.scale_by_adam`'s recurrences, bias-corrected) with m in 8 bits and v in bfloat16.

  Args:
    b1, b2, eps: Adam's β₁, β₂, ε.
    block: elements per scale of m (at most; the largest divisor of each parameter's last axis up to it).
    nesterov: NAdam's first-moment look-ahead (Dozat 2016), as `optax.scale_by_adam(nesterov=True)`.
    clip: a global-norm clip of the gradient first (`optax.clip_by_global_norm(clip)`'s rule and operations, so the
      same numbers), applied as each slice is read. Chained before this transform instead, the clip writes the
      clipped gradient out whole, 4 more bytes a parameter beside the gradient (22 GiB more at Qwen2.5-7B shapes,
      16 x 72: `lrl-jax bench learner memory`).

  The update takes an extra argument (`optax.GradientTransformationExtraArgs`; `optax.chain` passes it on):
  `apply`, a boolean scalar or None. Where it is false the state comes back as it was (its count too), selected
  slice by slice as the slices are written: the learner's skipped step on a GPU (`step._update_by_select`), where a
  select after the update read the codes, scales and v once more (+13% of the bytes of a Qwen2.5-7B-shaped step
  on an H100 target: 1145 against 1016 GB).
  """
  if block < 1:
    raise ValueError(f"scale_by_adam_8bit: block must be >= 1; got {block}")

  def init_fn(params):
    def zeros_scale(p):  # encode_moment's scales of m = 0: 1 (written directly: XLA folds the encode slowly)
      return jnp.ones(jax.eval_shape(lambda x: encode_moment(x, block), p)[1].shape, jnp.float32)

    return Adam8State(
      count=jnp.zeros([], jnp.int32),
      m_codes=jax.tree_util.tree_map(lambda p: jnp.zeros(jnp.shape(p), _FP8), params),
      m_scale=jax.tree_util.tree_map(zeros_scale, params),
      v=jax.tree_util.tree_map(lambda p: jnp.zeros(jnp.shape(p), jnp.bfloat16), params),
    )

  def update_fn(updates, state, params=None, *, apply=None, **extra_args):
    del params, extra_args
    count = optax.safe_increment(state.count)
    keep = (lambda new, old: new) if apply is None else (lambda new, old: jnp.where(apply, new, old))  # noqa: E731
    t = count.astype(jnp.float32)
    step_key = jax.random.fold_in(jax.random.key(_SR_SEED, impl="threefry2x32"), count)

    def moments(g, mc, ms, v_prev, noise):
      """(update, m codes as uint8 bit patterns, m scales, v) of one leaf or slice; mc: the codes as fp8 or their
      bits; noise: uint32 shaped like g (both roundings')."""
      g = jnp.asarray(g, jnp.float32)
      m = b1 * decode_moment(mc, ms, block) + (1.0 - b1) * g
      v = b2 * v_prev.astype(jnp.float32) + (1.0 - b2) * g * g
      m_hat = (b1 * m + (1.0 - b1) * g) / (1.0 - b1 ** (t + 1)) if nesterov else m / (1.0 - b1**t)
      v_hat = v / (1.0 - b2**t)
      u = m_hat / (jnp.sqrt(v_hat) + eps)
      mc, ms = encode_moment(m, block, noise=noise, as_bits=True)
      return u, mc, ms, _bf16_stochastic(v, noise)

    def one(i, g, mc, ms, v):
      g = jnp.asarray(g, jnp.float32)
      if g.ndim < 3:  # whole: drawn once g exists (`_tie`)
        key = jax.random.fold_in(_tie(step_key, g), i)
        u, mc1, ms1, v1 = moments(clipped(g), mc, ms, v, _bits(key, g.shape))
        return u, _as(keep(mc1, _as(mc, jnp.uint8)), _FP8), keep(ms1, ms), keep(v1, v)
      key, n = jax.random.fold_in(step_key, i), _layers_per_slice(g.shape)

      def layer_bits(layer):
        return _bits(jax.random.fold_in(key, layer), g.shape[1:])

      def slice_(j, carry):  # layers [j n, (j + 1) n): the update into its own carry, the state in place
        g_j = clipped(lax.dynamic_slice_in_dim(g, j * n, n))
        mc_j, ms_j, v_j = [lax.dynamic_slice_in_dim(x, j * n, n) for x in carry[1:]]
        # drawn outside `_apart`'s conditional, the bits are one buffer both roundings read: drawn inside, XLA:CPU
        # fused the hash into m's rounding and v's and computed it twice (the update alone 0.89-0.94x with it out)
        noise = jax.vmap(layer_bits)(j * n + jnp.arange(n))
        u_j, *new = _apart(moments, g_j, mc_j, ms_j, v_j, noise, live=count > 0)
        out = (u_j, *(keep(a, b) for a, b in zip(new, (mc_j, ms_j, v_j))))
        return tuple(lax.dynamic_update_slice_in_dim(x, y, j * n, 0) for x, y in zip(carry, out))

      init = (jnp.zeros_like(g), _as(mc, jnp.uint8), ms, v)
      u, mc, ms, v = lax.fori_loop(0, g.shape[0] // n, slice_, init)
      return u, _as(mc, _FP8), ms, v

    flat_g, treedef = jax.tree_util.tree_flatten(updates)
    if clip is None:
      clipped = lambda t: t  # noqa: E731
    else:  # optax.clip_by_global_norm's rule, the same operations, applied where a slice is read
      g_norm = optax.tree.norm(updates)
      trigger = jnp.squeeze(g_norm < clip)
      clipped = lambda t: lax.select(trigger, t, (t / g_norm.astype(t.dtype)) * clip)  # noqa: E731
    parts = [jax.tree_util.tree_leaves(x) for x in (state.m_codes, state.m_scale, state.v)]
    out = [one(i, g, *xs) for i, (g, *xs) in enumerate(zip(flat_g, *parts))]
    unflat = lambda i: jax.tree_util.tree_unflatten(treedef, [o[i] for o in out])  # noqa: E731
    return unflat(0), Adam8State(keep(count, state.count), unflat(1), unflat(2), unflat(3))

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
