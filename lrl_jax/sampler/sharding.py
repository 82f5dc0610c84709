"""The sampler's sharding rules: logical axis names (models.param_logical_axes) -> mesh axes.

The sampler may run on its own mesh, disaggregated from the learner's. Default: tensor
parallelism over heads / MLP width / vocabulary on the `tensor` axis, batch on `data`. A
dimension the mesh axis does not divide (e.g. the group axis of a packed INT4 scale) stays
replicated rather than failing.
"""

from __future__ import annotations

import jax
from jax.sharding import NamedSharding, PartitionSpec

from lrl_jax import quant
from lrl_jax.models.decoder import param_logical_axes

__all__ = ["SAMPLER_RULES", "partition_spec", "param_shardings", "shard_params", "shard_batch", "batch_axis_size"]

SAMPLER_RULES: tuple[tuple[str, str | None], ...] = (
  ("batch", "data"),
  ("vocab", "tensor"),
  ("heads", "tensor"),
  ("kv_heads", "tensor"),
  ("mlp", "tensor"),
  ("embed", None),
  ("layers", None),
  ("head_dim", None),
  ("length", None),
  ("cache_length", None),
)


def partition_spec(names, shape, mesh, rules=SAMPLER_RULES) -> PartitionSpec:
  """Logical names of an array [shape] -> PartitionSpec; a mesh axis that is absent, already used,
  or does not divide the dimension leaves it replicated."""
  table = dict(rules)
  used, out = set(), []
  for name, dim in zip(names, shape):
    ax = table.get(name)
    if ax is None or ax not in mesh.shape or ax in used or dim % mesh.shape[ax]:
      out.append(None)
    else:
      out.append(ax)
      used.add(ax)
  return PartitionSpec(*out)


def param_shardings(served, mesh, rules=SAMPLER_RULES):
  """A tree of NamedShardings for a served (or float) parameter tree; QArray fields each get their own."""
  axes = param_logical_axes(served)
  isq = lambda x: isinstance(x, quant.QArray)

  def one(names, leaf):
    if isinstance(leaf, quant.QArray):
      f = lambda n, a: None if a is None else NamedSharding(mesh, partition_spec(n, a.shape, mesh, rules))
      return quant.QArray(
        codes=f(names.codes, leaf.codes),
        scale=f(names.scale, leaf.scale),
        global_scale=f(names.global_scale, leaf.global_scale),
        spec=leaf.spec,
        axis=leaf.axis,
        zero_point=f(names.zero_point, leaf.zero_point),
      )
    return NamedSharding(mesh, partition_spec(names, leaf.shape, mesh, rules))

  return jax.tree_util.tree_map(one, axes, served, is_leaf=lambda x: isq(x) or isinstance(x, tuple))


def shard_params(served, mesh, rules=SAMPLER_RULES):
  """Places a served tree on `mesh` by the sampler's rules (jax.device_put with NamedShardings)."""
  return jax.device_put(served, param_shardings(served, mesh, rules))


def shard_batch(x, mesh, rules=SAMPLER_RULES):
  """Places a [B, ...] array with its batch axis on the rules' `batch` mesh axis."""
  names = ("batch",) + (None,) * (x.ndim - 1)
  return jax.device_put(x, NamedSharding(mesh, partition_spec(names, x.shape, mesh, rules)))


def batch_axis_size(tree, rules=SAMPLER_RULES) -> tuple[int, object]:
  """(size, mesh) of the mesh axis the rules put the batch on, for the mesh `tree`'s arrays are placed on
  (`shard_params`); (1, None) when they are not on a multi-device mesh."""
  axis = dict(rules).get("batch")
  for leaf in jax.tree_util.tree_leaves(tree):
    sh = getattr(leaf, "sharding", None)
    if isinstance(sh, NamedSharding):
      return int(sh.mesh.shape.get(axis, 1)) if axis else 1, sh.mesh
  return 1, None
