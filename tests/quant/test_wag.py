"""NVFP4 W/A/G (`quant.nvfp4_wag_matmul`, `quant.NVFP4WAG`) against float64 NumPy references written here.

The references compute the contract's scales in float32 (IEEE, as XLA; e4m3 / e2m1 casts through ml_dtypes, round
to nearest even) so that codes compare bit for bit, stochastic rounding in float64 from the same uniforms
(`quant.wag_draws`), the Hadamard transform and the GEMMs in float64. GEMM tolerance: the f32 accumulation bound
(K + 2)·ε₃₂·Σ|a||b| times the tensor scales (K products summed, two scale multiplications; ε₃₂ = 2^-23).
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from lrl_jax import learner as L
from lrl_jax import models, quant, sampler
from lrl_jax.models import decoder

F32 = np.float32
EPS32 = 2.0**-23
GRID = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float64)  # E2M1 magnitudes


# --------------------------------------------------------------------------- references


def np_hadamard16():
  h = np.array([[1.0]])
  for _ in range(4):
    h = np.kron(np.array([[1.0, 1.0], [1.0, -1.0]]), h)
  return h / 4.0


def np_sr(v, u):
  """float64 stochastic rounding onto the E2M1 grid: up with probability (|v| − lo)/(hi − lo)."""
  a = np.abs(np.asarray(v, np.float64))
  i = np.clip(np.searchsorted(GRID, a, side="right") - 1, 0, 7)
  lo, hi = GRID[i], GRID[np.minimum(i + 1, 7)]
  p = np.where(hi > lo, (a - lo) / np.where(hi > lo, hi - lo, 1.0), 0.0)
  return np.sign(v) * np.where(np.asarray(u, np.float64) < p, hi, lo)


def np_nvfp4(x, axis, u=None, tile=False):
  """NVFP4 of a matrix in blocks of 16 along `axis` (0 or 1): (m = e2m1·s_b float64, dec).

  enc = 2688/amax, dec = 1/enc, s_b = e4m3(min(amax_16·enc/6, 448)) (tile: amax over the 16x16 tile),
  q = e2m1(clip(x/(s_b·dec), ±6)) rounded to nearest even, or stochastically with the uniforms u."""
  x = np.asarray(x, F32)
  amax = np.abs(x).max()
  enc = F32(2688) / amax if amax > 0 else F32(1)
  dec = F32(1) / enc
  xm = np.moveaxis(x, axis, -1)  # blocks along the last axis
  r, c = xm.shape
  xg = xm.reshape(r, c // 16, 16)
  bamax = np.abs(xg).max(-1, keepdims=True)
  if tile:
    t = bamax.reshape(r // 16, 16, c // 16, 1).max(1, keepdims=True)
    bamax = np.broadcast_to(t, (r // 16, 16, c // 16, 1)).reshape(r, c // 16, 1)
  sb = np.minimum(bamax * enc / F32(6), F32(448)).astype(ml_dtypes.float8_e4m3fn).astype(F32)
  denom = sb * dec
  with np.errstate(invalid="ignore", divide="ignore"):
    v = np.where(denom > 0, np.clip(xg / np.where(denom > 0, denom, F32(1)), -6, 6), 0).astype(F32)
  if u is None:
    q = v.astype(ml_dtypes.float4_e2m1fn).astype(np.float64)
  else:
    q = np_sr(v, np.moveaxis(np.asarray(u), axis, -1).reshape(v.shape))
  m = (q * sb.astype(np.float64)).reshape(r, c)
  return np.moveaxis(m, -1, axis), float(dec)


def np_rht(x, signs):
  """float64 blockdiag(H·diag(signs)) along axis 0 (tokens)."""
  hd = np_hadamard16() * np.asarray(signs, np.float64)[None, :]
  m = x.shape[0]
  return np.einsum("ij,bjc->bic", hd, np.asarray(x, np.float64).reshape(m // 16, 16, -1)).reshape(x.shape)


def np_wag(x2, w, dy, draws, *, rht, sr, act_scale="tensor"):
  """(y, dx, dW, bounds) of the recipe in float64 on the reference quantizations (act_scale "token": the forward's
  x quantized row by row, each row its own per-tensor scale)."""
  x2, w, dy = (np.asarray(a, np.float64) for a in (x2, w, dy))
  m, k = x2.shape
  if act_scale == "token":
    rows = [np_nvfp4(r[None, :], 1) for r in x2]
    xm, dec_x = np.concatenate([r[0] for r in rows]), np.array([r[1] for r in rows])[:, None]
  else:
    xm, dec_x = np_nvfp4(x2, 1)
  wm, dec_w = np_nvfp4(w, 0, tile=True)
  y = xm @ wm * dec_w * dec_x
  by = (k + 2) * EPS32 * (np.abs(xm) @ np.abs(wm)) * dec_w * dec_x
  dym, dec_dy = np_nvfp4(dy, 1, u=draws["u_dgrad"] if sr else None)
  dx = dym @ wm.T * dec_w * dec_dy
  bdx = (w.shape[1] + 2) * EPS32 * (np.abs(dym) @ np.abs(wm).T) * dec_w * dec_dy
  mp = -(-m // 16) * 16
  xp, dyp = np.zeros((mp, k)), np.zeros((mp, dy.shape[1]))
  xp[:m], dyp[:m] = x2, dy
  if rht:
    xp, dyp = np_rht(xp, draws["signs"]), np_rht(dyp, draws["signs"])
    # The test inputs are multiples of 2^-6 below 4 in magnitude: the transform is exact in float32 too.
    assert np.array_equal(xp.astype(F32), xp) and np.array_equal(dyp.astype(F32), dyp)
  xq, dec_xr = np_nvfp4(xp, 0)
  dyq, dec_dyr = np_nvfp4(dyp, 0, u=draws["u_wgrad"] if sr else None)
  dw = xq.T @ dyq * dec_dyr * dec_xr
  bdw = (mp + 2) * EPS32 * (np.abs(xq).T @ np.abs(dyq)) * dec_dyr * dec_xr
  return (y, by), (dx, bdx), (dw, bdw)


def grid_values(key, shape, scale=1.0):
  """Normal values rounded to multiples of 2^-6 in [−4, 4] (so that the Hadamard transform is exact in f32)."""
  return jnp.clip(jnp.round(jax.random.normal(key, shape) * scale * 64) / 64, -4, 4)


def _wag_vjp(x, w, dy, key, rht, sr, act_scale):
  y, vjp = jax.vjp(lambda a, b: quant.nvfp4_wag_matmul(a, b, key, rht=rht, sr=sr, act_scale=act_scale), x, w)
  return (y, *vjp(dy))


_wag_vjp_jit = jax.jit(_wag_vjp, static_argnames=("rht", "sr", "act_scale"))


def run_wag(x, w, dy, key, *, rht=True, sr=True, act_scale="tensor", jit=False):
  """(y, dx, dW) of the layer; every array an argument (nothing constant-folded), one compile per shape."""
  return (_wag_vjp_jit if jit else _wag_vjp)(x, w, dy, key, rht=rht, sr=sr, act_scale=act_scale)


def assert_within(got, want_bound, what):
  want, bound = want_bound
  err = np.abs(np.asarray(got, np.float64) - want)
  assert np.all(err <= bound + 1e-30), f"{what}: max excess {np.max(err - bound)}"


# --------------------------------------------------------------------------- primitives


def test_sr_is_unbiased_and_picks_a_neighbour():
  mags = np.concatenate([GRID, [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], [0.1, 0.6, 1.9, 2.2, 3.9, 4.4, 5.9]])
  v = np.concatenate([mags, -mags]).astype(F32)
  n = 20000
  u = jax.random.uniform(jax.random.PRNGKey(7), (n, v.size), jnp.float32)
  q = np.asarray(quant.sr_e2m1(jnp.asarray(v)[None, :], u), np.float64)
  a = np.abs(v.astype(np.float64))
  i = np.clip(np.searchsorted(GRID, a, side="right") - 1, 0, 7)
  lo, hi = GRID[i], GRID[np.minimum(i + 1, 7)]
  lo, hi = np.sign(v) * lo, np.sign(v) * np.where(a == 6, 6, hi)
  assert np.all((q == lo) | (q == hi)), "a draw that is not one of the two neighbouring grid values"
  step = np.abs(hi - lo)
  p = np.where(step > 0, np.abs(v - lo) / np.where(step > 0, step, 1), 0)
  se = step * np.sqrt(p * (1 - p) / n)  # standard error of the mean of n draws in {lo, hi}
  # 5 standard errors (two-sided 6e-7 per value), plus the 2^-24 granularity of the uniforms.
  err = np.abs(q.mean(0) - v)
  assert np.all(err <= 5 * se + step * 2.0**-23), f"biased: {err.max()} (bound {(5 * se).max()})"
  assert np.all(err[p == 0] == 0)  # grid points (0 and ±6 included) are never moved


def test_blocks_match_reference_rne_sr_and_tiles():
  key = jax.random.PRNGKey(1)
  x = jax.random.normal(key, (48, 64)) * jnp.exp(jax.random.normal(jax.random.PRNGKey(2), (48, 1)))
  u = jax.random.uniform(jax.random.PRNGKey(3), x.shape)
  for axis, np_axis in ((-1, 1), (-2, 0)):
    for uu in (None, u):
      m, dec = quant.nvfp4_blocks(x, axis=axis, u=uu)
      want, wdec = np_nvfp4(np.asarray(x), np_axis, u=None if uu is None else np.asarray(uu))
      assert float(dec) == wdec and np.array_equal(np.asarray(m, np.float64), want), (axis, uu is None)
  m, dec = quant.nvfp4_blocks(x, axis=-2, tile=True)
  want, wdec = np_nvfp4(np.asarray(x), 0, tile=True)
  assert float(dec) == wdec and np.array_equal(np.asarray(m, np.float64), want)


def test_weight_tiles_read_the_same_along_k_and_n():
  w = jax.random.normal(jax.random.PRNGKey(4), (2, 64, 48)) * jnp.linspace(0.01, 3, 48)[None, None, :]
  q_kn = quant.quantize(w, quant.NVFP4WAG(), axis=-2)
  q_nk = quant.quantize(jnp.swapaxes(w, -1, -2), quant.NVFP4WAG(), axis=-1)
  assert q_kn.spec == quant.NVFP4() and q_kn.shape == w.shape  # served as plain NVFP4
  a, b = quant.dequantize(q_kn), jnp.swapaxes(quant.dequantize(q_nk), -1, -2)
  assert np.array_equal(np.asarray(a), np.asarray(b))  # bit for bit
  assert np.array_equal(np.asarray(quant.fake_quant(w, quant.NVFP4WAG(), axis=-2)), np.asarray(a))
  s = np.asarray(q_kn.scale.astype(jnp.float32))  # [2, K/16, N]: constant over each tile's 16 columns
  assert np.array_equal(s, np.repeat(s[..., ::16], 16, axis=-1))
  with pytest.raises(ValueError, match="16x16"):
    quant.quantize(jnp.ones((32, 40)), quant.NVFP4WAG(), axis=-2)


def test_hadamard_orthogonal_and_rht_cancels_in_wgrad():
  h = quant.hadamard16().astype(np.float64)
  assert np.array_equal(h, np_hadamard16())
  assert np.max(np.abs(h.T @ h - np.eye(16))) <= 16 * EPS32  # exact here: entries ±1/4
  signs = jax.random.rademacher(jax.random.PRNGKey(5), (16,), jnp.float32)
  x, dy = grid_values(jax.random.PRNGKey(6), (32, 24)), grid_values(jax.random.PRNGKey(7), (32, 16))
  xr, dyr = quant.rht(x, signs), quant.rht(dy, signs)
  assert np.array_equal(np.asarray(xr, np.float64), np_rht(np.asarray(x), np.asarray(signs)))  # exact inputs
  # Inverse: (H·D)ᵀ = D·H undoes it exactly.
  back = np_rht_inverse(np.asarray(xr, np.float64), np.asarray(signs))
  assert np.array_equal(back, np.asarray(x, np.float64))
  # Quantization-free wgrad: (T x)ᵀ (T dy) = xᵀ dy (float64 products of the exact transforms).
  got = np.asarray(xr, np.float64).T @ np.asarray(dyr, np.float64)
  want = np.asarray(x, np.float64).T @ np.asarray(dy, np.float64)
  assert np.max(np.abs(got - want)) <= 32 * 2.0**-52 * np.max(np.abs(x).T @ np.abs(dy))
  # And on general f32 inputs the f32 transform keeps the product within its rounding bound.
  xg, dg = jax.random.normal(jax.random.PRNGKey(8), (32, 8)), jax.random.normal(jax.random.PRNGKey(9), (32, 8))
  g = np.asarray(quant.rht(xg, signs), np.float64).T @ np.asarray(quant.rht(dg, signs), np.float64)
  w64 = np.asarray(xg, np.float64).T @ np.asarray(dg, np.float64)
  bound = 2 * 16 * EPS32 * (np.abs(np.asarray(xg)).T @ np.abs(np.asarray(dg))) * 4  # 16-term sums, |H·D| rows sum 4
  assert np.all(np.abs(g - w64) <= bound)


def np_rht_inverse(y, signs):
  hd = np_hadamard16() * np.asarray(signs, np.float64)[None, :]
  m = y.shape[0]
  return np.einsum("ji,bjc->bic", hd, y.reshape(m // 16, 16, -1)).reshape(y.shape)


# --------------------------------------------------------------------------- the layer


@pytest.mark.parametrize("rht,sr,act_scale", [(True, True, "tensor"), (False, False, "tensor"), (True, False, "token")])
def test_forward_dgrad_wgrad_match_reference(rht, sr, act_scale):
  """x [2, 10, 32] (M = 20: the wgrad pads to 32 rows), W [32, 48]; every GEMM against float64 of the same draws."""
  key = jax.random.PRNGKey(11)
  x = grid_values(jax.random.PRNGKey(12), (2, 10, 32))
  w = jax.random.normal(jax.random.PRNGKey(13), (32, 48)) * 0.1
  dy = grid_values(jax.random.PRNGKey(14), (2, 10, 48), 0.5)
  y, dx, dw = run_wag(x, w, dy, key, rht=rht, sr=sr, act_scale=act_scale, jit=True)
  assert y.dtype == x.dtype and dx.dtype == x.dtype and dw.dtype == w.dtype
  draws = {k: None if v is None else np.asarray(v) for k, v in quant.wag_draws(key, 20, 48).items()}
  ry, rdx, rdw = np_wag(
    np.asarray(x).reshape(20, 32),
    np.asarray(w),
    np.asarray(dy).reshape(20, 48),
    draws,
    rht=rht,
    sr=sr,
    act_scale=act_scale,
  )
  assert_within(np.asarray(y).reshape(20, 48), ry, "forward")
  assert_within(np.asarray(dx).reshape(20, 32), rdx, "dgrad")
  assert_within(np.asarray(dw), rdw, "wgrad")


@pytest.mark.slow  # the eager run dispatches every op on its own (~25 s here): `make test-slow`
def test_jit_equals_eager_bit_for_bit():
  """jit == eager bit for bit (`_gemm` materializes its operands, so XLA runs the same dots). dy and the key are
  arguments: closed over, XLA constant-folds dy's quantization at compile time and its dec came out an ulp apart."""
  key = jax.random.PRNGKey(11)
  x = grid_values(jax.random.PRNGKey(12), (2, 10, 32))
  w = jax.random.normal(jax.random.PRNGKey(13), (32, 48)) * 0.1
  dy = grid_values(jax.random.PRNGKey(14), (2, 10, 48), 0.5)
  y, dx, dw = run_wag(x, w, dy, key, rht=True, sr=True, jit=True)
  ey, edx, edw = run_wag(x, w, dy, key, rht=True, sr=True)
  for a, b, n in ((y, ey, "y"), (dx, edx, "dx"), (dw, edw, "dW")):
    assert np.array_equal(np.asarray(a), np.asarray(b)), n


