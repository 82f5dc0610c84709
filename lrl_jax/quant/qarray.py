"""The numerics contract: QArray, quantize, dequantize, fake_quant.

One definition per format (see `specs.py` for the formulas). The learner calls
`fake_quant` (or the dot_general of `aqt.py`, proven equal to it); the sampler
stores `quantize(w)` and its kernels read the codes. They agree bit for bit:

    fake_quant(x, spec, axis=a) == dequantize(quantize(x, spec, axis=a), x.dtype)

Everything is computed in float32 whatever the input dtype; the result of
`dequantize` / `fake_quant` is rounded once, to the requested dtype, at the end.
Quantize the array the matmul sees: if the learner casts f32 master weights to
bf16 before its dot, the sampler quantizes the bf16 cast too.

Non-finite input: a NaN or ±Inf element makes its own group (INT4 group, FP8
channel/block, MXFP8/NVFP4 block) dequantize to NaN; other groups are untouched
(the NVFP4 per-tensor scale is taken over the finite elements only). Finite input
never produces NaN or Inf: everything saturates.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from lrl_jax.quant import packing
from lrl_jax.quant.specs import FP4_MAX, FP8, FP8_MAX, INT4_MAX, INT4_SCALE_FLOOR, MXFP8, NVFP4, NVFP4WAG, Int4, Spec

__all__ = ["QArray", "quantize", "dequantize", "fake_quant", "learned_fake_quant", "check_spec", "tree_nbytes"]

_F32_TINY = float(jnp.finfo(jnp.float32).tiny)  # smallest normal f32: CPUs flush denormals to zero
_F32_MAX = float(jnp.finfo(jnp.float32).max)
_INT4_SCALE_FLOOR = INT4_SCALE_FLOOR


@functools.partial(
  jax.tree_util.register_dataclass,
  data_fields=["codes", "scale", "global_scale", "zero_point"],
  meta_fields=["spec", "axis"],
)
@dataclasses.dataclass(frozen=True)
class QArray:
  """A quantized array. Invariant: `dequantize(q) ≈ x` with the error of `q.spec`.

  Attributes:
    codes: Int4 / NVFP4: uint8, two 4-bit codes per byte along `axis` (element 2i in
      the low nibble; INT4 codes stored as q + 8). FP8 / MXFP8: float8_e4m3fn, `shape`.
    scale: one scale per group, `shape` with the group axis (or, for FP8 blocks, the
      last two axes) divided by the group size. Int4: `spec.scale_dtype`; FP8: float32;
      MXFP8: float8_e8m0fnu; NVFP4: float8_e4m3fn.
    global_scale: NVFP4 only: the float32 per-matrix decode scale `dec`, one per matrix of
      the last two axes (shape = the leading axes; () for a plain matrix). None otherwise.
    zero_point: asymmetric Int4 only (`spec.asymmetric`): int8 per group, the shape of `scale`,
      signed convention (compressed-tensors): ŵ = (q − z) · s with q in [-8, 7] (stored in the
      nibble as q + 8). None otherwise (z = 0).
    spec: the format (static).
    axis: the axis the groups run along, counted from the end (static, negative);
      the matmul's contraction axis: -2 for a kernel [.., K, N] used as `x @ w`.

  Leading axes are a stack (scanned layers, experts): slicing every field along
  them (`lax.scan`, `vmap`, indexing) gives the QArray of the slice, so the logical
  `shape` is derived from the codes rather than stored.
  """

  codes: jax.Array
  scale: jax.Array
  global_scale: jax.Array | None
  spec: Spec
  axis: int
  zero_point: jax.Array | None = None

  @property
  def shape(self) -> tuple[int, ...]:
    s = list(self.codes.shape)
    if isinstance(self.spec, (Int4, NVFP4)):
      s[self.axis] *= 2  # two codes per byte along the group axis
    return tuple(s)

  @property
  def ndim(self) -> int:
    return self.codes.ndim

  @property
  def nbytes(self) -> int:
    """Bytes of codes and scales (what a matmul has to read)."""
    n = self.codes.size * self.codes.dtype.itemsize + self.scale.size * self.scale.dtype.itemsize
    for extra in (self.global_scale, self.zero_point):
      if extra is not None:
        n += extra.size * extra.dtype.itemsize
    return int(n)

  @property
  def bits_per_weight(self) -> float:
    """Storage bits per logical element, scales included."""
    return 8 * self.nbytes / math.prod(self.shape)


# --------------------------------------------------------------------------- checks


def tree_nbytes(tree) -> int:
  """Bytes of one copy of a (float or served) parameter tree: QArray codes, scales, global scales and zero points
  included (each QArray counts its `nbytes`). Arrays or `jax.ShapeDtypeStruct`s; nothing is copied to the host."""
  return int(sum(x.size * jnp.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(tree)))


def _normalize_axis(spec: Spec, shape: tuple[int, ...], axis: int) -> int:
  if len(shape) == 0:
    raise ValueError(f"{spec}: cannot quantize a scalar (shape {shape}, axis {axis})")
  if not -len(shape) <= axis < len(shape):
    raise ValueError(f"{spec}: axis {axis} out of range for shape {shape}")
  return axis % len(shape)


def check_spec(spec: Spec, shape: tuple[int, ...], dtype, axis: int = -1) -> int:
  """Validates (spec, shape, dtype, axis) at trace time; returns the axis counted from the end (< 0).

  Raises:
    ValueError naming the spec, the shape and the axis.
  """
  if not isinstance(spec, (Int4, FP8, MXFP8, NVFP4, NVFP4WAG)):
    raise TypeError(f"not a quantization spec: {spec!r}")
  shape = tuple(shape)
  if not jnp.issubdtype(dtype, jnp.floating) or jnp.dtype(dtype).itemsize < 2:
    raise ValueError(
      f"{spec}: expected a float32/bfloat16/float16 array, got dtype {jnp.dtype(dtype)} (shape {shape}, axis {axis})"
    )
  ax = _normalize_axis(spec, shape, axis)
  if isinstance(spec, NVFP4WAG):
    if len(shape) < 2 or ax < len(shape) - 2 or shape[-2] % 16 or shape[-1] % 16:
      raise ValueError(
        f"{spec}: 16x16 tiles need the group axis among the last two and both multiples of 16; got shape {shape} "
        f"(axis {axis})"
      )
  if isinstance(spec, FP8) and spec.granularity == "block":
    if len(shape) < 2:
      raise ValueError(f"{spec}: 2-D blocks need rank >= 2, got shape {shape} (axis {axis})")
    for d in (-2, -1):
      if shape[d] % spec.block:
        raise ValueError(
          f"{spec}: dimension {len(shape) + d} of shape {shape} is not a multiple of block {spec.block} (axis {axis})"
        )
  elif isinstance(spec, (Int4, MXFP8, NVFP4)):
    if shape[ax] % spec.block:
      raise ValueError(f"{spec}: group size {spec.block} does not divide axis {axis} of shape {shape}")
  if isinstance(spec, NVFP4) and len(shape) > 2 and ax < len(shape) - 2:
    raise ValueError(
      f"{spec}: the per-matrix scale covers the last two axes; the group axis must be one of "
      f"them, got axis {axis} of shape {shape}"
    )
  return ax - len(shape)


# --------------------------------------------------------------------------- helpers


def _exact_cast(x: jax.Array, dtype) -> jax.Array:
  # XLA may drop a narrowing convert that is immediately widened again
  # (allow_excess_precision); the barrier keeps the rounding, which is the point.
  return lax.optimization_barrier(x.astype(dtype))


def _div(x: jax.Array, d) -> jax.Array:
  """x / d, a true IEEE division.

  XLA rewrites `x / broadcast(d)` into `x * broadcast(1 / d)` (seen on CPU), which is off by an ulp often enough to
  move codes at rounding ties; slime and compressed-tensors divide. The divisor is made per element, NaN where x is
  NaN (x / anything is NaN there, so the quotient is the same everywhere): not a broadcast, so XLA keeps the
  division, and it fuses into the division's pass. (It was the broadcast behind an optimization barrier, which kept
  the division too but wrote the divisor out in full: 8 bytes a weight in every QAT step, `lrl_jax/learner/README.md`.)
  """
  return x / jnp.where(jnp.isnan(x), jnp.nan, jnp.asarray(d, x.dtype))


def _groups(x: jax.Array, axis: int, size: int) -> jax.Array:
  """[.., K, ..] -> [.., K/size, size, ..] in place (a free reshape, no transpose).

  `axis` is negative; in the grouped array the element axis keeps that same negative index.
  """
  ax = axis % x.ndim
  return x.reshape(x.shape[:ax] + (x.shape[ax] // size, size) + x.shape[ax + 1 :])


def _fenced_groups(x: jax.Array, axis: int, size: int) -> jax.Array:
  """`_groups(x, axis, size)` behind an optimization barrier, for a quantizer's input: the group reductions and the
  elementwise pass after them then stay in the grouped shape. Without it XLA:TPU moves the elementwise work back to
  x's shape, cannot fuse across the reshape (a bitcast) and writes |x| in f32 and the scales broadcast in full: 25
  (INT4) and 40 (NVFP4) bytes a weight above the bf16 step, against 11 and 12 with it (`lrl_jax/learner/README.md`).
  XLA:CPU runs the same time either way. Cast x to float32 after this, not before (the barrier keeps what it is given
  in memory)."""
  return lax.optimization_barrier(_groups(x, axis, size))


def _ungroup(xg: jax.Array, axis: int) -> jax.Array:
  """Inverse of `_groups`."""
  e = axis % xg.ndim
  return xg.reshape(xg.shape[: e - 1] + (xg.shape[e - 1] * xg.shape[e],) + xg.shape[e + 1 :])


def _scale_shape(scale_g: jax.Array, axis: int) -> jax.Array:
  """Group scales [.., K/size, 1, ..] -> the logical layout [.., K/size, ..]."""
  return jnp.squeeze(scale_g, axis)


def _scale_groups(scale: jax.Array, axis: int) -> jax.Array:
  """Inverse of `_scale_shape`: broadcastable against the grouped array."""
  return jnp.expand_dims(scale, axis)


def _absmax(xg: jax.Array, axes) -> jax.Array:
  """max |x| over `axes` (kept), NaN for a group holding a NaN or Inf.

  NaN enters the max as +Inf (some XLA CPU reductions drop NaN from a max), so one reduction marks both; a second
  one (`all(isfinite)`) cost XLA:TPU another pass over the weight stack: the INT4 QAT step's bytes accessed above the
  bf16 step's 3.44 -> 2.78 GB (`lrl_jax/learner/README.md`).

  One long non-minor axis (>= 64, a multiple of 16: INT4 g64 / g128 groups, FP8's per-channel K) is reduced on a CPU
  in two stages, over groups of 16 along it and then over those: the same value (a max of maxima; NaN stays NaN),
  but XLA:CPU reduced such an axis at a third to a quarter of the rate (a [30, 576, 1536] stack: over K 12.3 ->
  2.7 ms, over groups of 64 12.9 -> 4.0 ms; over 32, one stage is the faster). Elsewhere in one go
  (`lax.platform_dependent`): XLA:TPU did not fuse the two-stage form (FP8's fake quant of that stack 10.0 -> 18.6
  bytes a weight).
  """
  if isinstance(axes, int):
    ax = axes % xg.ndim
    n = xg.shape[ax]
    if ax != xg.ndim - 1 and n >= 64 and n % 16 == 0:

      def two_stage(x):
        blocks = _absmax_once(_groups(x, ax - x.ndim, 16), ax - x.ndim)  # [.., n/16, 1, ..]
        return _absmax_once(jnp.squeeze(blocks, ax + 1), ax)

      return lax.platform_dependent(xg, cpu=two_stage, default=lambda x: _absmax_once(x, ax))
  return _absmax_once(xg, axes)


def _absmax_once(xg: jax.Array, axes) -> jax.Array:
  """`_absmax` as one reduction."""
  mag, inf = _magnitude_bits(xg)
  return _amax_of_bits(jnp.max(mag, axis=axes, keepdims=True), inf, xg.dtype)


def _amax_of_bits(m: jax.Array, inf: jax.Array, dtype) -> jax.Array:
  """A max over `_magnitude_bits` back to a float: the max |x|, NaN where it met a NaN or an Inf."""
  return jnp.where(m >= inf, jnp.array(jnp.nan, dtype), lax.bitcast_convert_type(m, dtype))


def _magnitude_bits(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(|x|'s bits as a signed integer of x's width, +Inf's bits). Non-negative floats order as their bits do, and a
  NaN's magnitude bits lie above +Inf's, so an integer max over them is max |x| with NaN counted as above Inf:
  exactly the float max with NaN entering as +Inf, but in a reduction XLA:CPU fuses with the bit mask. The float
  version's select was written out in full before the max (XLA:CPU hands a float max to its YNNPACK reduction,
  which fuses no producer): `nvfp4_operand` on a [30, 576, 1536] stack took 60 ms, 39 ms so (bit for bit)."""
  ity = {1: jnp.int8, 2: jnp.int16, 4: jnp.int32, 8: jnp.int64}[jnp.dtype(x.dtype).itemsize]
  width = 8 * jnp.dtype(x.dtype).itemsize
  mag = lax.bitcast_convert_type(x, ity) & jnp.array((1 << (width - 1)) - 1, ity)
  return mag, lax.bitcast_convert_type(jnp.array(jnp.inf, x.dtype), ity)


def _poison(s: jax.Array, amax: jax.Array) -> jax.Array:
  """A group whose amax is NaN or Inf gets a NaN scale, so it dequantizes to NaN as a whole."""
  return jnp.where(jnp.isfinite(amax), s, jnp.nan)


def _safe_div(x: jax.Array, d: jax.Array) -> jax.Array:
  """x / d with d == 0 (an all-zero or underflowed group) giving 0, never NaN."""
  return jnp.where(d > 0, _div(x, jnp.where(d > 0, d, 1.0)), 0.0)


# --------------------------------------------------------------------------- formats


def _int4_range(xg, spec: Int4, axis):
  """The computed (not learned) scale and zero point of each group: absmax, or minmax (0 in range)."""
  if spec.scheme == "minmax":
    finite = jnp.all(jnp.isfinite(xg), axis=axis, keepdims=True)
    lo = jnp.minimum(jnp.min(xg, axis=axis, keepdims=True), 0.0)
    hi = jnp.maximum(jnp.max(xg, axis=axis, keepdims=True), 0.0)
    marker = jnp.where(finite, hi - lo, jnp.nan)  # NaN for a group holding a NaN or Inf
    return _div(marker, 15.0), lo, marker
  amax = _absmax(xg, axis)
  return _div(amax, INT4_MAX), None, amax


def _int4_scale(s, sdt, marker):
  """Floor, saturate to the storage dtype, poison non-finite groups, round to `sdt` (before use)."""
  s = jnp.maximum(s, _INT4_SCALE_FLOOR)  # also maps NaN (a NaN-poisoned learned scale stays NaN below)
  s = _poison(jnp.minimum(s, float(jnp.finfo(sdt).max)), marker)  # amax/7 can overflow fp16: saturate
  return _exact_cast(s, sdt)


def _int4_zero(z, spec: Int4):
  """Zero point as float in the signed convention: round-half-to-even, clipped to [-8, 7]."""
  return jnp.clip(jnp.round(jnp.where(jnp.isnan(z), 0.0, z)), -8, INT4_MAX)


def _int4_codes(xg, s32, z32, spec: Int4):
  """q = clip(round(x / s) + z, qmin, qmax) in float32 (NaN input -> 0; its scale carries the NaN)."""
  q = jnp.round(_div(xg, s32))  # jnp.round is round-half-to-even
  if z32 is not None:
    q = q + z32
  return jnp.clip(jnp.where(jnp.isnan(q), 0.0, q), spec.qmin, spec.qmax)


def _int4_qparams(xg, spec: Int4, axis, scale, zero_point):
  """(s in the storage dtype [.., G=1, ..], z float32 or None) of each group, computed or given."""
  sdt = jnp.dtype(spec.scale_dtype)
  if scale is None:
    if spec.learned and spec.learn_zero_point:
      spec_init = dataclasses.replace(spec, scheme="minmax", learn_zero_point=False)
    else:
      spec_init = spec
    s, lo, marker = _int4_range(xg, spec_init, axis)
    s = _int4_scale(s, sdt, marker)
    z = None
    if spec.asymmetric:
      zu = jnp.clip(jnp.round(_safe_div(-lo, s.astype(jnp.float32))), 0, 15)
      z = zu - 8.0
    return s, z
  marker = _absmax(xg, axis)  # only its finiteness is used: a non-finite group dequantizes to NaN
  s = _int4_scale(_scale_groups(jnp.asarray(scale, jnp.float32), axis), sdt, marker)
  z = None
  if spec.asymmetric:
    zp = jnp.zeros(s.shape, jnp.float32) if zero_point is None else jnp.asarray(zero_point, jnp.float32)
    z = _int4_zero(_scale_groups(zp, axis) if zero_point is not None else zp, spec)
  elif zero_point is not None:
    raise ValueError(
      f"{spec}: a zero point was given but the spec is symmetric (scheme={spec.scheme!r}, "
      f"learn_zero_point={spec.learn_zero_point})"
    )
  return s, z


def _quantize_int4(x, spec: Int4, axis, scale=None, zero_point=None):
  xg = _groups(x, axis, spec.group_size)
  s, z = _int4_qparams(xg, spec, axis, scale, zero_point)
  q = _int4_codes(xg, s.astype(jnp.float32), z, spec).astype(jnp.int8)
  codes = packing.pack_nibbles((_ungroup(q, axis) + 8).astype(jnp.uint8), axis)
  zp = None if z is None else _scale_shape(z, axis).astype(jnp.int8)
  return codes, _scale_shape(s, axis), None, zp


def _dequantize_int4(q: QArray):
  codes = packing.unpack_nibbles(q.codes, q.axis).astype(jnp.int32) - 8
  if q.zero_point is not None:
    zg = _scale_groups(q.zero_point.astype(jnp.int32), q.axis)
    codes = _ungroup(_groups(codes, q.axis, q.spec.group_size) - zg, q.axis)
  qg = _groups(codes.astype(jnp.float32), q.axis, q.spec.group_size)
  return _ungroup(qg * _scale_groups(q.scale, q.axis).astype(jnp.float32), q.axis)


def _fp8_codes(x, s, cast=True):
  # Clipped to ±448 (a cast of |x| > 464 to float8_e4m3fn gives NaN), rounded by arithmetic (`_round_e4m3`), then
  # stored as float8_e4m3fn bits (`_e4m3_bits`): the cast's codes, bit for bit. cast=False: the codes' values left
  # in float32, for a fake quant that never stores them.
  r = _round_e4m3(jnp.clip(_div(x, s), -FP8_MAX, FP8_MAX))
  return _e4m3_bits(r) if cast else r


def _fp8_scale(amax):
  # s = amax / 448, floored at the smallest normal f32 so that x / s never meets a
  # flushed-to-zero denominator (amax == 0 then yields zero codes).
  return _poison(jnp.maximum(_div(amax, FP8_MAX), _F32_TINY), amax)


def _quantize_fp8(x, spec: FP8, axis, cast=True):
  if spec.granularity == "block":
    b = spec.block
    *lead, k, n = x.shape
    xb = x.reshape(*lead, k // b, b, n // b, b)
    s = _fp8_scale(_absmax(xb, (-3, -1)))
    codes = _fp8_codes(xb, s, cast).reshape(x.shape)
    return codes, s[..., 0, :, 0], None
  s = _fp8_scale(_absmax(x, axis))
  return _fp8_codes(x, s, cast), s, None


def _dequantize_fp8(q: QArray):
  c = q.codes.astype(jnp.float32)
  if q.spec.granularity == "block":
    b = q.spec.block
    *lead, k, n = c.shape
    cb = c.reshape(*lead, k // b, b, n // b, b)
    return (cb * q.scale[..., :, None, :, None]).reshape(q.shape)
  return c * q.scale


def _quantize_mxfp8(x, spec: MXFP8, axis, cast=True):
  xg = _groups(x, axis, spec.block_size)
  amax = _absmax(xg, axis)
  v = _div(amax, FP8_MAX)
  mant, exp = jnp.frexp(v)  # v = mant · 2^exp, mant in [0.5, 1)
  e = jnp.where(mant == 0.5, exp - 1, exp)  # ceil(log2 v), exact for powers of two
  e = jnp.where(v > 0, e, -126)
  # E8M0 reaches 2^-127, but 2^-127 is an f32 denormal (flushed on CPU): clamp at 2^-126.
  e = jnp.clip(e, -126, 127)
  scale = jnp.ldexp(jnp.ones_like(v), e)
  scale = _poison(scale, amax)
  codes = _fp8_codes(xg, scale, cast)
  return _ungroup(codes, axis), _scale_shape(scale.astype(jnp.float8_e8m0fnu), axis), None


def _dequantize_mxfp8(q: QArray):
  cg = _groups(q.codes.astype(jnp.float32), q.axis, q.spec.block_size)
  return _ungroup(cg * _scale_groups(q.scale, q.axis).astype(jnp.float32), q.axis)


def _block_amaxes(xg: jax.Array, axis: int) -> tuple[jax.Array, jax.Array]:
  """(`_absmax(xg, axis)`, the max |x| over the finite elements of each group, 0 if none; both kept dims) from one
  variadic reduction: XLA reads the groups once for both. NVFP4 takes its per-matrix amax from the second: the max
  over the blocks is the max over the matrix, but XLA:CPU reduced a whole [576, 1536] matrix at a sixth of the rate
  it reduces its groups (17 against 2.5 ms on a [30, 576, 1536] stack), and XLA:TPU read the weight a second time."""
  mag, inf = _magnitude_bits(xg)
  ax = axis % xg.ndim
  zero = jnp.zeros((), mag.dtype)
  m, f = lax.reduce(
    (mag, jnp.where(mag < inf, mag, zero)),
    (zero, zero),
    lambda a, b: (jnp.maximum(a[0], b[0]), jnp.maximum(a[1], b[1])),
    (ax,),
  )
  m, f = jnp.expand_dims(m, ax), jnp.expand_dims(f, ax)
  return _amax_of_bits(m, inf, xg.dtype), lax.bitcast_convert_type(f, xg.dtype)


def _nvfp4_global(finite_block_amax):
  """(dec, enc) of each matrix from its amax over the last two axes (leading axes are a stack of matrices), over
  finite elements only, so one NaN does not poison the whole matrix: the max of its blocks' finite amaxes (the
  second of `_block_amaxes`, in the grouped layout, one more axis than x)."""
  b = finite_block_amax
  amax = jnp.max(b, axis=tuple(range(max(b.ndim - 3, 0), b.ndim)))  # finite, >= 0: a float max is exact
  enc = (FP8_MAX * FP4_MAX) / amax
  enc = jnp.where(amax > 0, jnp.minimum(enc, _F32_MAX), 1.0)  # 1 when amax is 0; no Inf for tiny amax
  return 1.0 / enc, enc


def _per_matrix(v: jax.Array, ndim: int) -> jax.Array:
  """A per-matrix value [lead...] broadcast against an array of rank `ndim` (grouped layout adds one)."""
  return v.reshape(v.shape + (1,) * (ndim - v.ndim))


def _tile_max(amax: jax.Array, axis: int) -> jax.Array:
  """Block amaxes [.., K/16, 1, N] (grouped layout, groups along `axis`) -> the max over each 16x16 tile, repeated
  over the tile's 16 groups along the other matrix axis (NaN if any of them is NaN)."""
  o = (-1 if axis == -2 else -3) % amax.ndim  # the other matrix axis, in the grouped layout
  t = amax.reshape(amax.shape[:o] + (amax.shape[o] // 16, 16) + amax.shape[o + 1 :])
  m = jnp.max(t, axis=o + 1, keepdims=True)
  m = jnp.where(jnp.any(jnp.isnan(t), axis=o + 1, keepdims=True), jnp.nan, m)  # some CPU max-reductions drop NaN
  return jnp.broadcast_to(m, t.shape).reshape(amax.shape)


def _nvfp4_prepare(x, axis, tile: bool = False):
  """NVFP4 up to the element rounding: (v, s_b, dec), v = clip(x / (s_b · dec), ±6) in the grouped layout
  [.., K/16, 16, ..] (NaN -> 0: the NaN lives on in the block scale), s_b the block scales [.., K/16, 1, ..] (e4m3
  values held in float32), dec the per-matrix decode scale. tile: one s_b per 16x16 tile of the last two axes
  (`NVFP4WAG` weights)."""
  xg = _fenced_groups(x, axis, 16).astype(jnp.float32)
  amax, finite_amax = _block_amaxes(xg, axis)
  dec, enc = _nvfp4_global(finite_amax)
  dec_g, enc = _per_matrix(dec, xg.ndim), _per_matrix(enc, xg.ndim)
  if tile:
    amax = _tile_max(amax, axis)
  sb = _round_e4m3(_poison(jnp.minimum(_div(amax * enc, FP4_MAX), FP8_MAX), amax))
  q = jnp.clip(_safe_div(xg, sb * dec_g), -FP4_MAX, FP4_MAX)
  return jnp.where(jnp.isnan(xg), 0.0, q), sb, dec.astype(jnp.float32)


def _round_e4m3(v: jax.Array) -> jax.Array:
  """float32 v (|v| <= 448, or NaN) rounded to the nearest float8_e4m3fn value, ties to even, still in float32: the
  value of `v.astype(float8_e4m3fn).astype(float32)`, bit for bit, as arithmetic. XLA fuses a block scale into each
  of its 16 elements' consumers, and XLA:CPU's f8 convert is a software routine: the cast cost the NVFP4 QAT operand
  a third of its time (`lrl_jax/learner/README.md`). The spacing of e4m3 values at |v| is 2^(max(e, -6) - 3), e the
  exponent of |v| (-6: the subnormals' spacing 2^-9); dividing and multiplying by a power of two is exact."""
  e = (lax.bitcast_convert_type(v.astype(jnp.float32), jnp.int32) >> 23) & 0xFF  # biased exponent of |v|
  step = lax.bitcast_convert_type((jnp.maximum(e, 127 - 6) - 3) << 23, jnp.float32)
  return jnp.round(v / step) * step


def _e4m3_bits(r: jax.Array) -> jax.Array:
  """float32 r holding float8_e4m3fn values (or NaN) -> the same values as float8_e4m3fn, bit for bit as
  `r.astype(float8_e4m3fn)` (NaN keeps its sign: 0x7F / 0xFF), built from r's bits with integer arithmetic that
  XLA:CPU vectorises (its f8 convert is a software routine). A normal value's exponent field is r's less 120
  (biases 127 and 7) and its 3 mantissa bits are r's top 3; below 2^-6 the code is the subnormal |r| / 2^-9."""
  b = lax.bitcast_convert_type(r.astype(jnp.float32), jnp.uint32)
  e = (b >> 23) & 0xFF
  normal = ((e - 120) << 3) | ((b >> 20) & 7)
  subnormal = (jnp.abs(r) * 512.0).astype(jnp.uint32)  # exact: 0 .. 7
  mag = jnp.where(jnp.isnan(r), jnp.uint32(0x7F), jnp.where(e >= 121, normal, subnormal))
  return lax.bitcast_convert_type(((b >> 24) & 0x80 | mag).astype(jnp.uint8), jnp.float8_e4m3fn)


def _e4m3_value(codes: jax.Array) -> jax.Array:
  """float8_e4m3fn codes (or their bits as uint8) -> float32, bit for bit as `codes.astype(float32)` (0x7F / 0xFF:
  NaN of that sign), built with integer arithmetic: `_e4m3_bits` backwards. A normal code's f32 exponent field is its
  own plus 120 and its 3 mantissa bits are f32's top 3; a subnormal code is its mantissa times 2^-9."""
  c = codes if codes.dtype == jnp.uint8 else lax.bitcast_convert_type(codes, jnp.uint8)
  c = c.astype(jnp.uint32)
  e, m, sign = (c >> 3) & 0xF, c & 7, (c & 0x80) << 24
  normal = lax.bitcast_convert_type(sign | ((e + 120) << 23) | (m << 20), jnp.float32)
  subnormal = jnp.where(sign > 0, -1.0, 1.0) * m.astype(jnp.float32) * 2.0**-9  # exact: 0 .. 7 times 2^-9, signed
  return jnp.where((c & 0x7F) == 0x7F, jnp.where(sign > 0, -jnp.nan, jnp.nan), jnp.where(e > 0, normal, subnormal))


def _e2m1_nibbles(r: jax.Array) -> jax.Array:
  """float32 r holding float4_e2m1fn values (or NaN) -> their 4-bit codes as uint8, bit for bit as
  `bitcast(r.astype(float4_e2m1fn), uint4)` on XLA:CPU (NaN: 8; a NaN only occurs where the block scale is NaN,
  so the block dequantizes to NaN whatever its codes), as arithmetic: the magnitudes 0, 0.5 .. 1.5, 2, 3, 4, 6 are
  codes 2|r| below 2, |r| + 2 below 4, |r| / 2 + 4 from 4; bit 3 is the sign."""
  nan, a = jnp.isnan(r), jnp.abs(r)
  mag = jnp.where(nan, 0.0, jnp.where(a < 2, a * 2, jnp.where(a < 4, a + 2, a * 0.5 + 4))).astype(jnp.uint8)
  sign = ((lax.bitcast_convert_type(r.astype(jnp.float32), jnp.uint32) >> 28) & 8).astype(jnp.uint8)
  return jnp.where(nan, jnp.uint8(8), sign | mag)


def _round_e2m1(v: jax.Array) -> jax.Array:
  """float32 v (|v| <= 6) rounded to the nearest float4_e2m1fn value {0, 0.5, 1, 1.5, 2, 3, 4, 6}, ties to even,
  in float32: `v.astype(float4_e2m1fn).astype(float32)` bit for bit (the spacing is 0.5 below 2, 1 below 4, then 2;
  an even multiple of the spacing is an even code), as arithmetic XLA:CPU vectorises (its f4 convert does not)."""
  a = jnp.abs(v)
  step = jnp.where(a < 2, 0.5, jnp.where(a < 4, 1.0, 2.0))
  return jnp.round(v / step) * step


def _quantize_nvfp4(x, spec: NVFP4 | NVFP4WAG, axis):
  q, sb, dec = _nvfp4_prepare(x, axis, tile=isinstance(spec, NVFP4WAG))
  nib = _e2m1_nibbles(_round_e2m1(q))  # round to nearest even, as the cast to float4_e2m1fn
  codes = packing.pack_nibbles(_ungroup(nib, axis), axis)
  return codes, _scale_shape(_e4m3_bits(sb), axis), dec  # sb holds e4m3 values


def nvfp4_operand(x: jax.Array, spec: NVFP4 | NVFP4WAG = NVFP4(), *, axis: int = -2):
  """NVFP4's fake quant in the served matmul's form, without packing codes: (e2m1 · s_b in float32, dec).

  The same numbers as `dequantize(quantize(x, spec, axis=axis), jnp.float32, global_scale=False)` and
  `quantize(...).global_scale`, bit for bit (the e2m1 values rounded the same way, times the same E4M3 block
  scales), in one elementwise pass after the scales: no nibble packing and unpacking in between. x̂ = that · dec
  (dec per matrix: the shape of x's leading axes). What the learner's hoisted NVFP4 QAT operand and `fake_quant`
  compute.
  """
  if not isinstance(spec, (NVFP4, NVFP4WAG)):
    raise ValueError(f"nvfp4_operand: an NVFP4 / NVFP4WAG spec; got {spec}")
  x = jnp.asarray(x)
  axis = check_spec(spec, x.shape, x.dtype, axis)
  q, sb, dec = _nvfp4_prepare(x, axis, tile=isinstance(spec, NVFP4WAG))
  return _ungroup(_round_e2m1(q) * sb, axis), dec  # e2m1 rounded as `_quantize_nvfp4`'s codes; the product exact


def _dequantize_nvfp4(q: QArray, global_scale: bool = True):
  nib = packing.unpack_nibbles(q.codes, q.axis).astype(jnp.uint4)
  vals = lax.bitcast_convert_type(nib, jnp.float4_e2m1fn).astype(jnp.float32)
  vg = _groups(vals, q.axis, q.spec.block_size)
  vg = vg * _scale_groups(q.scale, q.axis).astype(jnp.float32)  # e2m1 · s_b: exact (2 x 4 significant bits)
  if global_scale:
    vg = vg * _per_matrix(q.global_scale, vg.ndim)
  return _ungroup(vg, q.axis)


_QUANTIZE = {
  Int4: _quantize_int4,
  FP8: _quantize_fp8,
  MXFP8: _quantize_mxfp8,
  NVFP4: _quantize_nvfp4,
  NVFP4WAG: _quantize_nvfp4,
}
_DEQUANTIZE = {Int4: _dequantize_int4, FP8: _dequantize_fp8, MXFP8: _dequantize_mxfp8, NVFP4: _dequantize_nvfp4}


# --------------------------------------------------------------------------- API


def _check_qparams(spec: Spec, shape, axis: int, scale, zero_point):
  """Given scale / zero point: Int4 only, the shape of the group scales [.., K/G, ..]."""
  if scale is None and zero_point is None:
    return
  if not isinstance(spec, Int4):
    raise ValueError(f"{spec}: a given scale / zero point is supported for Int4 only")
  if scale is None:
    raise ValueError(f"{spec}: a zero point was given without a scale")
  want = list(shape)
  want[axis] //= spec.group_size
  for name, v in (("scale", scale), ("zero_point", zero_point)):
    if v is not None and tuple(jnp.shape(v)) != tuple(want):
      raise ValueError(
        f"{spec}: {name} must have the group shape {tuple(want)} of an array {tuple(shape)} "
        f"grouped along axis {axis}; got {tuple(jnp.shape(v))}"
      )


def quantize(x: jax.Array, spec: Spec, *, axis: int = -1, scale=None, zero_point=None) -> QArray:
  """Quantizes `x` to `spec`, groups/blocks running along `axis`.

  Args:
    x: float32 / bfloat16 / float16 array.
    spec: an `Int4`, `FP8`, `MXFP8`, `NVFP4` or `NVFP4WAG` spec (the latter: NVFP4 with one E4M3 scale per
      16x16 tile of the last two axes, returned as an `NVFP4()` QArray, the tile's scale repeated per group).
    axis: the axis groups run along: the contraction axis of the matmul the array
      feeds (0 or -2 for a weight [K, N] used as `x @ w`). Ignored by FP8 channel/token,
      which reduce over it, and FP8 block, which tiles the last two axes.
    scale: Int4 only: the group scales to use (a learned `kernel_scale`, any float dtype,
      the shape of `x` with `axis` divided by the group size) instead of computing them;
      floored at 1e-5 and rounded to `spec.scale_dtype` like computed ones.
    zero_point: Int4 with `spec.asymmetric` only: the group zero points (float, signed
      convention; rounded half-to-even and clipped to [-8, 7]); None with a given scale: 0.

  Returns:
    A `QArray` with `dequantize(q) ≈ x`.

  Raises:
    ValueError (at trace time) if the group size does not divide the axis, the dtype
    is not floating point, the rank does not fit the format, or a given scale / zero
    point does not have the group shape.
  """
  x = jnp.asarray(x)
  ax = check_spec(spec, x.shape, x.dtype, axis)
  _check_qparams(spec, x.shape, ax, scale, zero_point)
  x32 = x.astype(jnp.float32)
  if isinstance(spec, Int4):
    codes, sc, gs, zp = _quantize_int4(x32, spec, ax, scale, zero_point)
  else:
    (codes, sc, gs), zp = _QUANTIZE[type(spec)](x32, spec, ax), None
  if isinstance(spec, NVFP4WAG):
    spec = NVFP4()  # served and stored as plain NVFP4: the 16x16 tiles only constrain which scales occur
  return QArray(codes=codes, scale=sc, global_scale=gs, spec=spec, axis=ax, zero_point=zp)


def dequantize(q: QArray, dtype=jnp.float32, *, global_scale: bool = True) -> jax.Array:
  """x̂ of `q`, computed in float32 and rounded once to `dtype`.

  global_scale: NVFP4 only (ignored by the other formats). False leaves out the per-matrix decode scale and
    returns e2m1 · s_b, which is exact in float32, bfloat16 and float16 alike (a 2-bit times a 4-bit
    significand, |·| in [2^-10, 2688]); x̂ = that · `q.global_scale`. This is how the served NVFP4 matmul
    and the learner's NVFP4 QAT dot apply `dec`: once, after the K sum (`served_dot`).
  """
  if not isinstance(q, QArray):
    raise TypeError(f"dequantize expects a QArray, got {type(q).__name__}")
  if isinstance(q.spec, NVFP4):
    return _dequantize_nvfp4(q, global_scale).astype(dtype)
  return _DEQUANTIZE[type(q.spec)](q).astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _fake_quant(x, spec, axis):
  if isinstance(spec, (NVFP4, NVFP4WAG)):  # the same numbers without packing the codes (`nvfp4_operand`)
    w_b, dec = lax.optimization_barrier(nvfp4_operand(x, spec, axis=axis))
    return (w_b * _per_matrix(dec, x.ndim)).astype(x.dtype)
  if isinstance(spec, (FP8, MXFP8)):  # the codes' values left in float32 (`_fp8_codes`): no f8 convert, same numbers
    codes, sc, _ = _QUANTIZE[type(spec)](x.astype(jnp.float32), spec, axis, cast=False)
    q = lax.optimization_barrier(QArray(codes=codes, scale=sc, global_scale=None, spec=spec, axis=axis))
    return dequantize(q, x.dtype)
  q = quantize(x, spec, axis=axis)
  q = lax.optimization_barrier(q)  # keep XLA from fusing quantize/dequantize into something else
  return dequantize(q, x.dtype)


def _fake_quant_fwd(x, spec, axis):
  return _fake_quant(x, spec, axis), None


def _fake_quant_bwd(spec, axis, _, g):
  return (g,)  # straight-through estimator: d x̂ / d x := I


_fake_quant.defvjp(_fake_quant_fwd, _fake_quant_bwd)


def fake_quant(x: jax.Array, spec: Spec, *, axis: int = -1) -> jax.Array:
  """Forward: `dequantize(quantize(x, spec, axis=axis), x.dtype)`, bit for bit.
  Backward: straight-through (identity)."""
  x = jnp.asarray(x)
  return _fake_quant(x, spec, check_spec(spec, x.shape, x.dtype, axis))  # the axis counted from the end


# --------------------------------------------------------------------------- learned scales (LSQ / LSQ+)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _learned_fake_quant(w, s, z, spec, axis):
  q = quantize(w, spec, axis=axis, scale=s, zero_point=z)
  q = lax.optimization_barrier(q)
  return dequantize(q, w.dtype)


def _learned_fake_quant_fwd(w, s, z, spec, axis):
  return _learned_fake_quant(w, s, z, spec, axis), (w, s, z)


def _learned_fake_quant_bwd(spec, axis, res, g):
  w, s, z = res
  wg = _groups(w.astype(jnp.float32), axis, spec.group_size)
  gg = _groups(g.astype(jnp.float32), axis, spec.group_size)
  s_b, zf = _int4_qparams(wg, spec, axis, s, z)  # the scale and zero point the forward used
  s32 = s_b.astype(jnp.float32)
  r = jnp.round(_div(wg, s32))
  r_z = r if zf is None else r + zf
  inside = (r_z >= spec.qmin) & (r_z <= spec.qmax)
  q = jnp.clip(r_z, spec.qmin, spec.qmax)
  zz = 0.0 if zf is None else zf
  # LSQ (Esser et al. 2020): dŵ/ds = round(w/s) − w/s inside the range, (q − z) where clipped;
  # gradient scale 1/sqrt(G · Qp) with G the weights sharing the scale and Qp = 7.
  gscale = 1.0 / math.sqrt(spec.group_size * spec.qmax)
  dws = jnp.where(inside, r - _div(wg, s32), q - zz)
  grad_s = gscale * jnp.sum(gg * dws, axis=axis, keepdims=True)
  # The floor and the storage-dtype rounding are passed straight through; below the floor s is frozen.
  s_in = _scale_groups(jnp.asarray(s, jnp.float32), axis)
  grad_s = jnp.where(s_in > _INT4_SCALE_FLOOR, grad_s, 0.0)
  grad_s = _scale_shape(grad_s, axis).astype(jnp.asarray(s).dtype)
  # Weights: straight through inside the range, zero where the code is clipped.
  grad_w = _ungroup(jnp.where(inside, gg, 0.0), axis).astype(w.dtype)
  grad_z = None
  if z is not None:
    # LSQ+ (Bhalgat et al. 2020) with an integer zero point: ŵ = (clip(round(w/s) + z) − z)·s, so
    # dŵ/dz = 0 inside the range and −s where clipped; same gradient scale as s; round() passed through.
    grad_z = gscale * jnp.sum(gg * jnp.where(inside, 0.0, -s32), axis=axis, keepdims=True)
    grad_z = _scale_shape(grad_z, axis).astype(jnp.asarray(z).dtype)
  return grad_w, grad_s, grad_z


_learned_fake_quant.defvjp(_learned_fake_quant_fwd, _learned_fake_quant_bwd)


def learned_fake_quant(
  w: jax.Array, scale: jax.Array, zero_point: jax.Array | None, spec: Int4, *, axis: int = -2
) -> jax.Array:
  """Fake quant with trainable group scales (and zero points): the learned-scale INT4 forward.

  Forward: `dequantize(quantize(w, spec, axis=axis, scale=scale, zero_point=zero_point), w.dtype)`,
  bit for bit — what the sampler serves from the same s and z.
  Backward: w straight through inside the code range and 0 where clipped; s by LSQ
  (Esser et al. 2020), z by LSQ+ (Bhalgat et al. 2020), both scaled by 1/sqrt(G · 7).

  Args:
    w: weights [.., K, ..] (float).
    scale: float group scales, `w.shape` with `axis` divided by the group size.
    zero_point: float group zero points of that shape (signed convention; used rounded), or None
      (symmetric: z = 0).
    spec: `Int4`; normally scheme="learned" (learn_zero_point iff a zero point is given).
    axis: the group (contraction) axis.
  """
  w = jnp.asarray(w)
  if not isinstance(spec, Int4):
    raise ValueError(f"learned_fake_quant needs an Int4 spec; got {spec!r}")
  if zero_point is not None and not spec.asymmetric:
    raise ValueError(f"{spec}: a zero point was given but the spec has none (set learn_zero_point=True)")
  ax = check_spec(spec, w.shape, w.dtype, axis)
  _check_qparams(spec, w.shape, ax, scale, zero_point)
  return _learned_fake_quant(w, scale, zero_point, spec, ax)
