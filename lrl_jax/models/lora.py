"""LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models").

y = x @ W + (α / r) · (x @ A) @ B, with A [K, r] ~ N(0, 1/K)·(init std) and B [r, N] = 0, so a
freshly initialised adapter leaves the model unchanged. The base W is frozen and may be a float
array, a fake-quantized float array (QAT rules) or a QArray whose matmul runs through
`lrl_jax.kernels.qmatmul` — the QeRL recipe (NVFP4 base + LoRA): gradients reach A and B through
the kernel's VJP with respect to its activation input.

Adapter tree (layers stacked like the base; one entry per targeted layer kernel):
  layers/attn/q_proj/a [L, D, r], layers/attn/q_proj/b [L, r, H·Dh], ... (same for k/v/o, gate/up/down).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import ClassVar

import jax
import jax.numpy as jnp

from lrl_jax import quant
from lrl_jax.models.config import ModelConfig
from lrl_jax.models.decoder import _PARAM_AXES, param_shapes
from lrl_jax.schema import Schema, check_regex

__all__ = ["LoraConfig", "Lora", "init_lora", "lora_logical_axes"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoraConfig(Schema):
  """LoRA adapters over a frozen base: which kernels get them and how large (YAML: `learner.lora`)."""

  section: ClassVar[str] = "learner.lora"

  rank: int = 8  # adapter rank r
  alpha: float = 16.0  # adapter scale α (the adapter output is scaled by α / r)
  targets: str = quant.DEFAULT_TARGETS  # regex (re.search) on stacked kernel paths, e.g. layers/attn/q_proj/kernel
  init_std: float = 1.0  # std of A's entries is init_std / sqrt(K) (B starts at zero)

  def _validate(self):
    self._check(self.rank > 0, "rank", "must be > 0")
    self._check(self.alpha > 0, "alpha", "must be > 0")
    self._check(self.init_std > 0, "init_std", "must be > 0")
    check_regex(self, "targets")

  @property
  def scale(self) -> float:
    return self.alpha / self.rank


@functools.partial(jax.tree_util.register_dataclass, data_fields=["params"], meta_fields=["config"])
@dataclasses.dataclass(frozen=True)
class Lora:
  """Adapter parameters (a pytree: `jax.grad` w.r.t. a Lora gives a Lora of gradients).

  Attributes:
    params: {'layers': {'attn': {'q_proj': {'a': [L, K, r], 'b': [L, r, N]}, ...}, 'mlp': {...}}}.
    config: the `LoraConfig` (static).
  """

  params: dict
  config: LoraConfig

  @property
  def scale(self) -> float:
    return self.config.scale

  def layer_params(self) -> dict:
    return self.params["layers"]


def _targets(cfg: ModelConfig, lcfg: LoraConfig) -> dict[str, tuple[int, ...]]:
  shapes = param_shapes(cfg)
  out = {}
  for p, shape in shapes.items():
    if not p.endswith(("/kernel", "/embedding")):
      continue  # targets are matched against weight matrices only (biases, norms never get adapters)
    if re.search(lcfg.targets, p):
      if not (p.startswith("layers/") and p.endswith("_proj/kernel")):
        raise ValueError(
          f"LoRA target regex {lcfg.targets!r} selects {p!r}; only layer projection "
          f"kernels (layers/.../*_proj/kernel) can carry adapters"
        )
      out[p] = shape
  if not out:
    raise ValueError(f"LoRA target regex {lcfg.targets!r} selects no kernel of {sorted(shapes)}")
  return out


def init_lora(cfg: ModelConfig, lcfg: LoraConfig, key: jax.Array, *, dtype=jnp.float32) -> Lora:
  """Adapters for every kernel `lcfg.targets` selects: A ~ N(0, init_std²/K), B = 0."""
  tree: dict = {}
  targets = _targets(cfg, lcfg)
  keys = jax.random.split(key, len(targets))
  for k, (p, (L, K, N)) in zip(keys, sorted(targets.items())):
    a = (lcfg.init_std / jnp.sqrt(K)) * jax.random.normal(k, (L, K, lcfg.rank), jnp.float32)
    b = jnp.zeros((L, lcfg.rank, N), jnp.float32)
    _, group, name, _ = p.split("/")
    tree.setdefault("layers", {}).setdefault(group, {})[name] = {"a": a.astype(dtype), "b": b.astype(dtype)}
  return Lora(params=tree, config=lcfg)


def lora_logical_axes(lora: Lora) -> Lora:
  """Logical axis names of the adapters: A (layers, <kernel input axis>, None), B (layers, None, <output axis>)."""

  def visit(kp, _):
    keys = [getattr(k, "key", None) for k in kp]
    _, group, name, ab = keys[-4:]  # params/layers/group/name/ab
    layers, k_ax, n_ax = _PARAM_AXES[f"layers/{group}/{name}/kernel"]
    return (layers, k_ax, None) if ab == "a" else (layers, None, n_ax)

  return Lora(params=jax.tree_util.tree_map_with_path(visit, lora.params), config=lora.config)
