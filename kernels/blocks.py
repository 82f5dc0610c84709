"""Block configurations and the tile plans of the low-bit matmuls.

A `BlockConfig` is what a caller may tune; a `Plan` is what one call runs with,
resolved from the config, the shapes, the format and the target backend. All
shape rules live here, so `supported(...)` and the kernels agree on them.

Shapes: x [M, K] (leading dims already flattened), weight [K, N], group size g
along K. Two schedules share one kernel body (see README.md):

  "k_grid"  grid (M/bm, N/bn, K/bk); K is the last, sequential ("arbitrary") grid
            axis and the f32 output block is the accumulator. Mosaic TPU.
  "k_loop"  grid (M/bm, N/bn, S); each program owns K/S of the contraction and
            walks it in chunks of bk with an in-kernel `fori_loop`; the S partial
            sums (split-K) are added outside. Triton (GPU), whose grid is parallel.

A tile left at None is chosen per target and shape (the largest legal tile up to the
target's default that divides the dimension); a tile you set is used as is, and a
dimension it does not divide raises `Unsupported`. Weights are never padded: that
would copy them on every call, the very traffic the kernels exist to avoid. M is padded
to the row tile on TPU and masked on GPU.

`LinearPlan` is the plan of the linear-layout kernel (`linear.py`: x [M, K] @ ŵᵀ for a weight
[N, K] quantized along K), resolved by `linear_plan`: per program 64 weight rows and mt
activation rows (M rounded up to 8, at most 128), split-K, and as many pipeline steps in
flight as its shared memory holds. `supported_linear` and `mosaic_linear` both ask it.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Literal

import jax.numpy as jnp

from lrl_jax import quant

__all__ = ["BlockConfig", "Plan", "plan", "Unsupported", "DEFAULTS", "LinearPlan", "linear_plan"]

# "gpu" is Pallas Triton (the k_loop schedule); "mosaic_gpu" the Hopper `wgmma` kernel of mosaic_gpu.py,
# which walks K like k_loop but with a 64-row tile and TMA pipelining.
Target = Literal["tpu", "gpu", "mosaic_gpu"]

# Per-target default tiles (upper bounds of the automatic choice).
#   TPU: blocks big enough to amortize the ~0.35 us per grid step, small enough that the
#        in-kernel int32 / f32 intermediates of a (bk/2, bn) = (512, 256) code block (512 KiB
#        each) stay well inside the default scoped VMEM (16 MiB on v5e).
#   GPU: Triton tiles; split-K fills the SMs when M/bm · N/bn programs are too few (decode).
#        Chosen so that no default plan spills registers or crowds shared memory on sm_90, as
#        compiled by `python -m lrl_jax.kernels.triton_aot` (README.md, "Compiled for sm_90"):
#        at bk = 256, NVFP4 and zero-point INT4 hit the 255-register cap and spilled (48-160 B
#        per thread at M <= 16, NVFP4 2.9 KB at M = 64) and FP8 / MXFP8 at M = 64 used 224-226 KiB
#        of shared memory, within 1 KiB of the 227 KiB launch limit. bk = 128 and 8 warps for the
#        64-row tile leave every format spill-free. Not timed: no GPU was available.
#   Mosaic GPU: 64 code rows per chunk (bk 128 for 4-bit formats, 64 for 8-bit), bn 128: a (64, 128) tile
#        dequantized in the `wgmma` register layout. Shared memory with 3 chunks in flight: 3 x 25 KiB of
#        TMA buffers plus the bf16 operands (2 x 16 KiB) and a 32 KiB f32 tile for the expanded scales, which
#        then stages the output tile: 141-173 KiB per program (`matmul.smem_bytes`).
DEFAULTS = {"tpu": {"bn": 256, "bk": 1024}, "gpu": {"bn": 128, "bk": 128}, "mosaic_gpu": {"bn": 128, "bk": 128}}
# Rows of one warpgroup MMA (the wgmma M), whose register layout is 64-row tiles: on Mosaic GPU the row tile and
# the code rows per chunk (mosaic_gpu.py), the weight rows per program of the linear-layout kernel (linear.py).
WGMMA_M = 64
_GPU_MAX_PROGRAMS = 264  # 2 waves on an H100/H200 (132 SMs): the split-K heuristic's target
_TPU_MAX_FULL_N = 1024  # full-dimension TPU blocks above these would crowd VMEM
_TPU_MAX_FULL_K = 4096


class Unsupported(ValueError):
  """A shape / format / backend combination no Pallas kernel here can run (XLA can)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class BlockConfig:
  """Tile sizes; None lets `plan` choose per target and shape.

  Attributes:
    bm: largest row tile; the actual one is the smallest allowed tile >= M, up to bm
      (M is padded up to a multiple of it on TPU; masked on GPU).
    bn: output-column tile. None: the largest legal divisor of N up to the target default.
    bk: contraction chunk (logical K elements dequantized and fed to one dot).
      None: the largest legal divisor of K up to the target default.
    split_k: "k_loop" schedule only: K splits run as separate programs whose f32 partial
      sums are added outside (fills the GPU at small M). None: a heuristic.
    schedule: "auto" (k_grid on TPU, k_loop on GPU), "k_grid" or "k_loop".
    num_warps: Triton warps per program (GPU only). None: 4 for row tiles below 64, 8 for the
      64-row tile (whose wgmma accumulators and dequantized tiles would otherwise spill).
    num_stages: Triton software-pipelining depth (GPU only); on Mosaic GPU, the chunks in flight
      (`emit_pipeline`'s max_concurrent_steps).
  """

  bm: int = 64
  bn: int | None = None
  bk: int | None = None
  split_k: int | None = None
  schedule: Literal["auto", "k_grid", "k_loop"] = "auto"
  num_warps: int | None = None
  num_stages: int = 3

  def __post_init__(self):
    for f in ("bm", "bn", "bk", "split_k", "num_warps", "num_stages"):
      v = getattr(self, f)
      optional = f in ("bn", "bk", "split_k", "num_warps")
      if v is None and optional:
        continue
      if not isinstance(v, int) or v <= 0:
        raise ValueError(f"BlockConfig.{f} must be a positive int{' or None' if optional else ''}; got {v!r}")
    if self.schedule not in ("auto", "k_grid", "k_loop"):
      raise ValueError(f"BlockConfig.schedule must be 'auto', 'k_grid' or 'k_loop'; got {self.schedule!r}")


