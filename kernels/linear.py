"""`qlinear`: y = x @ ŵᵀ for a low-bit weight stored the way `nn.Linear` stores it, [N, K] quantized along K.

Why a second layout. The kernels of `matmul.py` read the contract's [K, N] layout (`quantize(w, axis=-2)`:
two K-neighbours per byte, N contiguous). On Hopper the fast way to feed decoded weights to the tensor cores
is as `wgmma`'s *left* operand, straight from registers: no shared-memory round trip for the decoded tile
(kernels/README.md puts that round trip at 11-19 bytes of SMEM traffic per HBM byte for the [K, N] Mosaic
GPU kernel, against about 7 available). The left operand is ŵᵀ [N-tile, K-chunk] with K minor, so the codes
must be stored K-minor: [N, K/2] bytes, which is `quantize(w.T, axis=-1)`, the nn.Linear / HF /
compressed-tensors orientation. `linear_layout(q)` turns a [K, N] QArray into it (a transpose of codes and
scales, exact); `dequantize(linear_layout(q)) == dequantize(q).T` bit for bit.

The Mosaic GPU kernel (W4A16: `Int4`, bf16 / f16 activations; `NVFP4`, bf16), "swap AB": yᵀ = ŵᵀ xᵀ.
  * Grid (N/64, M/mt, S): one warpgroup per program owns 64 weight rows (the `wgmma` M), mt activation rows
    (the `wgmma` N: M rounded up to 8, at most 128, so decode pads 1 -> 8 rows, not 64) and K/S of the
    contraction (split-K S).
  * `plgpu.emit_pipeline` brings per step (TMA, `stages` steps in flight) the uint8 code tile [64, bk/2] (64
    bytes per row, 64-byte swizzle) and the activation tile [mt, bk] (swizzled). The program's scales (and zero
    points) [64, K/S/G] are copied to SMEM once, before the loop.
  * Decode in registers, Mosaic GPU's own int4 path: the code bytes are loaded 4 to a 32-bit register, where
    the `WGMMA_UPCAST_4X` layout keeps 8 int4 codes; bit 3 of every nibble is flipped (one xor per 8 codes: the
    stored q + 8 becomes q in two's complement) and the register is reinterpreted as int4 (`_codes_as_int4`);
    then relayout to the `wgmma` register layout (a lane shuffle and a byte permute per register, on the
    4-bit data) and `astype(bfloat16)`, whose sequence (`prmt`, `lop3`, `sub.bf16x2`: 3 instructions per pair
    of codes) is the CUTLASS int4 -> bf16 conversion. The codes are never copied: XLA's
    `bitcast_convert_type(uint8 -> int4)` would be (XLA:CPU expands it into an unpacking fusion).
  * Scales per group of G columns: one column of the SMEM scale tile, read in the row layout of the `wgmma`
    register layout and broadcast along K in registers. ŵ = (q − z)·s in bf16 for bf16 x with bf16 scales
    (exact: q − z is a small integer and one bf16 rounding of the exact product equals rounding the f32
    product, as `matmul._int4_tile_t` argues), else in f32 then rounded to x.dtype: `dequantize`'s values.
  * `wgmma(acc, ŵᵀ_g, xᵀ_g)` per group slice of the chunk (ŵᵀ from registers, xᵀ the transposed view of the
    swizzled activation tile), f32 accumulator [64, mt].
  * Partials [S, N, m_pad] f32, summed and transposed by XLA (at M = 1: 64 KiB per split for N = 8192).
  * NVFP4 (`quant.qdot`'s form, dec · (x @ (e2m1 · s_b)ᵀ)): the same pipeline and relayout, the nibbles carried
    as int4 unflipped; then per pair of codes a byte permute, a multiply and a mask place each E2M1 pattern in
    a bf16 as e2m1 · 2^-126 (`e2m1_pair_bits`, about as many instructions as the int4 conversion). The program's
    e4m3 block scales are turned once, before the loop, into a bf16 SMEM tile s_b · 2^119 (exact), so that the
    scale product e2m1 · s_b · 2^-7 is exact and normal; one 16-wide wgmma per block scale; the wrapper
    multiplies the f32 sum by 2^7 · dec.

Where the parts live: the plan (tiles, split-K, the shared-memory count) is `blocks.linear_plan`, beside the
[K, N] kernels' `Plan`; the register-level decode (`_codes_as_int4`, `e2m1_pair_bits`, `_e2m1_as_bf16`) is
`_mgpu_decode.py`; the kernel, its guard, its vjp and `qlinear` are here.

Status (2026-12-01): no GPU. Numerics run in Mosaic GPU's interpret mode on CPU against float64, where the
interpreter's limits (no register operand for `wgmma`, no transposed operand views, no register layouts)
make the kernel route ŵᵀ and xᵀ through SMEM scratch: it checks the indexing and the arithmetic, not the
register path. The register path is checked by lowering for `cuda` (`jax.export`, Pallas's full Mosaic GPU
lowering: layouts, relayouts, TMA, `wgmma` shapes); `mosaic_model` reads the lowered module. NVFP4's bit-placed
decode runs in NumPy, the same `e2m1_pair_bits`, on every code byte at every register position (tests). Not
compiled to machine code, not timed.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from lrl_jax import quant
from lrl_jax.kernels import _mgpu_decode as _mgpu
from lrl_jax.kernels import dispatch
from lrl_jax.kernels._decode import _e2m1
from lrl_jax.kernels._mgpu_decode import _codes_as_int4, _e2m1_as_bf16
from lrl_jax.kernels.blocks import _LINEAR_MT_MAX, WGMMA_M, LinearPlan, Unsupported, linear_plan
from lrl_jax.kernels.dispatch import Support
from lrl_jax.kernels.matmul import _x_cotangent, _zero_cotangent
from lrl_jax.kernels.mosaic_gpu import _swizzled

# LinearPlan and linear_plan live beside Plan in blocks.py; they are this kernel's plan, and exported here too.
__all__ = ["linear_layout", "qlinear", "supported_linear", "xla_linear", "mosaic_linear", "LinearPlan", "linear_plan"]

# NVFP4's wgmma operand is e2m1 · s_b · 2^-_NVFP4_SHIFT: bf16 s_b · 2^126 would overflow for s_b > 2^1.99.
_NVFP4_SHIFT = 7
# Above this M, qlinear takes XLA: the kernel reads the weights once per 128-row tile, and past
# `dispatch.MAX_WEIGHT_PASSES` passes XLA's dequantize-then-GEMM moves fewer bytes (reasoned, not timed).
MAX_M = _LINEAR_MT_MAX * dispatch.MAX_WEIGHT_PASSES


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
    raise ValueError(
      f"linear_layout: expected a [.., K, N] weight quantized along K (axis=-2); got shape {q.shape}, axis {q.axis}"
    )
  t = lambda a: None if a is None else jnp.swapaxes(a, -1, -2)  # noqa: E731
  return dataclasses.replace(q, codes=t(q.codes), scale=t(q.scale), zero_point=t(q.zero_point), axis=-1)


def _kernel(
  x_g,
  c_g,
  s_g,
  *rest,
  s_smem,
  z_smem,
  sb_smem,
  o_smem,
  bar,
  w_scr,
  xt_scr,
  p: LinearPlan,
  has_zp: bool,
  nvfp4: bool,
  x_dtype,
  bf16_math: bool,
  interpret: bool,
):
  # Lazy: the Mosaic GPU bindings may be missing from an install, and are slow to import.
  from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415

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
  width = p.width
  if nvfp4:
    # The program's e4m3 block scales, once, as bf16 s_b · 2^126 / 2^7 (exact: a power of two times an e4m3 value,
    # inside bf16's range). The 2^126 undoes the decode's e2m1 · 2^-126 (`e2m1_pair_bits`); the interpreter decodes
    # e2m1 itself, so there only 2^-7. Both give the wgmma e2m1 · s_b · 2^-7, and the wrapper multiplies by 2^7 · dec.
    lift = 2.0 ** (-_NVFP4_SHIFT if interpret else 126 - _NVFP4_SHIFT)
    sb_smem[...] = (s_smem[...].astype(jnp.float32) * lift).astype(jnp.bfloat16)
    plgpu.commit_smem()  # every thread reads columns other threads wrote
    s_smem = sb_smem

  def column(ref, col):
    """Column `col` of a [64, ns] SMEM tile as a [64] vector in the row layout of the wgmma layout."""
    if interpret:
      return ref[:, col]
    return _mgpu.load(ref, (slice(None), col), layout=plgpu.Layout.WGMMA.reduce(1), optimized=False)

  def decode(c_s):
    """The [64, bk/2] uint8 code tile as q [64, bk] (bf16, exact), in the wgmma register layout.

    NVFP4: e2m1 · 2^-126 compiled (`e2m1_pair_bits`), e2m1 itself in the interpreter (see the scale tile above)."""
    if interpret:  # the interpreter has no register layouts; same values
      c = c_s[...].astype(jnp.int32)
      if nvfp4:
        lo, hi = _e2m1(c & 0xF), _e2m1(c >> 4)
      else:
        lo, hi = (c & 0xF) - 8, (c >> 4) - 8
      q = jnp.stack([lo, hi], axis=-1).reshape(c.shape[0], 2 * c.shape[1])  # element 2i: the low nibble
      return q.astype(jnp.bfloat16)
    q = plgpu.layout_cast(_codes_as_int4(c_s, flip=not nvfp4), plgpu.Layout.WGMMA)
    return _e2m1_as_bf16(q) if nvfp4 else q.astype(jnp.bfloat16)

  def body(idx, x_s, c_s, acc_ref):
    (t,) = idx
    q = decode(c_s)
    for g in range(p.slices):
      col = t * p.slices + g if p.group <= p.bk else t // (p.group // p.bk)
      qg = q if p.slices == 1 else q[:, g * width : (g + 1) * width]
      if has_zp:
        qg = qg - lax.broadcast_in_dim(column(z_smem, col).astype(jnp.bfloat16), qg.shape, (0,))
      s = column(s_smem, col)
      if bf16_math:
        w = qg * lax.broadcast_in_dim(s, qg.shape, (0,))
      else:
        w = qg.astype(jnp.float32) * lax.broadcast_in_dim(s.astype(jnp.float32), qg.shape, (0,))
        w = w.astype(x_dtype)
      if interpret:  # the interpreter's wgmma reads both operands from SMEM, untransposed
        w_scr[...] = w
        xt_scr[...] = x_s[:, pl.ds(g * width, width)].T
        plgpu.wgmma(acc_ref, w_scr, xt_scr)
      else:
        xt = _mgpu.transpose(x_s, (1, 0))
        if p.slices > 1:
          xt = xt.at[pl.ds(g * width, width), :]
        plgpu.wgmma(acc_ref, w, xt)
    plgpu.wgmma_wait(0)  # the code and activation tiles are refilled by the pipeline

  # Swizzle atoms no wider than one wgmma's K slice: a slice of the transposed view starts on an atom.
  x_spec = plgpu.BlockSpec((p.mt, p.bk), lambda t: (i, sp * steps + t), transforms=_swizzled(width, x_dtype))
  c_spec = plgpu.BlockSpec(
    (WGMMA_M, p.bk // 2), lambda t: (j, sp * steps + t), transforms=_swizzled(p.bk // 2, jnp.uint8)
  )

  def run(acc_ref):
    plgpu.emit_pipeline(
      functools.partial(body, acc_ref=acc_ref), grid=(steps,), in_specs=[x_spec, c_spec], max_concurrent_steps=p.stages
    )(x_g, c_g)
    return acc_ref[...]

  _mgpu.store(o_smem, pl.run_scoped(run, plgpu.ACC((WGMMA_M, p.mt), jnp.float32)))
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(o_smem, o_g.at[sp, rows, pl.ds(i * p.mt, p.mt)])
  plgpu.wait_smem_to_gmem(0)


def mosaic_linear(
  x: jax.Array, w: quant.QArray, *, split_k: int | None = None, stages: int | None = None, interpret: bool | None = None
) -> jax.Array:
  """x [M, K] @ ŵᵀ for w [N, K] Int4 or NVFP4 along K -> [M, N] in x.dtype: the Mosaic GPU kernel, no autodiff.

  NVFP4 is `quant.qdot`'s form: dec · (x @ (e2m1 · s_b)ᵀ), bf16 activations only. split_k / stages: as
  `linear_plan` (None: the plan's choice). interpret: default True on CPU.
  """
  # Lazy: the Mosaic GPU bindings may be missing from an install, and are slow to import.
  from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415

  if interpret is None:
    interpret = jax.default_backend() == "cpu"
  if not isinstance(w, quant.QArray) or w.ndim != 2 or w.axis != -1:
    raise ValueError(
      f"mosaic_linear: expected one QArray [N, K] quantized along K (axis=-1); got "
      f"{getattr(w, 'shape', type(w).__name__)}, axis {getattr(w, 'axis', None)}"
    )
  if x.ndim != 2 or x.shape[1] != w.shape[1]:
    raise ValueError(f"mosaic_linear: activations {tuple(x.shape)} are not [M, K] for the weight {w.shape}")
  if x.dtype not in (jnp.bfloat16, jnp.float16):
    raise Unsupported(f"mosaic_linear: activations {x.dtype}; wgmma takes bfloat16 / float16")
  nvfp4 = isinstance(w.spec, quant.NVFP4)
  if nvfp4 and x.dtype != jnp.bfloat16:
    # s_b · 2^126 has no float16 form (its range ends at 2^16): the decode's scale fold needs bf16.
    raise Unsupported(f"mosaic_linear: NVFP4 takes bfloat16 activations; got {x.dtype}")
  m, k = x.shape
  n = w.shape[0]
  p = linear_plan(m, k, n, w, split_k=split_k, stages=stages)
  xp = jnp.pad(x, ((0, p.m_pad - m), (0, 0))) if p.m_pad > m else x
  has_zp = w.zero_point is not None
  bf16_math = x.dtype == jnp.bfloat16 and w.scale.dtype == jnp.bfloat16
  ns = k // p.split_k // p.group
  scratch = dict(
    s_smem=plgpu.SMEM((WGMMA_M, ns), w.scale.dtype),
    z_smem=plgpu.SMEM((WGMMA_M, ns if has_zp else 16), jnp.int8),
    sb_smem=plgpu.SMEM((WGMMA_M, ns if nvfp4 else 16), jnp.bfloat16),  # NVFP4's scales as bf16
    o_smem=plgpu.SMEM((WGMMA_M, p.mt), jnp.float32),
    bar=plgpu.Barrier(num_arrivals=2 if has_zp else 1),  # the scale copy [and the zero-point copy]
    # The interpreter's wgmma operands (unused when compiled: a few KiB of SMEM).
    w_scr=plgpu.SMEM((WGMMA_M, p.width) if interpret else (8, 8), x.dtype),
    xt_scr=plgpu.SMEM((p.width, p.mt) if interpret else (8, 8), x.dtype),
  )
  kwargs = {}
  if interpret:
    # Lazy: Mosaic GPU's interpreter (a private jax module), only for interpret=True.
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams  # noqa: PLC0415

    kwargs["interpret"] = InterpretGPUParams()
  kernel = functools.partial(
    _kernel, p=p, has_zp=has_zp, nvfp4=nvfp4, x_dtype=x.dtype, bf16_math=bf16_math or nvfp4, interpret=interpret
  )
  call = plgpu.kernel(
    kernel,
    out_type=jax.ShapeDtypeStruct((p.split_k, n, p.m_pad), jnp.float32),
    grid=(n // WGMMA_M, p.m_pad // p.mt, p.split_k),
    grid_names=("n", "m", "s"),
    scratch_types=scratch,
    # Lane semantics: the kernels place their registers' layouts themselves (`plgpu.layout_cast`); jax 0.11 made
    # Warpgroup (layouts inferred) the default, whose inference refuses these kernels' swizzled, transposed views.
    compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane),
    **kwargs,
  )
  operands = [xp, w.codes, w.scale] + ([w.zero_point] if has_zp else [])
  y = call(*operands).sum(axis=0)[:, :m].T
  if nvfp4:  # the wgmma summed e2m1 · s_b · 2^-7 (see `_kernel`): 2^7 and dec, once, as `quant.qdot` applies dec
    y = y * (w.global_scale.astype(jnp.float32) * 2.0**_NVFP4_SHIFT)
  return y.astype(x.dtype)


def xla_linear(x: jax.Array, w: quant.QArray) -> jax.Array:
  """[..., K] @ dequantize(w)ᵀ for w [N, K]: `quant.qdot` (dequantize to x.dtype, dot with f32 accumulation;
  NVFP4's per-matrix scale after the sum)."""
  return quant.qdot(x, w, (((x.ndim - 1,), (w.ndim - 1,)), ((), ()))).astype(x.dtype)


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
    raise ValueError(
      f"qlinear: activations {tuple(x.shape)} do not contract with weight {w.shape} (expected w [N, K], K last)"
    )
  if impl == "xla":
    return Support(False, "xla", "impl='xla' requested")
  backend = dispatch._backend()  # pylint: disable=protected-access
  if backend == "cpu" and impl == "auto":
    return Support(
      False,
      "xla",
      "CPU: XLA dequantize-then-dot is the fast path (impl='mosaic_gpu' runs the kernel in the interpreter)",
    )
  if backend == "tpu":
    return Support(
      False, "xla", "TPU: the linear-layout kernel is Mosaic GPU (Hopper); use qmatmul with the [K, N] layout"
    )
  why = None
  if w.ndim != 2 or w.axis != -1:
    why = f"weight of shape {w.shape} quantized along axis {w.axis}; the kernel takes one [N, K] along K"
  elif x.dtype not in (jnp.bfloat16, jnp.float16):
    why = f"activation dtype {x.dtype}: wgmma takes bfloat16 / float16 (no exact float32 form)"
  elif isinstance(w.spec, quant.NVFP4) and x.dtype != jnp.bfloat16:
    why = f"activation dtype {x.dtype}: the NVFP4 decode folds 2^126 into bf16 block scales (bfloat16 only)"
  elif backend != "cpu":
    cc = dispatch._gpu_compute_capability()  # pylint: disable=protected-access
    if cc is not None and cc < 9.0:
      why = f"the kernel uses Hopper's wgmma and TMA (sm_90+); this GPU is sm_{cc:g}"
  if why is None:
    m = int(np.prod(x.shape[:-1])) if x.ndim > 1 else 1
    if m > MAX_M and impl == "auto":
      why = (
        f"M={m} > {MAX_M}: the kernel reads the weights once per 128 rows; XLA's dequantize-then-GEMM is the "
        "prefill path (impl='mosaic_gpu' runs the kernel anyway)"
      )
    else:
      try:
        linear_plan(m, w.shape[1], w.shape[0], w)
      except Unsupported as e:
        why = str(e)
  if why is not None:
    return Support(False, "xla", why)
  path = "pallas-interpret" if backend == "cpu" else "pallas-mosaic-gpu"
  return Support(True, path, f"{w.spec.name} linear-layout kernel on {backend}", "mosaic_gpu")


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _linear_vjp(x, w, interpret):
  return mosaic_linear(x, w, interpret=interpret)


def _linear_fwd(x, w, interpret):
  return mosaic_linear(x, w, interpret=interpret), w


def _linear_bwd(interpret, w, g):
  del interpret
  return _x_cotangent(g, lambda x: xla_linear(x, w), w.shape[1]), _zero_cotangent(w)


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
  if impl == "auto":
    dispatch.log_fallback("qlinear", s.reason)
  return xla_linear(x, w)
