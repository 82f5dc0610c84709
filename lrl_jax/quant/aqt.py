"""QAT dot_generals: the learner's matmul on fake-quantized weights, built on Google AQT.

`dot_general_for(spec)` returns a `lax.dot_general`-compatible function that computes

    y = x · ŵ,   ŵ = dequantize(quantize(w, spec, axis=<rhs contraction axis>), w.dtype)

bit for bit (the contract), with a straight-through gradient to w and the exact
gradient g · ŵᵀ to x. Flax layers take it as their `dot_general`.

INT4 and FP8 weights are quantized by AQT (`aqt.jax.v2`): its `Quantizer` runs the
calibration, the numerics (clip, round, cast) and `QTensor.dequant`. AQT's defaults
differ from the contract, so it is configured as follows, each change through one of
AQT's own extension points:

* numerics: `IntSymmetric(bits=4, preserve_zero=True, preserve_max_val=True)` maps amax
  to the centre of the last bucket, i.e. s = amax/7 with codes clipped to ±7 (AQT's
  default, `preserve_max_val=False`, uses 7.5 and reaches -8). FP8 uses `_E4m3Numerics`, AQT's
  `Fp8Numerics(e4m3)` (which clips to ±448 before the cast, as the contract does) with its round
  to nearest even done as arithmetic in float32 (`qarray._round_e4m3`) instead of a cast to
  float8_e4m3fn and back: the same values bit for bit, but XLA:CPU's f8 convert is a software
  routine that cost the FP8 QAT operand half its time.
* calibration: `_ContractCalibration` (a `Calibration` subclass) computes the group /
  channel / block scales exactly as `quant.quantize` does: the 1e-5 floor (AQT's
  AbsMax maps an all-zero group to amax 1 instead), rounding to the scale dtype
  (bf16) before use, and NaN for a non-finite group. Groups run along the rhs
  contraction axis (AQT has no sub-channel calibration in the forward pass; the scale
  is returned broadcast to the weight's shape, which fake-quant mode accepts).
* quantizer: AQT quantizes as `x * reciprocal(s)` (`QTensor.quant`), while slime and
  compressed-tensors divide, and the two differ at exact rounding ties.
  `_DividingQuantizer` overrides `Quantizer.calculate_qvalue` to divide.

The dot itself is a plain `lax.dot_general` on ŵ (AQT's `DequantMode.THIS_INPUT`,
fake quant): the AQT `DotGeneral` custom gradient would give x the gradient g · wᵀ of
the *unquantized* weight, whereas the learner should differentiate what it computed.

NVFP4 (two-level scale: the per-block E4M3 scale and the per-matrix FP32 scale are
applied as two separate multiplications, which AQT's single-scale QTensor cannot
reproduce bit for bit) and MXFP8 use this package's own quantizer. NVFP4's dot is the
served form of `quant.qdot`, dec · (x @ e2m1·s_b), with a straight-through gradient.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
from aqt.jax.v2 import aqt_quantizer
from aqt.jax.v2 import calibration as aqt_calibration
from aqt.jax.v2 import utils as aqt_utils
from aqt.jax.v2.numerics import fp8_numerics, int_numerics
from jax import lax

from lrl_jax.quant.dot import qdot
from lrl_jax.quant.qarray import (
  _F32_TINY,
  _INT4_SCALE_FLOOR,
  _absmax,
  _div,
  _fenced_groups,
  _groups,
  _round_e4m3,
  _ungroup,
  check_spec,
  fake_quant,
  quantize,
)
from lrl_jax.quant.specs import FP8, FP8_MAX, INT4_MAX, NVFP4, NVFP4WAG, Int4, Spec
from lrl_jax.quant.wag import nvfp4_wag_matmul

__all__ = ["dot_general_for", "aqt_fake_quant"]

DotGeneral = Callable[..., jax.Array]


@aqt_utils.flax_slots_kw_only_dataclass
class _ContractCalibration(aqt_calibration.Calibration):
  """Scales of `lrl_jax.quant` for Int4 groups and FP8 channels/blocks, broadcast to x's shape."""

  spec: Int4 | FP8 = aqt_utils.static_field()

  def get_scale_and_bias_and_sparsity(self, x, shared_axes, numerics_, context=None):
    del numerics_, context
    (axis,) = shared_axes
    x = x.astype(jnp.float32)
    spec = self.spec
    if isinstance(spec, Int4):
      axis -= x.ndim  # negative: the element axis keeps its index in the grouped layout
      xg = _groups(x, axis, spec.group_size)
      amax = _absmax(xg, axis)
      sdt = jnp.dtype(spec.scale_dtype)
      s = jnp.minimum(jnp.maximum(_div(amax, INT4_MAX), _INT4_SCALE_FLOOR), float(jnp.finfo(sdt).max))
      s = jnp.where(jnp.isfinite(amax), s, jnp.nan)
      # Round to the storage dtype before use; the barrier stops XLA from keeping excess precision.
      s = lax.optimization_barrier(s.astype(sdt)).astype(jnp.float32)
      s = jnp.broadcast_to(s, xg.shape).reshape(x.shape)
    elif spec.granularity == "block":
      b = spec.block
      *lead, k, n = x.shape
      xb = x.reshape(*lead, k // b, b, n // b, b)
      amax = _absmax(xb, (-3, -1))
      s = jnp.where(jnp.isfinite(amax), jnp.maximum(_div(amax, FP8_MAX), _F32_TINY), jnp.nan)
      s = jnp.broadcast_to(s, xb.shape).reshape(x.shape)
    else:
      amax = _absmax(x, axis)
      s = jnp.where(jnp.isfinite(amax), jnp.maximum(_div(amax, FP8_MAX), _F32_TINY), jnp.nan)
      s = jnp.broadcast_to(s, x.shape)
    return [s], [], None


@aqt_utils.flax_slots_kw_only_dataclass
class _DividingQuantizer(aqt_quantizer.Quantizer):
  """AQT Quantizer that computes x / s (as slime and compressed-tensors do), not x · (1/s)."""

  def calculate_qvalue(self, x, qt):
    (s,) = qt.scale
    qt = qt.replace(qvalue=_div(x.astype(jnp.float32), s))
    x_q, res = self.numerics.vjp_fwd(qt.qvalue, self.context)
    return qt.replace(qvalue=x_q), jax.tree_util.Partial(self.numerics.vjp_bwd, res)


@aqt_utils.flax_slots_kw_only_dataclass
class _E4m3Numerics(fp8_numerics.Fp8Numerics):
  """AQT's e4m3 numerics, its forward as arithmetic: clip to ±448, then `qarray._round_e4m3`, the value of AQT's
  `round_to_nearest_even` (a cast to float8_e4m3fn and back) bit for bit, left in float32. `QTensor.dequant` casts
  the qvalue to the weight's dtype before the scale: exact from e4m3 values, as from float8_e4m3fn. The vjp
  (straight-through, no clip gradient) is `Fp8Numerics`'s."""

  def vjp_fwd(self, x, context):
    del context
    if x.dtype != jnp.float32:
      raise TypeError(f"_E4m3Numerics rounds float32 quotients; got {x.dtype}")
    bound = self._get_edge_of_last_fp8_bucket()
    return _round_e4m3(jnp.clip(x, -bound, bound)), (x,)


def _numerics(spec: Int4 | FP8):
  if isinstance(spec, Int4):
    return int_numerics.IntSymmetric(
      bits=4,
      preserve_zero=True,
      preserve_max_val=True,
      clip=True,
      round=True,
      noise_fn=None,
      clip_gradient=False,
      dtype=jnp.int8,
    )
  return _E4m3Numerics(dtype=jnp.float8_e4m3fn, exponent_bits=4, mantissa_bits=3)


@functools.lru_cache(maxsize=None)
def _quantizer(spec: Int4 | FP8) -> aqt_quantizer.Quantizer:
  q = _DividingQuantizer(
    numerics=_numerics(spec),
    calib_shared_axes=None,
    scale_stop_grad=True,
    calibration=functools.partial(_ContractCalibration, spec=spec),
    context=aqt_utils.Context(key=None, train_step=None),
  )
  q.init_calibration()
  return q


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _aqt_fake_quant(w, spec, axis):
  if isinstance(spec, Int4):  # AQT quantizes the groups [.., K/g, g, ..], one group per calibration (`_fenced_groups`)
    wg = _fenced_groups(w, axis - w.ndim, spec.group_size)
    qt, _ = _quantizer(spec).quant(wg, calibration_axes=[axis + 1])
    return _ungroup(qt.dequant(), axis - w.ndim)
  qt, _ = _quantizer(spec).quant(w, calibration_axes=[axis])
  return qt.dequant()


def _aqt_fake_quant_fwd(w, spec, axis):
  return _aqt_fake_quant(w, spec, axis), None


def _aqt_fake_quant_bwd(spec, axis, _, g):
  return (g,)  # straight-through: the numerics' own vjp is the identity (clip_gradient=False)


_aqt_fake_quant.defvjp(_aqt_fake_quant_fwd, _aqt_fake_quant_bwd)


def aqt_fake_quant(w: jax.Array, spec: Int4 | FP8, *, axis: int = -2) -> jax.Array:
  """ŵ computed by AQT's Quantizer; equals `quant.fake_quant(w, spec, axis=axis)` bit for bit."""
  if not (isinstance(spec, FP8) or (isinstance(spec, Int4) and spec.scheme == "absmax")):
    raise ValueError(f"aqt_fake_quant supports symmetric absmax Int4 and FP8 specs; got {spec} (use quant.fake_quant)")
  ax = check_spec(spec, w.shape, w.dtype, axis) % w.ndim
  return _aqt_fake_quant(w, spec, ax)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5))
