"""Ahead-of-time Triton compile of the GPU kernels: NVIDIA machine code and its resources, no GPU needed.

    python -m lrl_jax.kernels.triton_aot [--arch 90] [--shapes 8192x8192] [--m 1,16] [--formats ...]

`jax.export` (tests/kernels/test_lowering.py) stops at the Triton IR that jax hands to XLA.
This module goes the rest of the way on a machine without a GPU: it captures that IR
(the TTIR text of each `pallas_call`, as jax lowers it for `cuda`), compiles it with the
`triton` package (pinned in the `aot` extra) for a chosen SM — TTIR -> TTGIR -> LLVM ->
PTX -> cubin, `ptxas` included — and reads back what the hardware would be given:
registers per thread, local memory (spills), shared memory per program, the MMA
instruction, the widths of the global loads. From those and the SM's published limits it
derives occupancy (programs resident per SM) and the number of waves of the grid.

It also reads the machine code itself (`cuobjdump -sass`): the instructions of the kernel's main loop,
one K chunk per iteration, sorted by the SM pipe that executes them (`instruction_mix`). Against the
per-SM issue rates of the CUDA C++ Programming Guide's throughput table that gives a lower bound on the
time the loop needs per chunk, next to the time HBM needs for the chunk's bytes (`IssueModel`): a
static roofline, for a team without the GPU to run the kernels on.

What it shows is what XLA's own Triton pipeline would do up to version differences: XLA
compiles the same TTIR with the Triton bundled in jaxlib, not this package, so
layouts and register counts can differ in detail. It checks that the kernels compile
for the SM and that no tile plan spills or overflows shared memory; it measures no time.

The IR is captured by wrapping jax's private `lower_jaxpr_to_triton_module` while
lowering; a jax without it raises a RuntimeError naming the missing hook.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import inspect
import math
import os
import re
import subprocess
import tempfile
import time

import jax
import jax.numpy as jnp
from jax import export

from lrl_jax import quant
from lrl_jax.kernels.blocks import BlockConfig, plan
from lrl_jax.kernels.matmul import pallas_matmul

__all__ = [
  "SM",
  "SMS",
  "TritonIR",
  "CompileReport",
  "cuda_target",
  "lowered_triton_irs",
  "triton_ir",
  "compile_ir",
  "compile_kernel",
  "occupancy",
  "instruction_mix",
  "issue_model",
  "IssueModel",
  "PIPE_RATES",
  "main",
]


@dataclasses.dataclass(frozen=True)
class SM:
  """Per-SM limits of one NVIDIA architecture (CUDA C Programming Guide, compute capabilities table).

  Attributes:
    arch: compute capability as an int (90 = sm_90).
    sms: streaming multiprocessors of the named device.
    regs: 32-bit registers per SM; allocated per warp in units of `reg_unit`.
    max_regs_thread: registers one thread may use.
    smem: shared memory per SM (bytes); `smem_block` the most one program may use, and each
      resident program costs `smem_reserved` more (the driver's share).
    warps, blocks: resident warps / programs per SM.
  """

  arch: int
  device: str
  sms: int
  regs: int = 65536
  reg_unit: int = 256
  max_regs_thread: int = 255
  smem: int = 228 * 1024
  smem_block: int = 227 * 1024
  smem_reserved: int = 1024
  warps: int = 64
  blocks: int = 32
  clock_ghz: float = 1.98
  hbm_tbps: float = 4.8


SMS = {
  90: SM(arch=90, device="H100/H200 SXM", sms=132),  # clock and HBM: H200 SXM (boost 1.98 GHz, 4.8 TB/s)
  89: SM(arch=89, device="L40S", sms=142, smem=100 * 1024, smem_block=99 * 1024, warps=48, blocks=24),
  80: SM(arch=80, device="A100", sms=108, smem=164 * 1024, smem_block=163 * 1024, blocks=32),
}


@dataclasses.dataclass(frozen=True)
class TritonIR:
  """One `pallas_call` as jax lowers it for Triton: TTIR text and its launch parameters."""

  name: str
  ttir: str
  num_warps: int
  num_stages: int


@dataclasses.dataclass(frozen=True)
class CompileReport:
  """What `ptxas` produced for one kernel, and the occupancy that follows on `sm`.

  Attributes:
    name: kernel name; plan: the tile plan; programs: grid size (M/bm · N/bn · split-K).
    registers, local_bytes: per thread; local_bytes is ptxas's LOCAL + STACK (> 0: spills to memory).
    shared_bytes: dynamic shared memory per program (Triton's pipelining buffers).
    mma: the tensor-core instruction(s) the dot became ("" when none).
    load_widths: {bytes per global->shared / global->register load instruction: count} in the PTX.
    per_sm: programs resident per SM and what limits it ("registers", "shared", "warps", "blocks").
    waves: programs / (per_sm · SMs).
    mix: the main loop's instructions per thread by pipe (`instruction_mix`); model: `IssueModel` of the
      whole matmul (None when the loop was not found).
  """

  name: str
  arch: int
  m: int
  k: int
  n: int
  plan: object
  programs: int
  num_warps: int
  num_stages: int
  registers: int
  local_bytes: int
  shared_bytes: int
  mma: str
  load_widths: dict
  per_sm: int
  limit: str
  waves: float
  mix: dict = dataclasses.field(default_factory=dict)
  model: object = None

  @property
  def fits(self) -> bool:
    """Launchable on the SM: registers and shared memory within one program's limits."""
    sm = SMS[self.arch]
    return self.registers <= sm.max_regs_thread and self.shared_bytes <= sm.smem_block and self.per_sm >= 1


@contextlib.contextmanager
def cuda_target(device_kind: str = "NVIDIA H200"):
  """A context in which the Pallas Triton kernels lower for `cuda` (`jax.export`) on a machine without a GPU.

  jax < 0.11 lowers them without asking for a GPU. jax >= 0.11 reads the target's compute capability from the GPU,
  or, where there is none, from the abstract mesh's device (`jax.sharding.AbstractDevice`): this sets one, an H200
  by default (sm_90, as the kernels' targets). A machine with a GPU lowers for its own.
  """
  if jax.__version_info__ < (0, 11) or any(d.platform == "gpu" for d in jax.devices()):
    yield
    return
  device = jax.sharding.AbstractDevice(device_kind=device_kind, num_cores=None, platform="gpu")
  mesh = jax.sharding.AbstractMesh(
    (1,), ("_cuda_target",), axis_types=(jax.sharding.AxisType.Auto,), abstract_device=device
  )
  with jax.sharding.use_abstract_mesh(mesh):
    yield


def _hook():
  try:  # lazy: Pallas's Triton backend may be absent (deprecated from jax 0.11)
    from jax._src.pallas.triton import pallas_call_registration as reg  # noqa: PLC0415
  except ImportError as e:  # pragma: no cover - depends on the jax version
    raise RuntimeError(f"triton_aot: this jax ({jax.__version__}) has no Pallas Triton backend: {e}") from e
  if not hasattr(getattr(reg, "lowering", None), "lower_jaxpr_to_triton_module"):  # pragma: no cover
    raise RuntimeError(
      f"triton_aot: jax {jax.__version__} has no "
      "pallas.triton.lowering.lower_jaxpr_to_triton_module to capture the TTIR from"
    )
  return reg


@contextlib.contextmanager
def _capture(out: list):
  reg = _hook()
  orig = reg.lowering.lower_jaxpr_to_triton_module

  def wrapped(*args, **kwargs):
    result = orig(*args, **kwargs)
    # The launch parameters live in the caller (jax's pallas_call lowering rule), not in the TTIR.
    caller = inspect.currentframe().f_back.f_locals
    out.append((result.module.operation.get_asm(), caller.get("num_warps"), caller.get("num_stages")))
    return result

  reg.lowering.lower_jaxpr_to_triton_module = wrapped
  try:
    yield
  finally:
    reg.lowering.lower_jaxpr_to_triton_module = orig


def lowered_triton_irs(fn, *args) -> list[TritonIR]:
  """The TTIR and launch parameters of every Pallas Triton kernel in `jax.jit(fn)(*args)` lowered for cuda."""
  found: list = []
  checks = [export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
  with _capture(found), cuda_target():
    export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=checks)(*args)
  irs = []
  for text, warps, stages in found:
    if not isinstance(warps, int) or not isinstance(stages, int):  # pragma: no cover - depends on the jax version
      raise RuntimeError(f"triton_aot: jax {jax.__version__}'s Triton lowering no longer holds num_warps / num_stages")
    irs.append(TritonIR(re.search(r"tt\.func public @([\w$.]+)", text).group(1), text, warps, stages))
  return irs


def triton_ir(x: jax.ShapeDtypeStruct, q, *, block: BlockConfig = BlockConfig()) -> list[TritonIR]:
  """The TTIR of the Pallas kernel(s) that `pallas_matmul(x, q, target="gpu")` lowers to.

  Args:
    x: activations [M, K] (array or ShapeDtypeStruct).
    q: a weight QArray [K, N] along K, or its `jax.eval_shape`.
    block: tiles, as for the kernels.
  """
  irs = lowered_triton_irs(lambda x, q: pallas_matmul(x, q, block=block, target="gpu", interpret=False), x, q)
  if not irs:
    raise RuntimeError("triton_aot: lowering for cuda produced no Triton kernel")
  return irs


def _tool(name: str) -> str:
  # Lazy: triton is optional (the `aot` extra).
  import triton.backends.nvidia as nv  # noqa: PLC0415

  path = os.path.join(os.path.dirname(nv.__file__), "bin", name)
  if not os.path.exists(path):
    raise RuntimeError(f"triton_aot: {name} not found at {path} (the triton wheel ships it)")
  return path


_WIDTH = re.compile(
  r"^\s*(?:@%p\d+\s+)?(cp\.async\.c[ag]\.shared\.global|ld\.global[\w.]*)\s*\[[^\]]*\],?"
  r"\s*(?:\[[^\]]*\],\s*(0x[0-9a-f]+|\d+))?",
  re.M,
)


def _load_widths(ptx: str) -> dict:
  widths = collections.Counter()
  for op, size in _WIDTH.findall(ptx):
    if op.startswith("cp.async"):
      widths[int(size, 0)] += 1
    else:
      vec = re.search(r"\.v(\d)", op)
      bits = re.search(r"\.[bfsu](8|16|32|64)$", op)
      widths[(int(vec.group(1)) if vec else 1) * (int(bits.group(1)) // 8 if bits else 4)] += 1
  return dict(sorted(widths.items()))


def _mma(ptx: str) -> str:
  kinds = sorted(set(re.findall(r"\b((?:wgmma\.mma_async|mma)\.sync[\w.]*|wgmma\.mma_async[\w.]*)", ptx)))
  return ", ".join(kinds)


def occupancy(sm: SM, *, registers: int, shared: int, warps: int) -> tuple[int, str]:
  """Programs resident per SM and the binding limit (the CUDA occupancy calculator's rules)."""
  per_warp = math.ceil(max(registers, 1) * 32 / sm.reg_unit) * sm.reg_unit
  limits = {
    "registers": (sm.regs // per_warp) // warps,
    "shared": sm.smem // (shared + sm.smem_reserved) if shared else sm.blocks,
    "warps": sm.warps // warps,
    "blocks": sm.blocks,
  }
  if shared > sm.smem_block or registers > sm.max_regs_thread:
    return 0, "shared" if shared > sm.smem_block else "registers"
  limit = min(limits, key=lambda k: (limits[k], list(limits).index(k)))
  return limits[limit], limit


# Issue rates of sm_80 / sm_90 in warp-instructions per clock per SM: the CUDA C++ Programming Guide's
# "throughput of native arithmetic instructions" (results per clock per SM) divided by 32 lanes. The integer
# ALU (and / or / xor, shifts, add, compare, multiply-add, byte permute) gives 64, FP32 128, packed
# half / bf16 256 results (128 instructions' lanes), "all other type conversions" 16. Shared-memory
# instructions (LDS / STS / LDSM) are taken at one per clock per SM (32 lanes of 4 bytes = the 128 B/clock
# of shared-memory bandwidth), and issue at one instruction per clock per sub-partition (4 per SM).
PIPE_RATES = {"int": 2.0, "fp32": 4.0, "fp16": 4.0, "conv": 0.5, "mio": 1.0, "issue": 4.0}
_PIPES = {
  "conv": {"I2F", "F2F", "F2I", "F2FP", "I2FP", "FRND", "I2I"},
  "mio": {"LDS", "STS", "LDSM", "STSM", "SHFL", "ATOMS"},
  "fp16": {"HADD2", "HMUL2", "HFMA2", "HMNMX2", "HSET2", "HSETP2"},
  "fp32": {"FADD", "FMUL", "FFMA", "FMNMX", "FSEL", "FSET", "FSETP", "FCHK"},
  "int": {
    "LOP3",
    "LOP",
    "PRMT",
    "SHF",
    "SHL",
    "SHR",
    "IADD3",
    "IADD",
    "IMAD",
    "IMUL",
    "LEA",
    "VIADD",
    "ISETP",
    "ICMP",
    "SEL",
    "IMNMX",
    "VIMNMX",
    "SGXT",
    "IABS",
    "BMSK",
    "POPC",
    "FLO",
    "BREV",
    "P2R",
    "R2P",
    "PLOP3",
  },
}
_SASS_LINE = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T\d]+\s+)?([A-Z][A-Z0-9_]*)[^;]*?(0x[0-9a-f]+)?\s*;")


def _pipe(op: str) -> str:
  for pipe, ops in _PIPES.items():
    if op in ops:
      return pipe
  return "other"  # memory (LDG / LDGSTS / STG), MMA, uniform datapath, branches, barriers


def instruction_mix(sass: str) -> dict:
  """Instructions per thread in the kernel's main loop (the longest backward branch), by opcode and by pipe.

  Returns {"ops": Counter(opcode -> count), "pipes": {pipe: count}, "total": count}; empty when the SASS
  has no loop. Counts are static: one pass through the loop body, which Triton's software pipelining makes
  one K chunk (`fori_loop` over chunks is not unrolled).
  """
  ins = []
  for line in sass.splitlines():
    m = _SASS_LINE.match(line)
    if m:
      ins.append((int(m.group(1), 16), m.group(2), int(m.group(3), 16) if m.group(3) else None))
  back = [(target, addr) for addr, op, target in ins if op == "BRA" and target is not None and target < addr]
  if not back:
    return {}
  lo, hi = max(back, key=lambda t: t[1] - t[0])
  ops = collections.Counter(op for addr, op, _ in ins if lo <= addr <= hi)
  pipes = collections.Counter()
  for op, c in ops.items():
    pipes[_pipe(op)] += c
  return {"ops": ops, "pipes": dict(pipes), "total": sum(ops.values())}


@dataclasses.dataclass(frozen=True)
class IssueModel:
  """A static roofline of one matmul: the main loop's issue-bound time beside HBM's time for its bytes.

  Every SM runs programs · chunks / SMs loop iterations (a whole number of waves is not assumed); an
  iteration of `num_warps` warps needs at least max over pipes of (warp-instructions on the pipe / the
  pipe's rate) clocks (`PIPE_RATES`), and all iterations on an SM share its pipes. A lower bound on time:
  it ignores latency, dependencies, the prologue / epilogue and the split-K reduction, and that XLA
  compiles the TTIR with its own Triton. The HBM time is bytes / the device's bandwidth.

  Attributes:
    per_weight: instructions per thread per weight element, by pipe (the decode's cost).
    clocks_per_chunk: {pipe: clocks one loop iteration needs on that pipe}; bound: the largest pipe.
    t_issue_us, t_hbm_us: the two times (microseconds); hbm_fraction: t_hbm / max(t_hbm, t_issue).
  """

  per_weight: dict
  clocks_per_chunk: dict
  bound: str
  t_issue_us: float
  t_hbm_us: float

  @property
  def hbm_fraction(self) -> float:
    return self.t_hbm_us / max(self.t_hbm_us, self.t_issue_us)


def issue_model(
  mix: dict, *, plan_, k: int, n: int, m: int, programs: int, num_warps: int, nbytes: int, sm: SM
) -> IssueModel | None:
  """`IssueModel` of a kernel from its loop `instruction_mix` and its tile plan (None without a loop)."""
  if not mix:
    return None
  pipes = dict(mix["pipes"], issue=mix["total"])
  clocks = {p: pipes.get(p, 0) * num_warps / r for p, r in PIPE_RATES.items()}
  bound = max(clocks, key=clocks.get)
  chunks = k // plan_.split_k // plan_.bk  # loop iterations per program
  per_sm = programs * chunks / sm.sms
  t_issue = per_sm * clocks[bound] / (sm.clock_ghz * 1e3)
  weights_per_thread = plan_.bk * plan_.bn / (num_warps * 32)  # logical weight elements per iteration
  per_weight = {p: pipes.get(p, 0) / weights_per_thread for p in ("int", "fp16", "fp32", "conv", "mio", "issue")}
  return IssueModel(
    per_weight=per_weight,
    clocks_per_chunk=clocks,
    bound=bound,
    t_issue_us=t_issue,
    t_hbm_us=nbytes / (sm.hbm_tbps * 1e6),
  )


def compile_ir(ir: TritonIR, *, arch: int = 90) -> tuple[dict, str]:
  """Compiles one TTIR for sm_`arch` with `triton`; returns (resources, ptx).

  Raises:
    triton's CompilationError / RuntimeError when the IR does not compile for that SM.
  """
  # Lazy: triton is optional (the `aot` extra).
  import triton  # noqa: PLC0415
  from triton.backends.compiler import GPUTarget  # noqa: PLC0415

  os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9 warns when unset; 1 = its default
  with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, f"{ir.name}.ttir")
    with open(path, "w") as f:
      f.write(ir.ttir)
    kern = triton.compile(
      path, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=ir.num_warps, num_stages=ir.num_stages)
    )
    cubin = os.path.join(d, "k.cubin")
    with open(cubin, "wb") as f:
      f.write(kern.asm["cubin"])
    usage = subprocess.run(
      [_tool("cuobjdump"), "--dump-resource-usage", cubin], capture_output=True, text=True, check=True
    ).stdout
    sass = subprocess.run([_tool("cuobjdump"), "-sass", cubin], capture_output=True, text=True, check=True).stdout
  fields = dict(re.findall(r"\b(REG|LOCAL|STACK|SHARED):(\d+)", usage))
  # Spilled registers land in LOCAL or, with ptxas's ABI frame, in STACK (e.g. NVFP4 at bk = 512: REG 32,
  # STACK 6456 B per thread); either is per-thread memory traffic the kernel was not meant to have.
  res = {
    "registers": int(fields.get("REG", 0)),
    "local_bytes": int(fields.get("LOCAL", 0)) + int(fields.get("STACK", 0)),
    "shared_bytes": int(kern.metadata.shared),
    "num_warps": int(kern.metadata.num_warps),
    "num_stages": int(kern.metadata.num_stages),
    "mix": instruction_mix(sass),
  }
  return res, kern.asm["ptx"]


def compile_kernel(
  spec: quant.Spec, k: int, n: int, m: int, *, block: BlockConfig = BlockConfig(), arch: int = 90, x_dtype=jnp.bfloat16
) -> CompileReport:
  """Lowers and compiles the kernel for x [m, k] @ spec-quantized [k, n] on sm_`arch`; see `CompileReport`."""
  if arch not in SMS:
    raise ValueError(f"triton_aot: no SM limits for arch {arch}; known: {sorted(SMS)}")
  q = jax.eval_shape(lambda w: quant.quantize(w, spec, axis=-2), jax.ShapeDtypeStruct((k, n), jnp.float32))
  (ir,) = triton_ir(jax.ShapeDtypeStruct((m, k), x_dtype), q, block=block)
  res, ptx = compile_ir(ir, arch=arch)
  p = plan(m, k, n, spec, block, "gpu")
  programs = (p.m_pad // p.bm) * (n // p.bn) * p.split_k
  sm = SMS[arch]
  per_sm, limit = occupancy(sm, registers=res["registers"], shared=res["shared_bytes"], warps=res["num_warps"])
  waves = programs / (per_sm * sm.sms) if per_sm else math.inf
  nbytes = sum(math.prod(a.shape) * jnp.dtype(a.dtype).itemsize for a in jax.tree.leaves(q))  # codes, scales, zp
  nbytes += m * k * jnp.dtype(x_dtype).itemsize  # + the activations
  model = issue_model(
    res["mix"], plan_=p, k=k, n=n, m=m, programs=programs, num_warps=res["num_warps"], nbytes=nbytes, sm=sm
  )
  return CompileReport(
    name=ir.name,
    arch=arch,
    m=m,
    k=k,
    n=n,
    plan=p,
    programs=programs,
    mma=_mma(ptx),
    load_widths=_load_widths(ptx),
    per_sm=per_sm,
    limit=limit,
    waves=waves,
    model=model,
    **res,
  )


FORMATS = {
  "int4_g128": quant.Int4(group_size=128),
  "int4_g128_zp": quant.Int4(group_size=128, scheme="minmax"),
  "nvfp4": quant.NVFP4(),
  "fp8_channel": quant.FP8(),
  "fp8_block": quant.FP8(granularity="block"),
  "mxfp8": quant.MXFP8(),
}


def format_table(reports: list[tuple[str, CompileReport]]) -> str:
  head = (
    "| K x N | M | format | bm×bn×bk | split-K | warps | programs | regs | spill B | smem KiB | per SM (limit) "
    "| waves | loads B:count | MMA |"
  )
  lines = [head, "|" + "---|" * (head.count("|") - 1)]
  for fmt, r in reports:
    p = r.plan
    loads = " ".join(f"{b}:{c}" for b, c in r.load_widths.items())
    mma = r.mma.replace("mma.sync.aligned.", "").replace("wgmma.mma_async.sync.aligned.", "wgmma.")
    lines.append(
      f"| {r.k}x{r.n} | {r.m} | {fmt} | {p.bm}×{p.bn}×{p.bk} | {p.split_k} | {r.num_warps} | {r.programs} | "
      f"{r.registers} | {r.local_bytes} | {r.shared_bytes / 1024:.1f} | {r.per_sm} ({r.limit}) | "
      f"{r.waves:.2f} | {loads} | {mma} |"
    )
  return "\n".join(lines)


def format_model_table(reports: list[tuple[str, CompileReport]]) -> str:
  """The static roofline (`IssueModel`) of each report: per-weight instructions, the binding pipe, two times."""
  head = (
    "| K x N | M | format | int / w | shared-mem / w | convert / w | fp16 / w | all / w | bound by "
    "| issue-bound us | HBM us | HBM share |"
  )
  lines = [head, "|" + "---|" * (head.count("|") - 1)]
  for fmt, r in reports:
    md = r.model
    if md is None:
      continue
    w = md.per_weight
    lines.append(
      f"| {r.k}x{r.n} | {r.m} | {fmt} | {w['int']:.2f} | {w['mio']:.2f} | {w['conv']:.2f} | {w['fp16']:.2f} "
      f"| {w['issue']:.2f} | {md.bound} | {md.t_issue_us:.1f} | {md.t_hbm_us:.1f} | "
      f"{100 * md.hbm_fraction:.0f} % |"
    )
  return "\n".join(lines)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m lrl_jax.kernels.triton_aot", description=__doc__.split("\n\n")[0])
  ap.add_argument("--arch", type=int, default=90, help=f"SM to compile for, one of {sorted(SMS)}")
  ap.add_argument("--shapes", default="8192x8192,4096x14336", help="comma-separated KxN")
  ap.add_argument("--m", default="1,16,64", help="comma-separated M values")
  ap.add_argument("--formats", default=",".join(FORMATS), help=f"subset of {','.join(FORMATS)}")
  ap.add_argument("--bn", type=int, default=None)
  ap.add_argument("--bk", type=int, default=None)
  ap.add_argument("--split-k", type=int, default=None)
  ap.add_argument("--num-warps", type=int, default=None, help="default: the plan's (4, or 8 for 64-row tiles)")
  ap.add_argument("--num-stages", type=int, default=BlockConfig().num_stages)
  a = ap.parse_args(argv)
  fmts = a.formats.split(",")
  bad = [f for f in fmts if f not in FORMATS]
  if bad:
    ap.error(f"unknown formats {bad}; choose from {list(FORMATS)}")
  if a.arch not in SMS:
    ap.error(f"--arch {a.arch}: known {sorted(SMS)}")
  # Lazy: triton is optional (the `aot` extra).
  import triton  # noqa: PLC0415

  block = BlockConfig(bn=a.bn, bk=a.bk, split_k=a.split_k, num_warps=a.num_warps, num_stages=a.num_stages)
  sm = SMS[a.arch]
  print(f"# lrl_jax Triton AOT compile — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
  print(
    f"# sm_{a.arch} ({sm.device}, {sm.sms} SMs), triton {triton.__version__}, jax {jax.__version__}; "
    f"bf16 activations; {block}"
  )
  reports, failed = [], []
  for shape in a.shapes.split(","):
    k, n = (int(v) for v in shape.lower().split("x"))
    for m in (int(v) for v in a.m.split(",")):
      for f in fmts:
        try:
          reports.append((f, compile_kernel(FORMATS[f], k, n, m, block=block, arch=a.arch)))
        except Exception as e:  # noqa: BLE001 - a row per failure, the table goes on
          failed.append(f"{f} {k}x{n} M={m}: {type(e).__name__}: {str(e).strip().splitlines()[0][:200]}")
  print(format_table(reports))
  print(
    f"\n# Static roofline of the main loop (IssueModel; {sm.clock_ghz} GHz, {sm.hbm_tbps} TB/s, per-SM pipe "
    f"rates {PIPE_RATES} warp-instructions / clock): instructions per thread per weight, and the loop's issue-bound "
    "time beside HBM's time for the bytes. A lower bound from static counts, not a measurement."
  )
  print(format_model_table(reports))
  for line in failed:
    print("FAILED", line)
  return 1 if failed or not all(r.fits for _, r in reports) else 0


if __name__ == "__main__":
  raise SystemExit(main())
