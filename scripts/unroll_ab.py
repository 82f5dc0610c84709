"""The learner's train step with its layer loop as a `lax.scan` against unrolled (`LearnerConfig.unroll_layers`),
side by side in one process: compile time, the bytes of the ops that are not dots (`traffic.program_bytes`), and
the median step time, timed round-robin.

    python scripts/unroll_ab.py [--batch 16] [--dtype bfloat16] [--share | --no-share] [--repeats 5]

SmolLM2-135M shapes (random weights), `--batch` x 72 tokens, prompt 48 in groups of 8 (as `lrl-jax bench learner
torch`); forward, backward, AdamW.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--batch", type=int, default=16)
  ap.add_argument("--dtype", default="bfloat16", help="the learner's compute dtype")
  ap.add_argument("--share", action=argparse.BooleanOptionalAction, default=True, help="run a group's prompt once")
  ap.add_argument("--repeats", type=int, default=5)
  args = ap.parse_args()

  import jax  # noqa: PLC0415

  from lrl_jax import models  # noqa: PLC0415
  from lrl_jax.learner import LearnerConfig, traffic  # noqa: PLC0415
  from lrl_jax.learner.bench import MODELS, _batch, _JaxRunner, _round_robin  # noqa: PLC0415

  mc = MODELS["smollm2"]
  roll = _batch(mc, args.batch, 72, 48, 8)
  params = models.init_params(mc.replace(param_dtype="float32"), jax.random.PRNGKey(0))
  print(
    f"SmolLM2-135M shapes, {args.batch} x 72 tokens, {args.dtype}, prompt {'shared' if args.share else 'not shared'}; "
    f"median of {args.repeats}, round-robin",
    flush=True,
  )
  print("\n| layer loop | compile s | dots' GB / step | other ops' GB / step | step s |\n|---|---|---|---|---|")
  steps = {
    unroll: _JaxRunner(
      mc,
      LearnerConfig(lr=1e-6, compute_dtype=args.dtype, share_prompt=args.share, unroll_layers=unroll),
      roll,
      params,
    )
    for unroll in (False, True)
  }
  rows = {unroll: (r.compile_s, *traffic.program_bytes(r.compiled.as_text())) for unroll, r in steps.items()}
  med = _round_robin(steps, args.repeats)
  for unroll, (ct, dots, other) in rows.items():
    print(
      f"| {'unrolled' if unroll else 'scan'} | {ct:.1f} | {dots / 1e9:.1f} | {other / 1e9:.1f} | {med[unroll]:.2f} |"
    )
  print(f"\nunrolled / scan: {med[True] / med[False]:.2f}x the step, {rows[True][0] / rows[False][0]:.2f}x the compile")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
