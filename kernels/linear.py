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
from lrl_jax.kernels.blocks import Unsupported
from lrl_jax.kernels import dispatch
from lrl_jax.kernels.dispatch import Support
from lrl_jax.kernels.matmul import _e2m1, _zero_cotangent, _x_cotangent
from lrl_jax.kernels.mosaic_gpu import _swizzled

__all__ = ["linear_layout", "qlinear", "supported_linear", "xla_linear", "mosaic_linear", "LinearPlan",
           "linear_plan"]

WGMMA_M = 64  # weight rows per program: the wgmma M
_BK = 128  # logical K per pipeline step: a 64-byte row of int4 codes, a 256-byte row of bf16 activations
_MT_MAX = 128  # activation rows per program: the wgmma N (multiple of 8, <= 256); 128 keeps acc at 64 regs
# Split-K target: about 4 programs per SM of an H200 (132 SMs). A program holds ~30 KiB of shared memory and few
# registers, so all of them are resident at once; 4 per SM keep 4 x 4 steps x 4 KiB = 64 KiB of codes in flight per
# SM, against the ~25 KiB Little's law asks (4.8 TB/s x ~0.7 us / 132). Reasoning, not timed: the device run sweeps
# split_k (scripts/device_check.sh).
_MAX_PROGRAMS = 528
_STAGES = 4
# Shared memory one program may have on sm_90 (227 KiB), less a margin for what `_smem_bytes` does not count
# (barriers, alignment, the interpreter's unused scratch: the lowered kernels of tests/kernels/test_linear.py took
# 3-5 KiB more than the count).
_SMEM_BUDGET = (227 - 8) * 1024
_TMA_BOX = 256  # elements per dimension of one TMA copy
# NVFP4's wgmma operand is e2m1 · s_b · 2^-_NVFP4_SHIFT: bf16 s_b · 2^126 would overflow for s_b > 2^1.99.
_NVFP4_SHIFT = 7
# Above this M, qlinear takes XLA: the kernel reads the weights once per 128-row tile, and past
# `dispatch.MAX_WEIGHT_PASSES` passes XLA's dequantize-then-GEMM moves fewer bytes (reasoned, not timed).
MAX_M = _MT_MAX * dispatch.MAX_WEIGHT_PASSES


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
    group: the INT4 group size G, or NVFP4's block of 16.
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

  @property
  def width(self) -> int:
    """K columns per wgmma call: one scale group, or the whole step."""
    return self.bk // self.slices


def _smem_bytes(mt: int, stages: int, ns: int, scale_bytes: int, *, has_zp: bool, nvfp4: bool) -> int:
  """Shared memory of one program: the pipelined activation and code tiles, the program's scales (NVFP4: also
  their bf16 form; zero points), and the f32 output tile."""
  per_step = mt * _BK * 2 + WGMMA_M * _BK // 2
  return (stages * per_step + WGMMA_M * ns * (scale_bytes + 2 * nvfp4 + has_zp) + WGMMA_M * mt * 4)


def linear_plan(m: int, k: int, n: int, q: quant.QArray, *, split_k: int | None = None,
                stages: int | None = None) -> LinearPlan:
  """The tile plan of x [m, k] @ ŵᵀ for w [n, k], or `Unsupported` naming what does not fit.

  split_k: programs per output tile along K; None picks it (see `_MAX_PROGRAMS`). stages: steps in flight; None:
  4, or as many as shared memory holds (at least 2).
  """
  spec = q.spec
  if not isinstance(spec, (quant.Int4, quant.NVFP4)):
    raise Unsupported(f"{spec.name}: the linear-layout kernel takes Int4 and NVFP4; other formats take XLA")
  g = spec.block
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
    while k // split_k // g > _TMA_BOX and split_ok(split_k * 2):  # one TMA copy brings a program's scales
      split_k *= 2
  if k // split_k // g > _TMA_BOX:
    raise Unsupported(f"{spec.name}: {k // split_k // g} scale columns per program (K={k}, G={g}, "
                      f"split_k={split_k}); one TMA copy takes at most {_TMA_BOX}")
  smem = functools.partial(_smem_bytes, mt, ns=k // split_k // g, scale_bytes=sbytes,
                           has_zp=q.zero_point is not None, nvfp4=isinstance(spec, quant.NVFP4))
  if stages is None:
    stages = _STAGES
    while stages > 2 and smem(stages) > _SMEM_BUDGET:
      stages -= 1
  if stages < 1:
    raise Unsupported(f"{spec.name}: stages={stages}; at least 1 step in flight")
  if smem(stages) > _SMEM_BUDGET:
    raise Unsupported(f"{spec.name}: {smem(stages) // 1024} KiB of shared memory per program (M={m}, K={k}, "
                      f"split_k={split_k}, stages={stages}); sm_90 allows {_SMEM_BUDGET // 1024} with margin")
  return LinearPlan(mt=mt, m_pad=m_pad, bk=_BK, split_k=split_k, group=g, stages=stages)


