"""The TPU kernels compile to TPU executables (Pallas -> Mosaic -> XLA:TPU) for v4, v5e, v5p and v6e, no TPU needed.

`make test-aot` (CI) puts the libtpu that matches jax on the path and runs these with LRL_JAX_REQUIRE_AOT=1,
where a missing libtpu fails instead of skipping. The reference is Mosaic's own compiler: block shapes against
each operand's memory tiling, layouts and VMEM allocation are checked exactly as on a TPU host.
"""

import functools
import importlib

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

from lrl_jax import quant
from lrl_jax.kernels import dispatch
from lrl_jax.kernels import tpu_aot as aot
from lrl_jax.models import init_params
from lrl_jax.sampler import SamplingConfig, serve_params
from tests.kernels._aot_cases import MODELS, SAMPLER_CASES, SAMPLER_FORMATS

generate_module = importlib.import_module("lrl_jax.sampler.generate")  # the package re-exports `generate`

pytestmark = pytest.mark.aot
pytest.importorskip("libtpu", reason="libtpu (make test-aot) compiles for TPU")

BASE = [(f, t, 4096, 4096, 16) for f in aot.FORMATS for t in aot.TOPOLOGIES]
DECODE = [
  (f, t, k, n, m)
  for f in ("int4_g128", "int4_g128_zp", "nvfp4", "fp8_channel")
  for t in ("v5e:2x2", "v6e:2x2")
  for k, n, m in ((8192, 8192, 1), (4096, 14336, 1), (8192, 8192, 64))
]


@pytest.mark.parametrize("fmt,topo,k,n,m", BASE + DECODE, ids=str)
def test_compiles_for_tpu(fmt, topo, k, n, m):
  """Every format on every generation, including v4 / v5e, which have no FP8 unit: Mosaic accepts the
  in-kernel e4m3 converts of NVFP4 / FP8 / MXFP8 there (numerics on the chip still unmeasured)."""
  r = aot.compile_kernel(aot.FORMATS[fmt], k, n, m, topology_name=topo)
  assert r.compiled, r.error
  assert r.plan.schedule == "k_grid" and k % r.plan.bk == 0


@pytest.mark.parametrize("fmt", ["int4_g128", "int4_g32_zp", "nvfp4", "fp8_channel"])
def test_f32_activations_compile_for_tpu(fmt):
  r = aot.compile_kernel(aot.FORMATS[fmt], 4096, 4096, 3, topology_name="v5e:2x2", x_dtype=jnp.float32)
  assert r.compiled, r.error


def _copy_block_kernel(z_ref, o_ref):
  o_ref[...] = z_ref[...]


@pytest.mark.parametrize("dtype,ok", [(jnp.int8, False), (jnp.bfloat16, True)])
def test_int8_blocks_of_8_rows_do_not_tile_which_is_why_zero_points_are_cast(dtype, ok):
  """Why `pallas_matmul` casts INT4 zero points to the scale's dtype on TPU: a (bk/G, bn) = (8, 256) block of a
  [K/G, N] = [32, 4096] operand compiles in bf16 (the scales' case) but not in int8, whose memory tiling is
  (32, 128) (Mosaic error E2002)."""
  rep = aot.chip("v5e:2x2")
  f = jax.jit(
    functools.partial(
      pl.pallas_call,
      _copy_block_kernel,
      out_shape=jax.ShapeDtypeStruct((32, 4096), dtype),
      grid=(4, 16),
      in_specs=[pl.BlockSpec((8, 256), lambda i, j: (i, j))],
      out_specs=pl.BlockSpec((8, 256), lambda i, j: (i, j)),
    )()
  )
  lowered = f.lower(jax.ShapeDtypeStruct((32, 4096), dtype, sharding=rep))
  if ok:
    lowered.compile()
  else:
    with pytest.raises(Exception, match="E2002|not divisible by tiling"):
      lowered.compile()


def test_cli_table(capsys):
  assert aot.main(["--topologies", "v5e:2x2", "--shapes", "4096x4096", "--m", "1", "--formats", "int4_g128_zp"]) == 0
  assert "| v5e:2x2 | 4096x4096 | 1 | int4_g128_zp | 16×256×1024 | 4 | yes |" in capsys.readouterr().out


@pytest.mark.parametrize("model,fmt", SAMPLER_CASES)
def test_sampler_generate_compiles_for_tpu_with_the_kernels(model, fmt, monkeypatch):
  """The whole sampler — prefill, the decode while-loop over the KV cache, scanned layers — with a served low-bit
  tree compiles for v5e with every projection on the Pallas kernel (dispatch as on a TPU host)."""
  cfg = MODELS[model]
  spec = SAMPLER_FORMATS[fmt]
  paths = []
  supported = dispatch.supported

  def spy(x, q, **kw):
    s = supported(x, q, **kw)
    paths.append(s.path)
    return s

  monkeypatch.setattr(dispatch, "_backend", lambda: "tpu")
  monkeypatch.setattr(dispatch, "supported", spy)
  # On a TPU host pallas_matmul compiles rather than interprets; jax's default backend here is the CPU.
  monkeypatch.setattr(dispatch._mm, "pallas_matmul", functools.partial(dispatch._mm.pallas_matmul, interpret=False))
  served = jax.eval_shape(lambda: serve_params(init_params(cfg, jax.random.key(0)), spec))
  rep = aot.chip("v5e:2x2")
  sds = lambda t: jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep), t)
  b, p = 8, 32
  args = sds(
    (
      served,
      jax.ShapeDtypeStruct((b, p), jnp.int32),
      jax.ShapeDtypeStruct((b, p), jnp.bool_),
      jax.eval_shape(lambda: jax.random.split(jax.random.key(0), b)),
    )
  )
  lowered = generate_module._generate.lower(
    *args,
    cfg=cfg,
    sampling=SamplingConfig(max_new_tokens=4),
    cache_dtype=jnp.dtype(jnp.bfloat16),
    act_spec=None,
    lora=None,
  )
  # 7 projections (q, k, v, o, gate, up, down) in the scanned layer body, once for prefill and once for decode.
  assert lowered.as_text().count("tpu_custom_call") == 14
  assert paths and set(paths) == {"pallas-mosaic-tpu"}
  lowered.compile()


@pytest.mark.parametrize("fmt", ["nvfp4", "int4_g128"])
def test_gradient_through_the_kernel_compiles_for_tpu(fmt, monkeypatch):
  """LoRA over a frozen low-bit base differentiates through `qmatmul`: the custom_vjp's forward is the Pallas
  kernel, its backward an XLA dot with ŵᵀ. Both compile for v5e in one executable."""
  monkeypatch.setattr(dispatch, "_backend", lambda: "tpu")
  monkeypatch.setattr(dispatch._mm, "pallas_matmul", functools.partial(dispatch._mm.pallas_matmul, interpret=False))
  rep = aot.chip("v5e:2x2")
  q = jax.eval_shape(
    lambda w: quant.quantize(w, aot.FORMATS[fmt], axis=-2), jax.ShapeDtypeStruct((4096, 4096), jnp.float32)
  )
  q = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep), q)
  x = jax.ShapeDtypeStruct((16, 4096), jnp.bfloat16, sharding=rep)
  loss = lambda x, q: dispatch.qmatmul(x, q).astype(jnp.float32).sum()
  lowered = jax.jit(jax.grad(loss)).lower(x, q)
  assert lowered.as_text().count("tpu_custom_call") == 1  # the forward kernel; dx is an XLA dot
  lowered.compile()
