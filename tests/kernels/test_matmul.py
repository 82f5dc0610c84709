"""Pallas low-bit matmuls (interpret mode on CPU) against NumPy float64 references.

The weight reference is decoded here from the stored bytes with NumPy (the layouts of
the QArray docstring: nibble order, +8 offset, E2M1 table, E4M3 / E8M0 scales) and
checked against `quant.dequantize`; the kernels must then equal x @ ŵ, where ŵ is
rounded to the activation dtype, up to f32 summation order and the output rounding.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from lrl_jax import quant
from lrl_jax.kernels import BlockConfig, Unsupported, fp8_matmul, nvfp4_matmul, pallas_matmul, w4a16_matmul, xla_matmul
from lrl_jax.kernels.blocks import plan

K, N = 256, 256
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])

SPECS = {
  "int4_g32": quant.Int4(group_size=32),
  "int4_g64": quant.Int4(group_size=64),
  "int4_g128": quant.Int4(group_size=128),
  "int4_g32_minmax": quant.Int4(group_size=32, scheme="minmax"),  # zero points: ŵ = (q − z)·s
  "nvfp4": quant.NVFP4(),
  "fp8_channel": quant.FP8(),
  "fp8_block": quant.FP8(granularity="block"),
  "mxfp8": quant.MXFP8(),
}
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}
# Per-element bound |y - ref| <= TOL · (|x| @ |ŵ|): f32 summation, or the bf16 output rounding (2^-9).
TOL = {"f32": 2e-6, "bf16": 2.0**-8}


def _weights(seed=0, k=K, n=N):
  rng = np.random.default_rng(seed)
  # Columns of different magnitude, so scales differ across groups and channels.
  return (rng.standard_normal((k, n)) * np.exp(rng.uniform(-2, 2, size=(1, n)))).astype(np.float32)


def _np_dequant(q: quant.QArray) -> np.ndarray:
  """ŵ [K, N] decoded from q's bytes with NumPy, from the layout alone.

  Products are rounded to float32 in the contract's order ((code · s_b) · dec), returned as float64.
  """
  codes = np.asarray(q.codes)
  spec = q.spec
  f32 = np.float32
  if isinstance(spec, (quant.Int4, quant.NVFP4)):
    nib = np.empty((2 * codes.shape[0], codes.shape[1]), np.int64)
    nib[0::2], nib[1::2] = codes & 0xF, codes >> 4  # element 2i in the low nibble
    s = np.repeat(np.asarray(q.scale.astype(jnp.float32)), spec.block, axis=0)
    if isinstance(spec, quant.Int4):
      z = 0 if q.zero_point is None else np.repeat(np.asarray(q.zero_point).astype(np.int64), spec.block, axis=0)
      return ((nib - 8 - z).astype(f32) * s).astype(np.float64)
    vals = (np.where(nib & 8, -1.0, 1.0) * E2M1[nib & 7]).astype(f32)
    return (vals * s * np.asarray(q.global_scale, f32)).astype(np.float64)
  c = codes.view(ml_dtypes.float8_e4m3fn).astype(f32)
  if isinstance(spec, quant.MXFP8):
    e = np.asarray(q.scale).view(np.uint8).astype(np.float64)
    return c.astype(np.float64) * np.repeat(2.0 ** (e - 127), 32, axis=0)
  s = np.asarray(q.scale, f32)
  if spec.granularity == "block":
    s = np.repeat(np.repeat(s, spec.block, axis=0), spec.block, axis=1)
  return (c * s).astype(np.float64)


def _round(a: np.ndarray, dtype) -> np.ndarray:
  return np.asarray(jnp.asarray(a, jnp.float32).astype(dtype).astype(jnp.float32), np.float64)


def _served(q: quant.QArray, dtype, w_hat: np.ndarray | None = None) -> np.ndarray:
  """ŵ as the served matmul (`quant.qdot`, every kernel) multiplies by it, float64: rounded to the activation
  dtype, except NVFP4, whose e2m1 · s_b is exact in every activation dtype and whose per-matrix dec multiplies
  the f32 sum: x @ ŵ itself."""
  w_hat = _np_dequant(q) if w_hat is None else w_hat
  return w_hat if isinstance(q.spec, quant.NVFP4) else _round(w_hat, dtype)


def _check_close(y, x, w_hat, dtype_name):
  x64 = np.asarray(jnp.asarray(x, jnp.float32), np.float64)
  ref = x64 @ w_hat
  bound = TOL[dtype_name] * (np.abs(x64) @ np.abs(w_hat)) + 1e-30
  err = np.abs(np.asarray(jnp.asarray(y, jnp.float32), np.float64) - ref)
  assert np.all(err <= bound), f"max err/bound {np.max(err / bound):.3g}"


@pytest.fixture(scope="module")
def qweights():
  w = jnp.asarray(_weights())
  out = {}
  for name, spec in SPECS.items():
    q = quant.quantize(w, spec, axis=-2)
    w_hat = _np_dequant(q)
    # The NumPy decoding of the bytes is the contract's dequantize, exactly.
    np.testing.assert_array_equal(w_hat, np.asarray(quant.dequantize(q), np.float64))
    out[name] = (q, w_hat)
  return out


# Every M on the GPU (k_loop) schedule; two on the TPU (k_grid) schedule, to bound the run time. The default
# suite runs M = 1 and a ragged M = 100 on the GPU schedule, M = 100 on the TPU one; the rest are `make test-slow`.
CASES = [(1, "gpu"), (100, "gpu"), (100, "tpu")] + [
  pytest.param(m, t, marks=pytest.mark.slow) for m, t in ((3, "gpu"), (17, "gpu"), (3, "tpu"))
]


@pytest.mark.parametrize("m,target", CASES)
@pytest.mark.parametrize("dtype_name", ["f32", "bf16"])
@pytest.mark.parametrize("fmt", list(SPECS))
def test_kernel_matches_reference(qweights, fmt, dtype_name, m, target):
  q, w_hat = qweights[fmt]
  dtype = DTYPES[dtype_name]
  x = jnp.asarray(np.random.default_rng(m).standard_normal((m, K)), dtype)
  if target == "tpu" and fmt == "fp8_block":
    # FP8 128x128 block scales have no Mosaic-legal tile: TPU refuses (qmatmul takes the XLA path).
    with pytest.raises(Unsupported, match="breaks Mosaic's"):
      pallas_matmul(x, q, target=target, interpret=True)
    return
  y = pallas_matmul(x, q, target=target, interpret=True)
  assert y.shape == (m, N) and y.dtype == dtype
  _check_close(y, x, _served(q, dtype, w_hat), dtype_name)


@pytest.mark.parametrize("target", ["gpu", "tpu"])
@pytest.mark.parametrize("fmt", ["int4_g32", "int4_g32_minmax", "nvfp4", "fp8_channel", "mxfp8"])
def test_several_k_steps(fmt, target):
  """K = 1024: TPU accumulates over 4 sequential K grid steps (bk = 256); GPU runs split-K 4 x 2 chunks of 128.
  NVFP4 / MXFP8 on TPU: 8-bit scales need 32-row blocks (bk = 512 / 1024), so K = 2048 (4 / 2 steps)."""
  tpu_bk = {"nvfp4": 512, "mxfp8": 1024}.get(fmt, 256)
  k = 2048 if target == "tpu" and tpu_bk > 256 else 1024
  q = quant.quantize(jnp.asarray(_weights(seed=7, k=k)), SPECS[fmt], axis=-2)
  x = jnp.asarray(np.random.default_rng(8).standard_normal((17, k)), jnp.float32)
  block = BlockConfig(bk=tpu_bk) if target == "tpu" else BlockConfig()
  p = plan(17, k, N, q.spec, block, target)
  assert (k // p.bk, p.split_k) == ((k // tpu_bk, 1) if target == "tpu" else (8, 4))
  assert target == "gpu" or k // p.bk >= 2
  _check_close(pallas_matmul(x, q, block=block, target=target, interpret=True), x, _np_dequant(q), "f32")


@pytest.mark.parametrize(
  "fmt,fn", [("int4_g128", w4a16_matmul), ("nvfp4", nvfp4_matmul), ("fp8_channel", fp8_matmul), ("mxfp8", fp8_matmul)]
)
def test_named_entry_points_jit_and_leading_dims(qweights, fmt, fn):
  q, w_hat = qweights[fmt]
  x = jnp.asarray(np.random.default_rng(1).standard_normal((2, 5, K)), jnp.bfloat16)
  y = jax.jit(lambda x, q: fn(x, q, interpret=True))(x, q)
  assert y.shape == (2, 5, N) and y.dtype == jnp.bfloat16
  _check_close(y.reshape(10, N), x.reshape(10, K), _served(q, jnp.bfloat16, w_hat), "bf16")


def test_entry_points_reject_other_formats(qweights):
  x = jnp.ones((1, K), jnp.float32)
  with pytest.raises(ValueError, match="w4a16_matmul: weight spec"):
    w4a16_matmul(x, qweights["nvfp4"][0], interpret=True)
  with pytest.raises(ValueError, match="nvfp4_matmul: weight spec"):
    nvfp4_matmul(x, qweights["int4_g32"][0], interpret=True)
  with pytest.raises(ValueError, match="fp8_matmul: weight spec"):
    fp8_matmul(x, qweights["int4_g32"][0], interpret=True)


def test_split_k_and_small_chunks(qweights):
  q, w_hat = qweights["int4_g32"]
  x = jnp.asarray(np.random.default_rng(2).standard_normal((17, K)), jnp.float32)
  block = BlockConfig(bm=16, bn=64, bk=32, split_k=2)  # 4 N tiles, 2 splits of 4 chunks, 2 M tiles
  y = w4a16_matmul(x, q, block=block, target="gpu", interpret=True)
  _check_close(y, x, w_hat, "f32")


@pytest.mark.parametrize("fmt", ["int4_g64", "nvfp4", "fp8_channel"])
@pytest.mark.parametrize("dtype_name", ["f32", "bf16"])
def test_gradient_wrt_x(qweights, fmt, dtype_name):
  q, w_hat = qweights[fmt]
  dtype = DTYPES[dtype_name]
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.standard_normal((3, 4, K)), dtype)
  g = jnp.asarray(rng.standard_normal((3, 4, N)), jnp.float32)

  def loss(fn):
    return lambda x: jnp.sum(fn(x).astype(jnp.float32) * g)

  dx_kernel = jax.grad(loss(lambda x: pallas_matmul(x, q, interpret=True)))(x)
  dx_xla = jax.grad(loss(lambda x: xla_matmul(x, q)))(x)
  assert dx_kernel.dtype == dtype and dx_kernel.shape == x.shape
  # Both equal g @ ŵᵀ as served (`_served`; f32 accumulation, in their own summation order).
  g_x = np.asarray(jnp.asarray(g).astype(dtype).astype(jnp.float32), np.float64).reshape(12, N)
  w_r = _served(q, dtype, w_hat)
  ref = g_x @ w_r.T
  bound = TOL[dtype_name] * (np.abs(g_x) @ np.abs(w_r).T) + 1e-30
  for dx in (dx_kernel, dx_xla):
    err = np.abs(np.asarray(dx.astype(jnp.float32), np.float64).reshape(12, K) - ref)
    assert np.all(err <= bound), f"max err/bound {np.max(err / bound):.3g}"


def test_weight_gets_zero_cotangent(qweights):
  q, _ = qweights["int4_g128"]
  x = jnp.ones((2, K), jnp.float32)
  _, vjp = jax.vjp(lambda x, q: pallas_matmul(x, q, interpret=True), x, q)
  _, dq = vjp(jnp.ones((2, N), jnp.float32))
  assert dq.codes.dtype == jax.dtypes.float0
  assert not np.any(np.asarray(dq.scale.astype(jnp.float32)))


def test_scan_over_stacked_layers():
  """A stacked QArray [L, K, N] sliced by lax.scan feeds the kernel one matrix at a time."""
  ws = np.stack([_weights(seed=s) for s in range(3)]) / 16
  qs = quant.quantize(jnp.asarray(ws), quant.NVFP4(), axis=-2)
  x = jnp.asarray(np.random.default_rng(4).standard_normal((2, K)), jnp.float32)

  def step(h, q):
    return pallas_matmul(h, q, interpret=True), None

  y, _ = jax.lax.scan(step, x, qs)
  ref = np.asarray(x, np.float64)
  for layer in range(3):
    ql = jax.tree.map(lambda a, layer=layer: a[layer], qs)
    ref = ref @ _np_dequant(ql)
  np.testing.assert_allclose(np.asarray(y, np.float64), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


@pytest.mark.parametrize("path", ["gpu", "tpu", "xla"])
def test_nvfp4_applies_its_decode_scale_after_the_sum(qweights, path):
  """NVFP4 with bf16 activations is dec · (x @ e2m1·s_b) (`quant.qdot`): the product of the contract's f32 ŵ,
  rounded once at the output. The per-weight form x @ round_bf16(ŵ) is not: its 2^-9 per weight shows here."""
  q, w_hat = qweights["nvfp4"]
  x = jnp.asarray(np.random.default_rng(9).standard_normal((64, K)), jnp.bfloat16)
  y = xla_matmul(x, q) if path == "xla" else pallas_matmul(x, q, target=path, interpret=True)
  x64 = np.asarray(x.astype(jnp.float32), np.float64)
  ref, scale = x64 @ w_hat, np.abs(x64) @ np.abs(w_hat)
  bound = 2.0**-8 * np.abs(ref) + TOL["f32"] * scale  # the bf16 output's half ulp, and f32 summation
  err = np.abs(np.asarray(y.astype(jnp.float32), np.float64) - ref)
  assert np.all(err <= bound), f"max err/bound {np.max(err / bound):.3g}"
  per_weight = _round(x64 @ _round(w_hat, jnp.bfloat16), jnp.bfloat16)  # what rounding ŵ to bf16 first gives
  assert np.mean(np.abs(per_weight - ref) > bound) > 0.01


def test_fp8_token_activations_native_dot(qweights):
  q, _ = qweights["fp8_channel"]
  x = np.random.default_rng(5).standard_normal((17, K)).astype(np.float32)
  y = fp8_matmul(jnp.asarray(x), q, act="fp8_token")
  # NumPy W8A8: per-token s_x = amax/448, x_q = e4m3(x / s_x); y = (x_q @ w_q) · s_x · s_w.
  s_x = np.abs(x).max(axis=1, keepdims=True) / 448.0
  x_q = np.clip(x / s_x, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
  w_q = np.asarray(q.codes).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
  ref = (x_q @ w_q) * s_x * np.asarray(q.scale, np.float64)
  bound = 1e-5 * (np.abs(x_q) @ np.abs(w_q)) * s_x * np.asarray(q.scale, np.float64) + 1e-30
  assert np.all(np.abs(np.asarray(y, np.float64) - ref) <= bound)
  dx = jax.grad(lambda x: fp8_matmul(x, q, act="fp8_token").sum())(jnp.asarray(x))  # straight-through
  np.testing.assert_allclose(np.asarray(dx), np.ones((17, N)) @ _np_dequant(q).T, rtol=1e-5, atol=1e-4)
  with pytest.raises(ValueError, match="granularity='channel'"):
    fp8_matmul(jnp.asarray(x), qweights["fp8_block"][0], act="fp8_token")


def test_indivisible_shapes():
  """Weights are never padded (that would copy them every call). Default tiles adapt to K and N;
  a tile set explicitly that does not divide its dimension raises a clear error."""
  x = jnp.ones((3, K), jnp.bfloat16)
  q = quant.quantize(jnp.asarray(_weights(n=200)), quant.Int4(group_size=32), axis=-2)
  for target in ("gpu", "tpu"):
    with pytest.raises(Unsupported, match=r"int4_g32: N=200 is not a multiple of the tile 128"):
      w4a16_matmul(x, q, block=BlockConfig(bn=128), target=target, interpret=True)
  # GPU (Triton): no power-of-two tile >= 16 divides 200.
  with pytest.raises(Unsupported, match=r"no legal tile divides N=200"):
    w4a16_matmul(x, q, target="gpu", interpret=True)
  # TPU: a block equal to the full dimension is always legal.
  y = w4a16_matmul(x, q, target="tpu", interpret=True)
  _check_close(y, x, _round(_np_dequant(q), jnp.bfloat16), "bf16")
  # K = 224 = 7 · 32: the default chunk shrinks to 32 (GPU) or all of K (TPU); bk=256 is refused.
  q2 = quant.quantize(jnp.asarray(_weights(k=224)), quant.Int4(group_size=32), axis=-2)
  x2 = jnp.asarray(np.random.default_rng(6).standard_normal((3, 224)), jnp.float32)
  for target in ("gpu", "tpu"):
    _check_close(w4a16_matmul(x2, q2, target=target, interpret=True), x2, _np_dequant(q2), "f32")
    with pytest.raises(Unsupported, match=r"K=224 is not a multiple of split_k\*bk=1\*256"):
      w4a16_matmul(x2, q2, block=BlockConfig(bk=256, split_k=1), target=target, interpret=True)
  with pytest.raises(ValueError, match=r"activations \(3, 128\) do not contract with weight \(256, 256\)"):
    w4a16_matmul(jnp.ones((3, 128), jnp.float32), quant.quantize(jnp.asarray(_weights()), quant.Int4(), axis=-2))
  with pytest.raises(ValueError, match="axis=-2"):
    w4a16_matmul(jnp.ones((3, K), jnp.float32), quant.quantize(jnp.asarray(_weights()), quant.Int4(), axis=-1))


def test_block_config_validation():
  with pytest.raises(ValueError, match="BlockConfig.bn"):
    BlockConfig(bn=0)
  with pytest.raises(ValueError, match="BlockConfig.schedule"):
    BlockConfig(schedule="fast")
