"""INT4 update clipping (quant.optim) and INT4-aware init / policy jolt (quant.init), against NumPy references.

References are written here from the formulas (DESIGN.md, the module docstrings): the INT4 absmax scale
s = bf16(max(amax/7, 1e-5)) in float32 IEEE arithmetic through ml_dtypes, the clip in float64, the KL by
log-sum-exp in float64.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

from lrl_jax import quant
from lrl_jax.quant.init import grid_residual, int4_aware_init, next_token_kl, policy_jolt
from lrl_jax.quant.optim import int4_group_steps, int4_update_clip

F32 = np.float32
G = 32


def _np_absmax_scale(w, g, axis=-2):
  """[.., K, N] -> s [.., K/g, N] float32: bf16(max(amax/7, 1e-5)), the division in float32."""
  w = np.moveaxis(np.asarray(w, F32), axis, -1)
  wg = w.reshape(*w.shape[:-1], w.shape[-1] // g, g)
  amax = np.abs(wg).max(-1)
  s = np.maximum(amax / F32(7), F32(1e-5)).astype(ml_dtypes.bfloat16).astype(F32)
  return np.moveaxis(s, -1, axis)


def _np_clip(u, s_groups, k, g, axis=-2):
  s = np.repeat(np.asarray(s_groups, np.float64), g, axis=axis % np.ndim(u))
  return np.clip(np.asarray(u, np.float64), -k * s, k * s)


def _tree(key, L=2, D=64, F=128, V=24, group_scales=True):
  """A decoder-shaped tree: stacked [L, K, N] projection kernels, an embedding, norms, a bias."""
  ks = jax.random.split(key, 8)
  q = jax.random.normal(ks[0], (L, D, D), jnp.float32) * 0.05
  if group_scales:  # groups of very different magnitude, one all-zero group, one below the 1e-5 floor
    mag = jnp.exp(jax.random.uniform(ks[1], (L, D // G, 1, D), minval=-4.0, maxval=1.0))
    q = (q.reshape(L, D // G, G, D) * mag).reshape(L, D, D)
    q = q.at[0, :G, 0].set(0.0).at[1, :G, 1].set(3e-6)
  return {
    "embed": {"embedding": jax.random.normal(ks[2], (V, D)) * 0.02},
    "layers": {
      "attn": {"q_proj": {"kernel": q, "bias": jnp.zeros((L, D))}},
      "mlp": {
        "up_proj": {"kernel": jax.random.normal(ks[3], (L, D, F)) * 0.02},
        "down_proj": {"kernel": jax.random.normal(ks[4], (L, F, D)) * 0.02},
      },
      "input_norm": {"scale": jnp.ones((L, D))},
    },
    "lm_head": {"kernel": jax.random.normal(ks[5], (D, V)) * 0.02},
  }


RULES = quant.QuantRules.default(quant.Int4(group_size=G))
SELECTED = ("layers/attn/q_proj/kernel", "layers/mlp/up_proj/kernel", "layers/mlp/down_proj/kernel")


def _flat(tree):
  return {quant.path_str(kp): np.asarray(x) for kp, x in jax.tree_util.tree_leaves_with_path(tree)}


# --------------------------------------------------------------------------- update clipping


@pytest.mark.parametrize("k", [1.0, 0.5, 2.0])
def test_update_clip_matches_numpy_reference(k):
  params = _tree(jax.random.PRNGKey(0))
  # Updates of the order of the grid steps, so that some are clipped and some are not.
  updates = jax.tree_util.tree_map(lambda x: 0.02 * jax.random.normal(jax.random.PRNGKey(1), x.shape), params)
  tx = int4_update_clip(RULES, k=k)
  out, _ = jax.jit(tx.update)(updates, tx.init(params), params)
  fp, fu, fo = _flat(params), _flat(updates), _flat(out)
  n_clipped = 0
  for path in fu:
    if path in SELECTED:
      ref = _np_clip(fu[path], _np_absmax_scale(fp[path], G), k, G)
      np.testing.assert_array_equal(fo[path], ref.astype(F32), err_msg=path)
      n_clipped += int(np.sum(fo[path] != fu[path]))
    else:  # embedding, lm_head, norms, biases: untouched, bit for bit
      np.testing.assert_array_equal(fo[path], fu[path], err_msg=path)
  assert n_clipped > 0  # the test exercises the clip


def test_update_clip_stacked_layers_use_their_own_scales():
  """[L, K, N]: layer l's groups are clipped with layer l's scales (layer 1 is 100x larger)."""
  w = jax.random.normal(jax.random.PRNGKey(2), (2, 64, 8)) * jnp.array([0.01, 1.0])[:, None, None]
  params = {"layers": {"attn": {"o_proj": {"kernel": w}}}}
  u = {"layers": {"attn": {"o_proj": {"kernel": jnp.full_like(w, 0.05)}}}}
  out, _ = int4_update_clip(RULES, k=1.0).update(u, optax.EmptyState(), params)
  o = np.asarray(out["layers"]["attn"]["o_proj"]["kernel"])
  s = _np_absmax_scale(np.asarray(w), G)
  np.testing.assert_array_equal(o, _np_clip(np.full(w.shape, 0.05, F32), s, 1.0, G).astype(F32))
  assert np.all(o[1] == F32(0.05)) and np.all(o[0] < 0.05)  # layer 1 steps (~0.4) exceed 0.05; layer 0's do not


def test_update_clip_with_learned_scale_sibling():
  """A `P/kernel_scale` sibling is the step, as the forward uses it (floored at 1e-5, rounded to bf16); the
  sibling's own update passes unchanged."""
  spec = quant.Int4(group_size=G, scheme="learned")
  rules = quant.QuantRules.default(spec)
  w = jax.random.normal(jax.random.PRNGKey(3), (64, 16)) * 0.1
  s = jnp.abs(jax.random.normal(jax.random.PRNGKey(4), (64 // G, 16))) * 0.01 + 1e-3
  s = s.at[0, 0].multiply(-1.0)  # a learned scale driven negative: the forward floors it at 1e-5
  params = {"mlp": {"gate_proj": {"kernel": w, "kernel_scale": s}}}
  u = {
    "mlp": {
      "gate_proj": {
        "kernel": jax.random.normal(jax.random.PRNGKey(5), w.shape) * 0.01,
        "kernel_scale": jnp.full_like(s, 7.0),
      }
    }
  }
  out, _ = int4_update_clip(rules, k=1.0).update(u, optax.EmptyState(), params)
  s_eff = np.maximum(np.asarray(s), F32(1e-5)).astype(ml_dtypes.bfloat16).astype(F32)
  ref = _np_clip(np.asarray(u["mlp"]["gate_proj"]["kernel"]), s_eff, 1.0, G).astype(F32)
  np.testing.assert_array_equal(np.asarray(out["mlp"]["gate_proj"]["kernel"]), ref)
  np.testing.assert_array_equal(np.asarray(out["mlp"]["gate_proj"]["kernel_scale"]), 7.0)
  assert np.all(np.abs(np.asarray(out["mlp"]["gate_proj"]["kernel"])[:G, 0]) <= 1.01e-5)


def test_update_clip_bounds_every_move_in_an_adam_chain():
  """Chained after AdamW under jit: |Δw| <= k·s of the pre-update params for every INT4 element."""
  params = _tree(jax.random.PRNGKey(6))
  grads = jax.tree_util.tree_map(lambda x: jax.random.normal(jax.random.PRNGKey(7), x.shape), params)
  tx = optax.chain(optax.adamw(0.5), int4_update_clip(RULES, k=1.0))  # a huge lr: everything would move far
  upd, _ = jax.jit(tx.update)(grads, tx.init(params), params)
  new = optax.apply_updates(params, upd)
  fp, fn = _flat(params), _flat(new)
  for path in SELECTED:
    s = np.repeat(_np_absmax_scale(fp[path], G).astype(np.float64), G, axis=-2)
    dw = np.abs(fn[path].astype(np.float64) - fp[path])
    ulp = np.spacing(np.maximum(np.abs(fp[path]), np.abs(fn[path])))  # w + u is rounded once in f32
    assert np.all(dw <= s + ulp), path
  assert np.abs(fn["embed/embedding"] - fp["embed/embedding"]).max() > 0.1  # not selected: moves freely


def test_update_clip_errors():
  params = _tree(jax.random.PRNGKey(0))
  tx = int4_update_clip(RULES, k=1.0)
  with pytest.raises(ValueError, match="needs the params"):
    tx.update(params, tx.init(params), None)
  with pytest.raises(ValueError, match="k must be a positive"):
    int4_update_clip(RULES, k=0.0)
  bad = {"mlp": {"up_proj": {"kernel": jnp.ones((64, 8)), "kernel_scale": jnp.ones((3, 8))}}}
  lrules = quant.QuantRules.default(quant.Int4(group_size=G, scheme="learned"))
  with pytest.raises(ValueError, match=r"mlp/up_proj/kernel.*\(2, 8\).*\(3, 8\)"):
    int4_update_clip(lrules).update(bad, optax.EmptyState(), bad)
  odd = {"mlp": {"up_proj": {"kernel": jnp.ones((48, 8))}}}
  with pytest.raises(ValueError, match="mlp/up_proj/kernel"):
    tx.update(odd, tx.init(odd), odd)


def test_group_steps_equal_quantize_scale():
  w = jax.random.normal(jax.random.PRNGKey(8), (3, 64, 8))
  s = int4_group_steps(w, quant.Int4(group_size=G), axis=-2)
  q = quant.quantize(w, quant.Int4(group_size=G), axis=-2)
  np.testing.assert_array_equal(np.asarray(s), np.repeat(np.asarray(q.scale, F32), G, axis=-2))


# --------------------------------------------------------------------------- INT4-aware init


def test_absmax_fake_quant_is_idempotent_claim():
  """The claim behind the absmax init: amax(ŵ) = 7·s exactly, 7·s is exact in f32, so re-quantizing ŵ gives
  the same scales and codes (also for all-zero groups and groups under the 1e-5 floor)."""
  spec = quant.Int4(group_size=G)
  w = _tree(jax.random.PRNGKey(9))["layers"]["attn"]["q_proj"]["kernel"]  # [2, 64, 64], mixed magnitudes
  q1 = quant.quantize(w, spec, axis=-2)
  w1 = quant.dequantize(q1)
  q2 = quant.quantize(w1, spec, axis=-2)
  np.testing.assert_array_equal(np.asarray(q2.codes), np.asarray(q1.codes))
  np.testing.assert_array_equal(np.asarray(q2.scale, F32), np.asarray(q1.scale, F32))
  np.testing.assert_array_equal(np.asarray(quant.fake_quant(w1, spec, axis=-2)), np.asarray(w1))
  s = np.asarray(q1.scale, F32)
  seven_s = 7.0 * s.astype(np.float64)
  assert np.array_equal(seven_s.astype(F32).astype(np.float64), seven_s)  # exact in f32
  amax1 = np.abs(np.asarray(w1, np.float64).reshape(2, 2, G, 64)).max(2)
  normal = _np_absmax_scale(np.asarray(w), G) > 1e-5 * 1.01
  np.testing.assert_array_equal(amax1[normal], seven_s[normal])
  assert normal.sum() > 200 and (~normal).sum() >= 2  # both regimes are exercised


SCHEMES = {
  "absmax": dict(),
  "minmax": dict(scheme="minmax"),
  "learned": dict(scheme="learned"),
  "learned_zp": dict(scheme="learned", learn_zero_point=True),
}


@pytest.mark.parametrize("dtype", [None, jnp.bfloat16])
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_int4_aware_init_reaches_a_fixed_point(scheme, dtype):
  """Every scheme: the selected kernels become exact fixed points of the learner's fake quant (with the learned
  s, z when present), moved by at most the bound of the module docstring; other leaves untouched."""
  spec = quant.Int4(group_size=G, **SCHEMES[scheme])
  rules = quant.QuantRules.default(spec)
  params = quant.init_learned(_tree(jax.random.PRNGKey(10)), rules)
  info = {}
  out = int4_aware_init(params, rules, dtype=dtype, info=info)
  assert set(info) == set(SELECTED)
  if dtype is None:  # f32: one pass (absmax, learned), or the minmax snap (0 further passes)
    assert all(n == (0 if scheme == "minmax" else 1) for n in info.values()), info
  fo, fp = _flat(out), _flat(params)
  for path in fp:
    if path not in SELECTED:  # embedding, norms, biases, lm_head, and the learned s / z themselves
      np.testing.assert_array_equal(fo[path], fp[path], err_msg=path)
      continue
    x = jnp.asarray(fo[path]).astype(dtype or jnp.float32)
    sc, zp = fp.get(path + "_scale"), fp.get(path + "_zero")
    q = quant.quantize(x, spec, axis=-2, scale=sc, zero_point=zp)
    np.testing.assert_array_equal(np.asarray(quant.dequantize(q, x.dtype)), np.asarray(x), err_msg=path)
    assert fo[path].dtype == np.float32
    if dtype is not None:  # the f32 master holds the bf16 fixed point exactly
      np.testing.assert_array_equal(fo[path].astype(ml_dtypes.bfloat16).astype(F32), fo[path])
    q0 = quant.quantize(jnp.asarray(fp[path]).astype(dtype or jnp.float32), spec, axis=-2, scale=sc, zero_point=zp)
    s = np.repeat(np.asarray(q0.scale, np.float64), G, axis=-2)
    if dtype is None:
      k = 0.5 * (1 + 2**-20) if scheme in ("absmax", "learned") else 0.5 + 15 * 2**-8
    else:
      k = 0.5 + 2**-2
    assert np.all(np.abs(fo[path].astype(np.float64) - fp[path]) <= k * s), path
  assert all(v == 0.0 for v in grid_residual(out, rules, dtype=dtype).values())
  assert all(v > 0.0 for v in grid_residual(params, rules, dtype=dtype).values())


@pytest.mark.parametrize("scheme", ["learned", "learned_zp"])
def test_int4_aware_init_before_init_learned(scheme):
  """The loop's order (grid init, then `init_learned` from the snapped weights): the learned s, z initialised
  from a fixed point make it a fixed point of the learned forward too."""
  spec = quant.Int4(group_size=G, **SCHEMES[scheme])
  rules = quant.QuantRules.default(spec)
  params = quant.init_learned(int4_aware_init(_tree(jax.random.PRNGKey(15)), rules), rules)
  fp = _flat(params)
  for path in SELECTED:
    q = quant.quantize(
      jnp.asarray(fp[path]), spec, axis=-2, scale=fp[path + "_scale"], zero_point=fp.get(path + "_zero")
    )
    np.testing.assert_array_equal(np.asarray(quant.dequantize(q)), fp[path], err_msg=path)


def test_minmax_fake_quant_is_not_idempotent_but_the_snap_is():
  """The reason for the minmax snap: plain minmax fake quant moves some groups again on a second pass."""
  spec = quant.Int4(group_size=G, scheme="minmax")
  w = _tree(jax.random.PRNGKey(14))["layers"]["mlp"]["up_proj"]["kernel"]
  w1 = quant.fake_quant(w, spec, axis=-2)
  assert not np.array_equal(np.asarray(quant.fake_quant(w1, spec, axis=-2)), np.asarray(w1))
  w_snap = int4_aware_init({"mlp": {"up_proj": {"kernel": w}}}, quant.QuantRules.default(spec))["mlp"]["up_proj"]
  np.testing.assert_array_equal(
    np.asarray(quant.fake_quant(w_snap["kernel"], spec, axis=-2)), np.asarray(w_snap["kernel"])
  )


# --------------------------------------------------------------------------- jolt


def _np_kl(lp, lq):
  lp, lq = np.asarray(lp, np.float64), np.asarray(lq, np.float64)
  lsp = lp - np.log(np.exp(lp - lp.max(-1, keepdims=True)).sum(-1, keepdims=True)) - lp.max(-1, keepdims=True)
  lsq = lq - np.log(np.exp(lq - lq.max(-1, keepdims=True)).sum(-1, keepdims=True)) - lq.max(-1, keepdims=True)
  return (np.exp(lsp) * (lsp - lsq)).sum(-1)


def test_next_token_kl_matches_float64_and_its_bound():
  k1, k2, k3 = jax.random.split(jax.random.PRNGKey(11), 3)
  lp = 3.0 * jax.random.normal(k1, (3, 5, 17))
  lq = lp + 0.3 * jax.random.normal(k2, lp.shape)
  mask = jax.random.bernoulli(k3, 0.7, (3, 5)).at[0, 0].set(True)
  kl, m = jax.jit(next_token_kl)(lp, lq, mask)
  ref_t = _np_kl(lp, lq)
  mk = np.asarray(mask)
  np.testing.assert_allclose(float(kl), ref_t[mk].mean(), rtol=1e-4)
  np.testing.assert_allclose(float(m["kl_max"]), ref_t[mk].max(), rtol=1e-4)
  d = np.asarray(lq, np.float64) - np.asarray(lp, np.float64)
  bound_t = (d.max(-1) - d.min(-1)) ** 2 / 8
  assert np.all(ref_t <= bound_t)  # Hoeffding, per token
  np.testing.assert_allclose(float(m["bound"]), bound_t[mk].mean(), rtol=1e-5)
  assert float(kl) <= float(m["bound"])
  assert float(m["count"]) == mk.sum()
  # masked == sliced: one row alone
  kl0, _ = next_token_kl(lp[:1], lq[:1], mask[:1])
  np.testing.assert_allclose(float(kl0), ref_t[0][mk[0]].mean(), rtol=1e-4)
  z, mz = next_token_kl(lp, lp, mask)
  assert float(z) == 0.0 and float(mz["bound"]) == 0.0
  with pytest.raises(ValueError, match=r"\[B, T\]"):
    next_token_kl(lp, lq, mask[:, :2])


@pytest.mark.parametrize("scheme", ["absmax", pytest.param("learned_zp", marks=pytest.mark.slow)])
def test_policy_jolt_is_zero_after_int4_aware_init(scheme):
  """Tiny model: the QAT forward jolts the random init by 0 < KL <= bound; after int4_aware_init (then the
  learned s, z initialised from it, as the loop does) the QAT and float forwards agree bit for bit: KL = 0."""
  from lrl_jax import models

  cfg = models.ModelConfig(
    arch="qwen2", vocab_size=24, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2
  )
  rules = quant.QuantRules.default(quant.Int4(group_size=G, **SCHEMES[scheme]))
  params = models.init_params(cfg, jax.random.PRNGKey(12), std=0.2)  # large std: a jolt well above f32 noise
  tokens = jax.random.randint(jax.random.PRNGKey(13), (2, 9), 0, 24)
  fwd = jax.jit(lambda p, r: models.forward(p, tokens, cfg, numerics=models.Numerics(qat_rules=r))[0], static_argnums=1)
  p0 = quant.init_learned(params, rules)
  kl, m = policy_jolt(fwd, p0, rules)
  lf, lq = fwd(p0, None), fwd(p0, rules)
  np.testing.assert_allclose(float(kl), _np_kl(lf, lq).mean(), rtol=1e-3)
  assert 0.0 < float(kl) <= float(m["bound"])
  kl0, m0 = policy_jolt(fwd, quant.init_learned(int4_aware_init(params, rules), rules), rules)
  assert float(kl0) == 0.0 and float(m0["logit_diff_max"]) == 0.0
