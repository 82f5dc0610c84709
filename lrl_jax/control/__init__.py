"""lrl_jax.control — INT4 quantization-aware RL for control policies (PPO and DQN on gymnax).

The LLM numerics contract applied to small MLP policies: train with fake INT4 W4A16
(`quant.dot_general_for(quant.Int4(G))`, straight-through), deploy as packed INT4 codes +
bf16 scales (`quant.quantize`) run through `kernels.qmatmul`. PureJaxRL style: one jit'd
training function, `lax.scan` rollouts over vmapped envs, seeds vmapped.

Shapes: T rollout steps, E envs, S seeds, B batch, K/N kernel in/out, A actions.
See README.md in this folder.
"""

from lrl_jax.control.dqn import (
  DQNConfig,
  ReplayBuffer,
  buffer_add,
  buffer_init,
  buffer_sample,
  dqn_init,
  dqn_loss,
  epsilon_at,
  make_dqn_train,
  target_update,
  train_dqn,
)
from lrl_jax.control.envs import ENV_NAMES, EnvSpec, env_spec, make_env, preprocess
from lrl_jax.control.evaluate import (
  evaluate,
  greedy_actions,
  latency_batch1,
  make_evaluator,
  policy_apply,
  policy_params,
)
from lrl_jax.control.networks import (
  check_spec_fits,
  deploy,
  mlp_apply,
  mlp_init,
  param_bytes,
  served_apply,
)
from lrl_jax.control.ppo import PPOConfig, TrainResult, make_ppo_train, ppo_init, train_ppo
from lrl_jax.control.returns import dqn_targets, episodic_gae

__all__ = [
  "ENV_NAMES",
  "EnvSpec",
  "env_spec",
  "make_env",
  "preprocess",
  "mlp_init",
  "mlp_apply",
  "deploy",
  "served_apply",
  "check_spec_fits",
  "param_bytes",
  "episodic_gae",
  "dqn_targets",
  "PPOConfig",
  "TrainResult",
  "train_ppo",
  "make_ppo_train",
  "ppo_init",
  "DQNConfig",
  "ReplayBuffer",
  "buffer_init",
  "buffer_add",
  "buffer_sample",
  "train_dqn",
  "make_dqn_train",
  "dqn_init",
  "dqn_loss",
  "epsilon_at",
  "target_update",
  "evaluate",
  "make_evaluator",
  "policy_apply",
  "policy_params",
  "greedy_actions",
  "latency_batch1",
]
