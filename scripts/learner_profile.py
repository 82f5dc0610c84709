"""Where one learner step's time goes, by XLA op kind: a `jax.profiler` trace of the step read back on this machine.

    python scripts/learner_profile.py [--share | --no-share] [--dtype float32] [--batch 16] [--steps 2] [--bytes]
                                      [--unroll]

The GRPO-sized step of `lrl-jax bench learner torch` (SmolLM2-135M shapes, random weights, 16 (`--batch`) x 72
tokens, prompt 48 in groups of 8; forward, backward, AdamW), compiled and run once, then `--steps` steps traced.
Prints the time per step of each op kind (the op's name without its numeric suffix: `ynn_fusion` are XLA:CPU's
YNNPACK dot fusions, `dot` its other dots, the rest elementwise / layout / slicing fusions), from the thunk executor's
events (XLA:CPU runs the thunks one after another; a dot's helper threads are not counted again).

--bytes: each op kind's bytes read and written (`lrl_jax.learner.traffic`, from the compiled step's HLO, every
traced op once per time it ran) and the rate that makes, then the step split into its dots and the rest: the dots'
time against the machine's f32 dot rate, the rest's bytes against its memory bandwidth (a streaming x * a + y on
256 MiB arrays), measured in the same process.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--share", action=argparse.BooleanOptionalAction, default=True, help="run a group's prompt once")
  ap.add_argument("--dtype", default="float32", help="the learner's compute dtype")
  ap.add_argument("--batch", type=int, default=16, help="completions per step (64: the RL loop's own batch)")
  ap.add_argument("--steps", type=int, default=2)
  ap.add_argument("--top", type=int, default=15)
  ap.add_argument("--unroll", action="store_true", help="the layer loop unrolled (learner.unroll_layers)")
  ap.add_argument("--bytes", action="store_true", help="each op kind's bytes and rate; the step against bandwidth")
  args = ap.parse_args()

  import jax  # noqa: PLC0415
  from jax.profiler import ProfileData  # noqa: PLC0415

  from lrl_jax import models  # noqa: PLC0415
  from lrl_jax.learner import LearnerConfig, traffic  # noqa: PLC0415
  from lrl_jax.learner.bench import MODELS, _bandwidth, _batch, _dot_rate, _JaxRunner, step_matmuls  # noqa: PLC0415

  mc = MODELS["smollm2"]
  cfg = LearnerConfig(lr=1e-6, compute_dtype=args.dtype, share_prompt=args.share, unroll_layers=args.unroll)
  roll = _batch(mc, args.batch, 72, 48, 8)
  params = models.init_params(mc.replace(param_dtype="float32"), jax.random.PRNGKey(0))
  step = _JaxRunner(mc, cfg, roll, params)  # compiled and run once; each step waits for its temporaries' free
  with tempfile.TemporaryDirectory() as d:
    t0 = time.perf_counter()
    with jax.profiler.trace(d):
      for _ in range(args.steps):
        step()
    wall = (time.perf_counter() - t0) / args.steps
    data = ProfileData.from_file(sorted(glob.glob(f"{d}/**/*.xplane.pb", recursive=True))[-1])
    kinds: collections.Counter = collections.Counter()
    nbytes: collections.Counter = collections.Counter()
    dots: set = set()
    seen: collections.Counter = collections.Counter()
    if args.bytes:  # the program the runner runs: the trace's op names are its HLO names
      hlo_ops = traffic.op_bytes(step.compiled.as_text())
    for plane in data.planes:
      for line in plane.lines:
        if not line.name.startswith("tf_XLAEigen"):  # the threads XLA:CPU executes thunks on
          continue
        for ev in line.events:
          if not ev.name.startswith(("ThunkExecutor", "SlinkyThreadPool")):
            kind = re.sub(r"\.\d+$", "", ev.name)
            kinds[kind] += ev.duration_ns / 1e9 / args.steps
            if args.bytes and ev.name in hlo_ops:
              nbytes[kind] += hlo_ops[ev.name].bytes / args.steps
              seen[ev.name] += 1 / args.steps
              if hlo_ops[ev.name].is_dot:
                dots.add(kind)
  ops = sum(kinds.values())
  print(
    f"SmolLM2-135M shapes, {args.batch} x 72 tokens, prompt {'shared' if args.share else 'not shared'}, {args.dtype}; "
    f"{os.cpu_count()} cores; {args.steps} steps traced: {wall:.2f} s a step (with the tracer), ops {ops:.2f} s"
  )
  if not args.bytes:
    print("\n| op kind | s / step | share of the ops |\n|---|---|---|")
    for name, s in kinds.most_common(args.top):
      print(f"| {name} | {s:.3f} | {100 * s / ops:.1f}% |")
    return 0
  bw, rate = _bandwidth(), _dot_rate(dtype=args.dtype)  # the square dot in the compute dtype (f32 accumulation)
  print("\n| op kind | s / step | share of the ops | GB / step | GB/s |\n|---|---|---|---|---|")
  for name, s in kinds.most_common(args.top):
    label = f"{name} (dot)" if name in dots else name
    print(f"| {label} | {s:.3f} | {100 * s / ops:.1f}% | {nbytes[name] / 1e9:.2f} | {nbytes[name] / 1e9 / s:.1f} |")
  flops = sum(
    2 * b * m * k * n * c
    for (b, m, k, n), c in step_matmuls(mc, args.batch, 72, 48, 8, share_prompt=args.share).items()
  )
  t_dot = sum(s for k, s in kinds.items() if k in dots)
  t_rest, b_rest = ops - t_dot, sum(b for k, b in nbytes.items() if k not in dots)
  both = flops / rate + b_rest / bw
  print(
    f"\ndots: {t_dot:.2f} s for {flops / 1e9:.0f} GFLOP of products = {flops / t_dot / 1e9:.0f} GFLOP/s, against the "
    f"square dot's {rate / 1e9:.0f} (their bound {flops / rate:.2f} s)\n"
    f"the rest: {t_rest:.2f} s for {b_rest / 1e9:.2f} GB = {b_rest / t_rest / 1e9:.1f} GB/s, against a stream's "
    f"{bw / 1e9:.1f} GB/s (at that rate {b_rest / bw:.2f} s)\n"
    f"the step: {wall:.2f} s against the two together {both:.2f} s ({wall / both:.2f}x), "
    f"the matmul bound alone {flops / rate:.2f} s ({wall / (flops / rate):.2f}x)"
  )
  unseen = collections.Counter()  # ops the HLO runs (trip counts) more often than the trace showed them
  for name, op in hlo_ops.items():
    missing = (op.runs or 0) - seen[name]
    if op.bytes and missing > 0.5:
      unseen[re.sub(r"\.\d+$", "", name)] += op.bytes * missing
  if unseen:
    print(
      f"not in the trace: {sum(unseen.values()) / 1e9:.2f} GB of ops the HLO runs ("
      + ", ".join(f"{k} {b / 1e9:.2f}" for k, b in unseen.most_common(5))
      + ")"
    )
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
