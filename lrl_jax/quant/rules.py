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

from lrl_jax.quant.qarray import QArray, dequantize, fake_quant, quantize
from lrl_jax.quant.specs import Spec

__all__ = ["QuantRules", "path_str", "quantize_params", "fake_quant_params", "dequantize_params"]

# Excluded first: the first matching rule wins.
DEFAULT_KEEP = (r"embed", r"lm_head", r"norm", r"router", r"gate/kernel$", r"bias$")
DEFAULT_QUANTIZE = (r"(q|k|v|o|gate|up|down)_proj/kernel$",)


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
  """

  rules: tuple[tuple[str, Spec | None], ...]
  axis: int = -2

  @classmethod
  def default(cls, spec: Spec | None) -> "QuantRules":
    """All attention/MLP projection kernels -> `spec`; embeddings, lm_head, norms, routers, biases kept."""
    keep = tuple((p, None) for p in DEFAULT_KEEP)
    return cls(rules=keep + tuple((p, spec) for p in DEFAULT_QUANTIZE))

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


def _map_selected(fn: Callable[[jax.Array, Spec], Any], params, rules: QuantRules):
  def visit(kp, leaf):
    spec = rules.spec_for(path_str(kp))
    return leaf if spec is None else fn(leaf, spec)

  return jax.tree_util.tree_map_with_path(visit, params)


def quantize_params(params, rules: QuantRules):
  """Params tree -> the served tree: selected leaves become QArrays, the rest is unchanged."""
  return _map_selected(lambda w, s: quantize(w, s, axis=rules.axis), params, rules)


def fake_quant_params(params, rules: QuantRules):
  """Params tree -> the same tree with selected leaves fake-quantized (straight-through gradient)."""
  return _map_selected(lambda w, s: fake_quant(w, s, axis=rules.axis), params, rules)


def dequantize_params(served, dtype=jnp.float32):
  """Served tree -> float tree (QArrays dequantized)."""
  return jax.tree_util.tree_map(
      lambda x: dequantize(x, dtype) if isinstance(x, QArray) else x, served,
      is_leaf=lambda x: isinstance(x, QArray))
