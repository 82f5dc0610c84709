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
from lrl_jax.quant.specs import FP4_MAX, FP8_MAX, FP8, INT4_MAX, Int4, MXFP8, NVFP4, Spec

__all__ = ["QArray", "quantize", "dequantize", "fake_quant", "check_spec"]

_F32_TINY = float(jnp.finfo(jnp.float32).tiny)  # smallest normal f32: CPUs flush denormals to zero
_F32_MAX = float(jnp.finfo(jnp.float32).max)
_INT4_SCALE_FLOOR = 1e-5  # slime / compressed-tensors floor on amax / 7


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["codes", "scale", "global_scale"],
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
    if self.global_scale is not None:
      n += self.global_scale.size * self.global_scale.dtype.itemsize
    return int(n)

  @property
  def bits_per_weight(self) -> float:
    """Storage bits per logical element, scales included."""
    return 8 * self.nbytes / math.prod(self.shape)


# --------------------------------------------------------------------------- checks


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
  if not isinstance(spec, (Int4, FP8, MXFP8, NVFP4)):
    raise TypeError(f"not a quantization spec: {spec!r}")
  shape = tuple(shape)
  if not jnp.issubdtype(dtype, jnp.floating) or jnp.dtype(dtype).itemsize < 2:
    raise ValueError(f"{spec}: expected a float32/bfloat16/float16 array, got dtype {jnp.dtype(dtype)} "
                     f"(shape {shape}, axis {axis})")
  ax = _normalize_axis(spec, shape, axis)
  if isinstance(spec, FP8) and spec.granularity == "block":
    if len(shape) < 2:
      raise ValueError(f"{spec}: 2-D blocks need rank >= 2, got shape {shape} (axis {axis})")
    for d in (-2, -1):
      if shape[d] % spec.block:
        raise ValueError(f"{spec}: dimension {len(shape) + d} of shape {shape} is not a multiple of "
                         f"block {spec.block} (axis {axis})")
  elif isinstance(spec, (Int4, MXFP8, NVFP4)):
    if shape[ax] % spec.block:
      raise ValueError(f"{spec}: group size {spec.block} does not divide axis {axis} of shape {shape}")
  if isinstance(spec, NVFP4) and len(shape) > 2 and ax < len(shape) - 2:
    raise ValueError(f"{spec}: the per-matrix scale covers the last two axes; the group axis must be one of "
                     f"them, got axis {axis} of shape {shape}")
  return ax - len(shape)


# --------------------------------------------------------------------------- helpers


def _exact_cast(x: jax.Array, dtype) -> jax.Array:
  # XLA may drop a narrowing convert that is immediately widened again
  # (allow_excess_precision); the barrier keeps the rounding, which is the point.
  return lax.optimization_barrier(x.astype(dtype))


def _div(x: jax.Array, d) -> jax.Array:
  """x / d, a true IEEE division.

  XLA rewrites `x / broadcast(d)` into `x * broadcast(1 / d)` (seen on CPU), which is
  off by an ulp often enough to move codes at rounding ties. slime and compressed-tensors
  divide; hiding the broadcast behind a barrier keeps the division.
  """
  return x / lax.optimization_barrier(jnp.broadcast_to(jnp.asarray(d, x.dtype), x.shape))


