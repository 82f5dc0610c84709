"""gymnax environments and the one observation preprocessing shared by rollouts, replay and deployment.

Observations are flattened, cast to float32 and zero-padded on the feature axis to a
multiple of `pad_multiple` (16 by default): the INT4 group size (16..256) must divide
the first kernel's contraction axis K, and CartPole (4), Acrobot (6) or Catch (50)
features do not. Padded features are always 0, so the padded rows of the first kernel
see zero input: they are zero-initialised and receive zero gradient (∂L/∂W = xᵀg).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

__all__ = ["ENV_NAMES", "EnvSpec", "make_env", "env_spec", "preprocess"]

# Environments this package is tested on (any discrete-action gymnax env name works).
ENV_NAMES = ("CartPole-v1", "Acrobot-v1", "Catch-bsuite")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvSpec:
  """Static facts about an environment after preprocessing.

  Attributes:
    name: gymnax id.
    obs_shape: raw observation shape.
    obs_dim: flattened raw features.
    in_dim: padded width fed to the network (a multiple of `pad_multiple`).
    num_actions: discrete actions.
    max_steps: episode step limit (evaluation runs this many steps).
  """

  name: str
  obs_shape: tuple[int, ...]
  obs_dim: int
  in_dim: int
  num_actions: int
  max_steps: int


def make_env(name: str):
  """(env, env_params) of a discrete-action gymnax environment.

  Raises:
    ValueError naming the environment and the valid ids if it is unknown or not discrete.
  """
  import gymnax  # imported lazily: gymnax is the optional `control` extra  # noqa: PLC0415

  if name not in gymnax.registered_envs:
    raise ValueError(
      f"unknown gymnax environment {name!r}; tested: {list(ENV_NAMES)}; registered: {list(gymnax.registered_envs)}"
    )
  env, params = gymnax.make(name)
  if not hasattr(env.action_space(params), "n"):
    raise ValueError(f"environment {name!r} has a continuous action space; control PPO/DQN need discrete actions")
  return env, params


def env_spec(name: str, *, pad_multiple: int = 16) -> EnvSpec:
  """Static shapes of `name` with observations padded to a multiple of `pad_multiple`."""
  if pad_multiple <= 0:
    raise ValueError(f"pad_multiple must be positive; got {pad_multiple}")
  env, params = make_env(name)
  shape = tuple(env.observation_space(params).shape)
  d = math.prod(shape)
  return EnvSpec(
    name=name,
    obs_shape=shape,
    obs_dim=d,
    in_dim=-(-d // pad_multiple) * pad_multiple,
    num_actions=int(env.action_space(params).n),
    max_steps=int(params.max_steps_in_episode),
  )


def preprocess(obs: jax.Array, *, obs_shape: tuple[int, ...], in_dim: int) -> jax.Array:
  """Raw observations [..., *obs_shape] -> network input [..., in_dim] float32, zero-padded.

  The only activation handling of the control stack: rollouts, replay-buffer samples
  and the deployed INT4 policy all call it.
  """
  obs = jnp.asarray(obs)
  nlead = obs.ndim - len(obs_shape)
  if nlead < 0 or tuple(obs.shape[nlead:]) != tuple(obs_shape):
    raise ValueError(f"preprocess: observation shape {tuple(obs.shape)} does not end in {tuple(obs_shape)}")
  x = obs.reshape(obs.shape[:nlead] + (-1,)).astype(jnp.float32)
  d = x.shape[-1]
  if d > in_dim:
    raise ValueError(f"preprocess: {d} features do not fit in_dim {in_dim}")
  return jnp.pad(x, [(0, 0)] * nlead + [(0, in_dim - d)])
