"""Error bounds per format on N(0,1) data: elementwise bounds from each format's grid, and the
relative Frobenius error (measured values 2026-11-29 in comments; bounds leave ~5% headroom)."""

import jax
import numpy as np
import pytest

from lrl_jax import quant
from lrl_jax.quant import packing

X = np.random.default_rng(0).standard_normal((1024, 512)).astype(np.float32)
# relative Frobenius error ||x - x̂|| / ||x|| on N(0, 1), measured: 0.097 0.108 0.117 0.0264 0.0264 0.0265 0.095
REL_BOUND = {
  "int4_g32": 0.102,
  "int4_g64": 0.113,
  "int4_g128": 0.123,
  "fp8_channel": 0.028,
  "fp8_block128": 0.028,
  "mxfp8": 0.028,
  "nvfp4": 0.10,
}
SPECS = [
  quant.Int4(group_size=32),
  quant.Int4(group_size=64),
  quant.Int4(group_size=128),
  quant.FP8(),
  quant.FP8(granularity="block"),
  quant.MXFP8(),
  quant.NVFP4(),
]


def _groups(a, g):  # [K, N] -> [K/g, g, N]
  return a.reshape(a.shape[0] // g, g, a.shape[1])


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_relative_error(spec):
  xhat = np.asarray(jax.jit(lambda x: quant.fake_quant(x, spec, axis=0))(X), np.float64)
  rel = np.linalg.norm(xhat - X) / np.linalg.norm(X)
  assert rel < REL_BOUND[spec.name], rel


def test_int4_elementwise_half_step():
  spec = quant.Int4(group_size=64)
  q = quant.quantize(X, spec, axis=0)
  s = np.asarray(q.scale, np.float64)[:, None, :]  # [K/g, 1, N]
  xg = _groups(X.astype(np.float64), 64)
  err = np.abs(xg - _groups(np.asarray(quant.dequantize(q), np.float64), 64))
  amax = np.abs(xg).max(1, keepdims=True)
  # Rounding error s/2, plus the saturation a bf16 scale rounded below amax/7 can cause.
  assert np.all(err <= s / 2 + np.maximum(0, amax - 7 * s) + 1e-12)
  codes = np.asarray(packing.unpack_nibbles(q.codes, axis=0)).astype(int) - 8
  assert codes.min() >= -7 and codes.max() <= 7


@pytest.mark.parametrize("spec", [quant.FP8(), quant.MXFP8()], ids=lambda s: s.name)
def test_e4m3_elementwise(spec):
  q = quant.quantize(X, spec, axis=0)
  xhat = np.asarray(quant.dequantize(q), np.float64)
  s = np.asarray(q.scale, np.float64)
  s = np.repeat(s, X.shape[0] // s.shape[0], axis=0)  # per element
  v = np.abs(X) / s
  err = np.abs(X - xhat)
  normal = v >= 2.0**-6  # E4M3 normals: 3 mantissa bits -> relative error <= 2^-4
  assert np.all(err[normal] <= 2.0**-4 * np.abs(X[normal]) * (1 + 1e-6))
  assert np.all(err[~normal] <= 2.0**-10 * s[~normal] * (1 + 1e-6))  # subnormal spacing 2^-9
  assert np.all(v <= 448 * (1 + 1e-6))


def test_nvfp4_elementwise():
  q = quant.quantize(X, quant.NVFP4(), axis=0)
  xhat = np.asarray(quant.dequantize(q), np.float64)
  denom = np.asarray(q.scale, np.float64) * float(q.global_scale)
  denom = np.repeat(denom, 16, axis=0)
  v = np.abs(X) / denom
  half_step = np.where(v <= 2, 0.25, np.where(v <= 4, 0.5, 1.0))  # E2M1 grid 0, .5, 1, 1.5, 2, 3, 4, 6
  bound = denom * (half_step + np.maximum(0, v - 6))  # the e4m3-rounded block scale can clip a little
  assert np.all(np.abs(X - xhat) <= bound * (1 + 1e-6))
