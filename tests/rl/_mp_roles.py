"""One process of the 2-process learner / sampler test (`test_multiprocess_train.py::test_learner_and_sampler_...`).

Started as `python _mp_roles.py <process id> <coordinator port> <run dir> <out .json>`: 4 simulated CPU devices per
process, `learner.initialize_distributed` over 127.0.0.1, then `rl.train` on the config below: a disaggregated run
whose learner mesh is process 0's 4 devices and whose sampler mesh is process 1's, so each process takes one role
(`rl.roles`); writes what `train` returned to the .json.
"""

import os
import sys

import _mp_train

# _mp_train.py's run (the quickstart made short: 2 GRPO steps of 4 prompts x G=4, a KL penalty, an eval set of 15, a
# checkpoint every step, the INT4 export) with the learner on process 0's 4 devices (data=4) and the sampler on
# process 1's (data=4; its 4 batch slots round the eval set up to 16)
OVERRIDES = [
  *(o for o in _mp_train.OVERRIDES if not o.startswith("learner.mesh=")),
  "learner.mesh=[-1,1,1]",
  "run.placement=disaggregated",
  "sampler.mesh=[4,1]",
]
# synchronous; asynchronous (the sampler's process generates step k + 1 while the learner's trains on step k)
MODES = _mp_train.MODES


def main(pid: int, port: int, out_dir: str, out_path: str):
  _mp_train.run(pid, port, out_dir, out_path, OVERRIDES, MODES, _fault)


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
