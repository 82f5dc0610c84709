"""Train-inference mismatch corrections: TIS, MIS and ACRL token weights.

The sampler's log-prob μ of a sampled token differs from the learner's π_old (same
weights, other numerics: low-bit weights, other kernels). Each function here returns
detached per-token weights w [B, T] (0 where masked) for `ppo_loss(token_weights=w)` /
`gspo_loss(token_weights=w)`, where w multiplies the clipped surrogate of each token,
plus metrics (see `aggregation`: `Mean` pairs, `Max`, per-batch arrays).

Non-finite log-probs: μ = 0 < π (log μ = −inf) is a ratio of +inf; π = 0 < μ a ratio of
0; both 0 a ratio of 1 (no evidence of mismatch). A sequence whose log-ratio sum is
undefined (+inf and −inf tokens together) gets weight 0 (TIS) or is rejected (MIS).
"""

from __future__ import annotations

import math
from typing import Literal

import flax.struct
import jax
import jax.numpy as jnp

from lrl_jax.losses import _common as C
from lrl_jax.losses.aggregation import Max, Mean

__all__ = [
  "tis_weights",
  "mis_weights",
  "ACRLState",
  "acrl_init",
  "acrl_set_reference",
  "acrl_discrepancy",
  "acrl_weights",
  "effective_sample_size",
]


def effective_sample_size(log_w, valid) -> jax.Array:
  """Normalised effective sample size (Σ w)² / (N Σ w²) ∈ [1/N, 1] of weights w = exp(log_w) (Kong 1992).

  Computed in log space (ratios exp(Σ log r) overflow f32). Weights of +inf dominate:
  with k of them the ESS is k / N (the limit). 0 when nothing is valid.

  Args:
    log_w: any shape, log-weights (−inf allowed: weight 0).
    valid: bool, same shape: which entries count.

  Returns:
    scalar f32.
  """
  lw = jnp.where(valid, C.f32(log_w), -jnp.inf)
  n = jnp.sum(valid).astype(C.F32)
  is_inf = valid & (lw == jnp.inf)
  n_inf = jnp.sum(is_inf).astype(C.F32)
  fin = valid & jnp.isfinite(lw)
  mx = jnp.max(jnp.where(fin, lw, -jnp.inf))
  mx = jnp.where(jnp.isfinite(mx), mx, 0.0)
  e = jnp.where(fin, jnp.exp(jnp.where(fin, lw, 0.0) - mx), 0.0)
  ess = C.safe_div(jnp.sum(e) ** 2, n * jnp.sum(e**2))
  return jnp.where(n_inf > 0, C.safe_div(n_inf, n), ess)


def _weight_metrics(w, valid, truncated, log_w, per: str):
  n = jnp.sum(valid).astype(C.F32)
  return {
    "weight_mean": Mean(C.msum(w, valid), n),
    "weight_max": Max(jnp.max(jnp.where(valid, w, -jnp.inf))),
    "frac_truncated": Mean(C.msum(truncated.astype(C.F32), valid), n),
    f"ess_{per}": effective_sample_size(log_w, valid),
  }


def _check_bounds(fn, **kw):
  for name, v in kw.items():
    if isinstance(v, (int, float)) and not v > 1.0:
      raise ValueError(f"{fn}: {name} must be > 1; got {v}")


