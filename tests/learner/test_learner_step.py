"""train_step: loss vs a float64 NumPy PPO, micro-batching == full batch, sharded (2,2,2) == one device,
NaN guard, LoRA-only, value head, ACRL state, config validation."""

import jax
import jax.extend as jex
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _learner_util import (
  B,
  T,
  _forward,
  assert_update_close,
  host,
  make_batch,
  max_abs_diff,
  np_token_logprobs,
  tiny_cfg,
)

from lrl_jax import learner as L
from lrl_jax import models, quant

KEY = jax.random.PRNGKey(0)
MC = tiny_cfg()


def _state(cfg, **kw):
  return L.create_train_state(KEY, MC, cfg, **kw)


def _np_ppo_tis(logp, batch, cfg):
  """float64 PPO-clip with token TIS weights, token-mean (Schulman 2017; Yao et al. 2025)."""
  m = np.asarray(batch.loss_mask, bool)
  old = np.asarray(batch.old_logp, np.float64)
  mu = np.asarray(batch.sampler_logp, np.float64)
  a = np.broadcast_to(np.asarray(batch.advantages, np.float64)[:, None], m.shape)
  r = np.exp(logp - old)
  surr = np.minimum(r * a, np.clip(r, 1 - 0.2, 1 + 0.28) * a)  # clip_eps None: ppo_loss's defaults 0.2 / 0.28
  w = np.minimum(np.exp(old - mu), cfg.correction.clip_c)
  return float(np.sum(np.where(m, -w * surr, 0.0)) / m.sum())


def _np_logp(params, batch):
  logits, _ = _forward(params, batch.tokens, MC.replace(dtype="float32"), valid_BT=batch.valid)
  return np_token_logprobs(np.asarray(logits), np.asarray(batch.tokens), np.asarray(batch.valid))


CFG = L.LearnerConfig(lr=1e-3, compute_dtype="float32", correction=L.CorrectionConfig(method="tis"), micro_batches=1)


@pytest.fixture(scope="module")
def full_batch_run():
  """One step on the full batch (M = 1): the reference of the micro-batch and sharded tests."""
  state = _state(CFG)
  p0 = host(state.params)
  batch = make_batch(0, MC, state.params)
  new, metrics = L.train_step(state, batch, model_cfg=MC, cfg=CFG)
  return p0, batch, host(new.params), host(new.opt_state), {k: float(v) for k, v in metrics.items()}


def test_loss_matches_numpy_ppo_with_tis(full_batch_run):
  p0, batch, _, _, metrics = full_batch_run
  want = _np_ppo_tis(_np_logp(p0, batch), batch, CFG)
  assert metrics["loss"] == pytest.approx(want, rel=1e-5, abs=1e-6)  # f32 forward vs f64 reference
  assert 0 < metrics["clip_frac_low"] + metrics["clip_frac_high"] < 1  # the clip is exercised
  assert metrics["skipped"] == 0 and metrics["lr"] == pytest.approx(CFG.lr)
  for k in (
    "prob_abs_diff_mean",
    "prob_abs_diff_max",
    "log_abs_diff_mean",
    "kl_k1",
    "kl_k3",
    "log_ppl_ratio",
    "ess_token",
    "pearson_logp",
    "nonfinite_frac",
  ):
    assert f"mismatch/{k}" in metrics
  m = np.asarray(batch.loss_mask, bool)
  d = np.abs(np.exp(_np_logp(p0, batch)) - np.exp(np.asarray(batch.sampler_logp, np.float64)))
  assert metrics["mismatch/prob_abs_diff_mean"] == pytest.approx(d[m].mean(), rel=1e-5)
  w = np.minimum(np.exp(np.asarray(batch.old_logp, np.float64) - np.asarray(batch.sampler_logp, np.float64)), 2.0)
  assert metrics["correction/weight_mean"] == pytest.approx(w[m].mean(), rel=1e-5)


