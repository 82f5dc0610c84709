"""`qdot`: the one definition of a matmul on a QArray weight, shared by the sampler and the learner.

    qdot(x, q) = lax.dot_general(x, dequantize(q, x.dtype)) in float32        Int4, FP8, MXFP8
    qdot(x, q) = dec · lax.dot_general(x, e2m1 · s_b) in float32               NVFP4 (dec = q.global_scale)

NVFP4 applies its per-matrix decode scale once, after the K sum, instead of on every weight. The two are
the same x̂ = e2m1 · s_b · dec of the contract, but the factored form is *closer* to it for bf16 / f16
activations: e2m1 · s_b is exact in those dtypes (a 2-bit times a 4-bit significand, |·| in [2^-10, 2688]),
while e2m1 · s_b · dec is not (24 bits of dec) and `dequantize(q, bf16)` rounds it, 2^-9 relative per weight.
It is also what a GPU kernel can afford: no per-weight f32 product and bf16 repack in its decode loop
(Marlin-FP4 and TensorRT-LLM put the tensor scale in the epilogue likewise). The learner's NVFP4 QAT dot
(`dot_general_for(NVFP4())`) computes this same form, so π and μ agree bit for bit on one backend.

Every kernel of `lrl_jax.kernels` computes `qdot` up to f32 summation order; `kernels.xla_matmul` is it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from lrl_jax.quant.qarray import QArray, dequantize
from lrl_jax.quant.specs import NVFP4

__all__ = ["qdot"]


def qdot(x: jax.Array, q: QArray, dimension_numbers=None, *, precision=None, materialize: bool = False) -> jax.Array:
  """x ⋅ x̂ of a weight QArray, float32, in the served form (module docstring).

  Args:
    x: activations; the weight is dequantized to x.dtype (exactly, for NVFP4 without dec).
    q: the weight. With NVFP4 its per-matrix scales (shape q.shape[:-2]) must belong to the rhs free dims:
      q has no batch dims in `dimension_numbers` and contracts over one of its last two axes.
    dimension_numbers: as `lax.dot_general`; default: x's last axis with q's axis -2 (`jnp.dot` on [.., K, N]).
    precision: of the dot.
    materialize: put ŵ behind an optimization barrier, so XLA computes it once and then the plain dot, and
      cannot fuse the dequantization into the dot (XLA:CPU recomputes it per row when it does).
  """
  if dimension_numbers is None:
    dimension_numbers = (((x.ndim - 1,), (q.ndim - 2,)), ((), ()))
  nvfp4 = isinstance(q.spec, NVFP4)
  w = dequantize(q, x.dtype, global_scale=not nvfp4)
  if materialize:
    w = lax.optimization_barrier(w)
  y = lax.dot_general(x, w, dimension_numbers, precision=precision, preferred_element_type=jnp.float32)
  if not nvfp4:
    return y
  (_, rhs_c), (_, rhs_b) = dimension_numbers
  if rhs_b or len(rhs_c) != 1 or int(rhs_c[0]) % q.ndim < q.ndim - 2:
    raise ValueError(
      f"qdot: an NVFP4 weight {q.shape} must contract over one of its last two axes and have no "
      f"batch dims (its decode scale is per matrix); got dimension_numbers {dimension_numbers}"
    )
  # The output ends with the rhs free dims in order: the stack dims, then the matrix's free axis.
  dec = q.global_scale.astype(jnp.float32)
  return y * dec.reshape((1,) * (y.ndim - dec.ndim - 1) + dec.shape + (1,))
