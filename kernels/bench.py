"""Decode-shape benchmark of the low-bit matmuls against a bf16 `jnp.dot` of the same shape.

    python -m lrl_jax.kernels.bench [--quick] [--shapes 4096x4096,8192x8192] [--m 1,8,16]

Every row is timed in the same run as its bf16 baseline (warm-up, `block_until_ready`,
median of --iters calls); the speed-up is that side-by-side ratio. Bandwidth counts the
bytes a matmul must read: weights + scales + activations.

On an accelerator each format is timed as the Pallas kernel and as the XLA
dequantize-then-dot fallback (`qmatmul` should pick the faster); on an sm_90+ GPU also as
the Mosaic GPU kernel (path "mosaic", `mosaic_gpu.py`) beside Triton (path "pallas"), and INT4 and NVFP4 also in the
nn.Linear layout [N, K] through `qlinear`'s kernel (path "linear", `linear.py`; the weight is put in that
layout once, outside the timing). On CPU only the XLA
path is timed: Pallas runs there in interpret mode, orders of magnitude slower than any
compiled kernel, so its timings would mean nothing; the accelerator rows are reported
as not measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import statistics
import time

import jax
import jax.numpy as jnp

from lrl_jax import quant
from lrl_jax.kernels.blocks import BlockConfig, Unsupported
from lrl_jax.kernels.dispatch import _gpu_compute_capability, xla_matmul
from lrl_jax.kernels.linear import linear_layout, mosaic_linear
from lrl_jax.kernels.matmul import pallas_matmul
from lrl_jax.kernels.mosaic_gpu import triton_available

__all__ = ["main", "run", "Row"]

M_ALL = (1, 8, 16, 32, 64, 128)
SHAPES_ALL = ((4096, 4096), (4096, 14336), (8192, 8192))
FORMATS = {
  "int4_g128": quant.Int4(group_size=128),
  "nvfp4": quant.NVFP4(),
  "fp8_channel": quant.FP8(),
  "mxfp8": quant.MXFP8(),
}


@dataclasses.dataclass(frozen=True)
class Row:
  k: int
  n: int
  m: int
  fmt: str
  path: str  # "bf16 dot", "pallas" (Triton on GPU, Mosaic on TPU), "mosaic" (Mosaic GPU), "linear" or "xla"
  seconds: float | None  # None: not measured (reason in `note`)
  bytes_read: int
  speedup: float | None
  note: str = ""

  @property
  def gbps(self) -> float | None:
    return None if self.seconds is None else self.bytes_read / self.seconds / 1e9


def _time(fn, *args, iters: int, warmup: int) -> float:
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  ts = []
  for _ in range(iters):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    ts.append(time.perf_counter() - t0)
  return statistics.median(ts)


def run(
  *,
  shapes=SHAPES_ALL,
  ms=M_ALL,
  formats=tuple(FORMATS),
  iters: int = 20,
  warmup: int = 3,
  block: BlockConfig = BlockConfig(),
  seed: int = 0,
  linear_split_k: int | None = None,
) -> list[Row]:
  """Times every (shape, M, format, path) and its bf16 baseline; returns the rows.

  linear_split_k: split-K of the "linear" rows (None: the plan's choice).
  """
  backend = jax.default_backend()
  accel = backend in ("gpu", "tpu", "cuda", "rocm")
  paths = {"pallas": "tpu"} if backend == "tpu" else {"pallas": "gpu"}
  if accel and backend != "tpu" and (_gpu_compute_capability() or 0.0) >= 9.0:
    paths["mosaic"] = "mosaic_gpu"
  if accel and backend != "tpu" and not triton_available():
    paths = {"mosaic": "mosaic_gpu"}
  dot_bf16 = jax.jit(lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.float32).astype(x.dtype))
  xla = jax.jit(xla_matmul)
  kerns = {
    name: jax.jit(lambda x, q, t=t: pallas_matmul(x, q, block=block, target=t, interpret=False))
    for name, t in paths.items()
  }
  linear = None
  if accel and backend != "tpu" and (_gpu_compute_capability() or 0.0) >= 9.0:
    linear = jax.jit(lambda x, w: mosaic_linear(x, w, split_k=linear_split_k, interpret=False))
  rows = []
  key = jax.random.key(seed)
  for k, n in shapes:
    kw, kx = jax.random.split(jax.random.fold_in(key, k * 100003 + n))
    w = (jax.random.normal(kw, (k, n), jnp.float32) * 0.02).astype(jnp.bfloat16)
    qs = {f: jax.block_until_ready(jax.jit(lambda w, s=FORMATS[f]: quant.quantize(w, s, axis=-2))(w)) for f in formats}
    lin_qs = {
      f: jax.block_until_ready(linear_layout(q))
      for f, q in qs.items()
      if linear is not None and isinstance(q.spec, (quant.Int4, quant.NVFP4))
    }
    for m in ms:
      x = jax.random.normal(jax.random.fold_in(kx, m), (m, k), jnp.bfloat16)
      x_bytes = m * k * 2
      t_ref = _time(dot_bf16, x, w, iters=iters, warmup=warmup)
      rows.append(Row(k, n, m, "bf16", "bf16 dot", t_ref, k * n * 2 + x_bytes, 1.0))
      for f in formats:
        q = qs[f]
        nbytes = q.nbytes + x_bytes
        t = _time(xla, x, q, iters=iters, warmup=warmup)
        rows.append(Row(k, n, m, f, "xla", t, nbytes, t_ref / t))
        if not accel:
          rows.append(Row(k, n, m, f, "pallas", None, nbytes, None, f"not measured: no accelerator ({backend})"))
          continue
        tries = [(name, kern, q) for name, kern in kerns.items()]
        if f in lin_qs:
          tries.append(("linear", linear, lin_qs[f]))
        for name, kern, qq in tries:
          try:
            t = _time(kern, x, qq, iters=iters, warmup=warmup)
            rows.append(Row(k, n, m, f, name, t, nbytes, t_ref / t))
          except Unsupported as e:
            rows.append(Row(k, n, m, f, name, None, nbytes, None, f"unsupported: {e}"))
          except Exception as e:  # noqa: BLE001 - one device run: a kernel that fails to compile or run must
            # not cost the other rows (the Mosaic GPU kernel has never been compiled past its lowering)
            rows.append(Row(k, n, m, f, name, None, nbytes, None, f"failed: {type(e).__name__}: {e}"[:300]))
  return rows


def format_table(rows: list[Row]) -> str:
  head = f"| {'K x N':>11} | {'M':>3} | {'format':<11} | {'path':<8} | {'time us':>9} | {'vs bf16':>7} | {'GB/s':>7} |"
  lines = [head, "|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|"]
  for r in rows:
    t = f"{r.seconds * 1e6:9.1f}" if r.seconds is not None else f"{'—':>9}"
    s = f"{r.speedup:6.2f}x" if r.speedup is not None else f"{'—':>7}"
    g = f"{r.gbps:7.1f}" if r.gbps is not None else f"{'—':>7}"
    lines.append(f"| {f'{r.k}x{r.n}':>11} | {r.m:>3} | {r.fmt:<11} | {r.path:<8} | {t} | {s} | {g} |")
  return "\n".join(lines)


def _pairs(s: str) -> tuple[tuple[int, int], ...]:
  out = []
  for p in s.split(","):
    k, n = p.lower().split("x")
    out.append((int(k), int(n)))
  return tuple(out)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="lrl-jax bench kernels", description=__doc__.split("\n\n")[0])
  ap.add_argument("--quick", action="store_true", help="M in {1, 16}, (K, N) = (4096, 4096), 5 iterations")
  ap.add_argument("--shapes", type=_pairs, default=None, help="comma-separated KxN, e.g. 4096x4096,8192x8192")
  ap.add_argument(
    "--m",
    type=lambda s: tuple(int(v) for v in s.split(",")),
    default=None,
    help="comma-separated M values, e.g. 1,8,16",
  )
  ap.add_argument(
    "--formats",
    type=lambda s: tuple(s.split(",")),
    default=tuple(FORMATS),
    help=f"comma-separated subset of {','.join(FORMATS)}",
  )
  ap.add_argument("--iters", type=int, default=None)
  ap.add_argument("--warmup", type=int, default=3)
  ap.add_argument("--bn", type=int, default=BlockConfig().bn)
  ap.add_argument("--bk", type=int, default=BlockConfig().bk)
  ap.add_argument("--split-k", type=int, default=BlockConfig().split_k)
  ap.add_argument("--num-warps", type=int, default=BlockConfig().num_warps, help="GPU; default: the plan's")
  ap.add_argument("--num-stages", type=int, default=BlockConfig().num_stages, help="GPU pipelining depth")
  ap.add_argument("--linear-split-k", type=int, default=None, help="split-K of the 'linear' rows (default: plan's)")
  a = ap.parse_args(argv)
  bad = [f for f in a.formats if f not in FORMATS]
  if bad:
    ap.error(f"unknown formats {bad}; choose from {list(FORMATS)}")
  shapes = a.shapes or (((4096, 4096),) if a.quick else SHAPES_ALL)
  ms = a.m or ((1, 16) if a.quick else M_ALL)
  iters = a.iters or (5 if a.quick else 20)
  block = BlockConfig(bn=a.bn, bk=a.bk, split_k=a.split_k, num_warps=a.num_warps, num_stages=a.num_stages)
  dev = jax.devices()[0]
  print(f"# lrl_jax kernel benchmark — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
  print(
    f"# backend {jax.default_backend()}, device {dev.device_kind}, {len(jax.devices())} device(s), "
    f"host {platform.machine()} with {__import__('os').cpu_count()} CPUs, jax {jax.__version__}"
  )
  print(f"# median of {iters} calls after {a.warmup} warm-up; block {block}")
  rows = run(
    shapes=shapes, ms=ms, formats=a.formats, iters=iters, warmup=a.warmup, block=block, linear_split_k=a.linear_split_k
  )
  print(format_table(rows))
  if jax.default_backend() == "cpu":
    print(
      "\nCPU: timed the XLA dequantize-then-dot path only. Pallas kernels run on CPU in interpret "
      "mode, far too slow to mean anything; the accelerator (Pallas) rows were NOT measured."
    )
  else:
    slower = [
      r
      for r in rows
      if r.path in ("pallas", "mosaic", "linear")
      and r.seconds is not None
      and any(
        o.path == "xla" and (o.k, o.n, o.m, o.fmt) == (r.k, r.n, r.m, r.fmt) and o.seconds < r.seconds for o in rows
      )
    ]
    print(
      "\nPallas slower than the XLA path at: "
      + (", ".join(f"{r.fmt} {r.k}x{r.n} M={r.m} ({r.path})" for r in slower) or "none")
    )
    for r in rows:
      if r.note.startswith("failed"):
        print(f"FAILED {r.fmt} {r.k}x{r.n} M={r.m} ({r.path}): {r.note}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
