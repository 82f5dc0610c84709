"""Unit checks of lrl_jax.rl and the learner's rollout preparation: weight sync against the quantization contract,
the buffer, GAE, advantages, the QAE Δ schedule."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from lrl_jax import learner as L
from lrl_jax import models, quant
from lrl_jax.config import load_config
from lrl_jax.learner.config import UNQUANTIZED_DELTA
from lrl_jax.quant.rules import path_str
from lrl_jax.rl import OffPolicyQueue, RolloutBuffer, merge_lora, sync, sync_spec
from lrl_jax.rl import metrics as M
from lrl_jax.rollout import Rollout

QS = "configs/quickstart.yaml"


def _params(hidden=64, inter=128, seed=0):
  cfg = models.ModelConfig(
    arch="qwen2",
    vocab_size=20,
    hidden_size=hidden,
    intermediate_size=inter,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    tie_word_embeddings=True,
  )
  return cfg, models.init_params(cfg, jax.random.PRNGKey(seed), std=0.5)


def _flat(tree):
  return {
    path_str(kp): x
    for kp, x in jax.tree_util.tree_leaves_with_path(tree, is_leaf=lambda x: isinstance(x, quant.QArray))
  }


PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _is_proj(path):
  return path.endswith("/kernel") and any(f"/{p}/" in path for p in PROJ)


@functools.partial(jax.jit, static_argnames=("spec", "dtype"))
def _quantize_cast(kernels, spec, dtype):
  """The contract's quantize of each kernel's `dtype` cast, as one compiled program for the whole dict (op by
  op, every leaf shape would compile a dozen small programs)."""
  return {p: quant.quantize(w.astype(dtype), spec, axis=-2) for p, w in kernels.items()}


@pytest.mark.parametrize(
  "fmt,dtype",
  [("int4", "float32"), ("int4", "bfloat16"), ("fp8", "float32"), ("nvfp4", "float32"), ("mxfp8", "bfloat16")],
)
def test_sync_serves_quantize_of_the_learner_params(fmt, dtype):
  _, params = _params()
  cfg = load_config(QS, [f"quant.sampler={fmt}", "quant.learner=none", f"sampler.dtype={dtype}"])
  served = _flat(sync(params, cfg))
  ref = _flat(params)
  spec = cfg.quant.sampler_spec
  assert set(served) == set(ref)
  want = _quantize_cast({p: w for p, w in ref.items() if _is_proj(p)}, spec, dtype)
  n_q = 0
  for p, w in ref.items():
    s = served[p]
    w_cast = jnp.asarray(w).astype(dtype)
    if _is_proj(p):
      n_q += 1
      assert isinstance(s, quant.QArray), p
      q = want[p]
      np.testing.assert_array_equal(np.asarray(s.codes), np.asarray(q.codes), err_msg=p)
      np.testing.assert_array_equal(np.asarray(s.scale).astype(np.float32), np.asarray(q.scale).astype(np.float32))
    else:
      assert not isinstance(s, quant.QArray), p
      assert s.dtype == jnp.dtype(dtype)
      np.testing.assert_array_equal(np.asarray(s).astype(np.float32), np.asarray(w_cast).astype(np.float32))
  assert n_q == 7


def test_sync_int4_matches_a_float64_reference_of_the_contract():
  """ŵ = q·s, s = bf16(max(amax_group/7, 1e-5)), q = clip(round_half_even(w/s), −7, 7), groups of 32 along K."""
  _, params = _params()
  cfg = load_config(QS, ["sampler.dtype=float32"])
  assert cfg.quant.sampler == "int4" and cfg.quant.group_size == 32
  served = _flat(sync(params, cfg))
  for p, w in _flat(params).items():
    if not _is_proj(p):
      continue
    w = np.asarray(w, np.float64)  # [L, K, N]
    L_, K, N = w.shape
    g = w.reshape(L_, K // 32, 32, N)
    s = np.maximum(np.abs(g).max(axis=2, keepdims=True) / 7, 1e-5)
    s = s.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    q = np.clip(np.round(g / s), -7, 7)  # np.round is round-half-even
    want = (q * s).reshape(L_, K, N)
    got = np.asarray(quant.dequantize(served[p], jnp.float32), np.float64)
    np.testing.assert_array_equal(got, want, err_msg=p)


def test_sync_serves_the_configured_weight_layout():
  """sampler.weight_layout=linear: the same codes and scales as the kn sync, stored [.., N, K] (kernels.qlinear)."""
  _, params = _params()
  kn = _flat(sync(params, load_config(QS, ["sampler.dtype=float32"])))
  cfg = load_config(QS, ["sampler.dtype=float32", "sampler.weight_layout=linear"])
  assert sync_spec(cfg).layout == "linear"
  lin = _flat(sync(params, cfg))
  for p, a in kn.items():
    if _is_proj(p):
      b = lin[p]
      assert b.axis == -1 and b.shape == (*a.shape[:-2], a.shape[-1], a.shape[-2]), p
      np.testing.assert_array_equal(
        np.asarray(quant.dequantize(b)), np.swapaxes(np.asarray(quant.dequantize(a)), -1, -2)
      )
    else:
      np.testing.assert_array_equal(np.asarray(lin[p]), np.asarray(a))


def test_sync_bf16_arm_is_a_plain_cast():
  _, params = _params()
  cfg = load_config("configs/bf16_baseline.yaml")
  spec = sync_spec(cfg)
  assert spec.rules is None and spec.dtype == jnp.bfloat16
  served = _flat(sync(params, cfg))
  for p, w in _flat(params).items():
    assert served[p].dtype == jnp.bfloat16
    np.testing.assert_array_equal(
      np.asarray(served[p]).astype(np.float32), np.asarray(w).astype(ml_dtypes.bfloat16).astype(np.float32)
    )


def test_merge_lora_adds_the_scaled_low_rank_product():
  mcfg, params = _params()
  lcfg = models.LoraConfig(rank=4, alpha=8.0)
  lora = models.init_lora(mcfg, lcfg, jax.random.PRNGKey(1))
  lora = models.Lora(params=jax.tree_util.tree_map(lambda x: x + 0.1, lora.params), config=lcfg)  # B != 0
  merged = merge_lora(params, lora)
  a = np.asarray(lora.params["layers"]["attn"]["q_proj"]["a"], np.float64)
  b = np.asarray(lora.params["layers"]["attn"]["q_proj"]["b"], np.float64)
  w = np.asarray(params["layers"]["attn"]["q_proj"]["kernel"], np.float64)
  want = w + 2.0 * np.einsum("lkr,lrn->lkn", a, b)
  np.testing.assert_allclose(np.asarray(merged["layers"]["attn"]["q_proj"]["kernel"]), want, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(merged["embed"]["embedding"]), np.asarray(params["embed"]["embedding"]))


def _rollouts(B=8, T=6, seed=0, **kw):
  rng = np.random.default_rng(seed)
  mask = np.zeros((B, T), bool)
  mask[:, 3:] = True
  return Rollout(
    tokens=jnp.asarray(rng.integers(0, 20, (B, T)), jnp.int32),
    valid=jnp.ones((B, T), bool),
    loss_mask=jnp.asarray(mask),
    sampler_logp=jnp.asarray(-rng.random((B, T)) * mask, jnp.float32),
    rewards=jnp.asarray(rng.integers(0, 2, B), jnp.float32),
    **kw,
  )


def test_buffer_minibatches_partition_the_rows():
  rb = _rollouts(advantages=jnp.arange(8, dtype=jnp.float32))
  buf = RolloutBuffer(minibatches=2, seed=0)
  buf.put(rb, step=3)
  rows = buf.minibatch_rows()
  assert len(rows) == 2 and all(len(r) == 4 for r in rows)
  assert sorted(np.concatenate(rows).tolist()) == list(range(8))
  for r in rows:
    mb = buf.rollout.take(jnp.asarray(r))  # what train_step(rows=r) gathers on device
    np.testing.assert_array_equal(np.asarray(mb.advantages), r.astype(np.float32))
    np.testing.assert_array_equal(np.asarray(mb.tokens), np.asarray(rb.tokens)[r])
    assert mb.group_size == 1 and mb.old_logp is None
  one = RolloutBuffer(minibatches=1)
  one.put(rb, step=3)
  assert one.minibatch_rows() == [None]  # one minibatch: all rows, no gather


def test_buffer_and_rollout_reject_bad_shapes():
  rb = _rollouts()
  with pytest.raises(ValueError, match="advantages"):
    rb.replace(advantages=jnp.zeros(5)).check()
  with pytest.raises(ValueError, match="rewards"):
    rb.replace(rewards=jnp.zeros(3)).check()
  with pytest.raises(ValueError, match="sampler_logp"):
    rb.replace(sampler_logp=jnp.zeros((8, 7))).check()
  with pytest.raises(ValueError, match="group_size=3"):
    rb.replace(group_size=3).check()
  with pytest.raises(ValueError, match="minibatches"):
    RolloutBuffer(minibatches=3).put(rb, step=0)


def test_off_policy_queue_hands_out_the_previous_sync():
  q = OffPolicyQueue()
  assert q.swap("w0", 0) == ("w0", 0)
  assert q.swap("w1", 1) == ("w0", 0)
  assert q.swap("w2", 2) == ("w1", 1)
  assert q.held == [("w2", 2)] and q.peek() == ("w2", 2)


def test_off_policy_queue_with_staleness_2():
  """Step k generates with the weights of step k − 2 (the first steps: with the first sync's)."""
  q = OffPolicyQueue(2)
  got = [q.swap(f"w{k}", k)[1] for k in range(6)]
  assert got == [0, 0, 0, 1, 2, 3]
  assert q.held == [("w4", 4), ("w5", 5)] and q.peek() == ("w4", 4)  # step 6's weights: version 4
  r = OffPolicyQueue(2)
  r.restore(q.held)  # a resume hands out what the uninterrupted queue would
  assert [r.swap(f"w{k}", k)[1] for k in (6, 7)] == [q.swap(f"w{k}", k)[1] for k in (6, 7)] == [4, 5]
  one = OffPolicyQueue(1)
  one.restore([("w4", 4), ("w5", 5)])  # a resume that lowered run.max_staleness keeps the newest
  assert one.swap("w6", 6) == ("w5", 5)
  with pytest.raises(ValueError, match="staleness must be >= 1; got 0"):
    OffPolicyQueue(0)


def test_rollouts_staler_than_max_staleness_are_dropped_counted_and_regenerated(monkeypatch):
  """A batch generated with weights older than run.max_staleness versions is never trained on: `_Rollouts.get`
  drops it, counts it and generates step k again with step k's own weights."""
  from lrl_jax.rl import loop

  calls = []

  def fake_sample(k, served, version, *args, **kw):
    calls.append((k, served, version))
    return loop._Sampled(roll=served, rewards=None, rstats={}, gen={}, version=version, start=0.0, end=0.0)

  monkeypatch.setattr(loop, "_sample", fake_sample)
  cfg = load_config(QS, ["run.off_policy=true", "run.max_staleness=1"])
  q = OffPolicyQueue(3)  # holds weights 3 versions old: more than the run allows
  q.restore([("w2", 2), ("w3", 3), ("w4", 4)])
  r = loop._Rollouts(None, cfg, queue=q, sample_key=None, pool=None, t_start=0.0, asynchronous=False)
  out = r.get(5, "w5", last=False)
  assert (out.version, out.roll) == (5, "w5") and r.stale_dropped == 1
  assert calls == [(5, "w2", 2), (5, "w5", 5)]
  fresh = loop._Rollouts(
    None, cfg, queue=OffPolicyQueue(1), sample_key=None, pool=None, t_start=0.0, asynchronous=False
  )
  assert fresh.get(0, "w0", last=False).version == 0 and fresh.get(1, "w1", last=False).version == 0
  assert fresh.stale_dropped == 0


def test_group_advantages_match_numpy():
  cfg = load_config(QS).learner
  r = np.array([1, 0, 0, 1, 1, 1, 1, 0], np.float32)
  got = L.group_advantages(r, cfg, group_size=4)
  g = r.reshape(2, 4).astype(np.float64)
  want = (g - g.mean(1, keepdims=True)) / (g.std(1, ddof=1, keepdims=True) + 1e-6)
  np.testing.assert_allclose(got, want.reshape(-1), rtol=1e-5, atol=1e-6)
  cfg = load_config(QS, ["learner.advantage=rloo"]).learner
  want = np.array([[gi - (g[b].sum() - gi) / 3 for gi in g[b]] for b in range(2)]).reshape(-1)
  np.testing.assert_allclose(L.group_advantages(r, cfg, group_size=4), want, rtol=1e-6, atol=1e-6)


def test_gae_targets_match_a_float64_reference():
  """Left-padded prompt (2 pad + 2 prompt), 3 generated tokens then padding; V(s_t) = head at t − 1."""
  cfg = load_config("configs/ppo_baseline.yaml", ["learner.value.lam=0.9", "learner.value.gamma=0.95"])
  B, T = 2, 8
  valid = np.zeros((B, T), bool)
  valid[:, 2:7] = True
  valid[1, 6] = False  # row 1 generates 2 tokens
  mask = valid.copy()
  mask[:, :4] = False
  rng = np.random.default_rng(0)
  values = rng.normal(size=(B, T)).astype(np.float32)
  rewards = np.array([1.0, 0.0], np.float32)
  adv, targets = jax.jit(L.gae_targets, static_argnums=4)(values, rewards, valid, mask, cfg.learner.value)
  raw = np.zeros((B, T))
  ret = np.zeros((B, T))
  for b in range(B):
    ts = np.nonzero(mask[b])[0]
    v = np.array([values[b, t - 1] for t in ts], np.float64)  # predictor of token t is t − 1
    r = np.zeros(len(ts))
    r[-1] = rewards[b]
    a, nxt_v, nxt_a = np.zeros(len(ts)), 0.0, 0.0
    for i in reversed(range(len(ts))):
      delta = r[i] + 0.95 * nxt_v - v[i]
      a[i] = delta + 0.95 * 0.9 * nxt_a
      nxt_v, nxt_a = v[i], a[i]
    raw[b, ts] = a
    ret[b, ts] = a + v
  sel = raw[mask]
  want = np.where(mask, (raw - sel.mean()) / (sel.std() + 1e-8), 0)
  np.testing.assert_allclose(adv, want, rtol=1e-4, atol=1e-5)
  want_t = np.zeros((B, T))  # R_t is the target of the head output that predicts t (slot t − 1 here)
  want_t[:, :-1] = ret[:, 1:] * mask[:, 1:]
  np.testing.assert_allclose(targets, want_t, rtol=1e-5, atol=1e-6)
  want_m = np.zeros((B, T), bool)
  want_m[:, :-1] = mask[:, 1:]
  np.testing.assert_array_equal(L.value_mask(valid, mask), want_m)


def test_gae_on_a_hand_computed_three_token_example():
  """Prompt in slots 0-1, three generated tokens in slots 2-4, outcome reward 1 on the last, γ = 1, λ = 0.5. The head
  output at slot s is V of the state that predicts token s + 1: V(s_2) = v[1] = 0.5, V(s_3) = v[2] = 0.6, V(s_4) =
  v[3] = 0.8 (v[4], after the last token, is a terminal state's and unused). By hand:
  δ_4 = 1 − 0.8 = 0.2, δ_3 = 0.8 − 0.6 = 0.2, δ_2 = 0.6 − 0.5 = 0.1;
  A_4 = 0.2, A_3 = 0.2 + 0.5 · 0.2 = 0.3, A_2 = 0.1 + 0.5 · 0.3 = 0.25;
  R_t = A_t + V(s_t): R_2 = 0.75, R_3 = 0.9, R_4 = 1.0, the targets of v[1], v[2], v[3] (v[1] is V(s_2), the state
  that chooses the first token: it is trained too); whitened A (population std): (0, √1.5, −√1.5)."""
  valid = np.ones((1, 5), bool)
  mask = np.array([[False, False, True, True, True]])
  values = np.array([[0.0, 0.5, 0.6, 0.8, 0.9]], np.float32)
  adv, targets = jax.jit(L.gae_targets, static_argnums=4)(
    values, np.array([1.0], np.float32), valid, mask, L.ValueConfig(gamma=1.0, lam=0.5)
  )
  # f32 arithmetic on values of order 1: a few ulps (1e-7 each); the whitening divides by std = 0.041 (x25)
  np.testing.assert_allclose(targets, [[0.0, 0.75, 0.9, 1.0, 0.0]], rtol=0, atol=1e-6)
  np.testing.assert_allclose(adv, [[0.0, 0.0, 0.0, np.sqrt(1.5), -np.sqrt(1.5)]], rtol=0, atol=1e-5)
  np.testing.assert_array_equal(L.value_mask(valid, mask), [[False, True, True, True, False]])
  raw, _ = jax.jit(L.gae_targets, static_argnums=4)(
    values, np.array([1.0], np.float32), valid, mask, L.ValueConfig(gamma=1.0, lam=0.5, whiten=False)
  )
  np.testing.assert_allclose(raw, [[0.0, 0.0, 0.25, 0.3, 0.2]], rtol=0, atol=1e-6)  # value.whiten=false: A as is


def test_step_mismatch_is_pi_old_vs_mu_on_the_batch():
  from lrl_jax.learner.step import _mismatch

  rng = np.random.default_rng(0)
  old = -rng.random((4, 6)).astype(np.float32)
  mu = (old + 0.1 * rng.normal(size=(4, 6))).astype(np.float32)
  mask = rng.random((4, 6)) < 0.7
  got = jax.jit(_mismatch)(old, mu, mask)
  d = np.abs(np.exp(old.astype(np.float64)) - np.exp(mu.astype(np.float64)))[mask]
  lr = (old.astype(np.float64) - mu)[mask]
  assert float(got["prob_abs_diff_mean"]) == pytest.approx(d.mean(), rel=1e-5)
  assert float(got["prob_abs_diff_max"]) == pytest.approx(d.max(), rel=1e-5)
  assert float(got["kl_k3"]) == pytest.approx(np.mean(np.expm1(lr) - lr), rel=1e-4)


def test_qae_delta_multiplier_follows_the_config_boundaries():
  value = load_config("configs/ppo_qae.yaml").learner.value  # boundaries [20, 40], schedule step
  assert [float(value.delta_multiplier(k)) for k in (0, 19, 20, 39, 40, 100)] == [3, 3, 2, 2, 1, 1]
  const = load_config("configs/ppo_qae.yaml", ["learner.value.schedule=constant"]).learner.value
  assert float(const.delta_multiplier(0)) == 1
  assert float(load_config("configs/ppo_baseline.yaml").learner.value.delta_multiplier(0)) == 1  # unquantized
  assert load_config("configs/ppo_baseline.yaml").learner.value.initial_delta == UNQUANTIZED_DELTA


def test_results_render_tables_and_claims():
  from lrl_jax.rl.experiments import RunSummary, render

  nan = float("nan")

  def run(arm, seed, before, after, mismatch):
    return RunSummary(
      arm=arm,
      seed=seed,
      accuracy_before=before,
      accuracy_after=after,
      smoothness=0.1,
      mismatch_mean=mismatch,
      kl_k3_mean=1e-5,
      acrl_x=nan,
      acrl_y_mean=nan,
      reward_first=0.4,
      reward_last=0.5,
      wall_s=1.0,
    )

  runs = [run("bf16", s, 0.5, a, 3e-3) for s, a in ((0, 0.60), (1, 0.70))]
  runs += [run("int4_qat", s, 0.5, a, 3e-7) for s, a in ((0, 0.605), (1, 0.705))]
  runs += [run("int4_no_qat", 0, 0.2, 0.6, 3e-2)]
  text = render(runs, command="python scripts/results.py --seeds 2", seeds=[0, 1], date="today", setting="tiny")
  assert "Reduced run" in text and "python scripts/results.py --seeds 2" in text
  # bf16 final accuracy: mean 65.0; the bootstrap of two values {60, 70} has quantiles 60 and 70 exactly
  assert "| bf16 rollouts (baseline) | 2 | 50.0 [50.0, 50.0] | 65.0 [60.0, 70.0] | +15.0 [+10.0, +20.0] | — |" in text
  # INT4 QAT is +0.5 points on both seeds: inside ±1 point on every resample, so the claim holds
  assert "within 1 point of bf16**: +0.5 [+0.5, +0.5] points (paired over 2 seeds: 2 higher, 0 lower" in text
  assert "— holds (the interval must lie inside ±1 point)" in text
  # one seed of int4_no_qat: its ratio to INT4 QAT is 3e-2 / 3e-7 = 1e5, log10 = 5.00
  assert "log10 of the per-seed ratio 5.00 — holds" in text
  assert (
    "below 25% (the old plateau): bf16 rollouts (baseline) 0/2, INT4 rollouts + INT4 QAT 0/2, INT4 rollouts, no QAT 1/1"
    in text
  )

  # PPO: the critic's fit table and the band / "helps" claims. ppo − GRPO per seed: −2 and −4 points; a two-seed
  # resample's mean is −2, −3 or −4, so the interval [−4, −2] crosses the band's edge at −3: inconclusive.
  critic = [
    dataclasses.replace(run("ppo", s, 0.5, a, 3e-7), value_mse_last=0.26, reward_var_last=0.24)
    for s, a in ((0, 0.585), (1, 0.665))
  ]
  critic += [
    dataclasses.replace(run("ppo_v0", s, 0.5, a, 3e-7), value_mse_last=1.5, reward_var_last=0.2)
    for s, a in ((0, 0.50), (1, 0.60))
  ]
  text = render(runs + critic, command="c", seeds=[0, 1], date="today", setting="tiny")
  assert "## PPO: how well the critic fits" in text
  row = "| PPO, critic as before (policy's lr, N(0, 1/D) init) | 55.0 [50.0, 60.0] | 1.500 [1.500, 1.500] | 0.200"
  assert row in text
  assert "within 3 points of GRPO** (both INT4 QAT, same warm-up), final accuracy: -3.0 [-4.0, -2.0] points" in text
  assert "inconclusive at 95% (the interval must lie inside ±3)" in text
  assert "critic lr 1e-3, zero init) vs the critic as before, final accuracy: +7.5 [+6.5, +8.5] points" in text


def test_sync_reshards_onto_the_sampler_mesh():
  from jax.sharding import AxisType, NamedSharding

  _, params = _params()
  cfg = load_config(QS)
  mesh = jax.make_mesh((2, 4), ("data", "tensor"), axis_types=(AxisType.Auto,) * 2, devices=jax.devices()[:8])
  timings = {}
  served = _flat(sync(params, cfg, mesh=mesh, timings=timings))
  plain = _flat(sync(params, cfg))
  assert timings["sync_s"] > 0
  q = served["layers/mlp/up_proj/kernel"]  # [L, D, F]: F (mlp) over `tensor`
  assert isinstance(q.codes.sharding, NamedSharding) and q.codes.sharding.mesh.shape == mesh.shape
  assert q.codes.sharding.spec[-1] == "tensor"
  for p in plain:
    a, b = served[p], plain[p]
    if isinstance(a, quant.QArray):
      a, b = a.codes, b.codes
    np.testing.assert_array_equal(np.asarray(a).astype(np.float32), np.asarray(b).astype(np.float32))


def test_wilson_interval_matches_scipy():
  """rl.metrics.wilson_interval against scipy's binomtest(...).proportion_ci(method="wilson")."""
  from scipy.stats import binomtest  # noqa: PLC0415  (test-only reference)

  for k, n in [(0, 32), (3, 32), (16, 32), (32, 32), (77, 256), (1, 1)]:
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    lo, hi = M.wilson_interval(k, n)
    assert lo == pytest.approx(ci.low, abs=1e-12) and hi == pytest.approx(ci.high, abs=1e-12)
  with pytest.raises(ValueError, match="successes"):
    M.wilson_interval(5, 4)


def test_timeline_overlap_of_a_hand_made_timeline():
  """Three steps. Window: end of step 0's learning (t=4) to the last learning end (t=12). Sampler busy [4, 6) for
  step 1 (its [3, 6) clipped) and [6, 9) for step 2; learner [5, 8) and [9, 12). Both busy: [5, 6) + [6, 8) = 3 s of
  8 s; the sampler 5 s, the learner 6 s; 2 steps in the window, 4 s each."""
  t = [(0, 2, 2, 4), (3, 6, 5, 8), (6, 9, 9, 12)]
  recs = [
    {"phase": "rl", "time/sample_start": a, "time/sample_end": b, "time/learn_start": c, "time/learn_end": d}
    for a, b, c, d in t
  ]
  got = M.timeline_overlap(recs)
  assert got == pytest.approx(
    {"overlap_frac": 3 / 8, "sampler_busy_frac": 5 / 8, "learner_busy_frac": 6 / 8, "step_s": 4.0, "steps": 2},
    rel=1e-12,
  )
  assert np.isnan(M.timeline_overlap(recs[:1])["overlap_frac"])  # nothing after the compiling step