def tis_weights(
  old_logp,
  sampler_logp,
  mask,
  *,
  level: Literal["token", "sequence"] = "token",
  clip_c: float = 2.0,
  batch_normalize: bool = False,
):
  """Truncated importance sampling weights (Yao et al. 2025, "Your Efficient RL Framework
  Secretly Brings You Off-Policy RL Training"; verl / slime rollout correction).

    token:    w_t = min(π_old(y_t) / μ(y_t), C) = exp(min(log π_old − log μ, log C))
    sequence: w_b = min(Π_t π_old/μ, C) = exp(min(Σ_t m (log π_old − log μ), log C)), on every token of b
    batch_normalize: w ← w / mean(w), the mean over real tokens (token) or non-empty
      sequences (sequence) of this batch, so that the weights average to 1.

  Args:
    old_logp: [B, T] learner log π_old of the sampled tokens.
    sampler_logp: [B, T] sampler log μ.
    mask: [B, T].
    level: "token" or "sequence".
    clip_c: C > 1 (default 2).
    batch_normalize: rescale to mean 1 (after truncation).

  Returns:
    (w [B, T] f32 detached, 0 where masked; metrics): "weight_mean" (`Mean`, over tokens
    or sequences), "weight_max" (`Max`), "frac_truncated" (`Mean`, ratio > C, before
    normalisation), "ess_token" / "ess_sequence" (per-batch normalised ESS of w).
  """
  fn = "tis_weights"
  if level not in ("token", "sequence"):
    raise ValueError(f"{fn}: level must be 'token' or 'sequence'; got {level!r}")
  _check_bounds(fn, clip_c=clip_c)
  m, mf = C.bt_mask(fn, mask, old_logp=old_logp, sampler_logp=sampler_logp)
  sg = jax.lax.stop_gradient
  lr = C.log_ratio(sg(C.f32(old_logp)), sg(C.f32(sampler_logp)), m)
  log_c = math.log(clip_c)
  if level == "token":
    valid, unit_lr = m, lr
  else:
    valid = jnp.sum(mf, axis=1) > 0
    unit_lr = jnp.sum(jnp.where(m, lr, 0.0), axis=1)
    unit_lr = jnp.where(jnp.isnan(unit_lr), -jnp.inf, unit_lr)  # +inf and −inf together: weight 0
  truncated = valid & (unit_lr > log_c)
  log_w = jnp.minimum(unit_lr, log_c)
  w = jnp.where(valid, jnp.exp(log_w), 0.0)
  if batch_normalize:
    mean = C.safe_div(jnp.sum(w), jnp.sum(valid).astype(C.F32))
    w = C.safe_div(w, mean)
    log_w = log_w - jnp.log(jnp.where(mean > 0, mean, 1.0))
  metrics = _weight_metrics(w, valid, truncated, log_w, level)
  if level == "sequence":
    w = jnp.where(m, w[:, None], 0.0)
  return sg(w), metrics


def mis_weights(
  old_logp,
  sampler_logp,
  mask,
  *,
  level: Literal["sequence", "geometric", "token"] = "sequence",
  lo: float = 0.5,
  hi: float = 2.0,
  keep_ratio: bool = False,
):
  """Masked importance sampling: reject sequences (or tokens) whose IS ratio leaves [lo, hi].

  (Token masking: Ling Team 2025, IcePop; sequence masking, Seq-MIS: Liu, Li et al. 2025,
  "When Speed Kills Stability: Demystifying RL Collapse from the Training-Inference
  Mismatch"; verl rollout correction `rollout_rs`.)
    sequence:  ρ_b = exp(Σ_t m (log π_old − log μ))                keep b iff lo ≤ ρ_b ≤ hi
    geometric: ρ_b = exp((1/n_b) Σ_t m (log π_old − log μ))        (length-free; use tight bounds)
    token:     ρ_t = π_old(y_t) / μ(y_t)                          keep t iff lo ≤ ρ_t ≤ hi
  w = 1 on kept tokens, 0 elsewhere; with `keep_ratio`, w = ρ on kept (the masked-IS
  estimator: kept samples keep their IS weight). Compared in log space.

  Args:
    old_logp, sampler_logp, mask: [B, T].
    level: "sequence", "geometric" or "token".
    lo, hi: bounds, 0 ≤ lo < hi.
    keep_ratio: multiply kept tokens by their ratio ρ.

  Returns:
    (w [B, T] f32 detached; metrics): "frac_masked" (`Mean` over sequences, or tokens
    for level "token"), "frac_masked_tokens" (`Mean` over tokens), "weight_mean"
    (`Mean`), "weight_max" (`Max`), "ess_*" (per-batch normalised ESS of w).
  """
  fn = "mis_weights"
  if level not in ("sequence", "geometric", "token"):
    raise ValueError(f"{fn}: level must be 'sequence', 'geometric' or 'token'; got {level!r}")
  if not (isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and 0.0 <= lo < hi):
    raise ValueError(f"{fn}: need 0 <= lo < hi; got lo={lo}, hi={hi}")
  m, mf = C.bt_mask(fn, mask, old_logp=old_logp, sampler_logp=sampler_logp)
  sg = jax.lax.stop_gradient
  lr = C.log_ratio(sg(C.f32(old_logp)), sg(C.f32(sampler_logp)), m)
  log_lo = math.log(lo) if lo > 0 else -math.inf
  log_hi = math.log(hi)
  n_b = jnp.sum(mf, axis=1)
  if level == "token":
    valid, unit_lr = m, lr
  else:
    valid = n_b > 0
    unit_lr = jnp.sum(jnp.where(m, lr, 0.0), axis=1)  # NaN when +inf and −inf meet: rejected below
    if level == "geometric":
      unit_lr = C.safe_div(unit_lr, n_b)
  keep = valid & (unit_lr >= log_lo) & (unit_lr <= log_hi)
  if keep_ratio:
    log_w = jnp.where(keep, unit_lr, -jnp.inf)
  else:
    log_w = jnp.where(keep, 0.0, -jnp.inf)
  w = jnp.where(keep, jnp.exp(jnp.where(keep, log_w, 0.0)), 0.0).astype(C.F32)
  rejected = valid & ~keep
  per = "token" if level == "token" else "sequence"
  metrics = _weight_metrics(w, valid, jnp.zeros_like(valid), log_w, per)
  del metrics["frac_truncated"]
  metrics["frac_masked"] = Mean(C.msum(rejected.astype(C.F32), valid), jnp.sum(valid).astype(C.F32))
  if level != "token":
    w = jnp.where(m, w[:, None], 0.0)
    rejected_tok = m & rejected[:, None]
  else:
    rejected_tok = rejected
  metrics["frac_masked_tokens"] = Mean(C.msum(rejected_tok.astype(C.F32), m), jnp.sum(mf))
  return sg(w), metrics


