"""Bytes a weight that the learner's QAT operand adds to a program, compiled for one TPU chip that is not here.

    JAX_PLATFORMS=cpu PYTHONPATH=.venv/libtpu python scripts/qat_operand_bytes.py [--tpu v5p:2x2x1] [--hlo DIR]

The program: the gradient of sum((x · ŵ)²) with respect to an f32 stack w [L, K, N] (SmolLM2's MLP shape by default:
30 x 576 x 1536; x [M, K] bf16), where ŵ is `decoder._qat_operand` of w's bf16 cast (straight-through, as the
learner hoists it), or the bf16 cast itself for the baseline. It prints XLA:TPU's `cost_analysis()` bytes accessed
of each and the difference from the baseline per weight: what one fake-quant pass costs in memory traffic, without
the rest of the step around it (`lrl-jax bench learner aot` gives the whole step). `--hlo DIR` writes each optimized
HLO there (where the passes are: look for the fusions over [L, K, N]). Nothing runs; libtpu only describes the chip.
"""

from __future__ import annotations

import argparse
import os
import pathlib

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from lrl_jax import kernels, quant  # noqa: E402
from lrl_jax.kernels.tpu_aot import chip  # noqa: E402
from lrl_jax.models import decoder  # noqa: E402

FORMATS = {"bf16": None, "int4 g64": quant.Int4(group_size=64), "nvfp4": quant.NVFP4(), "fp8": quant.FP8()}


def grad_program(spec):
  """jit(grad of sum((x · ŵ)²) w.r.t. w), ŵ the QAT operand of w's bf16 cast under `spec` (None: the cast)."""

  def loss(w, x):
    wc = w.astype(jnp.bfloat16)
    if spec is None:
      return jnp.sum(jnp.einsum("mk,lkn->lmn", x, wc).astype(jnp.float32) ** 2)
    p = decoder._qat_operand(wc, spec)
    if p.dec is None:
      y = jnp.einsum("mk,lkn->lmn", x, p.w)
    else:  # NVFP4: the per-matrix scale after the K sum, through the learner's own dot (and its backward)
      y = jax.vmap(lambda w, dec: kernels.predecoded_dot(x, kernels.Predecoded(w=w, dec=dec)))(p.w, p.dec)
    return jnp.sum(y.astype(jnp.float32) ** 2)

  return jax.jit(jax.grad(loss))


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--tpu", default="v5p:2x2x1", help="the TPU slice whose one chip the programs compile for")
  ap.add_argument("--shape", type=int, nargs=4, default=[30, 576, 1536, 1152], metavar=("L", "K", "N", "M"))
  ap.add_argument("--hlo", type=pathlib.Path, default=None, help="write each optimized HLO to this folder")
  args = ap.parse_args(argv)
  n_layers, k, n, m = args.shape
  c = chip(args.tpu)
  w = jax.ShapeDtypeStruct((n_layers, k, n), jnp.float32, sharding=c)
  x = jax.ShapeDtypeStruct((m, k), jnp.bfloat16, sharding=c)
  print(f"grad of sum((x · ŵ)²), w f32 [{n_layers}, {k}, {n}], x bf16 [{m}, {k}]; one chip of TPU {args.tpu}\n")
  print("| operand | bytes accessed GB | above bf16, bytes a weight |")
  print("|---|---|---|")
  base = None
  for name, spec in FORMATS.items():
    compiled = grad_program(spec).lower(w, x).compile()
    b = compiled.cost_analysis()["bytes accessed"]
    base = b if base is None else base
    print(f"| {name} | {b / 1e9:.3f} | {(b - base) / (n_layers * k * n):.1f} |", flush=True)
    if args.hlo is not None:
      args.hlo.mkdir(parents=True, exist_ok=True)
      (args.hlo / f"{name.split()[0]}.hlo").write_text(compiled.as_text())
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
