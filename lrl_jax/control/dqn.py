"""DQN for gymnax control tasks, PureJaxRL style: one jit'd function per run, seeds vmapped.

Replay is a fixed-size circular buffer of arrays (`ReplayBuffer`, a pytree) holding raw
float32 observations; sampled observations pass through `envs.preprocess`, the same
function the rollouts and the deployed policy use. With `group_size` set the online and
the target network both run every forward through `quant.dot_general_for(Int4(G))`: the
target is a float master copy (hard copy every `target_period` updates, or Polyak with
`tau` < 1) that is only ever read through the same fake-INT4 view, so at a sync its
values equal those of the real-INT4 export of the online network.

Each training iteration takes `train_interval` vectorised env steps (ε-greedy, ε linear
from `eps_start` to `eps_end` over `eps_fraction` of training) then one gradient step.
The first `learning_starts` env steps fill the buffer with uniform random actions.
No `lax.cond` in the loop: under vmap over seeds it would run both branches anyway.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import optax

from lrl_jax import quant
from lrl_jax.control import envs as envs_lib
from lrl_jax.control import networks as nets
from lrl_jax.control.ppo import TrainResult, _check_widths, _track_episodes, run_seeds
from lrl_jax.control.returns import dqn_targets

__all__ = [
  "DQNConfig",
  "ReplayBuffer",
  "buffer_init",
  "buffer_add",
  "buffer_sample",
  "make_dqn_train",
  "train_dqn",
  "dqn_init",
  "dqn_loss",
  "epsilon_at",
  "target_update",
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class DQNConfig:
  """DQN hyperparameters (PureJaxRL's CartPole settings: MSE, lr 2.5e-4, hard target copy every 50 updates)."""

  env_name: str = "CartPole-v1"  # a discrete-action gymnax id
  total_steps: int = 200_000  # environment steps per seed (learning_starts included)
  num_envs: int = 8  # vectorised environments
  train_interval: int = 1  # vectorised env steps per gradient step
  buffer_size: int = 20_000  # transitions in the ring buffer
  batch_size: int = 128
  learning_starts: int = 2_000  # env steps of uniform random actions before learning
  lr: float = 2.5e-4
  gamma: float = 0.99
  tau: float = 1.0  # target update: θ' ← τθ + (1 − τ)θ' (1 = hard copy)
  target_period: int = 50  # gradient steps between target updates
  eps_start: float = 1.0
  eps_end: float = 0.05
  eps_fraction: float = 0.5  # fraction of total_steps over which ε decays linearly
  double_dqn: bool = False
  loss: str = "mse"  # "mse" (PureJaxRL) or "huber" (Mnih et al. 2015, δ = 1)
  max_grad_norm: float = 10.0
  hidden: tuple[int, ...] = (64, 64)
  activation: str = "relu"
  group_size: int | None = None  # INT4 QAT group size (16..256); None trains in float32
  pad_multiple: int = 16

  def __post_init__(self):
    for f in (
      "total_steps",
      "num_envs",
      "train_interval",
      "buffer_size",
      "batch_size",
      "target_period",
      "pad_multiple",
    ):
      if int(getattr(self, f)) <= 0:
        raise ValueError(f"DQNConfig.{f} must be positive; got {getattr(self, f)}")
    if not 0.0 < self.tau <= 1.0:
      raise ValueError(f"DQNConfig.tau must be in (0, 1]; got {self.tau}")
    if not 0.0 <= self.eps_end <= self.eps_start <= 1.0:
      raise ValueError(f"DQNConfig: need 0 <= eps_end <= eps_start <= 1; got {self.eps_end}, {self.eps_start}")
    if self.learning_starts < self.num_envs or self.learning_starts >= self.total_steps:
      raise ValueError(f"DQNConfig.learning_starts must be in [num_envs, total_steps); got {self.learning_starts}")
    if self.num_updates < 1:
      raise ValueError(f"DQNConfig: total_steps {self.total_steps} leaves no training iteration")
    if self.loss not in ("mse", "huber"):
      raise ValueError(f"DQNConfig.loss must be 'mse' or 'huber'; got {self.loss!r}")
    if self.activation not in ("tanh", "relu"):
      raise ValueError(f"DQNConfig.activation must be 'tanh' or 'relu'; got {self.activation!r}")
    _check_widths(self)

  @property
  def warmup_iters(self) -> int:
    return self.learning_starts // self.num_envs

  @property
  def num_updates(self) -> int:
    """Gradient steps (= training iterations) per seed."""
    return (self.total_steps - self.warmup_iters * self.num_envs) // (self.num_envs * self.train_interval)

  @property
  def spec(self) -> quant.Int4 | None:
    return None if self.group_size is None else quant.Int4(group_size=self.group_size)


# --------------------------------------------------------------------------- replay


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ReplayBuffer:
  """Circular buffer of transitions. Invariant: rows [0, size) are valid; `ptr` is the next row written.

  Attributes:
    obs, next_obs: [C, *obs_shape] raw float32 observations (s and s', s' before any reset).
    action: [C] int32; reward: [C] float32; done: [C] float32 (1 = s' is terminal).
    ptr, size: int32 scalars.
  """

  obs: jax.Array
  action: jax.Array
  reward: jax.Array
  next_obs: jax.Array
  done: jax.Array
  ptr: jax.Array
  size: jax.Array

  @property
  def capacity(self) -> int:
    return self.action.shape[0]


def buffer_init(capacity: int, obs_shape: tuple[int, ...]) -> ReplayBuffer:
  """An empty buffer of `capacity` transitions."""
  if capacity <= 0:
    raise ValueError(f"buffer_init: capacity must be positive; got {capacity}")
  z = jnp.zeros((capacity, *obs_shape), jnp.float32)
  return ReplayBuffer(
    obs=z,
    action=jnp.zeros((capacity,), jnp.int32),
    reward=jnp.zeros((capacity,), jnp.float32),
    next_obs=z,
    done=jnp.zeros((capacity,), jnp.float32),
    ptr=jnp.zeros((), jnp.int32),
    size=jnp.zeros((), jnp.int32),
  )


def buffer_add(buf: ReplayBuffer, obs, action, reward, next_obs, done) -> ReplayBuffer:
  """Writes a batch of E transitions at rows ptr, ptr+1, ... (mod C), overwriting the oldest."""
  e = action.shape[0]
  if e > buf.capacity:
    raise ValueError(f"buffer_add: batch of {e} transitions exceeds capacity {buf.capacity}")
  idx = (buf.ptr + jnp.arange(e, dtype=jnp.int32)) % buf.capacity
  return ReplayBuffer(
    obs=buf.obs.at[idx].set(jnp.asarray(obs, jnp.float32)),
    action=buf.action.at[idx].set(jnp.asarray(action, jnp.int32)),
    reward=buf.reward.at[idx].set(jnp.asarray(reward, jnp.float32)),
    next_obs=buf.next_obs.at[idx].set(jnp.asarray(next_obs, jnp.float32)),
    done=buf.done.at[idx].set(jnp.asarray(done, jnp.float32)),
    ptr=(buf.ptr + e) % buf.capacity,
    size=jnp.minimum(buf.size + e, buf.capacity),
  )


def buffer_sample(buf: ReplayBuffer, key: jax.Array, batch_size: int):
  """Uniform sample with replacement from the valid rows: (obs, action, reward, next_obs, done), raw."""
  idx = jax.random.randint(key, (batch_size,), 0, jnp.maximum(buf.size, 1))
  return buf.obs[idx], buf.action[idx], buf.reward[idx], buf.next_obs[idx], buf.done[idx]


# --------------------------------------------------------------------------- learner


def dqn_init(key: jax.Array, cfg: DQNConfig) -> dict:
  """{"q": MLP in_dim -> hidden -> A}."""
  es = envs_lib.env_spec(cfg.env_name, pad_multiple=cfg.pad_multiple)
  return {"q": nets.mlp_init(key, (es.in_dim, *cfg.hidden, es.num_actions), in_features=es.obs_dim)}


def epsilon_at(cfg: DQNConfig, env_steps):
  """ε after `env_steps` environment steps: linear from eps_start to eps_end over eps_fraction · total."""
  frac = jnp.clip(jnp.asarray(env_steps, jnp.float32) / (cfg.eps_fraction * cfg.total_steps + 1e-8), 0.0, 1.0)
  return cfg.eps_start + frac * (cfg.eps_end - cfg.eps_start)


def target_update(online, target, *, tau: float, do_update):
  """θ' ← τθ + (1 − τ)θ' where `do_update`, else θ' (float masters; read through the QAT view)."""
  return jax.tree.map(
    lambda o, t: jnp.where(do_update, tau * o + (1.0 - tau) * t if tau < 1.0 else o, t), online, target
  )


def dqn_loss(params, target, batch, *, cfg: DQNConfig) -> jax.Array:
  """TD loss on a replay batch of raw transitions (obs, action, reward, next_obs, done).

  Observations pass through `envs.preprocess` (as in deployment); online and target
  networks both run through the fake-INT4 view when `cfg.group_size` is set:
    y = dqn_targets(Q_target(s'), r, d),  loss = mean ½(Q(s, a) − y)² (or Huber).
  """
  es = envs_lib.env_spec(cfg.env_name, pad_multiple=cfg.pad_multiple)
  qnet = lambda p, x: nets.mlp_apply(p["q"], x, spec=cfg.spec, activation=cfg.activation)
  obs, action, reward, next_obs, done = batch
  x = envs_lib.preprocess(obs, obs_shape=es.obs_shape, in_dim=es.in_dim)
  x2 = envs_lib.preprocess(next_obs, obs_shape=es.obs_shape, in_dim=es.in_dim)
  q = jnp.take_along_axis(qnet(params, x), action[:, None], axis=-1)[:, 0]
  q_next_online = jax.lax.stop_gradient(qnet(params, x2)) if cfg.double_dqn else None
  y = dqn_targets(qnet(target, x2), reward, done, gamma=cfg.gamma, q_next_online=q_next_online)
  if cfg.loss == "huber":
    return jnp.mean(optax.huber_loss(q, y, delta=1.0))
  return 0.5 * jnp.mean((q - y) ** 2)


def make_dqn_train(cfg: DQNConfig):
  """train(key) -> ({"q": online, "q_target": target}, (episode_return_sum [U], episode_count [U])) for one seed.

  jit / vmap it. Both networks are float32 masters; with `group_size` set, both are only
  ever applied through the fake-INT4 view.
  """
  env, env_params = envs_lib.make_env(cfg.env_name)
  es = envs_lib.env_spec(cfg.env_name, pad_multiple=cfg.pad_multiple)
  spec = cfg.spec
  pre = lambda o: envs_lib.preprocess(o, obs_shape=es.obs_shape, in_dim=es.in_dim)
  qnet = lambda p, x: nets.mlp_apply(p["q"], x, spec=spec, activation=cfg.activation)
  tx = optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), optax.adam(cfg.lr))

  loss_fn = functools.partial(dqn_loss, cfg=cfg)

  def env_step(params, env_state, obs, ep_ret, buf, key, steps, random_only):
    k_eps, k_rand, k_env = jax.random.split(key, 3)
    greedy = jnp.argmax(qnet(params, pre(obs)), axis=-1)
    rand = jax.random.randint(k_rand, (cfg.num_envs,), 0, es.num_actions)
    eps = 1.0 if random_only else epsilon_at(cfg, steps)
    action = jnp.where(jax.random.uniform(k_eps, (cfg.num_envs,)) < eps, rand, greedy)
    obs2, env_state, reward, term, trunc, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
      jax.random.split(k_env, cfg.num_envs), env_state, action, env_params
    )
    reward = reward.astype(jnp.float32)
    # s' is the pre-reset observation; only termination (not a time-limit cut) stops bootstrapping.
    buf = buffer_add(buf, obs, action, reward, info["final_observation"], term)
    ep_ret, rsum, rcnt = _track_episodes(ep_ret, reward, jnp.logical_or(term, trunc))
    return env_state, obs2, ep_ret, buf, rsum, rcnt

  def train(key):
    k_init, k_reset, k_warm, k_run = jax.random.split(key, 4)
    params = dqn_init(k_init, cfg)
    target = params
    opt_state = tx.init(params)
    obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(k_reset, cfg.num_envs), env_params)
    buf = buffer_init(cfg.buffer_size, es.obs_shape)
    ep_ret = jnp.zeros((cfg.num_envs,), jnp.float32)

    def warm(carry, k):
      env_state, obs, ep_ret, buf = carry
      env_state, obs, ep_ret, buf, _, _ = env_step(params, env_state, obs, ep_ret, buf, k, 0, True)
      return (env_state, obs, ep_ret, buf), None

    (env_state, obs, ep_ret, buf), _ = jax.lax.scan(
      warm, (env_state, obs, ep_ret, buf), jax.random.split(k_warm, cfg.warmup_iters)
    )
    steps0 = cfg.warmup_iters * cfg.num_envs

    def update(carry, it):
      params, target, opt_state, env_state, obs, ep_ret, buf, key = carry
      key = jax.random.fold_in(key, it)
      k_act, k_sample = jax.random.split(key)

      def act(c, k_i):
        env_state, obs, ep_ret, buf, rsum, rcnt = c
        k, i = k_i
        steps = steps0 + (it * cfg.train_interval + i) * cfg.num_envs
        env_state, obs, ep_ret, buf, s, n = env_step(params, env_state, obs, ep_ret, buf, k, steps, False)
        return (env_state, obs, ep_ret, buf, rsum + s, rcnt + n), None

      (env_state, obs, ep_ret, buf, rsum, rcnt), _ = jax.lax.scan(
        act,
        (env_state, obs, ep_ret, buf, 0.0, 0.0),
        (jax.random.split(k_act, cfg.train_interval), jnp.arange(cfg.train_interval)),
      )
      batch = buffer_sample(buf, k_sample, cfg.batch_size)
      grads = jax.grad(loss_fn)(params, target, batch)
      updates, opt_state = tx.update(grads, opt_state, params)
      params = optax.apply_updates(params, updates)
      target = target_update(params, target, tau=cfg.tau, do_update=(it + 1) % cfg.target_period == 0)
      return (params, target, opt_state, env_state, obs, ep_ret, buf, key), (rsum, rcnt)

    init = (params, target, opt_state, env_state, obs, ep_ret, buf, k_run)
    (params, target, *_), curve = jax.lax.scan(update, init, jnp.arange(cfg.num_updates))
    return {"q": params["q"], "q_target": target["q"]}, curve

  return train


def train_dqn(cfg: DQNConfig, seeds: Sequence[int]) -> TrainResult:
  """Trains one DQN run per seed, all seeds vmapped in one compiled call."""
  params, (rsum, rcnt) = run_seeds(make_dqn_train(cfg), seeds, "train_dqn")
  steps = cfg.warmup_iters * cfg.num_envs + (jnp.arange(cfg.num_updates) + 1) * cfg.num_envs * cfg.train_interval
  return TrainResult(params=params, episode_return_sum=rsum, episode_count=rcnt, env_steps=steps, config=cfg)