@pytest.mark.parametrize("micro", [pytest.param(2, marks=pytest.mark.slow), 4])
def test_micro_batches_equal_full_batch(full_batch_run, micro):
  """Summed micro-batch losses / grads with the global denominator == the full batch (f32 reordering only)."""
  p0, batch, p1, opt1, m1 = full_batch_run
  cfg = CFG.replace(micro_batches=micro)
  state = _state(cfg)
  new, metrics = L.train_step(state, batch, model_cfg=MC, cfg=cfg)
  assert metrics["loss"] == pytest.approx(m1["loss"], rel=1e-6, abs=1e-7)
  assert float(metrics["grad_norm"]) == pytest.approx(m1["grad_norm"], rel=1e-5)
  for k in (
    "pg_loss",
    "clip_frac_low",
    "clip_frac_high",
    "approx_kl",
    "ratio_mean",
    "ratio_max",
    "entropy",
    "mismatch/kl_k3",
    "mismatch/pearson_logp",
    "correction/ess_token",
  ):
    assert float(metrics[k]) == pytest.approx(m1[k], rel=1e-5, abs=1e-7), k
  assert_update_close(host(new.params), host(new.opt_state), p1, opt1)


@pytest.mark.slow
def test_qat_step_sees_the_served_int4_weights():
  """bf16 compute + INT4 QAT: π in the step equals the log-probs of the served INT4 tree (codes of the
  bf16 cast of the masters, matmuls through kernels.qmatmul): every mismatch metric is exactly zero."""
  spec = quant.Int4(group_size=32)
  cfg = CFG.replace(compute_dtype="bfloat16", qat=spec, correction=L.CorrectionConfig())
  state = _state(cfg)
  batch = make_batch(6, MC, state.params)
  cast = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), state.params)
  served = quant.quantize_params(cast, quant.QuantRules.default(spec))
  mu = L.token_logprobs(served, batch, MC, cfg=L.LearnerConfig(compute_dtype="bfloat16"))
  state, m = L.train_step(state, batch.replace(sampler_logp=mu), model_cfg=MC, cfg=cfg)
  assert float(m["skipped"]) == 0
  for k in ("prob_abs_diff_max", "log_abs_diff_mean", "kl_k1", "kl_k3", "log_ppl_ratio"):
    assert float(m[f"mismatch/{k}"]) == 0.0, k
  assert float(m["mismatch/ess_token"]) == pytest.approx(1.0)


@pytest.mark.slow
def test_gspo_seq_mean_micro_batches():
  """Sequence-level aggregation too: M = 2 equals M = 1."""
  out = []
  for micro in (1, 2):
    cfg = L.LearnerConfig(
      lr=1e-3,
      compute_dtype="float32",
      policy_loss="gspo",
      clip_eps_low=0.05,
      clip_eps_high=0.05,
      agg="seq-mean-token-mean",
      micro_batches=micro,
    )
    state = _state(cfg)
    batch = make_batch(3, MC, state.params)
    new, metrics = L.train_step(state, batch, model_cfg=MC, cfg=cfg)
    out.append((host(new.params), host(new.opt_state), float(metrics["loss"]), float(metrics["clip_frac_high"])))
  assert out[1][2] == pytest.approx(out[0][2], rel=1e-6, abs=1e-7)
  assert out[1][3] == out[0][3]
  assert_update_close(out[0][0], out[0][1], out[1][0], out[1][1])


def test_sharded_step_equals_single_device(full_batch_run):
  """(data, fsdp, tensor) = (2, 2, 2) on 8 CPU devices, 2 micro-batches, == the single-device step:
  loss and grad norm to rel 1e-5, gradients to 1e-5 of the largest, params to 1e-5 absolute
  (f32; collectives reorder the sums)."""
  assert jax.device_count() == 8
  p0, batch, p1, opt1, m1 = full_batch_run
  cfg = CFG.replace(micro_batches=2)
  mesh = L.make_mesh(data=2, fsdp=2, tensor=2)
  state = L.create_train_state(KEY, MC, cfg, mesh=mesh)
  assert max_abs_diff(host(state.params), p0) == 0  # sharded init == single-device init
  want = L.state_shardings(state, mesh, cfg)
  q = state.params["layers"]["attn"]["q_proj"]["kernel"]
  assert q.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
  new, metrics = L.train_step(state, L.shard_batch(batch, mesh), model_cfg=MC, cfg=cfg, mesh=mesh)
  assert float(metrics["loss"]) == pytest.approx(m1["loss"], rel=1e-5)
  assert float(metrics["grad_norm"]) == pytest.approx(m1["grad_norm"], rel=1e-5)
  assert_update_close(host(new.params), host(new.opt_state), p1, opt1)
  got = jax.tree_util.tree_map(lambda x: x.sharding, new)
  for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    assert g.is_equivalent_to(w, 3) or g.is_equivalent_to(w, 2) or g.is_equivalent_to(w, 1) or g.is_equivalent_to(w, 0)


