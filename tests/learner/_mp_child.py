"""One process of the 2-process learner test (`test_multiprocess.py`), and the computation both sides run.

Started as `python _mp_child.py <process id> <coordinator port> <checkpoint dir> <out .npz>`: 4 simulated CPU devices
per process, `learner.initialize_distributed` over 127.0.0.1, one global (data=8) mesh across both processes. Each
process builds only its own half of the batch (`jax.make_array_from_process_local_data`), runs two train steps,
saves an orbax checkpoint (both processes write it) and restores it, and writes what it saw to the .npz. Then one RL
step end to end (`rl_step`): the sync quantizes the global masters, each process gathers the served tree onto its own
first device, generates and scores its own prompts, and the learner prepares and trains on the global rollout.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

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


# the quickstart (INT4 QAT learner, INT4 sampler) without its warm-up: 4 prompts x G=4, a format reward for signal
RL_CONFIG = ["run.sft_steps=0", "run.batch_prompts=4", "task.format_reward=0.5", "learner.lr=3e-4"]


def rl_step(mesh, halves, to_global, gather):
  """One GRPO step of the quickstart on `mesh`: {name: NumPy array} of the results. halves: the halves of the 4
  prompts this process generates (one process: both); to_global: this process's rollout rows -> the global rollout;
  gather: the served tree (global arrays) -> the same tree whole on this process."""
  from lrl_jax.config import load_config  # noqa: PLC0415
  from lrl_jax.rl.rollouts import encode_prompt_batch, generate_rollout, score_rollout  # noqa: PLC0415
  from lrl_jax.rl.setup import build_model, new_state  # noqa: PLC0415
  from lrl_jax.rl.sync import sync  # noqa: PLC0415

  cfg = load_config("configs/quickstart.yaml", RL_CONFIG)
  setup = build_model(cfg)
  state = new_state(cfg, setup, setup.params, mesh=mesh)
  served = jax.device_put(gather(sync(state.params, setup.sync)), jax.local_devices()[0])  # the sampler: one device
  prompts, refs = setup.task.prompts(0, cfg.run.batch_prompts)
  G, key = cfg.sampler.group_size, jax.random.fold_in(jax.random.PRNGKey(cfg.run.seed), 2)
  parts = []
  for h in halves:
    rows = slice(2 * h, 2 * h + 2)
    tok, val = encode_prompt_batch(setup.task, prompts[rows])
    roll = generate_rollout(served, tok, val, setup, cfg, jax.random.fold_in(key, h), evaluation=False, group_size=G)
    rewards, _ = score_rollout(setup.task, roll, tok.shape[1], [r for r in refs[rows] for _ in range(G)], cfg)
    parts.append(jax.tree_util.tree_map(np.asarray, roll.replace(rewards=np.asarray(rewards, np.float32))))
  local = jax.tree_util.tree_map(lambda *x: np.concatenate(x), *parts)
  roll, _ = L.prepare_rollout(state, to_global(local), None, model_cfg=setup.model_cfg, cfg=cfg.learner, mesh=mesh)
  state, m = L.train_step(state, roll, model_cfg=setup.model_cfg, cfg=cfg.learner, mesh=mesh)
  out = {f"rl_{k}": np.asarray(m[k].addressable_data(0)) for k in ("loss", "grad_norm")}
  out["rl_rewards_local"] = local.rewards
  for j, x in enumerate(jax.tree_util.tree_leaves(state.params)):
    out[f"rl_param_{j}"] = np.asarray(x.addressable_data(0))
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

  def rows_to_global(local):  # this process's rows of the rollout, the first half of the global one or the second
    def one(x):
      shape = (2 * x.shape[0], *x.shape[1:])
      return jax.make_array_from_process_local_data(L.batch_sharding(mesh, x.ndim), x, shape)

    return jax.tree_util.tree_map(one, local)

  gather = lambda t: multihost_utils.process_allgather(t, tiled=True)  # noqa: E731
  out.update(rl_step(mesh, [pid], rows_to_global, gather))
  np.savez(out_path, **out)
  print(f"process {pid}: done", flush=True)


if __name__ == "__main__":
  # before the CPU backend starts (the first device use); not on import: the test imports `run` from here
  os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
  os.environ["JAX_PLATFORMS"] = "cpu"
  main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