def _groups(x: jax.Array, axis: int, size: int) -> jax.Array:
  """[.., K, ..] -> [.., K/size, size, ..] in place (a free reshape, no transpose).

  `axis` is negative; in the grouped array the element axis keeps that same negative index.
  """
  ax = axis % x.ndim
  return x.reshape(x.shape[:ax] + (x.shape[ax] // size, size) + x.shape[ax + 1:])


def _ungroup(xg: jax.Array, axis: int) -> jax.Array:
  """Inverse of `_groups`."""
  e = axis % xg.ndim
  return xg.reshape(xg.shape[:e - 1] + (xg.shape[e - 1] * xg.shape[e],) + xg.shape[e + 1:])


def _scale_shape(scale_g: jax.Array, axis: int) -> jax.Array:
  """Group scales [.., K/size, 1, ..] -> the logical layout [.., K/size, ..]."""
  return jnp.squeeze(scale_g, axis)


def _scale_groups(scale: jax.Array, axis: int) -> jax.Array:
  """Inverse of `_scale_shape`: broadcastable against the grouped array."""
  return jnp.expand_dims(scale, axis)


def _absmax(xg: jax.Array, axes) -> jax.Array:
  """max |x| over `axes` (kept), NaN for a group holding a NaN or Inf.

  Marked explicitly: some XLA CPU reductions drop NaN from a max.
  """
  amax = jnp.max(jnp.abs(xg), axis=axes, keepdims=True)
  return jnp.where(jnp.all(jnp.isfinite(xg), axis=axes, keepdims=True), amax, jnp.nan)


def _poison(s: jax.Array, amax: jax.Array) -> jax.Array:
  """A group whose amax is NaN or Inf gets a NaN scale, so it dequantizes to NaN as a whole."""
  return jnp.where(jnp.isfinite(amax), s, jnp.nan)


def _safe_div(x: jax.Array, d: jax.Array) -> jax.Array:
  """x / d with d == 0 (an all-zero or underflowed group) giving 0, never NaN."""
  return jnp.where(d > 0, _div(x, jnp.where(d > 0, d, 1.0)), 0.0)


# --------------------------------------------------------------------------- formats


def _quantize_int4(x, spec: Int4, axis):
  xg = _groups(x, axis, spec.group_size)
  sdt = jnp.dtype(spec.scale_dtype)
  amax = _absmax(xg, axis)
  s = jnp.maximum(_div(amax, INT4_MAX), _INT4_SCALE_FLOOR)
  s = _poison(jnp.minimum(s, float(jnp.finfo(sdt).max)), amax)  # amax/7 can overflow fp16: saturate
  s = _exact_cast(s, sdt)  # scale is rounded to its storage dtype *before* use
  q = jnp.round(_div(xg, s.astype(jnp.float32)))  # jnp.round is round-half-to-even
  q = jnp.clip(jnp.where(jnp.isnan(q), 0.0, q), -INT4_MAX, INT4_MAX).astype(jnp.int8)
  codes = packing.pack_nibbles((_ungroup(q, axis) + 8).astype(jnp.uint8), axis)
  return codes, _scale_shape(s, axis), None


def _dequantize_int4(q: QArray):
  codes = packing.unpack_nibbles(q.codes, q.axis).astype(jnp.int32) - 8
  qg = _groups(codes.astype(jnp.float32), q.axis, q.spec.group_size)
  return _ungroup(qg * _scale_groups(q.scale, q.axis).astype(jnp.float32), q.axis)


def _fp8_codes(x, s):
  # A plain cast of |x| > 464 to float8_e4m3fn gives NaN: clip to ±448 first.
  return _exact_cast(jnp.clip(_div(x, s), -FP8_MAX, FP8_MAX), jnp.float8_e4m3fn)


def _fp8_scale(amax):
  # s = amax / 448, floored at the smallest normal f32 so that x / s never meets a
  # flushed-to-zero denominator (amax == 0 then yields zero codes).
  return _poison(jnp.maximum(_div(amax, FP8_MAX), _F32_TINY), amax)


def _quantize_fp8(x, spec: FP8, axis):
  if spec.granularity == "block":
    b = spec.block
    *lead, k, n = x.shape
    xb = x.reshape(*lead, k // b, b, n // b, b)
    s = _fp8_scale(_absmax(xb, (-3, -1)))
    codes = _fp8_codes(xb, s).reshape(x.shape)
    return codes, s[..., 0, :, 0], None
  s = _fp8_scale(_absmax(x, axis))
  return _fp8_codes(x, s), s, None


def _dequantize_fp8(q: QArray):
  c = q.codes.astype(jnp.float32)
  if q.spec.granularity == "block":
    b = q.spec.block
    *lead, k, n = c.shape
    cb = c.reshape(*lead, k // b, b, n // b, b)
    return (cb * q.scale[..., :, None, :, None]).reshape(q.shape)
  return c * q.scale


def _quantize_mxfp8(x, spec: MXFP8, axis):
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
  codes = _fp8_codes(xg, scale)
  return _ungroup(codes, axis), _scale_shape(scale.astype(jnp.float8_e8m0fnu), axis), None


def _dequantize_mxfp8(q: QArray):
  cg = _groups(q.codes.astype(jnp.float32), q.axis, q.spec.block_size)
  return _ungroup(cg * _scale_groups(q.scale, q.axis).astype(jnp.float32), q.axis)


def _nvfp4_global(x):
  # Per-matrix amax (last two axes; leading axes are a stack of matrices), over finite
  # elements only, so one NaN does not poison the whole matrix.
  amax = jnp.max(jnp.where(jnp.isfinite(x), jnp.abs(x), 0.0), axis=tuple(range(max(x.ndim - 2, 0), x.ndim)))
  enc = (FP8_MAX * FP4_MAX) / amax
  enc = jnp.where(amax > 0, jnp.minimum(enc, _F32_MAX), 1.0)  # 1 when amax is 0; no Inf for tiny amax
  return 1.0 / enc, enc


def _per_matrix(v: jax.Array, ndim: int) -> jax.Array:
  """A per-matrix value [lead...] broadcast against an array of rank `ndim` (grouped layout adds one)."""
  return v.reshape(v.shape + (1,) * (ndim - v.ndim))


def _quantize_nvfp4(x, spec: NVFP4, axis):
  dec, enc = _nvfp4_global(x)
  xg = _groups(x, axis, spec.block_size)
  dec_g, enc = _per_matrix(dec, xg.ndim), _per_matrix(enc, xg.ndim)
  amax = _absmax(xg, axis)
  sb = _exact_cast(_poison(jnp.minimum(_div(amax * enc, FP4_MAX), FP8_MAX), amax), jnp.float8_e4m3fn)
  denom = sb.astype(jnp.float32) * dec_g
  q = jnp.clip(_safe_div(xg, denom), -FP4_MAX, FP4_MAX)
  q = jnp.where(jnp.isnan(xg), 0.0, q)  # the NaN lives on in the block scale
  nib = lax.bitcast_convert_type(q.astype(jnp.float4_e2m1fn), jnp.uint4).astype(jnp.uint8)
  codes = packing.pack_nibbles(_ungroup(nib, axis), axis)
  return codes, _scale_shape(sb, axis), dec.astype(jnp.float32)


def _dequantize_nvfp4(q: QArray):
  nib = packing.unpack_nibbles(q.codes, q.axis).astype(jnp.uint4)
  vals = lax.bitcast_convert_type(nib, jnp.float4_e2m1fn).astype(jnp.float32)
  vg = _groups(vals, q.axis, q.spec.block_size)
  dec = _per_matrix(q.global_scale, vg.ndim)
  return _ungroup(vg * _scale_groups(q.scale, q.axis).astype(jnp.float32) * dec, q.axis)


_QUANTIZE = {Int4: _quantize_int4, FP8: _quantize_fp8, MXFP8: _quantize_mxfp8, NVFP4: _quantize_nvfp4}
_DEQUANTIZE = {Int4: _dequantize_int4, FP8: _dequantize_fp8, MXFP8: _dequantize_mxfp8, NVFP4: _dequantize_nvfp4}


# --------------------------------------------------------------------------- API


def quantize(x: jax.Array, spec: Spec, *, axis: int = -1) -> QArray:
  """Quantizes `x` to `spec`, groups/blocks running along `axis`.

  Args:
    x: float32 / bfloat16 / float16 array.
    spec: an `Int4`, `FP8`, `MXFP8` or `NVFP4` spec.
    axis: the axis groups run along: the contraction axis of the matmul the array
      feeds (0 or -2 for a weight [K, N] used as `x @ w`). Ignored by FP8 channel/token,
      which reduce over it, and FP8 block, which tiles the last two axes.

  Returns:
    A `QArray` with `dequantize(q) ≈ x`.

  Raises:
    ValueError (at trace time) if the group size does not divide the axis, the dtype
    is not floating point or the rank does not fit the format.
  """
  x = jnp.asarray(x)
  ax = check_spec(spec, x.shape, x.dtype, axis)
  codes, scale, global_scale = _QUANTIZE[type(spec)](x.astype(jnp.float32), spec, ax)
  return QArray(codes=codes, scale=scale, global_scale=global_scale, spec=spec, axis=ax)


def dequantize(q: QArray, dtype=jnp.float32) -> jax.Array:
  """x̂ of `q`, computed in float32 and rounded once to `dtype`."""
  if not isinstance(q, QArray):
    raise TypeError(f"dequantize expects a QArray, got {type(q).__name__}")
  return _DEQUANTIZE[type(q.spec)](q).astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _fake_quant(x, spec, axis):
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
  check_spec(spec, x.shape, x.dtype, axis)
  return _fake_quant(x, spec, axis)