def test_nan_guard_skips_and_counts():
  """A non-finite step changes nothing but the counters; N in a row stop the run."""
  cfg = CFG  # shares the compiled step with the other tests
  state = _state(cfg)
  good = make_batch(0, MC, state.params)
  adv = np.array(good.advantages)
  adv[3] = np.nan  # a real sequence with a NaN advantage: loss and gradients are NaN
  bad = good.replace(advantages=jnp.asarray(adv))
  p0, o0 = host(state.params), host(state.opt_state)
  guard = L.NonFiniteGuard(max_in_row=2)
  state, m = L.train_step(state, bad, model_cfg=MC, cfg=cfg)
  assert guard.check(m) is True
  assert (int(state.step), int(state.skipped), int(state.skipped_in_row)) == (1, 1, 1)
  assert max_abs_diff(host(state.params), p0) == 0 and max_abs_diff(host(state.opt_state), o0) == 0
  state, m = L.train_step(state, good, model_cfg=MC, cfg=cfg)  # a good step resets the run of skips
  assert guard.check(m) is False and float(m["skipped"]) == 0
  assert (int(state.step), int(state.skipped), int(state.skipped_in_row)) == (2, 1, 0)
  assert max_abs_diff(host(state.params), p0) > 0
  p2, o2 = host(state.params), host(state.opt_state)
  state, m = L.train_step(state, bad, model_cfg=MC, cfg=cfg)
  guard.check(m)
  state, m = L.train_step(state, bad, model_cfg=MC, cfg=cfg)
  with pytest.raises(L.NonFiniteError, match="2 consecutive"):
    guard.check(m, step=3)
  assert int(state.skipped) == 3 and int(state.step) == 4
  assert max_abs_diff(host(state.params), p2) == 0 and max_abs_diff(host(state.opt_state), o2) == 0


@pytest.mark.parametrize("base", [pytest.param("float", marks=pytest.mark.slow), "int4-served"])
def test_lora_only_trains_adapters_over_frozen_base(base):
  cfg = L.LearnerConfig(
    lr=1e-2,
    compute_dtype="float32",
    qat=quant.Int4(group_size=32) if base == "float" else None,
    lora=models.LoraConfig(rank=4),
  )
  params = models.init_params(MC, jax.random.PRNGKey(5))
  if base == "int4-served":  # under jit: one compiled program each, not a dozen small ones per leaf
    rules = quant.QuantRules.default(quant.Int4(group_size=32))
    params = jax.jit(lambda p: quant.quantize_params(p, rules))(params)
  state = L.create_train_state(KEY, MC, cfg, params=params)
  assert state.trainable == "lora"
  base0, lora0 = host(state.params), host(state.lora.params)
  batch = make_batch(1, MC, jax.jit(quant.dequantize_params)(params))
  for _ in range(2):  # B = 0 at init: the first step moves B, the second then moves A too
    state, m = L.train_step(state, batch, model_cfg=MC, cfg=cfg)
  assert float(m["skipped"]) == 0 and float(m["grad_norm"]) > 0
  assert max_abs_diff(host(state.params), base0) == 0  # the frozen base is bit-identical
  lora1 = host(state.lora.params)
  for name in ("q_proj", "o_proj"):
    for ab in ("a", "b"):
      assert np.max(np.abs(lora1["layers"]["attn"][name][ab] - lora0["layers"]["attn"][name][ab])) > 0, (name, ab)
  # The optimizer only holds the adapters' moments.
  mu = state.opt_state[1][0].mu
  assert set(mu) == {"policy"} and set(mu["policy"]) == {"layers"}


