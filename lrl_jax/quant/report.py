"""The numerics table: error, size and quantize time of every format on one matrix."""

from __future__ import annotations

import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from lrl_jax.quant.qarray import dequantize, fake_quant, quantize
from lrl_jax.quant.specs import FP8, MXFP8, NVFP4, Int4, Spec

__all__ = ["DEFAULT_SPECS", "Row", "error_table", "format_table"]

DEFAULT_SPECS: tuple[Spec, ...] = (
  Int4(group_size=32),
  Int4(group_size=128),
  FP8(),
  FP8(granularity="block"),
  MXFP8(),
  NVFP4(),
)


@dataclasses.dataclass(frozen=True)
class Row:
  name: str
  rel_error: float  # ||w - ŵ||_F / ||w||_F, float64
  max_abs_error: float
  bits_per_weight: float  # scales included
  quantize_ms: float  # median wall time of the jit'd quantize, compile excluded
  compile_s: float
  contract_holds: bool  # fake_quant(w) == dequantize(quantize(w)) bit for bit


def _time(fn, *args, repeats):
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def error_table(w: jax.Array, specs=DEFAULT_SPECS, *, axis: int = 0, repeats: int = 3) -> list[Row]:
  """One row per spec for the weight `w` [K, N] quantized along `axis`."""
  w = jnp.asarray(w, jnp.float32)
  w64 = np.asarray(w, np.float64)
  rows = []
  for spec in specs:
    q_fn = jax.jit(lambda x, spec=spec: quantize(x, spec, axis=axis))
    t0 = time.perf_counter()
    q = jax.block_until_ready(q_fn(w))
    compile_s = time.perf_counter() - t0
    ms = 1e3 * _time(q_fn, w, repeats=repeats)
    w_hat = np.asarray(jax.jit(dequantize)(q), np.float64)
    fq = np.asarray(jax.jit(lambda x, spec=spec: fake_quant(x, spec, axis=axis))(w), np.float64)
    rows.append(
      Row(
        name=spec.name,
        rel_error=float(np.linalg.norm(w_hat - w64) / np.linalg.norm(w64)),
        max_abs_error=float(np.abs(w_hat - w64).max()),
        bits_per_weight=q.bits_per_weight,
        quantize_ms=ms,
        compile_s=compile_s,
        contract_holds=bool(np.array_equal(fq, w_hat)),
      )
    )
  return rows


def format_table(rows: list[Row], title: str) -> str:
  head = (
    f"{'format':<14}{'rel err':>10}{'max |err|':>12}{'bits/w':>8}{'quantize ms':>13}{'compile s':>11}  fake==deq(q)"
  )
  lines = [title, head, "-" * len(head)]
  for r in rows:
    lines.append(
      f"{r.name:<14}{r.rel_error:>10.4f}{r.max_abs_error:>12.4g}{r.bits_per_weight:>8.3f}"
      f"{r.quantize_ms:>13.1f}{r.compile_s:>11.2f}  {'yes' if r.contract_holds else 'NO'}"
    )
  return "\n".join(lines)
