"""token_logprobs / logprobs_from_logits against a float64 NumPy log-softmax; QAT forward == fake-quant params."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _learner_util import B, T, V, np_token_logprobs, tiny_cfg

from lrl_jax import learner as L
from lrl_jax import models, quant
from tests._fp_bound import rounding_bound


def test_logprobs_from_logits_shift_and_gaps():
  """Token t is scored by the logits at its previous *valid* position (padding gaps skipped); 0 elsewhere."""
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 7, 11)).astype(np.float32) * 3
  tokens = rng.integers(0, 11, (3, 7)).astype(np.int32)
  valid = np.array(
    [
      [1, 1, 1, 1, 1, 1, 1],
      [0, 0, 1, 1, 1, 1, 0],  # left + right padding
      [1, 1, 0, 0, 1, 1, 1],
    ],
    bool,
  )  # a gap (prompt padded on the right)
  got = L.logprobs_from_logits(jnp.asarray(logits), jnp.asarray(tokens), jnp.asarray(valid))
  want = np_token_logprobs(logits, tokens, valid)
  np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=2e-6)  # f32 log-softmax vs f64
  assert got[2, 4] == pytest.approx(want[2, 4]) and want[2, 4] != 0  # scored from position 1
  lp, ent = L.logprobs_from_logits(jnp.asarray(logits), jnp.asarray(tokens), jnp.asarray(valid), with_entropy=True)
  ls = np.log(np.exp(logits.astype(np.float64)).sum(-1, keepdims=True))
  p = np.exp(logits - ls)
  h = -(p * (logits - ls)).sum(-1)  # entropy of each position's distribution
  np.testing.assert_allclose(float(ent[2, 4]), h[2, 1], atol=1e-5)
  np.testing.assert_allclose(float(ent[0, 3]), h[0, 2], atol=1e-5)
  assert float(ent[1, 2]) == 0.0 and float(ent[1, 6]) == 0.0


def test_logprobs_from_logits_rejects_bad_shape():
  with pytest.raises(ValueError, match="tokens"):
    L.logprobs_from_logits(jnp.zeros((2, 3, 5)), jnp.zeros((2, 4), jnp.int32))


def _batch(seed=1):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, V, (B, T)).astype(np.int32)
  valid = np.arange(T)[None, :] < rng.integers(T - 4, T + 1, B)[:, None]
  z = jnp.zeros((B, T), jnp.float32)
  return L.Rollout(
    tokens=jnp.asarray(tokens),
    loss_mask=jnp.asarray(valid),
    sampler_logp=z,
    advantages=jnp.zeros((B,), jnp.float32),
    valid=jnp.asarray(valid),
  )


def test_token_logprobs_matches_numpy_of_forward():
  mc = tiny_cfg()
  params = models.init_params(mc, jax.random.PRNGKey(0), std=0.5)  # wide logits: a non-trivial softmax
  batch = _batch()
  logits, _ = jax.jit(models.forward, static_argnames="cfg")(params, batch.tokens, mc, valid_BT=batch.valid)
  want = np_token_logprobs(np.asarray(logits), np.asarray(batch.tokens), np.asarray(batch.valid))
  got = L.token_logprobs(params, batch, mc, cfg=L.LearnerConfig(compute_dtype="float32"))
  assert got.dtype == jnp.float32 and got.shape == (B, T)
  # Two evaluations of one function (token_logprobs' own forward; the f64 log-softmax of the jitted forward's f32
  # logits), each within its first-order rounding bound of the exact log-probs (tests/_fp_bound.py).
  bound = rounding_bound(
    lambda p, t, v: L.token_logprobs(
      p, batch.replace(tokens=t, valid=v), mc, cfg=L.LearnerConfig(compute_dtype="float32")
    ),
    params,
    np.asarray(batch.tokens),
    np.asarray(batch.valid),
  )
  bound.assert_stable()
  np.testing.assert_array_less(np.abs(np.asarray(got, np.float64) - want), 2 * bound.err + 1e-30)


@pytest.mark.parametrize(
  "spec, dtype",
  [
    pytest.param(quant.Int4(group_size=32), "float32", marks=pytest.mark.slow),
    pytest.param(quant.Int4(group_size=32), "bfloat16", marks=pytest.mark.slow),  # step test covers it
    (quant.NVFP4(), "bfloat16"),
  ],
  ids=["int4-f32", "int4-bf16", "nvfp4-bf16"],
)
def test_qat_logprobs_equal_fake_quant_params(spec, dtype):
  """π under QAT == π of the served QArray tree of the array the matmul sees (the compute-dtype cast of the fp32
  masters: the sampler must quantize that cast) == π of a plain forward on fake_quant_params of it (NVFP4: up to
  rounding ŵ to bf16, which its served dot does not do)."""
  mc = tiny_cfg()
  params = models.init_params(mc, jax.random.PRNGKey(1), std=0.3)
  batch = _batch(2)
  cfg = L.LearnerConfig(compute_dtype=dtype, qat=spec)
  got = L.token_logprobs(params, batch, mc, cfg=cfg)
  cast = jax.tree_util.tree_map(lambda x: x.astype(dtype), params)
  # The sampler's view: real codes of the same cast, matmuls through lrl_jax.kernels.qmatmul.
  served = quant.quantize_params(cast, quant.QuantRules.default(spec))
  mu = L.token_logprobs(served, batch, mc, cfg=L.LearnerConfig(compute_dtype=dtype))
  np.testing.assert_array_equal(np.asarray(got), np.asarray(mu))  # bit for bit
  fq = quant.fake_quant_params(cast, quant.QuantRules.default(spec))
  want = L.token_logprobs(fq, batch, mc, cfg=L.LearnerConfig(compute_dtype=dtype))
  if isinstance(spec, quant.NVFP4):
    # NVFP4's dot applies dec after the K sum (`quant.qdot`); a float tree can only hold round_bf16(ŵ): the two
    # differ by that rounding (2^-9 of each weight), far below what QAT changes (asserted below).
    assert float(jnp.max(jnp.abs(got - want))) < 0.05 * float(
      jnp.max(jnp.abs(L.token_logprobs(params, batch, mc, cfg=L.LearnerConfig(compute_dtype=dtype)) - got))
    )
  else:
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))  # bit for bit
  plain = L.token_logprobs(params, batch, mc, cfg=L.LearnerConfig(compute_dtype=dtype))
  assert float(jnp.max(jnp.abs(plain - got))) > 1e-4  # QAT really changed the numerics
