"""Building the served tree from learner parameters: what the RL weight sync calls every step.

Served formats: bf16 (no rules), INT4 W4A16 (`Int4`), FP8 E4M3 weights (`FP8`), NVFP4, MXFP8 —
whatever spec the `QuantRules` give. The kernels are quantized with `quant.quantize_params`, the
same rules and numerics the learner's QAT forward fake-quantizes with, after the cast to the
compute dtype (the contract: quantize the array the matmul sees).

Layouts: "kn" keeps the QArrays as quantized, [.., K, N] along K (`kernels.qmatmul`); "linear" stores them
in the nn.Linear orientation [.., N, K] (`kernels.linear_layout`: the same codes and scales, transposed once
here), which the decoder runs through `kernels.qlinear` (Hopper: the W4A16 kernel that decodes in registers).
`quant.dequantize_params` of a "linear" tree gives its kernels as stored, [.., N, K]: not a float parameter
tree for `models.forward` (serve "kn" for that).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from lrl_jax import kernels, quant
from lrl_jax.models.bundle import LoadedModel

__all__ = ["serve_params", "as_rules"]


def as_rules(rules_or_spec) -> quant.QuantRules | None:
  """A `QuantRules`, a spec (-> `QuantRules.default(spec)`), or None (no quantization)."""
  if rules_or_spec is None or isinstance(rules_or_spec, quant.QuantRules):
    return rules_or_spec
  if isinstance(rules_or_spec, (quant.Int4, quant.FP8, quant.MXFP8, quant.NVFP4, quant.NVFP4WAG)):
    return quant.QuantRules.default(rules_or_spec)
  raise ValueError(f"serve_params expects QuantRules, a quantization spec or None; got {rules_or_spec!r}")


LAYOUTS = ("kn", "linear")


@functools.partial(jax.jit, static_argnames=("rules", "dtype", "layout"))
def _serve(params, rules, dtype, layout):
  cast = jax.tree_util.tree_map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, params)
  if rules is None:
    return cast
  served = quant.quantize_params(cast, rules)
  if layout == "linear":
    isq = lambda x: isinstance(x, quant.QArray)  # noqa: E731
    served = jax.tree_util.tree_map(lambda x: kernels.linear_layout(x) if isq(x) else x, served, is_leaf=isq)
  return served


def serve_params(params, rules_or_spec=None, *, dtype=None, layout: str = "kn"):
  """Learner params -> served tree (jit'd): float leaves cast to `dtype`, selected kernels -> QArrays.

  Args:
    params: float parameter tree (`models.init_params` layout), or a `models.LoadedModel`: then the result is
      a `LoadedModel` too (the served tree, the same tokenizer, `cfg.dtype` = `dtype`), so the compute dtype is
      set in one place (the loader's `compute_dtype`).
    rules_or_spec: `quant.QuantRules`, a spec (default rules: every attention / MLP projection
      kernel), or None for a plain `dtype` model (the bf16 served format).
    dtype: the sampler's compute dtype (`cfg.dtype`); kernels are quantized from this cast, as the
      learner's QAT forward with the same `cfg.dtype` fake-quantizes them. None: the `LoadedModel`'s
      `cfg.dtype`; bfloat16 for a bare tree.
    layout: "kn" (QArrays [.., K, N] as quantized) or "linear" ([.., N, K], see the module docstring).

  Returns:
    The served tree; pass it to `generate` / `models.forward` with `cfg.dtype == dtype`. A `LoadedModel` for a
    `LoadedModel`.
  """
  if isinstance(params, LoadedModel):
    dtype = params.cfg.dtype if dtype is None else jnp.dtype(dtype).name
    served = serve_params(params.params, rules_or_spec, dtype=dtype, layout=layout)
    return params.replace(cfg=params.cfg.replace(dtype=jnp.dtype(dtype).name), params=served)
  dtype = jnp.bfloat16 if dtype is None else dtype
  if any(
    isinstance(x, quant.QArray)
    for x in jax.tree_util.tree_leaves(params, is_leaf=lambda x: isinstance(x, quant.QArray))
  ):
    raise ValueError("serve_params expects float learner params; the tree already holds QArrays")
  if layout not in LAYOUTS:
    raise ValueError(f"serve_params: layout must be one of {LAYOUTS}; got {layout!r}")
  rules = as_rules(rules_or_spec)
  if layout == "linear" and rules is not None and rules.axis != -2:
    raise ValueError(
      f"serve_params(layout='linear') transposes kernels quantized along K (rules.axis=-2); got rules.axis={rules.axis}"
    )
  return _serve(params, rules, jnp.dtype(dtype), layout)
