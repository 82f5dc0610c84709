"""Predecoded serving (`kernels.predecode_params`, generate(predecode=True)): the served weights decoded once per
call instead of at every decode step give the same tokens and the same μ, bit for bit, as the per-step path.

Why bit for bit: on the CPU the per-step path is `quant.qdot` on ŵ = dequantize(q, x.dtype) behind an optimization
barrier (`kernels.xla_matmul` materializes ŵ when M > 1), then one dot_general; the predecoded path is the same
dot_general on the same ŵ, computed once. NVFP4's per-matrix scale multiplies the f32 sum in both.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lrl_jax import kernels, models, quant, sampler
from lrl_jax.models import ModelConfig
from lrl_jax.sampler import SamplingConfig

CFG = ModelConfig(
  arch="qwen2", vocab_size=97, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2
)
SAMPLED = SamplingConfig(max_new_tokens=6, temperature=1.0, eos_id=3, pad_id=0)


@pytest.fixture(scope="module")
def params():
  return models.init_params(CFG, jax.random.key(0), std=0.3)


def _prompts():
  rng = np.random.default_rng(0)
  toks = rng.integers(4, CFG.vocab_size, (3, 7)).astype(np.int32)
  valid = np.ones((3, 7), bool)
  valid[1, :3] = False  # left padding
  return toks, valid


CASES = [
  pytest.param(quant.Int4(group_size=32), "kn", "bfloat16", None, id="int4-kn-bf16"),
  pytest.param(quant.NVFP4(), "kn", "bfloat16", None, id="nvfp4-kn-bf16"),
  pytest.param(quant.FP8(), "kn", "float32", quant.FP8(granularity="token"), id="fp8-w8a8-f32", marks=pytest.mark.slow),
  pytest.param(quant.Int4(group_size=32), "linear", "bfloat16", None, id="int4-linear-bf16", marks=pytest.mark.slow),
  pytest.param(quant.MXFP8(), "kn", "bfloat16", None, id="mxfp8-kn-bf16", marks=pytest.mark.slow),
  pytest.param(quant.NVFP4(), "linear", "float32", None, id="nvfp4-linear-f32", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("spec, layout, dtype, act", CASES)
def test_predecoded_generation_is_the_per_step_generation_bit_for_bit(params, spec, layout, dtype, act):
  served = sampler.serve_params(params, spec, dtype=jnp.dtype(dtype), layout=layout)
  cfg = CFG.replace(dtype=dtype)
  toks, valid = _prompts()
  run = lambda pre: sampler.generate(  # noqa: E731
    served,
    toks,
    valid,
    cfg,
    SAMPLED,
    jax.random.key(3),
    group_size=2,
    cache_dtype=jnp.float32,
    act_spec=act,
    predecode=pre,
  )
  got, want = run(True), run(False)
  np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
  np.testing.assert_array_equal(np.asarray(got.loss_mask), np.asarray(want.loss_mask))
  np.testing.assert_array_equal(np.asarray(got.sampler_logp), np.asarray(want.sampler_logp))
  assert np.asarray(got.loss_mask).sum() > 6  # more than one decode step ran


def test_predecode_is_the_qdot_operand():
  """predecode(q) holds dequantize(q, dtype) (NVFP4: without its per-matrix scale, kept as `dec`), and
  predecoded_dot equals quant.qdot on a [K, N] and on an nn.Linear [N, K] weight, bit for bit."""
  rng = np.random.default_rng(1)
  w = jnp.asarray(rng.normal(size=(64, 32)), jnp.float32)
  x = jnp.asarray(rng.normal(size=(5, 64)), jnp.bfloat16)
  for spec in (quant.Int4(group_size=32), quant.NVFP4(), quant.FP8()):
    q = quant.quantize(w.astype(jnp.bfloat16), spec, axis=-2)
    p = kernels.predecode(q, jnp.bfloat16)
    nv = isinstance(spec, quant.NVFP4)
    np.testing.assert_array_equal(np.asarray(p.w), np.asarray(quant.dequantize(q, jnp.bfloat16, global_scale=not nv)))
    assert (p.dec is not None) == nv and p.axis == -2
    got = jax.jit(kernels.predecoded_dot)(x, p)
    want = jax.jit(lambda x, q: quant.qdot(x, q, materialize=True))(x, q)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    lin = kernels.linear_layout(q)
    pl_ = kernels.predecode(lin, jnp.bfloat16)
    got = jax.jit(kernels.predecoded_dot)(x, pl_)
    want = jax.jit(lambda x, q: quant.qdot(x, q, (((1,), (1,)), ((), ())), materialize=True))(x, lin)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  with pytest.raises(ValueError, match="do not contract"):
    kernels.predecoded_dot(x[:, :32], p)
