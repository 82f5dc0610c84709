#!/usr/bin/env python
"""Does Adam with 8-bit moments (learner.opt_state_dtype=fp8) train like float32 Adam? The quickstart (tiny model,
2-digit addition, INT4 QAT: supervised warm-up then GRPO) with each optimizer state, the same seeds, paired by seed.

    python scripts/adam8_parity.py --steps 40     # the table in lrl_jax/learner/README.md

Both the warm-up and the RL steps use the optimizer under test. Per seed: final greedy accuracy on 256 eval problems;
then the mean paired difference (fp8 − f32) with a 95% bootstrap interval over seeds (`lrl_jax.rl.stats.paired`), and
a verdict against a ±3-point equivalence margin (`stats.within`).
"""

import argparse
import sys
import tempfile

from lrl_jax.config import load_config
from lrl_jax.rl import stats, train


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
  ap.add_argument("--steps", type=int, default=40)
  args = ap.parse_args(argv)
  acc = {"float32": {}, "fp8": {}}
  for seed in args.seeds:
    for dtype in acc:
      with tempfile.TemporaryDirectory(prefix=f"adam8_{dtype}_{seed}_") as out:
        cfg = load_config(
          "configs/quickstart.yaml",
          [f"run.seed={seed}", f"run.steps={args.steps}", "run.eval_every=0", "run.ckpt_every=0",
           f"learner.opt_state_dtype={dtype}", f"run.out_dir={out}"],
        )  # fmt: skip
        r = train(cfg, progress=False, export=False)
      acc[dtype][seed] = r.accuracy_after
      print(
        f"seed {seed} {dtype:8s}: accuracy {100 * r.accuracy_before:.1f} -> {100 * r.accuracy_after:.1f}", flush=True
      )
  p = stats.paired(acc["fp8"], acc["float32"])
  verdict = stats.within(p.diff.lo, p.diff.hi, -0.03, 0.03)
  print("\n| seed | f32 Adam accuracy (%) | fp8-moment Adam accuracy (%) |\n|---|---|---|")
  for s in args.seeds:
    print(f"| {s} | {100 * acc['float32'][s]:.1f} | {100 * acc['fp8'][s]:.1f} |")
  print(
    f"\nfp8 − f32: {p.diff.fmt(100, sign=True)} points (95% bootstrap over {p.diff.n} seeds; {p.wins} higher, "
    f"{p.losses} lower, {p.ties} equal; sign test p = {p.p_sign:.3g}); equivalence within ±3 points: {verdict}"
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
