"""`qlinear` and the linear-layout (nn.Linear [N, K]) Mosaic GPU kernel.

Numerics run in Mosaic GPU's interpret mode against the float64 reference of test_matmul (ŵ decoded from the
stored bytes with NumPy). The interpreter takes the kernel's operands through SMEM, so the register path (the
int4 -> bf16 conversion in the wgmma layout, ŵᵀ as wgmma's register operand) is checked by lowering for cuda
and reading the lowered kernel.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import export

from lrl_jax import quant
from lrl_jax.kernels import Unsupported, _mgpu_decode, dispatch, mosaic_model
from lrl_jax.kernels import linear as lin
from lrl_jax.kernels import mosaic_gpu as mg
from tests.kernels.test_matmul import E2M1, SPECS, _check_close, _np_dequant, _round, _served, _weights

N = 128  # two 64-row weight tiles


def _pair(spec, k, seed=0, n=N):
  q = quant.quantize(jnp.asarray(_weights(seed=seed, k=k, n=n)), spec, axis=-2)
  return q, lin.linear_layout(q)


# Half the formats in the default suite (one per scale kind: INT4 groups, zero points, e4m3 blocks, e8m0 blocks).
_DEFAULT_LAYOUT_FORMATS = ("int4_g32", "int4_g32_minmax", "nvfp4", "mxfp8")


@pytest.mark.parametrize(
  "fmt", [f if f in _DEFAULT_LAYOUT_FORMATS else pytest.param(f, marks=pytest.mark.slow) for f in SPECS]
)
def test_linear_layout_is_the_transpose_of_the_contract(fmt):
  """linear_layout(quantize(w, axis=-2)) == quantize(wᵀ, axis=-1) field for field; it dequantizes to ŵᵀ exactly."""
  w = jnp.asarray(_weights(seed=3, k=256, n=256))
  q = quant.quantize(w, SPECS[fmt], axis=-2)
  t = lin.linear_layout(q)
  direct = quant.quantize(w.T, SPECS[fmt], axis=-1)
  assert t.shape == (256, 256) and t.axis == -1
  for a, b in zip(jax.tree.leaves(t), jax.tree.leaves(direct)):
    np.testing.assert_array_equal(
      np.atleast_1d(np.asarray(a)).view(np.uint8), np.atleast_1d(np.asarray(b)).view(np.uint8)
    )
  np.testing.assert_array_equal(np.asarray(quant.dequantize(t)), np.asarray(quant.dequantize(q)).T)


def test_linear_layout_of_a_stack_and_rejects_other_layouts():
  w = jnp.asarray(np.random.default_rng(0).standard_normal((3, 64, 128)), jnp.float32)
  q = quant.quantize(w, quant.NVFP4(), axis=-2)  # a per-matrix global scale [3] rides along
  t = lin.linear_layout(q)
  assert t.shape == (3, 128, 64) and t.global_scale.shape == (3,)
  np.testing.assert_array_equal(np.asarray(quant.dequantize(t)), np.swapaxes(np.asarray(quant.dequantize(q)), -1, -2))
  with pytest.raises(ValueError, match=r"\[\.\., K, N\] weight quantized along K"):
    lin.linear_layout(quant.quantize(w, quant.Int4(group_size=32), axis=-1))
  with pytest.raises(TypeError, match="expected a QArray"):
    lin.linear_layout(jnp.ones((4, 4)))


# (spec, K, M, activation dtype): every group size, zero points, f32 scales, odd M, split-K, M > 64 (the default
# suite: g32, zero points, f32 scales, split-K, M > 64 and NVFP4; the other group sizes and f16 are `make test-slow`).
CASES = [
  (quant.Int4(group_size=32), 256, 1, jnp.bfloat16),
  (quant.Int4(group_size=32), 1024, 5, jnp.bfloat16),  # split-K 4, 2 steps per program
  pytest.param(quant.Int4(group_size=64), 512, 17, jnp.bfloat16, marks=pytest.mark.slow),
  pytest.param(quant.Int4(group_size=128), 1024, 3, jnp.bfloat16, marks=pytest.mark.slow),
  (quant.Int4(group_size=256), 2048, 100, jnp.bfloat16),  # one 104-row tile, a scale column per 2 steps
  pytest.param(quant.Int4(group_size=16), 256, 3, jnp.float16, marks=pytest.mark.slow),
  (quant.Int4(group_size=32, scheme="minmax"), 512, 17, jnp.bfloat16),  # zero points: (q − z)·s
  pytest.param(quant.Int4(group_size=64, scheme="minmax"), 1024, 1, jnp.float16, marks=pytest.mark.slow),
  (quant.Int4(group_size=32, scale_dtype="float32"), 256, 2, jnp.bfloat16),  # f32 scales: the f32 product
  (quant.NVFP4(), 256, 1, jnp.bfloat16),  # dec · (x @ (e2m1 · s_b)ᵀ): 16-column scale groups, 8 wgmma per step
  (quant.NVFP4(), 1024, 17, jnp.bfloat16),  # split-K
  pytest.param(quant.NVFP4(), 512, 100, jnp.bfloat16, marks=pytest.mark.slow),
]


@pytest.mark.parametrize("spec,k,m,dtype", CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_matches_float64_reference(spec, k, m, dtype):
  """x @ ŵᵀ as served (round_dtype(ŵ); NVFP4's dec after the sum) up to f32 summation order and the output
  rounding."""
  q, t = _pair(spec, k, seed=k + m)
  x = jnp.asarray(np.random.default_rng(m).standard_normal((m, k)), dtype)
  y = lin.mosaic_linear(x, t, interpret=True)
  assert y.shape == (m, N) and y.dtype == dtype
  _check_close(y, x, _served(q, dtype), "bf16")


def test_split_k_override_gives_the_same_values():
  q, t = _pair(quant.Int4(group_size=32), 1024, seed=1)
  x = jnp.asarray(np.random.default_rng(2).standard_normal((4, 1024)), jnp.bfloat16)
  assert lin.linear_plan(4, 1024, N, t).split_k == 4
  ys = [
    np.asarray(lin.mosaic_linear(x, t, split_k=s, stages=st, interpret=True), np.float32)
    for s, st in ((1, 2), (2, 4), (4, 1))
  ]
  for y in ys:
    _check_close(y, x, _round(_np_dequant(q), jnp.bfloat16), "bf16")


@pytest.mark.parametrize("spec", [quant.Int4(group_size=32), quant.NVFP4()], ids=lambda s: s.name)
def test_qlinear_leading_dims_and_gradient(spec):
  """[B, T, K] activations; dx through the custom_vjp equals autodiff of the XLA path; w gets zeros."""
  q, t = _pair(spec, 256, seed=4)
  x = jnp.asarray(np.random.default_rng(4).standard_normal((2, 3, 256)), jnp.bfloat16)
  r = jnp.asarray(np.random.default_rng(5).standard_normal((2, 3, N)), jnp.float32)
  y = lin.qlinear(x, t, impl="mosaic_gpu")
  assert y.shape == (2, 3, N)
  _check_close(y.reshape(6, N), x.reshape(6, 256), _served(q, jnp.bfloat16), "bf16")
  loss = lambda f: lambda x: jnp.sum(f(x).astype(jnp.float32) * r)  # noqa: E731
  g_kernel = jax.grad(loss(lambda x: lin.qlinear(x, t, impl="mosaic_gpu")))(x)
  g_xla = jax.grad(loss(lambda x: lin.xla_linear(x, t)))(x)
  np.testing.assert_array_equal(np.asarray(g_kernel, np.float32), np.asarray(g_xla, np.float32))
  gw = jax.grad(lambda t: jnp.sum(lin.qlinear(x, t, impl="mosaic_gpu").astype(jnp.float32)), allow_int=True)(t)
  assert float(jnp.abs(gw.scale).max()) == 0.0


def test_xla_linear_is_x_at_w_hat_transposed():
  q, t = _pair(SPECS["nvfp4"], 256, seed=6)
  x = jnp.asarray(np.random.default_rng(6).standard_normal((3, 256)), jnp.float32)
  y = lin.qlinear(x, t)  # CPU, auto: XLA
  _check_close(y, x, _np_dequant(q), "f32")


def test_dispatch_reasons(monkeypatch):
  _, t = _pair(quant.Int4(group_size=32), 256)
  x = jnp.zeros((1, 256), jnp.bfloat16)
  s = lin.supported_linear(x, t)
  assert (s.pallas, s.path) == (False, "xla") and "CPU" in s.reason
  s = lin.supported_linear(x, t, impl="mosaic_gpu")
  assert (s.pallas, s.path, s.target) == (True, "pallas-interpret", "mosaic_gpu")
  assert "float32" in lin.supported_linear(x.astype(jnp.float32), t, impl="mosaic_gpu").reason
  _, nv = _pair(SPECS["nvfp4"], 256)
  assert lin.supported_linear(x, nv, impl="mosaic_gpu").pallas
  assert "bfloat16 only" in lin.supported_linear(x.astype(jnp.float16), nv, impl="mosaic_gpu").reason
  _, mx = _pair(SPECS["mxfp8"], 256)
  assert "takes Int4 and NVFP4" in lin.supported_linear(x, mx, impl="mosaic_gpu").reason
  q_kn = quant.quantize(jnp.ones((256, 256)), quant.Int4(group_size=32), axis=-2)
  assert "axis -2" in lin.supported_linear(x, q_kn, impl="mosaic_gpu").reason
  with pytest.raises(ValueError, match="do not contract"):
    lin.supported_linear(jnp.zeros((1, 128), jnp.bfloat16), t)
  with pytest.raises(ValueError, match="impl must be"):
    lin.qlinear(x, t, impl="triton")
  with pytest.raises(ValueError, match=r"qlinear\(impl='mosaic_gpu'\): .*float32"):
    lin.qlinear(x.astype(jnp.float32), t, impl="mosaic_gpu")
  monkeypatch.setattr(dispatch, "_backend", lambda: "gpu")
  monkeypatch.setattr(dispatch, "_gpu_compute_capability", lambda: 8.0)
  assert "sm_90" in lin.supported_linear(x, t).reason
  monkeypatch.setattr(dispatch, "_gpu_compute_capability", lambda: 9.0)
  s = lin.supported_linear(x, t)
  assert (s.pallas, s.path) == (True, "pallas-mosaic-gpu")
  big = jnp.zeros((lin.MAX_M + 1, 256), jnp.bfloat16)
  assert "prefill path" in lin.supported_linear(big, t).reason
  assert lin.supported_linear(big, t, impl="mosaic_gpu").pallas
  monkeypatch.setattr(dispatch, "_backend", lambda: "tpu")
  assert "TPU" in lin.supported_linear(x, t).reason


@pytest.mark.parametrize(
  "n,k,spec,match",
  [
    (96, 256, quant.Int4(group_size=32), "N=96 is not a multiple of the 64"),
    (128, 1088, quant.Int4(group_size=64), "K=1088 is not a multiple of the 128"),
    (128, 512, quant.Int4(group_size=128), r"row of scales / zero points is \[8\] bytes"),
    (128, 256, quant.Int4(group_size=32, scheme="minmax"), r"\[16, 8\] bytes"),
  ],
)
def test_plans_refuse_with_the_reason(n, k, spec, match):
  t = jax.eval_shape(
    lambda w: lin.linear_layout(quant.quantize(w, spec, axis=-2)), jax.ShapeDtypeStruct((k, n), jnp.float32)
  )
  with pytest.raises(Unsupported, match=match):
    lin.linear_plan(1, k, n, t)


def test_mosaic_linear_names_bad_input():
  q, t = _pair(quant.Int4(group_size=32), 256)
  x = jnp.zeros((2, 256), jnp.bfloat16)
  with pytest.raises(ValueError, match=r"QArray \[N, K\] quantized along K"):
    lin.mosaic_linear(x, q)  # the [K, N] layout
  with pytest.raises(ValueError, match=r"are not \[M, K\]"):
    lin.mosaic_linear(jnp.zeros((2, 128), jnp.bfloat16), t)
  with pytest.raises(Unsupported, match="float32"):
    lin.mosaic_linear(x.astype(jnp.float32), t)


def test_scale_columns_fit_one_tma_copy():
  """A TMA copy takes <= 256 elements per dimension: the plan splits K until a program's scale tile fits, and says
  so when it cannot."""
  t = jax.eval_shape(
    lambda w: lin.linear_layout(quant.quantize(w, quant.Int4(group_size=16), axis=-2)),
    jax.ShapeDtypeStruct((8192, 28672), jnp.float32),
  )
  p = lin.linear_plan(1, 8192, 28672, t)  # 448 programs: no split for occupancy, but 512 scale columns
  assert p.split_k == 2 and 8192 // p.split_k // 16 == 256
  with pytest.raises(Unsupported, match="512 scale columns per program"):
    lin.linear_plan(1, 8192, 28672, t, split_k=1)
  assert (
    "@mosaic_gpu"
    in export.export(jax.jit(lambda x, t: lin.mosaic_linear(x, t, interpret=False)), platforms=["cuda"])(
      jax.ShapeDtypeStruct((1, 8192), jnp.bfloat16), t
    ).mlir_module()
  )


def test_pipeline_depth_fits_shared_memory():
  """Prefill-sized M with 256 NVFP4 scale columns per program (found by the lowering sweep: 227 KiB + 40 bytes at 4
  steps in flight): the plan keeps 3 steps, says why 4 do not fit, and the kernel lowers within sm_90's limit."""
  t = jax.eval_shape(
    lambda w: lin.linear_layout(quant.quantize(w, quant.NVFP4(), axis=-2)),
    jax.ShapeDtypeStruct((8192, 28672), jnp.float32),
  )
  p = lin.linear_plan(300, 8192, 28672, t)
  assert (p.mt, p.split_k, p.stages, 8192 // p.split_k // 16) == (128, 2, 3, 256)
  with pytest.raises(Unsupported, match=r"KiB of shared memory per program .*stages=4"):
    lin.linear_plan(300, 8192, 28672, t, stages=4)
  x = jax.ShapeDtypeStruct((300, 8192), jnp.bfloat16)
  assert mg.lowered_smem_bytes(lambda x, t: lin.mosaic_linear(x, t, interpret=False), x, t) <= 227 * 1024
  assert lin.linear_plan(1, 8192, 8192, t).stages == 4  # decode keeps the full depth


def test_split_k_override_is_checked():
  t = _pair(quant.Int4(group_size=32), 1024)[1]
  with pytest.raises(Unsupported, match="split_k=3"):
    lin.linear_plan(1, 1024, N, t, split_k=3)
  with pytest.raises(Unsupported, match="split_k=8"):  # 128 of K per split: under 2 steps
    lin.linear_plan(1, 1024, N, t, split_k=8)


LOWER = [(1, 4096, 4096, 128), (16, 4096, 14336, 128), (64, 8192, 8192, 128), (1, 8192, 8192, 32)]


@pytest.mark.parametrize("m,k,n,g", LOWER)
def test_lowers_for_cuda_with_registers_feeding_wgmma(m, k, n, g):
  """At the #3 shapes: the decoded tile never touches SMEM. Per 64 x 128 step and thread (64 codes): 32 calls of
  Mosaic GPU's int4 -> bf16 conversion (prmt, lop3, sub.bf16x2 per pair), and wgmma calls whose left operand is 4
  registers, N = the activation tile (8 rows at decode, not 64); shared memory small enough for several programs
  per SM."""
  t = jax.eval_shape(
    lambda w: lin.linear_layout(quant.quantize(w, quant.Int4(group_size=g), axis=-2)),
    jax.ShapeDtypeStruct((k, n), jnp.float32),
  )
  x = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
  p = lin.linear_plan(m, k, n, t)
  text = mosaic_model.lowered_kernel(x, t)
  assert text.count("sub.bf16x2") == 32
  mma = f"wgmma.mma_async.sync.aligned.m64n{p.mt}k16.f32.bf16.bf16 {{$0"
  calls = [line for line in text.splitlines() if mma in line]
  assert len(calls) == 128 // 16  # one per k16 of the step
  assert all("{$" in c.split("bf16.bf16", 1)[1].split("},", 1)[1] for c in calls)  # A: a register list
  smem = mg.lowered_smem_bytes(lambda x, t: lin.mosaic_linear(x, t, interpret=False), x, t)
  assert smem <= (40 if m == 1 else 104) * 1024  # ~5 programs per SM at decode


# The [64, 64] uint8 code tile's loads per thread and step: 8 32-bit ld.shared, or 2 ldmatrix.x4 (4 registers each)
# where jax >= 0.11 lowers the tile's load with ldmatrix.
_CODE_LOADS = 2 if jax.__version_info__ >= (0, 11) else 8


def test_static_model_of_the_lowered_step():
  """One 64 x 128 step per thread (64 codes, read as 8 32-bit shared-memory loads, or 2 ldmatrix.x4 on jax >= 0.11,
  plus 2 scale loads): 32 int4 -> bf16 pair conversions, the relayout's 16 permutes and 16 shuffles, 32 bf16x2 scale
  products, 8 wgmma k16; and the roofline of those counts puts 8192 x 8192 at M = 1 between the Triton kernel's 48 %
  and the HBM limit."""
  t = jax.eval_shape(
    lambda w: lin.linear_layout(quant.quantize(w, quant.Int4(), axis=-2)),
    jax.ShapeDtypeStruct((8192, 8192), jnp.float32),
  )
  text = mosaic_model.lowered_kernel(jax.ShapeDtypeStruct((1, 8192), jnp.bfloat16), t)
  mix, model = mosaic_model.predicted(1, 8192, 8192, text=text)
  assert {k: mix[k] for k in ("convert", "permute", "shuffle", "bf16x2", "smem_ld", "wgmma", "f32")} == dict(
    convert=32, permute=16, shuffle=16, bf16x2=32, smem_ld=_CODE_LOADS + 2, wgmma=8, f32=0
  )
  # Raw counts include the integer multiplies of the swizzled-address arithmetic, which LLVM hoists (below).
  assert model.bound == "int" and 0.48 < model.hbm_fraction < 0.9
  assert model.per_weight["issue"] < 6.2  # Triton's W4A16 loop: 6.2 machine instructions per weight
  # After CSE and hoisting: the 32 shifts are 8 (one per register: 4 pairs share it) and the lane selects and
  # swizzle arithmetic leave the loop; 8 nibble-sign xors stay.
  opt_mix, opt = mosaic_model.predicted(1, 8192, 8192, text=text, optimized=True)
  assert opt_mix == dict(mix, int32=18) and opt.hbm_fraction == 1.0 and opt.per_weight["issue"] < 4.0


def test_zero_points_and_float16_lower_for_cuda():
  for spec, dtype in (
    (quant.Int4(group_size=32, scheme="minmax"), jnp.bfloat16),
    (quant.Int4(group_size=128), jnp.float16),
  ):
    t = jax.eval_shape(
      lambda w, spec=spec: lin.linear_layout(quant.quantize(w, spec, axis=-2)),
      jax.ShapeDtypeStruct((4096, 4096), jnp.float32),
    )
    text = mosaic_model.lowered_kernel(jax.ShapeDtypeStruct((3, 4096), dtype), t)
    assert text.count("sub.bf16x2") == 32  # the decode to bf16 is the same; f16 takes the f32 product after it


@pytest.mark.parametrize(
  "spec", [quant.Int4(group_size=128), pytest.param(quant.NVFP4(), marks=pytest.mark.slow)], ids=lambda s: s.name
)
def test_sampler_generate_lowers_with_linear_kernels(monkeypatch, spec):
  """A model served with layout="linear" runs every projection through the linear kernel on an H200 (dispatch
  faked): the whole sampler (prefill at M = 256, the decode loop at M = 8, scanned layers) lowers for cuda with
  14 Mosaic GPU kernels (7 projections, prefill and decode) and nothing from Triton."""
  from lrl_jax.models import init_params  # pylint: disable=g-import-not-at-top
  from lrl_jax.sampler import SamplingConfig, generate, serve_params  # pylint: disable=g-import-not-at-top
  from tests.kernels._aot_cases import MODELS  # pylint: disable=g-import-not-at-top

  cfg = MODELS["llama_1k"]
  monkeypatch.setattr(dispatch, "_backend", lambda: "gpu")
  monkeypatch.setattr(dispatch, "_gpu_compute_capability", lambda: 9.0)
  served = jax.eval_shape(lambda: serve_params(init_params(cfg, jax.random.key(0)), spec, layout="linear"))
  fn = lambda params, prompts, valid: generate(
    params, prompts, valid, cfg, SamplingConfig(max_new_tokens=4), jax.random.key(0)
  )
  text = export.export(jax.jit(fn), platforms=["cuda"])(
    served, jax.ShapeDtypeStruct((8, 32), jnp.int32), jax.ShapeDtypeStruct((8, 32), jnp.bool_)
  ).mlir_module()
  assert text.count("stablehlo.custom_call @mosaic_gpu_v2") == 14
  assert "__gpu$xla.gpu.triton" not in text


def test_op_mix_cse_and_hoisting_on_a_synthetic_loop():
  """Repeats of a pure op on one value (through views and equal constants) count once; ops on loop-invariant values
  only (lane arithmetic) leave the loop; loads and what depends on them stay."""
  text = "\n".join(
    [
      "%tid = gpu.thread_id x",
      "scf.for %i = %a to %b step %c {",
      "  %lane = arith.remui %tid, %c4 : i32",
      "  %sel = arith.select %cond, %c1, %c2 : i32",
      "  %v = llvm.load %p : !llvm.ptr<3> -> vector<8xi4>",
      "  %r1 = vector.bitcast %v : vector<8xi4> to vector<1xi32>",
      "  %e1 = vector.extract %r1[0] : i32 from vector<1xi32>",
      "  %k1 = arith.constant 4 : i32",
      "  %s1 = arith.shrui %e1, %k1 : i32",
      "  %r2 = vector.bitcast %v : vector<8xi4> to vector<1xi32>",
      "  %e2 = vector.extract %r2[0] : i32 from vector<1xi32>",
      "  %k2 = arith.constant 4 : i32",
      "  %s2 = arith.shrui %e2, %k2 : i32",
      "  %x = arith.xori %s2, %sel : i32",
      "}",
    ]
  )
  assert mosaic_model.loop_op_mix(text)["int32"] == 4  # select, 2 shifts, xor (remui is not a counted kind)
  opt = mosaic_model.loop_op_mix(text, optimized=True)
  assert (opt["int32"], opt["smem_ld"]) == (2, 1)  # one shift, the xor; the select is hoisted


@pytest.mark.slow
def test_lowering_sweep():
  """70 random configurations (seed 0) of K, N, G, M, zero points and activation dtype, and 20 of NVFP4: every plan
  the kernel accepts lowers for cuda (the sweep that found the 256-element TMA box limit); the rest are refused with
  a reason."""
  import itertools  # pylint: disable=g-import-not-at-top
  import random  # pylint: disable=g-import-not-at-top

  combos = list(
    itertools.product(
      [1024, 2048, 4096, 8192, 14336, 16384],
      [64, 512, 4096, 14336, 28672],
      [16, 32, 64, 128, 256],
      [1, 8, 17, 64, 100, 128, 300, 512],
      [False, True],
      [jnp.bfloat16, jnp.float16],
    )
  )
  random.Random(0).shuffle(combos)

  def lowers(spec, k, n, m, dtype) -> bool:  # True: lowered for cuda; False: refused by the plan with a reason
    t = jax.eval_shape(
      lambda w: lin.linear_layout(quant.quantize(w, spec, axis=-2)), jax.ShapeDtypeStruct((k, n), jnp.float32)
    )
    try:
      lin.linear_plan(m, k, n, t)
    except Unsupported as e:
      assert str(e)
      return False
    f = jax.jit(lambda x, t: lin.mosaic_linear(x, t, interpret=False))
    assert "@mosaic_gpu" in export.export(f, platforms=["cuda"])(jax.ShapeDtypeStruct((m, k), dtype), t).mlir_module()
    return True

  assert (
    sum(
      lowers(quant.Int4(group_size=g, scheme="minmax" if zp else "absmax"), k, n, m, dtype)
      for k, n, g, m, zp, dtype in combos[:70]
    )
    >= 60
  )
  # NVFP4 (bf16 activations): 20 configurations of K, N, M.
  nv = list(
    itertools.product(
      [1024, 2048, 4096, 8192, 14336, 16384], [64, 512, 4096, 14336, 28672], [1, 8, 17, 64, 100, 128, 300, 512]
    )
  )
  random.Random(1).shuffle(nv)
  lowered = sum(lowers(quant.NVFP4(), k, n, m, jnp.bfloat16) for k, n, m in nv[:20])
  assert lowered >= 15


def _prmt(a, b, sel):
  """PTX `prmt.b32 d, a, b, sel` (default mode), NumPy uint32: byte i of d is byte (sel >> 4i) & 7 of the 8 bytes
  {b, a} (a: bytes 0-3), or, when (sel >> 4i) & 8, that byte's bit 7 replicated over all 8 bits."""
  src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
  out = np.zeros_like(a)
  for i in range(4):
    nib = (sel >> (4 * i)) & 0xF
    byte = src[nib & 7]
    if nib & 8:
      byte = np.where(byte & 0x80, np.uint32(0xFF), np.uint32(0))
    out |= byte.astype(np.uint32) << np.uint32(8 * i)
  return out


def _bf16_bits_value(bits):
  """float64 value of bf16 bit patterns (uint16), subnormals included."""
  sign = np.where(bits & 0x8000, -1.0, 1.0)
  e, m = (bits >> 7) & 0xFF, (bits & 0x7F).astype(np.float64)
  return sign * np.where(e == 0, m / 128 * 2.0**-126, (1 + m / 128) * 2.0 ** (e.astype(np.float64) - 127))


def test_e2m1_decode_bits_are_exact_for_every_byte_and_position():
  """The kernel's NVFP4 decode (`e2m1_pair_bits`, the very function that builds its MLIR) run in NumPy on every code
  byte at every byte position of a register, with random neighbours: each pair of bf16 is e2m1(lo), e2m1(hi) times
  2^-126 exactly; times the kernel's bf16 block scale s_b · 2^119 it is e2m1 · s_b · 2^-7 exactly, a bf16 value,
  for every finite e4m3 s_b. (The GPU's bf16 multiply must keep the subnormal ±0.5 · 2^-126 input, as Marlin-FP4's
  decode needs too: run on a device by tests/device.)"""
  rng = np.random.default_rng(0)
  ops = dict(
    andi=np.bitwise_and,
    shrui=np.right_shift,
    muli=lambda a, b: (a * b) & np.uint32(0xFFFFFFFF),
    prmt=_prmt,
    const=np.uint32,
  )
  byte = np.arange(256, dtype=np.uint32)
  table = np.where(np.arange(16) & 8, -1.0, 1.0) * E2M1[np.arange(16) & 7]
  for part in range(4):
    r = rng.integers(0, 2**32, 256, dtype=np.uint64).astype(np.uint32)
    r = (r & ~np.uint32(0xFF << (8 * part))) | (byte << np.uint32(8 * part))
    out = _mgpu_decode.e2m1_pair_bits(r, part, **ops)
    lo, hi = _bf16_bits_value(out & 0xFFFF), _bf16_bits_value(out >> 16)
    np.testing.assert_array_equal(lo, table[byte & 0xF] * 2.0**-126)
    np.testing.assert_array_equal(hi, table[byte >> 4] * 2.0**-126)
  s_b = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
  s_b = s_b[np.isfinite(s_b)]
  lifted = np.asarray(jnp.asarray(s_b * 2.0**119, jnp.float32).astype(jnp.bfloat16).astype(jnp.float32), np.float64)
  np.testing.assert_array_equal(lifted, s_b * 2.0**119)  # the kernel's bf16 scale tile is exact
  prod = (table[:, None] * 2.0**-126) * lifted[None, :]
  np.testing.assert_array_equal(prod, table[:, None] * s_b[None, :] * 2.0**-7)
  np.testing.assert_array_equal(prod.astype(ml_dtypes.bfloat16).astype(np.float64), prod)  # one exact bf16


@pytest.mark.parametrize("m,k,n", [(1, 4096, 4096), (16, 4096, 14336), (1, 8192, 8192)])
def test_nvfp4_lowers_for_cuda_with_registers_feeding_wgmma(m, k, n):
  """NVFP4 at the #3 shapes: the E2M1 decode is one byte permute per pair of codes in registers (32 per 64-code step
  and thread, no int4 conversion), 8 wgmma k16 per step with a register A operand (one per 16-column scale group),
  and shared memory small enough for several programs per SM."""
  t = jax.eval_shape(
    lambda w: lin.linear_layout(quant.quantize(w, quant.NVFP4(), axis=-2)), jax.ShapeDtypeStruct((k, n), jnp.float32)
  )
  x = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
  p = lin.linear_plan(m, k, n, t)
  assert (p.group, p.slices, p.width) == (16, 8, 16)
  text = mosaic_model.lowered_kernel(x, t)
  assert "sub.bf16x2" not in text
  assert sum("prmt.b32 $0, $1, $2, 0x8" in line for line in mosaic_model._loop_body(text)) == 32
  mma = f"wgmma.mma_async.sync.aligned.m64n{p.mt}k16.f32.bf16.bf16 {{$0"
  calls = [line for line in text.splitlines() if mma in line]
  assert len(calls) == 8 and all("{$" in c.split("bf16.bf16", 1)[1].split("},", 1)[1] for c in calls)
  smem = mg.lowered_smem_bytes(lambda x, t: lin.mosaic_linear(x, t, interpret=False), x, t)
  assert smem <= 64 * 1024


def test_nvfp4_static_model_of_the_lowered_step():
  """Per 64-code step and thread: the 16 permutes and 16 shuffles of the relayout (as INT4), 32 decode permutes, 32
  bf16x2 scale products, 8 wgmma; 14 more shared-memory loads than INT4 G = 128 (two scale values per 16 columns,
  not per step). After
  CSE and hoisting, about one integer instruction per code more than INT4: still inside the model's HBM budget."""
  t = jax.eval_shape(
    lambda w: lin.linear_layout(quant.quantize(w, quant.NVFP4(), axis=-2)),
    jax.ShapeDtypeStruct((8192, 8192), jnp.float32),
  )
  text = mosaic_model.lowered_kernel(jax.ShapeDtypeStruct((1, 8192), jnp.bfloat16), t)
  mix, _ = mosaic_model.predicted(1, 8192, 8192, quant.NVFP4(), text=text)
  assert {k: mix[k] for k in ("convert", "permute", "shuffle", "bf16x2", "smem_ld", "wgmma", "f32")} == dict(
    convert=0, permute=48, shuffle=16, bf16x2=32, smem_ld=_CODE_LOADS + 16, wgmma=8, f32=0
  )
  _, opt = mosaic_model.predicted(1, 8192, 8192, quant.NVFP4(), text=text, optimized=True)
  _, opt_int4 = mosaic_model.predicted(1, 8192, 8192, quant.Int4(), optimized=True)
  assert opt.bound == "int" and 0.5 < opt.per_weight["int"] - opt_int4.per_weight["int"] < 1.5
  assert opt.hbm_fraction >= 0.7
