"""LearnerConfig: every setting of the learner, once — the library's config and the YAML `learner` section.

Three frozen, hashable configs (static arguments of the jit'd step), checked in `__post_init__` by
`lrl_jax.schema` against their annotations and by their own rules:

  LearnerConfig            optimizer, precision, LoRA, QAT schedule, policy loss, advantages, minibatches, mesh
    .correction: CorrectionConfig   train-inference mismatch correction (TIS / MIS / ACRL)
    .value: ValueConfig             the critic of policy_loss="ppo" (GAE), optionally QAE

A YAML file sets them under `learner:` (`learner.correction.method: tis`); in Python,
`LearnerConfig(lr=1e-4, correction=CorrectionConfig(method="tis"))`. Three fields are not YAML keys because the
run config supplies them from the sections that own them (`schema.set_by`): `qat` and `qat_targets` (the
`quant` section: the learner trains for the format the sampler serves) and `total_steps` (run.steps ×
minibatches). A `None` of a setting that says "null = the loss's default" is passed on as "not given", so
the default lives once, in `lrl_jax.losses`.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import ClassVar, Literal

import jax.numpy as jnp

from lrl_jax import losses, quant
from lrl_jax.losses import AggMode, KLEstimator
from lrl_jax.models import LoraConfig
from lrl_jax.schema import Schema, check_regex, set_by

__all__ = ["LearnerConfig", "CorrectionConfig", "ValueConfig", "POLICY_LOSSES", "CORRECTIONS", "UNQUANTIZED_DELTA"]

_DTYPE = Literal["float32", "bfloat16"]
PolicyLoss = Literal["grpo", "ppo", "gspo"]
Correction = Literal["none", "tis", "mis", "acrl"]
POLICY_LOSSES: tuple[str, ...] = typing.get_args(PolicyLoss)
CORRECTIONS: tuple[str, ...] = typing.get_args(Correction)
Remat = Literal["none", "full", "dots", "dots_no_batch", "offload"]  # models.remat_policy
REMATS: tuple[str, ...] = typing.get_args(Remat)

# The levels each correction takes (None: no level); the first is the loss function's default.
_LEVELS = {"none": (), "acrl": (), "tis": ("token", "sequence"), "mis": ("sequence", "geometric", "token")}

# value.quantized=false: the value head still rounds to a step Δ (one head, one code path); a Δ at
# `losses.quantize_value`'s floor (1e-4) keeps that rounding far below the scale of 0/1 rewards.
UNQUANTIZED_DELTA = 1e-4


@dataclasses.dataclass(frozen=True, kw_only=True)
class CorrectionConfig(Schema):
  """Train-inference mismatch correction of the policy loss (lrl_jax.losses.corrections)."""

  section: ClassVar[str] = "learner.correction"

  method: Correction = "none"  # none, truncated IS (tis), masked IS (mis) or adaptive control (acrl)
  level: Literal["token", "sequence", "geometric"] | None = None  # tis: token | sequence; mis: + geometric; null: 1st
  clip_c: float = 2.0  # C: TIS truncation min(π_old/μ, C) and ACRL's clip of ρ
  batch_normalize: bool = False  # tis: rescale the weights to mean 1 over the batch
  lo: float = 0.5  # mis: keep a sample iff lo <= ρ <= hi
  hi: float = 2.0  # mis: upper bound of the kept ratios
  keep_ratio: bool = False  # mis: kept tokens are weighted by ρ (false: by 1)
  gamma: float = 0.65  # acrl: gain γ in α = γ·sign(A)·(1 − Y/X)
  acrl_x: float | None = None  # acrl: reference discrepancy X; null = measured on the first batch

  def _validate(self):
    valid = _LEVELS[self.method]
    if valid:
      self._check(
        self.level is None or self.level in valid,
        "level",
        f"must be one of {', '.join(valid)} for method {self.method}",
      )
    else:
      self._check(self.level is None, "level", f"must be null for method {self.method}")
    self._check(self.clip_c > 1, "clip_c", "must be > 1 (a truncation below 1 would down-weight on-policy tokens)")
    self._check(0 <= self.lo < self.hi, "lo", f"must be >= 0 and < hi={self.hi}")
    self._check(self.gamma > 0, "gamma", "must be > 0")
    self._check(self.acrl_x is None or self.acrl_x > 0, "acrl_x", "must be > 0 or null")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ValueConfig(Schema):
  """The critic of policy_loss=ppo: GAE advantages from a value head, optionally quantized (QAE; lrl_jax.losses.value).

  The defaults are a plain critic (no quantization, MSE only, no smoothing); QAE sets quantized, alpha, beta.
  """

  section: ClassVar[str] = "learner.value"

  quantized: bool = False  # QAE: the head's values are multiples of a learnable step Δ
  delta0: float = 0.1  # QAE: initial step Δ₀
  schedule: Literal["step", "constant"] = "step"  # QAE: Δ multiplier n+1, n, …, 1 across the boundaries; or 1
  boundaries: tuple[int, ...] = (1000, 5000)  # QAE: learner updates at which the step schedule's multiplier drops
  alpha: float = 0.0  # weight of the quantile (pinball) loss against the MSE (0 = MSE only)
  quantile_levels: tuple[float, ...] = (0.5,)  # quantile levels τ of the value heads (K = their number)
  beta: float = 1.0  # advantage smoothing A' = βA_t + (1 − β)A_prev (1 = off)
  coef: float = 0.5  # weight of the value loss in the total loss
  gamma: float = 1.0  # GAE discount γ
  lam: float = 0.95  # GAE λ
  whiten: bool = True  # GAE advantages whitened over the batch's tokens ((A − mean) / std, PPO practice); false: raw
  lr: float | None = None  # the critic's own optimizer (AdamW, this peak lr, the policy's schedule, its own grad
  # clip); None: the head shares the policy's optimizer and lr (as verl's separate critic.optim, e.g. 10x the actor's)
  init_std: float | None = None  # std of the head's initial kernel; None: 1/√D (V ~ N(0, 1) on RMS-normed features)
  clip: float | None = None  # PPO value clipping ε (verl's cliprange_value, e.g. 0.5): max of the loss at V and at
  # V_old + clip(V − V_old, ±ε); None: off

  def _validate(self):
    self._check(self.delta0 > 0, "delta0", "must be > 0")
    b = self.boundaries
    self._check(
      all(x > 0 for x in b) and all(x < y for x, y in zip(b, b[1:])),
      "boundaries",
      "must be positive and strictly increasing",
    )
    self._check(0 <= self.alpha <= 1, "alpha", "must be in [0, 1]")
    self._check(
      len(self.quantile_levels) >= 1 and all(0 < t < 1 for t in self.quantile_levels),
      "quantile_levels",
      "must be one or more levels in (0, 1)",
    )
    self._check(0 <= self.beta <= 1, "beta", "must be in [0, 1]")
    self._check(self.coef >= 0, "coef", "must be >= 0")
    self._check(0 < self.gamma <= 1, "gamma", "must be in (0, 1]")
    self._check(0 <= self.lam <= 1, "lam", "must be in [0, 1]")
    self._check(self.lr is None or self.lr > 0, "lr", "must be > 0 (or null: the policy's)")
    self._check(self.init_std is None or self.init_std >= 0, "init_std", "must be >= 0 (or null: 1/sqrt(D))")
    self._check(self.clip is None or self.clip > 0, "clip", "must be > 0 (or null: no value clipping)")

  @property
  def initial_delta(self) -> float:
    """Δ the value head starts with: delta0 (QAE), else the unquantized floor."""
    return self.delta0 if self.quantized else UNQUANTIZED_DELTA

  def delta_multiplier(self, step):
    """The Δ multiplier at learner step `step` (may be traced): n+1, n, …, 1 across the n boundaries for a
    quantized critic with the step schedule (3, 2, 1 for two: the QAE write-up's 3Δ₀, 2Δ₀, Δ₀), else 1."""
    if not self.quantized or self.schedule != "step":
      return jnp.float32(1.0)
    n = len(self.boundaries)
    return losses.delta_multiplier(
      step, boundaries=self.boundaries, multipliers=tuple(float(n + 1 - i) for i in range(n + 1))
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class LearnerConfig(Schema):
  """Optimizer, numerics, policy loss, advantages and corrections of the learner (lrl_jax.losses for the formulas)."""

  section: ClassVar[str] = "learner"

  lr: float = 1e-6  # AdamW peak learning rate
  weight_decay: float = 0.0  # AdamW decoupled weight decay (kernels, embeddings, LoRA factors; not norms, biases, Δ)
  b1: float = 0.9  # Adam β₁
  b2: float = 0.999  # Adam β₂
  eps: float = 1e-8  # Adam ε
  nesterov: bool = False  # Adam with Nesterov momentum (NAdamW; Dozat 2016)
  grad_clip: float | None = 1.0  # clip the gradient's global norm to this; null = off
  schedule: Literal["constant", "cosine"] = "constant"  # learning rate after the linear warm-up
  warmup_steps: int = 0  # linear learning-rate warm-up from 0, in applied updates
  min_lr_ratio: float = 0.0  # cosine: final lr / lr
  total_steps: int | None = set_by("run.steps × learner.minibatches")  # cosine schedule length in updates
  opt_state_dtype: Literal["float32", "bfloat16", "fp8"] = "float32"  # Adam's μ (ν f32); fp8: μ E4M3 + ν bf16
  opt_state_block: int = 256  # fp8: elements per scale of μ along each parameter's last axis (at most)
  minibatches: int = 1  # K: each rollout batch is split into K minibatches, one optimizer update each
  micro_batches: int = 1  # gradient-accumulation splits of each minibatch (exact: same loss and gradient)
  compute_dtype: _DTYPE = "bfloat16"  # forward / backward activation dtype (log-probs and losses stay float32)
  temperature: float = set_by("sampler.temperature", 1.0)  # π = softmax(logits / T), the distribution μ samples
  remat: bool | Remat = "none"  # models.remat_policy
  unroll_layers: bool = False  # trained layer loop unrolled, not a scan: bf16 on XLA:CPU ~15% faster (learner README)
  logit_chunk: int | None = None  # logits in chunks of this many positions, recomputed in backward; null: at once
  share_prompt: bool = True  # run a group's shared prompt once for its G rows (exact up to the order of float sums)
  lora: LoraConfig | None = None  # train LoRA adapters over the frozen (possibly low-bit) base; null = full fine-tuning
  qat: quant.Spec | None = set_by("quant.learner")  # format of the QAT forward (fake quant of what is served)
  qat_targets: str = set_by("quant.targets", quant.DEFAULT_TARGETS)  # regex on the kernels QAT fake-quantizes
  qat_keep_last_layers: int = set_by("quant.wag_keep_last_layers", 0)  # W/A/G: the last k layers in the compute dtype
  qat_start_step: int = 0  # learner step at which QAT switches on (0 = from the start)
  qat_warmup_steps: int = 0  # fade QAT in over this many learner steps: w + α·(ŵ − w), α → 1 (0 = at once)
  qat_init: Literal["default", "grid"] = "default"  # grid: start the quantized kernels on their own INT4 grid
  int4_update_clip: float | None = None  # k: no INT4 weight moves more than k grid steps per update; null = off
  policy_loss: PolicyLoss = "grpo"  # grpo: group advantages; ppo: GAE on a critic (learner.value); gspo: sequence ratio
  advantage: Literal["grpo", "dr_grpo", "rloo"] = "grpo"  # group baseline: (r − mean)/std, r − mean, leave-one-out
  clip_eps_low: float | None = None  # ratio clip below 1 − ε_low; null = the loss's default (0.2; gspo 3e-4)
  clip_eps_high: float | None = None  # ratio clip above 1 + ε_high; null = the loss's default (0.28; gspo 4e-4)
  dual_clip_c: float | None = None  # dual-clip bound c > 1 for negative advantages (grpo / ppo); null = off
  agg: AggMode = "token-mean"  # loss aggregation over tokens and sequences (lrl_jax.losses.aggregate)
  norm_len: int | None = None  # L of seq-mean-token-sum-norm (Dr.GRPO); null = the padded length T
  kl_coef: float = 0.0  # β of the KL penalty to the frozen initial policy (0 = no reference model)
  kl_estimator: KLEstimator = "k3"  # KL estimator (Schulman 2020)
  entropy_coef: float = 0.0  # weight of the entropy bonus (grpo / ppo)
  mesh: tuple[int, int, int] = (-1, 1, 1)  # learner mesh (data, fsdp, tensor) sizes; one -1 = the remaining devices
  correction: CorrectionConfig = dataclasses.field(default_factory=CorrectionConfig)  # mismatch correction
  value: ValueConfig = dataclasses.field(default_factory=ValueConfig)  # the critic (policy_loss=ppo)

  def _validate(self):
    self._check(self.lr > 0, "lr", "must be > 0")
    self._check(self.weight_decay >= 0, "weight_decay", "must be >= 0")
    for name in ("b1", "b2"):
      self._check(0 <= getattr(self, name) < 1, name, "must be in [0, 1)")
    self._check(self.eps > 0, "eps", "must be > 0")
    self._check(self.grad_clip is None or self.grad_clip > 0, "grad_clip", "must be > 0 or null")
    self._check(self.warmup_steps >= 0, "warmup_steps", "must be >= 0")
    self._check(0 <= self.min_lr_ratio <= 1, "min_lr_ratio", "must be in [0, 1]")
    if self.schedule == "cosine":
      self._check(
        isinstance(self.total_steps, int) and self.total_steps > self.warmup_steps,
        "total_steps",
        f"must be an int > warmup_steps={self.warmup_steps} for schedule=cosine",
      )
    else:
      self._check(
        self.total_steps is None or (isinstance(self.total_steps, int) and self.total_steps > 0),
        "total_steps",
        "must be a positive int or None",
      )
    self._check(self.temperature > 0, "temperature", "must be > 0 (greedy rollouts report μ at 1)")
    self._check(self.logit_chunk is None or self.logit_chunk >= 1, "logit_chunk", "must be >= 1 or null")
    self._check(self.opt_state_block >= 1, "opt_state_block", "must be >= 1")
    self._check(isinstance(self.unroll_layers, bool), "unroll_layers", "must be true or false")
    if isinstance(self.remat, bool):  # true / false of older configs: the whole block, or nothing
      object.__setattr__(self, "remat", "full" if self.remat else "none")
    self._check(self.minibatches >= 1, "minibatches", "must be >= 1")
    self._check(self.micro_batches >= 1, "micro_batches", "must be >= 1")
    self._check(
      self.qat is None or isinstance(self.qat, (quant.Int4, quant.FP8, quant.MXFP8, quant.NVFP4, quant.NVFP4WAG)),
      "qat",
      "must be None or a quant spec (Int4, FP8, MXFP8, NVFP4, NVFP4WAG); from YAML it is quant.learner",
    )
    self._check(
      not isinstance(self.qat, quant.NVFP4WAG) or (self.qat_start_step == 0 and self.qat_warmup_steps == 0),
      "qat_start_step",
      "NVFP4 W/A/G (quant.learner=nvfp4_wag) is on from step 0: qat_start_step and qat_warmup_steps must be 0",
    )
    check_regex(self, "qat_targets")
    self._check(
      isinstance(self.qat_keep_last_layers, int) and self.qat_keep_last_layers >= 0,
      "qat_keep_last_layers",
      "must be an int >= 0",
    )
    self._check(
      self.qat_keep_last_layers == 0 or isinstance(self.qat, quant.NVFP4WAG),
      "qat_keep_last_layers",
      "applies to W/A/G QAT only (quant.learner=nvfp4_wag)",
    )
    self._check(self.qat_start_step >= 0, "qat_start_step", "must be >= 0")
    self._check(self.qat_warmup_steps >= 0, "qat_warmup_steps", "must be >= 0")
    self._check(
      self.qat_init == "default" or self.qat is not None,
      "qat_init",
      "needs a QAT learner (quant.learner, i.e. LearnerConfig.qat)",
    )
    if self.int4_update_clip is not None:
      self._check(self.int4_update_clip > 0, "int4_update_clip", "must be > 0 or null")
      self._check(
        isinstance(self.qat, quant.Int4),
        "int4_update_clip",
        f"needs an INT4 QAT learner (quant.learner=int4); the learner's QAT is {self.qat!r}",
      )
    for name in ("clip_eps_low", "clip_eps_high"):
      self._check(getattr(self, name) is None or getattr(self, name) > 0, name, "must be > 0 or null")
    self._check(self.clip_eps_low is None or self.clip_eps_low < 1, "clip_eps_low", "must be < 1")
    if self.dual_clip_c is not None:
      self._check(self.dual_clip_c > 1, "dual_clip_c", "must be > 1 or null")
      self._check(self.policy_loss != "gspo", "dual_clip_c", "must be null for policy_loss=gspo")
    self._check(self.norm_len is None or self.norm_len > 0, "norm_len", "must be > 0 or null")
    self._check(self.kl_coef >= 0, "kl_coef", "must be >= 0")
    self._check(self.entropy_coef >= 0, "entropy_coef", "must be >= 0")
    self._check(
      self.entropy_coef == 0 or self.policy_loss != "gspo",
      "entropy_coef",
      "must be 0 for policy_loss=gspo (gspo_loss has no entropy bonus)",
    )
    self._check(
      all(m == -1 or m >= 1 for m in self.mesh) and list(self.mesh).count(-1) <= 1,
      "mesh",
      "must hold sizes >= 1 and at most one -1",
    )

  @property
  def trainable(self) -> str:
    """ "full" (the fp32 masters) or "lora" (adapters over the frozen base): `TrainState.trainable`."""
    return "full" if self.lora is None else "lora"

  @property
  def critic(self) -> bool:
    """Whether the learner trains a value head (policy_loss=ppo: advantages from GAE on it)."""
    return self.policy_loss == "ppo"

  @property
  def qat_rules(self) -> quant.QuantRules | None:
    """The rules of the QAT forward (the `qat_targets` kernels -> `qat`; the rules the sampler serves), or None."""
    if self.qat is None:
      return None
    return quant.QuantRules.default(self.qat, targets=self.qat_targets, keep_last_layers=self.qat_keep_last_layers)

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

  def without_qat(self) -> "LearnerConfig":
    """This config with QAT and what only applies to it switched off."""
    return self.replace(qat=None, qat_start_step=0, qat_warmup_steps=0, qat_init="default", int4_update_clip=None)
