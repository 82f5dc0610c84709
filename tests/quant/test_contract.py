"""The contract: quantize matches a NumPy reference bit for bit, fake_quant == dequantize(quantize)."""

import functools

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lrl_jax import quant
from lrl_jax.quant import packing
from tests.quant import reference as ref

SPECS = [
  quant.Int4(group_size=32),
  quant.Int4(group_size=64),
  quant.Int4(group_size=128),
  quant.FP8(),
  quant.FP8(granularity="token"),
  quant.FP8(granularity="block", block=32),
  quant.MXFP8(),
  quant.NVFP4(),
]
IDS = [s.name if not isinstance(s, quant.FP8) or s.granularity != "token" else "fp8_token" for s in SPECS]


def _same(a, b):
  a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
  assert a.shape == b.shape
  np.testing.assert_array_equal(a, b)  # NaN == NaN here; -0 == +0


# quantize and dequantize as two separate compiled programs (op-by-op dispatch is slow on CPU);
# fake_quant is a third, fused one: the contract says all of them agree bit for bit.
_quantize = jax.jit(quant.quantize, static_argnames=("spec", "axis"))
_dequantize = jax.jit(quant.dequantize, static_argnames=("dtype",))


@functools.lru_cache(maxsize=None)
def _fq_jit(spec, axis):  # one jit per (spec, axis): a fresh lambda per call would recompile every time
  return jax.jit(lambda x: quant.fake_quant(x, spec, axis=axis))


