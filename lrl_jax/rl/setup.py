"""Building a run's pieces from its `Config`: model and task, the learner's mesh and train state.

`build_model(cfg)` gives the policy (tiny / SmolLM2 / HF dir / GGUF file) with the task that matches its
tokenizer; `new_state` creates the `TrainState` that `cfg.learner` describes (full or LoRA, with or without a
critic). The learner's settings are `cfg.learner` itself (`learner.LearnerConfig`): nothing here maps them.
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

__all__ = ["Setup", "build_model", "new_state", "learner_mesh", "served_model_config"]


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


def build_model(cfg, *, init: bool = True, task=None) -> Setup:
  """Model, parameters and task of a run config.

  Args:
    cfg: a `lrl_jax.config.Config`.
    init: create / load the parameters (False: `params` is None; the shapes come from a checkpoint).
    task: the user's task instead of `cfg.task`'s: a `Task`, or a callable (encoder, seed) -> Task given the model's
      prompt encoder (`tasks.task_from_config`).
  """
  compute = cfg.learner.compute_dtype
  src = cfg.model.source
  tokenizer = None
  if src == "tiny":
    task = task_from_config(cfg.task, seed=cfg.run.seed, task=task)
    model_cfg = cfg.model.tiny_model_config(vocab_size=task.encoder.vocab_size, dtype=compute)
    params = None
    if init:
      key = jax.random.fold_in(jax.random.PRNGKey(cfg.run.seed), 0)
      params = models.init_params(model_cfg, key, std=cfg.model.init_std)
  else:
    if src.startswith("hf:"):
      path = src.split(":", 1)[1]
      model = models.load_hf(path, dtype=jnp.float32, compute_dtype=compute)
      if model.tokenizer is None:
        model = model.replace(tokenizer=models.load_tokenizer(path))  # names the missing tokenizer.json
    else:
      path = models.smollm2_path() if src == "smollm2" else src.split(":", 1)[1]
      model = models.load_gguf(path, dtype=jnp.float32, compute_dtype=compute)
    k = cfg.model.layers
    if k is not None:
      if k > model.cfg.num_layers:
        raise ConfigError(f"model.layers={k}: {src} has only {model.cfg.num_layers} decoder blocks")
      model = model.first_layers(k)
    model_cfg, params, tokenizer = model
    eos = tokenizer.backend.id_to_token(tokenizer.eos_id) if tokenizer.eos_id is not None else "<|im_end|>"
    task = task_from_config(cfg.task, seed=cfg.run.seed, tokenizer=tokenizer.backend, eos_token=eos, task=task)
    if not init:
      params = None
  spec = sync_spec(cfg)
  return Setup(
    model_cfg=model_cfg,
    params=params,
    task=task,
    tokenizer=tokenizer,
    sync=spec,
    sampler_cfg=served_model_config(model_cfg, spec),
  )


def learner_mesh(cfg):
  """The learner's mesh from `learner.mesh` (one -1 = the remaining devices), or None for a single device."""
  n = jax.device_count()
  sizes = list(cfg.learner.mesh)
  if -1 in sizes:
    known = math.prod(s for s in sizes if s != -1)
    if n % known:
      raise ConfigError(f"learner.mesh={tuple(cfg.learner.mesh)} does not divide the {n} devices")
    sizes[sizes.index(-1)] = n // known
  if math.prod(sizes) > n:
    raise ConfigError(f"learner.mesh={tuple(cfg.learner.mesh)} needs {math.prod(sizes)} devices; {n} are visible")
  if math.prod(sizes) == 1:
    return None
  return L.make_mesh(data=sizes[0], fsdp=sizes[1], tensor=sizes[2], devices=jax.devices()[: math.prod(sizes)])


def new_state(cfg, setup: Setup, params, *, mesh=None) -> L.TrainState:
  """The RL `TrainState` of `cfg.learner` over `params` (full fine-tuning, or LoRA adapters over them)."""
  key = jax.random.fold_in(jax.random.PRNGKey(cfg.run.seed), 1)
  return L.create_train_state(key, setup.model_cfg, cfg.learner, mesh=mesh, params=params)
