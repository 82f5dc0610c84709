"""The quantizers' group amax (`qarray._absmax`) and NVFP4's per-matrix amax (`qarray._nvfp4_global`), taken as
integer maxima over |x|'s bits, against NumPy: max |x| over each group, NaN where the group holds a NaN or an Inf;
the per-matrix one over the finite elements only. Exact (a max rounds nothing), in f32 and bf16, with signed zeros,
subnormals, ±Inf and NaNs of both signs placed in some groups."""

import importlib

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

qa = importlib.import_module("lrl_jax.quant.qarray")


def _specials(dtype, shape=(3, 8, 16)):
  rng = np.random.default_rng(7)
  x = (rng.normal(size=shape) * np.exp(rng.uniform(-30, 10, size=shape))).astype(np.float32)
  x[0, 0, :4] = [-0.0, 0.0, 1e-40, -1e-42]  # signed zeros and f32 subnormals (bf16: its own, or flushed by the cast)
  x[0, 1, 3] = np.inf
  x[1, 2, 5] = -np.inf
  x[1, 3, 0] = np.nan
  x[2, 4, 9] = -np.nan
  x[2, 5, :] = 0.0  # an all-zero row
  return x.astype(dtype)


def _float64_absmax(x, axis):
  a = np.abs(x.astype(np.float64))
  m = a.max(axis=axis, keepdims=True)
  bad = (~np.isfinite(x.astype(np.float64))).any(axis=axis, keepdims=True)
  return np.where(bad, np.nan, m)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("axis", [-1, -2, (-3, -1)])
def test_absmax_is_the_max_magnitude_with_nonfinite_groups_nan(dtype, axis):
  x = _specials(dtype)
  got = np.asarray(qa._absmax(jnp.asarray(x), axis))
  assert got.dtype == np.dtype(dtype)
  want = _float64_absmax(x, axis)
  np.testing.assert_array_equal(np.isnan(got.astype(np.float64)), np.isnan(want))
  np.testing.assert_array_equal(got.astype(np.float64)[~np.isnan(want)], want[~np.isnan(want)])
  zero = np.asarray(qa._absmax(jnp.asarray(np.array([[-0.0, -0.0]], dtype)), -1))
  assert zero.astype(np.float64)[0, 0] == 0 and not np.signbit(zero[0, 0])  # +0, as max(|x|) gives


def test_nvfp4_global_amax_is_over_the_finite_elements():
  x = _specials(np.float32)
  dec, enc = qa._nvfp4_global(qa._block_amaxes(qa._groups(jnp.asarray(x), -1, 16), -1)[1])
  x64 = x.astype(np.float64)
  amax = np.where(np.isfinite(x64), np.abs(x64), 0.0).max(axis=(1, 2))
  # the amax is what is under test: its encode / decode scales through the same f32 divisions as the code's
  want_enc = (qa.FP8_MAX * qa.FP4_MAX) / jnp.asarray(amax, jnp.float32)
  np.testing.assert_array_equal(np.asarray(enc), np.asarray(want_enc))
  np.testing.assert_array_equal(np.asarray(dec), np.asarray(1.0 / want_enc))


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("axis", [-1, -2])
def test_block_amaxes_both_maxima_in_one_reduction(dtype, axis):
  """`_block_amaxes`: `_absmax` of each group and the max |x| over its finite elements (0 if none), both against
  NumPy."""
  x = _specials(np.float32)
  x[2, :, :4] = np.nan  # groups (along either axis) with no finite element
  x = x.astype(dtype)
  amax, finite = (np.asarray(a) for a in qa._block_amaxes(jnp.asarray(x), axis))
  want = _float64_absmax(x, axis)
  np.testing.assert_array_equal(np.isnan(amax.astype(np.float64)), np.isnan(want))
  np.testing.assert_array_equal(amax.astype(np.float64)[~np.isnan(want)], want[~np.isnan(want)])
  x64 = x.astype(np.float64)
  np.testing.assert_array_equal(
    finite.astype(np.float64), np.where(np.isfinite(x64), np.abs(x64), 0.0).max(axis=axis, keepdims=True)
  )


@pytest.mark.parametrize("axis", [-1, -2])
def test_nvfp4_global_amax_from_the_blocks(axis):
  """`_nvfp4_prepare` takes each matrix's amax as the max over its blocks' finite amaxes: the same as over the whole
  matrix's finite elements, on a stack with non-finite values, a matrix whose every value is non-finite but one
  block, and an all-zero matrix (amax 0: enc 1)."""
  x = np.concatenate([_specials(np.float32, (3, 32, 48)), np.zeros((1, 32, 48), np.float32)])
  x[1, :, :] = np.inf
  x[1, 0, :16] = np.linspace(-3.0, 2.0, 16)  # one finite block (along either axis) in an Inf matrix
  x[1, :16, 0] = np.linspace(-3.0, 2.0, 16)
  dec = np.asarray(qa._nvfp4_prepare(jnp.asarray(x), axis)[2])
  x64 = x.astype(np.float64)
  amax = np.where(np.isfinite(x64), np.abs(x64), 0.0).max(axis=(1, 2))
  assert amax[1] == 3.0 and amax[3] == 0.0
  want_enc = jnp.where(amax > 0, (qa.FP8_MAX * qa.FP4_MAX) / jnp.asarray(amax, jnp.float32), 1.0)
  np.testing.assert_array_equal(dec, np.asarray(1.0 / want_enc))


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize(
  "shape, axis", [((3, 64, 48), -2), ((128, 40), 0), ((3, 2, 96, 16), -2), ((3, 8, 64), -1), ((3, 72, 16), -2)]
)
def test_absmax_of_a_long_axis_in_two_stages(shape, axis, dtype):
  """`_absmax` over one long non-minor axis (on a CPU: groups of 16 first, then over those; the minor axis and a
  length not a multiple of 16 in one go) against NumPy: the max magnitude, NaN for a channel holding a NaN or an
  Inf."""
  x = _specials(np.float32, (3, *shape[-2:]))
  x = x[1].copy() if len(shape) == 2 else np.stack([x, -x], axis=1) if len(shape) == 4 else x
  assert x.shape == shape
  x.reshape(-1)[:: max(x.size // 5, 1)] = np.nan  # a few more non-finite channels
  x = x.astype(dtype)
  got = np.asarray(qa._absmax(jnp.asarray(x), axis))
  assert got.dtype == np.dtype(dtype)
  want = _float64_absmax(x, axis)
  np.testing.assert_array_equal(np.isnan(got.astype(np.float64)), np.isnan(want))
  np.testing.assert_array_equal(got.astype(np.float64)[~np.isnan(want)], want[~np.isnan(want)])
