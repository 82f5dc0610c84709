"""Weight sync: the learner's master parameters -> the sampler's served tree, every RL step.

The served tree is `sampler.serve_params(params, rules, dtype=sampler dtype)`: float leaves cast to the
sampler's compute dtype, and the kernels the rules select quantized to the sampler's spec (INT4 / FP8 /
MXFP8 / NVFP4) with the same numerics the learner's QAT forward fake-quantizes with. The bf16 arm
(`quant.sampler=bf16`) serves the weights cast to bfloat16, with no quantization.

Numerics contract (see `learner/step.py`): the learner fake-quantizes the *compute-dtype cast* of its
masters, so the sampler's dtype must equal the learner's compute dtype for QAT to make π and μ share
their weights exactly; `sync_dtype` picks it (the bf16 arm always casts to bfloat16).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp

from lrl_jax import quant
from lrl_jax.sampler import serve_params, shard_params

__all__ = ["SyncSpec", "sync", "sync_spec", "merge_lora"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class SyncSpec:
  """What `sync` produces.

  Attributes:
    rules: `quant.QuantRules` of the served kernels, or None (plain float weights).
    dtype: the served float dtype (the sampler's compute dtype; bfloat16 for the bf16 arm).
    layout: "kn" or "linear": the orientation of the served QArrays (`sampler.serve_params`).
  """

  rules: quant.QuantRules | None
  dtype: Any = jnp.bfloat16
  layout: str = "kn"


def sync_spec(cfg) -> SyncSpec:
  """The `SyncSpec` of a run config (`lrl_jax.config.Config`).

  Served dtype: bfloat16 for `quant.sampler=bf16`; otherwise `sampler.dtype` (which, for an exact QAT
  contract, should equal `learner.compute_dtype`).
  """
  spec = cfg.quant.sampler_spec
  rules = None if spec is None else cfg.quant.rules(spec)
  dtype = jnp.bfloat16 if cfg.quant.sampler == "bf16" else jnp.dtype(cfg.sampler.dtype)
  return SyncSpec(rules=rules, dtype=dtype, layout=cfg.sampler.weight_layout)


def merge_lora(params, lora):
  """params with each adapted kernel replaced by W + (α/r)·A·B (float; for a sampler without LoRA support).

  Args:
    params: float parameter tree (the frozen base).
    lora: a `models.Lora` (or None: params unchanged).
  """
  if lora is None:
    return params
  out = jax.tree_util.tree_map(lambda x: x, params)
  for group, mods in lora.params["layers"].items():
    for name, ab in mods.items():
      w = out["layers"][group][name]["kernel"]
      delta = jnp.einsum("lkr,lrn->lkn", ab["a"].astype(jnp.float32), ab["b"].astype(jnp.float32))
      out["layers"][group][name] = dict(
        out["layers"][group][name], kernel=(w.astype(jnp.float32) + lora.scale * delta).astype(w.dtype)
      )
  return out


def sync(learner_params, cfg_or_spec, *, mesh=None, lora=None, timings: dict | None = None):
  """Learner params -> served params (quantized like the sampler serves them), placed on the sampler's mesh.

  Args:
    learner_params: the float master tree (fp32), as `TrainState.params`.
    cfg_or_spec: a run `Config` or a `SyncSpec`.
    mesh: the sampler's mesh (`jax.sharding.Mesh`); None: leave the arrays where they are.
    lora: `models.Lora` adapters to merge into the base before quantizing (a sampler without LoRA support).
    timings: if given, it receives the wall times (blocked until the arrays are ready): "sync_s" (all of it),
      "sync_quantize_s" (on the learner's devices), "sync_transfer_s" (to `mesh`; 0 without one) and
      "sync_bytes" (the served tree's bytes, one copy: what moves to the sampler's mesh).

  Returns:
    The served tree: QArray kernels for a quantized format, else float leaves in the served dtype.
  """
  spec = cfg_or_spec if isinstance(cfg_or_spec, SyncSpec) else sync_spec(cfg_or_spec)
  t0 = time.perf_counter()
  params = merge_lora(learner_params, lora)
  served = serve_params(params, spec.rules, dtype=spec.dtype, layout=spec.layout)
  if timings is not None:
    jax.block_until_ready(served)
  t1 = time.perf_counter()
  if mesh is not None:
    # Quantized where the masters are, then only the packed codes and scales move: jax.device_put onto the
    # sampler's NamedShardings copies each shard to its device (within a process; across processes it needs a
    # collective, which a device_put between two meshes of one global program also is).
    served = shard_params(served, mesh)
  if timings is not None:
    jax.block_until_ready(served)
    t2 = time.perf_counter()
    moved = t2 - t1 if mesh is not None else 0.0
    timings.update(sync_s=t2 - t0, sync_quantize_s=t1 - t0, sync_transfer_s=moved, sync_bytes=quant.tree_nbytes(served))
  return served
