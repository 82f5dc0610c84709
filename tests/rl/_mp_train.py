"""One process of the 2-process `rl.train` test (`test_multiprocess_train.py`).

Started as `python _mp_train.py <process id> <coordinator port> <run dir> <out .json>`: 4 simulated CPU devices per
process, `learner.initialize_distributed` over 127.0.0.1, then `rl.train` on the config below (the learner on one
data=8 mesh across both processes); writes what `train` returned to the .json.
"""

import json
import os
import sys

# the quickstart (INT4 QAT learner, INT4 sampler) made short: a 20-step warm-up, 2 GRPO steps of 4 prompts x G=4
# (16 rows: 8 per process, 2 per learner device), a KL penalty to the warm-up's policy (its file written by process 0,
# placed on the global mesh by all), an eval set of 15 (does not split across 2: padded), a checkpoint every step,
# the INT4 export at the end
OVERRIDES = [
  "run.sft_steps=20",
  "run.steps=2",
  "run.batch_prompts=4",
  "run.eval_every=1",
  "run.ckpt_every=1",
  "task.eval_size=15",
  "task.format_reward=0.5",
  "learner.mesh=[8,1,1]",
  "learner.kl_coef=0.05",
]
# synchronous, and asynchronous (step k + 1 sampled in a thread, each process its share, while the learner trains)
MODES = {"sync": [], "async": ["run.async_rollouts=true"]}


def main(pid: int, port: int, out_dir: str, out_path: str):
  run(pid, port, out_dir, out_path, OVERRIDES, MODES, _fault)


def run(pid: int, port: int, out_dir: str, out_path: str, overrides: list[str], modes: dict, fault) -> None:
  """Joins the 2-process run, trains the quickstart with `overrides` in each of `modes`, then `fault(out_dir)`; writes
  what `train` returned to `out_path` (also `_mp_roles.py`'s body)."""
  import jax  # noqa: PLC0415

  from lrl_jax import learner as L  # noqa: PLC0415
  from lrl_jax.config import load_config  # noqa: PLC0415
  from lrl_jax.rl import train  # noqa: PLC0415

  assert L.initialize_distributed(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid)
  assert jax.device_count() == 8 and jax.local_device_count() == 4 and jax.process_count() == 2
  got = {}
  for mode, over in modes.items():
    cfg = load_config("configs/quickstart.yaml", [*overrides, *over, f"run.out_dir={out_dir}/{mode}"])
    res = train(cfg, progress=False, export=True)
    got[mode] = {
      "records": res.records,
      "accuracy_before": res.accuracy_before,
      "accuracy_after": res.accuracy_after,
      "eval_after": res.eval_after,
      "steps": res.steps,
      "paths": res.paths,
    }
  got["fault"] = fault(out_dir)
  with open(out_path, "w") as f:
    json.dump(got, f)
  print(f"process {pid}: done", flush=True)


def _fault(out_dir: str) -> dict:
  """The synchronous run again, with process 1's sampler raising on RL step 1 (its share of the rows): both processes
  must stop with a `SamplerError` (none waiting forever for the other's rows), the checkpoint of step 1 intact; then
  `resume=True` in both finishes the run."""
  import jax  # noqa: PLC0415

  from lrl_jax.config import load_config  # noqa: PLC0415
  from lrl_jax.rl import SamplerError, loop, train  # noqa: PLC0415

  cfg = load_config("configs/quickstart.yaml", [*OVERRIDES, f"run.out_dir={out_dir}/fault"])
  share, calls = loop._local_share, []

  def failing(*args, evaluation, **kw):
    if not evaluation:
      calls.append(1)
      if len(calls) == 2 and jax.process_index() == 1:  # RL step 1 (step 0 was the first)
        raise RuntimeError("injected sampler failure")
    return share(*args, evaluation=evaluation, **kw)

  loop._local_share = failing
  try:
    train(cfg, progress=False, export=False)
    error = None
  except SamplerError as e:
    error = str(e)
  finally:
    loop._local_share = share
  res = train(cfg, resume=True, progress=False, export=False)
  return {"error": error, "records": res.records, "accuracy_after": res.accuracy_after, "steps": res.steps}


if __name__ == "__main__":
  # before the CPU backend starts (the first device use); not on import. The test passes its own flags (4 devices)
  os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
  os.environ["JAX_PLATFORMS"] = "cpu"
  main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