def test_value_head_trains_on_returns_only_and_acrl_reference():
  """Zero advantages: the policy gradient vanishes (params unchanged); the value head learns, and the
  reported value loss matches the NumPy pinball + MSE formula (write-up 003). ACRL's X is measured
  on the first batch: X = mean_b mean_t |π_old − μ| (Fan et al. 2026)."""
  cfg = L.LearnerConfig(
    lr=1e-3,
    compute_dtype="float32",
    policy_loss="ppo",  # a critic: Δ = 0.1, no schedule
    value=L.ValueConfig(coef=1.0, alpha=0.7, quantized=True, schedule="constant"),
    correction=L.CorrectionConfig(method="acrl"),
  )
  state = _state(cfg)
  batch = make_batch(2, MC, state.params)
  rng = np.random.default_rng(7)
  batch = batch.replace(
    advantages=jnp.zeros((B,), jnp.float32), returns=jnp.asarray(rng.normal(size=(B, T)), jnp.float32)
  )
  assert not bool(state.acrl.is_set)
  values = np.asarray(L.prepare_rollout(state, batch, model_cfg=MC, cfg=cfg)[0].values, np.float64)
  p0, v0 = host(state.params), host(state.value_head)
  state, m = L.train_step(state, batch, model_cfg=MC, cfg=cfg)
  msk = np.asarray(batch.loss_mask, bool)
  valid = np.asarray(batch.valid, bool)
  vmsk = np.zeros_like(msk)  # the value head is trained at the slot that predicts each loss token
  for b, t in zip(*np.nonzero(msk)):
    before = np.nonzero(valid[b, :t])[0]
    if len(before):
      vmsk[b, before[-1]] = True
  u = np.asarray(batch.returns, np.float64) - values
  want = 0.7 * np.maximum(0.5 * u, -0.5 * u)[vmsk].mean() + 0.3 * (u**2)[vmsk].mean()
  assert float(m["value/loss"]) == pytest.approx(want, rel=1e-5)
  assert float(m["loss"]) == pytest.approx(want, rel=1e-5)  # pg term is 0 with A = 0
  assert max_abs_diff(host(state.params), p0) == 0
  assert max_abs_diff(host(state.value_head), v0) > 0
  d = np.abs(np.exp(np.asarray(batch.old_logp, np.float64)) - np.exp(np.asarray(batch.sampler_logp, np.float64)))
  x = np.mean([d[b][msk[b]].mean() for b in range(B)])
  assert bool(state.acrl.is_set) and float(state.acrl.x) == pytest.approx(x, rel=1e-5)
  assert float(m["correction/acrl_x"]) == pytest.approx(x, rel=1e-5)


def test_critic_lr_is_its_own_optimizer():
  """value.lr: the head gets its own Adam (peak lr value.lr): Adam's first bias-corrected update is lr·g/(|g|+ε), so
  the bias (no weight decay) moves by value.lr where |g| ≫ ε; the policy's update is the one it gets without a
  critic lr (no grad clip: Adam is elementwise, so bit-equal); value.init_std = 0 starts the head at V = 0. Value
  clipping reads the rollout's values (V_old = V at the first update: nothing clipped)."""
  rng = np.random.default_rng(3)
  cfgs = {
    lr: L.LearnerConfig(
      lr=1e-3,
      grad_clip=None,
      compute_dtype="float32",
      policy_loss="ppo",
      value=L.ValueConfig(lr=lr, init_std=0.0, clip=0.5),
    )
    for lr in (None, 0.05)
  }
  out = {}
  for lr, cfg in cfgs.items():
    state = _state(cfg)
    assert np.all(np.asarray(state.value_head["kernel"]) == 0)
    batch = make_batch(2, MC, state.params)
    batch = batch.replace(returns=jnp.asarray(rng.normal(size=(B, T)) if not out else out["returns"], jnp.float32))
    out["returns"] = np.asarray(batch.returns)
    batch = L.prepare_rollout(state, batch, model_cfg=MC, cfg=cfg)[0]
    assert np.all(np.asarray(batch.values) == 0)  # zero kernel, zero bias
    v0 = host(state.value_head)  # before the step: train_step donates the state
    new, m = L.train_step(state, batch, model_cfg=MC, cfg=cfg)
    assert float(m["value/vf_clipfrac"]) == 0
    out[lr] = (host(new.params), host(new.value_head), v0)
  (p_shared, v_shared, v0), (p_own, v_own, _) = out[None], out[0.05]
  assert max_abs_diff(p_own, p_shared) == 0
  np.testing.assert_allclose(np.abs(v_own["bias"] - v0["bias"]), 0.05, rtol=1e-5)  # ε/|g| and f32 rounding
  np.testing.assert_allclose(np.abs(v_shared["bias"] - v0["bias"]), 1e-3, rtol=1e-5)