def _codes_as_int4(c_smem, *, flip: bool = True):
  """The uint8 code tile [64, bk/2] in SMEM as int4 q [64, bk] (two's complement) in `WGMMA_UPCAST_4X` layout.

  Loads the bytes in the layout that puts in each 32-bit register the 4 bytes `WGMMA_UPCAST_4X` puts its 8 nibbles
  in (the same tiling with halved columns), then per register: xor 0x88888888 (bit 3 of every nibble: the stored
  q + 8 becomes q) and a bitcast to 8 int4. One 32-bit xor per 8 codes; no copy of the codes anywhere: XLA's
  `bitcast_convert_type(uint8 -> int4)` is not a view (XLA:CPU expands it into an unpacking fusion).
  flip=False keeps the nibbles as stored (NVFP4's E2M1 bit patterns, carried as int4 through the relayout).
  """
  from jax.experimental.mosaic import gpu as mgpu  # pylint: disable=g-import-not-at-top
  from jax.experimental.mosaic.gpu import fragmented_array as fa  # pylint: disable=g-import-not-at-top
  from jax.experimental.mosaic.gpu import utils as mgpu_utils  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top
  from jax._src.lib.mlir import ir  # pylint: disable=g-import-not-at-top
  from jax._src.lib.mlir.dialects import arith  # pylint: disable=g-import-not-at-top

  up4 = mgpu.WGMMA_LAYOUT_UPCAST_4X
  tiles = [tuple(t) for t in up4.tiling.tiles]
  byte_tiles = tuple(t[:-1] + (t[-1] // 2,) for t in tiles)  # ((64, 16), (16, 16), (8, 16), (4,))
  bytes_layout = plgpu.Layout.TILED(fa.Tiling(byte_tiles), warp_dims=up4.warp_dims, lane_dims=up4.lane_dims,
                                    vector_dim=up4.vector_dim)
  rows, cols = c_smem.shape
  raw = plgpu.load(c_smem, (), layout=bytes_layout)

  @plgpu.inline_mgpu(arg_types=(bytes_layout,),
                     return_type=plgpu.ShapeDtypeStruct((rows, 2 * cols), jnp.int4, layout=plgpu.Layout.WGMMA_UPCAST_4X))
  def as_int4(_, a):
    i32 = ir.IntegerType.get_signless(32)
    v8i4 = ir.VectorType.get((8,), ir.IntegerType.get_signless(4))
    mask = arith.constant(i32, ir.IntegerAttr.get(i32, 0x88888888 - (1 << 32)))
    regs = np.empty(a.registers.shape, dtype=object)
    for idx, r in np.ndenumerate(a.registers):
      r32 = mgpu_utils.bitcast(r, i32)
      regs[idx] = mgpu_utils.bitcast(arith.xori(r32, mask) if flip else r32, v8i4)
    want = up4.registers_shape((rows, 2 * cols))
    assert regs.shape == tuple(want), (regs.shape, want)
    return mgpu.FragmentedArray(_registers=regs, _layout=up4, _is_signed=True)

  return as_int4(raw)


def e2m1_pair_bits(r, part: int, *, andi, shrui, muli, prmt, const):
  """The bf16x2 bits of E2M1 elements (2·part, 2·part + 1) of a 32-bit register of 8 nibbles, each e2m1 · 2^-126.

  The nibble's sign goes to bit 15 and its three exponent / mantissa bits to bits 8..6, the bottom of bf16's
  exponent field and the top of its mantissa: exponent e, mantissa m read as bf16 are 2^(e−127)·(1 + m/2) for e > 0
  and m·2^-127 for e = 0 (a bf16 subnormal), i.e. exactly e2m1 · 2^-126 (the placement Marlin-FP4 uses; the kernel
  folds 2^126 into the block scale). Per pair: a byte permute that puts the two nibbles at bits 0..3 and 16..19
  of an otherwise zero register, one multiply that makes the two shifted copies (·2^6 for e m, ·2^12 for the
  sign), one mask; the two nibble masks are shared by the register's four pairs.

  The ops are parameters so that the same sequence builds the kernel's MLIR and runs in NumPy in the tests:
  andi / shrui / muli as `arith`, prmt(a, b, selector) as PTX `prmt.b32` (result byte i is byte sel_i & 7 of
  {b, a}, or that byte's sign replicated when sel_i & 8), const(v) a 32-bit constant.
  """
  lo = andi(r, const(0x0F0F0F0F))  # the low nibble of each byte: elements 0, 2, 4, 6
  hi = andi(shrui(r, const(4)), const(0x0F0F0F0F))  # the high nibbles: elements 1, 3, 5, 7
  # byte 0 <- lo byte `part`, byte 2 <- hi byte `part`; bytes 1, 3 <- the sign of lo's byte 0: 0, as lo < 0x10.
  pair = prmt(lo, hi, 0x8080 | part | (part + 4) << 8)
  return andi(muli(pair, const(0x1040)), const(0x81C081C0))  # (n << 6 | n << 12) & (bits 15, 8..6) per half


def _e2m1_as_bf16(q4):
  """int4 [64, bk] in the `wgmma` register layout, holding E2M1 bit patterns -> bf16 e2m1 · 2^-126, exactly."""
  from jax.experimental.mosaic import gpu as mgpu  # pylint: disable=g-import-not-at-top
  from jax.experimental.mosaic.gpu import utils as mgpu_utils  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top
  from jax._src.lib.mlir import ir  # pylint: disable=g-import-not-at-top
  from jax._src.lib.mlir.dialects import arith, llvm, vector  # pylint: disable=g-import-not-at-top

  @plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA,),
                     return_type=plgpu.ShapeDtypeStruct(q4.shape, jnp.bfloat16, layout=plgpu.Layout.WGMMA))
  def convert(_, a):
    i8, i32 = ir.IntegerType.get_signless(8), ir.IntegerType.get_signless(32)
    v2bf16 = ir.VectorType.get((2,), ir.BF16Type.get())
    const = lambda v: arith.constant(i32, ir.IntegerAttr.get(i32, v - (1 << 32) if v >= 1 << 31 else v))  # noqa: E731
    prmt = lambda x, y, sel: llvm.inline_asm(i32, [x, y], f"prmt.b32 $0, $1, $2, {sel:#06x};", "=r,r,r")  # noqa: E731
    ops = dict(andi=arith.andi, shrui=arith.shrui, muli=arith.muli, prmt=prmt, const=const)
    regs = np.empty(a.registers.shape, dtype=object)
    for idx, reg in np.ndenumerate(a.registers):
      assert ir.VectorType(reg.type).shape == [2], reg.type
      src = getattr(reg.owner, "opview", None)
      if isinstance(src, vector.ExtractStridedSliceOp) and mgpu_utils.bitwidth(src.source.type) == 32:
        # A slice of a 32-bit register (what the relayout leaves): decode in place, sharing the nibble masks.
        r32, part = mgpu_utils.bitcast(src.source, i32), src.offsets[0].value // 2
      else:
        r32, part = arith.extui(i32, mgpu_utils.bitcast(reg, i8)), 0
      regs[idx] = mgpu_utils.bitcast(e2m1_pair_bits(r32, part, **ops), v2bf16)
    return mgpu.FragmentedArray(_registers=regs, _layout=mgpu.WGMMA_LAYOUT, _is_signed=None)

  return convert(q4)


