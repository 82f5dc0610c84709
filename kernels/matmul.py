"""Pallas low-bit matmuls that read QArray codes and scales as stored.

`y = x @ ŵ` with ŵ = dequantize(q) computed tile by tile in VMEM / registers, never
written to HBM. One kernel body serves every format; only the decoding of a tile of
codes and of its scales differs:

  Int4(G)  ŵ = (nibble − 8 − z) · f32(s)           codes uint8 [K/2, N], s [K/G, N], z int8 [K/G, N] or none
  NVFP4    ŵ = e2m1(nibble) · f32(s_b), then · dec codes uint8 [K/2, N], s_b e4m3 [K/16, N], dec f32 (after the sum)
  FP8      ŵ = f32(code) · s                       codes e4m3 [K, N], s f32 [1, N] or [K/b, N/b]
  MXFP8    ŵ = f32(code) · 2^(e − 127)             codes e4m3 [K, N], e uint8 view of e8m0 [K/32, N]

The tile ŵ is rounded once to x.dtype (exactly what `dequantize(q, x.dtype)` gives,
multiplication order included; NVFP4's e2m1 · s_b needs no rounding) and fed to a dot with f32
accumulation, so a kernel differs from the XLA path `quant.qdot(x, q)` only in summation order.

Packed formats hold elements 2i and 2i+1 of K in the low and high nibble of byte
row i. Rather than interleave the two nibble planes in-kernel (a lane shuffle), the
activations are split instead: x @ ŵ = x[:, 0::2] @ ŵ_lo + x[:, 1::2] @ ŵ_hi. The split
is an [M, K] copy of the activations (bytes M·K·2 for bf16; the weights are K·N/2).

A `pallas_call` has no autodiff: each entry point is a `jax.custom_vjp` whose backward
pass is dx = g @ ŵᵀ (XLA; the weight gets a zero cotangent — it is a frozen base).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from lrl_jax import quant
from lrl_jax.kernels import mosaic_gpu as _mg
from lrl_jax.kernels._decode import _apply_dec, _decode_scale, dequant_plane, kernel_operands
from lrl_jax.kernels.blocks import BlockConfig, Plan, Target, Unsupported, plan

__all__ = ["w4a16_matmul", "nvfp4_matmul", "fp8_matmul", "pallas_matmul", "default_target", "smem_bytes"]


# --------------------------------------------------------------------------- in-kernel decoding


def _e2m1_bf16(nib: jax.Array) -> jax.Array:
  """E2M1 nibble (int32) -> bf16, exactly, with few instructions: the GPU form of `_decode._e2m1`.

  The magnitude index i = nib & 7 becomes bf16 by bits (0x4300 | i is 128 + i), and the eight magnitudes
  {0, .5, 1, 1.5, 2, 3, 4, 6} are max(i/2, i − 2, 2i − 8) (one line each for i <= 4, i = 5..6, i = 7),
  exact in bf16; the sign is bit 3 moved to bit 15. No int -> float convert, no select chain.
  """
  i = _magic_bf16(nib & 7, 128)
  half, two, eight = (jnp.asarray(v, jnp.bfloat16) for v in (0.5, 2, 8))
  mag = jnp.maximum(jnp.maximum(i * half, i - two), i * two - eight)
  sign = ((nib & 8) << 12).astype(jnp.uint16)
  return lax.bitcast_convert_type(lax.bitcast_convert_type(mag, jnp.uint16) | sign, jnp.bfloat16)


def _magic_bf16(u: jax.Array, bias: int) -> jax.Array:
  """A small unsigned integer u (0..15, int32) -> u − bias + 128 as bf16: 0x4300 | u is 128 + u in bf16."""
  bits = (u | 0x4300).astype(jnp.uint16)
  return lax.bitcast_convert_type(bits, jnp.bfloat16) - jnp.asarray(bias, jnp.bfloat16)


def _int4_bf16(nib: jax.Array) -> jax.Array:
  """Stored INT4 nibble (q + 8, int32) -> q as bfloat16, exactly, without an int -> float convert.

  bf16 0x4300 is 128.0 with an ulp of 1, so the bits 0x4300 | nib are 128 + nib and minus 136 leave
  nib − 8 (Marlin's "magic number" decode, here in bf16).
  """
  return _magic_bf16(nib, 136)


def _expand_rows(s: jax.Array, rows: int) -> jax.Array:
  """[sr, c] scales -> [rows, c], each scale row repeated rows/sr times (its group)."""
  sr, c = s.shape
  if sr == 1 or sr == rows:
    return s
  return jnp.broadcast_to(s[:, None, :], (sr, rows // sr, c)).reshape(rows, c)


def _bf16_int4(spec: quant.Spec, x_dtype, scale_dtype) -> bool:
  """INT4 with bf16 activations and bf16 scales, the W4A16 case: on GPU the kernel runs `_int4_tile_t`."""
  return isinstance(spec, quant.Int4) and jnp.dtype(x_dtype) == jnp.bfloat16 and jnp.dtype(scale_dtype) == jnp.bfloat16


def _int4_tile_t(x_tiles, c, s, z=None, *, precision):
  """(Σ_planes x_p @ ŵ_p)ᵀ for one K chunk of INT4 with bf16 x and bf16 scales: -> [bn, bm] f32.

  The GPU (Triton) form of W4A16 (`_bf16_int4`), chosen from the compiled instruction mix (kernels/README.md,
  "Instruction mix"), not timed:
  * q − z and (q − z)·s in bf16, q from the nibble by bit operations (`_int4_bf16`). Same values as the f32
    form: q − z is a small integer, exact in bf16, and a bf16 multiply rounds the exact product once, as
    rounding the exact f32 product to bf16 does. It drops the int -> float convert per weight (a quarter-rate
    instruction on sm_90) and the f32 multiply and f32 -> bf16 convert.
  * Transposed, yᵀ = ŵᵀ xᵀ: the decoded weights are the dot's left operand, which Triton keeps in registers
    (Hopper's wgmma reads A from registers), so they skip the shared-memory round trip the right operand
    takes; x, small at decode, becomes the right operand.
  """
  sb = _expand_rows(s, c.shape[0])
  zb = None if z is None else _expand_rows(z.astype(jnp.float32).astype(jnp.bfloat16), c.shape[0])
  ci = c.astype(jnp.int32)
  acc = None
  for p, xt in enumerate(x_tiles):
    q = _int4_bf16((ci & 0xF) if p == 0 else ((ci >> 4) & 0xF))
    if zb is not None:
      q = q - zb
    d = jnp.dot((q * sb).T, xt.T, preferred_element_type=jnp.float32, precision=precision)
    acc = d if acc is None else acc + d
  return acc


def _tile_product(x_tiles, c, s, z=None, *, spec, x_dtype, precision, gpu: bool = False):
  """Σ_planes x_p @ round_{x.dtype}(ŵ_p) in f32 for one K chunk. x_p [bm, r], c [r, bn] -> [bm, bn].

  z: INT4 zero points of the chunk's groups (the scale's shape; int8, or the scale's dtype on TPU) or None:
    ŵ = (q − z)·s.
  gpu: the Triton form of NVFP4: e2m1 · s_b in bf16 (`_e2m1_bf16`; the product of a 2-bit and a 4-bit
    significand is exact in bf16's 8, and within its range), the same values as the f32 form with fewer
    instructions per weight (kernels/README.md, "Instruction mix").
  NVFP4's per-matrix dec is not applied here: the wrapper multiplies the summed product by it (`quant.qdot`).
  """
  if gpu and isinstance(spec, quant.NVFP4):
    sb = _expand_rows(s.astype(jnp.bfloat16), c.shape[0])  # e4m3 -> bf16: exact
    ci = c.astype(jnp.int32)
    acc = None
    for p, xt in enumerate(x_tiles):
      w = (_e2m1_bf16((ci & 0xF) if p == 0 else ((ci >> 4) & 0xF)) * sb).astype(x_dtype)  # exact in bf16/f16/f32
      d = jnp.dot(xt, w, preferred_element_type=jnp.float32, precision=precision)
      acc = d if acc is None else acc + d
    return acc
  sf = _expand_rows(_decode_scale(s, spec), c.shape[0])
  if z is not None:  # int8 (GPU) or small integers in the scale's float dtype (TPU): exact either way
    z = z.astype(jnp.float32) if jnp.issubdtype(z.dtype, jnp.floating) else z.astype(jnp.int32).astype(jnp.float32)
  zf = None if z is None else _expand_rows(z, c.shape[0])
  acc = None
  for p, xt in enumerate(x_tiles):
    w = dequant_plane(c, p, sf, zf, spec=spec)
    d = jnp.dot(xt, w.astype(x_dtype), preferred_element_type=jnp.float32, precision=precision)
    acc = d if acc is None else acc + d
  return acc


def _kernel(
  *refs,
  spec,
  p: Plan,
  n_x: int,
  has_zp: bool,
  x_dtype,
  precision,
  chunks: int,
  m_rows: int | None = None,
  gpu: bool = False,
):
  """One program's output tile. m_rows (k_loop only): the real row count when the last row tile overhangs it;
  those rows are then masked on load and store (Pallas Triton does not mask an overhanging block itself).
  gpu: the Triton target: W4A16 and NVFP4 take their GPU decode forms (`_int4_tile_t`, `_e2m1_bf16`)."""
  x_refs = refs[:n_x]
  c_ref, s_ref = refs[n_x], refs[n_x + 1]
  z_ref = refs[n_x + 2] if has_zp else None
  o_ref = refs[-1]
  tile = functools.partial(_tile_product, spec=spec, x_dtype=x_dtype, precision=precision, gpu=gpu)
  int4_t = gpu and p.schedule == "k_loop" and _bf16_int4(spec, x_dtype, s_ref.dtype)

  if p.schedule == "k_grid":
    # K is the last grid axis, visited in order: the output block stays resident and accumulates.
    @pl.when(pl.program_id(2) == 0)
    def _():
      o_ref[...] = jnp.zeros(o_ref.shape, jnp.float32)

    o_ref[...] += tile([r[...] for r in x_refs], c_ref[...], s_ref[...], None if z_ref is None else z_ref[...])
    return

  rows = p.bk // 2 if p.packed else p.bk  # code (and x-plane) rows per chunk
  srows = p.bk // p.kg  # scale rows per chunk (unused for FP8 channel: one row for all of K)

  if m_rows is None:
    load_x = lambda r, cols: r[:, cols]
  else:
    # Lazy: Pallas's Triton backend may be absent (deprecated from jax 0.11; `mosaic_gpu.triton_available`).
    from jax.experimental.pallas import triton as pltriton  # noqa: PLC0415

    row_ok = pl.program_id(0) * p.bm + lax.broadcasted_iota(jnp.int32, (p.bm, 1), 0) < m_rows
    load_x = lambda r, cols: pltriton.load(r.at[:, cols], mask=jnp.broadcast_to(row_ok, (p.bm, rows)), other=0)

  def body(t, acc):
    r0 = pl.multiple_of(t * rows, rows)
    xt = [load_x(r, pl.ds(r0, rows)) for r in x_refs]
    c = c_ref[pl.ds(r0, rows), :]
    srow = pl.ds(pl.multiple_of(t * srows, srows), srows)
    s = s_ref[...] if p.channel else s_ref[srow, :]
    z = None if z_ref is None else z_ref[srow, :]
    if int4_t:
      return acc + _int4_tile_t(xt, c, s, z, precision=precision)
    return acc + tile(xt, c, s, z)

  if int4_t:  # accumulates yᵀ [bn, bm]
    acc = lax.fori_loop(0, chunks, body, jnp.zeros(o_ref.shape[::-1], jnp.float32)).T
  else:
    acc = lax.fori_loop(0, chunks, body, jnp.zeros(o_ref.shape, jnp.float32))
  if m_rows is None:
    o_ref[...] = acc
  else:
    pltriton.store(o_ref, acc, mask=jnp.broadcast_to(row_ok, acc.shape))


# --------------------------------------------------------------------------- pallas_call


def default_target() -> Target:
  """'tpu' on TPU; on a GPU 'gpu' (Triton) while jax ships it, else 'mosaic_gpu'; 'gpu' on CPU (interpret)."""
  backend = jax.default_backend()
  if backend == "tpu":
    return "tpu"
  if backend != "cpu":
    if not _mg.triton_available():  # read at call time: tests patch mosaic_gpu.triton_available
      return "mosaic_gpu"
  return "gpu"


def _compiler_params(target: Target, p: Plan, block: BlockConfig, interpret: bool):
  if interpret:
    return None
  if target == "tpu":
    # Lazy: each Pallas backend is imported for the target that uses it.
    from jax.experimental.pallas import tpu as pltpu  # noqa: PLC0415

    sem = ("parallel", "parallel", "arbitrary" if p.schedule == "k_grid" else "parallel")
    return pltpu.CompilerParams(dimension_semantics=sem)
  # Lazy: Pallas's Triton backend may be absent (deprecated from jax 0.11; `mosaic_gpu.triton_available`).
  from jax.experimental.pallas import triton as pltriton  # noqa: PLC0415

  return pltriton.CompilerParams(num_warps=p.num_warps, num_stages=block.num_stages)


def _check(x: jax.Array, q: quant.QArray, kinds, name: str):
  if not isinstance(q, quant.QArray):
    raise TypeError(f"{name}: expected a QArray weight, got {type(q).__name__}")
  if not isinstance(q.spec, kinds):
    raise ValueError(f"{name}: weight spec {q.spec} is not one of {[k.__name__ for k in kinds]}")
  if q.ndim != 2:
    raise ValueError(
      f"{name}: expected one weight matrix [K, N], got a QArray of shape {q.shape}; "
      "slice stacked layers first (lax.scan / indexing)"
    )
  if q.axis != -2:
    raise ValueError(f"{name}: weight [K, N] must be quantized along K (axis=-2), got axis={q.axis}")
  if x.ndim < 1 or x.shape[-1] != q.shape[0]:
    raise ValueError(
      f"{name}: activations {tuple(x.shape)} do not contract with weight {q.shape} (x [..., K] @ w [K, N])"
    )
  if x.dtype not in (jnp.float32, jnp.bfloat16, jnp.float16):
    raise ValueError(f"{name}: activations must be float32/bfloat16/float16, got {x.dtype}")


def _pallas_2d(x: jax.Array, q: quant.QArray, block: BlockConfig, target: Target, interpret: bool):
  """x [M, K] @ QArray [K, N] -> [M, N] in x.dtype through one pallas_call."""
  m, k = x.shape
  n = q.shape[1]
  p = plan(m, k, n, q.spec, block, target)
  if target == "mosaic_gpu":
    return _mg.mosaic_gpu_2d(x, q, p, interpret)
  # TPU (k_grid): blocks must tile the arrays, so M is padded to the row tile. GPU (k_loop): the last row tile
  # overhangs M and the kernel masks its rows, so neither x nor the [S, M, N] f32 split-K partials carry padding
  # (at M = 1, 16-row partials were 2 MiB written and 2 MiB read back for 8192x8192 at S = 4, beside 33 MiB of
  # INT4 codes and scales).
  pad = p.schedule == "k_grid"
  xp = jnp.pad(x, ((0, p.m_pad - m), (0, 0))) if pad and p.m_pad > m else x
  # Mosaic TPU tiles int8 as (32, 128): a (bk/G, bn) zero-point block of 8 or 16 group rows does not compile
  # (E2002, found by the ahead-of-time TPU compile, kernels/README.md). In the scale's dtype the block tiles like
  # the scales; the integers -8..15 are exact there. Costs 1/(2G) byte per weight per call.
  xs, operands, has_zp = kernel_operands(xp, q, p, zp_dtype=q.scale.dtype if target == "tpu" else None)

  per_row = 2 if p.packed else 1
  channel = p.channel
  scale_cols = p.bn // p.ng
  if p.schedule == "k_grid":
    grid = (p.m_pad // p.bm, n // p.bn, k // p.bk)
    kx = p.bk // per_row
    in_specs = [pl.BlockSpec((p.bm, kx), lambda i, j, t: (i, t)) for _ in xs]
    in_specs.append(pl.BlockSpec((kx, p.bn), lambda i, j, t: (t, j)))
    if channel:
      in_specs.append(pl.BlockSpec((1, scale_cols), lambda i, j, t: (0, j)))
    else:
      in_specs.append(pl.BlockSpec((p.bk // p.kg, scale_cols), lambda i, j, t: (t, j)))
    if has_zp:
      in_specs.append(pl.BlockSpec((p.bk // p.kg, scale_cols), lambda i, j, t: (t, j)))
    out_shape = jax.ShapeDtypeStruct((p.m_pad, n), jnp.float32)
    out_spec = pl.BlockSpec((p.bm, p.bn), lambda i, j, t: (i, j))
    chunks = 1
  else:
    ks = k // p.split_k  # logical K per split
    grid = (p.m_pad // p.bm, n // p.bn, p.split_k)
    kx = ks // per_row
    in_specs = [pl.BlockSpec((p.bm, kx), lambda i, j, s: (i, s)) for _ in xs]
    in_specs.append(pl.BlockSpec((kx, p.bn), lambda i, j, s: (s, j)))
    if channel:
      in_specs.append(pl.BlockSpec((1, scale_cols), lambda i, j, s: (0, j)))
    else:
      in_specs.append(pl.BlockSpec((ks // p.kg, scale_cols), lambda i, j, s: (s, j)))
    if has_zp:
      in_specs.append(pl.BlockSpec((ks // p.kg, scale_cols), lambda i, j, s: (s, j)))
    out_shape = jax.ShapeDtypeStruct((p.split_k, m, n), jnp.float32)
    out_spec = pl.BlockSpec((pl.squeezed, p.bm, p.bn), lambda i, j, s: (s, i, j))
    chunks = ks // p.bk

  precision = lax.Precision.HIGHEST if x.dtype == jnp.float32 else None  # no TF32 / bf16 passes
  kernel = functools.partial(
    _kernel,
    spec=q.spec,
    p=p,
    n_x=len(xs),
    has_zp=has_zp,
    x_dtype=x.dtype,
    precision=precision,
    chunks=chunks,
    m_rows=m if not pad and p.m_pad > m else None,
    gpu=target == "gpu",
  )
  out = pl.pallas_call(
    kernel,
    out_shape=out_shape,
    grid=grid,
    in_specs=in_specs,
    out_specs=out_spec,
    interpret=interpret,
    compiler_params=_compiler_params(target, p, block, interpret),
    name=f"{q.spec.name}_matmul",
  )(*operands)
  if p.schedule == "k_loop":
    out = out.sum(axis=0)  # split-K partials [S, M, N] (a no-op reduction when S == 1)
  return _apply_dec(out[:m], q).astype(x.dtype)


def _zero_cotangent(q: quant.QArray) -> quant.QArray:
  def zero(a):
    if jnp.issubdtype(a.dtype, jnp.inexact):
      return jnp.zeros_like(a)
    return np.zeros(a.shape, dtype=jax.dtypes.float0)  # integer leaves take float0 cotangents

  return jax.tree.map(zero, q)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _pallas_vjp(x, q, block, target, interpret):
  return _pallas_2d(x, q, block, target, interpret)


def _pallas_fwd(x, q, block, target, interpret):
  return _pallas_2d(x, q, block, target, interpret), q


def _x_cotangent(g: jax.Array, xla_forward, k: int) -> jax.Array:
  """dx for the cotangent g of a matmul linear in x: autodiff of its XLA path `xla_forward` (x [..., k] -> y), so a
  kernel's custom_vjp gives the numbers differentiating the XLA path gives (`quant.qdot`'s form: ŵ in the
  activation dtype, NVFP4's dec applied as the forward applies it)."""
  _, vjp = jax.vjp(xla_forward, jnp.zeros(g.shape[:-1] + (k,), g.dtype))
  return vjp(g)[0]


def _pallas_bwd(block, target, interpret, q, g):
  dx = _x_cotangent(g, lambda x: quant.qdot(x, q).astype(x.dtype), q.shape[0])
  return dx, _zero_cotangent(q)


_pallas_vjp.defvjp(_pallas_fwd, _pallas_bwd)


def pallas_matmul(
  x: jax.Array,
  q: quant.QArray,
  *,
  block: BlockConfig = BlockConfig(),
  target: Target | None = None,
  interpret: bool | None = None,
) -> jax.Array:
  """[..., K] @ QArray [K, N] -> [..., N] in x.dtype through the Pallas kernel of q's format.

  Args:
    x: activations [..., K], float32 / bfloat16 / float16; leading dims are flattened to M.
    q: weight QArray [K, N] quantized along K (axis=-2): Int4, NVFP4, FP8 channel/block or MXFP8.
    block: tile sizes (see `BlockConfig`).
    target: "tpu" (Mosaic, k_grid schedule), "gpu" (Triton, k_loop schedule) or "mosaic_gpu"
      (Hopper wgmma kernel, `mosaic_gpu.py`; bf16 / f16 activations); the shape rules and the
      lowering follow it. Default: the default backend ("gpu" rules on CPU).
    interpret: run the kernel in the Pallas interpreter. Default: True on CPU, else False.

  Raises:
    ValueError when the shapes do not contract or no tile plan fits (`blocks.Unsupported`:
    N or K not a multiple of the tiles; weights are never padded, which would copy them).
  """
  _check(x, q, (quant.Int4, quant.NVFP4, quant.FP8, quant.MXFP8), "pallas_matmul")
  if target is None:
    target = default_target()
  if interpret is None:
    interpret = jax.default_backend() == "cpu"
  k, n = q.shape
  lead = x.shape[:-1]
  m = int(np.prod(lead)) if lead else 1
  if target == "mosaic_gpu" and x.dtype == jnp.float32:
    raise Unsupported(
      "pallas_matmul: the Mosaic GPU kernel takes bfloat16 / float16 activations (wgmma has no "
      "exact float32 form); got float32"
    )
  plan(m, k, n, q.spec, block, target)  # raise at trace time, outside the custom_vjp
  y = _pallas_vjp(x.reshape(m, k), q, block, target, interpret)
  return y.reshape(*lead, n)


def smem_bytes(x: jax.ShapeDtypeStruct, q, block=None) -> int:
  """Shared memory one program of the Mosaic GPU kernel allocates, as Mosaic GPU's lowering counts it.

  Lowers `pallas_matmul(x, q, block=block, target="mosaic_gpu")` for cuda (`mosaic_gpu.lowered_smem_bytes`);
  no GPU needed.
  """
  block = block or BlockConfig()
  return _mg.lowered_smem_bytes(
    lambda x, q: pallas_matmul(x, q, block=block, target="mosaic_gpu", interpret=False), x, q
  )


def w4a16_matmul(
  x: jax.Array,
  q: quant.QArray,
  *,
  block: BlockConfig = BlockConfig(),
  target: Target | None = None,
  interpret: bool | None = None,
) -> jax.Array:
  """W4A16: x [..., K] (bf16/f32) @ Int4(G) weights [K, N] -> [..., N] in x.dtype.

  Nibbles are unpacked with shift/mask, multiplied by their group scale and rounded to
  x.dtype in-kernel; the dot accumulates in f32. See `pallas_matmul` for the arguments.
  """
  _check(x, q, (quant.Int4,), "w4a16_matmul")
  return pallas_matmul(x, q, block=block, target=target, interpret=interpret)


def nvfp4_matmul(
  x: jax.Array,
  q: quant.QArray,
  *,
  block: BlockConfig = BlockConfig(),
  target: Target | None = None,
  interpret: bool | None = None,
) -> jax.Array:
  """x [..., K] @ NVFP4 weights [K, N] -> [..., N] in x.dtype.

  E2M1 nibbles are decoded arithmetically and scaled by their E4M3 block scale (exact in
  bf16 / f16 / f32), fed to a dot with f32 accumulation (Hopper has no FP4 tensor cores; this
  is the Marlin-FP4 scheme), and the f32 sum is multiplied by the per-matrix scale once
  (`quant.qdot`). See `pallas_matmul` for the arguments.
  """
  _check(x, q, (quant.NVFP4,), "nvfp4_matmul")
  return pallas_matmul(x, q, block=block, target=target, interpret=interpret)


# --------------------------------------------------------------------------- FP8


def _fp8_act_dot(x2: jax.Array, q: quant.QArray) -> jax.Array:
  """W8A8: per-token FP8 activations × per-channel FP8 weights, one native FP8 dot.

  y = (x_q @ w_q) · s_x[M, 1] · s_w[1, N]: both scales factor out of the K sum, so XLA gets
  an e4m3 × e4m3 dot with f32 accumulation (cuBLASLt FP8 GEMM on Hopper, through XLA's
  GEMM rewriter), which is already the optimal kernel.
  """
  xq = quant.quantize(x2, quant.FP8(granularity="token"), axis=-1)
  acc = jnp.dot(xq.codes, q.codes, preferred_element_type=jnp.float32)
  return (acc * xq.scale * q.scale).astype(x2.dtype)


@jax.custom_vjp
def _fp8_act_vjp(x2, q):
  return _fp8_act_dot(x2, q)


def _fp8_act_fwd(x2, q):
  return _fp8_act_dot(x2, q), q


def _fp8_act_bwd(q, g):
  # Straight-through through the activation quantizer: dx = g @ ŵᵀ.
  w = quant.dequantize(q, g.dtype)
  return jnp.dot(g, w.T, preferred_element_type=jnp.float32).astype(g.dtype), _zero_cotangent(q)


_fp8_act_vjp.defvjp(_fp8_act_fwd, _fp8_act_bwd)


def fp8_matmul(
  x: jax.Array,
  q: quant.QArray,
  *,
  act: str | None = None,
  block: BlockConfig = BlockConfig(),
  target: Target | None = None,
  interpret: bool | None = None,
) -> jax.Array:
  """x [..., K] @ FP8 / MXFP8 weights [K, N] -> [..., N] in x.dtype.

  Args:
    act: None — weight-only (W8A16): the Pallas kernel dequantizes E4M3 tiles in-kernel.
      "fp8_token" — also quantize x to E4M3 per token (dynamic, `FP8(granularity="token")`)
      and run XLA's native FP8 dot (FP8 channel weights only); there a Pallas kernel would
      only re-implement the cuBLASLt FP8 GEMM XLA already emits.
    block, target, interpret: see `pallas_matmul` (unused with act="fp8_token").
  """
  _check(x, q, (quant.FP8, quant.MXFP8), "fp8_matmul")
  if act is None:
    return pallas_matmul(x, q, block=block, target=target, interpret=interpret)
  if act != "fp8_token":
    raise ValueError(f"fp8_matmul: act must be None or 'fp8_token'; got {act!r}")
  if not (isinstance(q.spec, quant.FP8) and q.spec.granularity == "channel"):
    raise ValueError(
      f"fp8_matmul: act='fp8_token' needs FP8(granularity='channel') weights (scales that "
      f"factor out of the K sum); got {q.spec}"
    )
  k, n = q.shape
  lead = x.shape[:-1]
  m = int(np.prod(lead)) if lead else 1
  return _fp8_act_vjp(x.reshape(m, k), q).reshape(*lead, n)
