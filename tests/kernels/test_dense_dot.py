"""`kernels.dense_dot`: a dense layer's product whose backward contracts flattened rows.

The forward is `lax.dot_general` itself (compared bit for bit). The gradients are compared with a NumPy float64
formula within `tests/_fp_bound.rounding_bound`'s worst-case bound of the vjp program: an f32 sum of n terms within
γ_n·Σ|terms| of the exact sum, γ_n = n·u/(1 − n·u) (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd
ed., Thm 3.4: any summation order or blocking), plus the rounding of the result to the weight's dtype.
"""

import importlib

import jax
import jax.extend as jex
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from lrl_jax import kernels
from tests._fp_bound import rounding_bound


def _operands(dtype, k_axis):
  kx, kw, kg = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(kx, (3, 5, 8), jnp.float32).astype(dtype)
  shape = (8, 6) if k_axis == 0 else (6, 8)
  w = jax.random.normal(kw, shape, jnp.float32).astype(dtype)
  g = jax.random.normal(kg, (3, 5, 6), jnp.float32)
  return x, w, g


def _float64_grads(x, w, g, k_axis):
  """(dx, dw) of x · w against cotangent g in NumPy float64, dw in w's layout."""
  x64, g64 = np.asarray(x, np.float64), np.asarray(g, np.float64)
  w64 = np.asarray(w, np.float64) if k_axis == 0 else np.asarray(w, np.float64).T  # [K, N]
  dw = np.einsum("btk,btn->kn", x64, g64)
  return np.einsum("btn,kn->btk", g64, w64), dw if k_axis == 0 else dw.T


# (compute dtype, out_dtype): f32; bf16 operands with the f32 output (the LM head's); bf16 in and out (a layer's)
CASES = [("float32", "float32"), ("bfloat16", "float32"), ("bfloat16", "bfloat16")]


@pytest.mark.parametrize("dtype, out", CASES)
@pytest.mark.parametrize("k_axis", [0, 1])
def test_forward_is_the_dot_bit_for_bit(dtype, out, k_axis):
  x, w, _ = _operands(jnp.dtype(dtype), k_axis)
  want = lax.dot_general(x, w, (((2,), (k_axis,)), ((), ())), preferred_element_type=jnp.float32).astype(out)
  got = jax.jit(kernels.dense_dot, static_argnums=(2, 3))(x, w, k_axis, jnp.dtype(out))
  assert got.dtype == jnp.dtype(out)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("dtype, out", CASES)
@pytest.mark.parametrize("k_axis", [0, 1])
def test_gradients_equal_the_float64_formula(dtype, out, k_axis):
  """Including bf16 operands, whose backward dots take the cotangent in bf16 (as it comes, or rounded from the f32
  output's): the bound's program is the vjp itself, so its sites are that rounding, the two products bf16 x bf16
  summed in f32, then their rounding to bf16."""
  dt = jnp.dtype(dtype)
  x, w, g = _operands(dt, k_axis)
  g = g.astype(out)
  grads = lambda x, w, g: jax.vjp(lambda a, b: kernels.dense_dot(a, b, k_axis, out), x, w)[1](g)  # noqa: E731
  dx, dw = jax.jit(grads)(x, w, g)
  assert dx.dtype == dt and dw.dtype == dt and dx.shape == x.shape and dw.shape == w.shape
  err_dx, err_dw = rounding_bound(grads, x, w, g, model="worst").err

  for got, want, err in zip((dx, dw), _float64_grads(x, w, g, k_axis), (err_dx, err_dw), strict=True):
    np.testing.assert_array_less(np.abs(np.asarray(got, np.float64) - want), np.asarray(err, np.float64))


def _dots(jaxpr):
  for e in jaxpr.eqns:
    if e.primitive.name == "dot_general":
      yield e
    for sub in jex.core.jaxprs_in_params(e.params):
      yield from _dots(sub)