# --------------------------------------------------------------------------- ACRL


@flax.struct.dataclass
class ACRLState:
  """What the learner carries for ACRL between steps.

  Attributes:
    x: f32 [] the reference discrepancy X (mean token |π − μ| at step 0).
    is_set: bool [] whether X has been measured (or set); until then the next
      `acrl_weights` call measures it on its batch.
  """

  x: jax.Array
  is_set: jax.Array


def acrl_init(x: float | None = None) -> ACRLState:
  """A fresh ACRL state: X unset (measured on the first batch), or set to `x`."""
  if x is None:
    return ACRLState(x=jnp.zeros((), C.F32), is_set=jnp.zeros((), jnp.bool_))
  return acrl_set_reference(None, x)


def acrl_set_reference(state: ACRLState | None, x) -> ACRLState:
  """Sets X (e.g. measured over several batches or hosts with `acrl_discrepancy`)."""
  del state
  x = C.f32(x)
  if x.shape != ():
    raise ValueError(f"acrl_set_reference: x must be a scalar; got shape {x.shape}")
  return ACRLState(x=x, is_set=jnp.ones((), jnp.bool_))


def acrl_discrepancy(old_logp, sampler_logp, mask):
  """ACRL's discrepancy: d_t = |π_old(y_t) − μ(y_t)| (probabilities) and per-sequence Y_b = mean_t d_t.

  Args:
    old_logp, sampler_logp, mask: [B, T].

  Returns:
    (d [B, T], y [B], x_batch: `Mean` of Y over non-empty sequences, i.e. the paper's X
    formula (1/n) Σ_j (1/G) Σ_i (1/|a_i|) Σ_t d on this batch, combinable across hosts).
  """
  fn = "acrl_discrepancy"
  m, mf = C.bt_mask(fn, mask, old_logp=old_logp, sampler_logp=sampler_logp)
  sg = jax.lax.stop_gradient
  p_old = jnp.exp(C.clean(sg(C.f32(old_logp)), m))
  p_smp = jnp.exp(C.clean(sg(C.f32(sampler_logp)), m))
  d = jnp.where(m, jnp.abs(p_old - p_smp), 0.0)
  n_b = jnp.sum(mf, axis=1)
  y = C.safe_div(jnp.sum(d, axis=1), n_b)
  has = n_b > 0
  return d, y, Mean(C.msum(y, has), jnp.sum(has).astype(C.F32))


