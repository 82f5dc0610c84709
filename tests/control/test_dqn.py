"""DQN under the numerics contract: ring buffer, ε schedule, target network keeps the INT4 view."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lrl_jax import control as C
from lrl_jax import quant
from tests.control._ref import mlp_np

SPEC = quant.Int4(group_size=16)


def test_ring_buffer_matches_numpy_model():
  buf = C.buffer_init(10, (2, 3))
  ref = np.zeros((10, 2, 3), np.float32)  # the buffer stores float32
  ptr = 0
  for i in range(4):  # 16 transitions into 10 rows: wraps
    obs = (np.full((4, 2, 3), float(i)) + np.arange(4)[:, None, None] / 10).astype(np.float32)
    buf = jax.jit(C.buffer_add)(buf, obs, np.arange(4) + i, np.ones(4) * i, obs + 100, np.ones(4) * (i % 2))
    for j in range(4):
      ref[(ptr + j) % 10] = obs[j]
    ptr = (ptr + 4) % 10
  np.testing.assert_array_equal(buf.obs, ref)
  np.testing.assert_array_equal(buf.next_obs, ref + 100)
  assert int(buf.ptr) == 6 and int(buf.size) == 10
  with pytest.raises(ValueError, match="exceeds capacity"):
    C.buffer_add(C.buffer_init(2, (1,)), np.zeros((3, 1)), np.zeros(3), np.zeros(3), np.zeros((3, 1)), np.zeros(3))


def test_buffer_sample_only_valid_rows():
  buf = C.buffer_init(100, (1,))
  buf = C.buffer_add(buf, np.arange(7.0)[:, None] + 1, np.arange(7), np.zeros(7), np.zeros((7, 1)), np.zeros(7))
  obs, action, *_ = C.buffer_sample(buf, jax.random.key(0), 512)
  assert set(np.asarray(action).tolist()) == set(range(7))
  np.testing.assert_array_equal(np.asarray(obs)[:, 0], np.asarray(action) + 1)


def test_epsilon_linear_decay():
  cfg = C.DQNConfig(total_steps=10_000, eps_start=1.0, eps_end=0.1, eps_fraction=0.5, learning_starts=100)
  np.testing.assert_allclose([C.epsilon_at(cfg, s) for s in (0, 2500, 5000, 9000)], [1.0, 0.55, 0.1, 0.1], rtol=1e-6)


def _batch(cfg, n=32, seed=0):
  es = C.env_spec(cfg.env_name)
  rng = np.random.default_rng(seed)
  obs = rng.normal(size=(n, *es.obs_shape)).astype(np.float32)
  nxt = rng.normal(size=(n, *es.obs_shape)).astype(np.float32)
  return (
    obs,
    rng.integers(0, es.num_actions, n).astype(np.int32),
    rng.normal(size=n).astype(np.float32),
    nxt,
    (rng.random(n) < 0.3).astype(np.float32),
  )


def test_dqn_loss_uses_int4_view_of_both_networks():
  """The learner's TD loss equals a NumPy float64 loss whose online AND target kernels are INT4 fake-quantized,
  computed from raw replayed observations padded by the deployment preprocessing."""
  cfg = C.DQNConfig(env_name="Acrobot-v1", group_size=16, total_steps=10_000, learning_starts=100)
  p = C.dqn_init(jax.random.key(0), cfg)
  t = C.dqn_init(jax.random.key(1), cfg)
  obs, a, r, nxt, d = b = _batch(cfg)
  pad = lambda o: np.pad(o.astype(np.float64), [(0, 0), (0, 16 - 6)])
  q = mlp_np(p["q"], pad(obs), group_size=16, activation="relu")[np.arange(len(a)), a]
  y = r + cfg.gamma * (1 - d) * mlp_np(t["q"], pad(nxt), group_size=16, activation="relu").max(1)
  ref = 0.5 * np.mean((q - y) ** 2)
  got = jax.jit(lambda p, t, b: C.dqn_loss(p, t, b, cfg=cfg))(p, t, b)
  np.testing.assert_allclose(got, ref, rtol=1e-5)
  float_loss = C.dqn_loss(p, t, b, cfg=dataclasses.replace(cfg, group_size=None))
  assert abs(float(float_loss) - ref) > 1e-4 * ref  # the float loss is a different number


def test_polyak_target_update_numpy():
  o = {"w": jnp.arange(6.0).reshape(2, 3)}
  t = {"w": jnp.ones((2, 3))}
  got = C.target_update(o, t, tau=0.25, do_update=jnp.asarray(True))
  np.testing.assert_allclose(got["w"], 0.25 * np.arange(6.0).reshape(2, 3) + 0.75, rtol=1e-6)
  same = C.target_update(o, t, tau=0.25, do_update=jnp.asarray(False))
  np.testing.assert_array_equal(same["w"], t["w"])


@pytest.mark.slow
def test_target_sync_keeps_quantized_view():
  """Short QAT run that ends on a hard target sync: target == online masters, and the target's fake-INT4
  forward equals the real-INT4 export of the online network and a NumPy float64 INT4 reference."""
  base = C.DQNConfig(
    env_name="CartPole-v1",
    group_size=16,
    num_envs=4,
    learning_starts=400,
    batch_size=32,
    target_period=25,
    buffer_size=2000,
    total_steps=10_000,
  )
  # end exactly on a sync: num_updates a multiple of target_period
  total = base.warmup_iters * base.num_envs + 4 * base.target_period * base.num_envs
  cfg = dataclasses.replace(base, total_steps=total)
  assert cfg.num_updates % cfg.target_period == 0
  res = C.train_dqn(cfg, [3])
  online = jax.tree.map(lambda a: a[0], res.params["q"])
  target = jax.tree.map(lambda a: a[0], res.params["q_target"])
  jax.tree.map(np.testing.assert_array_equal, online, target)
  init = C.dqn_init(jax.random.split(jax.random.key(3), 4)[0], cfg)["q"]
  assert np.abs(np.asarray(online["dense_0"]["kernel"]) - np.asarray(init["dense_0"]["kernel"])).max() > 0
  x = C.preprocess(np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32), obs_shape=(4,), in_dim=16)
  # the forwards under jit: one program each instead of an op-by-op compile per layer and op
  mlp_apply = jax.jit(C.mlp_apply, static_argnames=("spec", "activation"))
  served_apply = jax.jit(C.served_apply, static_argnames=("activation",))
  y_target_qat = mlp_apply(target, x, spec=SPEC, activation="relu")
  y_online_int4 = served_apply(C.deploy(online, SPEC), x, activation="relu")
  np.testing.assert_array_equal(y_target_qat, y_online_int4)  # the same ŵ and ops: bit for bit
  np.testing.assert_allclose(y_target_qat, mlp_np(target, x, group_size=16, activation="relu"), rtol=1e-5, atol=1e-5)
  # a Polyak step moves the float master; its INT4 view is the fake quant of the moved master
  moved = C.target_update(online, init, tau=0.1, do_update=jnp.asarray(True))
  ref = jax.tree.map(lambda o, t: 0.1 * np.asarray(o, np.float64) + 0.9 * np.asarray(t, np.float64), online, init)
  np.testing.assert_allclose(
    mlp_apply(moved, x, spec=SPEC, activation="relu"),
    mlp_np(jax.tree.map(lambda a: a.astype(np.float32), ref), x, group_size=16, activation="relu"),
    rtol=1e-4,
    atol=1e-4,
  )
