"""Finding non-finite values under jit: checkify checks on every float leaf of a tree."""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax.experimental import checkify

from lrl_jax.quant.rules import path_str

__all__ = ["check_finite", "checked"]


def check_finite(tree, name: str = "tree") -> None:
  """Inside a function run under `checked` (or `checkify.checkify`): fail on NaN/Inf in any float leaf.

  The error names the leaf's path, e.g. "non-finite values in grads/layers/mlp/up_proj/kernel".
  """
  for kp, leaf in jax.tree_util.tree_leaves_with_path(tree):
    leaf = jnp.asarray(leaf)
    if jnp.issubdtype(leaf.dtype, jnp.floating):
      path = path_str(kp)
      checkify.check(
        jnp.all(jnp.isfinite(leaf.astype(jnp.float32))),
        f"non-finite values in {name}/{path}" if path else f"non-finite values in {name}",
      )


def checked(fn: Callable) -> Callable:
  """jit(fn) with its `check_finite` calls live: raises `checkify.JaxRuntimeError` on the first failure."""
  run = jax.jit(checkify.checkify(fn))

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    err, out = run(*args, **kwargs)
    err.throw()
    return out

  return wrapper
