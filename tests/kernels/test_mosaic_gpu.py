"""The Mosaic GPU (Hopper wgmma) kernel: numerics in Mosaic GPU's interpret mode, lowering for cuda, plans.

Interpret mode runs the kernel's TMA copies, SMEM staging and wgmma on the CPU with the semantics of the
primitives; it ignores register layouts, which the `cuda` lowering checks instead (with the shared-memory
budget). Together they cover everything but ptxas and the clock: no GPU here.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from lrl_jax import kernels, quant
from lrl_jax.kernels import BlockConfig, Unsupported, dispatch, pallas_matmul, xla_matmul
from lrl_jax.kernels import mosaic_gpu as mg
from lrl_jax.kernels.blocks import plan
from lrl_jax.kernels.matmul import smem_bytes
from tests.kernels.test_matmul import SPECS, TOL, K, N, _check_close, _np_dequant, _served, _weights

FORMATS = ["int4_g32", "int4_g128", "int4_g32_minmax", "nvfp4", "fp8_channel", "mxfp8"]


@pytest.fixture(scope="module")
def qw():
  w = jnp.asarray(_weights())
  return {f: (q := quant.quantize(w, SPECS[f], axis=-2), _np_dequant(q)) for f in FORMATS}


@pytest.mark.parametrize("m", [1, pytest.param(17, marks=pytest.mark.slow), 100])
@pytest.mark.parametrize("fmt", FORMATS)
def test_matches_float64_reference(qw, fmt, m):
  """x @ ŵ as served (round_bf16(ŵ); NVFP4's dec after the sum) up to f32 summation order and the bf16 output
  rounding; M = 100 spans two row tiles."""
  q, w_hat = qw[fmt]
  x = jnp.asarray(np.random.default_rng(m).standard_normal((m, K)), jnp.bfloat16)
  y = pallas_matmul(x, q, target="mosaic_gpu", interpret=True)
  assert y.shape == (m, N) and y.dtype == jnp.bfloat16
  _check_close(y, x, _served(q, jnp.bfloat16, w_hat), "bf16")


def test_float16_activations(qw):
  q, w_hat = qw["int4_g128"]
  x = jnp.asarray(np.random.default_rng(5).standard_normal((3, K)), jnp.float16)
  y = pallas_matmul(x, q, target="mosaic_gpu", interpret=True)
  assert y.dtype == jnp.float16
  _check_close(y, x, _served(q, jnp.float16, w_hat), "bf16")  # f16 output rounding (2^-11) is inside bf16's bound


@pytest.mark.parametrize("fmt", ["int4_g32_minmax", "nvfp4"])
def test_split_k_and_several_chunks(fmt):
  """K = 2048: split-K 4 programs per N tile, each walking 4 pipelined chunks."""
  k = 2048
  q = quant.quantize(jnp.asarray(_weights(seed=7, k=k)), SPECS[fmt], axis=-2)
  x = jnp.asarray(np.random.default_rng(8).standard_normal((5, k)), jnp.bfloat16)
  block = BlockConfig(split_k=4)
  p = plan(5, k, N, q.spec, block, "mosaic_gpu")
  assert (p.bm, p.bk, p.split_k, k // p.split_k // p.bk) == (64, 128, 4, 4)
  y = pallas_matmul(x, q, block=block, target="mosaic_gpu", interpret=True)
  _check_close(y, x, _served(q, jnp.bfloat16), "bf16")


def test_plan_rules():
  # 64 code rows per chunk: bk 128 for the 4-bit formats, 64 for the 8-bit ones; bm is the wgmma M.
  p = plan(1, 8192, 8192, quant.Int4(), BlockConfig(), "mosaic_gpu")
  assert (p.bm, p.m_pad, p.bn, p.bk, p.split_k, p.stages) == (64, 64, 128, 128, 4, 3)
  assert plan(16, 4096, 4096, quant.FP8(), BlockConfig(), "mosaic_gpu").bk == 64
  assert plan(100, 4096, 4096, quant.NVFP4(), BlockConfig(), "mosaic_gpu").m_pad == 128
  with pytest.raises(Unsupported, match="FP8 block scales"):
    plan(1, 4096, 4096, quant.FP8(granularity="block"), BlockConfig(), "mosaic_gpu")
  with pytest.raises(Unsupported, match="no legal tile divides K"):  # a group spans two 64-row chunks
    plan(1, 4096, 4096, quant.Int4(group_size=256), BlockConfig(), "mosaic_gpu")
  with pytest.raises(Unsupported, match="breaks the target's tile rules"):  # wgmma N <= 256
    plan(1, 4096, 4096, quant.Int4(), BlockConfig(bn=512), "mosaic_gpu")
  with pytest.raises(Unsupported, match="schedule 'k_loop'"):
    plan(1, 4096, 4096, quant.Int4(), BlockConfig(schedule="k_grid"), "mosaic_gpu")
  q = quant.quantize(jnp.asarray(_weights()), quant.Int4(), axis=-2)
  with pytest.raises(Unsupported, match="bfloat16 / float16"):
    pallas_matmul(jnp.ones((1, K), jnp.float32), q, target="mosaic_gpu", interpret=True)


def test_gradient_through_custom_vjp(qw):
  q, w_hat = qw["nvfp4"]
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.standard_normal((2, 3, K)), jnp.bfloat16)
  g = jnp.asarray(rng.standard_normal((2, 3, N)), jnp.float32)
  loss = lambda fn: lambda x: jnp.sum(fn(x).astype(jnp.float32) * g)
  dx = jax.grad(loss(lambda x: pallas_matmul(x, q, target="mosaic_gpu", interpret=True)))(x)
  g_x = np.asarray(g.astype(jnp.bfloat16).astype(jnp.float32), np.float64).reshape(6, N)
  w_r = _served(q, jnp.bfloat16, w_hat)
  err = np.abs(np.asarray(dx.astype(jnp.float32), np.float64).reshape(6, K) - g_x @ w_r.T)
  assert np.all(err <= TOL["bf16"] * (np.abs(g_x) @ np.abs(w_r).T) + 1e-30)


def test_dispatch(monkeypatch, qw):
  """impl='mosaic_gpu' runs it by name; on a GPU whose jax has no Triton backend, 'auto' falls back to it."""
  q, _ = qw["int4_g128"]
  x = jnp.asarray(np.random.default_rng(1).standard_normal((4, K)), jnp.bfloat16)
  ref = np.asarray(xla_matmul(x, q).astype(jnp.float32))
  s = kernels.supported(x, q, impl="mosaic_gpu")
  assert s.pallas and s.target == "mosaic_gpu"
  np.testing.assert_allclose(
    np.asarray(kernels.qmatmul(x, q, impl="mosaic_gpu").astype(jnp.float32)), ref, rtol=2**-7, atol=2e-2
  )
  monkeypatch.setattr(dispatch, "_backend", lambda: "gpu")
  monkeypatch.setattr(dispatch, "_logged", set())
  assert kernels.supported(x, q).path == "pallas-triton"
  monkeypatch.setattr(mg, "triton_available", lambda: False)
  s = kernels.supported(x, q)
  assert s.pallas and s.path == "pallas-mosaic-gpu"
  np.testing.assert_allclose(np.asarray(kernels.qmatmul(x, q).astype(jnp.float32)), ref, rtol=2**-7, atol=2e-2)
  s = kernels.supported(x.astype(jnp.float32), q)
  assert not s.pallas and "float32" in s.reason
  s = kernels.supported(x, quant.quantize(jnp.asarray(_weights()), quant.FP8(granularity="block"), axis=-2))
  assert not s.pallas and "FP8 block scales" in s.reason
  with pytest.raises(ValueError, match="impl='mosaic_gpu'"):
    kernels.qmatmul(x.astype(jnp.float32), q, impl="mosaic_gpu")


LOWER_CASES = [(f, 2048, 512, 3) for f in FORMATS] + [
  ("int4_g128", 8192, 8192, 1),
  ("nvfp4", 4096, 14336, 16),
  ("int4_g32_minmax", 8192, 8192, 64),
]


@pytest.mark.parametrize("fmt,k,n,m", LOWER_CASES)
def test_lowers_for_cuda_within_shared_memory(fmt, k, n, m):
  """Pallas's Mosaic GPU lowering runs in full for cuda (layouts, TMA, wgmma shapes) and emits the mosaic_gpu
  custom call; one program's shared memory stays under 80 % of the 227 KiB an sm_90 block may have."""
  spec = SPECS[fmt]
  q = jax.eval_shape(lambda w: quant.quantize(w, spec, axis=-2), jax.ShapeDtypeStruct((k, n), jnp.float32))
  x = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
  f = jax.jit(lambda x, q: pallas_matmul(x, q, target="mosaic_gpu", interpret=False))
  assert "@mosaic_gpu" in export.export(f, platforms=["cuda"])(x, q).mlir_module()
  assert smem_bytes(x, q) <= 0.8 * 227 * 1024


@pytest.mark.parametrize("fmt", ["int4_g128", pytest.param("nvfp4", marks=pytest.mark.slow)])
def test_sampler_generate_lowers_with_mosaic_gpu_kernels(fmt, monkeypatch, request):
  """The whole sampler (prefill, the decode loop over the KV cache, scanned layers) lowers for cuda with dispatch as
  on an H200 whose jax has no Triton: all 14 projections (7 per layer body, prefill and decode) are Mosaic GPU."""
  import functools  # pylint: disable=g-import-not-at-top

  from lrl_jax.models import init_params  # pylint: disable=g-import-not-at-top
  from lrl_jax.sampler import SamplingConfig, generate, serve_params  # pylint: disable=g-import-not-at-top
  from tests.kernels._aot_cases import MODELS, SAMPLER_FORMATS  # pylint: disable=g-import-not-at-top

  cfg = MODELS["llama_1k"]
  monkeypatch.setattr(dispatch, "_backend", lambda: "gpu")
  monkeypatch.setattr(dispatch, "_gpu_compute_capability", lambda: 9.0)
  monkeypatch.setattr(mg, "triton_available", lambda: False)
  monkeypatch.setattr(dispatch._mm, "pallas_matmul", functools.partial(dispatch._mm.pallas_matmul, interpret=False))
  # The dispatch is decided at trace time: a jaxpr of the sampler's inner jits cached by an earlier test in this
  # process (Triton kernels for cuda, say) would be reused as it is, and the count below would meet its kernels;
  # and this test's Mosaic GPU jaxprs must not reach a later one.
  jax.clear_caches()
  request.addfinalizer(jax.clear_caches)
  served = jax.eval_shape(lambda: serve_params(init_params(cfg, jax.random.key(0)), SAMPLER_FORMATS[fmt]))
  fn = lambda params, prompts, valid: generate(
    params, prompts, valid, cfg, SamplingConfig(max_new_tokens=4), jax.random.key(0)
  )
  exp = export.export(jax.jit(fn), platforms=["cuda"])(
    served, jax.ShapeDtypeStruct((8, 32), jnp.int32), jax.ShapeDtypeStruct((8, 32), jnp.bool_)
  )
  text = exp.mlir_module()
  assert text.count("stablehlo.custom_call @mosaic_gpu_v2") == 14
  assert "__gpu$xla.gpu.triton" not in text
