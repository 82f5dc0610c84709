"""The low-bit matmul as a Pallas Mosaic GPU kernel (Hopper, `wgmma`): the successor of the Triton path.

jax 0.11 deprecates Pallas's Triton backend; Mosaic GPU is what replaces it. Mosaic GPU has no generic
`dot`: a matmul is an explicit warpgroup MMA (`plgpu.wgmma`) whose right operand lives in shared memory
in a swizzled tiling, so the dequantized weight tile takes one trip through SMEM (as in Triton, which
stages a dequantized `wgmma` operand the same way). One program (one warpgroup, 128 threads) owns a
(64, bn) output tile and K/S of the contraction (split-K S); per chunk of bk logical K elements:

  1. TMA copies (`plgpu.emit_pipeline`, `max_concurrent_steps` chunks in flight) bring the two
     activation planes x[:, 0::2] / x[:, 1::2] (64, bk/2) (swizzled: the `wgmma` left operand), the
     code tile (bk/2, bn) and the scale rows (bk/G, bn) [and the zero points] into SMEM.
  2. Scales in the `wgmma` register layout of the code tile. A chunk with one scale row (INT4 G = 128,
     FP8 channel) reads it in that layout's column layout and broadcasts it down the rows in registers.
     Smaller groups (16 for NVFP4, 32 / 64 for INT4, 32 for MXFP8) are expanded to one row per code row
     in an f32 SMEM tile (a broadcast per group, in the strided register layout) and read back in the
     `wgmma` layout; that tile later stages the output tile for its TMA store.
  3. Decode exactly as the Triton / Mosaic TPU kernels (`_decode.dequant_plane`, same f32 operations in
     the same order as `quant.dequantize`), round to x.dtype, store to the swizzled SMEM operand.
  4. `wgmma` x_plane (64, bk/2) @ ŵ_plane (bk/2, bn) into the f32 accumulator, both planes.

The [S, M, N] f32 partials are summed by XLA afterwards, as on the Triton path. bm is 64 (the `wgmma`
M): x is padded to 64 rows (a row of A only feeds the same row of the product), and only the M real
rows of a single row tile are stored (M > 64 pads to whole tiles).
Formats: Int4 (with or without zero points), NVFP4, FP8 channel,
MXFP8; activations bf16 / f16 (`wgmma` has no exact-f32 form). FP8 128x128 block scales are not
expressed here (a (bk/128, 1) scale tile per program); they take the Triton or XLA path.

Status (2026-11-29): numerics checked in Mosaic GPU's interpret mode on CPU against the float64
reference (tests/kernels/test_mosaic_gpu.py), and lowered for `cuda` with `jax.export`: Pallas's Mosaic GPU
lowering (register layouts, TMA descriptors, SMEM budget, `wgmma` operand shapes) runs in full there and
emits the `mosaic_gpu_v2` custom call. The PTX / cubin compile happens in the CUDA plugin at load time and
was not run (no GPU); nothing was timed. The default GPU path stays Triton until this one is measured.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
from jax import export, lax
from jax.experimental import pallas as pl

from lrl_jax import quant
from lrl_jax.kernels import _mgpu_decode as _mgpu
from lrl_jax.kernels._decode import _apply_dec, _decode_scale, dequant_plane, kernel_operands
from lrl_jax.kernels.blocks import WGMMA_M, Plan

__all__ = ["mosaic_gpu_2d", "triton_available", "lowered_smem_bytes"]


def triton_available() -> bool:
  """True while this jax ships Pallas's Triton backend (deprecated from jax 0.11)."""
  try:  # the probe itself: Pallas's Triton backend may be absent (deprecated from jax 0.11)
    from jax.experimental.pallas import triton as _  # noqa: F401, PLC0415
  except ImportError:
    return False
  return True


