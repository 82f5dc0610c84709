"""Policy-gradient losses: PPO / GRPO / DAPO / Dr.GRPO clipped surrogate, GSPO, KL penalties, entropy.

Per-token arrays are [B, T] with a mask [B, T] (1 = a real generated token). Log-probs
are cast to f32 on entry, whatever their dtype: ratios exp(Δ log p) in bf16 would round
to 1 for |Δ| < 2⁻⁸ and clip fractions would be meaningless. Every loss returns
(scalar f32, metrics) with metrics as in `aggregation` (`Mean` pairs, `Max`).
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

from lrl_jax.losses import _common as C
from lrl_jax.losses.aggregation import AggMode, Max, Mean, aggregate, check_agg

__all__ = ["ppo_loss", "gspo_loss", "kl_penalty", "entropy_from_logits", "KLEstimator"]

KLEstimator = Literal["k1", "k2", "k3"]
_KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_penalty(logp, ref_logp, mask, *, estimator: KLEstimator = "k3") -> jax.Array:
  """Per-token estimate of KL(π_θ ‖ π_ref) from tokens sampled by π_θ.

  With log r = log π_ref − log π_θ (Schulman, "Approximating KL Divergence", 2020):
    k1 = −log r                 (unbiased, high variance, can be negative)
    k2 = ½ (log r)²             (biased, low variance)
    k3 = (r − 1) − log r        (unbiased, ≥ 0, low variance; GRPO's penalty, Shao et al. 2024)

  Args:
    logp: [B, T] log π_θ of the sampled tokens (gradient flows through it).
    ref_logp: [B, T] log π_ref (treated as a constant).
    mask: [B, T].
    estimator: "k1", "k2" or "k3".

  Returns:
    [B, T] f32, 0 where masked. k3 overflows f32 for log r > 88 (r = inf): a reference
    that far from the policy is a bug upstream, not something to clamp silently.
  """
  if estimator not in _KL_ESTIMATORS:
    raise ValueError(f"kl_penalty: estimator must be one of {_KL_ESTIMATORS}; got {estimator!r}")
  m, _ = C.bt_mask("kl_penalty", mask, logp=logp, ref_logp=ref_logp)
  log_r = C.clean(jax.lax.stop_gradient(C.f32(ref_logp)), m) - C.clean(logp, m)
  if estimator == "k1":
    kl = -log_r
  elif estimator == "k2":
    kl = 0.5 * log_r**2
  else:
    kl = jnp.expm1(log_r) - log_r  # expm1: (r − 1) without cancellation near r = 1
  return jnp.where(m, kl, 0.0)


def entropy_from_logits(logits, mask) -> jax.Array:
  """Per-token entropy H = −Σ_v p_v log p_v of the policy, p = softmax(z), in f32 (`softmax_entropy`).

  Args:
    logits: [B, T, V] (any float dtype; upcast to f32 — softmax of bf16 logits loses
      the small probabilities that the entropy is made of).
    mask: [B, T].

  Returns:
    [B, T] f32 entropy in nats, 0 where masked.
  """
  C.check_rank("entropy_from_logits", "logits", logits, 3, "[B, T, V]")
  m, _ = C.bt_mask("entropy_from_logits", mask)
  if tuple(logits.shape[:2]) != tuple(m.shape):
    raise ValueError(
      f"entropy_from_logits: logits [B, T, V] {tuple(logits.shape)} do not match mask [B, T] {tuple(m.shape)}"
    )
  z = jnp.where(m[:, :, None], C.f32(logits), 0.0)
  return jnp.where(m, softmax_entropy(z), 0.0)


def softmax_entropy(logits, lse=None) -> jax.Array:
  """Entropy of softmax(z) over the last axis, in f32, from z's log-sum-exp (taken here when `lse` is None).

  H = Σ_v q_v (lse − z_v) / Σ_v q_v with q = exp(z − lse), i.e. −Σ_v p_v log p_v: one exp and two sums per element,
  and with `lse` the caller's (the learner's log-probs take it anyway) no other pass over z. (lse − Σ_v p_v z_v
  with p = softmax(z) takes a max, two exps, three sums and a division per element; on the learner's [B, N, V] f32
  logits that took 0.15-0.35 s of a ~4.1 s SmolLM2 CPU step at 64 x 72, `lrl_jax/learner/README.md`.) Dividing
  by Σ q cancels the shared factor that lse's rounding puts on every q; the rounding of lse in lse − z_v stays, an
  error of the order of u·|lse| as in lse − Σ p·z. A term at z_v = −inf is 0 (p_v log p_v → 0).

  Args:
    logits: [..., V] (any float dtype; upcast to f32).
    lse: [...] f32 `jax.nn.logsumexp(z, axis=-1)` of the same z, or None.

  Returns:
    [...] f32 entropy in nats.
  """
  z = C.f32(logits)
  lse = (jax.nn.logsumexp(z, axis=-1) if lse is None else lse)[..., None]
  q = jnp.exp(z - lse)
  return jnp.sum(jnp.where(q > 0, q * (lse - z), 0.0), axis=-1) / jnp.sum(q, axis=-1)


def _ppo_metrics(m, mf, log_ratio, ratio, adv, eps_low, eps_high, dual_clip_c, pg, extra):
  n = jnp.sum(mf)
  sg = jax.lax.stop_gradient
  log_ratio, ratio, adv, pg = sg(log_ratio), sg(ratio), sg(adv), sg(pg)
  count = lambda cond: Mean(C.msum(cond.astype(C.F32), m), n)
  metrics = {
    "pg_loss": Mean(C.msum(pg, m), n),
    "clip_frac_low": count((adv < 0) & (ratio < 1.0 - eps_low)),
    "clip_frac_high": count((adv > 0) & (ratio > 1.0 + eps_high)),
    # KL(π_old ‖ π_θ), k3 with log r = log π_θ − log π_old (Schulman 2020).
    "approx_kl": Mean(C.msum(jnp.expm1(log_ratio) - log_ratio, m), n),
    "ratio_mean": Mean(C.msum(ratio, m), n),
    "ratio_max": Max(jnp.max(jnp.where(m, ratio, -jnp.inf))),
  }
  if dual_clip_c is not None:
    metrics["dual_clip_frac"] = count((adv < 0) & (ratio > dual_clip_c))
  for k, v in extra.items():
    metrics[k] = Mean(C.msum(sg(v), m), n)
  return metrics


def _regularizers(fn, m, logp, ref_logp, kl_coef, kl_estimator, entropy, entropy_coef, agg, norm_len, denom):
  """β·agg(KL(π_θ‖π_ref)) − c_H·agg(H), and their per-token values for the metrics."""
  extra, reg = {}, jnp.zeros((), C.F32)
  if ref_logp is not None:
    C.check_same(fn, "mask", m.shape, ref_logp=ref_logp)
    kl = kl_penalty(logp, ref_logp, m, estimator=kl_estimator)
    extra["kl_ref"] = kl
    if kl_coef:
      reg = reg + kl_coef * aggregate(kl, m, agg=agg, norm_len=norm_len, denom=denom)
  elif kl_coef:
    raise ValueError(f"{fn}: kl_coef={kl_coef} needs ref_logp")
  if entropy is not None:
    C.check_same(fn, "mask", m.shape, entropy=entropy)
    ent = C.clean(entropy, m)
    extra["entropy"] = ent
    if entropy_coef:
      reg = reg - entropy_coef * aggregate(ent, m, agg=agg, norm_len=norm_len, denom=denom)
  elif entropy_coef:
    raise ValueError(f"{fn}: entropy_coef={entropy_coef} needs entropy")
  return reg, extra


def ppo_loss(
  logp,
  old_logp,
  adv,
  mask,
  *,
  clip_eps_low: float = 0.2,
  clip_eps_high: float = 0.28,
  dual_clip_c: float | None = None,
  agg: AggMode = "token-mean",
  norm_len: int | None = None,
  denom=None,
  token_weights=None,
  ref_logp=None,
  kl_coef: float = 0.0,
  kl_estimator: KLEstimator = "k3",
  entropy=None,
  entropy_coef: float = 0.0,
):
  """PPO clipped surrogate with decoupled clip range (DAPO clip-higher) and optional dual clip.

  Per token, r = exp(log π_θ − log π_old):
    ℓ = −w · min(r·A, clip(r, 1 − ε_low, 1 + ε_high)·A)          (Schulman et al. 2017; Yu et al. 2025)
    dual clip, for A < 0:  ℓ = −w · max(min(r·A, clip(r)·A), c·A)  (Ye et al. 2020, c > 1)
  then aggregated by `agg` (see `aggregation`): "token-mean" is DAPO, "seq-mean-token-mean"
  GRPO (Shao et al. 2024), "seq-mean-token-sum-norm" Dr.GRPO (Liu et al. 2025). The loss is
  loss = agg(ℓ) + β · agg(KL_k(π_θ ‖ π_ref)) − c_H · agg(H).

  Args:
    logp: [B, T] log π_θ of the sampled tokens (the only input with a gradient).
    old_logp: [B, T] log π_old (the policy that the advantages refer to).
    adv: [B] per-sequence or [B, T] per-token advantages.
    mask: [B, T].
    clip_eps_low, clip_eps_high: ε_low, ε_high (DAPO defaults 0.2 / 0.28; PPO: equal).
    dual_clip_c: c of dual-clip PPO (e.g. 3.0); None disables it.
    agg, norm_len, denom: aggregation (see `aggregation.aggregate`).
    token_weights: optional [B, T] correction weight w (TIS, MIS or ACRL; detached here):
      it multiplies the clipped surrogate of each token, so w · ∇min(rA, clip(r)A).
    ref_logp: optional [B, T] log π_ref for the KL penalty and the "kl_ref" metric.
    kl_coef: β; kl_estimator: "k1" | "k2" | "k3" (see `kl_penalty`).
    entropy: optional [B, T] per-token entropy (`entropy_from_logits`) for the bonus / metric.
    entropy_coef: c_H.

  Returns:
    (loss: scalar f32, metrics). Metrics (all over real tokens): `Mean` pairs "pg_loss"
    (weighted surrogate), "clip_frac_low" (A < 0, r < 1 − ε_low), "clip_frac_high"
    (A > 0, r > 1 + ε_high), "approx_kl" (k3 of KL(π_old ‖ π_θ)), "ratio_mean",
    "dual_clip_frac" (A < 0, r > c; with dual clip), "kl_ref", "entropy" (when given);
    `Max` "ratio_max".
  """
  fn = "ppo_loss"
  check_agg(fn, agg)
  m, mf = C.bt_mask(fn, mask, logp=logp, old_logp=old_logp, token_weights=token_weights)
  C.check_positive(fn, clip_eps_low=clip_eps_low, clip_eps_high=clip_eps_high)
  if dual_clip_c is not None and not dual_clip_c > 1.0:
    raise ValueError(f"{fn}: dual_clip_c must be > 1; got {dual_clip_c}")
  adv = C.clean(C.seq_or_token(fn, "adv", adv, m.shape), m)
  log_ratio = C.clean(logp, m) - C.clean(jax.lax.stop_gradient(C.f32(old_logp)), m)
  ratio = jnp.exp(log_ratio)
  surr = jnp.minimum(ratio * adv, jnp.clip(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high) * adv)
  if dual_clip_c is not None:
    surr = jnp.where(adv < 0, jnp.maximum(surr, dual_clip_c * adv), surr)
  pg = -surr
  if token_weights is not None:
    pg = pg * C.clean(jax.lax.stop_gradient(C.f32(token_weights)), m)
  loss = aggregate(pg, m, agg=agg, norm_len=norm_len, denom=denom)
  reg, extra = _regularizers(fn, m, logp, ref_logp, kl_coef, kl_estimator, entropy, entropy_coef, agg, norm_len, denom)
  metrics = _ppo_metrics(m, mf, log_ratio, ratio, adv, clip_eps_low, clip_eps_high, dual_clip_c, pg, extra)
  return loss + reg, metrics


def gspo_loss(
  logp,
  old_logp,
  adv,
  mask,
  *,
  clip_eps_low: float = 3e-4,
  clip_eps_high: float = 4e-4,
  agg: AggMode = "seq-mean-token-mean",
  norm_len: int | None = None,
  denom=None,
  token_weights=None,
  ref_logp=None,
  kl_coef: float = 0.0,
  kl_estimator: KLEstimator = "k3",
):
  """GSPO: a length-normalised sequence-level ratio, clipped per sequence (Zheng et al. 2025).

  s_b = exp((1/n_b) Σ_t m (log π_θ − log π_old)), the geometric mean of the token ratios.
  Written in the GSPO-token form s_bt = sg(s_b) · π_θ(y_t) / sg(π_θ(y_t)), which equals s_b
  and has ∇s_bt = s_b ∇log π_θ(y_t), so per-token advantages are allowed and with
  A_bt = A_b it is exactly GSPO:
    ℓ_bt = −w_bt · min(s_bt·A_bt, clip(s_bt, 1 − ε_low, 1 + ε_high)·A_bt)
  aggregated "seq-mean-token-mean" by default (the paper's (1/G) Σ_i (1/|y_i|) Σ_t).
  Defaults ε_low = 3e-4, ε_high = 4e-4 are the paper's.

  Args:
    logp, old_logp: [B, T]; adv: [B] or [B, T]; mask: [B, T].
    clip_eps_low, clip_eps_high, agg, norm_len, denom, token_weights, ref_logp, kl_coef,
      kl_estimator: as in `ppo_loss`.

  Returns:
    (loss: scalar f32, metrics): `Mean` over non-empty sequences "clip_frac_low",
    "clip_frac_high", "seq_ratio_mean"; `Mean` over tokens "pg_loss", "approx_kl"
    (token-level k3 of KL(π_old ‖ π_θ)), "kl_ref" (with ref_logp); `Max` "seq_ratio_max".
  """
  fn = "gspo_loss"
  check_agg(fn, agg)
  m, mf = C.bt_mask(fn, mask, logp=logp, old_logp=old_logp, token_weights=token_weights)
  C.check_positive(fn, clip_eps_low=clip_eps_low, clip_eps_high=clip_eps_high)
  sg = jax.lax.stop_gradient
  adv = C.clean(C.seq_or_token(fn, "adv", adv, m.shape), m)
  lp = C.clean(logp, m)
  log_ratio = lp - C.clean(sg(C.f32(old_logp)), m)
  n_b = jnp.sum(mf, axis=1)
  log_s = C.safe_div(jnp.sum(log_ratio, axis=1), n_b)  # [B]
  s_bt = jnp.exp(sg(log_s)[:, None] + lp - sg(lp))
  surr = jnp.minimum(s_bt * adv, jnp.clip(s_bt, 1.0 - clip_eps_low, 1.0 + clip_eps_high) * adv)
  pg = -surr
  if token_weights is not None:
    pg = pg * C.clean(sg(C.f32(token_weights)), m)
  loss = aggregate(pg, m, agg=agg, norm_len=norm_len, denom=denom)
  reg, extra = _regularizers(fn, m, logp, ref_logp, kl_coef, kl_estimator, None, 0.0, agg, norm_len, denom)

  has = n_b > 0
  n_seq = jnp.sum(has).astype(C.F32)
  s = sg(jnp.exp(log_s))
  adv_seq = sg(C.safe_div(jnp.sum(adv, axis=1), n_b))  # the sequence's mean advantage decides the side
  lr_sg, n = sg(log_ratio), jnp.sum(mf)
  metrics = {
    "pg_loss": Mean(C.msum(sg(pg), m), n),
    "clip_frac_low": Mean(C.msum(((adv_seq < 0) & (s < 1.0 - clip_eps_low)).astype(C.F32), has), n_seq),
    "clip_frac_high": Mean(C.msum(((adv_seq > 0) & (s > 1.0 + clip_eps_high)).astype(C.F32), has), n_seq),
    "approx_kl": Mean(C.msum(jnp.expm1(lr_sg) - lr_sg, m), n),
    "seq_ratio_mean": Mean(C.msum(s, has), n_seq),
    "seq_ratio_max": Max(jnp.max(jnp.where(has, s, -jnp.inf))),
  }
  for k, v in extra.items():
    metrics[k] = Mean(C.msum(sg(v), m), n)
  return loss + reg, metrics
