"""One process of the 2-process learner / sampler test (`test_multiprocess_train.py::test_learner_and_sampler_...`).

Started as `python _mp_roles.py <process id> <coordinator port> <run dir> <out .json>`: 4 simulated CPU devices per
process, `learner.initialize_distributed` over 127.0.0.1, then `rl.train` on the config below: a disaggregated run
whose learner mesh is process 0's 4 devices and whose sampler mesh is process 1's, so each process takes one role
(`rl.roles`); writes what `train` returned to the .json.
"""

import json
import os
import sys

# the quickstart (INT4 QAT learner, INT4 sampler) made short, as _mp_train.py's, with the learner on 4 devices
# (data=4) and the sampler on the other 4 (data=4): 2 GRPO steps of 4 prompts x G=4, a KL penalty, an eval set of 15
# (the sampler's 4 batch slots round it up to 16), a checkpoint every step, the INT4 export at the end
OVERRIDES = [
  "run.sft_steps=20",
  "run.steps=2",
  "run.batch_prompts=4",
  "run.eval_every=1",
  "run.ckpt_every=1",
  "task.eval_size=15",
  "task.format_reward=0.5",
  "learner.mesh=[-1,1,1]",
  "learner.kl_coef=0.05",
  "run.placement=disaggregated",
  "sampler.mesh=[4,1]",
]
# synchronous; asynchronous (the sampler's process generates step k + 1 while the learner's trains on step k)
MODES = {"sync": [], "async": ["run.async_rollouts=true"]}


def main(pid: int, port: int, out_dir: str, out_path: str):
  import jax  # noqa: PLC0415

  from lrl_jax import learner as L  # noqa: PLC0415
  from lrl_jax.config import load_config  # noqa: PLC0415
  from lrl_jax.rl import train  # noqa: PLC0415

  assert L.initialize_distributed(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid)
  assert jax.device_count() == 8 and jax.local_device_count() == 4 and jax.process_count() == 2
  got = {}
  for mode, over in MODES.items():
    cfg = load_config("configs/quickstart.yaml", [*OVERRIDES, *over, f"run.out_dir={out_dir}/{mode}"])
    res = train(cfg, progress=False, export=True)
    got[mode] = {
      "records": res.records,
      "accuracy_before": res.accuracy_before,
      "accuracy_after": res.accuracy_after,
      "eval_after": res.eval_after,
      "steps": res.steps,
      "paths": res.paths,
    }
  got["fault"] = _fault(out_dir)
  with open(out_path, "w") as f:
    json.dump(got, f)
  print(f"process {pid}: done", flush=True)


def _fault(out_dir: str) -> dict:
  """The asynchronous run again, with the sampler's process raising on RL step 1's rollouts: the learner's process
  stops with a `SamplerError` naming the step and the sampler's process, the sampler's with its own error, the
  step-1 checkpoint intact; then `resume=True` in both finishes the run."""
  from lrl_jax.config import load_config  # noqa: PLC0415
  from lrl_jax.rl import SamplerError, loop, train  # noqa: PLC0415

  cfg = load_config("configs/quickstart.yaml", [*OVERRIDES, *MODES["async"], f"run.out_dir={out_dir}/fault"])
  sample = loop._sample

  def failing(k, *args, **kw):
    if k == 1:
      raise RuntimeError("injected sampler failure")
    return sample(k, *args, **kw)

  loop._sample = failing
  try:
    train(cfg, progress=False, export=False)
    error = None
  except (SamplerError, RuntimeError) as e:
    error = f"{type(e).__name__}: {e}"
  finally:
    loop._sample = sample
  res = train(cfg, resume=True, progress=False, export=False)
  return {"error": error, "records": res.records, "accuracy_after": res.accuracy_after, "steps": res.steps}


if __name__ == "__main__":
  os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
  os.environ["JAX_PLATFORMS"] = "cpu"
  main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
