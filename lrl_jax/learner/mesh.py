"""The learner's device mesh and its logical-axis rules (parameters and activations).

Mesh axes (MaxText / nanodo naming):

| axis     | what is split                                                        |
|----------|----------------------------------------------------------------------|
| `data`   | the batch (pure data parallelism: parameters replicated)             |
| `fsdp`   | the batch *and* the parameters' model-width (`embed`) dimension (ZeRO-3 style: gathered per layer by XLA) |
| `tensor` | heads, MLP width and vocabulary (Megatron tensor parallelism)        |

The model names every parameter dimension and every constrained activation dimension
(`models.param_logical_axes`, `models.ACTIVATION_AXES`); the two tables below map those
names to mesh axes. A name absent from a table is replicated. The same name can map
differently for parameters and activations: `embed` is `fsdp`-sharded in a weight but
replicated in an activation (whose batch dimension already uses `fsdp`).

Divisibility: a parameter dimension whose size is not a multiple of the product of its
mesh axes' sizes falls back to *replicated for that dimension* (e.g. Hkv·Dh = 16 over a
`tensor` axis of 32); the other dimensions keep their sharding. Activations are
constrained only inside `activation_rules(mesh)`, where XLA pads uneven splits itself.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from lrl_jax import quant
from lrl_jax.models import Lora, lora_logical_axes, param_logical_axes

__all__ = [
  "MESH_AXES",
  "PARAM_RULES",
  "ACTIVATION_RULES",
  "make_mesh",
  "logical_to_spec",
  "param_shardings",
  "lora_shardings",
  "replicated",
  "batch_sharding",
  "shard_batch",
  "activation_rules",
]

MESH_AXES = ("data", "fsdp", "tensor")

# Logical name -> mesh axes, for parameters (fp32 masters, their optimizer moments, adapters).
PARAM_RULES: tuple[tuple[str, Any], ...] = (
  ("embed", "fsdp"),
  ("vocab", "tensor"),
  ("heads", "tensor"),
  ("kv_heads", "tensor"),
  ("mlp", "tensor"),
  ("layers", None),
  ("head_dim", None),
)

# Logical name -> mesh axes, for activations (`with_logical_constraint` inside the forward).
ACTIVATION_RULES: tuple[tuple[str, Any], ...] = (
  ("batch", ("data", "fsdp")),
  ("length", None),
  ("embed", None),
  ("vocab", "tensor"),
  ("heads", "tensor"),
  ("kv_heads", "tensor"),
  ("mlp", "tensor"),
  ("head_dim", None),
  ("layers", None),
  ("cache_length", None),
)


def make_mesh(*, data: int = 1, fsdp: int = 1, tensor: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A (data, fsdp, tensor) mesh with `AxisType.Auto` axes (the step uses `with_sharding_constraint`).

  Args:
    data, fsdp, tensor: axis sizes; their product must equal the number of devices used.
    devices: the devices (default: all of `jax.devices()`, every host's in a multi-host run).

  Raises:
    ValueError: a size < 1 or a product that does not match the device count.
  """
  sizes = {"data": data, "fsdp": fsdp, "tensor": tensor}
  for k, v in sizes.items():
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
      raise ValueError(f"make_mesh: {k} must be a positive int; got {v!r}")
  devs = list(jax.devices() if devices is None else devices)
  n = data * fsdp * tensor
  if n != len(devs):
    raise ValueError(f"make_mesh: data*fsdp*tensor = {data}*{fsdp}*{tensor} = {n} != {len(devs)} devices")
  return jax.make_mesh((data, fsdp, tensor), MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devs)


def _axis_size(mesh: Mesh, axes) -> int:
  if axes is None:
    return 1
  if isinstance(axes, str):
    axes = (axes,)
  return math.prod(mesh.shape[a] for a in axes)