def test_critic_lr_clips_the_policy_and_the_head_each_by_its_own_norm():
  """With value.lr, grad_clip applies to each subtree's global norm (NumPy: g · min(1, c / ‖g‖₂))."""
  from lrl_jax.learner.state import _clip_each

  rng = np.random.default_rng(0)
  g = {"policy": {"w": rng.normal(size=(8, 4)) * 3}, "value_head": {"kernel": rng.normal(size=(4, 1)) * 0.1}}
  out = _clip_each(1.0).update(jax.tree.map(jnp.asarray, g), optax.EmptyState())[0]
  for k, tree in g.items():
    x = next(iter(tree.values()))
    want = x * min(1.0, 1.0 / np.linalg.norm(x))
    np.testing.assert_allclose(np.asarray(next(iter(out[k].values()))), want, rtol=1e-6)  # f32 rounding


def test_prepare_rollout_old_logprobs_and_ref():
  cfg = L.LearnerConfig(compute_dtype="float32", micro_batches=2)
  state = _state(cfg)
  batch = make_batch(5, MC, state.params).replace(old_logp=None)
  ref = models.init_params(MC, jax.random.PRNGKey(9))
  out, _ = L.prepare_rollout(state, batch, ref, model_cfg=MC, cfg=cfg, with_old_logp=True)
  old, ref_lp = out.old_logp, out.ref_logp
  valid = np.asarray(batch.valid)
  np.testing.assert_allclose(np.asarray(old), _np_logp(host(state.params), batch), atol=1e-5)
  np.testing.assert_allclose(np.asarray(ref_lp), _np_logp(ref, batch), atol=1e-5)
  assert np.all(np.asarray(old)[~valid] == 0)


@pytest.mark.parametrize(
  "kw, match",
  [
    (dict(lr=0.0), "lr"),
    (dict(schedule="cosine"), "total_steps"),
    (dict(correction={"method": "tis", "level": "geometric"}), "learner.correction.level"),
    (dict(policy_loss="gspo", entropy_coef=0.1), "entropy_coef"),
    (dict(agg="mean"), "agg"),
    (dict(qat="int4"), "qat"),
    (dict(compute_dtype="float16"), "compute_dtype"),
  ],
)
def test_config_rejects_bad_values(kw, match):
  with pytest.raises(ValueError, match=match):
    L.LearnerConfig(**kw)


def test_step_rejects_bad_batch():
  cfg = CFG.replace(micro_batches=3)
  state = _state(CFG)
  batch = make_batch(0, MC, state.params)
  with pytest.raises(ValueError, match="micro_batches=3"):
    L.train_step(state, batch, model_cfg=MC, cfg=cfg)
  with pytest.raises(ValueError, match="sampler_logp"):
    L.train_step(state, batch.replace(sampler_logp=jnp.zeros((B, T + 1))), model_cfg=MC, cfg=CFG)
  with pytest.raises(ValueError, match="old_logp"):  # over M > 1 micro-batches the weights need π_old up front
    L.train_step(
      state,
      batch.replace(old_logp=None),
      model_cfg=MC,
      cfg=L.LearnerConfig(correction=L.CorrectionConfig(method="mis"), micro_batches=2),
    )


