"""lrl_jax.kernels — low-bit matmuls that read QArray codes directly.

`qmatmul(x, q)` computes `x @ dequantize(q)` for a weight QArray q of logical shape [K, N]
quantized along its contraction axis (axis 0).
"""

import jax
import jax.numpy as jnp

from lrl_jax import quant

__all__ = ["qmatmul"]


def qmatmul(x: jax.Array, q: quant.QArray) -> jax.Array:
  """[..., K] @ QArray[K, N] -> [..., N] in x.dtype (XLA dequantize-then-dot)."""
  w = quant.dequantize(q, x.dtype)
  return jnp.dot(x, w, preferred_element_type=jnp.float32).astype(x.dtype)
