"""Step time and overlap of the sampler and the learner, by placement and schedule, on 8 simulated CPU devices.

    python scripts/placement_timeline.py [--steps 12] [--extra key=value ...]

The quickstart run (tiny model, INT4 QAT learner, INT4 served) for `--steps` RL steps, no evaluation in between,
in four arms: colocated synchronous on-policy (the default), colocated synchronous one-step off-policy (the sampler's
mesh on the learner's 4 devices), disaggregated synchronous off-policy (learner on devices 0-3, sampler on 4-7) and
disaggregated asynchronous (`run.async_rollouts`: step k + 1 generated while the learner trains on step k). Prints,
per arm, the mean wall time of an RL step after the first (which compiles), the fraction of that time the sampler
and the learner are busy at once (`rl.metrics.timeline_overlap`), the sync's bytes and transfer time, and whether
the off-policy arms' numbers are equal (they must be, bit for bit).
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

ARMS = {
  "colocated, synchronous, on-policy": [],
  "colocated, synchronous, off-policy": ["run.off_policy=true", "sampler.mesh=[1,4]"],
  "disaggregated 4+4, synchronous, off-policy": [
    "run.off_policy=true",
    "run.placement=disaggregated",
    "sampler.mesh=[1,4]",
  ],
  "disaggregated 4+4, asynchronous": ["run.async_rollouts=true", "run.placement=disaggregated", "sampler.mesh=[1,4]"],
}


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--steps", type=int, default=12)
  ap.add_argument("--out", default="runs/placement_timeline")
  ap.add_argument("--extra", nargs="*", default=[], help="more key=value overrides for every arm")
  args = ap.parse_args()

  import jax  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415

  from lrl_jax.config import load_config  # noqa: PLC0415
  from lrl_jax.rl import metrics as M  # noqa: PLC0415
  from lrl_jax.rl import train  # noqa: PLC0415

  base = [f"run.steps={args.steps}", "run.eval_every=0", "learner.mesh=[4,1,1]", *args.extra]
  print(f"backend {jax.default_backend()}, {jax.device_count()} devices, {os.cpu_count()} cores", flush=True)
  rows, numbers = [], {}
  for i, (name, extra) in enumerate(ARMS.items()):
    cfg = load_config("configs/quickstart.yaml", [*base, *extra, f"run.out_dir={args.out}/arm{i}"])
    r = train(cfg, overwrite=True, progress=False, export=False)
    ov = M.timeline_overlap(r.records)
    later = r.records[1:]
    rows.append(
      (
        name,
        ov,
        float(np.mean([x["sync/bytes"] for x in later])),
        float(np.median([x["time/sync_transfer_s"] for x in later])),
        r.accuracy_after,
      )
    )
    numbers[name] = [
      {k: v for k, v in x.items() if not k.startswith("time/") and k != "tokens_per_s"} for x in r.records
    ]
    print(f"{name}: step {ov['step_s']:.2f} s, overlap {100 * ov['overlap_frac']:.1f}%", flush=True)
  sync_s = rows[0][1]["step_s"]
  print(
    "\n| arm | step s (after step 0) | vs colocated sync | sampler busy | learner busy | both busy | sync bytes | "
    "transfer ms | accuracy after |\n|---|---|---|---|---|---|---|---|---|"
  )
  for name, ov, nbytes, tr, acc in rows:
    print(
      f"| {name} | {ov['step_s']:.2f} | {ov['step_s'] / sync_s:.2f}x | {100 * ov['sampler_busy_frac']:.0f}% | "
      f"{100 * ov['learner_busy_frac']:.0f}% | {100 * ov['overlap_frac']:.0f}% | {nbytes / 1024:.1f} KiB | "
      f"{1e3 * tr:.1f} | {acc:.3f} |"
    )
  off = [numbers[n] for n in ARMS if "off-policy" in n or "asynchronous" in n]
  print(f"\noff-policy arms equal bit for bit (every RL record but its clock): {all(x == off[0] for x in off)}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
