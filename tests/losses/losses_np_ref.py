"""Float64 NumPy references for lrl_jax.losses, written from the papers' formulas with plain loops.

Deliberately naive (explicit per-sequence / per-token loops) so that they share no code and
no vectorisation trick with the implementation under test.
"""

from __future__ import annotations

import math

import numpy as np


def f64(x):
  return np.asarray(x, dtype=np.float64)


def real_positions(mask_row):
  return [t for t in range(len(mask_row)) if mask_row[t]]


# ------------------------------------------------------------------ aggregation


def aggregate(loss, mask, agg, norm_len=None):
  loss, mask = f64(loss), np.asarray(mask, bool)
  b, t = loss.shape
  seqs = [i for i in range(b) if mask[i].any()]
  if agg == "token-mean":
    n = mask.sum()
    return sum(loss[i, j] for i in range(b) for j in range(t) if mask[i, j]) / n if n else 0.0
  if not seqs:
    return 0.0
  if agg == "seq-mean-token-mean":
    return sum(np.mean([loss[i, j] for j in real_positions(mask[i])]) for i in seqs) / len(seqs)
  total = sum(loss[i, j] for i in seqs for j in real_positions(mask[i]))
  if agg == "seq-mean-token-sum":
    return total / len(seqs)
  if agg == "seq-mean-token-sum-norm":
    return total / (len(seqs) * (t if norm_len is None else norm_len))
  raise ValueError(agg)


# ------------------------------------------------------------------ advantages


