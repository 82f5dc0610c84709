"""qmatmul / supported: which path runs and why; both paths compute x @ dequantize(q, x.dtype)."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lrl_jax import kernels, quant
from lrl_jax.kernels import dispatch


def _q(k=256, n=256, spec=quant.Int4(group_size=64), axis=-2):
  w = np.random.default_rng(0).standard_normal((k, n)).astype(np.float32)
  return quant.quantize(jnp.asarray(w), spec, axis=axis)


def _ref(x, q):
  """float64 x @ ŵ, ŵ rounded to x.dtype (what both paths compute; NVFP4: unrounded, `quant.qdot`)."""
  w = np.asarray(quant.dequantize(q, jnp.float32 if isinstance(q.spec, quant.NVFP4) else x.dtype), np.float64)
  return np.asarray(x.astype(jnp.float32), np.float64) @ w


@pytest.fixture
def on_backend(monkeypatch):
  """Makes qmatmul dispatch as if on `name` (the kernel itself still runs in interpret mode on CPU)."""

  def set_backend(name):
    monkeypatch.setattr(dispatch, "_backend", lambda: name)
    monkeypatch.setattr(dispatch, "_logged", set())

  return set_backend


def test_cpu_default_is_xla_and_says_why():
  q = _q()
  x = jnp.ones((3, 256), jnp.bfloat16)
  s = kernels.supported(x, q)
  assert not s and s.path == "xla" and "CPU" in s.reason
  s = kernels.supported(x, q, impl="pallas")
  assert s and s.path == "pallas-interpret"
  y = kernels.qmatmul(x, q)
  np.testing.assert_allclose(np.asarray(y, np.float64), _ref(x, q), rtol=2**-8, atol=1e-2)


@pytest.mark.parametrize("backend,path", [("gpu", "pallas-triton"), ("tpu", "pallas-mosaic-tpu")])
def test_accelerator_picks_the_kernel(on_backend, backend, path):
  on_backend(backend)
  q = _q()
  x = jnp.asarray(np.random.default_rng(1).standard_normal((17, 256)), jnp.bfloat16)
  s = kernels.supported(x, q)
  assert s.pallas and s.path == path
  y = kernels.qmatmul(x, q)
  np.testing.assert_allclose(np.asarray(y, np.float64), _ref(x, q), rtol=2**-8, atol=1e-2)
  x32 = x.astype(jnp.float32)
  s = kernels.supported(x32, q)
  if backend == "gpu":  # exact f32 has no tensor-core dot and spills on sm_90 (test_triton_aot.py): XLA
    assert not s.pallas and "float32" in s.reason
  else:
    assert s.pallas
  np.testing.assert_allclose(np.asarray(kernels.qmatmul(x32, q), np.float64), _ref(x32, q), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("backend,bm", [("gpu", 64), ("tpu", 64)])
def test_prefill_sized_m_takes_xla(on_backend, backend, bm):
  """More than MAX_WEIGHT_PASSES row tiles (one read of the weights each): XLA, unless the kernel is asked for."""
  on_backend(backend)
  q = _q()
  edge = bm * dispatch.MAX_WEIGHT_PASSES
  assert kernels.supported(jnp.zeros((edge, 256), jnp.bfloat16), q).pallas
  s = kernels.supported(jnp.zeros((3, edge // 3 + 1, 256), jnp.bfloat16), q)  # leading dims count as M
  m = 3 * (edge // 3 + 1)
  assert not s.pallas and f"M={m}: {-(-m // bm)} passes" in s.reason and "prefill" in s.reason
  assert kernels.supported(jnp.zeros((edge + 1, 256), jnp.bfloat16), q, impl="pallas").pallas


def test_unsupported_shape_falls_back_and_logs_why_once(on_backend, caplog):
  on_backend("gpu")
  q = _q(n=200)  # N=200: no power-of-two column tile divides it
  x = jnp.asarray(np.random.default_rng(2).standard_normal((3, 256)), jnp.bfloat16)
  s = kernels.supported(x, q)
  assert not s and s.path == "xla"
  assert "no legal tile divides N=200" in s.reason
  with caplog.at_level(logging.INFO, logger="lrl_jax.kernels"):
    y1 = kernels.qmatmul(x, q)
    y2 = kernels.qmatmul(x, q)
  msgs = [r.getMessage() for r in caplog.records if "N=200" in r.getMessage()]
  assert len(msgs) == 1, msgs  # once per reason
  np.testing.assert_allclose(np.asarray(y1, np.float64), _ref(x, q), rtol=2**-8, atol=1e-2)
  np.testing.assert_array_equal(np.asarray(y1), np.asarray(y2))
  with pytest.raises(ValueError, match=r"impl='pallas'.*N=200"):
    kernels.qmatmul(x, q, impl="pallas")


def test_other_fallback_reasons(on_backend):
  on_backend("tpu")
  x = jnp.ones((2, 256), jnp.float32)
  s = kernels.supported(x, _q(spec=quant.FP8(granularity="block")))
  assert not s and "Mosaic" in s.reason
  s = kernels.supported(jnp.ones((2, 256), jnp.float32), _q(axis=-1))
  assert not s and "axis" in s.reason
  w = jnp.asarray(np.random.default_rng(3).standard_normal((2, 256, 128)), jnp.float32)
  qs = quant.quantize(w, quant.Int4(), axis=-2)
  s = kernels.supported(x, qs)
  assert not s and "stack" in s.reason
  assert kernels.supported(x, _q(), impl="xla").reason == "impl='xla' requested"


def test_fp8_formats_need_sm89(on_backend, monkeypatch):
  on_backend("gpu")
  monkeypatch.setattr(dispatch, "_gpu_compute_capability", lambda: 8.0)
  x = jnp.ones((2, 256), jnp.bfloat16)
  s = kernels.supported(x, _q(spec=quant.NVFP4()))
  assert not s and "sm_89" in s.reason and "sm_8" in s.reason
  assert kernels.supported(x, _q()).pallas  # INT4 needs no FP8 conversion


def test_errors():
  q = _q()
  with pytest.raises(ValueError, match="do not contract"):
    kernels.qmatmul(jnp.ones((2, 128)), q)
  with pytest.raises(TypeError, match="QArray"):
    kernels.qmatmul(jnp.ones((2, 256)), jnp.ones((256, 256)))
  with pytest.raises(ValueError, match="impl must be"):
    kernels.qmatmul(jnp.ones((2, 256)), q, impl="cuda")


def test_qmatmul_under_jit_and_grad(on_backend):
  on_backend("gpu")
  q = _q(spec=quant.NVFP4())
  x = jnp.asarray(np.random.default_rng(4).standard_normal((3, 256)), jnp.float32)
  f = jax.jit(lambda x: jnp.sum(kernels.qmatmul(x, q) ** 2))
  dx = jax.grad(f)(x)
  y = _ref(x, q)
  w = np.asarray(quant.dequantize(q), np.float64)
  # Per element, relative to the magnitudes summed (f32 summation in the forward and the backward dot).
  err = np.abs(np.asarray(dx, np.float64) - 2 * y @ w.T)
  assert np.all(err <= 1e-5 * (np.abs(2 * y) @ np.abs(w).T)), np.max(err / (np.abs(2 * y) @ np.abs(w).T))
