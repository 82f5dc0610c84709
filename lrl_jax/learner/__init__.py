"""lrl_jax.learner — the sharded QAT learner: its config, mesh and logical-axis rules, train state, the two jit'd
functions on a `Rollout` (`prepare_rollout`, `train_step`), checkpoints; `logprobs(params, rollout, numerics=...)`
is the learner's π of a rollout in one call (bf16, QAT or served numerics), for research code outside the loop.

See lrl_jax/learner/README.md.
"""

from lrl_jax.learner.checkpoint import Checkpointer, CheckpointError, abstract_state
from lrl_jax.learner.config import CORRECTIONS, POLICY_LOSSES, CorrectionConfig, LearnerConfig, ValueConfig
from lrl_jax.learner.mesh import (
  ACTIVATION_RULES,
  MESH_AXES,
  PARAM_RULES,
  activation_rules,
  batch_sharding,
  logical_to_spec,
  lora_shardings,
  make_mesh,
  param_shardings,
  replicated,
  shard_batch,
)
from lrl_jax.learner.multihost import initialize_distributed
from lrl_jax.learner.state import (
  TrainState,
  create_train_state,
  make_optimizer,
  make_schedule,
  replace_trainable,
  state_shardings,
  step_key,
  trainable_params,
)
from lrl_jax.learner.step import (
  NonFiniteError,
  NonFiniteGuard,
  completion_logits,
  gae_targets,
  group_advantages,
  learned_qat_start,
  logprobs,
  logprobs_from_hidden,
  logprobs_from_logits,
  needs_old_logp,
  prepare_rollout,
  restarts_learned_scales,
  token_logprobs,
  train_step,
  value_mask,
)
from lrl_jax.rollout import Rollout

__all__ = [
  "LearnerConfig",
  "CorrectionConfig",
  "ValueConfig",
  "POLICY_LOSSES",
  "CORRECTIONS",
  "MESH_AXES",
  "PARAM_RULES",
  "ACTIVATION_RULES",
  "make_mesh",
  "logical_to_spec",
  "param_shardings",
  "lora_shardings",
  "replicated",
  "batch_sharding",
  "shard_batch",
  "activation_rules",
  "TrainState",
  "create_train_state",
  "make_optimizer",
  "make_schedule",
  "trainable_params",
  "replace_trainable",
  "state_shardings",
  "step_key",
  "Rollout",
  "prepare_rollout",
  "train_step",
  "group_advantages",
  "gae_targets",
  "value_mask",
  "needs_old_logp",
  "logprobs",
  "logprobs_from_logits",
  "logprobs_from_hidden",
  "completion_logits",
  "token_logprobs",
  "learned_qat_start",
  "restarts_learned_scales",
  "NonFiniteGuard",
  "NonFiniteError",
  "Checkpointer",
  "CheckpointError",
  "abstract_state",
  "initialize_distributed",
]
