"""Functional MLPs for control policies: float / fake-INT4 (QAT) forward, real-INT4 deployment.

Parameters are a plain dict {"dense_i": {"kernel": [K, N], "bias": [N]}}, layer i computing
h_{i+1} = act(h_i · W_i + b_i) (no activation after the last layer).

* `mlp_apply(params, x, spec=None)`: float forward; with an `quant.Int4` spec every
  dense matmul goes through `quant.dot_general_for(spec)`, the learner's QAT dot
  (ŵ = dequantize(quantize(W, spec, axis=-2)), straight-through gradient).
* `deploy(params, spec)`: kernels -> `quant.quantize(W, spec, axis=-2)` (packed INT4 codes
  + bf16 group scales); biases stay float32 (W4A16; activations stay float32 here).
* `served_apply(served, x)`: forward through `lrl_jax.kernels.qmatmul` only.

`mlp_apply(params, x, spec)` and `served_apply(deploy(params, spec), x)` compute the same
numbers: both dot float32 activations with ŵ (same contract), which the tests check.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from lrl_jax import kernels, quant

__all__ = ["Activation", "mlp_init", "mlp_apply", "deploy", "served_apply", "check_spec_fits", "param_bytes"]

Activation = Literal["tanh", "relu"]
_ACTS = {"tanh": jnp.tanh, "relu": jax.nn.relu}
_DN = (((1,), (0,)), ((), ()))  # [M, K] · [K, N]


def _act(name: str):
  if name not in _ACTS:
    raise ValueError(f"activation must be one of {sorted(_ACTS)}; got {name!r}")
  return _ACTS[name]


def _layers(params) -> list[str]:
  names = sorted(params, key=lambda s: int(s.split("_")[-1]))
  if not names or any(not n.startswith("dense_") for n in names):
    raise ValueError(f"MLP params must be {{'dense_i': {{'kernel', 'bias'}}}}; got keys {sorted(params)}")
  return names


def mlp_init(
  key: jax.Array, sizes: tuple[int, ...], *, in_features: int | None = None, head_scale: float = 1.0
) -> dict:
  """Orthogonal init (gain √2, last layer `head_scale`), zero biases (PureJaxRL / CleanRL practice).

  Args:
    key: PRNG key.
    sizes: (in_dim, hidden..., out_dim); in_dim is the padded width.
    in_features: real (unpadded) input features; rows in_features..in_dim-1 of the first
      kernel are zero (they only ever see zero padding). Default: all rows are real.
    head_scale: orthogonal gain of the last layer (0.01 for a policy head, 1 for values).

  Returns:
    {"dense_i": {"kernel": [sizes[i], sizes[i+1]] f32, "bias": [sizes[i+1]] f32}}.
  """
  if len(sizes) < 2 or any(int(s) <= 0 for s in sizes):
    raise ValueError(f"mlp_init: sizes must be >= 2 positive widths; got {sizes}")
  in_features = sizes[0] if in_features is None else in_features
  if not 0 < in_features <= sizes[0]:
    raise ValueError(f"mlp_init: in_features {in_features} must be in [1, {sizes[0]}]")
  params = {}
  keys = jax.random.split(key, len(sizes) - 1)
  for i, (k, n) in enumerate(zip(sizes[:-1], sizes[1:])):
    gain = head_scale if i == len(sizes) - 2 else np.sqrt(2.0)
    rows = in_features if i == 0 else k
    w = jax.nn.initializers.orthogonal(gain)(keys[i], (rows, n), jnp.float32)
    w = jnp.pad(w, [(0, k - rows), (0, 0)])
    params[f"dense_{i}"] = {"kernel": w, "bias": jnp.zeros((n,), jnp.float32)}
  return params


def check_spec_fits(params, spec: quant.Int4 | None) -> None:
  """Raises ValueError naming the layer and its kernel shape when the group size does not divide K."""
  if spec is None:
    return
  if not isinstance(spec, quant.Int4):
    raise ValueError(f"control QAT supports quant.Int4 specs; got {spec}")
  for name in _layers(params):
    k = params[name]["kernel"].shape[-2]
    if k % spec.group_size:
      raise ValueError(
        f"{spec}: group size {spec.group_size} does not divide K = {k} of {name}/kernel "
        f"{tuple(params[name]['kernel'].shape)}; pad the observation (pad_multiple) or "
        f"widen the layer to a multiple of {spec.group_size}"
      )


def mlp_apply(params, x: jax.Array, *, spec: quant.Int4 | None = None, activation: Activation = "tanh") -> jax.Array:
  """[..., in_dim] -> [..., out_dim] float32; with `spec`, each kernel is fake-quantized (QAT)."""
  act = _act(activation)
  names = _layers(params)
  check_spec_fits(params, spec)
  dg = quant.dot_general_for(spec)
  lead = x.shape[:-1]
  h = x.reshape(-1, x.shape[-1]).astype(jnp.float32)
  for i, name in enumerate(names):
    layer = params[name]
    h = dg(h, layer["kernel"], _DN) + layer["bias"][None, :]
    if i < len(names) - 1:
      h = act(h)
  return h.reshape(lead + (h.shape[-1],))


def deploy(params, spec: quant.Int4) -> dict:
  """Real-INT4 policy: {"dense_i": {"kernel": QArray [K, N] (packed codes + scales), "bias": f32}}."""
  if spec is None:
    raise ValueError("deploy needs a quant spec (the float policy is the params themselves)")
  check_spec_fits(params, spec)
  return {
    name: {
      "kernel": quant.quantize(params[name]["kernel"], spec, axis=-2),
      "bias": jnp.asarray(params[name]["bias"], jnp.float32),
    }
    for name in _layers(params)
  }


def served_apply(served, x: jax.Array, *, activation: Activation = "tanh") -> jax.Array:
  """Forward of a `deploy`ed policy through `kernels.qmatmul` (no float kernel exists)."""
  act = _act(activation)
  names = _layers(served)
  lead = x.shape[:-1]
  h = x.reshape(-1, x.shape[-1]).astype(jnp.float32)
  for i, name in enumerate(names):
    w = served[name]["kernel"]
    if not isinstance(w, quant.QArray):
      raise ValueError(f"served_apply: {name}/kernel is {type(w).__name__}, not a QArray; use deploy()")
    h = kernels.qmatmul(h, w) + served[name]["bias"][None, :]
    if i < len(names) - 1:
      h = act(h)
  return h.reshape(lead + (h.shape[-1],))


def param_bytes(tree) -> int:
  """Bytes of a (float or served) parameter tree: QArray.nbytes for quantized kernels."""
  return quant.tree_nbytes(tree)
