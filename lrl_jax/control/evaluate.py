"""Greedy evaluation of control policies: float, fake-INT4 (training-time view) or real INT4.

A policy is `apply(params, x[B, in_dim]) -> scores [B, A]` (logits or Q-values); its
action is argmax (greedy) for both PPO and DQN. `make_evaluator` runs a fixed set of
episodes (their reset keys come from one eval key) in parallel until all have ended
(`lax.while_loop`, at most the env's step limit), so arms evaluated with the same key
see the same initial states.
"""

from __future__ import annotations

import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from lrl_jax import quant
from lrl_jax.control import envs as envs_lib
from lrl_jax.control import networks as nets

__all__ = ["make_evaluator", "evaluate", "policy_apply", "policy_params", "greedy_actions", "latency_batch1"]


def policy_params(params: dict) -> dict:
  """The MLP that acts: params["actor"] (PPO) or params["q"] (DQN)."""
  for k in ("actor", "q"):
    if k in params:
      return params[k]
  raise ValueError(f"policy_params: expected an 'actor' (PPO) or 'q' (DQN) entry; got keys {sorted(params)}")


def policy_apply(*, kind: str, spec: quant.Int4 | None = None, activation: str = "tanh") -> Callable:
  """apply(policy, x) for kind "float" (spec None), "qat" (fake-INT4 with spec) or "int4" (a served tree)."""
  if kind == "float":
    return lambda p, x: nets.mlp_apply(p, x, spec=None, activation=activation)
  if kind == "qat":
    if spec is None:
      raise ValueError("policy_apply(kind='qat') needs a spec")
    return lambda p, x: nets.mlp_apply(p, x, spec=spec, activation=activation)
  if kind == "int4":
    return lambda s, x: nets.served_apply(s, x, activation=activation)
  raise ValueError(f"policy_apply: kind must be 'float', 'qat' or 'int4'; got {kind!r}")


def greedy_actions(apply: Callable, policy, x: jax.Array) -> jax.Array:
  """argmax_a apply(policy, x)[..., a] for preprocessed states x [B, in_dim] -> [B] int32."""
  return jnp.argmax(apply(policy, x), axis=-1).astype(jnp.int32)


def make_evaluator(env_name: str, apply: Callable, *, num_episodes: int = 32, pad_multiple: int = 16):
  """evaluate(policy, key) -> (returns [num_episodes] f32, lengths [num_episodes] int32), jit/vmap-able."""
  if num_episodes <= 0:
    raise ValueError(f"make_evaluator: num_episodes must be positive; got {num_episodes}")
  env, env_params = envs_lib.make_env(env_name)
  es = envs_lib.env_spec(env_name, pad_multiple=pad_multiple)

  def run(policy, key):
    k_reset, k_step = jax.random.split(key)
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(k_reset, num_episodes), env_params)
    zeros = jnp.zeros((num_episodes,), jnp.float32)

    def cond(c):
      t, alive = c[0], c[4]
      return jnp.logical_and(t < es.max_steps, jnp.any(alive))

    def body(c):
      t, state, obs, ret, alive, length = c
      x = envs_lib.preprocess(obs, obs_shape=es.obs_shape, in_dim=es.in_dim)
      action = greedy_actions(apply, policy, x)
      keys = jax.random.split(jax.random.fold_in(k_step, t), num_episodes)
      obs, state, reward, term, trunc, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(keys, state, action, env_params)
      ret = ret + jnp.where(alive, reward.astype(jnp.float32), 0.0)
      length = length + alive.astype(jnp.int32)
      alive = jnp.logical_and(alive, jnp.logical_not(jnp.logical_or(term, trunc)))
      return t + 1, state, obs, ret, alive, length

    init = (
      jnp.zeros((), jnp.int32),
      state,
      obs,
      zeros,
      jnp.ones((num_episodes,), bool),
      jnp.zeros((num_episodes,), jnp.int32),
    )
    _, _, _, ret, _, length = jax.lax.while_loop(cond, body, init)
    return ret, length

  return run


def evaluate(
  policy,
  *,
  env_name: str,
  apply: Callable,
  num_episodes: int = 32,
  seed: int = 0,
  pad_multiple: int = 16,
  stacked: bool = False,
):
  """Greedy returns [num_episodes] (or [S, num_episodes] for a seed-stacked `policy`), as numpy.

  The same `seed` gives the same episodes (initial states, env randomness) for every policy.
  """
  run = make_evaluator(env_name, apply, num_episodes=num_episodes, pad_multiple=pad_multiple)
  key = jax.random.key(seed)
  fn = jax.vmap(run, in_axes=(0, None)) if stacked else run
  ret, _ = jax.jit(fn)(policy, key)
  return np.asarray(ret)


def latency_batch1(apply: Callable, policy, in_dim: int, *, calls: int = 2000, repeats: int = 5) -> dict:
  """Median wall time of one jit'd batch-1 forward (+ argmax), microseconds; several interleavable rounds.

  Returns {"median_us", "p10_us", "p90_us"} over `repeats` × `calls` timed calls.
  """
  f = jax.jit(lambda p, x: greedy_actions(apply, p, x))
  x = jnp.zeros((1, in_dim), jnp.float32)
  f(policy, x).block_until_ready()
  ts = []
  for _ in range(repeats):
    for _ in range(calls):
      t0 = time.perf_counter()
      f(policy, x).block_until_ready()
      ts.append(time.perf_counter() - t0)
  ts = np.asarray(ts) * 1e6
  return {
    "median_us": float(np.median(ts)),
    "p10_us": float(np.percentile(ts, 10)),
    "p90_us": float(np.percentile(ts, 90)),
  }
