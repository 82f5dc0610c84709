"""A static roofline of the linear-layout kernel (`linear.py`) from its lowered Mosaic GPU module, no GPU needed.

    python -m lrl_jax.kernels.mosaic_model [--shapes 8192x8192] [--m 1,16]

Mosaic GPU compiles its kernels to PTX inside the CUDA plugin, on a GPU client, so unlike Triton's
(`triton_aot`) there is no machine code to read here. What can be read is the module Pallas hands to that
compiler: `lowered_kernel` lowers `mosaic_linear` for cuda and keeps it as MLIR text, `loop_op_mix` counts one
pipeline step's operations by kind, and `predicted` feeds them to `triton_aot.issue_model` (the same pipe rates
and H200 figures as the Triton model). An estimate of the machine code, not a count of it.
"""

from __future__ import annotations

import argparse
import itertools
import re
import types

import jax
import jax.numpy as jnp
from jax import export

from lrl_jax import quant
from lrl_jax.kernels import triton_aot
from lrl_jax.kernels.blocks import WGMMA_M, linear_plan
from lrl_jax.kernels.linear import linear_layout, mosaic_linear

__all__ = ["FORMATS", "lowered_kernel", "loop_op_mix", "predicted", "main"]

FORMATS = {"int4_g128": quant.Int4(), "nvfp4": quant.NVFP4()}  # what the linear-layout kernel takes


def lowered_kernel(x: jax.ShapeDtypeStruct, w, **kwargs) -> str:
  """The Mosaic GPU module of `mosaic_linear(x, w)` lowered for cuda, as MLIR text (no GPU needed)."""
  # Lazy: the Mosaic GPU bindings may be missing from an install, and are slow to import.
  from jax.experimental.mosaic.gpu import core  # noqa: PLC0415

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


_DEF = re.compile(r"^\s*(%[\w.#-]+)(?::\d+)? = ([\w.]+)(.*)$")
_OPERAND = re.compile(r"%[\w.#-]+")
# Side-effect-free ops LLVM hoists out of the loop when their operands are loop-invariant, and merges when they
# repeat (CSE). Views (bitcast / extract / broadcast of one register) are looked through.
_PURE = (
  "arith.",
  "vector.",
  "gpu.thread_id",
  "gpu.block_dim",
  "llvm.mlir.",
  "llvm.bitcast",
  "llvm.extractelement",
  "llvm.insertelement",
  "llvm.extractvalue",
  "builtin.unrealized_conversion_cast",
)
_VIEWS = ("vector.bitcast", "vector.extract", "vector.broadcast", "llvm.bitcast", "builtin.unrealized_conversion_cast")


def _loop_body(text: str) -> list[str]:
  lines = text.splitlines()
  start = next(i for i, line in enumerate(lines) if "scf.for" in line)
  depth, body = 0, []
  for line in lines[start:]:
    depth += line.count("{") - line.count("}")
    body.append(line)
    if depth <= 0 and len(body) > 1:
      break
  return body


def _kind(line: str) -> str | None:
  if "llvm.inline_asm" in line:
    if "sub.bf16x2" in line:
      return "convert"
    if "wgmma.mma_async" in line:
      return "wgmma"
    return "permute" if "prmt.b32" in line else None
  if "nvvm.shfl.sync" in line:
    return "shuffle"
  if re.search(r"= llvm\.load .*!llvm\.ptr<3>", line) or "= nvvm.ldmatrix " in line:
    return "smem_ld"
  if re.search(r"= arith\.(xori|andi|ori|shrui|shli|select|muli)\b.*: i32$", line):
    return "int32"
  if re.search(r"= arith\.(mulf|subf|addf)\b.*vector<2xbf16>", line):
    return "bf16x2"
  if re.search(r"= arith\.(mulf|subf|addf|truncf|extf)\b.*f32", line):
    return "f32"
  return None


def loop_op_mix(text: str, *, optimized: bool = False) -> dict[str, int]:
  """Per-thread operations of one pipeline step (the `scf.for` body) of a lowered kernel, by kind.

  Counted in the MLIR handed to Mosaic GPU's compiler, before LLVM and ptxas: an estimate of the machine code,
  not a count of it. `optimized=True` first drops what LLVM's loop-invariant code motion hoists (pure ops whose
  operands are all loop-invariant: lane-index arithmetic, its selects) and counts repeats of a pure op on the same
  operands once (CSE; views of one register are looked through). Kinds:
    convert  Mosaic GPU's int4 -> bf16 pair conversions (inline PTX: prmt, lop3, sub.bf16x2 each)
    permute  byte permutes (prmt): of the relayout to the wgmma layout, and NVFP4's one per pair of codes
    shuffle  warp shuffles of the relayout (shfl.sync)
    int32    32-bit integer / logic ops (nibble-sign flips, NVFP4's bit placement, shifts, swizzled addresses,
             selects)
    bf16x2   packed bf16 arithmetic (scale multiply, zero-point subtract)
    f32      f32 arithmetic and conversions (non-bf16 paths)
    smem_ld  loads from shared memory (codes, scales), one per instruction: ld.shared, or ldmatrix (jax >= 0.11
             reads the code tile with ldmatrix.x4, four 32-bit registers a thread each)
    wgmma    wgmma instructions (k16 each)
  """
  body = _loop_body(text)
  defined = {m.group(1) for line in body if (m := _DEF.match(line))}
  root: dict[str, str] = {}
  invariant: set[str] = set()
  seen: set[tuple] = set()
  mix = dict.fromkeys(("convert", "permute", "shuffle", "int32", "bf16x2", "f32", "smem_ld", "wgmma"), 0)
  for line in body:
    kind = _kind(line)
    m = _DEF.match(line)
    if m and optimized:
      res, op, rest = m.groups()
      args = [root.get(a, a) for a in _OPERAND.findall(rest.split(" : ")[0])]
      if op in ("arith.constant", "llvm.mlir.constant"):
        root[res] = rest.strip()  # a constant is its value: equal constants are one value
        invariant.add(root[res])
        continue
      pure = op.startswith(_PURE)
      if pure and all(a not in defined or a in invariant for a in args):
        invariant.add(res)
        continue  # hoisted out of the loop
      if op.startswith(_VIEWS) and len(args) == 1:
        root[res] = args[0]
        continue
      if pure:
        consts = re.sub(r"%[\w.#-]+", "", rest.split(" : ")[0])
        key = (op, tuple(args), consts)
        if key in seen:
          continue  # CSE
        seen.add(key)
    if kind:
      mix[kind] += 1
  return mix