def test_sr_and_rht_change_only_the_backward_and_follow_the_key():
  x = grid_values(jax.random.PRNGKey(20), (24, 32))
  w = jax.random.normal(jax.random.PRNGKey(21), (32, 16)) * 0.1
  dy = grid_values(jax.random.PRNGKey(22), (24, 16))
  a = run_wag(x, w, dy, jax.random.PRNGKey(1), jit=True)
  b = run_wag(x, w, dy, jax.random.PRNGKey(2), jit=True)
  c = run_wag(x, w, dy, jax.random.PRNGKey(1), jit=True)
  assert np.array_equal(a[0], b[0])  # the forward is RNE only
  assert not np.array_equal(a[2], b[2])  # new draws, new gradient
  assert all(np.array_equal(p, q) for p, q in zip(a, c))  # deterministic in the key


def test_gradients_finite_under_masks():
  w = jax.random.normal(jax.random.PRNGKey(30), (32, 16))
  x = grid_values(jax.random.PRNGKey(31), (24, 32)).at[3:17].set(0.0)  # masked rows
  for xx, dy in (
    (x, grid_values(jax.random.PRNGKey(32), (24, 16)).at[5:20].set(0.0)),
    (jnp.zeros((24, 32)), jnp.zeros((24, 16))),  # amax 0 everywhere: enc = 1, zero codes
  ):
    y, dx, dw = run_wag(xx, w, dy, jax.random.PRNGKey(33), jit=True)
    assert all(bool(jnp.all(jnp.isfinite(t))) for t in (y, dx, dw))
  assert not np.any(np.asarray(y)) and not np.any(np.asarray(dx)) and not np.any(np.asarray(dw))
  wz = jnp.zeros((32, 16))
  y, dx, dw = run_wag(x, wz, jnp.ones((24, 16)), jax.random.PRNGKey(34), jit=True)
  assert all(bool(jnp.all(jnp.isfinite(t))) for t in (y, dx, dw)) and not np.any(np.asarray(dx))


