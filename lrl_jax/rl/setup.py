"""Building a run's pieces from its `Config`: model and task, learner settings, train state, sampling.

`build_model(cfg)` gives the policy (tiny / SmolLM2 / HF dir / GGUF file) with the task that matches its
tokenizer; `learner_config(cfg)` maps the config's learner / correction / value sections onto
`learner.LearnerConfig`; `new_state` creates the `TrainState` (full or LoRA, with or without a critic).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from lrl_jax import learner as L
from lrl_jax import models
from lrl_jax.config import ConfigError
from lrl_jax.rl.sync import SyncSpec, sync_spec
from lrl_jax.tasks import Task, task_from_config

__all__ = ["Setup", "build_model", "learner_config", "new_state", "learner_mesh", "served_model_config",
           "delta_scale", "NO_QUANT_DELTA"]

# value.quantized=false: the learner's value head always rounds to a step Δ; a Δ at quantize_value's floor
# (1e-4) makes that rounding far below the scale of 0/1 rewards, i.e. a plain (unquantized) critic.
NO_QUANT_DELTA = 1e-4


@dataclasses.dataclass(frozen=True, kw_only=True)
class Setup:
  """The static pieces of a run.

  Attributes:
    model_cfg: the policy's `ModelConfig` (dtype = learner compute dtype).
    params: initial float32 parameters.
    task: the task (its encoder is the model's tokenizer).
    tokenizer: the model's `models.Tokenizer`, or None (tiny model: the task's CharTokenizer).
    sync: the `SyncSpec` of the served weights.
    sampler_cfg: the `ModelConfig` the sampler runs (dtype = served dtype).
  """

  model_cfg: models.ModelConfig
  params: Any
  task: Task
  tokenizer: Any
  sync: SyncSpec
  sampler_cfg: models.ModelConfig


def served_model_config(model_cfg: models.ModelConfig, spec: SyncSpec) -> models.ModelConfig:
  return model_cfg.replace(dtype=jnp.dtype(spec.dtype).name)


def build_model(cfg, *, init: bool = True) -> Setup:
  """Model, parameters and task of a run config.

  Args:
    cfg: a `lrl_jax.config.Config`.
    init: create / load the parameters (False: `params` is None; the shapes come from a checkpoint).
  """
  compute = cfg.learner.compute_dtype
  src = cfg.model.source
  tokenizer = None
  if src == "tiny":
    task = task_from_config(cfg.task, seed=cfg.run.seed)
    model_cfg = cfg.model.tiny_model_config(vocab_size=task.encoder.vocab_size, dtype=compute)
    params = None
    if init:
      key = jax.random.fold_in(jax.random.PRNGKey(cfg.run.seed), 0)
      params = models.init_params(model_cfg, key, std=cfg.model.init_std)
  else:
    if src.startswith("hf:"):
      path = src.split(":", 1)[1]
      model_cfg, params = models.load_hf(path, dtype=jnp.float32, compute_dtype=compute)
      tokenizer = models.load_tokenizer(path)
    else:
      path = models.smollm2() if src == "smollm2" else src.split(":", 1)[1]
      model_cfg, params, tokenizer = models.load_gguf(path, dtype=jnp.float32, compute_dtype=compute)
    eos = tokenizer.backend.id_to_token(tokenizer.eos_id) if tokenizer.eos_id is not None else "<|im_end|>"
    task = task_from_config(cfg.task, seed=cfg.run.seed, tokenizer=tokenizer.backend, eos_token=eos)
    if not init:
      params = None
  spec = sync_spec(cfg)
  return Setup(model_cfg=model_cfg, params=params, task=task, tokenizer=tokenizer, sync=spec,
               sampler_cfg=served_model_config(model_cfg, spec))


def learner_config(cfg, *, lr: float | None = None, total_steps: int | None = None) -> L.LearnerConfig:
  """The `LearnerConfig` of a run config (lr overrides the RL lr, e.g. for the supervised warm-up)."""
  lrn, cor, val = cfg.learner, cfg.correction, cfg.value
  K = lrn.minibatches
  total = total_steps if total_steps is not None else max(cfg.run.steps * K, lrn.warmup_steps + 1)
  try:
    return _learner_config(cfg, lrn, cor, val, lr, total)
  except ValueError as e:  # a combination the learner rejects: report it as a config error
    raise ConfigError(f"the learner rejects this config: {e}") from None


def _learner_config(cfg, lrn, cor, val, lr, total) -> L.LearnerConfig:
  return L.LearnerConfig(
      lr=lrn.lr if lr is None else lr,
      weight_decay=lrn.weight_decay,
      grad_clip=lrn.grad_clip if lrn.grad_clip > 0 else None,
      schedule=lrn.schedule,
      warmup_steps=lrn.warmup_steps,
      total_steps=total if lrn.schedule == "cosine" else None,
      opt_state_dtype=lrn.opt_state_dtype,
      micro_batches=lrn.micro_batches,
      compute_dtype=lrn.compute_dtype,
      qat=cfg.quant.learner_spec,
      qat_targets=cfg.quant.targets,
      qat_start_step=lrn.qat_start_step,
      qat_warmup_steps=lrn.qat_warmup_steps,
      qat_init=lrn.qat_init,
      int4_update_clip=lrn.int4_update_clip,
      remat=lrn.remat,
      policy_loss="gspo" if lrn.policy_loss == "gspo" else "ppo",  # grpo / ppo: the clipped surrogate
      clip_eps_low=lrn.clip_eps_low,
      clip_eps_high=lrn.clip_eps_high,
      dual_clip_c=lrn.dual_clip_c,
      agg=lrn.agg,
      kl_coef=lrn.kl_coef,
      kl_estimator=lrn.kl_estimator,
      entropy_coef=lrn.entropy_coef,
      correction=cor.method,
      correction_level=cor.level if cor.method in ("tis", "mis") else None,
      clip_c=cor.clip_c,
      tis_batch_normalize=cor.batch_normalize,
      mis_lo=cor.lo,
      mis_hi=cor.hi,
      acrl_gamma=cor.gamma,
      value_coef=val.coef,
      value_alpha=val.alpha,
      value_quantile_levels=tuple(val.quantile_levels),
      value_delta_schedule=False,  # the loop applies value.schedule at value.boundaries (RL steps): delta_scale
  )


def delta_scale(cfg, k: int) -> float:
  """QAE's Δ multiplier at RL step k: "step" = n+1, n, ..., 1 across the n `value.boundaries` (3, 2, 1 for
  two), "constant" = 1. The loop folds it into the learnable Δ (rescaled at each boundary), so the learner
  runs with `value_delta_schedule=False`."""
  val = cfg.value
  if not val.quantized or val.schedule != "step":
    return 1.0
  n = len(val.boundaries)
  return float(n + 1 - sum(k >= b for b in val.boundaries))


def learner_mesh(cfg):
  """The learner's mesh from `learner.mesh` (one -1 = the remaining devices), or None for a single device."""
  n = jax.device_count()
  sizes = list(cfg.learner.mesh)
  if -1 in sizes:
    known = math.prod(s for s in sizes if s != -1)
    if n % known:
      raise ValueError(f"learner.mesh={tuple(cfg.learner.mesh)} does not divide the {n} devices")
    sizes[sizes.index(-1)] = n // known
  if math.prod(sizes) == 1:
    return None
  return L.make_mesh(data=sizes[0], fsdp=sizes[1], tensor=sizes[2], devices=jax.devices()[:math.prod(sizes)])


def new_state(cfg, setup: Setup, lcfg: L.LearnerConfig, params, *, mesh=None) -> L.TrainState:
  """The RL `TrainState` over `params` (full fine-tuning, or LoRA adapters over the frozen `params`)."""
  key = jax.random.fold_in(jax.random.PRNGKey(cfg.run.seed), 1)
  lora = None
  if cfg.lora.enabled:
    lora = models.LoraConfig(rank=cfg.lora.rank, alpha=cfg.lora.alpha, targets=cfg.lora.targets)
  val = cfg.value
  return L.create_train_state(key, setup.model_cfg, lcfg, mesh=mesh, params=params, lora=lora,
                              value_head=val.enabled,
                              value_delta0=val.delta0 * delta_scale(cfg, 0) if val.quantized else NO_QUANT_DELTA,
                              acrl_x=cfg.correction.acrl_x)