@dataclasses.dataclass(frozen=True)
class Plan:
  """Concrete tiles of one call.

  Attributes:
    schedule: "k_grid" or "k_loop".
    bm, bn, bk: row, column and contraction tiles (bk in logical K elements).
    m_pad: M rounded up to a multiple of bm.
    split_k: K splits ("k_loop"); 1 for "k_grid".
    packed: two 4-bit codes per byte along K (Int4, NVFP4).
    kg: K elements per scale row (the group size; K for FP8 channel: one row for all of K).
    ng: N columns per scale column (1, or the FP8 block edge).
    channel: one scale row for all of K (FP8 channel): the scale block is (1, bn) at every K step.
    num_warps: Triton warps per program (GPU).
    stages: chunks in flight (Triton num_stages / Mosaic GPU max_concurrent_steps).
  """

  schedule: str
  bm: int
  bn: int
  bk: int
  m_pad: int
  split_k: int
  packed: bool
  kg: int
  ng: int
  channel: bool
  num_warps: int = 4
  stages: int = 3


def _pow2(n: int) -> bool:
  return n > 0 and n & (n - 1) == 0


def _next_pow2(n: int) -> int:
  return 1 << max(n - 1, 0).bit_length()


def scale_groups(spec: quant.Spec, k: int) -> tuple[int, int]:
  """(K elements per scale row, N columns per scale column) of a weight QArray [K, N], axis=-2."""
  if isinstance(spec, quant.FP8):
    if spec.granularity == "block":
      return spec.block, spec.block
    return k, 1  # one scale per output channel: scale [1, N]
  return spec.block, 1


def _choose(dim: int, want: int | None, default: int, legal, what: str, name: str) -> int:
  """`want` if set (it must divide `dim` and be legal); else the largest legal divisor <= default."""
  if want is not None:
    if dim % want:
      raise Unsupported(f"{name}: {what}={dim} is not a multiple of the tile {want}")
    if not legal(want):
      raise Unsupported(f"{name}: tile {want} for {what}={dim} breaks the target's tile rules")
    return want
  cands = [c for c in range(1, dim + 1) if dim % c == 0 and legal(c)]
  if not cands:
    raise Unsupported(f"{name}: no legal tile divides {what}={dim}")
  below = [c for c in cands if c <= default]
  return max(below) if below else min(cands)


