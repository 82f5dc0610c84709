"""The GPU decode forms are exact: the same values as `quant.dequantize`'s f32 operations, for every code.

`_int4_bf16` / `_e2m1_bf16` build bf16 values from bits, and the Triton kernels multiply in bf16 where the f32
form multiplies in f32 and rounds to bf16. Those agree when the product is exact before its one rounding; here
that is checked in float64 for every nibble and every finite scale of the format.
"""

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from lrl_jax.kernels import matmul
from lrl_jax.kernels._decode import _e2m1

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
NIBS = jnp.arange(16, dtype=jnp.int32)


def _f64(a):
  return np.asarray(jnp.asarray(a).astype(jnp.float32), np.float64)


def test_nibble_decodes_are_exact_for_every_code():
  np.testing.assert_array_equal(_f64(matmul._int4_bf16(NIBS)), np.arange(16) - 8.0)
  e = _f64(matmul._e2m1_bf16(NIBS))
  np.testing.assert_array_equal(e, E2M1)
  np.testing.assert_array_equal(np.signbit(e), np.arange(16) >= 8)  # -0 keeps its sign
  e32 = _f64(_e2m1(NIBS))  # the f32-bits form (TPU, Mosaic GPU)
  np.testing.assert_array_equal(e32, E2M1)
  np.testing.assert_array_equal(np.signbit(e32), np.arange(16) >= 8)


def test_bf16_products_are_exact_where_the_kernels_use_them():
  # W4A16: (q − z) · s with q, z in [-8, 7] and s any finite bf16 (a dense sample of all 65 536 patterns).
  bits = np.arange(0, 1 << 16, 7, dtype=np.uint16)
  bits = bits[(bits & 0x7F80) != 0x7F80]  # finite patterns only
  s = bits.view(ml_dtypes.bfloat16).astype(np.float64)
  qz = np.arange(-15, 16, dtype=np.float64)
  prod = (qz[:, None] * s[None, :]).ravel()
  prod = prod[np.abs(prod) < np.finfo(np.float32).max]
  # exact in f32 (a 4-bit times an 8-bit significand), so one bf16 rounding of either gives the same value
  np.testing.assert_array_equal(prod.astype(np.float32).astype(np.float64), prod)
  # NVFP4: e2m1 · s_b for every E2M1 value and every finite e4m3 block scale is exact in bf16 itself.
  e4m3 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
  e4m3 = e4m3[np.isfinite(e4m3)]
  p = E2M1[:, None] * e4m3[None, :]
  np.testing.assert_array_equal(p.astype(ml_dtypes.bfloat16).astype(np.float64), p)
