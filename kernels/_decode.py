"""What the [K, N] kernels share: the in-kernel decode of QArray codes and scales, and their operands.

Both `matmul.py` (Pallas Triton / Mosaic TPU) and `mosaic_gpu.py` (Hopper `wgmma`) decode a tile as
`dequant_plane` does, the same f32 operations in the same order as `quant.dequantize`; they take their
inputs from `kernel_operands` and apply NVFP4's per-matrix decode scale with `_apply_dec`. Plain `jnp` /
`lax` code that traces inside either kernel body; the GPU-only bf16 decode forms stay in `matmul.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from lrl_jax import quant
from lrl_jax.kernels.blocks import Plan


def _e2m1(nib: jax.Array) -> jax.Array:
  """4-bit E2M1 pattern (sign, 2 exponent bits e, 1 mantissa bit m; OCP MX spec) -> f32, exactly.

  |v| = m/2 when e = 0 (subnormal), (1 + m/2)·2^(e−1) otherwise -> {0, .5, 1, 1.5, 2, 3, 4, 6}. Built as
  f32 bits with integer ops (neither Triton nor Mosaic lowers a float4 bitcast): for e > 0 the f32
  exponent is e + 126 and m the top mantissa bit, i.e. ((nib & 7) << 22) + (126 << 23); e = 0 gives
  0 or 0.5 (126 << 23); the sign is bit 3 moved to bit 31. No int -> float convert: on sm_90 those run
  at 16 per clock per SM, a quarter of the integer ops, and one per element capped the kernels
  (kernels/README.md, "Instruction mix").
  """
  mag = jnp.where((nib & 6) == 0, (nib & 1) * (126 << 23), ((nib & 7) << 22) + (126 << 23))
  return lax.bitcast_convert_type(mag | ((nib & 8) << 28), jnp.float32)


def _e8m0(u: jax.Array) -> jax.Array:
  """uint8 view of float8_e8m0fnu -> f32: 2^(u − 127); 255 is NaN (OCP MX spec)."""
  u = u.astype(jnp.int32)
  bits = jnp.where(u == 0, 0x00400000, u << 23)  # 2^-127 is an f32 subnormal: mantissa bit 22
  v = lax.bitcast_convert_type(bits, jnp.float32)
  return jnp.where(u == 255, jnp.nan, v)


def _decode_codes(c: jax.Array, spec: quant.Spec, plane: int) -> jax.Array:
  """A tile of stored codes -> f32 values (plane 0: low nibble, 1: high nibble)."""
  if isinstance(spec, (quant.Int4, quant.NVFP4)):
    ci = c.astype(jnp.int32)  # widen first: 8-bit vector shifts are not on every TPU generation
    nib = (ci & 0xF) if plane == 0 else ((ci >> 4) & 0xF)
    if isinstance(spec, quant.Int4):
      return (nib - 8).astype(jnp.float32)  # stored as q + 8
    return _e2m1(nib)
  return c.astype(jnp.float32)  # float8_e4m3fn -> f32 is exact


def _decode_scale(s: jax.Array, spec: quant.Spec) -> jax.Array:
  if isinstance(spec, quant.MXFP8):
    return _e8m0(s)
  return s.astype(jnp.float32)


def dequant_plane(c, plane: int, sf, zf, *, spec) -> jax.Array:
  """ŵ of one nibble plane (or of an 8-bit tile) in f32, in `quant.dequantize`'s order: (q − z) · s.

  c: the code tile; sf / zf: the scales / zero points expanded to it, f32 (zf None without zero points).
  NVFP4: e2m1 · s_b, exact; its per-matrix dec multiplies the summed product outside the kernel (`_apply_dec`).
  """
  q = _decode_codes(c, spec, plane)
  if zf is not None:
    q = q - zf  # small integers: exact in f32, as dequantize's integer q − z
  return q * sf


def kernel_operands(xp: jax.Array, q: quant.QArray, p: Plan, *, zp_dtype=None):
  """The kernels' inputs: (x planes, [*planes, codes, scales, (zero points)], has_zp).

  Packed formats split x into its even / odd K columns (one plane per nibble); MXFP8's e8m0 scales travel
  as their uint8 view (decoded in-kernel); INT4 zero points are cast to zp_dtype when given. NVFP4's
  per-matrix decode scale stays outside: `_apply_dec` multiplies the kernel's f32 output by it.
  """
  xs = [xp[:, 0::2], xp[:, 1::2]] if p.packed else [xp]
  scale = q.scale
  if isinstance(q.spec, quant.MXFP8):
    scale = lax.bitcast_convert_type(scale, jnp.uint8)  # a view: e8m0 is decoded in-kernel
  operands = [*xs, q.codes, scale]
  has_zp = q.zero_point is not None
  if has_zp:
    operands.append(q.zero_point if zp_dtype is None else q.zero_point.astype(zp_dtype))
  return xs, operands, has_zp


def _apply_dec(y: jax.Array, q: quant.QArray) -> jax.Array:
  """The kernel's f32 product times NVFP4's per-matrix decode scale (once, after the K sum: `quant.qdot`)."""
  return y if q.global_scale is None else y * q.global_scale.astype(jnp.float32)
