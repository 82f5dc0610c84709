"""Advantage estimators: GRPO (with / without std), Dr.GRPO, RLOO, masked GAE, whitening.

Outcome rewards are [B] with the G completions of a prompt contiguous: rows
g·G … g·G + G − 1 form group g (B = number of prompts × G). An optional `mask` [B]
drops completions (filtered, truncated, padding): group statistics use the kept ones
only, and dropped rows get advantage 0. Everything is computed in f32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lrl_jax.losses import _common as C

__all__ = ["grpo_advantages", "dr_grpo_advantages", "rloo_advantages", "gae_advantages", "normalize_advantages"]


def _groups(fn: str, rewards, mask, group_size: int):
  C.check_rank(fn, "rewards", rewards, 1, "[B]")
  if not isinstance(group_size, int) or group_size < 1:
    raise ValueError(f"{fn}: group_size must be a positive int; got {group_size!r}")
  b = rewards.shape[0]
  if b % group_size:
    raise ValueError(f"{fn}: rewards [B] = {rewards.shape} is not a whole number of groups of group_size={group_size}")
  if mask is None:
    m = jnp.ones((b,), jnp.bool_)
  else:
    C.check_same(fn, "rewards", rewards.shape, mask=mask)
    m = jnp.asarray(mask)
    m = m if m.dtype == jnp.bool_ else m != 0
  shape = (b // group_size, group_size)
  m = m.reshape(shape)
  r = jnp.where(m, C.f32(rewards).reshape(shape), 0.0)
  n = jnp.sum(m, axis=1, keepdims=True).astype(C.F32)
  return r, m, n


def grpo_advantages(
  rewards, *, group_size: int, mask=None, scale_by_std: bool = True, eps: float = 1e-6, ddof: int = 1
) -> jax.Array:
  """GRPO group-normalised outcome advantage (Shao et al. 2024, DeepSeekMath).

  A_i = (r_i − mean_g(r)) / (std_g(r) + ε), mean and std over the kept completions of
  the group of i; std with `ddof` (1, the unbiased estimate, as torch.std in TRL / verl).
  `scale_by_std=False` gives A_i = r_i − mean_g(r): Dr.GRPO (Liu et al. 2025), which
  drops the std because it reweights questions by their difficulty.

  Args:
    rewards: [B] outcome rewards, groups contiguous.
    group_size: G.
    mask: optional [B] kept completions (1 = kept).
    scale_by_std: divide by the group std (GRPO) or not (Dr.GRPO).
    eps: ε added to the std (a group with equal rewards gets advantage 0).
    ddof: delta degrees of freedom of the std; a group with ≤ ddof kept gets std 0.

  Returns:
    [B] f32 advantages, 0 for dropped completions.
  """
  fn = "grpo_advantages"
  r, m, n = _groups(fn, rewards, mask, group_size)
  mean = C.safe_div(jnp.sum(r, axis=1, keepdims=True), n)
  centred = jnp.where(m, r - mean, 0.0)
  if scale_by_std:
    var = C.safe_div(jnp.sum(centred**2, axis=1, keepdims=True), jnp.maximum(n - ddof, 0.0))
    std = jnp.sqrt(jnp.where(var > 0, var, 1.0))  # sqrt'(0) = inf: keep it out of the gradient
    std = jnp.where(var > 0, std, 0.0)
    centred = centred / (std + eps)
  return centred.reshape(-1)


def dr_grpo_advantages(rewards, *, group_size: int, mask=None) -> jax.Array:
  """Dr.GRPO advantage A_i = r_i − mean_g(r) (Liu et al. 2025, "Understanding R1-Zero-Like Training")."""
  return grpo_advantages(rewards, group_size=group_size, mask=mask, scale_by_std=False)


def rloo_advantages(rewards, *, group_size: int, mask=None) -> jax.Array:
  """REINFORCE leave-one-out (Ahmadian et al. 2024; Kool et al. 2019).

  A_i = r_i − (1/(n − 1)) Σ_{j≠i} r_j = n/(n − 1) · (r_i − mean_g(r)), n = kept in the group.

  Args:
    rewards: [B] outcome rewards, groups contiguous; group_size: G; mask: optional [B].

  Returns:
    [B] f32; 0 for dropped completions and for groups with a single kept completion.
  """
  r, m, n = _groups("rloo_advantages", rewards, mask, group_size)
  total = jnp.sum(r, axis=1, keepdims=True)
  baseline = C.safe_div(total - r, n - 1.0)
  ok = m & (n > 1)
  return jnp.where(ok, r - baseline, 0.0).reshape(-1)


def gae_advantages(rewards, values, mask, *, gamma: float = 1.0, lam: float = 0.95):
  """Generalised advantage estimation over the real tokens of each sequence (Schulman et al. 2016).

  With k_0 < k_1 < … the real (mask = 1) positions of a row, masked positions skipped
  (padding, or tool / prompt tokens inside a multi-turn completion):
    δ_k = r_k + γ V_{next(k)} − V_k,   V after the last real token = 0 (terminal),
    A_k = Σ_{j ≥ 0} (γλ)^j δ_{k+j}  (k+j: the j-th real position from k),
    R_k = A_k + V_k (the value target).
  Computed as a backward `lax.scan` over T carrying (V_next, A_next).

  Args:
    rewards: [B, T] per-token rewards (an outcome reward sits on the last real token).
    values: [B, T] V(s_t) (treated as a constant).
    mask: [B, T].
    gamma: discount γ; lam: GAE λ.

  Returns:
    (advantages [B, T], returns [B, T]), f32, 0 where masked.
  """
  fn = "gae_advantages"
  m, _ = C.bt_mask(fn, mask, rewards=rewards, values=values)
  r = C.clean(rewards, m)
  v = C.clean(jax.lax.stop_gradient(C.f32(values)), m)

  def step(carry, x):
    v_next, a_next = carry
    r_t, v_t, m_t = x
    delta = r_t + gamma * v_next - v_t
    a_t = delta + gamma * lam * a_next
    carry = (jnp.where(m_t, v_t, v_next), jnp.where(m_t, a_t, a_next))
    return carry, jnp.where(m_t, a_t, 0.0)

  b = r.shape[0]
  init = (jnp.zeros((b,), C.F32), jnp.zeros((b,), C.F32))
  _, adv_tb = jax.lax.scan(step, init, (r.T, v.T, m.T), reverse=True)
  adv = adv_tb.T
  return adv, jnp.where(m, adv + v, 0.0)


def normalize_advantages(adv, mask, *, eps: float = 1e-8, shift_mean: bool = True) -> jax.Array:
  """Whitens advantages over the real tokens of the batch: (A − mean) / (std + ε) (PPO practice).

  Args:
    adv: [B, T]; mask: [B, T]; eps: ε; shift_mean: subtract the mean (else only rescale).

  Returns:
    [B, T] f32, 0 where masked; std is the population std over real tokens.
  """
  m, mf = C.bt_mask("normalize_advantages", mask, adv=adv)
  a = C.clean(adv, m)
  n = jnp.sum(mf)
  mean = C.safe_div(jnp.sum(a), n)
  var = C.safe_div(C.msum((a - mean) ** 2, m), n)
  std = jnp.where(var > 0, jnp.sqrt(jnp.where(var > 0, var, 1.0)), 0.0)
  out = (a - mean if shift_mean else a) / (std + eps)
  return jnp.where(m, out, 0.0)
