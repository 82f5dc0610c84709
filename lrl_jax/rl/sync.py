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
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from lrl_jax import quant
from lrl_jax.quant.rules import path_str
from lrl_jax.sampler import serve_params, shard_params

__all__ = ["SyncSpec", "sync", "sync_spec", "merge_lora", "k_misalignment", "align_for_quantize"]


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


def _k_block(spec) -> int | None:
  """Elements of one scale block along K (the contraction axis) of a spec, or None (FP8 per channel: all of K)."""
  if isinstance(spec, quant.FP8):
    return spec.block if spec.granularity == "block" else None
  return getattr(spec, "block", None)


def _dim_axes(pspec, axis: int) -> tuple[str, ...]:
  """The mesh axes that PartitionSpec `pspec` puts on dimension `axis` (non-negative)."""
  entry = pspec[axis] if axis < len(pspec) else None
  return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def k_misalignment(shape, pspec, mesh_shape, spec, axis: int) -> tuple[tuple[str, ...], int, int] | None:
  """(the mesh axes over K, their total size n, the block) when a kernel of `shape` laid out by `pspec` on a mesh of
  `mesh_shape` (axis name -> size) has K shards (K / n rows) that the quantizer's blocks of `spec` along K (dimension
  `axis`) do not divide; None when they do, or nothing is blocked along K."""
  block = None if spec is None else _k_block(spec)
  if block is None or len(shape) < 2:
    return None
  axes = _dim_axes(pspec, axis % len(shape))
  n = math.prod(mesh_shape[a] for a in axes)
  return (axes, n, block) if n > 1 and (shape[axis % len(shape)] // n) % block else None


def align_for_quantize(params, rules: quant.QuantRules | None):
  """params with every kernel whose K shards its scale blocks do not divide resharded so that they do.

  A kernel [.., K, N] sharded over K by mesh axes of total size n, with K / n not a multiple of the format's block,
  makes the partitioner reshard the whole kernel inside the quantizer (INT4 g64 on SmolLM2 with fsdp = 4: 4.3x
  the one-device sync, `lrl_jax/rl/README.md`). Here those mesh axes move from K to N when N's size lets them
  (else K is gathered over them), one `jax.device_put` per such kernel; the quantized values do not change (the
  quantizer is elementwise per block; sharding is layout only). Leaves without a NamedSharding, and kernels already
  aligned, are returned as they are.
  """
  if rules is None:
    return params

  def fix(path, w):
    sh = getattr(w, "sharding", None)
    if not isinstance(sh, NamedSharding):
      return w
    bad = k_misalignment(w.shape, sh.spec, sh.mesh.shape, rules.spec_for(path_str(path)), rules.axis)
    if bad is None:
      return w
    nd, k_ax = w.ndim, rules.axis % w.ndim
    n_ax = nd - 1 if k_ax == nd - 2 else nd - 2  # the other matrix dimension
    entries = list(sh.spec) + [None] * (nd - len(sh.spec))
    on_n = _dim_axes(sh.spec, n_ax) + bad[0]
    entries[k_ax] = None
    if w.shape[n_ax] % math.prod(sh.mesh.shape[a] for a in on_n) == 0:
      entries[n_ax] = on_n
    return jax.device_put(w, NamedSharding(sh.mesh, P(*entries)))

  return jax.tree_util.tree_map_with_path(fix, params)


def sync(learner_params, cfg_or_spec, *, mesh=None, lora=None, timings: dict | None = None, align: bool = True):
  """Learner params -> served params (quantized like the sampler serves them), placed on the sampler's mesh.

  Args:
    learner_params: the float master tree (fp32), as `TrainState.params`.
    cfg_or_spec: a run `Config` or a `SyncSpec`.
    mesh: the sampler's mesh (`jax.sharding.Mesh`); None: leave the arrays where they are.
    lora: `models.Lora` adapters to merge into the base before quantizing (a sampler without LoRA support).
    timings: if given, it receives the wall times (blocked until the arrays are ready): "sync_s" (all of it),
      "sync_quantize_s" (on the learner's devices), "sync_transfer_s" (to `mesh`; 0 without one) and
      "sync_bytes" (the served tree's bytes, one copy: what moves to the sampler's mesh).
    align: reshard the kernels whose K shards split the format's blocks first (`align_for_quantize`; the values
      are the same either way). False only to measure what that saves (`lrl-jax bench sync`).

  Returns:
    The served tree: QArray kernels for a quantized format, else float leaves in the served dtype.
  """
  spec = cfg_or_spec if isinstance(cfg_or_spec, SyncSpec) else sync_spec(cfg_or_spec)
  t0 = time.perf_counter()
  params = merge_lora(learner_params, lora)
  if align:
    params = align_for_quantize(params, spec.rules)
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
