"""AQT's QAT dot_general equals x @ dequantize(quantize(w)) for the same spec, bit for bit."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from lrl_jax import quant

DN = (((1,), (0,)), ((), ()))  # x [M, K] @ w [K, N]
SPECS = [
  quant.Int4(group_size=32),
  quant.Int4(group_size=128),
  quant.FP8(),
  quant.FP8(granularity="block", block=32),
  quant.MXFP8(),
  quant.NVFP4(),
]


def _weights():
  rng = np.random.default_rng(0)
  w = rng.standard_t(3, (128, 64)).astype(np.float32)
  # Exact INT4 ties in a few columns: amax 7s, others (k + 0.5)s with s a bf16 value.
  s = np.float32(ml_dtypes.bfloat16(0.0371))
  ties = rng.integers(-7, 7, (128, 8)).astype(np.float32) + 0.5
  ties[::32] = 7
  w[:, :8] = ties * s
  w[:, 8] = 0.0  # an all-zero column
  return w


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_forward_equals_contract(spec, dtype):
  w = jnp.asarray(_weights(), dtype)
  x = jax.random.normal(jax.random.key(0), (5, 128), dtype)
  dg = quant.dot_general_for(spec)
  y = jax.jit(lambda x, w: dg(x, w, DN))(x, w)
  if isinstance(spec, quant.NVFP4):  # the served form: dec after the K sum (`quant.qdot`), as the sampler's dot
    ref = quant.qdot(x, quant.quantize(w, spec, axis=0), DN).astype(dtype)
  else:
    ref = jax.lax.dot_general(x, quant.dequantize(quant.quantize(w, spec, axis=0), dtype), DN)
  assert y.dtype == dtype
  np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(ref, np.float32))


@pytest.mark.parametrize(
  "spec", [quant.Int4(group_size=32), quant.FP8(), quant.FP8(granularity="block", block=32)], ids=lambda s: s.name
)
def test_aqt_quantizer_equals_fake_quant(spec):
  w = jnp.asarray(_weights())
  np.testing.assert_array_equal(
    np.asarray(quant.aqt_fake_quant(w, spec, axis=0)), np.asarray(quant.fake_quant(w, spec, axis=0))
  )


def test_aqt_default_int4_differs_from_contract():
  """Why the configuration matters: AQT's stock int4 (bound 7.5, x·1/s) gives other weights."""
  from aqt.jax.v2 import aqt_quantizer

  w = jnp.asarray(_weights())
  stock = aqt_quantizer.quantizer_make(4)
  qt, _ = stock.quant(w, calibration_axes=[0])
  stock_w = np.asarray(qt.dequant())
  ours = np.asarray(quant.aqt_fake_quant(w, quant.Int4(group_size=128), axis=0))
  assert not np.array_equal(stock_w, ours)


def test_gradients_straight_through():
  spec = quant.Int4(group_size=32)
  w = jnp.asarray(_weights())
  x = jax.random.normal(jax.random.key(1), (5, 128))
  ct = jax.random.normal(jax.random.key(2), (5, 64))
  dg = quant.dot_general_for(spec)
  gx, gw = jax.grad(lambda x, w: jnp.sum(dg(x, w, DN) * ct), argnums=(0, 1))(x, w)
  w_hat = np.asarray(quant.fake_quant(w, spec, axis=0), np.float64)
  np.testing.assert_allclose(gx, np.asarray(ct, np.float64) @ w_hat.T, rtol=1e-5, atol=1e-5)  # d/dx of x·ŵ
  np.testing.assert_allclose(gw, np.asarray(x, np.float64).T @ np.asarray(ct, np.float64), rtol=1e-5, atol=1e-5)


def test_w8a8_activation_quant():
  act = quant.FP8(granularity="token")
  dg = quant.dot_general_for(quant.FP8(), act_spec=act)
  x = jax.random.normal(jax.random.key(3), (4, 128))
  w = jnp.asarray(_weights())
  y = dg(x, w, DN)
  ref = quant.fake_quant(x, act, axis=-1) @ quant.fake_quant(w, quant.FP8(), axis=0)
  np.testing.assert_array_equal(np.asarray(y), np.asarray(ref))
  with pytest.raises(ValueError, match="act_spec"):
    quant.dot_general_for(quant.FP8(), act_spec=quant.Int4())


def test_stacked_weights_inside_scan():
  spec = quant.Int4(group_size=32)
  ws = jnp.stack([jnp.asarray(_weights()) * (i + 1) for i in range(3)])
  x = jax.random.normal(jax.random.key(4), (2, 128))
  dg = quant.dot_general_for(spec)
  ys = jax.lax.scan(lambda c, w: (c, dg(x, w, DN)), 0, ws)[1]
  served = quant.quantize(ws, spec, axis=-2)
  ref = jax.lax.scan(lambda c, q: (c, x @ quant.dequantize(q)), 0, served)[1]
  np.testing.assert_array_equal(np.asarray(ys), np.asarray(ref))


def test_multi_axis_contraction_rejected():
  dg = quant.dot_general_for(quant.Int4(group_size=32))
  with pytest.raises(ValueError, match="one axis"):
    dg(jnp.ones((2, 4, 32)), jnp.ones((4, 32, 8)), (((1, 2), (0, 1)), ((), ())))


def test_e4m3_numerics_equal_aqt_cast():
  """The FP8 numerics' arithmetic forward (`aqt._E4m3Numerics`) = AQT's stock `Fp8Numerics(e4m3)` (clip to ±448, a
  cast to float8_e4m3fn and back), bit for bit (signs of zero included), at every e4m3 value, every tie between
  two of them and one float32 ulp either side, below the subnormals, beyond ±448 (clipped), at ±Inf, and NaN
  stays NaN."""
  from aqt.jax.v2.numerics import fp8_numerics

  grid = np.unique(np.abs(np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)).astype(np.float32))
  grid = grid[np.isfinite(grid)]
  ties = (grid[:-1] + grid[1:]) / 2  # exact in float32: 4 significant bits
  pts = np.concatenate([grid, ties, np.nextafter(ties, 0), np.nextafter(ties, np.inf)])
  rng = np.random.default_rng(11)
  extra = [2.0**-12, 2.0**-10, np.finfo(np.float32).smallest_subnormal, 449.0, 464.0, 465.0, 1e6, np.inf]
  pts = np.concatenate([pts, extra, np.exp(rng.uniform(-12, 7, 4096))]).astype(np.float32)
  x = jnp.asarray(np.concatenate([pts, -pts]))
  args = dict(dtype=jnp.float8_e4m3fn, exponent_bits=4, mantissa_bits=3)
  stock = fp8_numerics.Fp8Numerics(**args).vjp_fwd(x, None)[0].astype(jnp.float32)
  ours = quant.aqt._E4m3Numerics(**args).vjp_fwd(x, None)[0]
  assert ours.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(ours).view(np.uint32), np.asarray(stock).view(np.uint32))
  assert np.isnan(np.asarray(quant.aqt._E4m3Numerics(**args).vjp_fwd(jnp.array([np.nan]), None)[0])).all()
