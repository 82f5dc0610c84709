"""Bad input fails at trace time with a message naming spec, shape and axis; rules; the finite check."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

from lrl_jax import quant


@pytest.mark.parametrize(
  "spec,shape,axis,match",
  [
    (quant.Int4(group_size=128), (96, 8), 0, r"Int4.*128.*axis 0.*\(96, 8\)"),
    (quant.NVFP4(), (8, 24), -1, r"NVFP4.*16.*axis -1.*\(8, 24\)"),
    (quant.MXFP8(), (8, 48), -1, r"MXFP8.*32.*axis -1.*\(8, 48\)"),
    (quant.FP8(granularity="block", block=128), (256,), -1, r"FP8.*rank >= 2.*\(256,\)"),
    (quant.FP8(granularity="block", block=128), (256, 100), 0, r"FP8.*dimension 1.*\(256, 100\)"),
    (quant.NVFP4(), (32, 4, 16), 0, r"NVFP4.*last two axes.*axis 0"),
    (quant.Int4(), (), -1, r"scalar"),
    (quant.Int4(group_size=32), (32, 4), 2, r"axis 2 out of range"),
  ],
)
def test_shape_errors_name_spec_shape_axis(spec, shape, axis, match):
  with pytest.raises(ValueError, match=match):
    jax.jit(lambda x: quant.quantize(x, spec, axis=axis)).lower(jnp.zeros(shape))  # trace time
  with pytest.raises(ValueError, match=match):
    quant.fake_quant(jnp.zeros(shape), spec, axis=axis)


def test_dtype_errors():
  with pytest.raises(ValueError, match=r"int32.*shape \(32, 2\)"):
    quant.quantize(jnp.zeros((32, 2), jnp.int32), quant.Int4(group_size=32), axis=0)
  with pytest.raises(ValueError, match="float8_e4m3fn"):
    quant.quantize(jnp.zeros((32, 2), jnp.float8_e4m3fn), quant.FP8(), axis=0)
  with pytest.raises(TypeError, match="not a quantization spec"):
    quant.quantize(jnp.zeros((32, 2)), "int4")


def test_spec_validation():
  with pytest.raises(ValueError, match="group_size"):
    quant.Int4(group_size=48)
  with pytest.raises(ValueError, match="granularity"):
    quant.FP8(granularity="tensor")
  with pytest.raises(TypeError):
    quant.Int4(128)  # keyword-only


def _params():
  z = lambda *s: jnp.zeros(s)
  return {
    "embed": {"embedding": z(16, 32)},
    "layers": {
      "input_norm": {"scale": z(2, 32)},
      "attn": {
        "q_proj": {"kernel": z(2, 32, 32), "bias": z(2, 32)},
        "o_proj": {"kernel": z(2, 32, 32)},
        "q_norm": {"scale": z(2, 8)},
      },
      "mlp": {
        "gate_proj": {"kernel": z(2, 32, 64)},
        "down_proj": {"kernel": z(2, 64, 32)},
        "router": {"kernel": z(2, 32, 4)},
      },
    },
    "final_norm": {"scale": z(32)},
    "lm_head": {"kernel": z(32, 16)},
  }


def test_default_rules_select_projections_only():
  rules = quant.QuantRules.default(quant.Int4(group_size=32))
  assert sorted(rules.selected(_params())) == [
    "layers/attn/o_proj/kernel",
    "layers/attn/q_proj/kernel",
    "layers/mlp/down_proj/kernel",
    "layers/mlp/gate_proj/kernel",
  ]


def test_quantize_params_matches_per_leaf_quantize():
  params = jax.tree.map(lambda x: jax.random.normal(jax.random.key(x.size), x.shape), _params())
  spec = quant.Int4(group_size=32)
  served = jax.jit(lambda p: quant.quantize_params(p, quant.QuantRules.default(spec)))(params)
  q = served["layers"]["mlp"]["down_proj"]["kernel"]
  assert isinstance(q, quant.QArray) and q.shape == (2, 64, 32) and q.axis == -2
  np.testing.assert_array_equal(
    q.codes, quant.quantize(params["layers"]["mlp"]["down_proj"]["kernel"], spec, axis=-2).codes
  )
  np.testing.assert_array_equal(served["lm_head"]["kernel"], params["lm_head"]["kernel"])
  fq = jax.jit(lambda p: quant.fake_quant_params(p, quant.QuantRules.default(spec)))(params)
  deq = jax.jit(quant.dequantize_params)(served)
  for a, b in zip(jax.tree.leaves(fq), jax.tree.leaves(deq)):
    np.testing.assert_array_equal(a, b)


def test_first_matching_rule_wins():
  rules = quant.QuantRules(rules=((r"q_proj", None), (r"_proj/kernel$", quant.FP8())))
  assert rules.spec_for("layers/attn/q_proj/kernel") is None
  assert rules.spec_for("layers/attn/k_proj/kernel") == quant.FP8()
  assert rules.spec_for("embed/embedding") is None


def test_check_finite_names_the_leaf():
  def step(tree):
    quant.check_finite(tree, "grads")
    return jax.tree.map(lambda x: x * 2, tree)

  good = {"a": jnp.ones(3), "b": {"c": jnp.ones(2, jnp.bfloat16)}, "n": jnp.arange(3)}
  out = quant.checked(step)(good)
  np.testing.assert_array_equal(out["a"], 2 * np.ones(3))
  bad = {"a": jnp.ones(3), "b": {"c": jnp.array([1.0, jnp.nan], jnp.bfloat16)}, "n": jnp.arange(3)}
  with pytest.raises(checkify.JaxRuntimeError, match="grads/b/c"):
    quant.checked(step)(bad)