def _inputs(rng, shape):
  """Named inputs covering the cases the contract must hold on."""
  g = rng.standard_normal(shape).astype(np.float32)
  out = {
    "gaussian": g,
    "heavy_tailed": rng.standard_t(1.5, shape).astype(np.float32),
    "all_zero": np.zeros(shape, np.float32),
    "denormal": (g * 1e-39).astype(np.float32),
    "tiny_1e-30": (g * 1e-30).astype(np.float32),
    "huge_1e30": (g * 1e30).astype(np.float32),
    "near_f32_max": (np.clip(g, -1, 1) * 3e38).astype(np.float32),
  }
  mixed = g.copy()
  mixed[: shape[0] // 2] = 0.0  # zero groups next to non-zero ones
  out["half_zero"] = mixed
  return out


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_fake_quant_equals_dequantize_quantize(spec, axis=0):  # axis 1: the hypothesis test
  rng = np.random.default_rng(0)
  for name, x in _inputs(rng, (128, 128)).items():
    for dtype in (jnp.float32, jnp.bfloat16):
      xj = jnp.asarray(x, dtype)
      d = _dequantize(_quantize(xj, spec, axis=axis), dtype)
      f = _fq_jit(spec, axis)(xj)
      assert f.dtype == dtype
      _same(f, d)
      assert np.isfinite(np.asarray(d, np.float32)).all(), f"{spec.name} {name} {dtype}: finite input gave non-finite"


HYPOTHESIS_SPECS = [
  quant.Int4(group_size=32),
  quant.Int4(group_size=128),
  quant.FP8(),
  quant.FP8(granularity="block", block=4),
  quant.MXFP8(),
  quant.NVFP4(),
]


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_fake_quant_equals_dequantize_quantize_hypothesis(data):
  spec = data.draw(st.sampled_from(HYPOTHESIS_SPECS))
  axis = data.draw(st.sampled_from([0, 1]))
  elems = st.floats(-1e6, 1e6, width=32, allow_nan=False, allow_infinity=False, allow_subnormal=True)
  x = data.draw(hnp.arrays(np.float32, (128, 4) if axis == 0 else (4, 128), elements=elems))
  scale = data.draw(st.sampled_from([1.0, 1e-30, 1e30, 1e-38]))
  x = (x * np.float32(scale)).astype(np.float32)
  xj = jnp.asarray(x)
  _same(_fq_jit(spec, axis)(xj), _dequantize(_quantize(xj, spec, axis=axis)))


@pytest.mark.parametrize(
  "spec", [quant.FP8(), quant.FP8(granularity="block", block=32), quant.MXFP8()], ids=lambda s: s.name
)
def test_fp8_fake_quant_without_the_cast_equals_the_codes(spec):
  """FP8 / MXFP8 `fake_quant` rounds the codes' values by arithmetic (`qarray._fp8_codes(cast=False)`), `quantize`
  casts them to float8_e4m3fn: the same numbers bit for bit (signs of zero included) on a stack of matrices with
  NaN and ±Inf in some groups, and the signs of zero of a group of tiny values."""
  rng = np.random.default_rng(2)
  x = rng.standard_t(3, (2, 64, 128)).astype(np.float32)
  x[0, 3, 5], x[1, 40, 17], x[1, 0, 100] = np.nan, np.inf, -np.inf
  x[0, :, 64:96] *= np.float32(1e-4)  # a block whose small values round to ±0
  for dtype in (jnp.float32, jnp.bfloat16):
    xj = jnp.asarray(x, dtype)
    want = np.asarray(_dequantize(_quantize(xj, spec, axis=-2), dtype), np.float32)
    got = np.asarray(_fq_jit(spec, -2)(xj), np.float32)
    assert np.isnan(got).sum() > 0
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(got[ok].view(np.uint32), want[ok].view(np.uint32))


@pytest.mark.parametrize("spec", [quant.NVFP4(), quant.NVFP4WAG()], ids=["nvfp4", "nvfp4_wag"])
def test_nvfp4_operand_equals_the_served_form(spec):
  """`nvfp4_operand` (no codes packed) = dequantize(quantize(x), global_scale=False) and its global scale, bit for
  bit: a stack of matrices, both group axes, every named input and a NaN / ±Inf in some blocks."""
  rng = np.random.default_rng(1)
  cases = {k: v.reshape(2, 64, 128) for k, v in _inputs(rng, (128, 128)).items()}
  bad = rng.standard_normal((2, 64, 128)).astype(np.float32)
  bad[0, 3, 5], bad[1, 40, 17], bad[1, 0, 100] = np.nan, np.inf, -np.inf
  cases["nan_inf"] = bad
  fn = jax.jit(quant.nvfp4_operand, static_argnames=("spec", "axis"))
  for name, x in cases.items():
    for dtype in (jnp.float32, jnp.bfloat16):
      for axis in (-2, -1):
        xj = jnp.asarray(x, dtype)
        q = _quantize(xj, spec, axis=axis)
        w_b, dec = fn(xj, spec=spec, axis=axis)
        assert w_b.dtype == jnp.float32 and dec.shape == (2,), (name, w_b.dtype, dec.shape)
        _same(w_b, quant.dequantize(q, jnp.float32, global_scale=False))
        _same(dec, q.global_scale)


def test_div_is_a_true_division_under_jit():
  """`qarray._div(x, d)` with d broadcast per group is x / d correctly rounded (NumPy's float32 division), where
  x · (1/d), what XLA rewrites a division by a broadcast into, is off by an ulp: the quotients that move codes at
  rounding ties. NaN in x stays NaN; d = 0 gives ±Inf as IEEE says."""
  rng = np.random.default_rng(3)
  x = rng.standard_normal((64, 16, 128)).astype(np.float32)
  d = (np.abs(rng.standard_normal((64, 1, 128))) + 0.1).astype(np.float32)
  recip = x * (np.float32(1) / d)
  want = x / d
  assert (recip != want).sum() > 100  # the inputs do tell the two apart
  x[0, 0, 0], d[1, 0, 1] = np.nan, 0.0
  with np.errstate(divide="ignore"):
    want = x / d
  got = np.asarray(jax.jit(quant.qarray._div)(jnp.asarray(x), jnp.asarray(d)))
  np.testing.assert_array_equal(got, want)


def _rounding_points(grid: np.ndarray, rng) -> np.ndarray:
  """Every value of a format's grid (non-negative part), every midpoint between neighbours (the ties), each of them
  one float32 ulp either side, both signs, f32 subnormals, and a log-uniform sample in between: where a rounding
  could go wrong, it goes wrong at a grid value or a tie."""
  g = np.asarray(grid, np.float32)
  mids = ((g[1:].astype(np.float64) + g[:-1]) / 2).astype(np.float32)  # exact: neighbours differ by <= 1 binade
  pts = np.concatenate([g, mids])
  pts = np.concatenate([pts, np.nextafter(pts, np.float32(np.inf)), np.nextafter(pts, np.float32(0))])
  top = float(g.max())
  sample = np.exp(rng.uniform(np.log(1e-12), np.log(top), 20000)).astype(np.float32)
  tiny = np.array([np.finfo(np.float32).smallest_subnormal, 1e-40, np.finfo(np.float32).tiny], np.float32)
  pts = np.concatenate([pts, sample, tiny])
  pts = pts[np.abs(pts) <= top]
  return np.concatenate([pts, -pts])


@pytest.mark.parametrize(
  "fmt, rounder", [("float8_e4m3fn", "_round_e4m3"), ("float4_e2m1fn", "_round_e2m1")], ids=["e4m3", "e2m1"]
)
def test_arithmetic_rounding_equals_the_cast(fmt, rounder):
  """The NVFP4 path's arithmetic roundings = ml_dtypes' cast (round to nearest, ties to even) and back, bit for bit
  (sign of zero included), at every grid value and tie ± 1 ulp of the format's range, and NaN stays NaN."""
  dt = getattr(ml_dtypes, fmt)
  grid = np.unique(
    np.abs(np.arange(256 if fmt.startswith("float8") else 16, dtype=np.uint8).view(dt)).astype(np.float32)
  )
  grid = grid[np.isfinite(grid)]
  x = _rounding_points(grid, np.random.default_rng(7))
  got = np.asarray(jax.jit(getattr(quant.qarray, rounder))(jnp.asarray(x)))
  want = x.astype(dt).astype(np.float32)
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
  if fmt.startswith("float8"):
    assert np.isnan(np.asarray(quant.qarray._round_e4m3(jnp.array([np.nan], jnp.float32)))).all()


def _int4_ties(rng, shape):
  """Weights whose quotient w/s is an exact .5 tie for the bf16 scale their group gets."""
  s = np.float32(ml_dtypes.bfloat16(0.0371))
  q = rng.integers(-7, 7, size=shape).astype(np.float32) + 0.5
  q[::32] = 7.0  # every group's amax is 7 s exactly, so s = amax / 7 is the bf16 value itself
  w = (q * s).astype(np.float32)
  np.testing.assert_array_equal(w / s, q)  # the ties are exact in f32
  return w


def test_int4_matches_reference_bitwise():
  rng = np.random.default_rng(1)
  cases = dict(_inputs(rng, (128, 48)))
  cases["ties"] = _int4_ties(rng, (128, 48))
  for name, x in cases.items():
    if name == "near_f32_max":
      continue  # reference's f32 amax/7 is fine, but bf16 has the range; covered by the finite test
    for g in (32,) if name == "ties" else (32, 128):
      q = _quantize(jnp.asarray(x), quant.Int4(group_size=g), axis=0)
      codes_ref, s_ref, xhat_ref = ref.int4(x, g, axis=0)
      codes = np.asarray(packing.unpack_nibbles(q.codes, axis=0)).astype(np.int16) - 8
      np.testing.assert_array_equal(codes, codes_ref, err_msg=f"{name} g{g}")
      np.testing.assert_array_equal(np.asarray(q.scale, np.float32), s_ref, err_msg=name)
      _same(_dequantize(q), xhat_ref)


def test_int4_ties_round_half_to_even():
  s = np.float32(ml_dtypes.bfloat16(0.0371))
  # quotients: amax 7, then ties 2.5 -> 2, 3.5 -> 4, -0.5 -> -0, 6.5 -> 6, -6.5 -> -6
  w = np.array([7, 2.5, 3.5, -0.5, 6.5, -6.5, 1.5, 0.5] * 4, np.float32) * s
  q = _quantize(jnp.asarray(w), quant.Int4(group_size=32))
  codes = np.asarray(packing.unpack_nibbles(q.codes)).astype(np.int16) - 8
  np.testing.assert_array_equal(codes[:8], [7, 2, 4, 0, 6, -6, 2, 0])


def test_fp8_matches_reference_bitwise():
  rng = np.random.default_rng(2)
  for name, x in _inputs(rng, (64, 96)).items():
    if name == "denormal":
      continue  # f32 denormals are flushed to zero on CPU (XLA) but not in NumPy
    q = _quantize(jnp.asarray(x), quant.FP8(), axis=0)
    c_ref, s_ref, xhat_ref = ref.fp8_channel(x, axis=0)
    np.testing.assert_array_equal(np.asarray(q.codes).view(np.uint8), c_ref.view(np.uint8), err_msg=name)
    np.testing.assert_array_equal(np.asarray(q.scale), s_ref, err_msg=name)
    _same(_dequantize(q), xhat_ref)
    qb = _quantize(jnp.asarray(x), quant.FP8(granularity="block", block=32))
    cb_ref, sb_ref, xbhat_ref = ref.fp8_block(x, 32)
    np.testing.assert_array_equal(np.asarray(qb.codes).view(np.uint8), cb_ref.view(np.uint8), err_msg=name)
    np.testing.assert_array_equal(np.asarray(qb.scale), sb_ref, err_msg=name)
    _same(_dequantize(qb), xbhat_ref)


def test_fp8_clips_before_cast():
  # A plain cast of 500 to float8_e4m3fn is NaN; the contract saturates at 448·s.
  x = jnp.array([[500.0, 1.0]], jnp.float32).T  # amax 500 -> s = 500/448, code 448
  q = _quantize(x, quant.FP8(), axis=0)
  assert float(_dequantize(q)[0, 0]) == pytest.approx(500.0, rel=1e-6)
  assert np.isnan(np.float32(jnp.array(500.0).astype(jnp.float8_e4m3fn)))


def test_mxfp8_matches_reference_bitwise():
  rng = np.random.default_rng(3)
  for name, x in _inputs(rng, (64, 96)).items():
    if name == "denormal":
      continue  # f32 denormal inputs are flushed to zero on CPU (XLA) but not in NumPy
    q = _quantize(jnp.asarray(x), quant.MXFP8(), axis=0)
    c_ref, s_ref, xhat_ref = ref.mxfp8(x, axis=0)
    np.testing.assert_array_equal(np.asarray(q.codes).view(np.uint8), c_ref.view(np.uint8), err_msg=name)
    np.testing.assert_array_equal(np.asarray(q.scale, np.float32), s_ref, err_msg=name)
    _same(_dequantize(q), xhat_ref)


def test_mxfp8_scale_is_round_up_power_of_two():
  # amax = 448 · 2^3 exactly -> scale 2^3; amax just above -> 2^4 (round up, no clipping).
  x = np.zeros((32, 2), np.float32)
  x[0, 0] = 448 * 8
  x[0, 1] = np.nextafter(np.float32(448 * 8), np.float32(1e9))
  q = _quantize(jnp.asarray(x), quant.MXFP8(), axis=0)
  np.testing.assert_array_equal(np.asarray(q.scale, np.float32), [[8.0, 16.0]])
  assert np.asarray(q.scale).dtype == jnp.float8_e8m0fnu


def test_nvfp4_matches_reference_bitwise():
  rng = np.random.default_rng(4)
  for name, x in _inputs(rng, (64, 96)).items():
    if name in ("denormal", "near_f32_max"):
      continue  # f32 denormal/overflow handling (flush-to-zero on CPU) is covered by the finite test
    q = _quantize(jnp.asarray(x), quant.NVFP4(), axis=0)
    c_ref, sb_ref, dec_ref, xhat_ref = ref.nvfp4(x, axis=0)
    nib = np.asarray(packing.unpack_nibbles(q.codes, axis=0))
    np.testing.assert_array_equal(nib, c_ref.view(np.uint8) & 0xF, err_msg=name)
    np.testing.assert_array_equal(np.asarray(q.scale).view(np.uint8), sb_ref.view(np.uint8), err_msg=name)
    assert np.float32(q.global_scale) == dec_ref, name
    _same(_dequantize(q), xhat_ref)


def test_all_zero_is_zero_everywhere():
  z = jnp.zeros((128, 64), jnp.float32)
  for spec in SPECS:
    q = _quantize(z, spec, axis=0)
    _same(_dequantize(q), np.zeros((128, 64)))
    assert np.isfinite(np.asarray(q.scale, np.float32)).all(), spec


def test_nan_stays_in_its_group():
  x = np.random.default_rng(5).standard_normal((128, 64)).astype(np.float32)
  x[3, 5] = np.nan
  x[70, 9] = np.inf
  for spec in SPECS:
    d = np.asarray(_dequantize(_quantize(jnp.asarray(x), spec, axis=0)))
    bad = ~np.isfinite(d)
    assert bad[3, 5] and bad[70, 9], spec
    # Every other column is untouched by the non-finite elements (groups run along axis 0).
    other = np.ones(64, bool)
    other[[5, 9]] = False
    if not (isinstance(spec, quant.FP8) and spec.granularity == "block"):
      assert np.isfinite(d[:, other]).all(), spec
    # Within the column, only the group holding the bad element is affected.
    if isinstance(spec, (quant.Int4, quant.MXFP8, quant.NVFP4)):
      g = spec.block
      assert np.isfinite(np.delete(d[:, 5], np.s_[(3 // g) * g : (3 // g + 1) * g])).all(), spec


def test_stacked_equals_per_matrix():
  x = jax.random.normal(jax.random.key(0), (3, 128, 32))
  for spec in HYPOTHESIS_SPECS:
    q = _quantize(x, spec, axis=-2)
    stacked = _dequantize(q)
    per = jnp.stack([_dequantize(_quantize(x[i], spec, axis=0)) for i in range(3)])
    _same(stacked, per)
    sliced = jax.lax.scan(lambda c, q: (c, _dequantize(q)), 0, q)[1]  # a scan slices the stacked QArray
    _same(sliced, per)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_straight_through_gradient(spec):
  x = jax.random.normal(jax.random.key(1), (128, 32))
  ct = jax.random.normal(jax.random.key(2), (128, 32))
  g = jax.grad(lambda x: jnp.sum(quant.fake_quant(x, spec, axis=0) * ct))(x)
  _same(g, ct)


def test_qarray_is_a_pytree_with_static_spec():
  q = _quantize(jnp.ones((64, 8)), quant.Int4(group_size=32), axis=0)
  leaves, tree = jax.tree_util.tree_flatten(q)
  assert len(leaves) == 2  # codes, scale (global_scale None)
  q2 = jax.tree_util.tree_unflatten(tree, leaves)
  assert q2.spec == q.spec and q2.shape == (64, 8) and q2.axis == -2
  assert q.bits_per_weight == pytest.approx(4 + 16 / 32)


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_int4_exact_ties_hypothesis(data):
  """w/s exactly k + 0.5 for the group's own bf16 scale: codes round half to even, as the reference."""
  s = np.float32(ml_dtypes.bfloat16(data.draw(st.floats(1e-4, 1e4))))
  half = data.draw(hnp.arrays(np.int8, (32, 2), elements=st.integers(-7, 6))).astype(np.float32) + 0.5
  half[0] = 7.0  # amax = 7 s exactly, so the scale is s itself
  w = (half * s).astype(np.float32)
  assert np.array_equal(w / s, half)  # the ties are exact in f32
  q = _quantize(jnp.asarray(w), quant.Int4(group_size=32), axis=0)
  codes = np.asarray(packing.unpack_nibbles(q.codes, axis=0)).astype(np.int16) - 8
  np.testing.assert_array_equal(codes, ref.int4(w, 32, axis=0)[0])
  np.testing.assert_array_equal(codes[1:], np.round(half[1:]))  # half to even


def test_code_bits_equal_the_casts():
  """`quantize` stores FP8 / MXFP8 codes and NVFP4's block scales through `qarray._e4m3_bits` and NVFP4's values
  through `_e2m1_nibbles` (integer arithmetic) instead of XLA's f8 / f4 converts: the same bits as ml_dtypes' casts
  at every value of each format, both signed zeros, and NaN of either sign (e4m3: 0x7F / 0xFF; e2m1 has no NaN,
  and XLA:CPU's convert gives code 8). `_e4m3_value` takes every e4m3 code (as uint8 or as e4m3) back to ml_dtypes'
  float32 of it, bit for bit."""
  e4 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)  # every code, 2 NaNs
  got = np.asarray(jax.jit(quant.qarray._e4m3_bits)(jnp.asarray(e4))).view(np.uint8)
  np.testing.assert_array_equal(got, np.arange(256, dtype=np.uint8))
  for codes in (np.arange(256, dtype=np.uint8), np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)):
    back = np.asarray(jax.jit(quant.qarray._e4m3_value)(jnp.asarray(codes)))  # the inverse (adam8's decode)
    np.testing.assert_array_equal(back.view(np.uint32), e4.view(np.uint32))  # -0 and NaN's sign included
  e2 = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
  got = np.asarray(jax.jit(quant.qarray._e2m1_nibbles)(jnp.asarray(e2)))
  np.testing.assert_array_equal(got, np.arange(16, dtype=np.uint8))
  nan = jnp.array([np.nan, -np.nan], jnp.float32)
  xla = jax.lax.bitcast_convert_type(nan.astype(jnp.float4_e2m1fn), jnp.uint4).astype(jnp.uint8)
  np.testing.assert_array_equal(np.asarray(quant.qarray._e2m1_nibbles(nan)), np.asarray(xla))
