"""MLP forward (float, fake-INT4), deployment to real INT4, and the observation preprocessing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lrl_jax import control as C
from lrl_jax import quant
from tests.control._ref import int4_fake_quant_np, mlp_np

SPEC = quant.Int4(group_size=16)


def _params(seed=0, sizes=(16, 64, 64, 3), in_features=6):
  p = C.mlp_init(jax.random.key(seed), sizes, in_features=in_features, head_scale=0.5)
  # non-zero biases so that the bias path is checked too
  return jax.tree.map(lambda a: a + 0.01 * jnp.arange(a.size, dtype=a.dtype).reshape(a.shape) / a.size, p)


def _states(n=257, d=6, width=16, seed=1):
  x = np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32) * 2.0
  return C.preprocess(x, obs_shape=(d,), in_dim=width)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_float_and_qat_forward_match_numpy(activation):
  p, x = _params(), _states()
  y = jax.jit(lambda p, x: C.mlp_apply(p, x, activation=activation))(p, x)
  np.testing.assert_allclose(y, mlp_np(p, x, activation=activation), rtol=1e-5, atol=1e-5)
  yq = jax.jit(lambda p, x: C.mlp_apply(p, x, spec=SPEC, activation=activation))(p, x)
  np.testing.assert_allclose(yq, mlp_np(p, x, group_size=16, activation=activation), rtol=1e-5, atol=1e-5)
  assert np.abs(np.asarray(yq) - np.asarray(y)).max() > 1e-4  # the quantization does change the output


def test_deploy_layout_and_numpy_int4_rule():
  p = _params()
  served = C.deploy(p, SPEC)
  for name, layer in served.items():
    q = layer["kernel"]
    k, n = p[name]["kernel"].shape
    assert isinstance(q, quant.QArray) and q.codes.dtype == jnp.uint8 and q.codes.shape == (k // 2, n)
    assert q.scale.dtype == jnp.bfloat16 and q.scale.shape == (k // 16, n)
    assert layer["bias"].dtype == jnp.float32
    np.testing.assert_array_equal(
      np.asarray(quant.dequantize(q), np.float64), int4_fake_quant_np(p[name]["kernel"], 16)
    )
    assert q.nbytes == k * n // 2 + 2 * (k // 16) * n
  assert C.param_bytes(served) < C.param_bytes(p) / 5


@pytest.mark.parametrize("batch", [1, 64])
def test_served_forward_equals_qat_forward(batch):
  p, x = _params(), _states(batch)
  served = C.deploy(p, SPEC)
  y_int4 = jax.jit(lambda s, x: C.served_apply(s, x))(served, x)
  y_qat = jax.jit(lambda p, x: C.mlp_apply(p, x, spec=SPEC))(p, x)
  # Bit for bit: dequantize(served) is the QAT forward's ŵ (test_deploy_layout_and_numpy_int4_rule), and the
  # same dot, bias and activation follow.
  np.testing.assert_array_equal(y_int4, y_qat)
  np.testing.assert_array_equal(np.argmax(y_int4, -1), np.argmax(y_qat, -1))


def test_padded_rows_zero_init_and_zero_grad():
  p = C.mlp_init(jax.random.key(0), (16, 64, 2), in_features=4)
  assert not np.any(np.asarray(p["dense_0"]["kernel"])[4:])
  x = C.preprocess(np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32), obs_shape=(4,), in_dim=16)
  for spec in (None, SPEC):
    g = jax.grad(lambda p: jnp.sum(C.mlp_apply(p, x, spec=spec) ** 2))(p)
    assert not np.any(np.asarray(g["dense_0"]["kernel"])[4:])
    assert np.any(np.asarray(g["dense_0"]["kernel"])[:4])


def test_preprocess_flattens_casts_pads():
  obs = np.arange(2 * 10 * 5, dtype=np.float64).reshape(2, 10, 5)
  x = C.preprocess(obs, obs_shape=(10, 5), in_dim=64)
  assert x.shape == (2, 64) and x.dtype == jnp.float32
  np.testing.assert_array_equal(x[:, :50], obs.reshape(2, 50))
  assert not np.any(np.asarray(x[:, 50:]))
  with pytest.raises(ValueError, match=r"does not end in \(4,\)"):
    C.preprocess(np.zeros((3, 5)), obs_shape=(4,), in_dim=16)


def test_bad_inputs_raise_clear_errors():
  with pytest.raises(ValueError, match="unknown gymnax environment 'CartPol-v1'"):
    C.PPOConfig(env_name="CartPol-v1")
  with pytest.raises(ValueError, match="continuous action space"):
    C.make_env("Pendulum-v1")
  with pytest.raises(ValueError, match="group_size 32 does not divide the padded observation width"):
    C.PPOConfig(env_name="CartPole-v1", group_size=32)  # 4 features padded to 16
  with pytest.raises(ValueError, match="group_size 64 does not divide the hidden width 48"):
    C.DQNConfig(env_name="Catch-bsuite", group_size=64, pad_multiple=64, hidden=(48,))
  with pytest.raises(ValueError, match="group_size must be one of"):
    C.DQNConfig(group_size=8)
  p = C.mlp_init(jax.random.key(0), (16, 24, 2))
  with pytest.raises(ValueError, match=r"does not divide K = 24 of dense_1/kernel \(24, 2\)"):
    C.deploy(p, SPEC)
  with pytest.raises(ValueError, match="dense_0/kernel is ArrayImpl, not a QArray"):
    C.served_apply(_params(), _states(2))