def acrl_weights(state: ACRLState, old_logp, sampler_logp, adv, mask, *, gamma: float = 0.65, clip_c: float = 2.0):
  """ACRL adaptive-control weights (Fan et al. 2026, "ACRL: Adaptive Control of
  Training-Inference Discrepancy for Stable Reinforcement Learning", arXiv 2607.24062).

    d_t = |π(y_t) − μ(y_t)|,  Y_b = (1/|y_b|) Σ_t d_t,  X = mean of Y at step 0 (in `state`)
    α_bt = γ · sign(A_bt) · (1 − Y_b / X),   r_t = π / μ,   ρ_bt = r_t^α_bt
    w_bt = min(ρ_bt, C), multiplying ∇ min(r A, clip(r) A) (`ppo_loss(token_weights=w)`).

  Four quadrants, PA/NA: A > 0 / A < 0; HP/LP: π > μ / π < μ (training probability above /
  below the sampler's; this reading is the one the formula gives — the write-up's gloss
  that names μ contradicts its own quadrant list). When Y > X (too much discrepancy),
  α has the sign of −A, so ρ > 1 (enhanced) for PA&LP and NA&HP — updates that move π
  towards μ — and ρ < 1 (suppressed) for PA&HP and NA&LP; when Y < X all four reverse,
  keeping some discrepancy for exploration. α = 0 (A = 0, Y = X, or X = 0) gives ρ = 1.

  X: if `state.is_set` is false, X is measured on this batch (mean over its non-empty
  sequences of Y_b) and stored in the returned state; a batch without real tokens
  leaves the state unset. X = 0 (identical engines) disables the control (α = 0).

  Args:
    state: `ACRLState` (from `acrl_init`).
    old_logp: [B, T] learner log π (at θ_old); sampler_logp: [B, T] log μ.
    adv: [B] or [B, T] advantages (only their sign is used).
    mask: [B, T].
    gamma: γ > 0, the control strength (paper: 0.65; ≥ 2.1 collapsed).
    clip_c: C > 1.

  Returns:
    (w [B, T] f32 detached, 0 where masked; new_state; metrics): "acrl_x" (the X used,
    per-batch array), "acrl_y" (`Mean` of Y over sequences), "frac_y_above_x" (`Mean`
    over sequences), "weight_mean" (`Mean` over tokens), "weight_max" (`Max`),
    "frac_truncated" (ρ > C), "frac_enhanced" (ρ > 1), "frac_suppressed" (ρ < 1)
    (`Mean` over tokens), "ess_token" (per-batch); how far the control acts: "alpha_abs_mean" (|α|),
    "rho_dev_mean" (|ρ − 1|, `Mean` over tokens) and "rho_dev_max" (`Max`), ρ before the clip at C.
  """
  fn = "acrl_weights"
  _check_bounds(fn, clip_c=clip_c)
  C.check_positive(fn, gamma=gamma)
  m, _ = C.bt_mask(fn, mask, old_logp=old_logp, sampler_logp=sampler_logp)
  sg = jax.lax.stop_gradient
  adv = C.clean(sg(C.seq_or_token(fn, "adv", adv, m.shape)), m)
  _, y, x_batch = acrl_discrepancy(old_logp, sampler_logp, m)
  has_seq = x_batch.count > 0
  x = jnp.where(state.is_set, state.x, x_batch.value)
  new_state = ACRLState(x=jnp.where(state.is_set | ~has_seq, state.x, x_batch.value), is_set=state.is_set | has_seq)
  ctrl = jnp.where(x > 0, 1.0 - C.safe_div(y, x), 0.0)  # [B]
  alpha = gamma * jnp.sign(adv) * ctrl[:, None]
  lr = C.log_ratio(sg(C.f32(old_logp)), sg(C.f32(sampler_logp)), m)
  log_rho = jnp.where(alpha == 0, 0.0, alpha * lr)  # r^0 = 1 even for r ∈ {0, inf}
  log_c = math.log(clip_c)
  log_w = jnp.minimum(log_rho, log_c)
  w = jnp.where(m, jnp.exp(log_w), 0.0)
  n_seq = x_batch.count
  has = jnp.sum(m, axis=1) > 0
  metrics = _weight_metrics(w, m, m & (log_rho > log_c), log_w, "token")
  rho_dev = jnp.where(m, jnp.abs(jnp.expm1(log_rho)), 0.0)
  n_tok = jnp.sum(m).astype(C.F32)
  metrics.update(
    {
      "acrl_x": x,
      "acrl_y": x_batch,
      "frac_y_above_x": Mean(jnp.sum((has & (y > x)).astype(C.F32)), n_seq),
      "frac_enhanced": Mean(C.msum((log_rho > 0).astype(C.F32), m), n_tok),
      "frac_suppressed": Mean(C.msum((log_rho < 0).astype(C.F32), m), n_tok),
      "alpha_abs_mean": Mean(C.msum(jnp.abs(alpha), m), n_tok),
      "rho_dev_mean": Mean(C.msum(rho_dev, m), n_tok),
      "rho_dev_max": Max(jnp.max(jnp.where(m, rho_dev, 0.0))),
    }
  )
  return sg(w), new_state, metrics
