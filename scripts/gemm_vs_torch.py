"""XLA:CPU's f32 products against torch.matmul's at the shapes of one SmolLM2-135M learner step, in one process.

    python scripts/gemm_vs_torch.py [--rows 1152] [--repeats 5]
    XLA_FLAGS="--xla_cpu_experimental_ynn_fusion_type=" python scripts/gemm_vs_torch.py   # another dot library

The step of `lrl-jax bench learner torch` without prompt sharing (16 x 72 = 1152 rows): each layer's q / o (576 x
576), k / v (576 x 192), gate / up (576 x 1536) and down (1536 x 576) products and the LM head (576 x 49152), each as
its forward (x · w), its input gradient (g · wᵀ) and its weight gradient (xᵀ · g), written as jnp does them and timed
jitted (median of `--repeats`); torch's the same on the same arrays, `torch.set_num_threads` = the host's cores.
Prints each shape's GFLOP/s on both sides and the step's products summed (times the count of each in the 30 layers),
XLA's over torch's: the part of the gap to torch at equal work that is the matmul library (`lrl_jax/learner/README.md`).
Needs the `ref` extra (torch).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

# (K, N, products of that shape in one forward of SmolLM2-135M: 30 layers, and the head once)
SHAPES = ((576, 576, 60), (576, 192, 60), (576, 1536, 60), (1536, 576, 30), (576, 49152, 1))


def _median(f, *args, repeats: int) -> float:
  f(*args)
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    f(*args)
    times.append(time.perf_counter() - t)
  return float(np.median(times))


def _rates(gflop: float, times) -> str:
  return " / ".join(f"{gflop / t:.0f}" for t in times)


def main(argv=None) -> None:
  import torch  # noqa: PLC0415

  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--rows", type=int, default=1152, help="tokens in the step (batch x sequence)")
  p.add_argument("--repeats", type=int, default=5)
  a = p.parse_args(argv)
  torch.set_num_threads(os.cpu_count() or 1)
  rng = np.random.default_rng(0)
  products = {"fwd": lambda x, w, g: x @ w, "dx": lambda x, w, g: g @ w.T, "dw": lambda x, w, g: x.T @ g}
  jitted = {k: jax.jit(f) for k, f in products.items()}
  total_xla = total_torch = flops = 0.0
  print(f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}, jax {jax.__version__}, torch {torch.__version__}")
  print("| rows x K x N | XLA fwd / dx / dw GFLOP/s | torch fwd / dx / dw GFLOP/s |\n|---|---|---|")
  for k, n, count in SHAPES:
    arrays = [rng.standard_normal(s, np.float32) for s in ((a.rows, k), (k, n), (a.rows, n))]
    on_xla, on_torch = [jnp.asarray(x) for x in arrays], [torch.from_numpy(x) for x in arrays]
    gflop = 2 * a.rows * k * n / 1e9
    t_xla = [_median(lambda *x, f=f: jax.block_until_ready(f(*x)), *on_xla, repeats=a.repeats) for f in jitted.values()]
    t_torch = [_median(f, *on_torch, repeats=a.repeats) for f in products.values()]
    print(f"| {a.rows} x {k} x {n} | {_rates(gflop, t_xla)} | {_rates(gflop, t_torch)} |")
    total_xla += count * sum(t_xla)
    total_torch += count * sum(t_torch)
    flops += 3 * count * gflop
  print(
    f"\nthe step's products ({flops:.0f} GFLOP): XLA {total_xla:.2f} s, torch.matmul {total_torch:.2f} s, "
    f"XLA / torch {total_xla / total_torch:.2f}x"
  )


if __name__ == "__main__":
  main()
