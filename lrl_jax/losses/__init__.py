"""lrl_jax.losses — RL losses and estimators as pure array functions (depends only on jax / flax.struct).

Per-token arrays are [B, T] with a mask [B, T] (1 = a real generated token); log-probs,
ratios and losses are computed in f32 whatever the input dtype. Losses return
(scalar f32, metrics); metrics use `Mean` (sum, count) pairs and `Max` so that they
combine across micro-batches and hosts (`merge_metrics`, `finalize_metrics`).

Modules: `advantages` (GRPO, Dr.GRPO, RLOO, GAE), `policy` (PPO/DAPO/GRPO/Dr.GRPO
surrogate, GSPO, KL, entropy), `corrections` (TIS, MIS, ACRL), `value` (quantized
advantage estimation), `metrics` (train-inference mismatch), `distill` (teacher -> student KL), `aggregation`.
Formulas and sources: lrl_jax/losses/README.md.
"""

from lrl_jax.losses.advantages import (
  dr_grpo_advantages,
  gae_advantages,
  grpo_advantages,
  normalize_advantages,
  rloo_advantages,
)
from lrl_jax.losses.aggregation import (
  AGG_MODES,
  AggMode,
  Max,
  Mean,
  aggregate,
  finalize_metrics,
  merge_metrics,
)
from lrl_jax.losses.corrections import (
  ACRLState,
  acrl_discrepancy,
  acrl_init,
  acrl_set_reference,
  acrl_weights,
  effective_sample_size,
  mis_weights,
  tis_weights,
)
from lrl_jax.losses.distill import distill_kl
from lrl_jax.losses.metrics import mismatch_metrics
from lrl_jax.losses.policy import KLEstimator, entropy_from_logits, gspo_loss, kl_penalty, ppo_loss, softmax_entropy
from lrl_jax.losses.value import (
  delta_multiplier,
  delta_schedule,
  quantize_value,
  smooth_advantages,
  value_head_apply,
  value_head_init,
  value_loss,
)

__all__ = [
  # aggregation
  "AGG_MODES",
  "AggMode",
  "aggregate",
  "Mean",
  "Max",
  "merge_metrics",
  "finalize_metrics",
  # advantages
  "grpo_advantages",
  "dr_grpo_advantages",
  "rloo_advantages",
  "gae_advantages",
  "normalize_advantages",
  # policy
  "ppo_loss",
  "gspo_loss",
  "kl_penalty",
  "entropy_from_logits",
  "softmax_entropy",
  "KLEstimator",
  # corrections
  "tis_weights",
  "mis_weights",
  "ACRLState",
  "acrl_init",
  "acrl_set_reference",
  "acrl_discrepancy",
  "acrl_weights",
  "effective_sample_size",
  # value
  "quantize_value",
  "delta_multiplier",
  "delta_schedule",
  "value_head_init",
  "value_head_apply",
  "value_loss",
  "smooth_advantages",
  # metrics
  "mismatch_metrics",
  "distill_kl",
]
