"""Where one learner step's time goes, by XLA op kind: a `jax.profiler` trace of the step read back on this machine.

    python scripts/learner_profile.py [--share | --no-share] [--dtype float32] [--batch 16] [--steps 2]

The GRPO-sized step of `lrl-jax bench learner torch` (SmolLM2-135M shapes, random weights, 16 (`--batch`) x 72
tokens, prompt 48 in groups of 8; forward, backward, AdamW), compiled and run once, then `--steps` steps traced.
Prints the time per step of each op kind (the op's name without its numeric suffix: `ynn_fusion` are XLA:CPU's
YNNPACK dot fusions, `dot` its other dots, the rest elementwise / layout / slicing fusions), from the thunk executor's
events (XLA:CPU runs the thunks one after another; a dot's helper threads are not counted again).
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
  args = ap.parse_args()

  import jax  # noqa: PLC0415
  from jax.profiler import ProfileData  # noqa: PLC0415

  from lrl_jax import models  # noqa: PLC0415
  from lrl_jax.learner import LearnerConfig  # noqa: PLC0415
  from lrl_jax.learner.bench import MODELS, _batch, _jax_runner  # noqa: PLC0415

  mc = MODELS["smollm2"]
  cfg = LearnerConfig(lr=1e-6, compute_dtype=args.dtype, share_prompt=args.share)
  roll = _batch(mc, args.batch, 72, 48, 8)
  params = models.init_params(mc.replace(param_dtype="float32"), jax.random.PRNGKey(0))
  step = _jax_runner(mc, cfg, roll, params)  # compiled and run once; each step waits for its temporaries' free
  with tempfile.TemporaryDirectory() as d:
    t0 = time.perf_counter()
    with jax.profiler.trace(d):
      for _ in range(args.steps):
        step()
    wall = (time.perf_counter() - t0) / args.steps
    data = ProfileData.from_file(sorted(glob.glob(f"{d}/**/*.xplane.pb", recursive=True))[-1])
    kinds: collections.Counter = collections.Counter()
    for plane in data.planes:
      for line in plane.lines:
        if not line.name.startswith("tf_XLAEigen"):  # the threads XLA:CPU executes thunks on
          continue
        for ev in line.events:
          if not ev.name.startswith(("ThunkExecutor", "SlinkyThreadPool")):
            kinds[re.sub(r"\.\d+$", "", ev.name)] += ev.duration_ns / 1e9 / args.steps
  ops = sum(kinds.values())
  print(
    f"SmolLM2-135M shapes, {args.batch} x 72 tokens, prompt {'shared' if args.share else 'not shared'}, {args.dtype}; "
    f"{os.cpu_count()} cores; {args.steps} steps traced: {wall:.2f} s a step (with the tracer), ops {ops:.2f} s"
  )
  print("\n| op kind | s / step | share of the ops |\n|---|---|---|")
  for name, s in kinds.most_common(args.top):
    print(f"| {name} | {s:.3f} | {100 * s / ops:.1f}% |")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
