"""Register-level decode helpers of the linear-layout Mosaic GPU kernel (`linear.py`).

`_codes_as_int4` views a uint8 code tile in SMEM as int4 in the `WGMMA_UPCAST_4X` register layout (one xor
per 8 codes, no copy); `e2m1_pair_bits` places two E2M1 nibbles of a register in a bf16x2 as e2m1 · 2^-126,
with its ops as parameters so that the tests run the very sequence in NumPy; `_e2m1_as_bf16` applies it to
every register of a `wgmma`-layout tile. Why these bit tricks: linear.py's docstring.

Mosaic GPU is imported inside the functions that trace a kernel, as in the other kernel modules: its bindings
(jaxlib's or the CUDA plugin's `_mosaic_gpu_ext`) may be missing from an install, and are slow to import.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def load(ref, idx, **kwargs):
  """`plgpu.load` of `ref[idx]` in a register layout (kwargs: layout, optimized), on jax 0.10-0.12.

  jax 0.10 takes the index as an argument, 0.11 deprecates that, 0.12 takes the indexed view (`ref.at[idx]`) only.
  """
  from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415  (lazy, as below)

  if jax.__version_info__ < (0, 11):
    return plgpu.load(ref, idx, **kwargs)
  return plgpu.load(ref if idx == () else ref.at[idx], **kwargs)


def store(ref, value):
  """`ref[...] = value` from registers into SMEM, bank conflicts allowed (an epilogue's one store per program).

  jax 0.12 refuses a plain `ref[...] = value` whose layout it cannot store without bank conflicts; its
  `plgpu.store(..., optimized=False)` is the store jax 0.10 and 0.11 made of `ref[...] = value`.
  """
  from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415

  if hasattr(plgpu, "store"):
    plgpu.store(ref, value, optimized=False)
  else:
    ref[...] = value


def transpose(ref, perm):
  """A transposed view of an SMEM ref (`ref.transpose` from jax 0.11, which deprecates `plgpu.transpose_ref`)."""
  if jax.__version_info__ < (0, 11):
    from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415

    return plgpu.transpose_ref(ref, perm)
  return ref.transpose(perm)


def _codes_as_int4(c_smem, *, flip: bool = True):
  """The uint8 code tile [64, bk/2] in SMEM as int4 q [64, bk] (two's complement) in `WGMMA_UPCAST_4X` layout.

  Loads the bytes in the layout that puts in each 32-bit register the 4 bytes `WGMMA_UPCAST_4X` puts its 8 nibbles
  in (the same tiling with halved columns), then per register: xor 0x88888888 (bit 3 of every nibble: the stored
  q + 8 becomes q) and a bitcast to 8 int4. One 32-bit xor per 8 codes; no copy of the codes anywhere: XLA's
  `bitcast_convert_type(uint8 -> int4)` is not a view (XLA:CPU expands it into an unpacking fusion).
  flip=False keeps the nibbles as stored (NVFP4's E2M1 bit patterns, carried as int4 through the relayout).
  """
  # Lazy: the Mosaic GPU bindings may be missing from an install, and are slow to import.
  from jax._src.lib.mlir import ir  # noqa: PLC0415
  from jax._src.lib.mlir.dialects import arith  # noqa: PLC0415
  from jax.experimental.mosaic import gpu as mgpu  # noqa: PLC0415
  from jax.experimental.mosaic.gpu import fragmented_array as fa  # noqa: PLC0415
  from jax.experimental.mosaic.gpu import utils as mgpu_utils  # noqa: PLC0415
  from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415

  up4 = mgpu.WGMMA_LAYOUT_UPCAST_4X
  tiles = [tuple(t) for t in up4.tiling.tiles]
  byte_tiles = tuple(t[:-1] + (t[-1] // 2,) for t in tiles)  # ((64, 16), (16, 16), (8, 16), (4,))
  bytes_layout = plgpu.Layout.TILED(
    fa.Tiling(byte_tiles), warp_dims=up4.warp_dims, lane_dims=up4.lane_dims, vector_dim=up4.vector_dim
  )
  rows, cols = c_smem.shape
  raw = load(c_smem, (), layout=bytes_layout)

  @plgpu.inline_mgpu(
    arg_types=(bytes_layout,),
    return_type=plgpu.ShapeDtypeStruct((rows, 2 * cols), jnp.int4, layout=plgpu.Layout.WGMMA_UPCAST_4X),
  )
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
  # Lazy: the Mosaic GPU bindings may be missing from an install, and are slow to import.
  from jax._src.lib.mlir import ir  # noqa: PLC0415
  from jax._src.lib.mlir.dialects import arith, llvm, vector  # noqa: PLC0415
  from jax.experimental.mosaic import gpu as mgpu  # noqa: PLC0415
  from jax.experimental.mosaic.gpu import utils as mgpu_utils  # noqa: PLC0415
  from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415

  @plgpu.inline_mgpu(
    arg_types=(plgpu.Layout.WGMMA,),
    return_type=plgpu.ShapeDtypeStruct(q4.shape, jnp.bfloat16, layout=plgpu.Layout.WGMMA),
  )
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
