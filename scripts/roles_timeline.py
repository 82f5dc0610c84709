"""The learner and the sampler in two processes of their own (`rl.roles`): step time, overlap and the weight transfer.

    python scripts/roles_timeline.py [--steps 12] [--extra key=value ...]

Starts 2 processes on 127.0.0.1 (4 simulated CPU devices each; `jax.distributed`), the learner on process 0's devices
(data=4) and the sampler on process 1's (tensor=4), and runs the quickstart (`--extra` overrides, e.g. a larger model)
for `--steps` RL steps without evaluation in between, in these arms: INT4 served, synchronous off-policy; INT4 served,
asynchronous (the sampler's process generates step k + 1 while the learner's trains on step k); and the synchronous
arm with bf16 and NVFP4 served, for the transfer. Prints per arm the mean step wall time after the first (which
compiles), the fraction of it both sides are busy (`rl.metrics.timeline_overlap`), the served bytes sent to the other
process per step and the transfer's median time, and whether the INT4 arms' numbers are equal (they must be).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ARMS = {
  "int4, synchronous, off-policy": ["run.off_policy=true"],
  "int4, asynchronous": ["run.async_rollouts=true"],
  "bf16, synchronous, off-policy": ["run.off_policy=true", "quant.sampler=bf16", "quant.learner=none"],
  "nvfp4, synchronous, off-policy": ["run.off_policy=true", "quant.sampler=nvfp4", "quant.learner=nvfp4"],
}
BASE = ["run.eval_every=0", "learner.mesh=[-1,1,1]", "run.placement=disaggregated", "sampler.mesh=[1,4]"]


def child(pid: int, port: int, steps: int, out: str, extra: list[str], arms: list[int]) -> None:
  import jax  # noqa: PLC0415

  from lrl_jax import learner as L  # noqa: PLC0415
  from lrl_jax.config import load_config  # noqa: PLC0415
  from lrl_jax.rl import train  # noqa: PLC0415

  L.initialize_distributed(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid)
  assert jax.process_count() == 2
  got = {}
  names = list(ARMS)
  for i in arms:
    name, over = names[i], ARMS[names[i]]
    cfg = load_config(
      "configs/quickstart.yaml", [f"run.steps={steps}", *BASE, *extra, *over, f"run.out_dir={out}/arm{i}"]
    )
    got[name] = train(cfg, overwrite=True, progress=False, export=False).records
  if pid == 0:
    Path(out, "records.json").write_text(json.dumps(got))


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--steps", type=int, default=12)
  ap.add_argument("--out", default="runs/roles_timeline")
  ap.add_argument("--extra", nargs="*", default=[], help="more key=value overrides for every arm")
  ap.add_argument(
    "--arms", nargs="+", type=int, default=None, help="which arms (indices into ARMS), in this order (default: all)"
  )
  ap.add_argument("--child", nargs=2, type=int, metavar=("PID", "PORT"), help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.child:
    child(*args.child, args.steps, args.out, args.extra, args.arms or list(range(len(ARMS))))
    return 0

  import numpy as np  # noqa: PLC0415

  from lrl_jax.rl import metrics as M  # noqa: PLC0415

  sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
  from tests._mp_launch import free_port  # noqa: PLC0415

  Path(args.out).mkdir(parents=True, exist_ok=True)
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
  port = free_port()
  argv = [sys.executable, __file__, "--steps", str(args.steps), "--out", args.out, "--extra", *args.extra]
  argv += ["--arms", *map(str, args.arms or range(len(ARMS))), "--child"]
  logs = [open(Path(args.out, f"{i}.log"), "w") for i in range(2)]  # noqa: SIM115
  ps = [
    subprocess.Popen([*argv, str(i), str(port)], env=env, stdout=logs[i], stderr=subprocess.STDOUT) for i in range(2)
  ]
  codes = [p.wait() for p in ps]
  if any(codes):
    print(f"a process failed ({codes}): see {args.out}/0.log, 1.log", file=sys.stderr)
    return 1
  got = json.loads(Path(args.out, "records.json").read_text())
  print(f"2 processes x 4 CPU devices, {os.cpu_count()} cores; {args.steps} RL steps, extra: {' '.join(args.extra)}")
  print(
    "\n| arm | step s (after step 0) | vs int4 sync | sampler busy | learner busy | both busy | bytes sent / step | "
    "transfer ms |\n|---|---|---|---|---|---|---|---|"
  )
  first = list(ARMS)[0]
  base = M.timeline_overlap(got[first if first in got else next(iter(got))])["step_s"]
  for name, recs in got.items():
    ov = M.timeline_overlap(recs)
    later = recs[1:]
    nbytes = float(np.mean([r["sync/bytes"] for r in later]))
    tr = float(np.median([r["time/sync_transfer_s"] for r in later]))
    print(
      f"| {name} | {ov['step_s']:.2f} | {ov['step_s'] / base:.2f}x | {100 * ov['sampler_busy_frac']:.0f}% | "
      f"{100 * ov['learner_busy_frac']:.0f}% | {100 * ov['overlap_frac']:.0f}% | {nbytes / 1024:.1f} KiB "
      f"| {1e3 * tr:.1f} |"
    )
  pair = [n for n in list(ARMS)[:2] if n in got]
  untimed = [
    [{k: v for k, v in r.items() if not k.startswith("time/") and k != "tokens_per_s"} for r in got[n]] for n in pair
  ]
  if len(pair) == 2:
    print(f"\nINT4 synchronous off-policy == asynchronous, every record but its clock: {untimed[0] == untimed[1]}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
