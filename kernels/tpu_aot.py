"""Ahead-of-time compile of the TPU kernels (Pallas -> Mosaic -> TPU executable) without a TPU.

    python -m lrl_jax.kernels.tpu_aot [--topologies v5e:2x2,v6e:2x2] [--shapes 4096x4096] [--m 1,16]

`jax.export` (tests/kernels/test_lowering.py) checks the Pallas -> Mosaic lowering rules only.
With `libtpu` importable (the `tpu` extra, or `make test-aot`, which installs it beside the
venv), jax describes a TPU slice it does not have (`jax.experimental.topologies`) and XLA
compiles for it: Mosaic's own passes run — block tiling against each operand's memory
tiling, layouts, VMEM allocation — exactly as on the machine. Nothing runs and nothing is
timed; the result is "compiles for this TPU generation" or Mosaic's error.

Run it with JAX_PLATFORMS=cpu (jax computes on the CPU and only compiles for the TPU), libtpu on
PYTHONPATH, and ALLOW_MULTIPLE_LIBTPU_LOAD=1 where several processes load it (pytest -n): see the
Makefile's `test-aot`.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import topologies

from lrl_jax import quant
from lrl_jax.kernels.blocks import BlockConfig, Plan, plan
from lrl_jax.kernels.matmul import pallas_matmul

__all__ = ["TOPOLOGIES", "TpuReport", "chip", "compile_kernel", "topology", "main"]

# One small slice per generation that jax's topology parser accepts on a host without TPUs.
TOPOLOGIES = ("v4:2x2x1", "v5e:2x2", "v5p:2x2x1", "v6e:2x2")

FORMATS = {
  "int4_g128": quant.Int4(group_size=128),
  "int4_g32": quant.Int4(group_size=32),
  "int4_g128_zp": quant.Int4(group_size=128, scheme="minmax"),
  "int4_g32_zp": quant.Int4(group_size=32, scheme="minmax"),
  "nvfp4": quant.NVFP4(),
  "fp8_channel": quant.FP8(),
  "mxfp8": quant.MXFP8(),
}


@dataclasses.dataclass(frozen=True)
class TpuReport:
  """One kernel compiled for one TPU topology.

  Attributes:
    compiled: XLA + Mosaic produced an executable.
    error: the first line of Mosaic's / XLA's error when not.
    seconds: compile time on this host.
  """

  name: str
  topology: str
  m: int
  k: int
  n: int
  plan: Plan
  compiled: bool
  error: str
  seconds: float


_TOPOS: dict[str, object] = {}


def topology(name: str):
  """jax's description of the TPU slice `name` (cached); a RuntimeError says how to get libtpu."""
  if name not in _TOPOS:
    try:
      _TOPOS[name] = topologies.get_topology_desc(topology_name=name, platform="tpu")
    except Exception as e:  # noqa: BLE001 - jax raises several types here
      raise RuntimeError(
        f"tpu_aot: cannot describe TPU topology {name!r} ({type(e).__name__}: "
        f"{str(e).splitlines()[0][:200]}); is libtpu importable? (`make test-aot` installs it)"
      ) from e
  return _TOPOS[name]


def chip(name: str) -> jax.sharding.NamedSharding:
  """One chip of the TPU slice `name`, as a sharding: what is placed there (ShapeDtypeStructs) compiles for it."""
  mesh = jax.sharding.Mesh(np.array(topology(name).devices[:1]), ("chip",))
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def compile_kernel(
  spec: quant.Spec,
  k: int,
  n: int,
  m: int,
  *,
  topology_name: str = "v5e:2x2",
  block: BlockConfig = BlockConfig(),
  x_dtype=jnp.bfloat16,
) -> TpuReport:
  """Compiles `pallas_matmul(x [m, k], spec-quantized [k, n], target="tpu")` for one chip of the topology."""
  rep = chip(topology_name)
  q = jax.eval_shape(lambda w: quant.quantize(w, spec, axis=-2), jax.ShapeDtypeStruct((k, n), jnp.float32))
  q = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep), q)
  x = jax.ShapeDtypeStruct((m, k), x_dtype, sharding=rep)
  p = plan(m, k, n, spec, block, "tpu")
  f = jax.jit(lambda x, q: pallas_matmul(x, q, block=block, target="tpu", interpret=False))
  t0 = time.perf_counter()
  try:
    f.lower(x, q).compile()
    ok, err = True, ""
  except Exception as e:  # noqa: BLE001 - the report carries Mosaic's message
    ok, err = False, " ".join(str(e).split())[:400]
  return TpuReport(
    name=f"{spec.name}_matmul",
    topology=topology_name,
    m=m,
    k=k,
    n=n,
    plan=p,
    compiled=ok,
    error=err,
    seconds=time.perf_counter() - t0,
  )


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m lrl_jax.kernels.tpu_aot", description=__doc__.split("\n\n")[0])
  ap.add_argument("--topologies", default=",".join(TOPOLOGIES))
  ap.add_argument("--shapes", default="4096x4096,8192x8192,4096x14336", help="comma-separated KxN")
  ap.add_argument("--m", default="1,16", help="comma-separated M values")
  ap.add_argument("--formats", default=",".join(FORMATS), help=f"subset of {','.join(FORMATS)}")
  a = ap.parse_args(argv)
  fmts = a.formats.split(",")
  bad = [f for f in fmts if f not in FORMATS]
  if bad:
    ap.error(f"unknown formats {bad}; choose from {list(FORMATS)}")
  print(f"# lrl_jax TPU AOT compile — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, jax {jax.__version__}")
  print("| topology | K x N | M | format | bm×bn×bk | K grid steps | compiled | error |")
  print("|---|---|---|---|---|---|---|---|")
  failed = 0
  for topo in a.topologies.split(","):
    for shape in a.shapes.split(","):
      k, n = (int(v) for v in shape.lower().split("x"))
      for m in (int(v) for v in a.m.split(",")):
        for f in fmts:
          r = compile_kernel(FORMATS[f], k, n, m, topology_name=topo)
          failed += not r.compiled
          p = r.plan
          print(
            f"| {topo} | {k}x{n} | {m} | {f} | {p.bm}×{p.bn}×{p.bk} | {k // p.bk} | "
            f"{'yes' if r.compiled else 'NO'} | {r.error[:160]} |"
          )
  return 1 if failed else 0


if __name__ == "__main__":
  raise SystemExit(main())
