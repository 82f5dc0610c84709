"""Distillation: the forward KL from a teacher's next-token distributions to a student's (full vocabulary).

Used by the INT4 recovery phase (`rl.recover`): the float model teaches its own QAT-quantized copy before RL,
on the teacher's own samples (sequence-level knowledge distillation, Kim & Rush 2016, with the teacher's whole
distribution at each token as the target, Hinton et al. 2015).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lrl_jax.losses import _common as C
from lrl_jax.losses.aggregation import Max, Mean

__all__ = ["distill_kl"]


def distill_kl(student_logits, teacher_logits, mask) -> tuple[jax.Array, dict]:
  """Token-mean KL(p_T ‖ p_S) = Σ_v p_T(v) (log p_T(v) − log p_S(v)) over the masked positions.

  Args:
    student_logits: [B, T, V] (any float dtype; f32 inside): the gradient flows through them.
    teacher_logits: [B, T, V], treated as a constant.
    mask: [B, T], the positions that count.

  Returns:
    (loss f32 scalar: the mean KL over masked positions (0 if none), metrics {"distill_kl": Mean,
    "distill_kl_max": Max, "distill_top1_agree": Mean}: the fraction of positions where both argmaxes agree).
  """
  C.check_rank("distill_kl", "student_logits", student_logits, 3, "[B, T, V]")
  C.check_rank("distill_kl", "teacher_logits", teacher_logits, 3, "[B, T, V]")
  if tuple(student_logits.shape) != tuple(teacher_logits.shape):
    raise ValueError(
      f"distill_kl: student_logits {tuple(student_logits.shape)} and teacher_logits "
      f"{tuple(teacher_logits.shape)} must have the same [B, T, V] shape"
    )
  m, mf = C.bt_mask("distill_kl", mask)
  if tuple(m.shape) != tuple(student_logits.shape[:2]):
    raise ValueError(f"distill_kl: mask {tuple(m.shape)} does not match logits {tuple(student_logits.shape)}")
  log_t = jax.nn.log_softmax(jax.lax.stop_gradient(C.f32(teacher_logits)), axis=-1)
  log_s = jax.nn.log_softmax(C.f32(student_logits), axis=-1)
  p_t = jnp.exp(log_t)
  # p_T = 0 (log p_T = −inf) contributes 0, not 0·(−inf) = NaN
  kl = jnp.sum(jnp.where(p_t > 0, p_t * (log_t - log_s), 0.0), axis=-1)
  kl = jnp.where(m, kl, 0.0)
  n = jnp.sum(mf)
  agree = jnp.where(m, jnp.argmax(log_t, -1) == jnp.argmax(log_s, -1), False).astype(jnp.float32)
  metrics = {
    "distill_kl": Mean(jax.lax.stop_gradient(jnp.sum(kl)), n),
    "distill_kl_max": Max(jax.lax.stop_gradient(jnp.max(kl))),
    "distill_top1_agree": Mean(jnp.sum(agree), n),
  }
  return C.safe_div(jnp.sum(kl), n), metrics