def plan(m: int, k: int, n: int, spec: quant.Spec, block: BlockConfig, target: Target) -> Plan:
  """Resolves `block` for x [m, k] @ w [k, n] in `spec` on `target`.

  Raises:
    Unsupported (a ValueError) naming the dimension and the tile that do not fit.
  """
  name = spec.name
  if isinstance(spec, quant.FP8) and spec.granularity == "token":
    raise Unsupported(
      f"{name}: per-token scales belong to activations; a weight [K, N] needs FP8(granularity='channel' or 'block')"
    )
  packed = isinstance(spec, (quant.Int4, quant.NVFP4))
  kg, ng = scale_groups(spec, k)
  per_row = 2 if packed else 1
  schedule = block.schedule
  if schedule == "auto":
    schedule = "k_grid" if target == "tpu" else "k_loop"
  if target == "mosaic_gpu" and schedule != "k_loop":
    raise Unsupported(f"{name}: the Mosaic GPU kernel walks K in-kernel (schedule 'k_loop'); got {schedule!r}")
  dflt = DEFAULTS[target]

  # Rows: the smallest allowed tile covering M (decode pads 1 -> 16, not to bm).
  # Triton's tl.dot needs every dimension >= 16 and powers of two; TPU bf16 packs 16 rows per vreg.
  # Mosaic GPU: always the 64 rows of one warpgroup MMA.
  bm = min(max(16, _next_pow2(m)), max(16, _next_pow2(block.bm)))
  if target == "mosaic_gpu":
    bm = WGMMA_M
  m_pad = -(-m // bm) * bm

  def group_ok(c: int) -> bool:  # a chunk holds whole scale groups
    return kg >= k or c % kg == 0

  if target == "tpu":
    if ng > 1 and n != ng:
      raise Unsupported(f"{name}: on TPU the block-scale tile (bk/{kg}, 1) breaks Mosaic's (8, 128) block tiling")

    # Mosaic: the last two dims of every block are multiples of (8, 128) or the full dims.
    # Blocks: x (bm, bk/per_row), codes (bk/per_row, bn), scale (bk/kg, bn).
    def n_ok(c: int) -> bool:
      return c % 128 == 0 or (c == n and n <= _TPU_MAX_FULL_N)

    # Scale rows per block: a multiple of the scale dtype's sublane tiling. 8 for 16- and 32-bit scales; 32
    # for the 8-bit ones (NVFP4's e4m3, MXFP8's e8m0), which Mosaic tiles (32, 128) in memory: a (48, 576)
    # block of NVFP4 scales [96, 576] (SmolLM2's down projection) failed with E2002 (`make test-aot`).
    srow_tile = 32 if isinstance(spec, (quant.NVFP4, quant.MXFP8)) else 8

    def k_ok(c: int) -> bool:
      xk = c // per_row
      srows = c // kg if kg < k else 1
      return (
        group_ok(c)
        and c % per_row == 0
        and (xk % 128 == 0 or c == k)
        and (srows % srow_tile == 0 or c == k or kg >= k)
        and c <= max(_TPU_MAX_FULL_K, dflt["bk"])
      )
  elif target == "mosaic_gpu":
    if isinstance(spec, quant.FP8) and spec.granularity == "block":
      raise Unsupported(f"{name}: FP8 block scales are not expressed in the Mosaic GPU kernel (Triton / XLA)")

    def n_ok(c: int) -> bool:  # the wgmma N (<= 256) and a 128-byte-swizzled bf16 operand
      return c % 64 == 0 and c <= 256

    def k_ok(c: int) -> bool:  # whole scale groups; 64 code rows, the wgmma register layout's tile
      return group_ok(c) and c % per_row == 0 and c // per_row == WGMMA_M
  else:
    # Triton: power-of-two tiles, dots >= 16 on every side.
    def n_ok(c: int) -> bool:
      return _pow2(c) and c >= 16 and (ng == 1 or c == ng)

    def k_ok(c: int) -> bool:
      rows = c // per_row
      srows = c // kg if kg < k else 1
      return group_ok(c) and c % per_row == 0 and _pow2(rows) and rows >= 16 and _pow2(srows)

  if target == "mosaic_gpu":
    dflt = {**dflt, "bk": WGMMA_M * per_row}
  bn = _choose(n, block.bn, ng if ng > 1 else dflt["bn"], n_ok, "N", name)

  split_k = 1
  if schedule == "k_loop":
    if block.split_k is not None:
      split_k = block.split_k
      if k % split_k:
        raise Unsupported(f"{name}: K={k} is not a multiple of split_k={split_k}")
    else:
      # Enough programs to fill the GPU at decode, each still walking >= 2 chunks.
      programs = (m_pad // bm) * (n // bn)

      def best_chunk(ks: int) -> int:
        return max([c for c in range(16, min(ks, dflt["bk"]) + 1) if ks % c == 0 and k_ok(c)], default=0)

      def split_ok(s: int) -> bool:  # splitting must not shrink the chunk (nor leave < 2 per split)
        ks = k // s
        return k % s == 0 and (kg >= k or ks % kg == 0) and ks >= 2 * dflt["bk"] and best_chunk(ks) == best_chunk(k)

      while split_k < 8 and programs * split_k * 2 <= _GPU_MAX_PROGRAMS and split_ok(split_k * 2):
        split_k *= 2
  ks = k // split_k
  if block.bk is not None and ks % block.bk:
    raise Unsupported(f"{name}: K={k} is not a multiple of split_k*bk={split_k}*{block.bk}")
  bk = _choose(ks, block.bk, dflt["bk"], k_ok, "K" if split_k == 1 else "K/split_k", name)
  if split_k > 1 and kg < k and ks % kg:
    raise Unsupported(f"{name}: K/split_k={ks} is not a multiple of the group size {kg}")
  num_warps = block.num_warps or (8 if bm >= 64 else 4)
  if target == "mosaic_gpu":
    num_warps = 4  # one warpgroup
  return Plan(
    schedule=schedule,
    bm=bm,
    bn=bn,
    bk=bk,
    m_pad=m_pad,
    split_k=split_k,
    packed=packed,
    kg=kg,
    ng=ng,
    channel=kg >= k,
    num_warps=num_warps,
    stages=block.num_stages,
  )


# --------------------------------------------------------------------------- the linear-layout kernel

_LINEAR_BK = 128  # logical K per pipeline step: a 64-byte row of int4 codes, a 256-byte row of bf16 activations
_LINEAR_MT_MAX = 128  # activation rows per program: the wgmma N (multiple of 8, <= 256); 128 keeps acc at 64 regs
# Split-K target: about 4 programs per SM of an H200 (132 SMs). A program holds ~30 KiB of shared memory and few
# registers, so all of them are resident at once; 4 per SM keep 4 x 4 steps x 4 KiB = 64 KiB of codes in flight per
# SM, against the ~25 KiB Little's law asks (4.8 TB/s x ~0.7 us / 132). Reasoning, not timed: the device run sweeps
# split_k (scripts/device_check.sh).
_LINEAR_MAX_PROGRAMS = 528
_LINEAR_STAGES = 4
# Shared memory one program may have on sm_90 (227 KiB), less a margin for what `_linear_smem_bytes` does not count
# (barriers, alignment, the interpreter's unused scratch: the lowered kernels of tests/kernels/test_linear.py took
# 3-5 KiB more than the count).
_LINEAR_SMEM_BUDGET = (227 - 8) * 1024
_TMA_BOX = 256  # elements per dimension of one TMA copy


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
  stages: int = _LINEAR_STAGES

  @property
  def slices(self) -> int:
    """wgmma calls per step: one per scale group in the chunk (G < bk), else one."""
    return max(1, self.bk // self.group)

  @property
  def width(self) -> int:
    """K columns per wgmma call: one scale group, or the whole step."""
    return self.bk // self.slices


def _linear_smem_bytes(mt: int, stages: int, ns: int, scale_bytes: int, *, has_zp: bool, nvfp4: bool) -> int:
  """Shared memory of one program: the pipelined activation and code tiles, the program's scales (NVFP4: also
  their bf16 form; zero points), and the f32 output tile."""
  per_step = mt * _LINEAR_BK * 2 + WGMMA_M * _LINEAR_BK // 2
  return stages * per_step + WGMMA_M * ns * (scale_bytes + 2 * nvfp4 + has_zp) + WGMMA_M * mt * 4


def linear_plan(
  m: int, k: int, n: int, q: quant.QArray, *, split_k: int | None = None, stages: int | None = None
) -> LinearPlan:
  """The tile plan of x [m, k] @ ŵᵀ for w [n, k], or `Unsupported` naming what does not fit.

  split_k: programs per output tile along K; None picks it (see `_LINEAR_MAX_PROGRAMS`). stages: steps in flight; None:
  4, or as many as shared memory holds (at least 2).
  """
  spec = q.spec
  if not isinstance(spec, (quant.Int4, quant.NVFP4)):
    raise Unsupported(f"{spec.name}: the linear-layout kernel takes Int4 and NVFP4; other formats take XLA")
  g = spec.block
  if g % 16 or not (g <= _LINEAR_BK and _LINEAR_BK % g == 0 or g % _LINEAR_BK == 0):
    raise Unsupported(
      f"{spec.name}: group size {g} is not a multiple of 16 that divides or is divided by the {_LINEAR_BK}-wide K step"
    )
  if n % WGMMA_M:
    raise Unsupported(f"{spec.name}: N={n} is not a multiple of the {WGMMA_M} weight rows of one wgmma")
  if k % _LINEAR_BK:
    raise Unsupported(f"{spec.name}: K={k} is not a multiple of the {_LINEAR_BK}-wide K step")
  sbytes = jnp.dtype(q.scale.dtype).itemsize
  per_row = [(k // g) * sbytes] + ([k // g] if q.zero_point is not None else [])
  if any(b % 16 for b in per_row):
    raise Unsupported(
      f"{spec.name}: a row of scales / zero points is {per_row} bytes (K={k}, G={g}); TMA needs a multiple of 16"
    )
  mt = min(-(-m // 8) * 8, _LINEAR_MT_MAX)
  m_pad = -(-m // mt) * mt
  programs = (n // WGMMA_M) * (m_pad // mt)

  def split_ok(s: int) -> bool:  # >= 2 steps per split, whole groups, 16-byte scale / zero-point boxes
    ks = k // s
    return (
      k % s == 0
      and ks % _LINEAR_BK == 0
      and ks >= 2 * _LINEAR_BK
      and ks % g == 0
      and all((b // s) % 16 == 0 for b in per_row)
    )

  if split_k is not None:
    if split_k < 1 or (split_k > 1 and not split_ok(split_k)):
      raise Unsupported(
        f"{spec.name}: split_k={split_k} does not cut K={k} into whole groups of >= 2 steps with 16-byte scale rows"
      )
  else:
    split_k = 1
    while split_k < 8 and programs * split_k * 2 <= _LINEAR_MAX_PROGRAMS and split_ok(split_k * 2):
      split_k *= 2
    while k // split_k // g > _TMA_BOX and split_ok(split_k * 2):  # one TMA copy brings a program's scales
      split_k *= 2
  if k // split_k // g > _TMA_BOX:
    raise Unsupported(
      f"{spec.name}: {k // split_k // g} scale columns per program (K={k}, G={g}, "
      f"split_k={split_k}); one TMA copy takes at most {_TMA_BOX}"
    )
  smem = functools.partial(
    _linear_smem_bytes,
    mt,
    ns=k // split_k // g,
    scale_bytes=sbytes,
    has_zp=q.zero_point is not None,
    nvfp4=isinstance(spec, quant.NVFP4),
  )
  if stages is None:
    stages = _LINEAR_STAGES
    while stages > 2 and smem(stages) > _LINEAR_SMEM_BUDGET:
      stages -= 1
  if stages < 1:
    raise Unsupported(f"{spec.name}: stages={stages}; at least 1 step in flight")
  if smem(stages) > _LINEAR_SMEM_BUDGET:
    raise Unsupported(
      f"{spec.name}: {smem(stages) // 1024} KiB of shared memory per program (M={m}, K={k}, "
      f"split_k={split_k}, stages={stages}); sm_90 allows {_LINEAR_SMEM_BUDGET // 1024} with margin"
    )
  return LinearPlan(mt=mt, m_pad=m_pad, bk=_LINEAR_BK, split_k=split_k, group=g, stages=stages)
