"""Checkpoints: resume == uninterrupted run (same next-step loss and params); SIGKILL during a save."""

import os
import signal
import subprocess
import sys
import time

import jax
import pytest
from _learner_util import host, make_batch, max_abs_diff, tiny_cfg

from lrl_jax import learner as L

MC = tiny_cfg()
CFG = L.LearnerConfig(
  lr=1e-3, compute_dtype="float32", correction=L.CorrectionConfig(method="tis")
)  # the step tests' config: shared compile


def _batch_for_step(k, params0):
  """The data of step k depends on k only (here: the seed), never on the process's history."""
  return make_batch(100 + k, MC, params0)


def test_resume_equals_uninterrupted(tmp_path):
  key = jax.random.PRNGKey(0)
  state = L.create_train_state(key, MC, CFG)
  params0 = host(state.params)
  losses = []
  for k in range(4):
    state, m = L.train_step(state, _batch_for_step(k, params0), model_cfg=MC, cfg=CFG)
    losses.append(float(m["loss"]))
  final = host(state)

  # Interrupted run: 2 steps, checkpoint (save_every=2), the process "dies".
  state = L.create_train_state(key, MC, CFG)
  ck = L.Checkpointer(tmp_path / "ckpt", save_every=2)
  for k in range(2):
    state, _ = L.train_step(state, _batch_for_step(k, params0), model_cfg=MC, cfg=CFG)
    ck.maybe_save(state)
  assert ck.all_steps() == [2]
  ck.close()
  del state

  # --resume: a fresh process builds the abstract state and restores the latest checkpoint.
  ck = L.Checkpointer(tmp_path / "ckpt", save_every=2)
  target = jax.eval_shape(lambda: L.create_train_state(jax.random.PRNGKey(123), MC, CFG))
  state = ck.restore_latest(target)
  assert int(state.step) == 2
  for k in range(int(state.step), 4):
    state, m = L.train_step(state, _batch_for_step(k, params0), model_cfg=MC, cfg=CFG)
    ck.maybe_save(state)
  ck.save(state)  # final (already saved at 4: no duplicate)
  assert float(m["loss"]) == losses[3]  # bit for bit: same compiled step, same inputs
  assert max_abs_diff(host(state), final) == 0
  assert ck.all_steps() == [2, 4]
  ck.close()


def test_sharded_restore(tmp_path):
  """A single-device checkpoint restored onto the (2, 2, 2) mesh with state_shardings."""
  state = L.create_train_state(jax.random.PRNGKey(1), MC, CFG)
  want = host(state)
  with L.Checkpointer(tmp_path, save_every=1) as ck:
    ck.save(state)
  mesh = L.make_mesh(data=2, fsdp=2, tensor=2)
  target = jax.eval_shape(lambda: L.create_train_state(jax.random.PRNGKey(1), MC, CFG))
  with L.Checkpointer(tmp_path, save_every=1) as ck:
    got = ck.restore_latest(target, L.state_shardings(target, mesh, CFG))
  assert max_abs_diff(host(got), want) == 0
  q = got.params["layers"]["mlp"]["down_proj"]["kernel"]
  assert q.sharding.spec == jax.sharding.PartitionSpec(None, "tensor", "fsdp")


def test_restore_latest_empty_and_bad_step(tmp_path):
  with L.Checkpointer(tmp_path, save_every=1) as ck:
    assert ck.restore_latest(None) is None
    with pytest.raises(ValueError, match="no complete checkpoint for step 7"):
      ck.restore(7, None)
  with pytest.raises(ValueError, match="save_every"):
    L.Checkpointer(tmp_path, save_every=0)


def test_a_changed_integer_dtype_is_refused(tmp_path):
  """Restoring into a state whose leaf has another non-float dtype than the checkpoint's fails, naming the leaf and
  both dtypes: orbax would cast the values (fp8 codes into uint8 as numbers, integers wrapped) without a word."""
  import jax.numpy as jnp

  mc, cfg = tiny_cfg(), L.LearnerConfig(lr=1e-3)
  st = L.create_train_state(jax.random.PRNGKey(0), mc, cfg)
  ck = L.Checkpointer(tmp_path / "ck", save_every=1)
  ck.save(st)
  ck.wait()
  other = L.abstract_state(st)
  other = other.replace(skipped=jax.ShapeDtypeStruct((), jnp.uint32, sharding=other.skipped.sharding))
  with pytest.raises(L.CheckpointError, match=r"\.skipped \(\) was saved as int32 and the state holds uint32"):
    ck.restore(0, other)
  back = ck.restore(0, st)  # the same dtypes restore
  assert jax.tree_util.tree_all(jax.tree_util.tree_map(lambda a, b: a.dtype == b.dtype, st, back))
  ck.close()


def test_sigkill_during_save_resumes_from_last_complete(tmp_path):
  directory = str(tmp_path / "ckpt")
  child = os.path.join(os.path.dirname(__file__), "_ckpt_child.py")
  # one device in the child; conftest's other XLA flags too, so that its init compiles like ours (bit for bit)
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform")]
  env = dict(os.environ, XLA_FLAGS=" ".join(["--xla_force_host_platform_device_count=1", *flags]))
  proc = subprocess.Popen(
    [sys.executable, child, directory], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
  )
  lines = []
  try:
    deadline = time.time() + 120
    while time.time() < deadline:
      line = proc.stdout.readline()
      if not line:
        break
      lines.append(line.strip())
      if line.startswith("IN_SAVE"):
        break
    assert lines and lines[-1] == "IN_SAVE", (lines, proc.stderr.read() if proc.poll() is not None else "")
    os.kill(proc.pid, signal.SIGKILL)
  finally:
    proc.wait(timeout=60)
  assert proc.returncode == -signal.SIGKILL
  leftovers = os.listdir(directory)
  assert "0" in leftovers and "1" not in leftovers
  assert any(name.startswith("1.") and "tmp" in name for name in leftovers), leftovers  # the half-done save

  cfg = L.LearnerConfig(lr=1e-3, compute_dtype="float32")
  fresh = L.create_train_state(jax.random.PRNGKey(0), MC, cfg)  # what the child saved at step 0
  with L.Checkpointer(directory, save_every=1) as ck:
    assert ck.latest_step() == 0
    got = ck.restore_latest(jax.eval_shape(lambda: fresh))
    assert int(got.step) == 0 and max_abs_diff(host(got), host(fresh)) == 0
    assert ck.save(got.replace(step=got.step + 1))  # the run goes on: step 1 saves cleanly now
    assert ck.all_steps() == [0, 1]