def _nvfp4_dot(lhs, rhs, dimension_numbers, spec, precision, preferred_element_type):
  """lhs ⋅ fake_quant(rhs, NVFP4) in the served form: `qdot` on quantize(rhs), the sampler's dot bit for bit."""
  (_, rhs_ca), _ = dimension_numbers
  q = lax.optimization_barrier(quantize(rhs, spec, axis=int(rhs_ca[0])))
  y = qdot(lhs, q, dimension_numbers, precision=precision, materialize=True)
  return y.astype(preferred_element_type or jnp.result_type(lhs, rhs))


def _nvfp4_dot_fwd(lhs, rhs, dimension_numbers, spec, precision, preferred_element_type):
  return _nvfp4_dot(lhs, rhs, dimension_numbers, spec, precision, preferred_element_type), (lhs, rhs)


def _nvfp4_dot_bwd(dimension_numbers, spec, precision, preferred_element_type, res, g):
  # Straight-through, as for every other format: the gradient of lax.dot_general(lhs, ŵ) at ŵ = fake_quant(rhs),
  # passed to rhs unchanged.
  lhs, rhs = res
  (_, rhs_ca), _ = dimension_numbers
  w_hat = fake_quant(rhs, spec, axis=int(rhs_ca[0]))
  _, vjp = jax.vjp(
    lambda a, b: lax.dot_general(
      a, b, dimension_numbers, precision=precision, preferred_element_type=preferred_element_type
    ),
    lhs,
    w_hat,
  )
  return vjp(g)


