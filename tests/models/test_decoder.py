"""The decoder against an independent float64 NumPy implementation, the KV cache against the full
forward, QAT and QArray kernels against fake-quantized / dequantized float weights."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

from lrl_jax import kernels, models, quant
from lrl_jax.models import ModelConfig
from tests._fp_bound import rounding_bound

ARCHS = ("llama", "qwen2", "qwen3")

# One jit'd forward for every test (tracing op by op would dominate the run time).
fwd = jax.jit(models.forward, static_argnames=("cfg", "remat"))


def tiny_cfg(arch, **kw):
  base = dict(
    arch=arch,
    vocab_size=101,
    hidden_size=64,
    intermediate_size=96,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    rope_theta=500.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=arch == "qwen2",
  )
  base.update(kw)
  return ModelConfig(**base)


def random_params(cfg, seed=0):
  """init_params, with norm scales and biases moved off their 1 / 0 init so every term is exercised."""
  p = models.init_params(cfg, jax.random.key(seed), std=0.15)
  rng = np.random.default_rng(seed)

  def perturb(kp, x):
    path = quant.path_str(kp)
    if path.endswith("/scale"):
      return jnp.asarray(np.asarray(x) + 0.2 * rng.standard_normal(x.shape), x.dtype)
    if path.endswith("/bias"):
      return jnp.asarray(0.3 * rng.standard_normal(x.shape), x.dtype)
    return x

  return jax.tree_util.tree_map_with_path(perturb, p)


def logits_bound(params, tokens, cfg, valid=None):
  """The forward's logits with a first-order rounding bound on each (tests/_fp_bound.py, probabilistic: exceeded
  with probability < 3e-8 in the model of mean-independent rounding errors). Any evaluation of the same
  function with the same operations (padded, KV-cached, another summation order) lies within it of the exact
  logits, so two of them differ by at most twice it. The weights are taken as f32 roundings (covers ŵ·dec)."""
  valid = np.ones(np.shape(tokens), bool) if valid is None else valid
  fn = lambda p, t, v: models.forward(p, t, cfg, valid_BT=v)[0]
  b = rounding_bound(fn, params, np.asarray(tokens), np.asarray(valid), rounded_args=(0,))
  b.assert_stable()
  return b.err


# --------------------------------------------------------------------------- NumPy float64 reference


def _np_rms(x, g, eps):
  return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g


def _np_rope(x, pos, theta):
  """Rotation of the complex pairs (x_i, x_{i+Dh/2}) by angle pos · θ^(-2i/Dh)."""
  half = x.shape[-1] // 2
  freq = theta ** (-2.0 * np.arange(half) / x.shape[-1])
  z = (x[..., :half] + 1j * x[..., half:]) * np.exp(1j * pos[:, :, None, None] * freq)
  return np.concatenate([z.real, z.imag], axis=-1)


def np_forward(params, tokens, cfg, valid=None):
  """Float64 reference from the formulas (RMSNorm, RoPE, GQA softmax attention, SwiGLU)."""
  P = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
  tokens = np.asarray(tokens)
  B, T = tokens.shape
  valid = np.ones((B, T), bool) if valid is None else np.asarray(valid)
  pos = np.cumsum(valid, axis=1) - valid  # valid tokens before each token
  mask = np.tril(np.ones((T, T), bool))[None] & valid[:, None, :]
  H, Hkv, Dh, eps = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps
  x = P["embed"]["embedding"][tokens]
  ly = P["layers"]
  for l in range(cfg.num_layers):
    at = ly["attn"]
    h = _np_rms(x, ly["input_norm"]["scale"][l], eps)
    proj = lambda name: h @ at[name]["kernel"][l] + (at[name]["bias"][l] if cfg.attention_bias else 0.0)
    q = proj("q_proj").reshape(B, T, H, Dh)
    k = proj("k_proj").reshape(B, T, Hkv, Dh)
    v = proj("v_proj").reshape(B, T, Hkv, Dh)
    if cfg.qk_norm:
      q = _np_rms(q, at["q_norm"]["scale"][l], eps)
      k = _np_rms(k, at["k_norm"]["scale"][l], eps)
    q, k = _np_rope(q, pos, cfg.rope_theta), _np_rope(k, pos, cfg.rope_theta)
    o = np.zeros((B, T, H, Dh))
    for hh in range(H):
      kv = hh // (H // Hkv)
      s = np.einsum("btd,bsd->bts", q[:, :, hh], k[:, :, kv]) / np.sqrt(Dh)
      s = np.where(mask, s, -1e300)  # finite: a fully masked (padding) row stays finite
      s = s - np.max(s, axis=-1, keepdims=True)
      w = np.exp(s)
      w /= w.sum(-1, keepdims=True)
      o[:, :, hh] = np.einsum("bts,bsd->btd", w, v[:, :, kv])
    x = x + o.reshape(B, T, H * Dh) @ at["o_proj"]["kernel"][l]
    h = _np_rms(x, ly["post_attn_norm"]["scale"][l], eps)
    m = ly["mlp"]
    g = h @ m["gate_proj"]["kernel"][l]
    a = g / (1.0 + np.exp(-g)) * (h @ m["up_proj"]["kernel"][l])
    x = x + a @ m["down_proj"]["kernel"][l]
  x = _np_rms(x, P["final_norm"]["scale"], eps)
  if cfg.tie_word_embeddings:
    return x @ P["embed"]["embedding"].T
  return x @ P["lm_head"]["kernel"]


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("arch", ARCHS)
def test_forward_matches_numpy_float64(arch):
  cfg = tiny_cfg(arch, tie_word_embeddings=arch != "llama")
  params = random_params(cfg)
  rng = np.random.default_rng(1)
  tokens = rng.integers(0, cfg.vocab_size, (3, 9))
  valid = np.ones((3, 9), bool)
  valid[1, :3] = False  # left padding
  valid[2, 6:] = False  # right padding
  got, cache = fwd(params, tokens, cfg, valid_BT=valid)
  want = np_forward(params, tokens, cfg, valid)
  assert cache is None and got.dtype == jnp.float32 and got.shape == (3, 9, cfg.vocab_size)
  # f32 vs f64, logits of magnitude ~5: accumulation error ~1e-6 relative.
  np.testing.assert_allclose(np.asarray(got)[valid], want[valid], rtol=0, atol=2e-5 * np.abs(want).max())


def test_padding_does_not_change_valid_logits():
  cfg = tiny_cfg("qwen3")
  params = random_params(cfg)
  toks = np.random.default_rng(2).integers(1, cfg.vocab_size, (1, 6))
  plain, _ = fwd(params, toks, cfg)
  left = np.concatenate([np.zeros((1, 3), int), toks], 1)
  lv = np.concatenate([np.zeros((1, 3), bool), np.ones((1, 6), bool)], 1)
  padded, _ = fwd(params, left, cfg, valid_BT=lv)
  # The padding adds exact-zero terms to the attention sums and may reorder them: both within the padded
  # forward's rounding bound (the unpadded one sums the same nonzero terms).
  np.testing.assert_array_less(np.abs(padded[:, 3:] - plain), 2 * logits_bound(params, left, cfg, lv)[:, 3:])


@pytest.mark.parametrize(  # qwen2 / qwen3 (biases, q/k norms): the same cache path; the parity tests run them
  "arch", ["llama"] + [pytest.param(a, marks=pytest.mark.slow) for a in ARCHS if a != "llama"]
)
def test_kv_cache_decode_equals_full_forward(arch):
  cfg = tiny_cfg(arch)
  params = random_params(cfg, seed=3)
  B, T, P = 2, 10, 4
  tokens = np.random.default_rng(4).integers(0, cfg.vocab_size, (B, T))
  valid = np.ones((B, T), bool)
  valid[1, :2] = False  # a left-padded row
  full, _ = fwd(params, tokens, cfg, valid_BT=valid)
  step = lambda p, t, v, c, i: fwd(p, t, cfg, valid_BT=v, cache=c, cache_index=i)
  cache = models.init_cache(cfg, B, T + 2, jnp.float32)
  logits, cache = step(params, tokens[:, :P], valid[:, :P], cache, 0)  # prefill
  outs = [logits]
  for t in range(P, T):  # one token at a time
    logits, cache = step(params, tokens[:, t : t + 1], valid[:, t : t + 1], cache, t)
    outs.append(logits)
  dec = np.concatenate(outs, axis=1)
  # The cached decode computes the full forward's dot products (the unwritten slots add exact zeros).
  tol = 2 * logits_bound(params, tokens, cfg, valid)
  np.testing.assert_array_less(np.abs(dec[valid] - np.asarray(full)[valid]), tol[valid])
  np.testing.assert_array_equal(cache.valid_BS, np.concatenate([valid, np.zeros((B, 2), bool)], 1))


def test_fp8_kv_cache_holds_e4m3_per_token_head_codes():
  cfg = tiny_cfg("llama")
  params = random_params(cfg, seed=5)
  tokens = np.random.default_rng(6).integers(0, cfg.vocab_size, (2, 7))
  ref_logits, c32 = fwd(params, tokens, cfg, cache=models.init_cache(cfg, 2, 8, jnp.float32), cache_index=0)
  got_logits, c8 = fwd(params, tokens, cfg, cache=models.init_cache(cfg, 2, 8, jnp.float8_e4m3fn), cache_index=0)
  assert c8.k.dtype == jnp.float8_e4m3fn and c8.k_scale.shape == c8.k.shape[:-1]
  for x32, x8, s in ((c32.k, c8.k, c8.k_scale), (c32.v, c8.v, c8.v_scale)):
    x = np.asarray(x32, np.float64)[:1, :, :7]  # layer 0: its inputs do not depend on the cache dtype
    want_s = np.abs(x).max(-1) / 448.0  # s = amax / 448 per (layer, row, token, head)
    want_c = np.clip(x / want_s[..., None], -448, 448).astype(ml_dtypes.float8_e4m3fn)
    np.testing.assert_allclose(np.asarray(s)[:1, :, :7], want_s, rtol=1e-6)
    # codes equal the NumPy rounding of the same values (one-ulp differences allowed where
    # x / s in f32 vs f64 sits on a rounding boundary).
    diff = np.abs(np.asarray(x8)[:1, :, :7].astype(np.float64) - want_c.astype(np.float64))
    assert np.mean(diff == 0) > 0.999, np.mean(diff == 0)
  # e4m3 keeps 3 mantissa bits (relative step 1/16) on every key and value: with these large random
  # weights logits move by ~5% of their range; bound it at 10%.
  assert np.abs(got_logits - ref_logits).max() < 0.1 * np.abs(ref_logits).max()


@pytest.mark.parametrize(
  "spec",
  [quant.Int4(group_size=32), pytest.param(quant.NVFP4(), marks=pytest.mark.slow), quant.FP8(), quant.MXFP8()],
  ids=lambda s: s.name,
)
def test_qat_forward_equals_fake_quantized_params(spec):  # NVFP4's QAT logits: test_learner_logprobs (default)
  cfg = tiny_cfg("qwen2")
  params = random_params(cfg, seed=7)
  rules = quant.QuantRules.default(spec)
  tokens = np.random.default_rng(8).integers(0, cfg.vocab_size, (2, 6))
  qat, _ = fwd(params, tokens, cfg, numerics=models.Numerics(qat_rules=rules))
  fq_params = jax.jit(quant.fake_quant_params, static_argnums=1)(params, rules)
  fq, _ = fwd(fq_params, tokens, cfg)
  plain, _ = fwd(params, tokens, cfg)
  assert np.abs(np.asarray(plain) - np.asarray(qat)).max() > 1e-3  # the rules did quantize
  if isinstance(spec, quant.NVFP4):
    # NVFP4's dot is the served one (`quant.qdot`: dec after the K sum): bit for bit the forward on the served
    # QArrays; against x @ ŵ on the float tree only f32 rounding differs: the float forward's rounding bound, the
    # served side within sqrt(1 + 1/64) of it (test_qarray_forward_equals_dequantized_float_forward says why).
    served, _ = fwd(jax.jit(quant.quantize_params, static_argnums=1)(params, rules), tokens, cfg)
    np.testing.assert_array_equal(qat, served)
    tol = (1 + np.sqrt(1 + 1 / 64)) * logits_bound(fq_params, tokens, cfg)
    np.testing.assert_array_less(np.abs(np.asarray(qat) - np.asarray(fq)), tol)
    # QAT fading in (learner.qat_warmup_steps): fully faded in it is the served dot again; at 0 the plain one.
    np.testing.assert_array_equal(
      fwd(params, tokens, cfg, numerics=models.Numerics(qat_rules=rules, qat_alpha=1.0))[0], qat
    )
    np.testing.assert_array_equal(
      fwd(params, tokens, cfg, numerics=models.Numerics(qat_rules=rules, qat_alpha=0.0))[0], plain
    )
  else:
    np.testing.assert_array_equal(qat, fq)  # same weights, same dots: bit for bit


def test_qat_gradient_is_straight_through():
  cfg = tiny_cfg("llama", num_layers=1)
  params = random_params(cfg, seed=9)
  rules = quant.QuantRules.default(quant.Int4(group_size=32))
  tokens = np.random.default_rng(10).integers(0, cfg.vocab_size, (2, 5))
  loss = lambda p, r: jnp.mean(models.forward(p, tokens, cfg, numerics=models.Numerics(qat_rules=r))[0] ** 2)
  grad = jax.jit(jax.grad(loss), static_argnums=1)
  g_qat = grad(params, rules)
  # STE: d/dW of loss(fake_quant(W)) is the plain gradient evaluated at the fake-quantized weights.
  fq = jax.jit(quant.fake_quant_params, static_argnums=1)(params, rules)
  g_ref = grad(fq, None)
  for a, b in zip(jax.tree_util.tree_leaves(g_qat), jax.tree_util.tree_leaves(g_ref)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
  "spec", [quant.Int4(group_size=32), quant.NVFP4(), quant.FP8(), quant.MXFP8()], ids=lambda s: s.name
)
def test_qarray_forward_equals_dequantized_float_forward(spec):
  cfg = tiny_cfg("qwen3")
  params = random_params(cfg, seed=11)
  served = jax.jit(quant.quantize_params, static_argnums=1)(params, quant.QuantRules.default(spec))
  assert (
    sum(
      isinstance(x, quant.QArray)
      for x in jax.tree_util.tree_leaves(served, is_leaf=lambda x: isinstance(x, quant.QArray))
    )
    == 7
  )
  tokens = np.random.default_rng(12).integers(0, cfg.vocab_size, (2, 6))
  got, _ = fwd(served, tokens, cfg)
  deq = jax.jit(quant.dequantize_params)(served)
  want, _ = fwd(deq, tokens, cfg)
  # Same dequantized weights (the XLA path dequantizes, then dots); only the accumulation order may differ:
  # both within the float forward's rounding bound. NVFP4 multiplies by dec after the K sum: ŵ·dec is the
  # rounded weight the bound allows for, and rounding y·dec adds at most 1/K <= 1/64 of a dot's own term
  # in quadrature (u·|y| against u·√K·Σ|x||w|): that side is within sqrt(1 + 1/64) of the bound.
  f = np.sqrt(1 + 1 / 64) if isinstance(spec, quant.NVFP4) else 1.0
  np.testing.assert_array_less(np.abs(np.asarray(got) - np.asarray(want)), (1 + f) * logits_bound(deq, tokens, cfg))


def test_w8a8_served_equals_w8a8_qat_forward():
  cfg = tiny_cfg("llama")
  params = random_params(cfg, seed=15)
  spec, act = quant.FP8(), quant.FP8(granularity="token")
  rules = quant.QuantRules.default(spec)
  tokens = np.random.default_rng(16).integers(0, cfg.vocab_size, (2, 6))
  served = jax.jit(lambda p: quant.quantize_params(p, rules))(params)
  sampler_w8a8, _ = fwd(served, tokens, cfg, numerics=models.Numerics(act_spec=act))
  learner_w8a8, _ = fwd(params, tokens, cfg, numerics=models.Numerics(qat_rules=rules, act_spec=act))
  # NumPy reference of the per-token FP8 activation quantizer on the first q_proj input
  x = np.asarray(jax.random.normal(jax.random.key(0), (5, 64)), np.float64)
  s = np.abs(x).max(-1, keepdims=True) / 448.0
  want = np.clip(x / s, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float64) * s
  np.testing.assert_allclose(quant.fake_quant(jnp.asarray(x, jnp.float32), act, axis=-1), want, rtol=1e-6)
  # Same codes on both sides; the dots may differ in accumulation order: 1e-5 of scale.
  np.testing.assert_allclose(sampler_w8a8, learner_w8a8, rtol=0, atol=1e-5 * np.abs(np.asarray(learner_w8a8)).max())
  w8a16, _ = fwd(served, tokens, cfg)
  assert np.abs(np.asarray(w8a16) - np.asarray(sampler_w8a8)).max() > 1e-3  # activations were quantized
  with pytest.raises(ValueError, match="act_spec"):
    models.forward(params, tokens, cfg, numerics=models.Numerics(act_spec=quant.FP8()))


def test_bf16_compute_close_to_f32():
  cfg = tiny_cfg("llama")
  params = random_params(cfg, seed=13)
  tokens = np.random.default_rng(14).integers(0, cfg.vocab_size, (2, 6))
  f32, _ = fwd(params, tokens, cfg)
  bf, _ = fwd(params, tokens, cfg.replace(dtype="bfloat16"))
  assert bf.dtype == jnp.float32
  # bf16 keeps 8 mantissa bits: a few 1e-2 relative after two layers.
  assert np.abs(np.asarray(bf) - np.asarray(f32)).max() < 0.05 * np.abs(np.asarray(f32)).max()


def test_param_table_rules_and_logical_axes():
  for arch in ARCHS:
    cfg = tiny_cfg(arch)
    params = models.init_params(cfg, jax.random.key(0))
    models.check_params(params, cfg)
    shapes = models.param_shapes(cfg)
    sel = quant.QuantRules.default(quant.Int4(group_size=32)).selected(params)
    assert sorted(sel) == sorted(p for p in shapes if p.endswith("_proj/kernel"))
    axes = models.param_logical_axes(cfg)
    flat = {
      quant.path_str(kp): v
      for kp, v in jax.tree_util.tree_leaves_with_path(axes, is_leaf=lambda x: isinstance(x, tuple))
    }
    assert {p: len(v) for p, v in flat.items()} == {p: len(s) for p, s in shapes.items()}
    assert flat["layers/attn/q_proj/kernel"] == ("layers", "embed", "heads")
    assert flat["layers/mlp/down_proj/kernel"] == ("layers", "mlp", "embed")
  served = jax.eval_shape(lambda p: quant.quantize_params(p, quant.QuantRules.default(quant.NVFP4())), params)
  sax = models.param_logical_axes(served)
  q = sax["layers"]["attn"]["q_proj"]["kernel"]
  assert q.codes == ("layers", "embed", "heads") and q.global_scale == ("layers",)


def test_check_params_names_bad_path():
  cfg = tiny_cfg("llama")
  params = models.init_params(cfg, jax.random.key(0))
  bad = jax.tree_util.tree_map(lambda x: x, params)
  bad["layers"]["mlp"]["up_proj"]["kernel"] = jnp.zeros((2, 64, 95))
  with pytest.raises(ValueError, match=r"layers/mlp/up_proj/kernel.*\(2, 64, 96\).*\(2, 64, 95\)"):
    models.check_params(bad, cfg)
  del bad["final_norm"]
  with pytest.raises(ValueError, match="final_norm/scale"):
    models.check_params(bad, cfg)


def test_config_validation_and_hf_mapping():
  with pytest.raises(ValueError, match="arch"):
    ModelConfig(arch="gpt2", vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=2)
  with pytest.raises(ValueError, match="num_kv_heads"):
    ModelConfig(
      arch="llama", vocab_size=8, hidden_size=12, intermediate_size=8, num_layers=1, num_heads=3, num_kv_heads=2
    )
  hf4 = dict(
    model_type="qwen2",
    vocab_size=50,
    hidden_size=32,
    intermediate_size=40,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    rope_theta=1e6,
    torch_dtype="bfloat16",
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    max_position_embeddings=4096,
  )
  c4 = ModelConfig.from_hf(hf4)
  assert (c4.head_dim, c4.rope_theta, c4.dtype, c4.attention_bias, c4.qk_norm) == (8, 1e6, "bfloat16", True, False)
  hf5 = {k: v for k, v in hf4.items() if k not in ("rope_theta", "torch_dtype")}
  hf5.update(
    model_type="qwen3", head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 2e5}, dtype="float32"
  )
  c5 = ModelConfig.from_hf(hf5)
  assert (c5.head_dim, c5.rope_theta, c5.dtype, c5.attention_bias, c5.qk_norm) == (16, 2e5, "float32", False, True)
  assert ModelConfig.from_hf(c5.to_hf()) == c5
  with pytest.raises(ValueError, match="'mistral'"):
    ModelConfig.from_hf(dict(hf4, model_type="mistral"))
  with pytest.raises(ValueError, match="llama3"):
    ModelConfig.from_hf(dict(hf4, model_type="llama", rope_scaling={"rope_type": "llama3", "factor": 8.0}))


@pytest.mark.ref
def test_to_hf_is_read_by_transformers():
  transformers = pytest.importorskip("transformers")
  for arch in ARCHS:
    cfg = tiny_cfg(arch)
    hc = transformers.AutoConfig.for_model(**cfg.to_hf())
    assert ModelConfig.from_hf(hc.to_dict()) == cfg


@pytest.mark.parametrize(
  "spec",
  [
    # 4 compiles each: the default suite keeps NVFP4 (its own backward), the rest run in test-slow
    pytest.param(quant.Int4(group_size=32), marks=pytest.mark.slow),
    pytest.param(quant.Int4(group_size=32, scheme="minmax"), marks=pytest.mark.slow),
    pytest.param(quant.FP8(), marks=pytest.mark.slow),
    quant.NVFP4(),
    None,  # no QAT: the f32 kernels cast to bf16 once per forward
  ],
  ids=lambda s: "bf16_cast" if s is None else s.name + ("_minmax" if getattr(s, "scheme", "") == "minmax" else ""),
)
def test_qat_operands_made_once_equal_the_per_matmul_path(spec, monkeypatch):
  """QAT fake-quantizes each stacked layer kernel once per forward, outside the layer scan
  (`decoder._hoist_operands`): its hidden states equal the per-matmul path's bit for bit (the same operand, the same
  dot) in the plain and the grouped forward. Straight-through gradients to the f32 masters, INT4 / FP8 in bf16: with
  one matmul per kernel (the plain forward) bit for bit; with two (the grouped forward's prompt and completions) the
  two bf16 gradients now add in bf16 on the operand, where they added in f32 on the master: the master's gradient is
  the old one rounded to bf16, exactly (two bf16 values add exactly in f32), and every other leaf is unchanged.
  NVFP4's backward changed: the per-matmul one multiplied by ŵ = e2m1 · s_b · dec rounded to the compute dtype, the
  operand's multiplies by e2m1 · s_b exactly and by dec in f32 (the forward's own factors). In bf16 the two differ by
  those roundings compounded through the layers (about 1% norm-wise); in f32, checked here, by f32 roundings only
  (2^-24 per operation, a few hundred along any path): 2^-16 norm-wise is far above that. Without QAT (spec None)
  the f32 kernels are cast to bf16 once per forward the same way: the same bits as INT4 / FP8 above."""
  from lrl_jax.models import decoder  # noqa: PLC0415

  nvfp4 = isinstance(spec, quant.NVFP4)
  cfg = tiny_cfg("qwen2", dtype="float32" if nvfp4 else "bfloat16")
  params = random_params(cfg, seed=21)
  num = models.Numerics(qat_rules=None if spec is None else quant.QuantRules.default(spec))
  rng = np.random.default_rng(22)
  tokens = np.repeat(rng.integers(0, cfg.vocab_size, (2, 8)), 2, axis=0)
  tokens[:, 5:] = rng.integers(0, cfg.vocab_size, (4, 3))
  sq = lambda a: jnp.sum(a.astype(jnp.float32) ** 2)  # noqa: E731

  def run():
    plain = lambda p: (lambda h: (sq(h), h))(models.forward_hidden(p, tokens, cfg, numerics=num)[0])  # noqa: E731
    grouped = lambda p: (  # noqa: E731
      lambda h: (sq(h), h)
    )(models.forward_hidden_grouped(p, tokens, cfg, group_size=2, prompt_len=5, numerics=num)[0])
    out = [jax.jit(jax.value_and_grad(f, has_aux=True))(params) for f in (plain, grouped)]
    return [jax.tree_util.tree_map(np.asarray, (h, g)) for (_, h), g in out]

  if spec is None:  # the f32 masters are cast: the hoisting is not a no-op here
    cast = decoder._hoist_operands(params, {}, jnp.dtype(cfg.dtype))[0]["layers"]["mlp"]["up_proj"]["kernel"]
    assert params["layers"]["mlp"]["up_proj"]["kernel"].dtype == jnp.float32 and cast.w.dtype == jnp.bfloat16
  if spec is not None:
    # The per-matmul QAT dot (AQT's) takes the f32 cotangent of its f32 output; the hoisted operand's dot takes a
    # bf16 one (`kernels.dense_dot` on bf16 operands), whose backward dots add the same products in another order
    # (tests/kernels/test_dense_dot.py). The hoisting is compared here with the f32-cotangent dot on both sides: jax's
    # own vjp of the f32-accumulated dot over x's rows (NVFP4's f32 operands keep `predecoded_dot`, whose f32
    # backward is that).
    own = kernels.predecoded_dot

    def f32_cotangent_dot(x, p, out_dtype=jnp.float32):
      if p.dec is not None:
        return own(x, p, out_dtype)
      k = 0 if p.axis == -2 else 1
      y = lax.dot_general(x.reshape(-1, x.shape[-1]), p.w, (((1,), (k,)), ((), ())), preferred_element_type=jnp.float32)
      return y.reshape(*x.shape[:-1], -1).astype(out_dtype)

    monkeypatch.setattr(kernels, "predecoded_dot", f32_cotangent_dot)
  hoisted = run()
  monkeypatch.setattr(decoder, "_hoist_operands", lambda p, s, dt: (p, s))
  per_matmul = run()
  for (h_a, g_a), (h_b, g_b), two_uses in zip(hoisted, per_matmul, (False, True)):
    np.testing.assert_array_equal(h_a, h_b)
    for (kp, a), b in zip(jax.tree_util.tree_leaves_with_path(g_a), jax.tree_util.tree_leaves(g_b)):
      path = quant.path_str(kp)
      if nvfp4:
        assert np.linalg.norm(a - b) <= 2.0**-16 * np.linalg.norm(b), path
      elif two_uses and path.startswith("layers/") and path.endswith("kernel"):
        np.testing.assert_array_equal(a, b.astype(ml_dtypes.bfloat16).astype(np.float32), err_msg=path)
      else:
        np.testing.assert_array_equal(a, b, err_msg=path)