# --------------------------------------------------------------------------- decoder, learner, sampler

MC = models.ModelConfig(
  arch="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, num_kv_heads=1,
  dtype="float32",
)  # fmt: skip
KERNELS = ("attn/q_proj", "attn/k_proj", "attn/v_proj", "attn/o_proj", "mlp/gate_proj", "mlp/up_proj", "mlp/down_proj")


def _get(tree, path):
  for k in path.split("/"):
    tree = tree[k]
  return tree


@pytest.fixture(scope="module")
def tiny():
  params = models.init_params(MC, jax.random.PRNGKey(0), std=0.1)
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 9), 0, MC.vocab_size)
  return params, tokens


def test_decoder_forward_grad_and_served_w4a4(tiny):
  params, tokens = tiny
  num = decoder.Numerics(qat_rules=quant.QuantRules.default(quant.NVFP4WAG()), key=jax.random.PRNGKey(3))
  run = jax.jit(lambda p, n, t: models.forward(p, t, MC, numerics=n)[0])
  fwd = lambda p, n: run(p, n, tokens)  # noqa: E731  (tokens an argument: nothing constant-folded)
  loss = lambda p, t: (lambda z: (jnp.mean(jax.nn.log_softmax(z)[..., 0]), z))(  # noqa: E731
    models.forward(p, t, MC, numerics=num)[0]
  )
  (_, lg), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(params, tokens)  # one compile: π and its gradient
  assert bool(jnp.all(jnp.isfinite(lg))) and all(bool(jnp.all(jnp.isfinite(t))) for t in jax.tree_util.tree_leaves(g))
  # The sampler serves the forward's Ŵ: its QArrays dequantize bit for bit to the 16x16-tiled weights.
  served = sampler.serve_params(params, quant.NVFP4WAG(), dtype=jnp.float32)
  ws = {n: _get(params["layers"], n)["kernel"] for n in KERNELS}  # [L, K, N]: the forward sees layer i's slice
  per_layer = jax.jit(
    lambda ws: {n: jax.vmap(lambda w: quant.nvfp4_blocks(w, axis=-2, tile=True))(v) for n, v in ws.items()}
  )
  for name, (m, dec) in per_layer(ws).items():
    q = _get(served["layers"], name)["kernel"]
    assert np.array_equal(np.asarray(quant.dequantize(q, global_scale=False)), np.asarray(m)), name
    assert np.array_equal(np.asarray(q.global_scale), np.asarray(dec)), name
  # W4A4 served forward (NVFP4 activations 1x16, one scale per call) of the same tokens: the learner's forward, bit
  # for bit, both jitted (op by op, XLA:CPU fuses the attention differently: an ulp or so apart).
  w4a4 = fwd(served, decoder.Numerics(act_spec=quant.NVFP4()))
  assert np.array_equal(np.asarray(w4a4), np.asarray(lg))
  # keep_last_layers = k: layers L − k … L − 1 off (a plain dot in the compute dtype), each layer its own key.
  rules = quant.QuantRules.default(quant.NVFP4WAG(), keep_last_layers=1)
  specs = decoder._qat_specs(rules, params, None, jax.random.PRNGKey(3))
  per_layer = [decoder._layer_specs(specs, jnp.int32(i), MC.num_layers) for i in range(MC.num_layers)]
  assert [bool(p["on"]) for p in per_layer] == [True, False]
  assert not np.array_equal(jax.random.key_data(per_layer[0]["key"]), jax.random.key_data(per_layer[1]["key"]))
  with pytest.raises(ValueError, match="keep_last_layers"):
    models.forward(
      params,
      tokens,
      MC,
      numerics=decoder.Numerics(qat_rules=quant.QuantRules.default(quant.NVFP4(), keep_last_layers=1)),
    )