def test_optimizer_keys_from_yaml_reach_optax():
  """The learner's YAML keys are the optimizer's settings: learner.b1 / b2 / eps / nesterov / grad_clip=null give
  exactly optax.adamw's updates with those settings (the reference), and not the defaults' updates."""
  from lrl_jax.config import load_config

  cfg = load_config(
    None,
    [
      "learner.lr=0.1",
      "learner.b1=0.5",
      "learner.b2=0.9",
      "learner.eps=1e-3",
      "learner.nesterov=true",
      "learner.grad_clip=null",
    ],
  ).learner
  params = {"layer": {"kernel": jnp.asarray([1.0, -2.0, 3.0])}}
  grads = [{"layer": {"kernel": jnp.asarray(g)}} for g in ([0.3, -0.1, 0.2], [-0.2, 0.4, 0.1])]
  ref = optax.adamw(0.1, b1=0.5, b2=0.9, eps=1e-3, weight_decay=0.0, nesterov=True)

  def updates(tx):
    state, out = tx.init(params), []
    for g in grads:
      u, state = tx.update(g, state, params)
      out.append(np.asarray(u["layer"]["kernel"]))
    return out

  for got, want in zip(updates(L.make_optimizer(cfg)), updates(ref)):
    np.testing.assert_array_equal(got, want)  # the same optax transformation: bit for bit
  plain = updates(L.make_optimizer(cfg.replace(nesterov=False)))
  assert not np.array_equal(plain[1], updates(ref)[1])


@pytest.mark.parametrize("method", ["tis", "acrl"])
def test_correction_without_old_logp_uses_the_steps_own_forward(method):
  """K = 1, M = 1, no π_old in the rollout: the correction weights come from the step's own forward (π_θ detached),
  with the same update and correction metrics as a step given π_old = `token_logprobs` of the same weights (what
  `prepare_rollout` computed before), to f32 reordering."""
  cfg = CFG.replace(correction=L.CorrectionConfig(method=method))
  assert not L.needs_old_logp(cfg) and L.needs_old_logp(cfg.replace(micro_batches=2))
  st = _state(cfg)
  batch = make_batch(3, MC, st.params).replace(old_logp=None)
  old = L.token_logprobs(st.params, batch, MC, cfg=cfg)
  given, m_given = L.train_step(_state(cfg), batch.replace(old_logp=old), model_cfg=MC, cfg=cfg)
  fused, m_fused = L.train_step(st, batch, model_cfg=MC, cfg=cfg)
  assert_update_close(host(fused.params), host(fused.opt_state), host(given.params), host(given.opt_state))
  keys = [k for k in m_given if k.startswith("correction/")]
  assert keys
  for k in keys:
    assert float(m_fused[k]) == pytest.approx(float(m_given[k]), rel=1e-5, abs=1e-7), k


def _count_scoped(jaxpr, scope: str) -> int:
  """How many equations of a jaxpr (sub-jaxprs included: scan bodies, custom_vjp calls) run in the name scope
  `scope` (`jax.named_scope`)."""
  n = 0
  for eqn in jaxpr.eqns:
    n += scope in str(eqn.source_info.name_stack).split("/")
    for sub in jex.core.jaxprs_in_params(eqn.params):
      n += _count_scoped(sub, scope)
  return n


def _micro_scan(jaxpr, length: int):
  """The outermost scan of `length` steps in a step's jaxpr (the micro-batch loop)."""
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "scan" and eqn.params["length"] == length:
      return eqn.params["jaxpr"].jaxpr
    for sub in jex.core.jaxprs_in_params(eqn.params):
      found = _micro_scan(sub, length)
      if found is not None:
        return found
  return None


