"""Which parameters are quantized: regex rules on the parameter path.

A path is the '/'-joined keys of a parameter in its tree, e.g.
`layers_3/attn/q_proj/kernel`. The first rule whose pattern matches (re.search)
decides: its spec, or None for "stay high precision". Unmatched paths stay high
precision. The same rules drive the learner's fake quant and the sampler's real
codes, so both quantize exactly the same tensors.

Default: every linear layer of attention and MLP (`*_proj/kernel`); embeddings,
lm_head, norms, biases and MoE routers stay high precision.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable

import jax
import jax.numpy as jnp

from lrl_jax.quant.qarray import QArray, dequantize, fake_quant, learned_fake_quant, quantize
from lrl_jax.quant.specs import Spec

__all__ = [
  "QuantRules",
  "DEFAULT_TARGETS",
  "path_str",
  "quantize_params",
  "fake_quant_params",
  "dequantize_params",
  "init_learned",
  "SCALE_SUFFIX",
  "ZERO_SUFFIX",
  "sibling_base",
]

# Excluded first: the first matching rule wins.
DEFAULT_KEEP = (r"embed", r"lm_head", r"norm", r"router", r"gate/kernel$", r"bias$")
DEFAULT_TARGETS = r"(q|k|v|o|gate|up|down)_proj/kernel$"  # every attention / MLP projection kernel


def path_str(keypath) -> str:
  """A jax key path -> 'a/b/c'."""
  parts = []
  for k in keypath:
    for attr in ("key", "name", "idx"):
      if hasattr(k, attr):
        parts.append(str(getattr(k, attr)))
        break
    else:
      parts.append(str(k))
  return "/".join(parts)


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantRules:
  """Ordered (pattern, spec | None) rules; the first match wins.

  Attributes:
    rules: tuple of (regex, spec or None).
    axis: the axis groups run along in a selected kernel; -2 for Flax `Dense`
      kernels [.., K, N] used as `x @ w` (the contraction axis; leading axes are
      stacked layers).
    keep_last_layers: `NVFP4WAG` only: the last k layers of the decoder's stack run their matmuls in the compute
      dtype (NVIDIA's recipe keeps a few final blocks in BF16). Default 0: every layer W/A/G, because the sampler
      serves every layer in NVFP4 and a layer trained in bf16 but served in NVFP4 is a train-inference mismatch.
  """

  rules: tuple[tuple[str, Spec | None], ...]
  axis: int = -2
  keep_last_layers: int = 0

  def __post_init__(self):
    if not (isinstance(self.keep_last_layers, int) and self.keep_last_layers >= 0):
      raise ValueError(f"QuantRules.keep_last_layers must be an int >= 0; got {self.keep_last_layers!r}")

  @classmethod
  def default(cls, spec: Spec | None, *, targets: str = DEFAULT_TARGETS, keep_last_layers: int = 0) -> "QuantRules":
    """The `targets` kernels (default: every attention / MLP projection) -> `spec`; embeddings, lm_head, norms,
    routers and biases are kept whatever `targets` says (they come first). The one builder of the rules the
    learner's QAT forward and the sampler's served weights use."""
    keep = tuple((p, None) for p in DEFAULT_KEEP)
    return cls(rules=keep + ((targets, spec),), keep_last_layers=keep_last_layers)

  def spec_for(self, path: str) -> Spec | None:
    for pattern, spec in self.rules:
      if re.search(pattern, path):
        return spec
    return None

  def selected(self, params) -> list[str]:
    """Paths of the parameters these rules quantize."""
    out = []
    for kp, _ in jax.tree_util.tree_leaves_with_path(params):
      p = path_str(kp)
      if self.spec_for(p) is not None:
        out.append(p)
    return out


SCALE_SUFFIX = "_scale"  # learned INT4: `P/kernel_scale` sits next to `P/kernel`
ZERO_SUFFIX = "_zero"  # and `P/kernel_zero` when the zero point is learned too


def sibling_base(name: str) -> str | None:
  """'P/kernel' for a learned-scale sibling name 'P/kernel_scale' / 'P/kernel_zero' (a key or a path); else None."""
  for suffix in (SCALE_SUFFIX, ZERO_SUFFIX):
    if name.endswith(suffix):
      return name[: -len(suffix)]
  return None


def _is_sibling(key: str, node: dict) -> bool:
  return sibling_base(key) in node


def _map_selected(fn: Callable[..., Any], params, rules: QuantRules, *, drop_siblings: bool):
  """Applies fn(leaf, spec, scale, zero, path) to the selected leaves of a tree of dicts.

  Learned INT4 scales / zero points (`<name>_scale`, `<name>_zero` next to a selected leaf
  `<name>`) are handed to fn and, with `drop_siblings`, left out of the result (the QArray
  carries them). A learned spec whose scale is missing is an error naming the path.
  """

  def visit(node, prefix):
    if not isinstance(node, dict):
      spec = rules.spec_for(prefix)
      if spec is None:
        return node
      _check_learned(spec, prefix, None, None)
      return fn(node, spec, None, None, prefix)
    out = {}
    for k, v in node.items():
      path = f"{prefix}/{k}" if prefix else str(k)
      if isinstance(k, str) and _is_sibling(k, node) and not isinstance(v, dict):
        if drop_siblings and rules.spec_for(path[: path.rindex("_")]) is not None:
          continue
        out[k] = v
        continue
      if isinstance(v, dict):
        out[k] = visit(v, path)
        continue
      spec = rules.spec_for(path)
      if spec is None:
        out[k] = v
        continue
      scale, zero = node.get(f"{k}{SCALE_SUFFIX}"), node.get(f"{k}{ZERO_SUFFIX}")
      _check_learned(spec, path, scale, zero)
      out[k] = fn(v, spec, scale, zero, path)
    return out

  if not isinstance(params, dict):
    return jax.tree_util.tree_map_with_path(
      lambda kp, leaf: (
        leaf
        if rules.spec_for(path_str(kp)) is None
        else fn(leaf, rules.spec_for(path_str(kp)), None, None, path_str(kp))
      ),
      params,
    )
  return visit(params, "")


def _check_learned(spec, path, scale, zero):
  learned = getattr(spec, "learned", False)
  if learned and scale is None:
    raise ValueError(
      f"{path}: {spec} needs its learned scale `{path}{SCALE_SUFFIX}` next to it "
      f"(create it with quant.init_learned(params, rules))"
    )
  if learned and spec.learn_zero_point and zero is None:
    raise ValueError(
      f"{path}: {spec} needs its learned zero point `{path}{ZERO_SUFFIX}` next to it "
      f"(create it with quant.init_learned(params, rules))"
    )
  if not learned and (scale is not None or zero is not None):
    raise ValueError(
      f"{path}: has a learned scale / zero point next to it but the rules give {spec} "
      f"(scheme={getattr(spec, 'scheme', None)!r}); use Int4(scheme='learned')"
    )


def quantize_params(params, rules: QuantRules):
  """Params tree -> the served tree: selected leaves become QArrays, the rest is unchanged.

  Learned INT4 scales / zero points next to a kernel are used as they are (never recomputed
  from the weights) and move into its QArray.
  """
  return _map_selected(
    lambda w, spec, s, z, _: quantize(w, spec, axis=rules.axis, scale=s, zero_point=z),
    params,
    rules,
    drop_siblings=True,
  )


def fake_quant_params(params, rules: QuantRules):
  """Params tree -> the same tree with selected leaves fake-quantized (straight-through gradient;
  learned INT4 scales / zero points by LSQ / LSQ+, kept in the tree)."""

  def one(w, spec, s, z, _):
    if s is not None:
      return learned_fake_quant(
        w, s.astype(jnp.float32), None if z is None else z.astype(jnp.float32), spec, axis=rules.axis
      )
    return fake_quant(w, spec, axis=rules.axis)

  return _map_selected(one, params, rules, drop_siblings=False)


def init_learned(params, rules: QuantRules, *, dtype=None, overwrite: bool = False):
  """Adds learned INT4 scales (and zero points) next to each selected kernel whose spec is learned.

  `P/kernel_scale` float32 [.., K/G, ..] starts at the absmax scale (minmax when the zero point is
  learned) of the kernel, `P/kernel_zero` float32 at the minmax zero point (signed convention).
  Leaves that already have them keep theirs (a restored checkpoint) unless `overwrite`
  (re-initialise from the current weights: QAT switched on late). Other specs: tree unchanged.

  Args:
    params: a tree of dicts.
    rules: the learner's QAT rules.
    dtype: quantize the kernel's cast to this dtype (the learner's compute dtype: the array its
      matmul sees), so the initial learned values equal the absmax / minmax ones of the QAT forward;
      None: the kernel's own dtype.
    overwrite: replace existing learned leaves.
  """

  def visit(node, prefix):
    out = dict(node)
    for k, v in node.items():
      path = f"{prefix}/{k}" if prefix else str(k)
      if isinstance(v, dict):
        out[k] = visit(v, path)
        continue
      spec = rules.spec_for(path)
      if spec is None or not getattr(spec, "learned", False) or (f"{k}{SCALE_SUFFIX}" in node and not overwrite):
        continue
      q = quantize(v if dtype is None else v.astype(dtype), spec, axis=rules.axis)
      out[f"{k}{SCALE_SUFFIX}"] = q.scale.astype(jnp.float32)
      if spec.learn_zero_point:
        out[f"{k}{ZERO_SUFFIX}"] = q.zero_point.astype(jnp.float32)
    return out

  if not isinstance(params, dict):
    raise ValueError(f"init_learned expects a tree of dicts; got {type(params).__name__}")
  return visit(params, "")


def dequantize_params(served, dtype=jnp.float32):
  """Served tree -> float tree (QArrays dequantized)."""
  return jax.tree_util.tree_map(
    lambda x: dequantize(x, dtype) if isinstance(x, QArray) else x, served, is_leaf=lambda x: isinstance(x, QArray)
  )