def _swizzled(cols: int, dtype) -> tuple:
  """SMEM transforms of a [rows, cols] `wgmma` operand: (8, swizzle/itemsize) tiles, the widest swizzle."""
  # Lazy: the Mosaic GPU bindings may be missing from an install, and are slow to import.
  from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415

  bits = jnp.dtype(dtype).itemsize * 8
  s = plgpu.find_swizzle(cols * bits)
  return (plgpu.TilingTransform((8, s * 8 // bits)), plgpu.SwizzleTransform(s))


def _kernel(*refs, w_smem, sx, zx, spec, p: Plan, n_x: int, has_zp: bool, x_dtype, chunks: int, interpret: bool):
  # Lazy: the Mosaic GPU bindings may be missing from an install, and are slow to import.
  from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415

  n_in = n_x + 2 + int(has_zp)
  x_g, (c_g, s_g) = refs[:n_x], refs[n_x : n_x + 2]
  z_g = refs[n_x + 2] if has_zp else None
  o_g = refs[n_in]
  rows = p.bk // 2 if p.packed else p.bk  # code rows per chunk
  srows = 1 if p.channel else p.bk // p.kg  # scale rows per chunk
  gr = rows if p.channel else p.kg // (2 if p.packed else 1)  # code rows per scale row
  i, j, sp = lax.axis_index("m"), lax.axis_index("n"), lax.axis_index("s")

  def expand(src, dst, decode):
    # One f32 row per code row: scale row g covers code rows [g·gr, (g+1)·gr). Strided layout: a broadcast
    # along the leading dim is native there, whatever gr is.
    for g in range(srows):
      dst[pl.ds(g * gr, gr), :] = jnp.broadcast_to(decode(src[g, :])[None, :], (gr, p.bn))

  def wgmma_layout(ref):
    # The interpreter has no `plgpu.load` (jax 0.10.2) and ignores layouts; the compiled kernel needs the
    # `wgmma` register layout for the decoded tile, read from unswizzled SMEM.
    if interpret:
      return ref[...]
    return _mgpu.load(ref, (), layout=plgpu.Layout.WGMMA, optimized=False)

  def row_broadcast(ref, decode):
    # One scale row for the whole chunk: read it in the column layout of the wgmma register layout and
    # broadcast it down the 64 rows in registers (no trip through SMEM).
    if interpret:
      r = ref[0, :]
    else:
      r = _mgpu.load(ref, (0, slice(None)), layout=plgpu.Layout.WGMMA.reduce(0), optimized=False)
    return lax.broadcast_in_dim(decode(r), (rows, p.bn), (1,))  # not [None, :]: a (1, bn) has no wgmma layout

  def scales(ref, staging, decode):
    if srows == 1:
      return row_broadcast(ref, decode)
    expand(ref, staging, decode)
    return wgmma_layout(staging)

  def body(_, *chunk, acc_ref):
    xs, c, s = chunk[:n_x], chunk[n_x], chunk[n_x + 1]
    sf = scales(s, sx, lambda r: _decode_scale(r, spec))
    zf = scales(chunk[n_x + 2], zx, lambda r: r.astype(jnp.int32).astype(jnp.float32)) if has_zp else None
    codes = wgmma_layout(c)
    for plane in range(n_x):
      w_smem[plane][...] = dequant_plane(codes, plane, sf, zf, spec=spec).astype(x_dtype)
    plgpu.commit_smem()  # the generic-proxy stores above, before the async-proxy wgmma reads them
    for plane, xt in enumerate(xs):
      plgpu.wgmma(acc_ref, xt, w_smem[plane])
    plgpu.wgmma_wait(0)  # the operand tiles are rewritten next chunk

  xspec = plgpu.BlockSpec((WGMMA_M, rows), lambda t: (i, sp * chunks + t), transforms=_swizzled(rows, x_dtype))
  in_specs = [xspec] * n_x + [plgpu.BlockSpec((rows, p.bn), lambda t: (sp * chunks + t, j))]
  if p.channel:
    in_specs.append(plgpu.BlockSpec((1, p.bn), lambda t: (0, j)))
  else:
    in_specs.append(plgpu.BlockSpec((srows, p.bn), lambda t: (sp * chunks + t, j)))
  if has_zp:
    in_specs.append(plgpu.BlockSpec((srows, p.bn), lambda t: (sp * chunks + t, j)))

  def run(acc_ref):
    plgpu.emit_pipeline(
      functools.partial(body, acc_ref=acc_ref), grid=(chunks,), in_specs=in_specs, max_concurrent_steps=p.stages
    )(*x_g, c_g, s_g, *([z_g] if has_zp else []))
    return acc_ref[...]

  acc = pl.run_scoped(run, plgpu.ACC((WGMMA_M, p.bn), jnp.float32))
  o_smem = sx  # the (64, bn) f32 scale tile is free once the pipeline is done: the output's staging tile
  _mgpu.store(o_smem, acc)
  plgpu.commit_smem()
  out_rows = o_g.shape[1] if p.m_pad == WGMMA_M else WGMMA_M  # one row tile: only M rows are stored
  plgpu.copy_smem_to_gmem(
    o_smem.at[pl.ds(0, out_rows)], o_g.at[sp, pl.ds(i * WGMMA_M, out_rows), pl.ds(j * p.bn, p.bn)]
  )
  plgpu.wait_smem_to_gmem(0)


def mosaic_gpu_2d(x: jax.Array, q: quant.QArray, p: Plan, interpret: bool) -> jax.Array:
  """x [M, K] @ QArray [K, N] -> [M, N] in x.dtype through one Mosaic GPU kernel (plan p, target mosaic_gpu)."""
  # Lazy: the Mosaic GPU bindings may be missing from an install, and are slow to import.
  from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: PLC0415

  m, k = x.shape
  n = q.shape[1]
  xp = jnp.pad(x, ((0, p.m_pad - m), (0, 0))) if p.m_pad > m else x
  xs, operands, has_zp = kernel_operands(xp, q, p)
  rows = p.bk // 2 if p.packed else p.bk
  assert rows == WGMMA_M, p  # sx doubles as the (64, bn) output staging tile
  chunks = k // p.split_k // p.bk
  scratch = dict(
    w_smem=[plgpu.SMEM((rows, p.bn), x.dtype, transforms=_swizzled(p.bn, x.dtype)) for _ in xs],
    sx=plgpu.SMEM((rows, p.bn), jnp.float32),
    zx=plgpu.SMEM((rows, p.bn) if has_zp else (8, p.bn), jnp.float32),
  )
  kwargs = {}
  if interpret:
    # Lazy: Mosaic GPU's interpreter (a private jax module), only for interpret=True.
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams  # noqa: PLC0415

    kwargs["interpret"] = InterpretGPUParams()
  kernel = functools.partial(
    _kernel, spec=q.spec, p=p, n_x=len(xs), has_zp=has_zp, x_dtype=x.dtype, chunks=chunks, interpret=interpret
  )
  call = plgpu.kernel(
    kernel,
    out_type=jax.ShapeDtypeStruct((p.split_k, m if p.m_pad == WGMMA_M else p.m_pad, n), jnp.float32),
    grid=(p.m_pad // WGMMA_M, n // p.bn, p.split_k),
    grid_names=("m", "n", "s"),
    scratch_types=scratch,
    # Lane semantics: the kernels place their registers' layouts themselves (`plgpu.layout_cast`); jax 0.11 made
    # Warpgroup (layouts inferred) the default, whose inference refuses these kernels' swizzled, transposed views.
    compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane),
    **kwargs,
  )
  return _apply_dec(call(*operands).sum(axis=0)[:m], q).astype(x.dtype)


def lowered_smem_bytes(fn, *args) -> int:
  """Shared memory per program of the one Mosaic GPU kernel in `fn(*args)`, lowered for `cuda` (no GPU needed).

  Lowers under a zero shared-memory limit and reads the size from the lowering's refusal.
  """
  # Lazy: the Mosaic GPU bindings may be missing from an install, and are slow to import.
  from jax.experimental.mosaic.gpu import core as mgpu_core  # noqa: PLC0415

  with mgpu_core.artificial_shared_memory_limit(0):
    try:
      export.export(jax.jit(fn), platforms=["cuda"])(*args)
    except ValueError as e:
      found = re.search(r"smem_bytes=(\d+)", str(e))
      if found:
        return int(found.group(1))
      raise
  raise AssertionError("the lowering accepted a zero shared-memory limit")
