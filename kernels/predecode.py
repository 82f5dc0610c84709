"""`Predecoded`: a served weight decoded once, for backends where the matmul is compute-bound.

On a GPU / TPU a decode step is memory-bound and the low-bit kernels read the codes directly (`qmatmul`,
`qlinear`). On a CPU the step is compute-bound and XLA's path decodes every weight at every step (a full pass of
dequantization per token: INT4 serving ran at 0.6x and NVFP4 at 0.15x of bf16). `predecode` does that decode
once, outside the decode loop, into the operand `quant.qdot` computes: ŵ = dequantize(q, dtype), without NVFP4's
per-matrix scale `dec`, which `predecoded_dot` applies after the K sum as `qdot` does. The product is the same
dot on the same operand as the XLA path, so the served numbers do not change (tested bit for bit).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import layout

from lrl_jax import quant
from lrl_jax.kernels import dispatch

__all__ = ["Predecoded", "predecode", "predecode_params", "predecoded_dot", "predecode_by_default", "dense_dot"]


@functools.partial(jax.tree_util.register_dataclass, data_fields=["w", "dec"], meta_fields=["axis"])
@dataclasses.dataclass(frozen=True)
class Predecoded:
  """A weight decoded once: w = dequantize(q, dtype) (NVFP4: without `dec`).

  Attributes:
    w: [.., K, N] (axis -2, the contract's layout) or [.., N, K] (axis -1, the nn.Linear layout) in the compute
      dtype; leading axes are stacked layers (sliced by the decoder's scan like the QArray they came from).
    dec: f32 [..] NVFP4's per-matrix decode scale (one per stacked matrix), applied after the K sum; else None.
    axis: the contraction axis of w, -2 or -1 (static).
  """

  w: jax.Array
  dec: jax.Array | None
  axis: int = -2


def predecode_by_default() -> bool:
  """Whether a decode loop should predecode its served weights: on the backend `qmatmul` dispatches for, the CPU
  (compute-bound: `qmatmul` takes XLA's decode-then-dot there anyway); GPU / TPU keep the low-bit kernels."""
  return dispatch._backend() == "cpu"


def predecode(q: quant.QArray, dtype) -> Predecoded:
  """The `Predecoded` of a weight QArray for activations of `dtype` (the operand `quant.qdot` dots with)."""
  nvfp4 = isinstance(q.spec, quant.NVFP4)
  w = quant.dequantize(q, jnp.dtype(dtype), global_scale=not nvfp4)
  return Predecoded(w=w, dec=q.global_scale.astype(jnp.float32) if nvfp4 else None, axis=q.axis)


def predecode_params(params, dtype):
  """`params` with every QArray leaf predecoded for activations of `dtype` (float leaves unchanged)."""
  is_q = lambda x: isinstance(x, quant.QArray)  # noqa: E731
  return jax.tree_util.tree_map(lambda x: predecode(x, dtype) if is_q(x) else x, params, is_leaf=is_q)


def _dot(x, w, k_axis: int):
  return lax.dot_general(x, w, (((x.ndim - 1,), (k_axis,)), ((), ())), preferred_element_type=jnp.float32)


def dense_dot(x: jax.Array, w: jax.Array, k_axis: int = 0, out_dtype=jnp.float32) -> jax.Array:
  """x [..., K] · w (one matrix, [K, N] for k_axis 0, [N, K] for 1) -> [..., N]: a dense layer's product, accumulated
  in float32 and returned in `out_dtype` (float32 by default; x.dtype for a layer whose output is cast back to it).

  The forward is `lax.dot_general` as written, then the cast. The backward is that dot's own vjp on x flattened to
  [rows, K]: the same products, but the weight gradient contracts one axis of rows, not x's leading axes. (XLA:CPU
  lays a dot that contracts two axes out by transposing the gradient, fused with the elementwise work that makes
  it, e.g. the SwiGLU backward; that fusion ran at ~130 MB/s and took a quarter of a SmolLM2 learner step:
  `lrl_jax/learner/README.md`.)

  With x and w in a narrow dtype (bf16 compute), the two backward dots take the cotangent in that dtype too, each
  accumulating in f32 and cast to its operand's dtype. With `out_dtype` that dtype (a layer's output) the cotangent
  arrives so. A float32 output (the LM head's: its log-softmax reads f32 logits) gets an f32 cotangent, which the
  backward rounds to the operands' dtype first, as torch's autocast does (its bf16 linear's output gradient is
  bf16). That rounding (u = 2⁻⁸ relative per element) is of the size of the one both gradients get anyway, cast to
  bf16 at the end: the error bound goes from about u·Σ|terms| to 2u·Σ|terms|. Mixing an f32 cotangent with a bf16
  operand instead makes XLA convert the bf16 operand to float32 and run float32 dots (on a SmolLM2 bf16 learner
  step, 6 GB of converts, and the LM head's backward at the f32 rate: `lrl_jax/learner/README.md`).
  """
  return _dense_dot(x, w, k_axis, jnp.dtype(out_dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _dense_dot(x, w, k_axis, out_dtype):
  return _dot(x, w, k_axis).astype(out_dtype)


def _dense_dot_fwd(x, w, k_axis, out_dtype):
  return _dense_dot(x, w, k_axis, out_dtype), (x, w)


def _dense_dot_bwd(k_axis, out_dtype, res, g):
  x, w = res
  x2 = x.reshape(-1, x.shape[-1])
  g2 = g.reshape(-1, g.shape[-1])
  dx, dw = _product_grads(x2, w, g2, k_axis)
  return dx.astype(x.dtype).reshape(x.shape), dw.astype(w.dtype)


_dense_dot.defvjp(_dense_dot_fwd, _dense_dot_bwd)

_NN = (((1,), (0,)), ((), ()))  # [M, K] · [K, N]: the row-major product every matmul library takes as it is


def _grads(x2, w, g2, k_axis):
  """(dx, dw) f32 of x2 [rows, K] · w with cotangent g2 [rows, N], dw in w's layout: each a dot contracting one axis,
  as XLA is given them (the rows of x2 and g2 are their leading axis)."""
  dx = lax.dot_general(g2, w, (((1,), (1 - k_axis,)), ((), ())), preferred_element_type=jnp.float32)  # [rows, K]
  a, b = (x2, g2) if k_axis == 0 else (g2, x2)  # dw [K, N] = xᵀ · g, or [N, K] = gᵀ · x
  return dx, lax.dot_general(a, b, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def _product_grads(x2, w, g2, k_axis):
  """(dx, dw) f32 of the backward both custom vjps here share: on bf16 (narrow) x2 and w, `_narrow_grads` with the
  cotangent rounded to their dtype (the LM head's f32 one; a layer's arrives so); else `_grads` in f32 (the same
  bits as jax's own vjp of the f32 dot)."""
  if x2.dtype == w.dtype != jnp.float32:
    return _narrow_grads(x2, w, g2.astype(x2.dtype), k_axis)
  return _grads(x2, w, g2.astype(jnp.float32), k_axis)


def _narrow_grads(x2, w, g2, k_axis):
  """`_grads` of bf16 (narrow) x2, w and g2: on a CPU `_grads_row_major`, elsewhere `_grads`."""
  on = lambda f: functools.partial(f, k_axis=k_axis)  # noqa: E731
  return lax.platform_dependent(x2, w, g2, cpu=on(_grads_row_major), default=on(_grads))


def _row_major_transpose(a):
  """a.T written out in row-major order (a copy), where XLA would otherwise fold the transpose into its consumer."""
  return layout.with_layout_constraint(a.T, layout.Layout(major_to_minor=(0, 1)))


def _grads_row_major(x2, w, g2, k_axis):
  """`_grads` with every product row-major ([M, K] · [K, N]) on copied transposes (xᵀ: [K, rows]; wᵀ: a
  weight). XLA:CPU gives a bf16 dot to its YNNPACK kernels only in that form (`IsDotSupportedByYnn`: neither
  operand column-major); any other it runs on float32 copies of both operands, at the f32 rate. On a CPU with AMX a
  [576, 1536] x [1536, 1536] bf16 weight gradient ran at 1206 against 240 GFLOP/s so (learner README). The
  same products; the copies cost one pass over x and over the weight."""
  dx = lax.dot_general(g2, w if k_axis == 1 else _row_major_transpose(w), _NN, preferred_element_type=jnp.float32)
  if k_axis == 0:  # dw [K, N] = xᵀ · g
    dw = lax.dot_general(_row_major_transpose(x2), g2, _NN, preferred_element_type=jnp.float32)
  else:  # dw [N, K] = gᵀ · x
    dw = lax.dot_general(_row_major_transpose(g2), x2, _NN, preferred_element_type=jnp.float32)
  return dx, dw


def predecoded_dot(x: jax.Array, p: Predecoded, out_dtype=jnp.float32) -> jax.Array:
  """x [..., K] ⋅ ŵ -> [..., N] in `out_dtype` (`dense_dot`'s; float32 by default): `quant.qdot` on the predecoded
  operand (one matrix, no stack)."""
  if p.w.ndim != 2:
    raise ValueError(f"predecoded_dot: one matrix at a time (a stack is sliced by the layer scan); got {p.w.shape}")
  k_axis = 0 if p.axis == -2 else 1
  if x.shape[-1] != p.w.shape[k_axis]:
    raise ValueError(f"predecoded_dot: activations {tuple(x.shape)} do not contract with weight {p.w.shape}")
  if p.dec is None:
    return dense_dot(x, p.w, k_axis, out_dtype)
  return _scaled_dense_dot(x, p.w, p.dec, k_axis, jnp.dtype(out_dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _scaled_dense_dot(x, w, dec, k_axis, out_dtype):
  """dense_dot(x, w) · dec (NVFP4's per-matrix scale after the K sum), with dec applied to the three products'
  f32 outputs in the backward too: dx = (g · wᵀ) · dec, dw = (xᵀ · g) · dec, each then in its operand's dtype.
  jax's own backward of `y · dec` scales the cotangent g first, a pass over [rows, N] in f32 whose result is no
  longer in the compute dtype: on a TPU target it is written out and read by both dots (0.9 GB of a SmolLM2 NVFP4
  QAT step's 24.9, `lrl_jax/learner/README.md`), where a scale on a dot's output fuses into the dot. dec is a
  constant to differentiation (its cotangent is zero): the scales are not trained, as in every QAT path here.
  out_dtype as `dense_dot`'s, and as there, bf16 operands make bf16 backward dots (the cotangent rounded to bf16)."""
  return (_dot(x, w, k_axis) * dec).astype(out_dtype)


def _scaled_dense_dot_fwd(x, w, dec, k_axis, out_dtype):
  return _scaled_dense_dot(x, w, dec, k_axis, out_dtype), (x, w, dec)


def _scaled_dense_dot_bwd(k_axis, out_dtype, res, g):
  x, w, dec = res
  x2, g2 = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
  dx, dw = _product_grads(x2, w, g2, k_axis)
  return (dx * dec).astype(x.dtype).reshape(x.shape), (dw * dec).astype(w.dtype), jnp.zeros_like(dec)


_scaled_dense_dot.defvjp(_scaled_dense_dot_fwd, _scaled_dense_dot_bwd)
