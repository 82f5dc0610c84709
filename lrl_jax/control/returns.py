"""Return estimators for environment rollouts [T, E] (time-major, one column per vectorised env).

`lrl_jax.losses.gae_advantages` is written for LLM completions: one episode per row that
ends at the last real token (V after it = 0) and no episode boundary inside a row. A
control rollout of T steps crosses episode boundaries (gymnax resets on `done`) and is
cut before its episode ends, so it needs the done-masked, bootstrapped form; with no
`done` in the rollout and a zero bootstrap value the two agree (tested).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["episodic_gae", "dqn_targets"]


def episodic_gae(rewards, values, dones, last_value, *, gamma: float = 0.99, lam: float = 0.95):
  """GAE over a rollout with episode boundaries (Schulman et al. 2016, "High-Dimensional
  Continuous Control Using Generalized Advantage Estimation"):

    δ_t = r_t + γ (1 − d_t) V_{t+1} − V_t,     V_T = last_value (bootstrap),
    A_t = δ_t + γ λ (1 − d_t) A_{t+1},          A_T = 0,
    R_t = A_t + V_t (the value target).

  d_t = 1 when the episode ended at step t (the next observation is a reset).

  Args:
    rewards, values, dones: [T, E].
    last_value: [E] V of the observation after the last step.
    gamma: discount γ; lam: λ.

  Returns:
    (advantages [T, E], returns [T, E]) float32; values are treated as constants.
  """
  for name, a in (("rewards", rewards), ("values", values), ("dones", dones)):
    if jnp.ndim(a) != 2:
      raise ValueError(f"episodic_gae: {name} must be [T, E]; got shape {jnp.shape(a)}")
  if jnp.shape(rewards) != jnp.shape(values) or jnp.shape(rewards) != jnp.shape(dones):
    raise ValueError(
      f"episodic_gae: rewards {jnp.shape(rewards)}, values {jnp.shape(values)}, dones {jnp.shape(dones)} differ"
    )
  if jnp.shape(last_value) != jnp.shape(rewards)[1:]:
    raise ValueError(f"episodic_gae: last_value must be [E] = {jnp.shape(rewards)[1:]}; got {jnp.shape(last_value)}")
  r = jnp.asarray(rewards, jnp.float32)
  v = jax.lax.stop_gradient(jnp.asarray(values, jnp.float32))
  nd = 1.0 - jnp.asarray(dones, jnp.float32)

  def step(carry, x):
    v_next, a_next = carry
    r_t, v_t, nd_t = x
    a_t = r_t + gamma * nd_t * v_next - v_t + gamma * lam * nd_t * a_next
    return (v_t, a_t), a_t

  init = (jax.lax.stop_gradient(jnp.asarray(last_value, jnp.float32)), jnp.zeros_like(r[0]))
  _, adv = jax.lax.scan(step, init, (r, v, nd), reverse=True)
  return adv, adv + v


def dqn_targets(q_next_target, rewards, dones, *, gamma: float = 0.99, q_next_online=None):
  """One-step Q-learning targets (Mnih et al. 2015; double DQN: van Hasselt et al. 2016).

    y = r + γ (1 − d) max_a Q_target(s', a)                         (DQN)
    y = r + γ (1 − d) Q_target(s', argmax_a Q_online(s', a))        (double DQN, q_next_online given)

  Args:
    q_next_target: [B, A] target-network values of s'.
    rewards, dones: [B].
    gamma: discount.
    q_next_online: optional [B, A] online-network values of s' (double DQN).

  Returns:
    [B] float32, no gradient.
  """
  q_next_target = jnp.asarray(q_next_target, jnp.float32)
  if (
    q_next_target.ndim != 2
    or jnp.shape(rewards) != q_next_target.shape[:1]
    or jnp.shape(dones) != q_next_target.shape[:1]
  ):
    raise ValueError(
      f"dqn_targets: q_next_target must be [B, A] and rewards, dones [B]; got "
      f"{q_next_target.shape}, {jnp.shape(rewards)}, {jnp.shape(dones)}"
    )
  if q_next_online is None:
    boot = jnp.max(q_next_target, axis=-1)
  else:
    if jnp.shape(q_next_online) != q_next_target.shape:
      raise ValueError(f"dqn_targets: q_next_online {jnp.shape(q_next_online)} != q_next_target {q_next_target.shape}")
    a = jnp.argmax(q_next_online, axis=-1)
    boot = jnp.take_along_axis(q_next_target, a[:, None], axis=-1)[:, 0]
  y = jnp.asarray(rewards, jnp.float32) + gamma * (1.0 - jnp.asarray(dones, jnp.float32)) * boot
  return jax.lax.stop_gradient(y)
