"""LearnerConfig: the optimizer, numerics, loss and correction settings of the train step.

Frozen and hashable (a static argument of the jit'd step), validated in `__post_init__`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Literal

import jax.numpy as jnp

from lrl_jax import quant
from lrl_jax.losses import AGG_MODES

__all__ = ["LearnerConfig", "POLICY_LOSSES", "CORRECTIONS", "SCHEDULES"]

POLICY_LOSSES = ("ppo", "gspo")
CORRECTIONS = ("none", "tis", "mis", "acrl")
SCHEDULES = ("constant", "cosine")
_COMPUTE_DTYPES = ("bfloat16", "float32")
_OPT_DTYPES = ("float32", "bfloat16")
_KL = ("k1", "k2", "k3")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LearnerConfig:
  """Settings of `train_step` (one source of truth; the CLI's YAML only sets these values).

  Attributes:
    lr: peak learning rate of AdamW.
    weight_decay: decoupled weight decay (kernels, embeddings and LoRA factors only;
      norm scales, biases and the value head's Δ are not decayed).
    b1, b2, eps: Adam's β₁, β₂, ε.
    grad_clip: clip the gradient's global norm to this (optax `clip_by_global_norm`); None: off.
    schedule: "constant" (linear warmup then lr) or "cosine" (warmup then cosine to min_lr_ratio·lr).
    warmup_steps: linear warmup from 0 over this many applied updates.
    total_steps: length of the cosine schedule (warmup included); required for "cosine".
    min_lr_ratio: final lr / lr of the cosine schedule.
    opt_state_dtype: dtype of Adam's first moment μ (optax `mu_dtype`); ν stays float32
      (a bf16 ν rounds small squared gradients to coarse steps and skews 1/√ν).
    micro_batches: split the batch into this many micro-batches (rows m, m+M, m+2M, ...),
      accumulated by `lax.scan`; the result equals the full batch (loss, grads, metrics).
    compute_dtype: activations and matmul inputs ("bfloat16" or "float32"); the master
      weights stay float32 and are cast per matmul; log-probs and losses are float32.
    qat: a `quant` spec (Int4, FP8, MXFP8, NVFP4): the forward fake-quantizes the layer kernels
      `QuantRules.default(qat)` selects, exactly as the sampler serves them; None: no QAT.
    qat_targets: regex on '/'-joined parameter paths of the kernels QAT fake-quantizes (default: every
      attention / MLP projection); embeddings, lm_head, norms, routers and biases are always kept. Must
      select what the sampler serves (`rl` passes `quant.targets`).
    qat_start_step: the learner step (`TrainState.step`) at which QAT switches on; before it the
      forward is plain (float). 0: from the start.
    qat_warmup_steps: fade QAT in over this many steps from `qat_start_step`: the selected kernels
      enter the matmul as w + α·(ŵ − w), α = min(1, (step − start + 1) / warmup); exactly ŵ once
      α = 1. 0: switch on at once. (The INT4 RL write-up warns that an abrupt switch jolts early RL.)
    qat_init: "grid": a freshly initialised model's quantized kernels start on their own INT4 grid
      (`quant.int4_aware_init`: fake quant at step 0 changes nothing); "default": the plain init.
    int4_update_clip: k: clip each INT4 kernel's update to ±k·s of its group after AdamW
      (`quant.int4_update_clip`: no weight moves more than k grid steps per update). None: off.
    remat: rematerialize each decoder layer in the backward pass.
    policy_loss: "ppo" (PPO / GRPO / DAPO / Dr.GRPO, by `agg`) or "gspo".
    clip_eps_low, clip_eps_high: the clip range ε_low, ε_high (GSPO wants ~3e-4 / 4e-4).
    dual_clip_c: dual-clip constant c > 1 (PPO only); None: off.
    agg: loss aggregation, one of `losses.AGG_MODES`.
    norm_len: L of "seq-mean-token-sum-norm" (Dr.GRPO); None: the padded T.
    kl_coef: β of the KL(π_θ ‖ π_ref) penalty (needs ref log-probs in the batch).
    kl_estimator: "k1", "k2" or "k3".
    entropy_coef: entropy bonus c_H (PPO only).
    correction: train-inference mismatch correction: "none", "tis", "mis" or "acrl".
    correction_level: TIS "token" | "sequence"; MIS "sequence" | "geometric" | "token"
      (ignored by "none" and "acrl"). None: "token" for TIS, "sequence" for MIS.
    clip_c: truncation C of TIS and ACRL.
    tis_batch_normalize: TIS weights rescaled to mean 1 over the batch.
    mis_lo, mis_hi, mis_keep_ratio: MIS acceptance interval and whether kept tokens keep ρ.
    acrl_gamma: ACRL's control strength γ.
    value_coef: weight of the value-head loss (when the state has a value head and the batch
      has returns).
    value_alpha: α of `losses.value_loss` (quantile vs MSE).
    value_quantile_levels: the value head's quantile levels τ_k (K = their number).
    value_delta_schedule: multiply the value head's Δ by `losses.delta_multiplier(step)`.
  """

  lr: float = 1e-6
  weight_decay: float = 0.0
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  grad_clip: float | None = 1.0
  schedule: Literal["constant", "cosine"] = "constant"
  warmup_steps: int = 0
  total_steps: int | None = None
  min_lr_ratio: float = 0.0
  opt_state_dtype: Literal["float32", "bfloat16"] = "float32"
  micro_batches: int = 1
  compute_dtype: Literal["bfloat16", "float32"] = "bfloat16"
  qat: quant.Spec | None = None
  qat_targets: str = quant.rules.DEFAULT_QUANTIZE[0]
  qat_start_step: int = 0
  qat_warmup_steps: int = 0
  qat_init: Literal["default", "grid"] = "default"
  int4_update_clip: float | None = None
  remat: bool = False
  policy_loss: Literal["ppo", "gspo"] = "ppo"
  clip_eps_low: float = 0.2
  clip_eps_high: float = 0.28
  dual_clip_c: float | None = None
  agg: str = "token-mean"
  norm_len: int | None = None
  kl_coef: float = 0.0
  kl_estimator: Literal["k1", "k2", "k3"] = "k3"
  entropy_coef: float = 0.0
  correction: Literal["none", "tis", "mis", "acrl"] = "none"
  correction_level: str | None = None
  clip_c: float = 2.0
  tis_batch_normalize: bool = False
  mis_lo: float = 0.5
  mis_hi: float = 2.0
  mis_keep_ratio: bool = False
  acrl_gamma: float = 0.65
  value_coef: float = 0.5
  value_alpha: float = 0.7
  value_quantile_levels: tuple[float, ...] = (0.5,)
  value_delta_schedule: bool = True

  def __post_init__(self):
    def bad(name, want):
      raise ValueError(f"LearnerConfig.{name} must be {want}; got {getattr(self, name)!r}")

    def is_num(v):
      return isinstance(v, (int, float)) and not isinstance(v, bool)

    def is_int(v):
      return isinstance(v, int) and not isinstance(v, bool)

    for name in ("lr", "eps", "clip_eps_low", "clip_eps_high", "acrl_gamma"):
      if not (is_num(getattr(self, name)) and getattr(self, name) > 0):
        bad(name, "a number > 0")
    for name in ("weight_decay", "kl_coef", "entropy_coef", "value_coef", "min_lr_ratio"):
      if not (is_num(getattr(self, name)) and getattr(self, name) >= 0):
        bad(name, "a number >= 0")
    for name in ("b1", "b2"):
      if not (is_num(getattr(self, name)) and 0 <= getattr(self, name) < 1):
        bad(name, "in [0, 1)")
    if self.grad_clip is not None and not (is_num(self.grad_clip) and self.grad_clip > 0):
      bad("grad_clip", "None or a number > 0")
    if self.schedule not in SCHEDULES:
      bad("schedule", f"one of {SCHEDULES}")
    if not (is_int(self.warmup_steps) and self.warmup_steps >= 0):
      bad("warmup_steps", "an int >= 0")
    if self.schedule == "cosine":
      if not (is_int(self.total_steps) and self.total_steps > self.warmup_steps):
        bad("total_steps", f"an int > warmup_steps ({self.warmup_steps}) for schedule='cosine'")
    elif self.total_steps is not None and not (is_int(self.total_steps) and self.total_steps > 0):
      bad("total_steps", "None or a positive int")
    if self.min_lr_ratio > 1:
      bad("min_lr_ratio", "<= 1")
    if self.opt_state_dtype not in _OPT_DTYPES:
      bad("opt_state_dtype", f"one of {_OPT_DTYPES}")
    if not (is_int(self.micro_batches) and self.micro_batches >= 1):
      bad("micro_batches", "an int >= 1")
    if self.compute_dtype not in _COMPUTE_DTYPES:
      bad("compute_dtype", f"one of {_COMPUTE_DTYPES}")
    if self.qat is not None:
      if not isinstance(self.qat, (quant.Int4, quant.FP8, quant.MXFP8, quant.NVFP4)):
        bad("qat", "None or a quant spec (Int4, FP8, MXFP8, NVFP4)")
    try:
      re.compile(self.qat_targets)
    except (re.error, TypeError) as e:
      raise ValueError(f"LearnerConfig.qat_targets must be a regular expression; got {self.qat_targets!r} ({e})")
    for name in ("qat_start_step", "qat_warmup_steps"):
      if not (is_int(getattr(self, name)) and getattr(self, name) >= 0):
        bad(name, "an int >= 0")
    if self.qat_init not in ("default", "grid"):
      bad("qat_init", "'default' or 'grid'")
    if self.int4_update_clip is not None:
      if not (is_num(self.int4_update_clip) and self.int4_update_clip > 0):
        bad("int4_update_clip", "None or a number of INT4 steps > 0")
      if not isinstance(self.qat, quant.Int4):
        bad("int4_update_clip", f"None unless qat is an Int4 spec (qat={self.qat!r})")
    if self.qat_init == "grid" and self.qat is None:
      bad("qat_init", "'default' without qat")
    if not isinstance(self.remat, bool):
      bad("remat", "a bool")
    if self.policy_loss not in POLICY_LOSSES:
      bad("policy_loss", f"one of {POLICY_LOSSES}")
    if self.dual_clip_c is not None:
      if not (is_num(self.dual_clip_c) and self.dual_clip_c > 1):
        bad("dual_clip_c", "None or a number > 1")
      if self.policy_loss != "ppo":
        bad("dual_clip_c", "None with policy_loss='gspo'")
    if self.agg not in AGG_MODES:
      bad("agg", f"one of {AGG_MODES}")
    if self.norm_len is not None and not (is_int(self.norm_len) and self.norm_len > 0):
      bad("norm_len", "None or a positive int")
    if self.kl_estimator not in _KL:
      bad("kl_estimator", f"one of {_KL}")
    if self.entropy_coef and self.policy_loss != "ppo":
      bad("entropy_coef", "0 with policy_loss='gspo' (gspo_loss has no entropy bonus)")
    if self.correction not in CORRECTIONS:
      bad("correction", f"one of {CORRECTIONS}")
    levels = {"tis": ("token", "sequence"), "mis": ("sequence", "geometric", "token")}
    if self.correction in levels:
      if self.correction_level is not None and self.correction_level not in levels[self.correction]:
        bad("correction_level", f"one of {levels[self.correction]} for correction={self.correction!r}")
    elif self.correction_level is not None:
      bad("correction_level", f"None for correction={self.correction!r}")
    if not (is_num(self.clip_c) and self.clip_c > 1):
      bad("clip_c", "a number > 1")
    if not (is_num(self.mis_lo) and is_num(self.mis_hi) and 0 <= self.mis_lo < self.mis_hi):
      raise ValueError(f"LearnerConfig: need 0 <= mis_lo < mis_hi; got {self.mis_lo}, {self.mis_hi}")
    for name in ("tis_batch_normalize", "mis_keep_ratio", "value_delta_schedule"):
      if not isinstance(getattr(self, name), bool):
        bad(name, "a bool")
    if not (is_num(self.value_alpha) and 0 <= self.value_alpha <= 1):
      bad("value_alpha", "in [0, 1]")
    lv = self.value_quantile_levels
    if not (isinstance(lv, tuple) and lv and all(is_num(t) and 0 < t < 1 for t in lv)):
      bad("value_quantile_levels", "a non-empty tuple of numbers in (0, 1)")

  @property
  def level(self) -> str | None:
    """The correction level in use: `correction_level`, or "token" for TIS / "sequence" for MIS."""
    if self.correction_level is not None:
      return self.correction_level
    return {"tis": "token", "mis": "sequence"}.get(self.correction)

  @property
  def qat_rules(self) -> quant.QuantRules | None:
    """The rules of the QAT forward (the `qat_targets` kernels -> `qat`; the rules the sampler quantizes with),
    or None."""
    if self.qat is None:
      return None
    keep = tuple((p, None) for p in quant.rules.DEFAULT_KEEP)
    return quant.QuantRules(rules=keep + ((self.qat_targets, self.qat),))

  @property
  def qat_fades(self) -> bool:
    """Whether QAT is scheduled (starts late or fades in) rather than on from step 0."""
    return self.qat is not None and (self.qat_start_step > 0 or self.qat_warmup_steps > 0)

  def qat_alpha(self, step):
    """QAT weight α at learner step `step` (float32 scalar; may be traced), or None when QAT is simply on.

    α = 0 before `qat_start_step`, then min(1, (step − start + 1) / qat_warmup_steps) (1 without warm-up).
    """
    if not self.qat_fades:
      return None
    t = jnp.asarray(step, jnp.float32) - self.qat_start_step
    if self.qat_warmup_steps == 0:
      return jnp.where(t >= 0, 1.0, 0.0).astype(jnp.float32)
    return jnp.clip((t + 1.0) / self.qat_warmup_steps, 0.0, 1.0).astype(jnp.float32)

  def replace(self, **changes) -> "LearnerConfig":
    return dataclasses.replace(self, **changes)
