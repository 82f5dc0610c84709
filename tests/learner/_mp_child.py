"""One process of the 2-process learner test (`test_multiprocess.py`), and the computation both sides run.

Started as `python _mp_child.py <process id> <coordinator port> <checkpoint dir> <out .npz>`: 4 simulated CPU devices
per process, `learner.initialize_distributed` over 127.0.0.1, one global (data=8) mesh across both processes. Each
process builds only its own half of the batch (`jax.make_array_from_process_local_data`), runs two train steps,
saves an orbax checkpoint (both processes write it) and restores it, and writes what it saw to the .npz.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from lrl_jax import learner as L  # noqa: E402
from lrl_jax import models  # noqa: E402

STEPS = 2


def problem():
  """(model config, learner config, fp32 params as NumPy, the global batch of 16 rows as NumPy)."""
  from _learner_util import make_batch, tiny_cfg  # noqa: PLC0415  (the test helpers, on sys.path here)

  mc = tiny_cfg()
  cfg = L.LearnerConfig(lr=1e-3, compute_dtype="float32")
  params = models.init_params(mc, jax.random.PRNGKey(0))
  halves = [make_batch(s, mc, params) for s in (0, 1)]
  batch = jax.tree_util.tree_map(lambda a, b: np.concatenate([np.asarray(a), np.asarray(b)]), *halves)
  return mc, cfg, jax.tree_util.tree_map(np.asarray, params), batch


def run(mesh, batch_of_mesh, ckpt_dir):
  """Two train steps on `mesh`, a checkpoint saved and restored: {name: NumPy array} of the results."""
  mc, cfg, params, batch = problem()
  state = L.create_train_state(jax.random.PRNGKey(1), mc, cfg, mesh=mesh, params=params)
  roll = batch_of_mesh(batch)
  out = {}
  for i in range(STEPS):
    state, m = L.train_step(state, roll, model_cfg=mc, cfg=cfg, mesh=mesh)
    for k in ("loss", "grad_norm"):
      out[f"{k}_{i}"] = np.asarray(m[k].addressable_data(0))
  ck = L.Checkpointer(ckpt_dir, save_every=1)
  ck.save(state)
  ck.wait()
  target = L.create_train_state(jax.random.PRNGKey(1), mc, cfg, mesh=mesh, params=params)
  restored = ck.restore_latest(target)
  ck.close()
  flat = lambda t: [np.asarray(x.addressable_data(0)) for x in jax.tree_util.tree_leaves(t)]  # noqa: E731
  for j, (a, b) in enumerate(zip(flat(state.params), flat(restored.params))):
    out[f"param_{j}"] = a
    out[f"restored_{j}"] = b
  out["restored_step"] = np.asarray(restored.step.addressable_data(0))
  return out


def main(pid: int, port: int, ckpt_dir: str, out_path: str):
  assert L.initialize_distributed(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid)
  assert jax.device_count() == 8 and jax.local_device_count() == 4 and jax.process_count() == 2
  mesh = L.make_mesh(data=8)

  def local_rows(batch):  # this process's 8 rows of the 16, assembled into global arrays
    def one(x):
      rows = x[8 * pid : 8 * (pid + 1)]
      return jax.make_array_from_process_local_data(L.batch_sharding(mesh, x.ndim), rows, x.shape)

    return jax.tree_util.tree_map(one, batch)

  out = run(mesh, local_rows, ckpt_dir)
  np.savez(out_path, **out)
  print(f"process {pid}: done", flush=True)


if __name__ == "__main__":
  # before the CPU backend starts (the first device use); not on import: the test imports `run` from here
  os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
  os.environ["JAX_PLATFORMS"] = "cpu"
  main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
