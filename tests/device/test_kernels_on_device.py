"""The compiled Pallas kernels on a real accelerator (GPU: Triton, TPU: Mosaic) against NumPy float64.

Collected only under LRL_JAX_REQUIRE_DEVICE=1 (tests/conftest.py), which `scripts/device_check.sh` sets
on a GPU / TPU machine; there a CPU-only backend is an error, so a missing accelerator never reads as
a pass (and `make test` on this CPU machine neither runs nor skips them).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lrl_jax import quant
from lrl_jax.kernels import pallas_matmul, qmatmul, supported

pytestmark = pytest.mark.device

if jax.default_backend() not in ("gpu", "cuda", "tpu"):  # collected only under LRL_JAX_REQUIRE_DEVICE=1
  raise RuntimeError(f"the device tests need a GPU or TPU; jax's backend is {jax.default_backend()!r}")

SPECS = {
  "int4_g128": quant.Int4(group_size=128),
  "int4_g32_minmax": quant.Int4(group_size=32, scheme="minmax"),
  "nvfp4": quant.NVFP4(),
  "fp8_channel": quant.FP8(),
  "mxfp8": quant.MXFP8(),
}
TOL = {jnp.float32: 2e-5, jnp.bfloat16: 2.0**-7}  # device dots: f32 sums in any order; bf16 output rounding


def _served(q, dtype):
  """ŵ as the served matmul multiplies by it (`quant.qdot`), float64: rounded to the activation dtype; NVFP4
  unrounded (e2m1 · s_b is exact, dec multiplies the f32 sum)."""
  nvfp4 = isinstance(q.spec, quant.NVFP4)
  return np.asarray(quant.dequantize(q, jnp.float32 if nvfp4 else dtype).astype(jnp.float32), np.float64)


@pytest.mark.parametrize("m", [1, 16, 100])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("fmt", list(SPECS))
def test_compiled_kernel_matches_float64(fmt, dtype, m):
  k, n = 4096, 2048
  rng = np.random.default_rng(m)
  w = (rng.standard_normal((k, n)) * np.exp(rng.uniform(-2, 2, (1, n)))).astype(np.float32)
  q = quant.quantize(jnp.asarray(w), SPECS[fmt], axis=-2)
  sup = supported(jnp.zeros((m, k), dtype), q)
  # f32 activations on a GPU go to XLA by design (exact f32 dots spill there: tests/kernels/test_triton_aot.py);
  # the kernel itself must still be right when asked for.
  f32_on_gpu = dtype == jnp.float32 and jax.default_backend() != "tpu"
  if sup.pallas == f32_on_gpu:
    pytest.fail(f"{fmt}: qmatmul's choice on {jax.default_backend()} is wrong: {sup}")
  x = jnp.asarray(rng.standard_normal((m, k)), dtype)
  y = np.asarray(jax.jit(pallas_matmul)(x, q).astype(jnp.float32), np.float64)
  w_hat = _served(q, dtype)
  x64 = np.asarray(x.astype(jnp.float32), np.float64)
  bound = TOL[dtype] * (np.abs(x64) @ np.abs(w_hat)) + 1e-30
  err = np.abs(y - x64 @ w_hat)
  assert np.all(err <= bound), f"{fmt} {dtype.__name__} M={m}: max err/bound {np.max(err / bound):.3g}"
  y_auto = np.asarray(jax.jit(qmatmul)(x, q).astype(jnp.float32))
  if sup.pallas:
    np.testing.assert_array_equal(y_auto, y.astype(np.float32))  # qmatmul dispatches to the same kernel
  else:
    assert np.all(np.abs(y_auto - x64 @ w_hat) <= bound), f"{fmt}: the XLA path is off"


def _require_hopper(what: str) -> None:
  dev = jax.devices()[0]
  if jax.default_backend() == "tpu" or float(getattr(dev, "compute_capability", 0) or 0) < 9.0:
    pytest.fail(f"{what} needs an sm_90+ GPU; this device is {dev.device_kind}")  # not a skip


@pytest.mark.parametrize("m", [1, 16, 100])
@pytest.mark.parametrize("fmt", list(SPECS))
def test_mosaic_gpu_kernel_matches_float64(fmt, m):
  """The Mosaic GPU (wgmma) kernel compiled and run on an sm_90+ GPU, bf16 activations (kernels/mosaic_gpu.py)."""
  _require_hopper("the Mosaic GPU kernel")
  k, n = 4096, 2048
  rng = np.random.default_rng(m + 7)
  w = (rng.standard_normal((k, n)) * np.exp(rng.uniform(-2, 2, (1, n)))).astype(np.float32)
  q = quant.quantize(jnp.asarray(w), SPECS[fmt], axis=-2)
  x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
  y = np.asarray(jax.jit(lambda x, q: pallas_matmul(x, q, target="mosaic_gpu"))(x, q).astype(jnp.float32), np.float64)
  w_hat = _served(q, jnp.bfloat16)
  x64 = np.asarray(x.astype(jnp.float32), np.float64)
  bound = TOL[jnp.bfloat16] * (np.abs(x64) @ np.abs(w_hat)) + 1e-30
  err = np.abs(y - x64 @ w_hat)
  assert np.all(err <= bound), f"{fmt} M={m}: max err/bound {np.max(err / bound):.3g}"


LINEAR_SPECS = {
  "int4_g128": quant.Int4(group_size=128),
  "int4_g32": quant.Int4(group_size=32),
  "int4_g64_minmax": quant.Int4(group_size=64, scheme="minmax"),
  "nvfp4": quant.NVFP4(),
}


LINEAR_CASES = [
  ("int4_g128", 1, jnp.bfloat16),
  ("int4_g128", 16, jnp.bfloat16),
  ("int4_g128", 100, jnp.bfloat16),
  ("int4_g128", 1, jnp.float16),
  ("int4_g32", 1, jnp.bfloat16),
  ("int4_g32", 100, jnp.bfloat16),
  ("int4_g64_minmax", 16, jnp.bfloat16),
  ("int4_g64_minmax", 3, jnp.float16),
  ("nvfp4", 1, jnp.bfloat16),
  ("nvfp4", 16, jnp.bfloat16),
  ("nvfp4", 100, jnp.bfloat16),
]


@pytest.mark.parametrize("fmt,m,dtype", LINEAR_CASES)
def test_linear_layout_kernel_matches_float64(fmt, m, dtype):
  """`qlinear` on the nn.Linear layout [N, K] (kernels/linear.py): ŵᵀ decoded in registers as wgmma's left operand.
  Also the first run of the in-register reinterpretation of the code bytes as int4 (element 2i from the low nibble),
  which interpret mode cannot execute, and of NVFP4's bit-placed E2M1 decode (`_mgpu_decode.e2m1_pair_bits`: the
  ±0.5 codes are bf16 subnormals before the scale multiply, which the GPU must keep)."""
  from lrl_jax.kernels import linear as lin  # pylint: disable=g-import-not-at-top

  _require_hopper("the linear-layout kernel")
  k, n = 4096, 2048
  rng = np.random.default_rng(m + 11)
  w = (rng.standard_normal((k, n)) * np.exp(rng.uniform(-2, 2, (1, n)))).astype(np.float32)
  t = lin.linear_layout(quant.quantize(jnp.asarray(w), LINEAR_SPECS[fmt], axis=-2))
  sup = lin.supported_linear(jnp.zeros((m, k), dtype), t)
  assert sup.pallas and sup.path == "pallas-mosaic-gpu", sup
  x = jnp.asarray(rng.standard_normal((m, k)), dtype)
  y = np.asarray(jax.jit(lin.qlinear)(x, t).astype(jnp.float32), np.float64)
  w_hat = _served(t, dtype).T  # [K, N]
  x64 = np.asarray(x.astype(jnp.float32), np.float64)
  bound = TOL[jnp.bfloat16] * (np.abs(x64) @ np.abs(w_hat)) + 1e-30
  err = np.abs(y - x64 @ w_hat)
  assert np.all(err <= bound), f"{fmt} {dtype.__name__} M={m}: max err/bound {np.max(err / bound):.3g}"