def test_weight_gradient_contracts_one_axis():
  """What the custom backward is for: no dot in it contracts two axes (x's leading ones)."""
  x, w, g = _operands(jnp.float32, 0)
  _, vjp = jax.vjp(kernels.dense_dot, x, w)
  dots = list(_dots(jax.make_jaxpr(vjp)(g).jaxpr))
  assert len(dots) >= 2, "the vjp computes both gradients with dots"
  assert all(len(e.params["dimension_numbers"][0][0]) == 1 for e in dots)


@pytest.mark.parametrize("out", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("k_axis", [0, 1])
def test_narrow_operands_backward_dots_in_their_dtype(out, k_axis):
  """bf16 operands make both backward dots bf16 x bf16 only (f32 accumulation), whatever the output's dtype: an f32
  cotangent (the LM head's) is rounded to bf16 first, never mixed with a bf16 operand (which XLA runs as an f32 dot
  on converted copies). The CPU's are row-major [M, K] · [K, N] on copied transposes (the form XLA:CPU gives its
  bf16 kernels)."""
  x, w, g = _operands(jnp.bfloat16, k_axis)
  nn = (((1,), (0,)), ((), ()))
  _, vjp = jax.vjp(lambda a, b: kernels.dense_dot(a, b, k_axis, out), x, w)
  dots = list(_dots(jax.make_jaxpr(vjp)(g.astype(out)).jaxpr))
  for e in dots:
    assert e.params["preferred_element_type"] == jnp.float32
    assert len(e.params["dimension_numbers"][0][0]) == 1  # one contracted axis each
  dtypes = [{v.aval.dtype for v in e.invars} for e in dots]
  # two per branch of lax.platform_dependent: the CPU's, then the others'
  assert len(dots) == 4 and all(d == {jnp.dtype(jnp.bfloat16)} for d in dtypes), dtypes
  assert sum(e.params["dimension_numbers"] == nn for e in dots) >= 2


def test_cpu_backward_contracts_no_leading_axis():
  """What runs on a CPU: the compiled vjp (bf16 in and out) contracts no operand along its leading axis (the
  row-major form: copied transposes instead)."""
  x, w, g = _operands(jnp.bfloat16, 0)
  vjp = lambda x, w, g: jax.vjp(lambda a, b: kernels.dense_dot(a, b, 0, jnp.bfloat16), x, w)[1](g)  # noqa: E731
  hlo = jax.jit(vjp).lower(x, w, g.astype(jnp.bfloat16)).compile().as_text()
  assert "lhs_contracting_dims={0}" not in hlo and "rhs_contracting_dims={1}" not in hlo


@pytest.mark.parametrize("branch", ["_grads_row_major", "_grads"])
@pytest.mark.parametrize("k_axis", [0, 1])
def test_both_platform_branches_equal_the_float64_formula(branch, k_axis):
  """Each branch of the bf16 backward (the CPU's row-major one, the other platforms' as jax writes it), both run here,
  in f32 before the cast: every output is an f32 sum of n exact products (bf16 x bf16 fits f32), within
  γ_n·Σ|terms| of the exact sum, γ_n = n·u/(1 − n·u), u = 2⁻²⁴ (Higham Thm 3.4, any order)."""
  predecode = importlib.import_module("lrl_jax.kernels.predecode")
  x, w, g = _operands(jnp.bfloat16, k_axis)
  g = g.astype(jnp.bfloat16)
  x2, g2 = x.reshape(-1, 8), g.reshape(-1, 6)
  dx, dw = jax.jit(getattr(predecode, branch), static_argnums=3)(x2, w, g2, k_axis)
  want_dx, want_dw = _float64_grads(x, w, g, k_axis)
  abs_dx, abs_dw = _float64_grads(
    np.abs(np.asarray(x, np.float64)), np.abs(np.asarray(w, np.float64)), np.abs(np.asarray(g, np.float64)), k_axis
  )
  gamma = lambda n: n * 2.0**-24 / (1 - n * 2.0**-24)  # noqa: E731
  assert dx.dtype == dw.dtype == jnp.float32 and dw.shape == w.shape
  np.testing.assert_array_less(
    np.abs(np.asarray(dx, np.float64) - want_dx.reshape(15, 8)), gamma(6) * abs_dx.reshape(15, 8) + 1e-300
  )
  np.testing.assert_array_less(np.abs(np.asarray(dw, np.float64) - want_dw), gamma(15) * abs_dw + 1e-300)


def _scaled(k_axis, out=jnp.float32):
  """predecoded_dot on a Predecoded with NVFP4's per-matrix scale dec: dense_dot(x, w) · dec (in `out`)."""
  p = lambda w, dec: kernels.Predecoded(w=w, dec=dec, axis=-2 if k_axis == 0 else -1)  # noqa: E731
  return lambda x, w, dec: kernels.predecoded_dot(x, p(w, dec), out)


@pytest.mark.parametrize("dtype, out", CASES)
@pytest.mark.parametrize("k_axis", [0, 1])
def test_scaled_dot_gradients_equal_the_float64_formula(dtype, out, k_axis):
  """With dec, the backward scales the products' outputs: dx = (g · wᵀ) · dec, dw = (xᵀ · g) · dec, within the
  vjp program's worst-case rounding bound (as above: the f32 sums, dec's product, the cast to the dtype); dec
  gets no gradient (the scales are not trained). The forward is dense_dot · dec bit for bit (cast to `out`)."""
  dt = jnp.dtype(dtype)
  x, w, g = _operands(dt, k_axis)
  g = g.astype(out)
  dec = jnp.float32(0.3125 / 3)  # not a power of two: its products round
  y = jax.jit(_scaled(k_axis, out))(x, w, dec)
  assert y.dtype == jnp.dtype(out)
  np.testing.assert_array_equal(
    np.asarray(y), np.asarray((jax.jit(kernels.dense_dot, static_argnums=2)(x, w, k_axis) * dec).astype(out))
  )
  grads = lambda x, w, dec, g: jax.vjp(_scaled(k_axis, out), x, w, dec)[1](g)[:2]  # noqa: E731
  dx, dw = jax.jit(grads)(x, w, dec, g)
  assert dx.dtype == dt and dw.dtype == dt and dx.shape == x.shape and dw.shape == w.shape
  ddec = jax.jit(lambda x, w, dec, g: jax.vjp(_scaled(k_axis, out), x, w, dec)[1](g)[2])(x, w, dec, g)
  assert float(ddec) == 0.0
  err_dx, err_dw = rounding_bound(grads, x, w, dec, g, model="worst").err

  wants = (want * float(dec) for want in _float64_grads(x, w, g, k_axis))
  for got, want, err in zip((dx, dw), wants, (err_dx, err_dw), strict=True):
    np.testing.assert_array_less(np.abs(np.asarray(got, np.float64) - want), np.asarray(err, np.float64))


def test_scaled_dot_backward_scales_outputs_not_the_cotangent():
  """What the scaled backward is for: both dots take the cotangent g as it comes (no multiply makes a dot's
  operand), so the scale is work on the dots' outputs (fused into them on XLA:TPU), and each contracts one axis."""
  x, w, g = _operands(jnp.float32, 0)
  _, vjp = jax.vjp(_scaled(0), x, w, jnp.float32(0.5))
  jaxpr = jax.make_jaxpr(vjp)(g).jaxpr

  def eqns(jaxpr):
    for e in jaxpr.eqns:
      yield e
      for sub in jex.core.jaxprs_in_params(e.params):
        yield from eqns(sub)

  made_by_mul = {v for e in eqns(jaxpr) if e.primitive.name == "mul" for v in e.outvars}
  dots = [e for e in eqns(jaxpr) if e.primitive.name == "dot_general"]
  assert len(dots) == 2
  assert not any(v in made_by_mul for e in dots for v in e.invars)
  assert all(len(e.params["dimension_numbers"][0][0]) == 1 for e in dots)
