"""Two processes on localhost (`jax.distributed` over 127.0.0.1, 4 simulated CPU devices each) train the learner
on one global mesh, write one orbax checkpoint together and restore it, then run one GRPO step end to end (sync of
the global masters, each process sampling and scoring its own prompts, the learner on the global rollout): the same
numbers as one process with 8 devices (`_mp_child.py` runs the processes' side)."""

import os
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from lrl_jax import learner as L
from tests._mp_launch import run_processes

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _mp_child  # noqa: E402


@pytest.mark.multiprocess
def test_two_processes_train_and_checkpoint_like_one(tmp_path):
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  run_processes(
    HERE / "_mp_child.py",
    lambda i, port: [i, port, tmp_path / "ckpt", tmp_path / f"{i}.npz"],
    tmp_path,
    env=env,
    timeout=300,
  )
  got = [dict(np.load(tmp_path / f"{i}.npz")) for i in range(2)]

  # the reference: one process, its 8 devices (tests/conftest.py), the batch placed whole
  assert jax.device_count() == 8
  mesh = L.make_mesh(data=8)
  want = _mp_child.run(mesh, lambda b: L.shard_batch(jax.tree_util.tree_map(np.asarray, b), mesh), tmp_path / "one")
  # Tolerance: the one difference is the order of the 8-way sums across the data axis (gloo between the processes,
  # XLA's in-process all-reduce within one): f32 reordering, at most 7 ulps of the summed magnitudes. Loss and
  # gradient norm: rtol 4e-6 (7 x 2^-23 = 8e-7, x5 for terms of mixed sign). Parameters after 2 AdamW steps at
  # lr 1e-3: each update is lr * m / (sqrt(v) + eps), which a relative change d of an element's gradient moves by
  # at most about lr * d; an element whose 8 partial gradients nearly cancel has a large d (seen: 2e-8 on one
  # element of 2048, a d of 2e-5), so atol 1e-6 = lr x 1e-3 allows d up to 1e-3 per step, still 1000x below
  # what a wrong reduction (a shard missing or counted twice: d of order 1/8) would give.
  rl = _mp_child.rl_step(mesh, [0, 1], lambda b: L.shard_batch(b, mesh), lambda t: t)
  # The RL step: each process generated its own two prompts on the weights the sync served from the global masters;
  # generation runs on one device in both set-ups with the same keys, so the rollouts (and rewards) are equal bit for
  # bit; loss and gradient norm follow the tolerance above. Parameters: this is Adam's *first* step, whose update is
  # lr * g / (|g| + eps), about lr * sign(g): for an element whose 8 partial gradients cancel to |g| of order eps,
  # a reordered sum can move the update by up to 2 lr (seen: 2 of 16384 elements of one kernel, 5e-6 apart). So every
  # element within 2 lr = 6e-4, and all but 0.1% of all the elements within 3e-7 = lr x 1e-3 (a wrong reduction, a
  # shard missing or counted twice, moves the loss and gradient norm far beyond their rtol, checked too). The 0.1% is
  # of the whole tree (75584 elements), not of each tensor: in a small tensor one such element is more than
  # 0.1% (jax 0.11: 1 of the k projection bias's 64, whose updates put its gradients at 1e-7 and below, within a
  # factor of 10 of Adam's eps 1e-8).
  lr = 3e-4
  for i in range(2):
    np.testing.assert_array_equal(got[i]["rl_rewards_local"], rl["rl_rewards_local"][8 * i : 8 * (i + 1)])
    assert np.ptp(rl["rl_rewards_local"]) > 0  # the groups carry a GRPO signal: the step moves the weights
    apart = total = 0
    for k, w in rl.items():
      if k.startswith("rl_param_"):
        np.testing.assert_allclose(got[i][k], w, rtol=0, atol=2 * lr, err_msg=f"process {i}: {k}")
        apart, total = apart + int(np.sum(np.abs(got[i][k] - w) > lr * 1e-3)), total + w.size
      elif k != "rl_rewards_local":
        np.testing.assert_allclose(got[i][k], w, rtol=4e-6, err_msg=f"process {i}: {k}")
    assert apart <= 1e-3 * total, f"process {i}: {apart} of {total} parameters more than {lr * 1e-3} apart"
    for k in rl:
      got[i].pop(k)
  for i in range(2):
    assert set(got[i]) == set(want)
    assert int(got[i]["restored_step"]) == _mp_child.STEPS
    for k, w in want.items():
      if (
        k.startswith("restored_") and k != "restored_step"
      ):  # the checkpoint both processes wrote holds what they trained, bit for bit
        np.testing.assert_array_equal(got[i][k], got[i]["param_" + k.split("_")[1]], err_msg=k)
      elif k.startswith("param_"):
        np.testing.assert_allclose(got[i][k], w, rtol=0, atol=1e-6, err_msg=f"process {i}: {k}")
      elif k != "restored_step":
        np.testing.assert_allclose(got[i][k], w, rtol=4e-6, err_msg=f"process {i}: {k}")
    for k in got[i]:  # the two processes hold the same replicated results
      np.testing.assert_array_equal(got[0][k], got[1][k], err_msg=k)
