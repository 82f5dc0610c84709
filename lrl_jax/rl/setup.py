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
import numpy as np

from lrl_jax import learner as L
from lrl_jax import models, quant
from lrl_jax.config import ConfigError
from lrl_jax.quant.rules import path_str
from lrl_jax.rl.sync import SyncSpec, k_misalignment, sync_spec
from lrl_jax.tasks import Task, task_from_config

__all__ = [
  "Setup",
  "mesh_devices",
  "build_model",
  "new_state",
  "learner_mesh",
  "sampler_mesh",
  "make_sampler_mesh",
  "misaligned_kernels",
  "served_model_config",
]


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


def _device_split(cfg) -> tuple[list, list | None, str]:
  """(the devices the learner may use, the sampler's devices or None, what the learner's share is called).

  No `sampler.mesh`: the learner takes every device and the sampler serves where the sync leaves the weights.
  Colocated: the sampler's mesh is the first prod(sampler.mesh) devices, shared with the learner. Disaggregated:
  the sampler takes the last prod(sampler.mesh) devices and the learner the ones before them.
  """
  devs = jax.devices()
  sizes = cfg.sampler.mesh
  if sizes is None:
    return devs, None, f"the {len(devs)} visible"
  n_s = math.prod(sizes)
  if cfg.run.placement == "colocated":
    if n_s > len(devs):
      raise ConfigError(f"sampler.mesh={tuple(sizes)} needs {n_s} devices; {len(devs)} are visible")
    return devs, devs[:n_s], f"the {len(devs)} visible"
  if n_s >= len(devs):
    raise ConfigError(
      f"run.placement=disaggregated: sampler.mesh={tuple(sizes)} takes {n_s} devices of the {len(devs)} visible "
      "and leaves none to the learner"
    )
  rest = len(devs) - n_s
  return devs[:rest], devs[rest:], f"the {rest} left to the learner by sampler.mesh={tuple(sizes)}"


def learner_mesh(cfg):
  """The learner's mesh from `learner.mesh` (one -1 = the remaining devices), or None for a single device.

  With `run.placement=disaggregated` the devices are the ones the sampler's mesh leaves (`sampler_mesh`)."""
  devs, _, what = _device_split(cfg)
  n = len(devs)
  sizes = list(cfg.learner.mesh)
  if -1 in sizes:
    known = math.prod(s for s in sizes if s != -1)
    if n % known:
      raise ConfigError(f"learner.mesh={tuple(cfg.learner.mesh)} does not divide {what} devices")
    sizes[sizes.index(-1)] = n // known
  if math.prod(sizes) > n:
    raise ConfigError(f"learner.mesh={tuple(cfg.learner.mesh)} needs {math.prod(sizes)} devices; {what} are there")
  if math.prod(sizes) == 1:
    return None
  return L.make_mesh(data=sizes[0], fsdp=sizes[1], tensor=sizes[2], devices=devs[: math.prod(sizes)])


def mesh_devices(cfg) -> tuple[list, list | None]:
  """(the learner's devices, the sampler's mesh's devices or None): who computes what."""
  lm, sm = learner_mesh(cfg), sampler_mesh(cfg)
  learner = list(lm.devices.flat) if lm is not None else _device_split(cfg)[0][:1]
  return learner, None if sm is None else list(sm.devices.flat)


def sampler_mesh(cfg):
  """The sampler's own mesh (axes `data`, `tensor`: `sampler.SAMPLER_RULES`) from `sampler.mesh`, or None.

  Colocated: on the first devices, which the learner uses too. Disaggregated (`run.placement`): on the last
  devices, which the learner does not use; the sync moves the served (packed low-bit) weights there.
  """
  _, devs, _ = _device_split(cfg)
  return None if devs is None else make_sampler_mesh(devs, *cfg.sampler.mesh)


def make_sampler_mesh(devices, data: int, tensor: int):
  """A (data, tensor) mesh with Auto axes over `devices` in their order (the sampler's rules' axis names)."""
  auto = (jax.sharding.AxisType.Auto,) * 2
  grid = np.asarray(devices, dtype=object).reshape(data, tensor)
  return jax.sharding.Mesh(grid, ("data", "tensor"), axis_types=auto)


def misaligned_kernels(params, rules: quant.QuantRules | None, mesh) -> list[str]:
  """The kernels the sync quantizes whose shard of K on the learner's `mesh` their scale blocks do not divide.

  The sync quantizes where the masters are; a group of the format that straddles two shards of K makes XLA
  reshard the whole kernel first (measured: INT4 g64 on SmolLM2 with fsdp=4, 144-row shards, 4.3x the one-device
  sync; `lrl_jax/rl/README.md`). One line per kernel, naming K, the mesh axes over it and the block.

  Args:
    params: the float parameter tree (arrays or `jax.ShapeDtypeStruct`s).
    rules: the served format's `quant.QuantRules` (None: nothing is quantized).
    mesh: the learner's mesh (None: one device).
  """
  if rules is None or mesh is None:
    return []
  shardings = L.param_shardings(params, mesh)
  out = []
  flat = jax.tree_util.tree_leaves_with_path(params)
  for (path, leaf), sh in zip(flat, jax.tree_util.tree_leaves(shardings)):
    name = path_str(path)
    bad = k_misalignment(leaf.shape, sh.spec, mesh.shape, rules.spec_for(name), rules.axis)
    if bad is not None:
      axes, n, block = bad
      K = leaf.shape[rules.axis % len(leaf.shape)]
      out.append(f"{name}: K={K} over {'x'.join(axes)}={n} is {K // n} rows per shard, blocks of {block}")
  return out


def new_state(cfg, setup: Setup, params, *, mesh=None) -> L.TrainState:
  """The RL `TrainState` of `cfg.learner` over `params` (full fine-tuning, or LoRA adapters over them)."""
  key = jax.random.fold_in(jax.random.PRNGKey(cfg.run.seed), 1)
  return L.create_train_state(key, setup.model_cfg, cfg.learner, mesh=mesh, params=params)
