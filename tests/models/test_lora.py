"""LoRA adapters: zero-init is the identity, the adapted forward equals merged weights, and gradients
reach A and B through a frozen float, fake-quantized or NVFP4 QArray base."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lrl_jax import models, quant
from lrl_jax.models import LoraConfig, ModelConfig
from tests._fp_bound import rounding_bound

CFG = ModelConfig(
  arch="qwen2", vocab_size=64, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2
)
LCFG = LoraConfig(rank=4, alpha=8.0)
TOKENS = np.random.default_rng(0).integers(0, CFG.vocab_size, (2, 6))
fwd = jax.jit(models.forward, static_argnames=("cfg", "remat"))


def _params():
  return models.init_params(CFG, jax.random.key(1), std=0.15)


def _with_random_b(lora, seed=2):
  keys = iter(jax.random.split(jax.random.key(seed), 64))
  return jax.tree_util.tree_map_with_path(
    lambda kp, x: 0.1 * jax.random.normal(next(keys), x.shape) if kp[-1].key == "b" else x, lora
  )


def _loss(lora, base, rules=None):
  logits, _ = models.forward(base, TOKENS, CFG, lora=lora, numerics=models.Numerics(qat_rules=rules))
  logp = jax.nn.log_softmax(logits, -1)
  return -jnp.mean(jnp.take_along_axis(logp[:, :-1], TOKENS[:, 1:, None], -1))


def test_zero_init_is_identity_and_shapes():
  params = _params()
  lora = models.init_lora(CFG, LCFG, jax.random.key(3))
  assert lora.params["layers"]["attn"]["q_proj"]["a"].shape == (2, 64, 4)
  assert lora.params["layers"]["mlp"]["down_proj"]["b"].shape == (2, 4, 64)
  base, _ = fwd(params, TOKENS, CFG)
  adapted, _ = fwd(params, TOKENS, CFG, lora=lora)
  np.testing.assert_array_equal(adapted, base)  # B = 0 adds exact zeros


def test_adapted_forward_equals_merged_weights():
  params = _params()
  lora = _with_random_b(models.init_lora(CFG, LCFG, jax.random.key(4)))
  merged = jax.tree_util.tree_map(lambda x: x, params)
  for group, names in (
    ("attn", ("q_proj", "k_proj", "v_proj", "o_proj")),
    ("mlp", ("gate_proj", "up_proj", "down_proj")),
  ):
    for n in names:
      ab = lora.params["layers"][group][n]
      w = np.asarray(params["layers"][group][n]["kernel"], np.float64)
      delta = np.einsum("lkr,lrn->lkn", np.asarray(ab["a"], np.float64), np.asarray(ab["b"], np.float64))
      merged["layers"][group][n]["kernel"] = jnp.asarray(w + LCFG.alpha / LCFG.rank * delta, jnp.float32)
  got, _ = fwd(params, TOKENS, CFG, lora=lora)
  want, _ = fwd(merged, TOKENS, CFG)
  # W·x + s·(x·A)·B vs (W + s·A·B)·x: equal in exact arithmetic; each f32 run within its first-order rounding
  # bound of the exact logits (tests/_fp_bound.py), the merged weights counted as f32 roundings of W + s·A·B.
  bounds = [
    rounding_bound(lambda p: models.forward(p, TOKENS, CFG, lora=lora)[0], params),
    rounding_bound(lambda p: models.forward(p, TOKENS, CFG)[0], merged, rounded_args=(0,)),
  ]
  for b in bounds:
    b.assert_stable()
  np.testing.assert_array_less(np.abs(np.asarray(got) - np.asarray(want)), bounds[0].err + bounds[1].err)


def test_gradients_flow_to_adapters_over_nvfp4_qarray_base():
  params = _params()
  served = jax.jit(lambda p: quant.quantize_params(p, quant.QuantRules.default(quant.NVFP4())))(params)
  deq = jax.jit(quant.dequantize_params)(served)
  lora = _with_random_b(models.init_lora(CFG, LCFG, jax.random.key(5)))
  grad = jax.jit(jax.grad(_loss))
  g_q = grad(lora, served)
  g_f = grad(lora, deq)  # the same weights as a float base: the reference gradient
  assert isinstance(g_q, models.Lora)
  for a, b in zip(jax.tree_util.tree_leaves(g_q), jax.tree_util.tree_leaves(g_f)):
    assert np.abs(np.asarray(a)).max() > 0
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * np.abs(np.asarray(b)).max() + 1e-9)
  # Zero-init B: dL/dA = 0 (A only acts through B), dL/dB ≠ 0 — training starts on B.
  g0 = grad(models.init_lora(CFG, LCFG, jax.random.key(5)), served)
  q = g0.params["layers"]["attn"]["q_proj"]
  assert np.abs(np.asarray(q["a"])).max() == 0 and np.abs(np.asarray(q["b"])).max() > 0


def test_lora_over_fake_quantized_base():
  params = _params()
  rules = quant.QuantRules.default(quant.Int4(group_size=32))
  lora = _with_random_b(
    models.init_lora(CFG, LoraConfig(rank=2, alpha=2.0, targets=r"attn/(q|v)_proj"), jax.random.key(6))
  )
  assert set(lora.params["layers"]["attn"]) == {"q_proj", "v_proj"}
  got, _ = fwd(params, TOKENS, CFG, lora=lora, numerics=models.Numerics(qat_rules=rules))
  fq = jax.jit(lambda p: quant.fake_quant_params(p, rules))(params)
  want, _ = fwd(fq, TOKENS, CFG, lora=lora)
  np.testing.assert_array_equal(got, want)


def test_logical_axes_and_bad_targets():
  lora = models.init_lora(CFG, LCFG, jax.random.key(7))
  ax = models.lora_logical_axes(lora).params["layers"]
  assert ax["attn"]["q_proj"]["a"] == ("layers", "embed", None)
  assert ax["mlp"]["down_proj"]["b"] == ("layers", None, "embed")
  with pytest.raises(ValueError, match="lm_head"):
    models.init_lora(CFG.replace(tie_word_embeddings=False), LoraConfig(targets="lm_head"), jax.random.key(0))
  with pytest.raises(ValueError, match="selects no kernel"):
    models.init_lora(CFG, LoraConfig(targets="nothing_here"), jax.random.key(0))
  with pytest.raises(ValueError, match="rank"):
    LoraConfig(rank=0)
