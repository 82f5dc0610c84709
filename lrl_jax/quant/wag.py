"""NVFP4 weights, activations and gradients: the linear layer of NVIDIA's NVFP4 training recipe, emulated.

Recipe (Pretraining LLMs with NVFP4, arXiv 2509.25149; torchao's NVFP4 training tracker pytorch/ao#3293;
TransformerEngine's `NVFP4BlockScaling`), for y = x @ W with x [M, K] (M tokens), W [K, N]:

    forward  y  = x̂ @ Ŵ        x̂: 1x16 blocks along K, RNE;  Ŵ: 16x16 tiles, RNE
    dgrad    dx = d̂y @ Ŵᵀ       d̂y: 1x16 blocks along N, stochastic rounding (SR); the same Ŵ
    wgrad    dW = (T x)^ᵀ @ (T dy)^   T = blockdiag(H·D) along M (random Hadamard transform, RHT);
                                      both 16x1 blocks along M, x RNE, dy SR

Every operand carries the NVFP4 contract's scales (`quant.NVFP4`): a per-tensor FP32 dec = amax/2688 and one
E4M3 scale s_b per block. A GEMM multiplies the exact block values m = e2m1 · s_b (exact in bf16: a 2-bit times
a 4-bit significand), accumulates in f32 and applies the two tensor scales after the sum:
y = ((m_a @ m_b) · dec_b) · dec_a, where Blackwell's `scaled_matmul` applies s_b per block inside the sum (the
same products, exact either way) and dec_a · dec_b in the epilogue (one f32 rounding apart). Only the summation
order is left to the backend. The gradients are these quantized GEMMs' outputs: no straight-through estimator.

Why a spec of its own (`NVFP4WAG(rht, sr)`) rather than a flag on `NVFP4`: `NVFP4` is a storage format with one
meaning everywhere (the sampler's QArrays, the kernels, export); W/A/G is a way of running the learner's GEMMs.
As a weight format it is NVFP4 whose E4M3 scales are shared by 16x16 tiles: `quantize(w, NVFP4WAG(), axis=-2)`
returns a plain `NVFP4()` QArray (each tile's scale repeated over its 16 columns), so the sampler serves the
forward's Ŵ exactly with its NVFP4 kernels, and with `act_spec=NVFP4()` the activations 1x16 too (W4A4).

`act_scale="token"` (an option, not the recipe) gives the forward's activations one FP32 scale per token, so a
token's codes do not depend on which tokens share its matmul (the sampler's decode steps vs the learner's batch).

Random draws (SR uniforms, RHT signs) come from one key per layer and step (`wag_draws`); the decoder folds the
layer index and the kernel's index into `Numerics.key`, which the learner folds from its step. M not a
multiple of 16: the wgrad operands are padded with zero rows (they add nothing to xᵀ·dy, RHT or not).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from lrl_jax.quant.qarray import _groups, _nvfp4_prepare, _ungroup, check_spec, nvfp4_operand
from lrl_jax.quant.specs import FP4_MAX, NVFP4, NVFP4WAG

__all__ = ["nvfp4_blocks", "nvfp4_activations", "sr_e2m1", "hadamard16", "rht", "wag_draws", "nvfp4_wag_matmul"]

_BLOCK = 16


def sr_e2m1(v: jax.Array, u: jax.Array) -> jax.Array:
  """Stochastic rounding of v ∈ [−6, 6] onto the E2M1 grid {0, 0.5, 1, 1.5, 2, 3, 4, 6} (and negatives).

  With lo ≤ |v| ≤ lo + δ the neighbouring grid values (δ = 0.5 below 2, 1 below 4, 2 above):
  q = sign(v) · (lo + δ · [u < (|v| − lo)/δ]), so P(q = lo + δ) = (|v| − lo)/δ and E[q] = v for u ~ U[0, 1).
  Every step here is exact in f32 (powers of two, Sterbenz); u's 2^-24 granularity biases P by at most 2^-24.

  Args:
    v: float32 values already divided by their block scale and clipped to ±6.
    u: float32 uniforms in [0, 1), v's shape (one draw per element).
  """
  a = jnp.abs(v)
  step = jnp.where(a < 2.0, 0.5, jnp.where(a < 4.0, 1.0, 2.0))
  lo = jnp.floor(a / step) * step
  r = jnp.minimum(lo + jnp.where(u < (a - lo) / step, step, 0.0), FP4_MAX)
  return jnp.where(v < 0, -r, r)


def nvfp4_blocks(x: jax.Array, *, axis: int = -1, u: jax.Array | None = None, tile: bool = False):
  """NVFP4 of a matrix [.., R, C] in blocks of 16 along `axis`, split as x̂ = m · dec.

  m = e2m1(x / (f32(s_b) · dec)) · f32(s_b) (exact in f32 and bf16), s_b = e4m3(min(amax_16 · enc / 6, 448)),
  enc = 2688 / amax_matrix, dec = 1 / enc: the `quant.NVFP4` contract. The E2M1 rounding is round-to-nearest-even
  (`quantize` itself), or stochastic (`sr_e2m1`) with the uniforms `u`.

  Args:
    x: float array, rank >= 2 (the per-tensor scale is per matrix of the last two axes).
    axis: the block axis: -1 (1x16 along the rows' last axis) or -2 (16x1 along the rows).
    u: None (RNE) or float32 uniforms in [0, 1) of x's shape (SR).
    tile: one s_b per 16x16 tile (`NVFP4WAG` weights; both last axes multiples of 16); RNE only.

  Returns:
    (m float32 x's shape, dec float32 [leading axes]).
  """
  x = jnp.asarray(x)
  if u is None:
    return nvfp4_operand(x, NVFP4WAG() if tile else NVFP4(), axis=axis)
  if tile:
    raise ValueError("nvfp4_blocks: 16x16 tiles are the weight's, rounded to nearest even (u must be None)")
  ax = check_spec(NVFP4(), x.shape, x.dtype, axis)
  if x.ndim < 2 or jnp.shape(u) != x.shape:
    raise ValueError(f"nvfp4_blocks: x must be a matrix (rank >= 2) and u its shape; got {x.shape} and {jnp.shape(u)}")
  v, sb, dec = _nvfp4_prepare(x.astype(jnp.float32), ax)
  q = sr_e2m1(v, _groups(jnp.asarray(u, jnp.float32), ax, _BLOCK))
  return _ungroup(q * sb.astype(jnp.float32), ax), dec


def nvfp4_activations(x: jax.Array, act_scale: str = "tensor"):
  """The forward's activations x [M, K], 1x16 along K (RNE): (m [M, K] f32, dec) with x̂ = m · dec.

  act_scale "tensor": one dec over the whole matrix (the recipe; dec a scalar); "token": one per row (dec [M, 1]),
  i.e. each row quantized as a matrix of its own.
  """
  if act_scale == "token":
    m, dec = nvfp4_blocks(x[:, None, :], axis=-1)
    return m[:, 0, :], dec[:, None]
  return nvfp4_blocks(x, axis=-1)


def hadamard16() -> np.ndarray:
  """The normalised 16x16 Sylvester Hadamard matrix H (H = Hᵀ, HᵀH = I; entries ±1/4, exact in any float)."""
  h = np.ones((1, 1))
  for _ in range(4):
    h = np.block([[h, h], [h, -h]])
  return (h / 4.0).astype(np.float32)


def rht(x: jax.Array, signs: jax.Array) -> jax.Array:
  """Random Hadamard transform along axis 0 (tokens), blockwise: x_r[16b : 16b+16] = H · diag(signs) · x[16b : 16b+16].

  T = blockdiag(H·D) is orthogonal, so (T a)ᵀ(T b) = aᵀ D Hᵀ H D b = aᵀ b: the wgrad xᵀ·dy is unchanged in exact
  arithmetic. Computed in float32 (HIGHEST precision: no TF32 on GPUs).

  Args:
    x: [M, C] with M a multiple of 16.
    signs: [16] of ±1.
  """
  m = x.shape[0]
  if x.ndim != 2 or m % _BLOCK:
    raise ValueError(f"rht: expected [M, C] with M a multiple of {_BLOCK}; got {x.shape}")
  hd = jnp.asarray(hadamard16()) * jnp.asarray(signs, jnp.float32)[None, :]  # H·D: column j times signs[j]
  xb = x.astype(jnp.float32).reshape(m // _BLOCK, _BLOCK, x.shape[1])
  y = jnp.einsum("ij,bjc->bic", hd, xb, precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
  return y.reshape(x.shape)


def _pad16(m: int) -> int:
  return -(-m // _BLOCK) * _BLOCK


def wag_draws(key: jax.Array, m: int, n: int, *, rht: bool = True, sr: bool = True) -> dict:
  """The random draws of one layer's backward for dy [M, N]: what `nvfp4_wag_matmul` uses, for references.

  Returns:
    {"u_dgrad": [M, N] uniforms (dgrad's dy, 1x16 along N) or None, "u_wgrad": [M16, N] uniforms (wgrad's
    transformed dy, 16x1 along M; M16 = M rounded up to 16) or None, "signs": [16] ±1 or None}; None where
    `sr` / `rht` is off.
  """
  k_dg, k_wg, k_rht = jax.random.split(key, 3)
  return {
    "u_dgrad": jax.random.uniform(k_dg, (m, n), jnp.float32) if sr else None,
    "u_wgrad": jax.random.uniform(k_wg, (_pad16(m), n), jnp.float32) if sr else None,
    "signs": jax.random.rademacher(k_rht, (_BLOCK,), jnp.float32) if rht else None,
  }


def _gemm(a, b, dec_a, dec_b, dtype):
  """((m_a @ m_b) · dec_b) · dec_a for a [M, K], b [K, N]: block values in `dtype` (exact), f32 accumulation, the
  tensor scales after the sum. The operands are materialized in this layout behind a barrier, so XLA runs the same
  dot (the same summation order) under jit as op by op."""
  a, b = lax.optimization_barrier((a.astype(dtype), b.astype(dtype)))
  y = lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
  return (y * dec_b) * dec_a


def _forward(x2, w, act_scale):
  xm, dec_x = nvfp4_activations(x2, act_scale)
  wm, dec_w = nvfp4_blocks(w, axis=-2, tile=True)
  return _gemm(xm, wm, dec_x, dec_w, x2.dtype).astype(x2.dtype), (wm, dec_w)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _wag(x2, w, key, use_rht, use_sr, act_scale):
  return _forward(x2, w, act_scale)[0]


def _wag_fwd(x2, w, key, use_rht, use_sr, act_scale):
  y, (wm, dec_w) = _forward(x2, w, act_scale)
  return y, (x2, wm, dec_w, key, jnp.zeros((0,), w.dtype))


def _wag_bwd(use_rht, use_sr, act_scale, res, dy):
  x2, wm, dec_w, key, w_dtype = res
  m, n = dy.shape
  d = wag_draws(key, m, n, rht=use_rht, sr=use_sr)
  dt = x2.dtype  # the GEMM operands' dtype: the block values are exact in it
  # dgrad: dy 1x16 along N (SR), times the forward's Ŵ transposed (Ŵ's 16x16 tiles read the same along N).
  dym, dec_dy = nvfp4_blocks(dy, axis=-1, u=d["u_dgrad"])
  dx = _gemm(dym, wm.T, dec_dy, dec_w, dt).astype(x2.dtype)
  # wgrad: zero rows up to a multiple of 16, RHT along the tokens, 16x1 blocks along them (x RNE, dy SR).
  pad = ((0, _pad16(m) - m), (0, 0))
  xp, dyp = jnp.pad(x2.astype(jnp.float32), pad), jnp.pad(dy.astype(jnp.float32), pad)
  if use_rht:
    xp, dyp = rht(xp, d["signs"]), rht(dyp, d["signs"])
  xq, dec_xr = nvfp4_blocks(xp, axis=-2)
  dyq, dec_dyr = nvfp4_blocks(dyp, axis=-2, u=d["u_wgrad"])
  dw = _gemm(xq.T, dyq, dec_xr, dec_dyr, dt).astype(w_dtype.dtype)
  return dx, dw, None


_wag.defvjp(_wag_fwd, _wag_bwd)


def nvfp4_wag_matmul(
  x: jax.Array,
  w: jax.Array,
  key: jax.Array | None = None,
  *,
  rht: bool = True,
  sr: bool = True,
  act_scale: str = "tensor",
):
  """y = x @ W with NVFP4 weights, activations and gradients (module docstring), y in x.dtype.

  Forward: y = ((m_x @ m_W) · dec_W) · dec_x, x 1x16 along K (RNE), W 16x16 tiles (RNE), f32 accumulation.
  Backward (`jax.custom_vjp`): dx = ((m_dy @ m_Wᵀ) · dec_W) · dec_dy with dy 1x16 along N (SR);
  dW = ((m_{T x}ᵀ @ m_{T dy}) · dec) · dec with T the RHT along the tokens and 16x1 blocks along them (x RNE,
  dy SR); dx in x.dtype, dW in W.dtype.

  Args:
    x: activations [.., K] (leading axes are tokens: reshaped to [M, K]; the per-tensor scale covers all of them).
    w: weight [K, N], K and N multiples of 16.
    key: PRNG key of this layer and step for SR and RHT (`wag_draws`); None: `PRNGKey(0)` (deterministic draws:
      seed it per step in training).
    rht: random Hadamard transform of the wgrad operands.
    sr: stochastic rounding of dy (False: round to nearest even).
    act_scale: the forward's activation scale, "tensor" (the recipe) or "token" (`nvfp4_activations`). The
      backward's operands keep per-tensor scales.
  """
  x, w = jnp.asarray(x), jnp.asarray(w)
  if w.ndim != 2 or x.shape[-1] != w.shape[0]:
    raise ValueError(f"nvfp4_wag_matmul: x [.., K] @ w [K, N]; got {x.shape} and {w.shape}")
  check_spec(NVFP4WAG(), w.shape, w.dtype, -2)
  check_spec(NVFP4(), x.shape, x.dtype, -1)
  key = jax.random.PRNGKey(0) if key is None else key
  if act_scale not in ("tensor", "token"):
    raise ValueError(f"nvfp4_wag_matmul: act_scale must be 'tensor' or 'token'; got {act_scale!r}")
  y = _wag(x.reshape(-1, x.shape[-1]), w, key, bool(rht), bool(sr), act_scale)
  return y.reshape(x.shape[:-1] + (w.shape[1],))