def predicted(
  m: int,
  k: int,
  n: int,
  spec: quant.Spec = quant.Int4(),
  dtype=jnp.bfloat16,
  *,
  split_k=None,
  optimized: bool = False,
  text: str | None = None,
):
  """The static roofline of `triton_aot.issue_model` (H200: pipe rates, 132 SMs, 4.8 TB/s) fed with `loop_op_mix`.

  Pipes: int = 2 per conversion (prmt, lop3) + permutes + int32 ops; fp16 = 1 per conversion (sub.bf16x2) +
  bf16x2 ops; fp32 = f32 ops; mio = shuffles + shared-memory loads; issue = all of them + wgmma. With raw MLIR
  counts (optimized=False) an upper bound on the instructions and a lower bound on the share of HBM bandwidth;
  with optimized=True the counts after the CSE and hoisting LLVM does. Either way under the model's own
  assumptions (no latency, perfect overlap). text: the lowered kernel, if already at hand. Returns (mix, model).
  """
  w = jax.eval_shape(
    lambda a: linear_layout(quant.quantize(a, spec, axis=-2)), jax.ShapeDtypeStruct((k, n), jnp.float32)
  )
  p = linear_plan(m, k, n, w, split_k=split_k)
  text = text or lowered_kernel(jax.ShapeDtypeStruct((m, k), dtype), w, split_k=split_k)
  mix = loop_op_mix(text, optimized=optimized)
  pipes = {
    "int": 2 * mix["convert"] + mix["permute"] + mix["int32"],
    "fp16": mix["convert"] + mix["bf16x2"],
    "fp32": mix["f32"],
    "conv": 0,
    "mio": mix["shuffle"] + mix["smem_ld"],
  }
  total = sum(pipes.values()) + mix["wgmma"]
  # issue_model reads split_k, bk and bn (here the 64 weight rows of a program).
  plan_ = types.SimpleNamespace(split_k=p.split_k, bk=p.bk, bn=WGMMA_M)
  w_bytes = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(w))
  model = triton_aot.issue_model(
    {"pipes": pipes, "total": total},
    plan_=plan_,
    k=k,
    n=n,
    m=m,
    programs=(n // WGMMA_M) * (p.m_pad // p.mt) * p.split_k,
    num_warps=4,
    nbytes=w_bytes + m * k * 2,
    sm=triton_aot.SMS[90],
  )
  return mix, model


def main(argv=None) -> int:
  """The lowered linear kernel's per-step operation mix and its static roofline, as a Markdown table.

  Each row: the raw MLIR counts, then int / all instructions per code and the predicted share of HBM bandwidth
  raw and after LLVM's CSE and loop-invariant hoisting ("opt").
  """
  ap = argparse.ArgumentParser(prog="python -m lrl_jax.kernels.mosaic_model", description=main.__doc__)
  ap.add_argument("--shapes", default="4096x4096,4096x14336,8192x8192")
  ap.add_argument("--m", default="1,16,64")
  ap.add_argument("--formats", default="int4_g128,nvfp4", help=f"subset of {','.join(FORMATS)}")
  a = ap.parse_args(argv)
  print(
    "| K x N | M | format | split-K | convert | permute | shuffle | int32 (opt) | bf16x2 | smem ld | wgmma "
    "| int / code (opt) | all / code (opt) | bound (opt) | predicted share of HBM: raw | opt |"
  )
  print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
  for shape, m, fmt in itertools.product(a.shapes.split(","), a.m.split(","), a.formats.split(",")):
    k, n = (int(v) for v in shape.lower().split("x"))
    m, spec = int(m), FORMATS[fmt]
    w = jax.eval_shape(
      lambda w, spec=spec: linear_layout(quant.quantize(w, spec, axis=-2)), jax.ShapeDtypeStruct((k, n), jnp.float32)
    )
    text = lowered_kernel(jax.ShapeDtypeStruct((m, k), jnp.bfloat16), w)
    mix, raw = predicted(m, k, n, spec, text=text)
    opt_mix, opt = predicted(m, k, n, spec, optimized=True, text=text)
    p = linear_plan(m, k, n, w)
    print(
      f"| {k}x{n} | {m} | {fmt} | {p.split_k} | {mix['convert']} | {mix['permute']} | {mix['shuffle']} | "
      f"{mix['int32']} ({opt_mix['int32']}) | {mix['bf16x2']} | {mix['smem_ld']} | {mix['wgmma']} | "
      f"{raw.per_weight['int']:.2f} ({opt.per_weight['int']:.2f}) | "
      f"{raw.per_weight['issue']:.2f} ({opt.per_weight['issue']:.2f}) | {raw.bound} ({opt.bound}) | "
      f"{raw.hbm_fraction:.0%} | {opt.hbm_fraction:.0%} |"
    )
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