def _kernel(x_g, c_g, s_g, *rest, s_smem, z_smem, sb_smem, o_smem, bar, w_scr, xt_scr, p: LinearPlan, has_zp: bool,
            nvfp4: bool, x_dtype, bf16_math: bool, interpret: bool):
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
    return plgpu.load(ref, (slice(None), col), layout=plgpu.Layout.WGMMA.reduce(1), optimized=False)

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
  x_spec = plgpu.BlockSpec((p.mt, p.bk), lambda t: (i, sp * steps + t), transforms=_swizzled(width, x_dtype))
  c_spec = plgpu.BlockSpec((WGMMA_M, p.bk // 2), lambda t: (j, sp * steps + t), transforms=_swizzled(p.bk // 2, jnp.uint8))

  def run(acc_ref):
    plgpu.emit_pipeline(functools.partial(body, acc_ref=acc_ref), grid=(steps,), in_specs=[x_spec, c_spec],
                        max_concurrent_steps=p.stages)(x_g, c_g)
    return acc_ref[...]

  o_smem[...] = pl.run_scoped(run, plgpu.ACC((WGMMA_M, p.mt), jnp.float32))
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(o_smem, o_g.at[sp, rows, pl.ds(i * p.mt, p.mt)])
  plgpu.wait_smem_to_gmem(0)


def mosaic_linear(x: jax.Array, w: quant.QArray, *, split_k: int | None = None, stages: int | None = None,
                  interpret: bool | None = None) -> jax.Array:
  """x [M, K] @ ŵᵀ for w [N, K] Int4 or NVFP4 along K -> [M, N] in x.dtype: the Mosaic GPU kernel, no autodiff.

  NVFP4 is `quant.qdot`'s form: dec · (x @ (e2m1 · s_b)ᵀ), bf16 activations only. split_k / stages: as
  `linear_plan` (None: the plan's choice). interpret: default True on CPU.
  """
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top
  if interpret is None:
    interpret = jax.default_backend() == "cpu"
  if not isinstance(w, quant.QArray) or w.ndim != 2 or w.axis != -1:
    raise ValueError(f"mosaic_linear: expected one QArray [N, K] quantized along K (axis=-1); got "
                     f"{getattr(w, 'shape', type(w).__name__)}, axis {getattr(w, 'axis', None)}")
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
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams  # pylint: disable=g-import-not-at-top
    kwargs["interpret"] = InterpretGPUParams()
  kernel = functools.partial(_kernel, p=p, has_zp=has_zp, nvfp4=nvfp4, x_dtype=x.dtype,
                             bf16_math=bf16_math or nvfp4, interpret=interpret)
  call = plgpu.kernel(
      kernel,
      out_type=jax.ShapeDtypeStruct((p.split_k, n, p.m_pad), jnp.float32),
      grid=(n // WGMMA_M, p.m_pad // p.mt, p.split_k),
      grid_names=("n", "m", "s"),
      scratch_types=scratch,
      **kwargs,
  )
  operands = [xp, w.codes, w.scale] + ([w.zero_point] if has_zp else [])
  y = call(*operands).sum(axis=0)[:, :m].T
  if nvfp4:  # the wgmma summed e2m1 · s_b · 2^-7 (see `_kernel`): 2^7 and dec, once, as `quant.qdot` applies dec
    y = y * (w.global_scale.astype(jnp.float32) * 2.0 ** _NVFP4_SHIFT)
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
  elif isinstance(w.spec, quant.NVFP4) and x.dtype != jnp.bfloat16:
    why = f"activation dtype {x.dtype}: the NVFP4 decode folds 2^126 into bf16 block scales (bfloat16 only)"
  elif backend != "cpu":
    cc = dispatch._gpu_compute_capability()  # pylint: disable=protected-access
    if cc is not None and cc < 9.0:
      why = f"the kernel uses Hopper's wgmma and TMA (sm_90+); this GPU is sm_{cc:g}"
  if why is None:
    m = int(np.prod(x.shape[:-1])) if x.ndim > 1 else 1
    if m > MAX_M and impl == "auto":
      why = (f"M={m} > {MAX_M}: the kernel reads the weights once per 128 rows; XLA's dequantize-then-GEMM is the "
             "prefill path (impl='mosaic_gpu' runs the kernel anyway)")
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