def test_config_names_the_spec():
  from lrl_jax.config import QuantSection

  q = QuantSection(learner="nvfp4_wag", sampler="nvfp4", act="nvfp4")
  assert q.learner_spec == quant.NVFP4WAG() and q.sampler_spec == quant.NVFP4WAG()
  assert q.act_spec == quant.NVFP4WAG()  # W4A4 rollouts quantize activations as the W/A/G forward does
  tok = QuantSection(learner="nvfp4_wag", sampler="nvfp4", act="nvfp4", wag_act_scale="token", wag_sr=False)
  assert tok.act_spec == tok.learner_spec == quant.NVFP4WAG(sr=False, act_scale="token")
  assert QuantSection(learner="nvfp4", sampler="nvfp4", act="nvfp4").act_spec == quant.NVFP4()  # plain W4A4
  assert L.LearnerConfig(qat=q.learner_spec).qat_rules.spec_for("layers/mlp/up_proj/kernel") == quant.NVFP4WAG()
  with pytest.raises(Exception, match="nvfp4"):
    QuantSection(learner="nvfp4_wag", sampler="int4")
  with pytest.raises(Exception, match="qat_start_step"):
    L.LearnerConfig(qat=quant.NVFP4WAG(), qat_start_step=2)


def test_keep_last_layers_from_the_run_config():
  """`quant.wag_keep_last_layers: k` reaches the learner's QAT rules (the last k layers in the compute dtype); refused
  for any other learner format, naming the key."""
  from lrl_jax.config import load_config

  wag = ["quant.learner=nvfp4_wag", "quant.sampler=nvfp4"]
  c = load_config("configs/quickstart.yaml", wag + ["quant.wag_keep_last_layers=1"])
  assert c.learner.qat_rules.keep_last_layers == 1 and c.learner.qat_keep_last_layers == 1
  assert load_config("configs/quickstart.yaml", wag).learner.qat_rules.keep_last_layers == 0
  with pytest.raises(Exception, match="wag_keep_last_layers"):
    load_config("configs/quickstart.yaml", ["quant.wag_keep_last_layers=1"])
  with pytest.raises(Exception, match="qat_keep_last_layers"):
    L.LearnerConfig(qat=quant.NVFP4(), qat_keep_last_layers=1)


