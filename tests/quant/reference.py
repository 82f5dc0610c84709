"""NumPy references of the formats, written from the formulas in DESIGN.md (not from lrl_jax code).

Arithmetic is float32 (IEEE, correctly rounded, as XLA's) so that codes can be compared
bit for bit; casts to bf16 / e4m3 / e2m1 go through ml_dtypes (round to nearest even).
Each function returns (codes, scales[, global]) in the logical layout and x̂.
"""

import ml_dtypes
import numpy as np

F32 = np.float32
E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=F32)


def _groups(x, axis, g):
  x = np.moveaxis(x, axis, -1)
  return x.reshape(*x.shape[:-1], x.shape[-1] // g, g)


def _ungroup(x, axis):
  return np.moveaxis(x.reshape(*x.shape[:-2], -1), -1, axis)


def int4(x, group_size, axis=-1):
  """s = max(amax/7, 1e-5) -> bf16; q = clip(rne(x/s), -7, 7); x̂ = q·s."""
  xg = _groups(np.asarray(x, F32), axis, group_size)
  amax = np.abs(xg).max(-1, keepdims=True)
  s = np.maximum(amax / F32(7), F32(1e-5)).astype(ml_dtypes.bfloat16).astype(F32)
  q = np.clip(np.round(xg / s), -7, 7)  # np.round: half to even
  return _ungroup(q, axis).astype(np.int8), np.moveaxis(s[..., 0], -1, axis), _ungroup(q * s, axis)


def fp8_channel(x, axis=-1):
  x = np.asarray(x, F32)
  amax = np.abs(x).max(axis, keepdims=True)
  s = np.maximum(amax / F32(448), np.finfo(F32).tiny)
  q = np.clip(x / s, -448, 448).astype(ml_dtypes.float8_e4m3fn)
  return q, s, q.astype(F32) * s


def fp8_block(x, b):
  x = np.asarray(x, F32)
  k, n = x.shape
  xb = x.reshape(k // b, b, n // b, b)
  amax = np.abs(xb).max((1, 3), keepdims=True)
  s = np.maximum(amax / F32(448), np.finfo(F32).tiny)
  q = np.clip(xb / s, -448, 448).astype(ml_dtypes.float8_e4m3fn)
  return q.reshape(k, n), s[:, 0, :, 0], (q.astype(F32) * s).reshape(k, n)


def mxfp8(x, axis=-1):
  """scale = 2^ceil(log2(amax/448)) (exponent clamped to [-126, 127]); q = e4m3(x/scale)."""
  xg = _groups(np.asarray(x, F32), axis, 32)
  v = np.abs(xg).max(-1, keepdims=True) / F32(448)
  e = np.zeros(v.shape, np.int64)
  nz = v > 0
  e[nz] = np.ceil(np.log2(v[nz].astype(np.float64))).astype(np.int64)  # exact for these magnitudes in f64
  e[~nz] = -126
  e = np.clip(e, -126, 127)
  scale = np.ldexp(F32(1), e).astype(F32)
  q = np.clip(xg / scale, -448, 448).astype(ml_dtypes.float8_e4m3fn)
  return _ungroup(q, axis), np.moveaxis(scale[..., 0], -1, axis), _ungroup(q.astype(F32) * scale, axis)


def nvfp4(x, axis=-1):
  """TransformerEngine reference: enc = 2688/amax; s_b = e4m3(min(amax_b·enc/6, 448)); q = e2m1(x/(s_b·dec))."""
  x = np.asarray(x, F32)
  amax = np.abs(x).max()
  enc = F32(448 * 6) / amax if amax > 0 else F32(1)
  dec = F32(1) / enc
  xg = _groups(x, axis, 16)
  bamax = np.abs(xg).max(-1, keepdims=True)
  sb = np.minimum(bamax * enc / F32(6), F32(448)).astype(ml_dtypes.float8_e4m3fn)
  denom = sb.astype(F32) * dec
  with np.errstate(invalid="ignore", divide="ignore"):
    q = np.where(denom > 0, np.clip(xg / np.where(denom > 0, denom, 1), -6, 6), 0).astype(F32)
  q = q.astype(ml_dtypes.float4_e2m1fn)
  xhat = q.astype(F32) * sb.astype(F32) * dec
  return _ungroup(q, axis), np.moveaxis(sb[..., 0], -1, axis), dec, _ungroup(xhat, axis)


def e2m1_nibble(v):
  """The 4-bit E2M1 pattern of a representable value: sign bit 3, then the index in E2M1_VALUES."""
  v = np.asarray(v, F32)
  idx = np.argmin(np.abs(np.abs(v)[..., None] - E2M1_VALUES), axis=-1)
  return (idx | (np.signbit(v).astype(np.int64) << 3)).astype(np.uint8)