@pytest.mark.parametrize(
  "spec, trainable",
  [
    (quant.Int4(group_size=32), "full"),
    pytest.param(quant.NVFP4(), "full", marks=pytest.mark.slow),
    pytest.param(quant.Int4(group_size=32), "lora", marks=pytest.mark.slow),
  ],
)
def test_qat_micro_batches_fake_quantize_once_per_step(monkeypatch, spec, trainable):
  """With M = 4 micro-batches the QAT kernels are fake-quantized once for the step, outside the micro-batch loop,
  and the step equals, bit for bit, the step whose every micro-batch forward
  fake-quantizes for itself (the forward's own hoisting; same operations per micro-batch, so same bits); so do
  `prepare_rollout`'s π_old (and π_ref) forwards over the micro-batches."""
  lora = None if trainable == "full" else models.LoraConfig(rank=4)
  M = 4  # != the model's 2 layers: the micro-batch loop is the scan of M steps
  cfg = CFG.replace(compute_dtype="bfloat16", qat=spec, micro_batches=M, correction=L.CorrectionConfig(), lora=lora)
  state = _state(cfg)
  batch = make_batch(3, MC, state.params)

  def run():
    # fresh traces each call; π_old and π_ref (prepare_rollout's forwards, also per micro-batch) and the step
    prep = jax.jit(lambda s, b, r: L.prepare_rollout.__wrapped__(s, b, r, model_cfg=MC, cfg=cfg, with_old_logp=True))
    step = jax.jit(lambda s, b: L.train_step.__wrapped__(s, b, model_cfg=MC, cfg=cfg))
    ref = state.params if trainable == "full" else None
    fresh = batch.replace(old_logp=None)
    traced = [prep.trace(state, fresh, ref), step.trace(state, batch)]  # traced once: their jaxprs, then compiled
    jaxprs = [t.jaxpr.jaxpr for t in traced]
    prepared, _ = traced[0].lower().compile()(state, fresh, ref)
    new, m = traced[1].lower().compile()(jax.tree_util.tree_map(jnp.copy, state), batch)
    m = dict(host(m), old_logp=np.asarray(prepared.old_logp), ref_logp=np.asarray(prepared.ref_logp))
    return jaxprs, host(new.params if trainable == "full" else new.lora.params), m

  jaxprs_once, p_once, m_once = run()
  monkeypatch.setattr(models.decoder, "hoist_qat_operands", lambda params, numerics, dtype: params)
  jaxprs_each, p_each, m_each = run()
  # decoder._qat_operand runs in the name scope "qat_operand": inside the loop per forward, before it per step.
  for once, each in zip(jaxprs_once, jaxprs_each, strict=True):
    assert _count_scoped(_micro_scan(each, M), "qat_operand") > 0
    assert _count_scoped(_micro_scan(once, M), "qat_operand") == 0 < _count_scoped(once, "qat_operand")
  assert m_once.keys() == m_each.keys()
  for k in m_once:
    np.testing.assert_array_equal(m_once[k], m_each[k], err_msg=k)
  for a, b in zip(jax.tree_util.tree_leaves(p_once), jax.tree_util.tree_leaves(p_each), strict=True):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("moments", ["float32", "fp8"])
def test_skip_by_select_is_skip_by_branch(moments):
  """The GPU's select (`_update_by_select`) and the other backends' conditional (`_update_by_branch`) give the same
  parameters and optimizer state, bit for bit, for a finite step and for a skipped one (run here on the CPU)."""
  from lrl_jax.learner import step as S  # noqa: PLC0415

  cfg = CFG.replace(opt_state_dtype=moments, grad_clip=1.0)
  state = _state(cfg)
  tx = L.make_optimizer(cfg)
  trainable = S.trainable_params(state)
  leaves, treedef = jax.tree_util.tree_flatten(trainable)
  keys = jax.random.split(jax.random.PRNGKey(7), len(leaves))
  grads = treedef.unflatten([jax.random.normal(k, x.shape, jnp.float32) for k, x in zip(keys, leaves)])
  branch = jax.jit(lambda ok, p, o, g: S._update_by_branch(ok, tx, p, o, g))
  select = jax.jit(lambda ok, p, o, g: S._update_by_select(ok, tx, p, o, g))
  for ok in (True, False):
    want = host(branch(jnp.asarray(ok), trainable, state.opt_state, grads))
    got = host(select(jnp.asarray(ok), trainable, state.opt_state, grads))
    for w, g in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got)):
      np.testing.assert_array_equal(np.atleast_1d(g).view(np.uint8), np.atleast_1d(w).view(np.uint8))
    if not ok:
      for w, p in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(host((trainable, state.opt_state)))):
        np.testing.assert_array_equal(w, p)