_nvfp4_dot.defvjp(_nvfp4_dot_fwd, _nvfp4_dot_bwd)


def dot_general_for(spec: Spec | None, *, act_spec: FP8 | None = None, key: jax.Array | None = None) -> DotGeneral:
  """A `lax.dot_general` replacement that fake-quantizes its rhs (the weight) to `spec`.

  Args:
    spec: weight format, or None for a plain dot_general. Groups run along the rhs
      contraction axis (which must be a single axis). AQT computes absmax Int4 and FP8;
      minmax Int4 and MXFP8 go through `fake_quant` (AQT has no asymmetric INT4 with this
      contract's zero-point rule, nor these block formats); NVFP4 computes `quant.qdot`'s served
      form, dec · (lhs @ e2m1·s_b), with a straight-through gradient. Learned Int4 is not
      accepted here (its scales are parameters: `learned_fake_quant`).
    act_spec: optional FP8(granularity="token") for the lhs (W8A8): the activations are
      fake-quantized per token along the lhs contraction axis.
    key: `NVFP4WAG` only: the PRNG key of its backward's stochastic rounding and RHT. `NVFP4WAG` is not a fake
      quant: the dot is `quant.nvfp4_wag_matmul` (NVFP4 activations and gradients too, no straight-through); it
      takes lhs [.., K] contracting its last axis with a 2-D rhs [K, N], and no act_spec.

  Returns:
    dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None).
    The rhs is quantized in its own dtype; quantize the same array for serving (if the
    learner casts f32 master weights to bf16 first, the sampler quantizes the bf16 cast).
  """
  if act_spec is not None and not (isinstance(act_spec, FP8) and act_spec.granularity == "token"):
    raise ValueError(f"act_spec must be FP8(granularity='token'); got {act_spec}")
  if isinstance(spec, Int4) and spec.learned:
    raise ValueError(
      f"{spec}: learned scales live in the parameter tree; fake-quantize the weight with "
      "quant.learned_fake_quant(w, scale, zero_point, spec) and use a plain dot"
    )

  def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
    (lhs_ca, rhs_ca), (lhs_b, _) = dimension_numbers
    if isinstance(spec, NVFP4WAG):
      if act_spec is not None or tuple(lhs_ca) != (lhs.ndim - 1,) or tuple(rhs_ca) != (0,) or rhs.ndim != 2 or lhs_b:
        raise ValueError(
          f"{spec}: lhs [.., K] @ rhs [K, N] without act_spec; got {lhs.shape} @ {rhs.shape}, {dimension_numbers}"
        )
      y = nvfp4_wag_matmul(lhs, rhs, key, rht=spec.rht, sr=spec.sr, act_scale=spec.act_scale)
      return y.astype(preferred_element_type or jnp.result_type(lhs, rhs))
    if spec is not None:
      if len(rhs_ca) != 1:
        raise ValueError(
          f"{spec}: the weight must contract over one axis; got rhs shape {rhs.shape}, contracting axes {tuple(rhs_ca)}"
        )
      axis = int(rhs_ca[0])
      if isinstance(spec, NVFP4):
        check_spec(spec, rhs.shape, rhs.dtype, axis)
        if act_spec is not None:
          lhs = lax.optimization_barrier(aqt_fake_quant(lhs, act_spec, axis=int(lhs_ca[0])))
        return _nvfp4_dot(lhs, rhs, dimension_numbers, spec, precision, preferred_element_type)
      if isinstance(spec, FP8) or (isinstance(spec, Int4) and spec.scheme == "absmax"):
        rhs = aqt_fake_quant(rhs, spec, axis=axis)
      else:
        rhs = fake_quant(rhs, spec, axis=axis)
      # XLA may fuse the dequantization into the dot and change its accumulation order; the
      # barrier keeps y == lax.dot_general(x, ŵ) bit for bit, the same dot the sampler's
      # float path computes on dequantized weights.
      rhs = lax.optimization_barrier(rhs)
    if act_spec is not None:
      if len(lhs_ca) != 1:
        raise ValueError(f"{act_spec}: activations must contract over one axis; got lhs shape {lhs.shape}")
      lhs = lax.optimization_barrier(aqt_fake_quant(lhs, act_spec, axis=int(lhs_ca[0])))
    return lax.dot_general(
      lhs, rhs, dimension_numbers, precision=precision, preferred_element_type=preferred_element_type
    )

  return dot_general