def test_learner_seeds_the_backward_per_step():
  from lrl_jax.learner.step import _numerics

  cfg = L.LearnerConfig(qat=quant.NVFP4WAG())
  k1, k2 = (np.asarray(_numerics(cfg, None, jnp.int32(s)).key) for s in (1, 2))
  assert not np.array_equal(k1, k2) and np.array_equal(k1, np.asarray(_numerics(cfg, None, 1).key))
  assert _numerics(L.LearnerConfig(qat=quant.NVFP4()), None, 1).key is None  # other formats draw nothing


@pytest.mark.slow  # three generate + learner compiles (~35 s here): `make test-slow`
def test_measure_w4a4_mismatch(tiny):
  """|π − μ| of a tiny random model: W4A4 served vs the W/A/G learner, and NVFP4 W4A16 vs its QAT. Printed."""
  params, _ = tiny
  mc = MC.replace(dtype="bfloat16")
  prompts = jax.random.randint(jax.random.PRNGKey(2), (8, 6), 0, MC.vocab_size)
  sampling = sampler.SamplingConfig(temperature=1.0, max_new_tokens=8)
  out = {}
  tok = quant.NVFP4WAG(act_scale="token")
  for name, spec, act, qat in (
    ("W4A4 (W/A/G learner, per-tensor activation scale)", quant.NVFP4WAG(), quant.NVFP4(), quant.NVFP4WAG()),
    ("W4A4 (W/A/G learner, per-token activation scale)", tok, tok, tok),
    ("W4A16 (NVFP4 QAT learner)", quant.NVFP4(), None, quant.NVFP4()),
  ):
    served = sampler.serve_params(params, spec, dtype=jnp.bfloat16)
    r = sampler.generate(served, prompts, None, mc, sampling, jax.random.PRNGKey(3), group_size=2, act_spec=act)
    pi = L.token_logprobs(params, r, MC, cfg=L.LearnerConfig(compute_dtype="bfloat16", qat=qat))
    m = np.asarray(r.loss_mask, bool)
    d = np.abs(np.asarray(pi, np.float64) - np.asarray(r.sampler_logp, np.float64))[m]
    out[name] = (d.mean(), d.max())
    assert np.all(np.isfinite(d))
  for k, (mean, mx) in out.items():
    print(f"|pi - mu| {k}: mean {mean:.3e}, max {mx:.3e}")
