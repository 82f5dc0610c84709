"""Quantization-aware update clipping: no INT4 weight moves more than k grid steps per update.

An optax `GradientTransformation`, chained *after* the optimizer (its input is the update the
optimizer proposes, its output what `optax.apply_updates` adds to the params). For every INT4
kernel the rules select, each element's update u is clipped to its group's grid step s:

    u' = clip(u, −k·s_g, k·s_g),  g = the group (along `rules.axis`) the element belongs to,

so that one update moves a weight by at most k steps of its group's grid as it stands before the
update (the "gradient clipping thresholds that know the INT4 grid" of the INT4 RL write-up; slime
and verl clip only the global gradient norm). The step s of a group is

  * the learned scale sibling `P/kernel_scale` [.., K/G, N] when the params hold one
    (`Int4(scheme="learned")`), as the forward uses it (floored at 1e-5, rounded to `scale_dtype`);
  * otherwise the scale `quant.quantize(w, spec, axis=rules.axis)` computes from the *current*
    params (absmax: bf16(amax/7); minmax: bf16((max − min)/15)).

Leaves the rules do not select, leaves selected with a non-INT4 format (FP8 / MXFP8 / NVFP4 have
no uniform grid step) and the `kernel_scale` / `kernel_zero` siblings themselves pass unchanged.
Default off: the learner chains it only when `learner.int4_update_clip` is set.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from lrl_jax.quant.qarray import check_spec, quantize
from lrl_jax.quant.rules import SCALE_SUFFIX, ZERO_SUFFIX, QuantRules, path_str, sibling_base
from lrl_jax.quant.specs import Int4

__all__ = ["int4_update_clip", "int4_group_steps"]


def _flat(tree) -> dict[str, jax.Array]:
  return {path_str(kp): x for kp, x in jax.tree_util.tree_leaves_with_path(tree)}


def _is_sibling(path: str, flat: dict, rules: QuantRules) -> bool:
  """True for `P/kernel_scale` / `P/kernel_zero` when `P/kernel` is in the tree and selected."""
  base = sibling_base(path)
  return base in flat and rules.spec_for(base) is not None


def int4_group_steps(
  w: jax.Array,
  spec: Int4,
  *,
  axis: int,
  scale: jax.Array | None = None,
  zero_point: jax.Array | None = None,
  path: str = "kernel",
) -> jax.Array:
  """The INT4 grid step of each element's group, broadcast to `w`'s shape, float32.

  Args:
    w: a kernel [.., K, N].
    spec: its `Int4` spec.
    axis: the group axis (`rules.axis`, −2 for `x @ w` kernels).
    scale: the learned scale [.., K/G, N] (`P/kernel_scale`), or None: the scale `quantize` computes from w.
    zero_point: the learned zero point (`P/kernel_zero`), or None.
    path: the kernel's path, for error messages.

  Returns:
    s [.., K, N] float32: the scale the forward uses, `quantize(w, spec, axis=axis, scale=scale,
    zero_point=zero_point).scale` (a learned scale floored at 1e-5 and rounded to `spec.scale_dtype`),
    repeated over the G elements of each group along `axis`.

  Raises:
    ValueError naming `path` when the group size does not divide the axis or `scale` has the wrong shape.
  """
  try:
    ax = check_spec(spec, tuple(w.shape), w.dtype, axis)
    s = quantize(w, spec, axis=ax, scale=scale, zero_point=zero_point).scale
  except ValueError as e:
    raise ValueError(f"int4_update_clip: kernel {path!r} {tuple(w.shape)}: {e}") from None
  return jnp.repeat(s.astype(jnp.float32), spec.group_size, axis=ax)


def int4_update_clip(rules: QuantRules, *, k: float = 1.0) -> optax.GradientTransformation:
  """Clips each INT4 kernel's update elementwise to ±k·s of its group (see the module docstring).

  Use after the optimizer: `optax.chain(optax.adamw(lr), int4_update_clip(rules, k=1.0))`.
  The update needs the params: call `tx.update(updates, state, params)`.

  Args:
    rules: the `QuantRules` of the learner's QAT (which kernels, which spec, the group axis).
    k: the largest move per update, in grid steps (> 0). k = 1: no weight moves more than one
      INT4 step per update.

  Returns:
    A stateless `optax.GradientTransformation` (state: `optax.EmptyState`).

  Raises:
    ValueError: k <= 0; at update time, params None, or a kernel / scale sibling of the wrong shape.
  """
  if not isinstance(rules, QuantRules):
    raise TypeError(f"int4_update_clip: rules must be a QuantRules; got {type(rules).__name__}")
  if not (isinstance(k, (int, float)) and k > 0):
    raise ValueError(f"int4_update_clip: k must be a positive number of INT4 steps; got {k!r}")

  def init_fn(params):
    del params
    return optax.EmptyState()

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError(
        "int4_update_clip needs the params (the grid step of a group comes from them): call "
        "tx.update(updates, state, params)"
      )
    flat_p = _flat(params)

    def visit(kp, u):
      path = path_str(kp)
      spec = rules.spec_for(path)
      if not isinstance(spec, Int4) or _is_sibling(path, flat_p, rules) or u is None:
        return u
      if path not in flat_p:
        raise ValueError(f"int4_update_clip: update {path!r} has no parameter of that path")
      w = flat_p[path]
      if tuple(u.shape) != tuple(w.shape):
        raise ValueError(
          f"int4_update_clip: update {path!r} has shape {tuple(u.shape)}, its parameter {tuple(w.shape)}"
        )
      s = int4_group_steps(
        w,
        spec,
        axis=rules.axis,
        scale=flat_p.get(path + SCALE_SUFFIX),
        zero_point=flat_p.get(path + ZERO_SUFFIX),
        path=path,
      )
      bound = jax.lax.stop_gradient(k * s)
      return jnp.clip(u, -bound, bound).astype(u.dtype)

    return jax.tree_util.tree_map_with_path(visit, updates), state

  return optax.GradientTransformation(init_fn, update_fn)
