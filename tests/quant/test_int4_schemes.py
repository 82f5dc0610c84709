"""INT4 schemes beyond absmax: minmax (asymmetric) and learned scales / zero points (LSQ, LSQ+).

References are NumPy, written from the formulas of `Int4`'s docstring (float32 arithmetic where codes
are compared bit for bit; float64 for the LSQ / LSQ+ gradient formulas of Esser et al. 2020 and
Bhalgat et al. 2020).
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from lrl_jax import learner as L
from lrl_jax import models, quant, sampler
from lrl_jax.quant import Int4
from tests._fp_bound import rounding_bound

F32 = np.float32
G = 32
MINMAX = Int4(group_size=G, scheme="minmax")
LSQ = Int4(group_size=G, scheme="learned")
LSQZ = Int4(group_size=G, scheme="learned", learn_zero_point=True)


def _groups(x, g):  # [K, N] -> [K/g, g, N]
  return x.reshape(x.shape[0] // g, g, x.shape[1])


def ref_minmax(w):
  """lo = min(min w, 0), hi = max(max w, 0); s = bf16(max((hi − lo)/15, 1e-5)); z_u = clip(rne(−lo/s), 0, 15);
  u = clip(rne(w/s) + z_u, 0, 15); ŵ = (u − z_u)·s. Groups along axis 0 of w [K, N]."""
  wg = _groups(np.asarray(w, F32), G)
  lo = np.minimum(wg.min(1, keepdims=True), F32(0))
  hi = np.maximum(wg.max(1, keepdims=True), F32(0))
  s = np.maximum((hi - lo) / F32(15), F32(1e-5)).astype(ml_dtypes.bfloat16).astype(F32)
  zu = np.clip(np.round(-lo / s), 0, 15)
  u = np.clip(np.round(wg / s) + zu, 0, 15)
  return u.reshape(w.shape), s[:, 0], zu[:, 0], ((u - zu) * s).reshape(w.shape)


def ref_given(w, s, z, qmin=-8, qmax=7):
  """Given (learned) s, z: s → bf16(max(s, 1e-5)), z → clip(rne(z), −8, 7); q = clip(rne(w/s) + z); ŵ = (q − z)·s."""
  wg = _groups(np.asarray(w, F32), G)
  sb = np.maximum(np.asarray(s, F32), F32(1e-5)).astype(ml_dtypes.bfloat16).astype(F32)[:, None]
  zr = np.zeros_like(sb) if z is None else np.clip(np.round(np.asarray(z, F32)), -8, 7)[:, None]
  q = np.clip(np.round(wg / sb) + zr, qmin, qmax)
  return q.reshape(w.shape), ((q - zr) * sb).reshape(w.shape)


def unpack(codes):
  """uint8 [K/2, N] -> int [K, N] nibbles (element 2i in the low nibble)."""
  c = np.asarray(codes).astype(np.int64)
  out = np.empty((2 * c.shape[0], c.shape[1]), np.int64)
  out[0::2], out[1::2] = c & 0xF, c >> 4
  return out


@pytest.fixture(scope="module")
def w():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((128, 24)).astype(F32)
  x[:G, 0] = np.abs(x[:G, 0]) + 0.5  # an all-positive group: 0 joins the range, z_u = 0
  x[G : 2 * G, 1] = -np.abs(x[G : 2 * G, 1]) - 0.5  # an all-negative group: z_u = 15
  x[2 * G : 3 * G, 2] = 0.0  # an all-zero group
  return x


def test_minmax_matches_reference_bitwise(w):
  u, s, zu, w_hat = ref_minmax(w)
  q = quant.quantize(jnp.asarray(w), MINMAX, axis=0)
  assert q.zero_point.dtype == jnp.int8 and q.zero_point.shape == q.scale.shape == (4, 24)
  np.testing.assert_array_equal(unpack(q.codes), u)  # stored nibble = q + 8 = u (unsigned codes)
  np.testing.assert_array_equal(np.asarray(q.scale).astype(F32), s)
  np.testing.assert_array_equal(np.asarray(q.zero_point) + 8, zu)  # signed z = z_u − 8
  np.testing.assert_array_equal(np.asarray(quant.dequantize(q)), w_hat)
  assert zu[0, 0] == 0 and zu[1, 1] == 15
  # 0 is exactly representable; minmax beats absmax on the error (it uses all 16 levels).
  assert np.all(np.asarray(quant.dequantize(q))[2 * G : 3 * G, 2] == 0)
  err = lambda spec: float(jnp.linalg.norm(quant.fake_quant(jnp.asarray(w), spec, axis=0) - w))
  assert err(MINMAX) < err(Int4(group_size=G))


@pytest.mark.parametrize("spec", [LSQ, LSQZ], ids=lambda s: s.name)
def test_given_scale_and_zero_point_match_reference(w, spec):
  rng = np.random.default_rng(1)
  s = (np.abs(w).reshape(4, G, 24).max(1) / 7 * rng.uniform(0.6, 1.3, (4, 24))).astype(F32)
  s[0, 3] = -0.2  # a learned scale pushed below the floor: floored at 1e-5
  z = rng.uniform(-9.5, 8.5, (4, 24)).astype(F32) if spec.asymmetric else None
  q = quant.quantize(jnp.asarray(w), spec, axis=0, scale=s, zero_point=z)
  codes, w_hat = ref_given(w, s, z)
  np.testing.assert_array_equal(unpack(q.codes) - 8, codes)
  np.testing.assert_array_equal(np.asarray(quant.dequantize(q)), w_hat)
  assert codes.min() == -8  # the learned schemes use the full range [-8, 7]
  fq = quant.learned_fake_quant(jnp.asarray(w), jnp.asarray(s), None if z is None else jnp.asarray(z), spec, axis=0)
  np.testing.assert_array_equal(np.asarray(fq), w_hat)  # learner == sampler, bit for bit


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("spec", [MINMAX, LSQ, LSQZ], ids=lambda s: s.name)
def test_fake_quant_equals_dequantize_quantize(w, spec, dtype):
  x = jnp.asarray(w, dtype)
  f = jax.jit(quant.fake_quant, static_argnames=("spec", "axis"))(x, spec, axis=0)
  d = quant.dequantize(quant.quantize(x, spec, axis=0), dtype)
  np.testing.assert_array_equal(np.asarray(f).view(np.uint8), np.asarray(d).view(np.uint8))
  assert f.dtype == dtype


def test_learned_init_is_absmax_or_minmax(w):
  q_abs, q_mm = quant.quantize(w, Int4(group_size=G), axis=0), quant.quantize(w, MINMAX, axis=0)
  q_lsq, q_lsqz = quant.quantize(w, LSQ, axis=0), quant.quantize(w, LSQZ, axis=0)
  np.testing.assert_array_equal(np.asarray(q_lsq.scale), np.asarray(q_abs.scale))
  assert q_lsq.zero_point is None
  np.testing.assert_array_equal(np.asarray(q_lsqz.scale), np.asarray(q_mm.scale))
  np.testing.assert_array_equal(np.asarray(q_lsqz.zero_point), np.asarray(q_mm.zero_point))


def test_lsq_gradients_match_the_formulas(w):
  """LSQ: ∂ŵ/∂s = rne(w/s) − w/s inside [qmin, qmax], (q − z) where clipped; ∂ŵ/∂z = 0 inside, −s clipped;
  ∂ŵ/∂w = 1 inside, 0 clipped; s and z gradients scaled by 1/√(G·7). float64 reference."""
  rng = np.random.default_rng(2)
  s = (np.abs(w).reshape(4, G, 24).max(1) / 9).astype(F32)  # small scales: many clipped codes
  s = s.astype(ml_dtypes.bfloat16).astype(F32)  # on the bf16 grid, so the forward's s is this s
  s[2, 2] = 1.0  # the all-zero group keeps a regular scale (below the floor, s would be frozen)
  z = np.round(rng.uniform(-3, 3, (4, 24))).astype(F32)
  g_out = rng.standard_normal(w.shape).astype(F32)
  loss = lambda w_, s_, z_: jnp.sum(quant.learned_fake_quant(w_, s_, z_, LSQZ, axis=0) * g_out)
  gw, gs, gz = jax.grad(loss, argnums=(0, 1, 2))(jnp.asarray(w), jnp.asarray(s), jnp.asarray(z))

  wg, gg = _groups(w.astype(np.float64), G), _groups(g_out.astype(np.float64), G)
  s64, z64 = s.astype(np.float64)[:, None], z.astype(np.float64)[:, None]
  r = np.round(wg.astype(F32) / s.astype(F32)[:, None]).astype(np.float64)  # rne(w/s) as the forward rounds
  inside = (r + z64 >= -8) & (r + z64 <= 7)
  q = np.clip(r + z64, -8, 7)
  k = 1 / np.sqrt(G * 7)
  want_s = k * np.sum(gg * np.where(inside, r - wg / s64, q - z64), axis=1)
  want_z = k * np.sum(gg * np.where(inside, 0.0, -s64), axis=1)
  want_w = np.where(inside, gg, 0.0).reshape(w.shape)
  assert 0.02 < 1 - inside.mean() < 0.9  # both branches exercised
  np.testing.assert_allclose(np.asarray(gs), want_s, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(np.asarray(gz), want_z, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(gw), want_w)


def test_stacked_qarray_with_zero_points_slices_like_its_matrices(w):
  x = jnp.stack([jnp.asarray(w), 2 * jnp.asarray(w)])  # [L, K, N]
  q = quant.quantize(x, MINMAX, axis=-2)

  def body(c, qi):
    return c, quant.dequantize(qi)

  _, per_layer = jax.lax.scan(body, 0, q)
  for i in range(2):
    np.testing.assert_array_equal(np.asarray(per_layer[i]), np.asarray(quant.fake_quant(x[i], MINMAX, axis=-2)))
  assert q.nbytes == q.codes.size + 2 * q.scale.size + q.zero_point.size


def test_errors_name_the_problem(w):
  with pytest.raises(ValueError, match="learn_zero_point needs scheme='learned'"):
    Int4(group_size=G, learn_zero_point=True)
  with pytest.raises(ValueError, match="scheme must be"):
    Int4(group_size=G, scheme="awq")
  with pytest.raises(ValueError, match=r"group shape \(4, 24\)"):
    quant.quantize(w, LSQ, axis=0, scale=np.ones((24, 4), F32))
  with pytest.raises(ValueError, match="zero point was given but the spec is symmetric"):
    quant.quantize(w, LSQ, axis=0, scale=np.ones((4, 24), F32), zero_point=np.zeros((4, 24), F32))
  with pytest.raises(ValueError, match="for Int4 only"):
    quant.quantize(w, quant.NVFP4(), axis=0, scale=np.ones((8, 24), F32))
  with pytest.raises(ValueError, match="learned scales live in the parameter tree"):
    quant.dot_general_for(LSQ)
  params = {"mlp": {"up_proj": {"kernel": jnp.asarray(w)}}}
  with pytest.raises(ValueError, match="mlp/up_proj/kernel.*kernel_scale"):
    quant.quantize_params(params, quant.QuantRules.default(LSQ))
  with pytest.raises(ValueError, match="mlp/up_proj/kernel: has a learned scale"):
    quant.quantize_params(
      quant.init_learned(params, quant.QuantRules.default(LSQ)), quant.QuantRules.default(Int4(group_size=G))
    )


def test_rules_serve_the_learned_scales_never_recomputed(w):
  rules = quant.QuantRules.default(LSQZ)
  params = {"mlp": {"up_proj": {"kernel": jnp.asarray(w), "bias": jnp.ones(24)}}}
  p = quant.init_learned(params, rules)
  node = p["mlp"]["up_proj"]
  assert set(node) == {"kernel", "kernel_scale", "kernel_zero", "bias"}
  assert node["kernel_scale"].dtype == jnp.float32 and node["kernel_scale"].shape == (4, 24)
  # Move the learned values and the weights: the served codes come from the learned s, z.
  s = node["kernel_scale"] * 1.37
  z = node["kernel_zero"] + 1.6
  p = {"mlp": {"up_proj": dict(node, kernel=node["kernel"] * 3.0, kernel_scale=s, kernel_zero=z)}}
  assert quant.init_learned(p, rules)["mlp"]["up_proj"]["kernel_scale"] is s  # kept, not re-initialised
  served = quant.quantize_params(p, rules)
  assert set(served["mlp"]["up_proj"]) == {"kernel", "bias"}  # s and z moved into the QArray
  q = served["mlp"]["up_proj"]["kernel"]
  _, w_hat = ref_given(np.asarray(p["mlp"]["up_proj"]["kernel"]), np.asarray(s), np.asarray(z))
  np.testing.assert_array_equal(np.asarray(quant.dequantize(q)), w_hat)
  fq = quant.fake_quant_params(p, rules)
  np.testing.assert_array_equal(np.asarray(fq["mlp"]["up_proj"]["kernel"]), w_hat)
  assert fq["mlp"]["up_proj"]["kernel_scale"] is s


# --------------------------------------------------------------------------- model, learner, sampler

CFG = models.ModelConfig(
  arch="qwen2",
  vocab_size=64,
  hidden_size=64,
  intermediate_size=96,
  num_layers=2,
  num_heads=4,
  num_kv_heads=2,
  head_dim=16,
  tie_word_embeddings=True,
  dtype="float32",
)


def _params(spec, seed=0):
  p = models.init_params(CFG, jax.random.key(seed))
  p = quant.init_learned(p, quant.QuantRules.default(spec))
  # learned values moved off their init, as after training
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map_with_path(
    lambda kp, x: (
      x * jnp.asarray(rng.uniform(0.7, 1.3, x.shape), x.dtype)
      if quant.path_str(kp).endswith("_scale")
      else (x + jnp.asarray(rng.integers(-2, 3, x.shape), x.dtype) if quant.path_str(kp).endswith("_zero") else x)
    ),
    p,
  )


@pytest.mark.parametrize("spec", [MINMAX, pytest.param(LSQZ, marks=pytest.mark.slow)], ids=lambda s: s.name)
def test_qat_forward_equals_served_sampler_forward(spec):
  rules = quant.QuantRules.default(spec)
  p = _params(spec) if spec.learned else models.init_params(CFG, jax.random.key(0))
  models.check_params(p, CFG)
  tokens = np.random.default_rng(3).integers(0, CFG.vocab_size, (2, 7))
  fwd = jax.jit(models.forward, static_argnames=("cfg",))
  qat, _ = fwd(p, tokens, CFG, numerics=models.Numerics(qat_rules=rules))
  served = sampler.serve_params(p, rules, dtype=jnp.float32)
  assert isinstance(served["layers"]["attn"]["q_proj"]["kernel"], quant.QArray)
  got, _ = fwd(served, tokens, CFG)
  deq_params = quant.dequantize_params(served)
  deq, _ = fwd(deq_params, tokens, CFG)
  np.testing.assert_array_equal(np.asarray(qat), np.asarray(deq))  # same ŵ, same dots: bit for bit
  # kernels: accumulation order. The XLA path dequantizes (the same ŵ), then dots: both runs within the float
  # forward's first-order rounding bound of the exact logits (tests/_fp_bound.py).
  b = rounding_bound(lambda p: models.forward(p, tokens, CFG)[0], deq_params)
  b.assert_stable()
  np.testing.assert_array_less(np.abs(np.asarray(got) - np.asarray(qat)), 2 * b.err)


def test_qat_warmup_blends_float_and_fake_quant():
  rules = quant.QuantRules.default(LSQ)
  p = _params(LSQ)
  tokens = np.random.default_rng(4).integers(0, CFG.vocab_size, (2, 5))
  fwd = jax.jit(models.forward, static_argnames=("cfg",))
  plain, _ = fwd(p, tokens, CFG)
  qat, _ = fwd(p, tokens, CFG, numerics=models.Numerics(qat_rules=rules))
  a0, _ = fwd(p, tokens, CFG, numerics=models.Numerics(qat_rules=rules, qat_alpha=0.0))
  a1, _ = fwd(p, tokens, CFG, numerics=models.Numerics(qat_rules=rules, qat_alpha=1.0))
  np.testing.assert_array_equal(np.asarray(a0), np.asarray(plain))
  np.testing.assert_array_equal(np.asarray(a1), np.asarray(qat))
  # α = 0.5: the forward on the float64-blended weights w + ½(ŵ − w).
  fq = quant.fake_quant_params(p, rules)
  half = jax.tree_util.tree_map(lambda a, b: (np.asarray(a, np.float64) + np.asarray(b, np.float64)) / 2, p, fq)
  want, _ = fwd(jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), half), tokens, CFG)
  got, _ = fwd(p, tokens, CFG, numerics=models.Numerics(qat_rules=rules, qat_alpha=0.5))
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-5)
  cfg = L.LearnerConfig(qat=LSQ, qat_start_step=3, qat_warmup_steps=4)
  alphas = [float(cfg.qat_alpha(t)) for t in range(9)]
  np.testing.assert_allclose(alphas, [0, 0, 0, 0.25, 0.5, 0.75, 1, 1, 1])
  assert L.LearnerConfig(qat=LSQ).qat_alpha(0) is None
  assert [float(L.LearnerConfig(qat=LSQ, qat_start_step=2).qat_alpha(t)) for t in range(4)] == [0, 0, 1, 1]


def test_learner_trains_the_learned_scales_and_the_sampler_serves_them():
  spec = LSQZ
  lcfg = L.LearnerConfig(lr=1e-2, qat=spec, compute_dtype="float32", grad_clip=None)
  state = L.create_train_state(jax.random.key(0), CFG, lcfg)
  qp = state.params["layers"]["mlp"]["up_proj"]
  assert qp["kernel_scale"].shape == (2, 64 // G, 96) and qp["kernel_zero"].shape == (2, 64 // G, 96)
  s0 = np.asarray(qp["kernel_scale"]).copy()
  rng = np.random.default_rng(5)
  tokens = jnp.asarray(rng.integers(1, CFG.vocab_size, (4, 8)), jnp.int32)
  batch = L.Rollout(
    tokens=tokens,
    loss_mask=jnp.ones((4, 8), bool).at[:, 0].set(False),
    sampler_logp=jnp.full((4, 8), -4.0),
    advantages=jnp.asarray([1.0, -1.0, 0.5, -0.5]),
    valid=jnp.ones((4, 8), bool),
  )
  for _ in range(2):
    state, m = L.train_step(state, batch, model_cfg=CFG, cfg=lcfg)
  assert float(m["skipped"]) == 0
  s1 = np.asarray(state.params["layers"]["mlp"]["up_proj"]["kernel_scale"])
  assert np.mean(s1 != s0) > 0.5  # the scales are trained
  # The learner's π and the sampler's μ on the served tree (learned s, z) agree.
  logp = L.token_logprobs(state.params, batch, CFG, cfg=lcfg)
  served = sampler.serve_params(state.params, lcfg.qat_rules, dtype=jnp.float32)
  logp_served = L.token_logprobs(served, batch, CFG)
  # π under QAT is the float forward on dequantize(served) (the same ŵ, as the forward test above checks bit for
  # bit); the served kernels may sum in another order: both within its first-order rounding bound.
  b = rounding_bound(
    lambda p, t: L.token_logprobs(p, batch.replace(tokens=t), CFG),
    quant.dequantize_params(served),
    np.asarray(batch.tokens),
  )
  b.assert_stable()
  np.testing.assert_array_less(np.abs(np.asarray(logp_served, np.float64) - np.asarray(logp)), 2 * b.err + 1e-30)
  q = served["layers"]["mlp"]["up_proj"]["kernel"]
  want = np.maximum(s1, 1e-5).astype(ml_dtypes.bfloat16)
  np.testing.assert_array_equal(np.asarray(q.scale).view(np.uint16), want.view(np.uint16))


def test_config_keys_reach_the_learner_and_the_sampler():
  from lrl_jax.config import ConfigError, load_config
  from lrl_jax.rl.setup import sync_spec

  cfg = load_config(
    None,
    [
      "quant.learner=int4",
      "quant.sampler=int4",
      "quant.group_size=32",
      "quant.int4_scheme=learned",
      "quant.int4_zero_point=true",
      "learner.qat_start_step=5",
      "learner.qat_warmup_steps=10",
      "learner.qat_init=grid",
      "learner.int4_update_clip=2",
    ],
  )
  lcfg = cfg.learner
  assert lcfg.qat == LSQZ and lcfg.qat_init == "grid" and lcfg.int4_update_clip == 2.0
  assert (lcfg.qat_start_step, lcfg.qat_warmup_steps) == (5, 10)
  assert sync_spec(cfg).rules.spec_for("layers/mlp/up_proj/kernel") == LSQZ  # the sampler serves the same scheme
  # quant.targets narrows what the sampler serves and, the same, what the learner fake-quantizes.
  narrow = load_config(
    None, ["quant.learner=int4", "quant.sampler=int4", "quant.group_size=32", r"quant.targets=(q|k)_proj/kernel$"]
  )
  for rules in (narrow.learner.qat_rules, sync_spec(narrow).rules):
    assert rules.spec_for("layers/attn/q_proj/kernel") is not None
    assert rules.spec_for("layers/mlp/up_proj/kernel") is None
  with pytest.raises(ConfigError, match="int4_scheme"):
    load_config(None, ["quant.sampler=int4", "quant.int4_scheme=learned"])  # learned needs the learner's QAT
  with pytest.raises(ConfigError, match="int4_zero_point"):
    load_config(None, ["quant.learner=int4", "quant.sampler=int4", "quant.int4_zero_point=true"])
  with pytest.raises(ValueError, match="int4_update_clip"):
    L.LearnerConfig(qat=quant.NVFP4(), int4_update_clip=1.0)


def test_learner_update_clip_and_grid_init():
  """int4_update_clip=k bounds every INT4 weight's move per update by k·s of its group (large lr, so the bound
  binds); qat_init="grid" starts the kernels on their own grid (QAT changes nothing at step 0)."""
  spec = Int4(group_size=G)
  k = 0.5
  lcfg = L.LearnerConfig(lr=0.5, qat=spec, compute_dtype="float32", grad_clip=None, int4_update_clip=k, qat_init="grid")
  state = L.create_train_state(jax.random.key(1), CFG, lcfg)
  rules = lcfg.qat_rules
  assert max(quant.grid_residual(state.params, rules).values()) == 0.0
  w0 = jax.tree_util.tree_map(np.asarray, state.params)
  rng = np.random.default_rng(6)
  tokens = jnp.asarray(rng.integers(1, CFG.vocab_size, (4, 8)), jnp.int32)
  batch = L.Rollout(
    tokens=tokens,
    loss_mask=jnp.ones((4, 8), bool).at[:, 0].set(False),
    sampler_logp=jnp.full((4, 8), -4.0),
    advantages=jnp.asarray([1.0, -1.0, 0.5, -0.5]),
    valid=jnp.ones((4, 8), bool),
  )
  state, m = L.train_step(state, batch, model_cfg=CFG, cfg=lcfg)
  assert float(m["skipped"]) == 0
  for name, grp in (("up_proj", "mlp"), ("q_proj", "attn")):
    w_old, w_new = w0["layers"][grp][name]["kernel"], np.asarray(state.params["layers"][grp][name]["kernel"])
    s = np.asarray(quant.quantize(jnp.asarray(w_old), spec, axis=-2).scale).astype(np.float64)  # [L, K/G, N]
    bound = k * np.repeat(s, G, axis=-2)
    moved = np.abs(w_new.astype(np.float64) - w_old)
    assert np.all(moved <= bound * (1 + 1e-6)), name
    assert np.mean(moved >= bound * (1 - 1e-6)) > 0.3, name  # lr 0.5: the clip binds on most weights
  # Unquantized leaves (norms, embeddings) are not clipped.
  emb_move = np.abs(np.asarray(state.params["embed"]["embedding"]) - w0["embed"]["embedding"]).max()
  assert emb_move > 0.1


@pytest.mark.slow
def test_learned_scales_restart_from_the_weights_when_qat_switches_on_late():
  """qat_start_step = 1: before it (α = 0) the learned scales get no gradient and keep their (here stale)
  values; at step 1 train_step re-initialises them from that step's weights (absmax of the compute-dtype
  cast) before its update."""
  lcfg = L.LearnerConfig(lr=1e-6, qat=LSQ, compute_dtype="float32", grad_clip=None, qat_start_step=1)
  state = L.create_train_state(jax.random.key(2), CFG, lcfg)
  stale = jax.tree_util.tree_map_with_path(
    lambda kp, x: 3.0 * x if quant.path_str(kp).endswith("_scale") else x, state.params
  )
  state = state.replace(params=stale)
  rng = np.random.default_rng(7)
  batch = L.Rollout(
    tokens=jnp.asarray(rng.integers(1, CFG.vocab_size, (4, 8)), jnp.int32),
    loss_mask=jnp.ones((4, 8), bool).at[:, 0].set(False),
    sampler_logp=jnp.full((4, 8), -4.0),
    advantages=jnp.asarray([1.0, -1.0, 0.5, -0.5]),
    valid=jnp.ones((4, 8), bool),
  )
  key = ("layers", "attn", "o_proj")
  get = lambda p, leaf: np.asarray(p[key[0]][key[1]][key[2]][leaf])
  s_stale = get(stale, "kernel_scale").copy()
  state, _ = L.train_step(state, batch, model_cfg=CFG, cfg=lcfg)  # step 0: QAT off
  np.testing.assert_array_equal(get(state.params, "kernel_scale"), s_stale)
  w1 = get(state.params, "kernel").copy()
  want = np.asarray(quant.quantize(jnp.asarray(w1), Int4(group_size=G), axis=-2).scale).astype(np.float32)
  state, m = L.train_step(state, batch, model_cfg=CFG, cfg=lcfg)  # step 1: restart, then one (tiny) update
  assert float(m["skipped"]) == 0
  np.testing.assert_allclose(get(state.params, "kernel_scale"), want, rtol=0, atol=2e-6)
  assert np.abs(s_stale - want).max() > 1e-3


def test_learned_scales_are_checkpointed(tmp_path):
  """The learned s, z are part of the state orbax writes: a restore brings them back bit for bit, and the
  restored state serves the same codes (the sync reads them, never the weights)."""
  lcfg = L.LearnerConfig(lr=1e-2, qat=LSQZ, compute_dtype="float32", grad_clip=None)
  state = L.create_train_state(jax.random.key(3), CFG, lcfg)
  moved = jax.tree_util.tree_map_with_path(
    lambda kp, x: (
      x * 1.25 if quant.path_str(kp).endswith("_scale") else (x - 1.0 if quant.path_str(kp).endswith("_zero") else x)
    ),
    state.params,
  )
  state = state.replace(params=moved)
  want = jax.tree_util.tree_map(np.asarray, moved)
  ck = L.Checkpointer(tmp_path / "ckpt", save_every=1)
  ck.save(state)
  ck.close()
  ck = L.Checkpointer(tmp_path / "ckpt", save_every=1)
  target = jax.eval_shape(lambda: L.create_train_state(jax.random.key(9), CFG, lcfg))
  restored = ck.restore_latest(target)
  ck.close()
  for a, b in zip(jax.tree_util.tree_leaves(restored.params), jax.tree_util.tree_leaves(want)):
    np.testing.assert_array_equal(np.asarray(a), b)
  q_a = sampler.serve_params(restored.params, lcfg.qat_rules, dtype=jnp.float32)["layers"]["attn"]["v_proj"]["kernel"]
  q_b = sampler.serve_params(moved, lcfg.qat_rules, dtype=jnp.float32)["layers"]["attn"]["v_proj"]["kernel"]
  np.testing.assert_array_equal(np.asarray(q_a.zero_point), np.asarray(q_b.zero_point))
  np.testing.assert_array_equal(np.asarray(q_a.codes), np.asarray(q_b.codes))
