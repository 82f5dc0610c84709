"""Train-inference mismatch metrics: what every RL step logs about π (learner) vs μ (sampler).

The combinators `Mean`, `Max`, `merge_metrics`, `finalize_metrics` live in `aggregation`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lrl_jax.losses import _common as C
from lrl_jax.losses.aggregation import Max, Mean
from lrl_jax.losses.corrections import effective_sample_size

__all__ = ["mismatch_metrics"]


def mismatch_metrics(logp, sampler_logp, mask) -> dict:
  """Mismatch between the learner's log π and the sampler's log μ on the sampled tokens.

  Per real token, r = π/μ, log r = log π − log μ; "finite" tokens have both log-probs finite.
    prob_abs_diff_mean / _max   |π − μ| (probabilities; ACRL's d)              all tokens
    log_abs_diff_mean           |log π − log μ|                               finite tokens
    kl_k1                       k1 of KL(μ ‖ π) = mean(−log r)                finite tokens
    kl_k3                       k3 of KL(μ ‖ π) = mean((r − 1) − log r)       finite tokens
      (samples come from μ; Schulman, "Approximating KL Divergence", 2020)
    log_ppl_ratio               mean over sequences of log PPL_π − log PPL_μ
                                = (1/n_b) Σ_t (log μ − log π)                 finite tokens
    ess_token                   (Σ r)² / (N Σ r²) over all tokens (log space; Kong 1992)
    pearson_logp                Pearson correlation of log π and log μ        finite tokens
    nonfinite_frac              tokens with a −inf (or NaN) log-prob           all tokens

  Args:
    logp: [B, T] learner log π; sampler_logp: [B, T] sampler log μ; mask: [B, T].

  Returns:
    dict: `Mean` pairs (combine across micro-batches/hosts by adding) for every mean,
    `Max` for prob_abs_diff_max, per-batch f32 arrays for ess_token and pearson_logp
    (their combination across batches is approximate). Detached.
  """
  fn = "mismatch_metrics"
  m, mf = C.bt_mask(fn, mask, logp=logp, sampler_logp=sampler_logp)
  sg = jax.lax.stop_gradient
  a = C.clean(sg(C.f32(logp)), m)
  b = C.clean(sg(C.f32(sampler_logp)), m)
  fin = m & jnp.isfinite(a) & jnp.isfinite(b)
  n, n_fin = jnp.sum(mf), jnp.sum(fin).astype(C.F32)
  d = jnp.abs(jnp.exp(a) - jnp.exp(b))
  lr = jnp.where(fin, a - b, 0.0)  # log π − log μ
  k3 = jnp.expm1(lr) - lr  # (r − 1) − log r; expm1 avoids cancellation near r = 1
  n_fin_b = jnp.sum(fin, axis=1).astype(C.F32)
  seq_ok = n_fin_b > 0
  log_ppl = C.safe_div(jnp.sum(jnp.where(fin, -lr, 0.0), axis=1), n_fin_b)
  am = C.safe_div(C.msum(a, fin), n_fin)
  bm = C.safe_div(C.msum(b, fin), n_fin)
  cov = C.msum((a - am) * (b - bm), fin)
  va, vb = C.msum((a - am) ** 2, fin), C.msum((b - bm) ** 2, fin)
  den = jnp.sqrt(va * vb)
  return {
    "prob_abs_diff_mean": Mean(C.msum(d, m), n),
    "prob_abs_diff_max": Max(jnp.max(jnp.where(m, d, -jnp.inf))),
    "log_abs_diff_mean": Mean(C.msum(jnp.abs(lr), fin), n_fin),
    "kl_k1": Mean(C.msum(-lr, fin), n_fin),
    "kl_k3": Mean(C.msum(k3, fin), n_fin),
    "log_ppl_ratio": Mean(C.msum(log_ppl, seq_ok), jnp.sum(seq_ok).astype(C.F32)),
    "ess_token": effective_sample_size(C.log_ratio(a, b, m), m),
    "pearson_logp": C.safe_div(cov, den),
    "nonfinite_frac": Mean(C.msum((~fin).astype(C.F32), m), n),
  }