def grpo(rewards, group_size, mask=None, scale_by_std=True, eps=1e-6, ddof=1):
  r = f64(rewards)
  keep = np.ones(len(r), bool) if mask is None else np.asarray(mask, bool)
  out = np.zeros(len(r))
  for g in range(len(r) // group_size):
    idx = [i for i in range(g * group_size, (g + 1) * group_size) if keep[i]]
    if not idx:
      continue
    vals = [r[i] for i in idx]
    mean = sum(vals) / len(vals)
    for i in idx:
      a = r[i] - mean
      if scale_by_std:
        n = len(vals)
        var = sum((v - mean) ** 2 for v in vals) / (n - ddof) if n > ddof else 0.0
        a = a / (math.sqrt(var) + eps)
      out[i] = a
  return out


def rloo(rewards, group_size, mask=None):
  r = f64(rewards)
  keep = np.ones(len(r), bool) if mask is None else np.asarray(mask, bool)
  out = np.zeros(len(r))
  for g in range(len(r) // group_size):
    idx = [i for i in range(g * group_size, (g + 1) * group_size) if keep[i]]
    if len(idx) < 2:
      continue
    for i in idx:
      others = [r[j] for j in idx if j != i]
      out[i] = r[i] - sum(others) / len(others)
  return out


def gae_double_loop(rewards, values, mask, gamma, lam):
  """A_k = Σ_j (γλ)^j δ_{k_j}, δ_k = r_k + γ V_next − V_k, over the real positions only."""
  r, v, mask = f64(rewards), f64(values), np.asarray(mask, bool)
  adv = np.zeros_like(r)
  for b in range(r.shape[0]):
    pos = real_positions(mask[b])
    deltas = []
    for n, k in enumerate(pos):
      v_next = v[b, pos[n + 1]] if n + 1 < len(pos) else 0.0
      deltas.append(r[b, k] + gamma * v_next - v[b, k])
    for n, k in enumerate(pos):
      adv[b, k] = sum((gamma * lam) ** j * deltas[n + j] for j in range(len(pos) - n))
  ret = np.where(mask, adv + v, 0.0)
  return adv, ret


# ------------------------------------------------------------------ policy


def ppo_per_token(logp, old_logp, adv, eps_low, eps_high, dual_c=None):
  """Returns (per-token loss ℓ, dℓ/dlogp) for one token, float64 scalars."""
  r = math.exp(logp - old_logp)
  s1 = r * adv
  s2 = min(max(r, 1 - eps_low), 1 + eps_high) * adv
  obj, grad = (s1, s1) if s1 <= s2 else (s2, 0.0)  # d(r·A)/dlogp = r·A
  if dual_c is not None and adv < 0 and dual_c * adv > obj:
    obj, grad = dual_c * adv, 0.0
  return -obj, -grad


def ppo_loss(
  logp, old_logp, adv, mask, *, eps_low=0.2, eps_high=0.28, dual_c=None, agg="token-mean", norm_len=None, weights=None
):
  """Loss and its gradient w.r.t. logp (analytic, per token), float64."""
  logp, old_logp, mask = f64(logp), f64(old_logp), np.asarray(mask, bool)
  adv = f64(adv)
  if adv.ndim == 1:
    adv = np.repeat(adv[:, None], logp.shape[1], axis=1)
  w = np.ones_like(logp) if weights is None else f64(weights)
  ell = np.zeros_like(logp)
  dell = np.zeros_like(logp)
  for i in range(logp.shape[0]):
    for j in range(logp.shape[1]):
      if mask[i, j]:
        l, g = ppo_per_token(logp[i, j], old_logp[i, j], adv[i, j], eps_low, eps_high, dual_c)
        ell[i, j], dell[i, j] = w[i, j] * l, w[i, j] * g
  loss = aggregate(ell, mask, agg, norm_len)
  # The aggregation is linear in ℓ: its gradient is the aggregation's coefficient per token.
  coef = np.zeros_like(logp)
  for i in range(logp.shape[0]):
    for j in range(logp.shape[1]):
      if mask[i, j]:
        e = np.zeros_like(logp)
        e[i, j] = 1.0
        coef[i, j] = aggregate(e, mask, agg, norm_len)
  return loss, coef * dell


def gspo_loss(logp, old_logp, adv_seq, mask, *, eps_low, eps_high):
  """GSPO as written in the paper: −(1/|S|) Σ_i min(s_i A_i, clip(s_i) A_i), s_i = exp(mean log ratio)."""
  logp, old_logp, mask = f64(logp), f64(old_logp), np.asarray(mask, bool)
  terms = []
  for i in range(logp.shape[0]):
    pos = real_positions(mask[i])
    if not pos:
      continue
    s = math.exp(sum(logp[i, t] - old_logp[i, t] for t in pos) / len(pos))
    a = float(adv_seq[i])
    terms.append(-min(s * a, min(max(s, 1 - eps_low), 1 + eps_high) * a))
  return sum(terms) / len(terms) if terms else 0.0


def kl(logp, ref_logp, mask, estimator):
  out = np.zeros(np.shape(logp))
  for i, j in zip(*np.nonzero(np.asarray(mask, bool))):
    log_r = float(ref_logp[i, j]) - float(logp[i, j])
    out[i, j] = {"k1": -log_r, "k2": 0.5 * log_r**2, "k3": math.exp(log_r) - 1 - log_r}[estimator]
  return out


def entropy(logits, mask):
  z = f64(logits)
  out = np.zeros(z.shape[:2])
  for i, j in zip(*np.nonzero(np.asarray(mask, bool))):
    p = np.exp(z[i, j] - z[i, j].max())
    p /= p.sum()
    out[i, j] = -sum(pk * math.log(pk) for pk in p if pk > 0)
  return out


# ------------------------------------------------------------------ corrections


def token_log_ratio(a, b):
  if a == -math.inf and b == -math.inf:
    return 0.0
  return a - b


def ess(weights):
  w = f64(weights)
  if len(w) == 0:
    return 0.0
  if np.isinf(w).any():
    return np.isinf(w).sum() / len(w)
  return w.sum() ** 2 / (len(w) * (w**2).sum()) if (w**2).sum() > 0 else 0.0


def tis(old_logp, sampler_logp, mask, *, level, c, normalize):
  mask = np.asarray(mask, bool)
  b, t = mask.shape
  w = np.zeros((b, t))
  if level == "token":
    units = [(i, j) for i in range(b) for j in range(t) if mask[i, j]]
    vals = {}
    for i, j in units:
      lr = token_log_ratio(float(old_logp[i, j]), float(sampler_logp[i, j]))
      vals[(i, j)] = min(math.exp(lr) if lr < 700 else math.inf, c)
  else:
    units = [i for i in range(b) if mask[i].any()]
    vals = {}
    for i in units:
      s = sum(token_log_ratio(float(old_logp[i, j]), float(sampler_logp[i, j])) for j in real_positions(mask[i]))
      vals[i] = 0.0 if math.isnan(s) else min(math.exp(min(s, 700.0)), c)
  if normalize and units:
    mean = sum(vals.values()) / len(units)
    vals = {k: v / mean for k, v in vals.items()}
  for k, v in vals.items():
    if level == "token":
      w[k] = v
    else:
      w[k, mask[k]] = v
  return w, vals


def mis(old_logp, sampler_logp, mask, *, level, lo, hi, keep_ratio=False):
  mask = np.asarray(mask, bool)
  b, t = mask.shape
  w = np.zeros((b, t))
  rejected = []
  for i in range(b):
    pos = real_positions(mask[i])
    lrs = [token_log_ratio(float(old_logp[i, j]), float(sampler_logp[i, j])) for j in pos]
    if level == "token":
      for j, lr in zip(pos, lrs):
        rho = math.exp(lr) if lr < 700 else math.inf
        ok = lo <= rho <= hi
        w[i, j] = (rho if keep_ratio else 1.0) if ok else 0.0
        rejected.append(not ok)
    elif pos:
      s = sum(lrs)
      if level == "geometric" and not math.isnan(s):
        s /= len(pos)
      rho = math.nan if math.isnan(s) else (math.exp(s) if s < 700 else math.inf)
      ok = (not math.isnan(rho)) and lo <= rho <= hi
      w[i, pos] = (rho if keep_ratio else 1.0) if ok else 0.0
      rejected.append(not ok)
  return w, rejected


def acrl(old_logp, sampler_logp, adv, mask, *, x=None, gamma=0.65, c=2.0, full=False):
  """Returns (weights, X used); X measured on this batch when x is None. full: also the per-token lists of α and
  ρ (before the clip at c) over the real tokens."""
  mask = np.asarray(mask, bool)
  b, t = mask.shape
  adv = f64(adv)
  if adv.ndim == 1:
    adv = np.repeat(adv[:, None], t, axis=1)
  ys = {}
  for i in range(b):
    pos = real_positions(mask[i])
    if pos:
      ys[i] = sum(abs(math.exp(float(old_logp[i, j])) - math.exp(float(sampler_logp[i, j]))) for j in pos) / len(pos)
  if x is None:
    x = sum(ys.values()) / len(ys)
  w = np.zeros((b, t))
  alphas, rhos = [], []
  for i, y in ys.items():
    for j in real_positions(mask[i]):
      alpha = gamma * np.sign(adv[i, j]) * ((1 - y / x) if x > 0 else 0.0)
      p, mu = math.exp(float(old_logp[i, j])), math.exp(float(sampler_logp[i, j]))
      if alpha == 0:
        rho = 1.0
      elif p == 0 and mu == 0:
        rho = 1.0
      elif mu == 0:
        rho = math.inf if alpha > 0 else 0.0
      elif p == 0:
        rho = 0.0 if alpha > 0 else math.inf
      else:
        rho = (p / mu) ** alpha
      w[i, j] = min(rho, c)
      alphas.append(alpha)
      rhos.append(rho)
  return (w, x, alphas, rhos) if full else (w, x)