def logical_to_spec(
  names: Sequence[str | None], shape: Sequence[int], mesh: Mesh, rules: Sequence[tuple[str, Any]] = PARAM_RULES
) -> P:
  """Logical names of an array's dimensions -> a PartitionSpec on `mesh`.

  Each name takes the mesh axes of its rule, unless a previous dimension of the same array
  already uses one of them (a mesh axis shards at most one dimension) or the dimension's
  size is not divisible by the axes' total size (then that dimension is replicated).
  """
  if len(names) != len(shape):
    raise ValueError(f"logical_to_spec: {len(names)} names {tuple(names)} for an array of shape {tuple(shape)}")
  table = dict(rules)
  used: set[str] = set()
  out = []
  for name, size in zip(names, shape):
    axes = table.get(name) if name is not None else None
    flat = () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
    if not flat or used & set(flat) or size % _axis_size(mesh, flat):
      out.append(None)
      continue
    used |= set(flat)
    out.append(flat[0] if len(flat) == 1 else flat)
  return P(*out)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def _is_names(x) -> bool:
  return isinstance(x, tuple) and all(n is None or isinstance(n, str) for n in x)


def _shardings_from_names(abstract, names_tree, mesh: Mesh, rules):
  is_leaf = lambda x: isinstance(x, quant.QArray)

  def one(names, leaf):
    if isinstance(leaf, quant.QArray):
      return jax.tree_util.tree_map(
        lambda n, a: NamedSharding(mesh, logical_to_spec(n[: a.ndim] if len(n) > a.ndim else n, a.shape, mesh, rules)),
        names,
        leaf,
        is_leaf=_is_names,
      )
    return NamedSharding(mesh, logical_to_spec(names, leaf.shape, mesh, rules))

  return jax.tree_util.tree_map(one, names_tree, abstract, is_leaf=lambda x: _is_names(x) or is_leaf(x))


def param_shardings(abstract_params, mesh: Mesh, rules: Sequence[tuple[str, Any]] = PARAM_RULES):
  """NamedShardings for a model parameter tree (float arrays, ShapeDtypeStructs or QArrays).

  Args:
    abstract_params: the tree of `models.init_params` (or its `jax.eval_shape`), or a served
      tree with QArray leaves (codes and scales take the kernel's names; a dimension of a
      scale that does not divide falls back to replicated like any other).
    mesh: from `make_mesh`.
    rules: logical name -> mesh axes (default `PARAM_RULES`).

  Returns:
    A tree like `abstract_params` of `NamedSharding`s (QArray leaves: a QArray of shardings).
  """
  return _shardings_from_names(abstract_params, param_logical_axes(abstract_params), mesh, rules)


def lora_shardings(abstract_lora: Lora, mesh: Mesh, rules: Sequence[tuple[str, Any]] = PARAM_RULES) -> Lora:
  """NamedShardings for LoRA adapters (A: (layers, K-axis, None), B: (layers, None, N-axis))."""
  names = lora_logical_axes(abstract_lora)
  return Lora(
    params=_shardings_from_names(abstract_lora.params, names.params, mesh, rules), config=abstract_lora.config
  )


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
  """Leading (batch) dimension over ('data', 'fsdp'), the rest replicated."""
  return NamedSharding(mesh, P(("data", "fsdp"), *([None] * (ndim - 1))))


def shard_batch(batch, mesh: Mesh):
  """Places every array of a batch pytree (leading dimension B) with `batch_sharding`.

  Across processes every process passes the whole batch (the same values: e.g. the RL loop's exchanged rollout,
  `rl.procs`) and places the rows its devices hold; when each holds only its own rows, build each array with
  `jax.make_array_from_process_local_data` instead (multihost.py).
  """

  def put(x):
    n = _axis_size(mesh, ("data", "fsdp"))
    if x.shape[0] % n:
      raise ValueError(
        f"shard_batch: batch dimension {x.shape[0]} (array shape {x.shape}) is not divisible by data*fsdp = {n}"
      )
    sharding = batch_sharding(mesh, x.ndim)
    if jax.process_count() > 1:
      whole = np.asarray(x)
      return jax.make_array_from_callback(whole.shape, sharding, lambda idx: whole[idx])
    return jax.device_put(x, sharding)

  return jax.tree_util.tree_map(put, batch)


@contextlib.contextmanager
def activation_rules(rules: Sequence[tuple[str, Any]] = ACTIVATION_RULES):
  """Context in which the decoder's `with_logical_constraint`s map names through `rules`.

  They act only while a mesh is set (`jax.set_mesh(mesh)` around the call, or tracing under
  a jit whose inputs live on the mesh, see `step.train_step`); otherwise they are no-ops.
  """
  with nn.logical_axis_rules(rules):
    yield
