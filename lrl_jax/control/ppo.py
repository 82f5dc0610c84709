"""PPO for gymnax control tasks, PureJaxRL style: one jit'd function per run, seeds vmapped.

Actor and critic are separate MLPs (`networks`); with `group_size` set, every dense layer
of both is fake-quantized to INT4 (W4A16 QAT, `quant.dot_general_for(quant.Int4(G))`),
in the rollouts as well as in the update, so the behaviour policy is the INT4 policy.
Clipped surrogate and entropy come from `lrl_jax.losses` (`ppo_loss`, `entropy_from_logits`,
`normalize_advantages`); GAE is `returns.episodic_gae` (rollouts cross episode boundaries).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import optax

from lrl_jax import losses, quant
from lrl_jax.control import envs as envs_lib
from lrl_jax.control import networks as nets
from lrl_jax.control.returns import episodic_gae

__all__ = ["PPOConfig", "TrainResult", "make_ppo_train", "train_ppo", "ppo_init"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PPOConfig:
  """PPO hyperparameters (defaults: PureJaxRL's CartPole settings, more envs per update)."""

  env_name: str = "CartPole-v1"  # a discrete-action gymnax id
  total_steps: int = 200_000  # environment steps per seed
  num_envs: int = 16  # vectorised environments
  num_steps: int = 64  # rollout length per env and update
  update_epochs: int = 4  # passes over each rollout
  num_minibatches: int = 4  # minibatches per pass
  lr: float = 2.5e-3  # Adam step size (linearly annealed to 0 when anneal_lr)
  anneal_lr: bool = True
  gamma: float = 0.99
  gae_lambda: float = 0.95
  clip_eps: float = 0.2  # ε of the clipped surrogate (and of the value clip)
  ent_coef: float = 0.01
  vf_coef: float = 0.5
  max_grad_norm: float = 0.5
  hidden: tuple[int, ...] = (64, 64)  # hidden widths (each a multiple of the group size)
  activation: str = "tanh"
  group_size: int | None = None  # INT4 QAT group size (16..256); None trains in float32
  pad_multiple: int = 16  # observations are zero-padded to a multiple of this

  def __post_init__(self):
    for f in ("total_steps", "num_envs", "num_steps", "update_epochs", "num_minibatches", "pad_multiple"):
      if int(getattr(self, f)) <= 0:
        raise ValueError(f"PPOConfig.{f} must be positive; got {getattr(self, f)}")
    if (self.num_envs * self.num_steps) % self.num_minibatches:
      raise ValueError(
        f"PPOConfig: num_envs * num_steps = {self.num_envs * self.num_steps} is not divisible by "
        f"num_minibatches = {self.num_minibatches}"
      )
    if self.num_updates < 1:
      raise ValueError(f"PPOConfig: total_steps {self.total_steps} < one rollout ({self.num_envs * self.num_steps})")
    if self.activation not in ("tanh", "relu"):
      raise ValueError(f"PPOConfig.activation must be 'tanh' or 'relu'; got {self.activation!r}")
    _check_widths(self)

  @property
  def num_updates(self) -> int:
    return self.total_steps // (self.num_envs * self.num_steps)

  @property
  def spec(self) -> quant.Int4 | None:
    return None if self.group_size is None else quant.Int4(group_size=self.group_size)


def _check_widths(cfg) -> None:
  """Validates the env name and that the group size divides every kernel's K (padded input, hiddens)."""
  es = envs_lib.env_spec(cfg.env_name, pad_multiple=cfg.pad_multiple)
  if cfg.group_size is None:
    return
  spec = quant.Int4(group_size=cfg.group_size)  # validates the group size itself
  for what, k in [
    (
      f"padded observation width ({es.obs_dim} features padded to a multiple of pad_multiple={cfg.pad_multiple})",
      es.in_dim,
    )
  ] + [("hidden width", h) for h in cfg.hidden]:
    if k % spec.group_size:
      raise ValueError(
        f"{type(cfg).__name__}: group_size {spec.group_size} does not divide the {what} {k}; "
        f"use a group size dividing it or set pad_multiple / hidden to multiples of {spec.group_size}"
      )


@dataclasses.dataclass(frozen=True)
class TrainResult:
  """What a training run returns, every array with a leading seed axis [S, ...].

  Attributes:
    params: float32 master parameters (PPO: {"actor", "critic"}; DQN: {"q", "q_target"}).
    episode_return_sum, episode_count: [S, U] sums and counts of the returns of episodes
      that ended during update u (behaviour policy: sampled / ε-greedy).
    env_steps: [U] environment steps per seed at the end of update u.
    config: the config.
  """

  params: dict
  episode_return_sum: jax.Array
  episode_count: jax.Array
  env_steps: jax.Array
  config: object

  def curve(self):
    """[S, U] mean training-episode return per update (NaN where no episode ended)."""
    c = jnp.asarray(self.episode_count)
    return jnp.where(c > 0, jnp.asarray(self.episode_return_sum) / jnp.maximum(c, 1), jnp.nan)


def ppo_init(key: jax.Array, cfg: PPOConfig) -> dict:
  """{"actor": MLP in_dim -> hidden -> A (head gain 0.01), "critic": MLP in_dim -> hidden -> 1}."""
  es = envs_lib.env_spec(cfg.env_name, pad_multiple=cfg.pad_multiple)
  ka, kc = jax.random.split(key)
  return {
    "actor": nets.mlp_init(ka, (es.in_dim, *cfg.hidden, es.num_actions), in_features=es.obs_dim, head_scale=0.01),
    "critic": nets.mlp_init(kc, (es.in_dim, *cfg.hidden, 1), in_features=es.obs_dim, head_scale=1.0),
  }


def _track_episodes(ep_ret, reward, done):
  """Running episode returns [E] -> (new running returns, sum and count of finished episodes)."""
  total = ep_ret + reward
  d = done.astype(jnp.float32)
  return total * (1.0 - d), jnp.sum(total * d), jnp.sum(d)


def make_ppo_train(cfg: PPOConfig):
  """train(key) -> (params, (episode_return_sum [U], episode_count [U])) for one seed; jit / vmap it."""
  env, env_params = envs_lib.make_env(cfg.env_name)
  es = envs_lib.env_spec(cfg.env_name, pad_multiple=cfg.pad_multiple)
  spec = cfg.spec
  pre = lambda o: envs_lib.preprocess(o, obs_shape=es.obs_shape, in_dim=es.in_dim)
  actor = lambda p, x: nets.mlp_apply(p["actor"], x, spec=spec, activation=cfg.activation)
  critic = lambda p, x: nets.mlp_apply(p["critic"], x, spec=spec, activation=cfg.activation)[..., 0]
  batch = cfg.num_envs * cfg.num_steps
  mb = batch // cfg.num_minibatches
  n_opt = cfg.num_updates * cfg.update_epochs * cfg.num_minibatches
  lr = optax.linear_schedule(cfg.lr, 0.0, n_opt) if cfg.anneal_lr else cfg.lr
  tx = optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), optax.adam(lr, eps=1e-5))

  def loss_fn(params, b):
    x, action, old_logp, old_v, adv, ret = b
    logits = actor(params, x)
    logp_all = jax.nn.log_softmax(logits)
    logp = jnp.take_along_axis(logp_all, action[:, None], axis=-1)[:, 0]
    ones = jnp.ones((1, x.shape[0]), bool)
    adv = losses.normalize_advantages(adv[None], ones)
    ent = losses.entropy_from_logits(logits[None], ones)
    pg, metrics = losses.ppo_loss(
      logp[None],
      old_logp[None],
      adv,
      ones,
      clip_eps_low=cfg.clip_eps,
      clip_eps_high=cfg.clip_eps,
      entropy=ent,
      entropy_coef=cfg.ent_coef,
    )
    v = critic(params, x)
    v_clip = old_v + jnp.clip(v - old_v, -cfg.clip_eps, cfg.clip_eps)
    v_loss = 0.5 * jnp.mean(jnp.maximum((v - ret) ** 2, (v_clip - ret) ** 2))
    return pg + cfg.vf_coef * v_loss, v_loss

  def train(key):
    k_init, k_reset, k_run = jax.random.split(key, 3)
    params = ppo_init(k_init, cfg)
    opt_state = tx.init(params)
    obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(k_reset, cfg.num_envs), env_params)

    def env_step(carry, _):
      params, env_state, obs, ep_ret, key = carry
      key, k_act, k_env = jax.random.split(key, 3)
      x = pre(obs)
      logits = actor(params, x)
      value = critic(params, x)
      action = jax.random.categorical(k_act, logits)
      logp = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], axis=-1)[:, 0]
      obs2, env_state, reward, term, trunc, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
        jax.random.split(k_env, cfg.num_envs), env_state, action, env_params
      )
      reward = reward.astype(jnp.float32)
      done = jnp.logical_or(term, trunc)
      ep_ret, rsum, rcnt = _track_episodes(ep_ret, reward, done)
      # A time-limit cut is not a terminal state: bootstrap it, r + γ V(s_final) (Pardo et al. 2018).
      v_final = critic(params, pre(info["final_observation"]))
      r_learn = reward + cfg.gamma * jnp.where(jnp.logical_and(trunc, jnp.logical_not(term)), v_final, 0.0)
      traj = (x, action, logp, value, r_learn, done)
      return (params, env_state, obs2, ep_ret, key), (traj, rsum, rcnt)

    def update(carry, _):
      params, opt_state, env_state, obs, ep_ret, key = carry
      (params, env_state, obs, ep_ret, key), (traj, rsum, rcnt) = jax.lax.scan(
        env_step, (params, env_state, obs, ep_ret, key), None, cfg.num_steps
      )
      x, action, logp, value, reward, done = traj
      adv, ret = episodic_gae(reward, value, done, critic(params, pre(obs)), gamma=cfg.gamma, lam=cfg.gae_lambda)
      flat = jax.tree.map(lambda a: a.reshape((batch,) + a.shape[2:]), (x, action, logp, value, adv, ret))

      def epoch(carry, _):
        params, opt_state, key = carry
        key, k_perm = jax.random.split(key)
        perm = jax.random.permutation(k_perm, batch)
        mbs = jax.tree.map(lambda a: a[perm].reshape((cfg.num_minibatches, mb) + a.shape[1:]), flat)

        def minibatch(carry, b):
          params, opt_state = carry
          grads, _ = jax.grad(loss_fn, has_aux=True)(params, b)
          updates, opt_state = tx.update(grads, opt_state, params)
          return (optax.apply_updates(params, updates), opt_state), None

        (params, opt_state), _ = jax.lax.scan(minibatch, (params, opt_state), mbs)
        return (params, opt_state, key), None

      (params, opt_state, key), _ = jax.lax.scan(epoch, (params, opt_state, key), None, cfg.update_epochs)
      return (params, opt_state, env_state, obs, ep_ret, key), (jnp.sum(rsum), jnp.sum(rcnt))

    init = (params, opt_state, env_state, obs, jnp.zeros((cfg.num_envs,), jnp.float32), k_run)
    (params, *_), curve = jax.lax.scan(update, init, None, cfg.num_updates)
    return params, curve

  return train


def run_seeds(train_fn, seeds: Sequence[int], name: str):
  """jit(vmap(train_fn)) over one PRNG key per seed: (params, (episode return sums, episode counts))."""
  seeds = list(seeds)
  if not seeds:
    raise ValueError(f"{name}: seeds is empty")
  keys = jax.vmap(jax.random.key)(jnp.asarray(seeds, jnp.uint32))
  return jax.jit(jax.vmap(train_fn))(keys)


def train_ppo(cfg: PPOConfig, seeds: Sequence[int]) -> TrainResult:
  """Trains one PPO run per seed, all seeds vmapped in one compiled call."""
  params, (rsum, rcnt) = run_seeds(make_ppo_train(cfg), seeds, "train_ppo")
  steps = (jnp.arange(cfg.num_updates) + 1) * cfg.num_envs * cfg.num_steps
  return TrainResult(params=params, episode_return_sum=rsum, episode_count=rcnt, env_steps=steps, config=cfg)
