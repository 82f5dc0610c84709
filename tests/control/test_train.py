"""Short CartPole PPO runs (fp32 and INT4 QAT) reach a return threshold; the INT4 export acts like the QAT policy."""

import jax
import numpy as np
import pytest

from lrl_jax import control as C
from lrl_jax import quant

SEEDS = [0, 1]
STEPS = 61_440  # 60 updates of 16 envs x 64 steps
THRESHOLD = 150.0  # greedy CartPole-v1 return (random policy: ~22, untrained greedy: ~10, maximum 500);
# seeds 0-5 measured at this budget: fp32 236-500, QAT 318-500 (16 episodes each)
SPEC = quant.Int4(group_size=16)


@pytest.fixture(scope="module")
def qat_run():
  return C.train_ppo(C.PPOConfig(env_name="CartPole-v1", total_steps=STEPS, group_size=16), SEEDS)


def _greedy(policy, kind):
  return C.evaluate(
    policy, env_name="CartPole-v1", apply=C.policy_apply(kind=kind, spec=SPEC), num_episodes=16, seed=7, stacked=True
  ).mean(axis=1)


@pytest.mark.slow  # the QAT run below trains the same agent (and reaches the threshold) in the default suite
def test_cartpole_fp32_reaches_threshold():
  res = C.train_ppo(C.PPOConfig(env_name="CartPole-v1", total_steps=STEPS), SEEDS)
  ret = _greedy(C.policy_params(res.params), "float")
  assert np.all(ret >= THRESHOLD), ret
  curve = np.asarray(res.curve())
  assert np.nanmean(curve[:, -5:]) > 2 * np.nanmean(curve[:, :5])  # it learned during training


def test_cartpole_qat_reaches_threshold_and_int4_deploys_the_same(qat_run):
  actor = C.policy_params(qat_run.params)
  ret_qat = _greedy(actor, "qat")
  assert np.all(ret_qat >= THRESHOLD), ret_qat
  ret_int4 = _greedy(jax.vmap(lambda p: C.deploy(p, SPEC))(actor), "int4")
  np.testing.assert_array_equal(ret_int4, ret_qat)


def test_exported_int4_actions_equal_qat_greedy_actions(qat_run):
  actor = jax.tree.map(lambda a: a[0], C.policy_params(qat_run.params))
  served = C.deploy(actor, SPEC)
  for leaf in jax.tree.leaves(served, is_leaf=lambda t: isinstance(t, quant.QArray)):
    assert isinstance(leaf, quant.QArray) or leaf.ndim == 1  # kernels are INT4, only biases are float
  # states spanning CartPole's observation ranges (x, ẋ, θ, θ̇), padded like deployment
  rng = np.random.default_rng(0)
  obs = rng.uniform([-2.4, -3, -0.21, -3.5], [2.4, 3, 0.21, 3.5], size=(4096, 4)).astype(np.float32)
  x = C.preprocess(obs, obs_shape=(4,), in_dim=16)
  a_int4 = jax.jit(lambda s, x: C.greedy_actions(C.policy_apply(kind="int4"), s, x))(served, x)
  a_qat = jax.jit(lambda p, x: C.greedy_actions(C.policy_apply(kind="qat", spec=SPEC), p, x))(actor, x)
  np.testing.assert_array_equal(a_int4, a_qat)
  a_float = C.greedy_actions(C.policy_apply(kind="float"), actor, x)
  assert 0.5 < np.mean(np.asarray(a_float) == np.asarray(a_qat))  # sanity: same policy family, not identical by fiat
