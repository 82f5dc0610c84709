"""`qlinear`: y = x @ ŵᵀ for a low-bit weight stored the way `nn.Linear` stores it, [N, K] quantized along K.

Why a second layout. The kernels of `matmul.py` read the contract's [K, N] layout (`quantize(w, axis=-2)`:
two K-neighbours per byte, N contiguous). On Hopper the fast way to feed decoded weights to the tensor cores
is as `wgmma`'s *left* operand, straight from registers: no shared-memory round trip for the decoded tile
(kernels/README.md puts that round trip at 11-19 bytes of SMEM traffic per HBM byte for the [K, N] Mosaic
GPU kernel, against about 7 available). The left operand is ŵᵀ [N-tile, K-chunk] with K minor, so the codes
must be stored K-minor: [N, K/2] bytes, which is `quantize(w.T, axis=-1)`, the nn.Linear / HF /
compressed-tensors orientation. `linear_layout(q)` turns a [K, N] QArray into it (a transpose of codes and
scales, exact); `dequantize(linear_layout(q)) == dequantize(q).T` bit for bit.

The Mosaic GPU kernel (W4A16: `Int4`, bf16 / f16 activations), "swap AB": yᵀ = ŵᵀ xᵀ.
  * Grid (N/64, M/mt, S): one warpgroup per program owns 64 weight rows (the `wgmma` M), mt activation rows
    (the `wgmma` N: M rounded up to 8, at most 128, so decode pads 1 -> 8 rows, not 64) and K/S of the
    contraction (split-K S).
  * `plgpu.emit_pipeline` brings per step (TMA, `stages` steps in flight) the code tile [64, bk] as int4 (a
    bitcast of the uint8 codes; 64 bytes per row, 64-byte swizzle) and the activation tile [mt, bk] (128-byte
    swizzle). The program's scales (and zero points) [64, K/S/G] are copied to SMEM once, before the loop.
  * Decode in registers, Mosaic GPU's own int4 path: load in the `WGMMA_UPCAST_4X` layout (one 32-bit register
    per 8 codes), flip bit 3 of every nibble (one xor per 8 codes: the stored q + 8 becomes q in two's
    complement), relayout to the `wgmma` register layout (a lane shuffle and a byte permute per register, on
    the 4-bit data), and `astype(bfloat16)`, whose sequence (`prmt`, `lop3`, `sub.bf16x2`: 3 instructions per
    pair of codes) is the CUTLASS int4 -> bf16 conversion.
  * Scales per group of G columns: one column of the SMEM scale tile, read in the row layout of the `wgmma`
    register layout and broadcast along K in registers. ŵ = (q − z)·s in bf16 for bf16 x with bf16 scales
    (exact: q − z is a small integer and one bf16 rounding of the exact product equals rounding the f32
    product, as `matmul._int4_tile_t` argues), else in f32 then rounded to x.dtype: `dequantize`'s values.
  * `wgmma(acc, ŵᵀ_g, xᵀ_g)` per group slice of the chunk (ŵᵀ from registers, xᵀ the transposed view of the
    swizzled activation tile), f32 accumulator [64, mt].
  * Partials [S, N, m_pad] f32, summed and transposed by XLA (at M = 1: 64 KiB per split for N = 8192).

Status (2026-11-29): no GPU. Numerics run in Mosaic GPU's interpret mode on CPU against float64, where the
interpreter's limits (no register operand for `wgmma`, no transposed operand views, no register layouts)
make the kernel route ŵᵀ and xᵀ through SMEM scratch: it checks the indexing and the arithmetic, not the
register path. The register path is checked by lowering for `cuda` (`jax.export`, Pallas's full Mosaic GPU
lowering: layouts, relayouts, TMA, `wgmma` shapes). Not compiled to machine code, not timed.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from lrl_jax import quant
from lrl_jax.kernels.blocks import Unsupported
from lrl_jax.kernels import dispatch
from lrl_jax.kernels.dispatch import Support

__all__ = ["linear_layout", "qlinear", "supported_linear", "xla_linear", "mosaic_linear", "LinearPlan",
           "linear_plan", "lowered_kernel", "loop_op_mix"]

log = logging.getLogger("lrl_jax.kernels")
_logged: set[str] = set()

WGMMA_M = 64  # weight rows per program: the wgmma M
_BK = 128  # logical K per pipeline step: a 64-byte row of int4 codes, a 256-byte row of bf16 activations
_MT_MAX = 128  # activation rows per program: the wgmma N (multiple of 8, <= 256); 128 keeps acc at 64 regs
# Split-K target: about 4 programs per SM of an H200 (132 SMs). A program holds ~30 KiB of shared memory and few
# registers, so all of them are resident at once; 4 per SM keep 4 x 4 steps x 4 KiB = 64 KiB of codes in flight per
# SM, against the ~25 KiB Little's law asks (4.8 TB/s x ~0.7 us / 132). Reasoning, not timed: the device run sweeps
# split_k (scripts/device_check.sh).
_MAX_PROGRAMS = 528
_STAGES = 4


def linear_layout(q: quant.QArray) -> quant.QArray:
  """The [.., N, K] form (quantized along its last axis) of a weight QArray [.., K, N] quantized along K.

  Same codes, scales and zero points with the last two axes swapped (leading axes, a stack of layers, stay):
  `dequantize(linear_layout(q)) == swapaxes(dequantize(q), -1, -2)` exactly, and for a matrix it equals
  `quantize(w.T, spec, axis=-1)` field for field. Do it once per weight (at load or sync), not per call: it
  copies the codes. `sampler.serve_params(..., layout="linear")` serves a whole model this way.
  """
  if not isinstance(q, quant.QArray):
    raise TypeError(f"linear_layout: expected a QArray, got {type(q).__name__}")
  if q.ndim < 2 or q.axis != -2:
    raise ValueError(f"linear_layout: expected a [.., K, N] weight quantized along K (axis=-2); got shape "
                     f"{q.shape}, axis {q.axis}")
  t = lambda a: None if a is None else jnp.swapaxes(a, -1, -2)  # noqa: E731
  return dataclasses.replace(q, codes=t(q.codes), scale=t(q.scale), zero_point=t(q.zero_point), axis=-1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LinearPlan:
  """The tiles of one `mosaic_linear` call.

  Attributes:
    mt: activation rows per program (the wgmma N): M rounded up to 8, at most 128.
    m_pad: M rounded up to whole row tiles.
    bk: logical K per pipeline step.
    split_k: programs sharing one output tile along K (partials summed by XLA).
    group: the INT4 group size G.
    stages: pipeline steps in flight.
  """

  mt: int
  m_pad: int
  bk: int
  split_k: int
  group: int
  stages: int = _STAGES

  @property
  def slices(self) -> int:
    """wgmma calls per step: one per scale group in the chunk (G < bk), else one."""
    return max(1, self.bk // self.group)


def linear_plan(m: int, k: int, n: int, q: quant.QArray, *, split_k: int | None = None,
                stages: int = _STAGES) -> LinearPlan:
  """The tile plan of x [m, k] @ ŵᵀ for w [n, k], or `Unsupported` naming what does not fit.

  split_k: programs per output tile along K; None picks it (see `_MAX_PROGRAMS`). stages: steps in flight.
  """
  spec = q.spec
  if not isinstance(spec, quant.Int4):
    raise Unsupported(f"{spec.name}: the linear-layout kernel is W4A16 (Int4) only; other formats take XLA")
  g = spec.group_size
  if g % 16 or not (g <= _BK and _BK % g == 0 or g % _BK == 0):
    raise Unsupported(f"{spec.name}: group size {g} is not a multiple of 16 that divides or is divided by "
                      f"the {_BK}-wide K step")
  if n % WGMMA_M:
    raise Unsupported(f"{spec.name}: N={n} is not a multiple of the {WGMMA_M} weight rows of one wgmma")
  if k % _BK:
    raise Unsupported(f"{spec.name}: K={k} is not a multiple of the {_BK}-wide K step")
  sbytes = jnp.dtype(q.scale.dtype).itemsize
  per_row = [(k // g) * sbytes] + ([k // g] if q.zero_point is not None else [])
  if any(b % 16 for b in per_row):
    raise Unsupported(f"{spec.name}: a row of scales / zero points is {per_row} bytes (K={k}, G={g}); TMA "
                      "needs a multiple of 16")
  mt = min(-(-m // 8) * 8, _MT_MAX)
  m_pad = -(-m // mt) * mt
  programs = (n // WGMMA_M) * (m_pad // mt)

  def split_ok(s: int) -> bool:  # >= 2 steps per split, whole groups, 16-byte scale / zero-point boxes
    ks = k // s
    return (k % s == 0 and ks % _BK == 0 and ks >= 2 * _BK and ks % g == 0
            and all((b // s) % 16 == 0 for b in per_row))

  if split_k is not None:
    if split_k < 1 or (split_k > 1 and not split_ok(split_k)):
      raise Unsupported(f"{spec.name}: split_k={split_k} does not cut K={k} into whole groups of >= 2 steps "
                        "with 16-byte scale rows")
  else:
    split_k = 1
    while split_k < 8 and programs * split_k * 2 <= _MAX_PROGRAMS and split_ok(split_k * 2):
      split_k *= 2
  if stages < 1:
    raise Unsupported(f"{spec.name}: stages={stages}; at least 1 step in flight")
  return LinearPlan(mt=mt, m_pad=m_pad, bk=_BK, split_k=split_k, group=g, stages=stages)


def _swizzled(cols: int, bits: int) -> tuple:
  """SMEM transforms of a [rows, cols] operand tile with `bits`-bit elements: the widest swizzle."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top
  s = plgpu.find_swizzle(cols * bits)
  return (plgpu.TilingTransform((8, s * 8 // bits)), plgpu.SwizzleTransform(s))


def _flip_nibble_sign(q):
  """q + 8 stored in each nibble -> q in two's complement: xor 0x8 per nibble, one 32-bit xor per 8 codes."""
  from jax.experimental import mosaic as _  # noqa: F401  pylint: disable=g-import-not-at-top
  from jax.experimental.mosaic import gpu as mgpu  # pylint: disable=g-import-not-at-top
  from jax.experimental.mosaic.gpu import utils as mgpu_utils  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top
  from jax._src.lib.mlir import ir  # pylint: disable=g-import-not-at-top
  from jax._src.lib.mlir.dialects import arith  # pylint: disable=g-import-not-at-top

  layout = plgpu.Layout.WGMMA_UPCAST_4X

  @plgpu.inline_mgpu(arg_types=(layout,),
                     return_type=plgpu.ShapeDtypeStruct(q.shape, jnp.int4, layout=layout))
  def flip(_, a):
    i32 = ir.IntegerType.get_signless(32)
    mask = arith.constant(i32, ir.IntegerAttr.get(i32, 0x88888888 - (1 << 32)))
    regs = np.empty_like(a.registers)
    for idx, r in np.ndenumerate(a.registers):
      regs[idx] = mgpu_utils.bitcast(arith.xori(mgpu_utils.bitcast(r, i32), mask), r.type)
    return mgpu.FragmentedArray(_registers=regs, _layout=a.layout, _is_signed=True)

  return flip(q)


def _kernel(x_g, c_g, s_g, *rest, s_smem, z_smem, o_smem, bar, w_scr, xt_scr, p: LinearPlan, has_zp: bool,
            x_dtype, bf16_math: bool, interpret: bool):
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top
  z_g = rest[0] if has_zp else None
  o_g = rest[int(has_zp)]
  j, i, sp = lax.axis_index("n"), lax.axis_index("m"), lax.axis_index("s")
  ks = x_g.shape[1] // p.split_k
  ns = ks // p.group  # scale columns of this program
  steps = ks // p.bk
  rows = pl.ds(j * WGMMA_M, WGMMA_M)
  cols = pl.ds(sp * ns, ns)
  plgpu.copy_gmem_to_smem(s_g.at[rows, cols], s_smem, bar)
  if has_zp:
    plgpu.copy_gmem_to_smem(z_g.at[rows, cols], z_smem, bar)
  plgpu.barrier_wait(bar)
  width = p.bk // p.slices  # K columns per wgmma call

  def column(ref, col):
    """Column `col` of a [64, ns] SMEM tile as a [64] vector in the row layout of the wgmma layout."""
    if interpret:
      return ref[:, col]
    return plgpu.load(ref, (slice(None), col), layout=plgpu.Layout.WGMMA.reduce(1), optimized=False)

  def decode(c_s):
    """The [64, bk] code tile as q (bf16, exact), in the wgmma register layout."""
    if interpret:  # the interpreter has no register layouts; same values
      return ((c_s[...].astype(jnp.int32) & 0xF) - 8).astype(jnp.bfloat16)
    q = plgpu.load(c_s, (), layout=plgpu.Layout.WGMMA_UPCAST_4X)
    q = plgpu.layout_cast(_flip_nibble_sign(q), plgpu.Layout.WGMMA)
    return q.astype(jnp.bfloat16)

  def body(idx, x_s, c_s, acc_ref):
    (t,) = idx
    q = decode(c_s)
    for g in range(p.slices):
      col = t * p.slices + g if p.group <= p.bk else t // (p.group // p.bk)
      qg = q if p.slices == 1 else q[:, g * width:(g + 1) * width]
      if has_zp:
        qg = qg - lax.broadcast_in_dim(column(z_smem, col).astype(jnp.bfloat16), qg.shape, (0,))
      s = column(s_smem, col)
      if bf16_math:
        w = qg * lax.broadcast_in_dim(s, qg.shape, (0,))
      else:
        w = (qg.astype(jnp.float32) * lax.broadcast_in_dim(s.astype(jnp.float32), qg.shape, (0,)))
        w = w.astype(x_dtype)
      if interpret:  # the interpreter's wgmma reads both operands from SMEM, untransposed
        w_scr[...] = w
        xt_scr[...] = x_s[:, pl.ds(g * width, width)].T
        plgpu.wgmma(acc_ref, w_scr, xt_scr)
      else:
        xt = plgpu.transpose_ref(x_s, (1, 0))
        if p.slices > 1:
          xt = xt.at[pl.ds(g * width, width), :]
        plgpu.wgmma(acc_ref, w, xt)
    plgpu.wgmma_wait(0)  # the code and activation tiles are refilled by the pipeline

  # Swizzle atoms no wider than one wgmma's K slice: a slice of the transposed view starts on an atom.
  x_spec = plgpu.BlockSpec((p.mt, p.bk), lambda t: (i, sp * steps + t), transforms=_swizzled(width, 16))
  c_spec = plgpu.BlockSpec((WGMMA_M, p.bk), lambda t: (j, sp * steps + t), transforms=_swizzled(p.bk, 4))

  def run(acc_ref):
    plgpu.emit_pipeline(functools.partial(body, acc_ref=acc_ref), grid=(steps,), in_specs=[x_spec, c_spec],
                        max_concurrent_steps=p.stages)(x_g, c_g)
    return acc_ref[...]

  o_smem[...] = pl.run_scoped(run, plgpu.ACC((WGMMA_M, p.mt), jnp.float32))
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(o_smem, o_g.at[sp, rows, pl.ds(i * p.mt, p.mt)])
  plgpu.wait_smem_to_gmem(0)


def mosaic_linear(x: jax.Array, w: quant.QArray, *, split_k: int | None = None, stages: int = _STAGES,
                  interpret: bool | None = None) -> jax.Array:
  """x [M, K] @ ŵᵀ for w [N, K] Int4 along K -> [M, N] in x.dtype: the Mosaic GPU kernel, no autodiff.

  split_k / stages: as `linear_plan` (None: the plan's choice). interpret: default True on CPU.
  """
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top
  if interpret is None:
    interpret = jax.default_backend() == "cpu"
  m, k = x.shape
  n = w.shape[0]
  p = linear_plan(m, k, n, w, split_k=split_k, stages=stages)
  xp = jnp.pad(x, ((0, p.m_pad - m), (0, 0))) if p.m_pad > m else x
  # uint8 [N, K/2] -> int4 [N, K], element 2i from the low nibble (a view: no copy of the codes).
  codes = lax.bitcast_convert_type(w.codes, jnp.int4).reshape(n, k)
  has_zp = w.zero_point is not None
  bf16_math = x.dtype == jnp.bfloat16 and w.scale.dtype == jnp.bfloat16
  ns = k // p.split_k // p.group
  scratch = dict(
      s_smem=plgpu.SMEM((WGMMA_M, ns), w.scale.dtype),
      z_smem=plgpu.SMEM((WGMMA_M, ns if has_zp else 16), jnp.int8),
      o_smem=plgpu.SMEM((WGMMA_M, p.mt), jnp.float32),
      bar=plgpu.Barrier(num_arrivals=2 if has_zp else 1),  # the scale copy [and the zero-point copy]
      # The interpreter's wgmma operands (unused when compiled: a few KiB of SMEM).
      w_scr=plgpu.SMEM((WGMMA_M, p.bk // p.slices) if interpret else (8, 8), x.dtype),
      xt_scr=plgpu.SMEM((p.bk // p.slices, p.mt) if interpret else (8, 8), x.dtype),
  )
  kwargs = {}
  if interpret:
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams  # pylint: disable=g-import-not-at-top
    kwargs["interpret"] = InterpretGPUParams()
  kernel = functools.partial(_kernel, p=p, has_zp=has_zp, x_dtype=x.dtype, bf16_math=bf16_math,
                             interpret=interpret)
  call = plgpu.kernel(
      kernel,
      out_type=jax.ShapeDtypeStruct((p.split_k, n, p.m_pad), jnp.float32),
      grid=(n // WGMMA_M, p.m_pad // p.mt, p.split_k),
      grid_names=("n", "m", "s"),
      scratch_types=scratch,
      **kwargs,
  )
  operands = [xp, codes, w.scale] + ([w.zero_point] if has_zp else [])
  return call(*operands).sum(axis=0)[:, :m].T.astype(x.dtype)


def xla_linear(x: jax.Array, w: quant.QArray) -> jax.Array:
  """[..., K] @ dequantize(w)ᵀ for w [N, K]: dequantize to x.dtype, dot with f32 accumulation."""
  wd = quant.dequantize(w, x.dtype)
  return jnp.einsum("...k,nk->...n", x, wd, preferred_element_type=jnp.float32).astype(x.dtype)


def supported_linear(x: jax.Array, w: quant.QArray, *, impl: str = "auto") -> Support:
  """Which path `qlinear(x, w, impl=impl)` takes on the default backend, and why.

  Raises:
    TypeError if w is not a QArray; ValueError if x [..., K] does not contract with w [N, K].
  """
  if not isinstance(w, quant.QArray):
    raise TypeError(f"qlinear: expected a QArray weight, got {type(w).__name__}")
  if impl not in ("auto", "mosaic_gpu", "xla"):
    raise ValueError(f"qlinear: impl must be 'auto', 'mosaic_gpu' or 'xla'; got {impl!r}")
  if x.ndim < 1 or w.ndim < 1 or x.shape[-1] != w.shape[-1]:
    raise ValueError(f"qlinear: activations {tuple(x.shape)} do not contract with weight {w.shape} "
                     "(expected w [N, K], K last)")
  if impl == "xla":
    return Support(False, "xla", "impl='xla' requested")
  backend = dispatch._backend()  # pylint: disable=protected-access
  if backend == "cpu" and impl == "auto":
    return Support(False, "xla", "CPU: XLA dequantize-then-dot is the fast path (impl='mosaic_gpu' runs the "
                   "kernel in the interpreter)")
  if backend == "tpu":
    return Support(False, "xla", "TPU: the linear-layout kernel is Mosaic GPU (Hopper); use qmatmul with the "
                   "[K, N] layout")
  why = None
  if w.ndim != 2 or w.axis != -1:
    why = f"weight of shape {w.shape} quantized along axis {w.axis}; the kernel takes one [N, K] along K"
  elif x.dtype not in (jnp.bfloat16, jnp.float16):
    why = f"activation dtype {x.dtype}: wgmma takes bfloat16 / float16 (no exact float32 form)"
  elif backend != "cpu":
    cc = dispatch._gpu_compute_capability()  # pylint: disable=protected-access
    if cc is not None and cc < 9.0:
      why = f"the kernel uses Hopper's wgmma and TMA (sm_90+); this GPU is sm_{cc:g}"
  if why is None:
    m = int(np.prod(x.shape[:-1])) if x.ndim > 1 else 1
    try:
      linear_plan(m, w.shape[1], w.shape[0], w)
    except Unsupported as e:
      why = str(e)
  if why is not None:
    return Support(False, "xla", why)
  path = "pallas-interpret" if backend == "cpu" else "pallas-mosaic-gpu"
  return Support(True, path, f"{w.spec.name} linear-layout kernel on {backend}", "mosaic_gpu")


def _zero_cotangent(w: quant.QArray) -> quant.QArray:
  def zero(a):
    if jnp.issubdtype(a.dtype, jnp.inexact):
      return jnp.zeros_like(a)
    return np.zeros(a.shape, dtype=jax.dtypes.float0)
  return jax.tree.map(zero, w)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _linear_vjp(x, w, interpret):
  return mosaic_linear(x, w, interpret=interpret)


def _linear_fwd(x, w, interpret):
  return mosaic_linear(x, w, interpret=interpret), w


def _linear_bwd(interpret, w, g):
  del interpret
  # dx = g @ ŵ with ŵ rounded to the activation dtype, as autodiff of the XLA path gives.
  dx = jnp.dot(g, quant.dequantize(w, g.dtype), preferred_element_type=jnp.float32).astype(g.dtype)
  return dx, _zero_cotangent(w)


_linear_vjp.defvjp(_linear_fwd, _linear_bwd)


def qlinear(x: jax.Array, w: quant.QArray, *, impl: str = "auto") -> jax.Array:
  """[..., K] @ dequantize(w)ᵀ -> [..., N] in x.dtype, for w [N, K] quantized along K (`linear_layout`).

  Args:
    x: activations [..., K].
    w: weight QArray [N, K], axis=-1 (`linear_layout(q)` or `quantize(w_nk, spec, axis=-1)`).
    impl: "auto" (the Mosaic GPU kernel on Hopper when `supported_linear` says so, else XLA), "mosaic_gpu"
      (the kernel or a ValueError saying why not; the interpreter on CPU) or "xla".

  The weight gets a zero cotangent (a frozen low-bit base); dx = g @ ŵ.
  """
  s = supported_linear(x, w, impl=impl)
  if s.pallas:
    lead = x.shape[:-1]
    m = int(np.prod(lead)) if lead else 1
    y = _linear_vjp(x.reshape(m, x.shape[-1]), w, s.path == "pallas-interpret")
    return y.reshape(*lead, w.shape[0])
  if impl == "mosaic_gpu":
    raise ValueError(f"qlinear(impl='mosaic_gpu'): {s.reason}")
  if impl == "auto" and s.reason not in _logged:
    _logged.add(s.reason)
    log.info("qlinear: XLA path: %s", s.reason)
  return xla_linear(x, w)


def lowered_kernel(x: jax.ShapeDtypeStruct, w, **kwargs) -> str:
  """The Mosaic GPU module of `mosaic_linear(x, w)` lowered for cuda, as MLIR text (no GPU needed)."""
  from jax import export  # pylint: disable=g-import-not-at-top
  from jax.experimental.mosaic.gpu import core  # pylint: disable=g-import-not-at-top
  seen = []
  orig = core._run_serde_pass  # pylint: disable=protected-access

  def keep(module, *, serialize, ir_version=None):
    if serialize:
      seen.append(str(module))
    return orig(module, serialize=serialize, ir_version=ir_version)

  core._run_serde_pass = keep  # pylint: disable=protected-access
  try:
    f = jax.jit(lambda x, w: mosaic_linear(x, w, interpret=False, **kwargs))
    export.export(f, platforms=["cuda"])(x, w)
  finally:
    core._run_serde_pass = orig  # pylint: disable=protected-access
  if len(seen) != 1:
    raise AssertionError(f"expected one Mosaic GPU kernel, lowered {len(seen)}")
  return seen[0]


def loop_op_mix(text: str) -> dict[str, int]:
  """Per-thread operations of one pipeline step (the `scf.for` body) of a lowered kernel, by kind.

  Counted in the MLIR handed to Mosaic GPU's compiler, before LLVM and ptxas: an estimate of the machine code,
  not a count of it (CSE, hoisting and ptxas may merge or split operations). Kinds:
    convert  Mosaic GPU's int4 -> bf16 pair conversions (inline PTX: prmt, lop3, sub.bf16x2 each)
    permute  byte permutes of the relayout to the wgmma layout (prmt)
    shuffle  warp shuffles of the relayout (shfl.sync)
    int32    32-bit integer / logic ops (nibble-sign flips, shifts, swizzled addresses, selects)
    bf16x2   packed bf16 arithmetic (scale multiply, zero-point subtract)
    f32      f32 arithmetic and conversions (non-bf16 paths)
    smem_ld  loads from shared memory (codes, scales)
    wgmma    wgmma instructions (k16 each)
  """
  import re  # pylint: disable=g-import-not-at-top
  lines = text.splitlines()
  start = next(i for i, line in enumerate(lines) if "scf.for" in line)
  depth, body = 0, []
  for line in lines[start:]:
    depth += line.count("{") - line.count("}")
    body.append(line)
    if depth <= 0 and len(body) > 1:
      break
  mix = dict.fromkeys(("convert", "permute", "shuffle", "int32", "bf16x2", "f32", "smem_ld", "wgmma"), 0)
  for line in body:
    if "llvm.inline_asm" in line:
      if "sub.bf16x2" in line:
        mix["convert"] += 1
      elif "wgmma.mma_async" in line:
        mix["wgmma"] += 1
      elif "prmt.b32" in line:
        mix["permute"] += 1
    elif "nvvm.shfl.sync" in line:
      mix["shuffle"] += 1
    elif re.search(r"= llvm\.load .*!llvm\.ptr<3>", line):
      mix["smem_ld"] += 1
    elif re.search(r"= arith\.(xori|andi|ori|shrui|shli|select)\b.*: i32$", line):
      mix["int32"] += 1
    elif re.search(r"= arith\.(mulf|subf|addf)\b.*vector<2xbf16>", line):
      mix["bf16x2"] += 1
    elif re.search(r"= arith\.(mulf|subf|addf|truncf|extf)\b.*f32", line):
      mix["f32"] += 1
  return mix


def predicted(m: int, k: int, n: int, spec: quant.Int4 = quant.Int4(), dtype=jnp.bfloat16, *, split_k=None):
  """The static roofline of `triton_aot.issue_model` (H200: pipe rates, 132 SMs, 4.8 TB/s) fed with `loop_op_mix`.

  Pipes: int = 2 per conversion (prmt, lop3) + permutes + int32 ops; fp16 = 1 per conversion (sub.bf16x2) +
  bf16x2 ops; fp32 = f32 ops; mio = shuffles + shared-memory loads; issue = all of them + wgmma. Raw MLIR counts,
  so an upper bound on the instructions (CSE and hoisting only remove some) and a lower bound on the share of
  HBM bandwidth, under the model's own assumptions (no latency, perfect overlap). Returns (mix, IssueModel).
  """
  from lrl_jax.kernels import triton_aot  # pylint: disable=g-import-not-at-top
  w = jax.eval_shape(lambda a: linear_layout(quant.quantize(a, spec, axis=-2)), jax.ShapeDtypeStruct((k, n), jnp.float32))
  p = linear_plan(m, k, n, w, split_k=split_k)
  mix = loop_op_mix(lowered_kernel(jax.ShapeDtypeStruct((m, k), dtype), w, split_k=split_k))
  pipes = {"int": 2 * mix["convert"] + mix["permute"] + mix["int32"], "fp16": mix["convert"] + mix["bf16x2"],
           "fp32": mix["f32"], "conv": 0, "mio": mix["shuffle"] + mix["smem_ld"]}
  total = sum(pipes.values()) + mix["wgmma"]
  # issue_model reads split_k, bk and bn (here the 64 weight rows of a program).
  plan_ = type("P", (), {"split_k": p.split_k, "bk": p.bk, "bn": WGMMA_M})()
  w_bytes = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(w))
  model = triton_aot.issue_model({"pipes": pipes, "total": total}, plan_=plan_, k=k, n=n, m=m,
                                 programs=(n // WGMMA_M) * (p.m_pad // p.mt) * p.split_k, num_warps=4,
                                 nbytes=w_bytes + m * k * 2, sm=triton_aot.SMS[90])
  return mix, model


def main(argv=None) -> int:
  """`python -m lrl_jax.kernels.linear`: the lowered kernel's per-step operation mix and its static roofline."""
  import argparse  # pylint: disable=g-import-not-at-top
  ap = argparse.ArgumentParser(prog="python -m lrl_jax.kernels.linear", description=main.__doc__)
  ap.add_argument("--shapes", default="4096x4096,4096x14336,8192x8192")
  ap.add_argument("--m", default="1,16,64")
  a = ap.parse_args(argv)
  print("| K x N | M | split-K | convert | permute | shuffle | int32 | bf16x2 | smem ld | wgmma | int / code "
        "| all / code | bound | predicted share of HBM |")
  print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
  for shape in a.shapes.split(","):
    k, n = (int(v) for v in shape.lower().split("x"))
    for m in (int(v) for v in a.m.split(",")):
      mix, model = predicted(m, k, n)
      p = linear_plan(m, k, n, jax.eval_shape(
          lambda w: linear_layout(quant.quantize(w, quant.Int4(), axis=-2)), jax.ShapeDtypeStruct((k, n), jnp.float32)))
      pw = model.per_weight
      print(f"| {k}x{n} | {m} | {p.split_k} | {mix['convert']} | {mix['permute']} | {mix['shuffle']} | "
            f"{mix['int32']} | {mix['bf16x2']} | {mix['smem_ld']} | {mix['wgmma']} | {pw['int']:.2f} | "
            f"{pw['issue']:.2f} | {model.bound} | {model.hbm_fraction:.0%} |")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
