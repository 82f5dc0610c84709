"""`qmatmul`: one entry for x @ dequantize(q) (`quant.qdot`) that picks the Pallas kernel or XLA.

Policy (`supported` says which path runs and why):
  TPU   Pallas (Mosaic, k_grid schedule) when a tile plan fits, else XLA.
  GPU   Pallas (Triton, k_loop schedule) when a tile plan fits, else XLA. Where jax no longer ships the
        Triton backend (deprecated from jax 0.11), the Mosaic GPU kernel (`mosaic_gpu.py`, Hopper wgmma)
        instead; `impl="mosaic_gpu"` asks for it by name. It stays second until it is timed on a device.
  CPU   XLA dequantize-then-dot: the fast path there. `impl="pallas"` runs the kernel in
        the Pallas interpreter (tests); it is orders of magnitude slower.
  Large M (TPU / GPU): a kernel reads the weights once per row tile; with more than `MAX_WEIGHT_PASSES` tiles
        (M > 256 at the 64-row tile) "auto" takes XLA, whose dequantize-then-GEMM moves fewer bytes there.
Each distinct fallback reason is logged once (python `logging`, logger "lrl_jax.kernels").
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Literal

import jax
import jax.numpy as jnp

from lrl_jax import quant
from lrl_jax.kernels import matmul as _mm
from lrl_jax.kernels import mosaic_gpu as _mg
from lrl_jax.kernels.blocks import BlockConfig, Unsupported, plan

__all__ = ["Support", "supported", "qmatmul", "xla_matmul"]

log = logging.getLogger("lrl_jax.kernels")
_logged: set[str] = set()

# A kernel reads the weights once per row tile. Past this many passes, "auto" takes XLA: 4 passes of 0.5 byte per
# INT4 weight (2 B/w) stay under XLA's dequantize-then-GEMM traffic (read the codes, write and read a bf16 copy:
# ~4.5 B/w), and prefill-sized M is compute-bound, where the vendor GEMM on a dequantized copy wins. Reasoned from
# bytes, not timed (`kernels/README.md`); impl="pallas" still runs the kernel.
MAX_WEIGHT_PASSES = 4

Impl = Literal["auto", "pallas", "mosaic_gpu", "xla"]


@dataclasses.dataclass(frozen=True)
class Support:
  """Which path `qmatmul` takes. `pallas`: True when a Pallas kernel runs.

  Attributes:
    pallas: a Pallas kernel runs (compiled, or interpreted on CPU).
    path: "pallas-mosaic-tpu", "pallas-triton", "pallas-mosaic-gpu", "pallas-interpret" or "xla".
    target: the kernel's `blocks.Target` ("tpu", "gpu" = Triton, "mosaic_gpu") when pallas, else None.
    reason: why, in words (why not Pallas, when path is "xla").
  """

  pallas: bool
  path: str
  reason: str
  target: str | None = None

  def __bool__(self) -> bool:
    return self.pallas


def _backend() -> str:
  """The platform qmatmul dispatches for (a seam for tests)."""
  return jax.default_backend()


def xla_matmul(x: jax.Array, q: quant.QArray) -> jax.Array:
  """[..., K] @ QArray [K, N] -> [..., N] in x.dtype: `quant.qdot` (dequantize to x.dtype, dot with f32
  accumulation; NVFP4's per-matrix scale after the sum), with `jnp.dot` semantics for a stack [.., K, N]."""
  m = 1
  for d in x.shape[:-1]:
    m *= d
  # XLA:CPU fuses the dequantize into the dot and recomputes it per row: 4-6x slower at M = 16
  # (measured, README.md). Materialize ŵ once. Not on GPU, where fusing it into the GEMM is the point.
  return quant.qdot(x, q, materialize=m > 1 and _backend() == "cpu").astype(x.dtype)


def _gpu_compute_capability() -> float | None:
  cc = getattr(jax.devices()[0], "compute_capability", None)
  try:
    return float(cc)
  except (TypeError, ValueError):
    return None


def _gpu_target(impl: str) -> str:
  """The GPU kernel `impl` runs: Triton while jax ships it, else (or when asked) Mosaic GPU."""
  if impl == "mosaic_gpu":
    return "mosaic_gpu"
  return "gpu" if _mg.triton_available() else "mosaic_gpu"


def _pallas_reason(x, q, backend: str) -> str | None:
  """None when shapes and format suit a kernel; else why not."""
  if backend in ("gpu", "cuda") and not isinstance(q.spec, quant.Int4):
    cc = _gpu_compute_capability()
    if cc is not None and cc < 8.9:
      # The kernels convert e4m3 scales / codes in registers: Triton's fp8e4nv needs sm_89+.
      return f"{q.spec.name} kernel needs FP8 conversions (sm_89+); this GPU is sm_{cc:g}"
  if backend in ("gpu", "cuda") and x.dtype == jnp.float32:
    # Exact f32 (precision HIGHEST) has no tensor-core MMA: Triton lowers the dot to FMAs and ptxas spills
    # 1.4-4.9 KB per thread on sm_90 at every tile tried (`python -m lrl_jax.kernels.triton_aot`, README.md).
    return "float32 activations on GPU: the kernel's exact f32 dot runs on CUDA cores and spills; use bf16"
  if q.ndim != 2:
    return f"QArray of shape {q.shape} is a stack; the kernels take one [K, N] matrix"
  if q.axis != -2:
    return f"weight quantized along axis {q.axis}; the kernels read groups along K (axis=-2)"
  if x.dtype not in (jnp.float32, jnp.bfloat16, jnp.float16):
    return f"activation dtype {x.dtype} (kernels take float32/bfloat16/float16)"
  if isinstance(q.spec, quant.FP8) and q.spec.granularity == "token":
    return "FP8 per-token scales on a weight"
  return None


def supported(x: jax.Array, q: quant.QArray, *, impl: Impl = "auto", block: BlockConfig = BlockConfig()) -> Support:
  """Which path `qmatmul(x, q, impl=impl, block=block)` takes on the default backend, and why.

  Raises:
    TypeError if q is not a QArray; ValueError if x [..., K] does not contract with q [K, N].
  """
  if not isinstance(q, quant.QArray):
    raise TypeError(f"qmatmul: expected a QArray weight, got {type(q).__name__}")
  if impl not in ("auto", "pallas", "mosaic_gpu", "xla"):
    raise ValueError(f"qmatmul: impl must be 'auto', 'pallas', 'mosaic_gpu' or 'xla'; got {impl!r}")
  k_axis = q.shape[-2] if q.ndim >= 2 else q.shape[0]
  if x.ndim < 1 or x.shape[-1] != k_axis:
    raise ValueError(f"qmatmul: activations {tuple(x.shape)} do not contract with weight {q.shape}")
  if impl == "xla":
    return Support(False, "xla", "impl='xla' requested")
  backend = _backend()
  if backend == "cpu" and impl == "auto":
    return Support(
      False,
      "xla",
      "CPU: XLA dequantize-then-dot is the fast path (Pallas runs only in interpret mode there; ask impl='pallas')",
    )
  if impl == "mosaic_gpu" and backend == "tpu":
    return Support(False, "xla", "impl='mosaic_gpu' on a TPU: the Mosaic GPU kernel is for NVIDIA Hopper")
  target = "tpu" if backend == "tpu" else ("gpu" if backend == "cpu" and impl == "pallas" else _gpu_target(impl))
  why = _pallas_reason(x, q, backend)
  if why is None and target == "mosaic_gpu" and x.dtype == jnp.float32:
    why = "float32 activations: the Mosaic GPU kernel's wgmma has no exact float32 form; use bf16"
  if why is None and target == "mosaic_gpu" and backend != "cpu":
    cc = _gpu_compute_capability()
    if cc is not None and cc < 9.0:
      why = f"the Mosaic GPU kernel uses Hopper's wgmma and TMA (sm_90+); this GPU is sm_{cc:g}"
  if why is None:
    m = 1
    for d in x.shape[:-1]:
      m *= d
    try:
      p = plan(m, q.shape[0], q.shape[1], q.spec, block, target)
      if impl == "auto" and backend != "cpu" and p.m_pad // p.bm > MAX_WEIGHT_PASSES:
        why = (
          f"M={m}: {p.m_pad // p.bm} passes over the weights (one per {p.bm}-row tile) > {MAX_WEIGHT_PASSES}; "
          "XLA's dequantize-then-GEMM is the prefill path (impl='pallas' runs the kernel anyway)"
        )
    except Unsupported as e:
      why = str(e)
  if why is not None:
    return Support(False, "xla", why)
  path = {"cpu": "pallas-interpret", "tpu": "pallas-mosaic-tpu"}.get(
    backend, "pallas-mosaic-gpu" if target == "mosaic_gpu" else "pallas-triton"
  )
  return Support(True, path, f"{q.spec.name} kernel on {backend}", target)


def qmatmul(x: jax.Array, q: quant.QArray, *, impl: Impl = "auto", block: BlockConfig = BlockConfig()) -> jax.Array:
  """[..., K] @ QArray [K, N] -> [..., N] in x.dtype: x @ dequantize(q), the fastest available way.

  Args:
    x: activations [..., K].
    q: weight QArray [K, N] quantized along K (axis=-2). Other layouts (stacks, other axes)
      take the XLA path, which also accepts them with `jnp.dot` semantics.
    impl: "auto" (see the module docstring), "pallas" (the kernel, or a ValueError saying why
      not; interpret mode on CPU), "mosaic_gpu" (the Mosaic GPU kernel by name; interpret mode on
      CPU) or "xla".
    block: kernel tile sizes.
  """
  s = supported(x, q, impl=impl, block=block)
  if s.pallas:
    return _mm.pallas_matmul(x, q, block=block, target=s.target)
  if impl in ("pallas", "mosaic_gpu"):
    raise ValueError(f"qmatmul(impl={impl!r}): {s.reason}")
  if impl == "auto":
    log_fallback("qmatmul", s.reason)
  return xla_matmul(x, q)


def log_fallback(entry: str, reason: str) -> None:
  """Logs `entry`'s XLA fallback once per distinct reason (logger "lrl_jax.kernels")."""
  if reason not in _logged:
    _logged.add(reason)
    log.info("%s: XLA path: %s", entry, reason)
