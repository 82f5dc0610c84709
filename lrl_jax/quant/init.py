"""INT4-aware initialisation, and the "jolt" of switching QAT on: KL(π_float ‖ π_QAT).

Turning fake quantization on moves every selected weight to its grid point, which changes the
policy at once; the INT4 RL write-up warns that this jolt destabilises early RL. Two tools:

* `int4_aware_init(params, rules)` moves each selected kernel onto its own quantization grid, to a
  *fixed point* of fake quant: `fake_quant(w′) == w′` bit for bit, so switching QAT on at that step
  changes nothing (KL = 0 exactly). bf16 has 8 significant bits: bf16 rounding is relative ≤ 2⁻⁸.
    - absmax INT4 (s = bf16(amax/7)): w′ = fake_quant(w), one pass. The group amax maps to code ±7
      (amax/s ∈ 7·(1 ± 2⁻⁸)), so amax(w′) = 7·s exactly; 7·s is exact in f32 (8 + 3 significant bits)
      and 7·s / 7 = s, so re-quantizing w′ gives the same s and codes. |w′ − w| ≤ s/2.
    - learned scale / zero point (given s, z, never recomputed): one pass. w′ = (q − z)·s with
      |q − z| ≤ 15 is exact in f32, so round(w′/s) + z = q again. |w′ − w| ≤ s/2 inside the code
      range; a clipped element (minmax-initialised z) moves ≤ (1/2 + 15·2⁻⁸)·s.
    - minmax INT4 (s = bf16((max − min)/15), 0 in the range): plain fake quant is *not* idempotent:
      with bf16(s) rounded up the group's codes can span 14 steps, the next pass picks a smaller s,
      and iterating drifts weights by several steps. Instead one pass moves the group's largest
      element to the top code (`_minmax_snap`): the codes span all 15 steps, the recomputed range is
      15·s (exact), so s, z and the codes come back exactly. |w′ − w| ≤ (1/2 + 15·2⁻⁸)·s.
  With `dtype=bfloat16` (a learner that casts its f32 masters to bf16 before the matmul, whose cast is
  what is fake-quantized) the fixed point is sought for the bf16 cast, by iterating fake quant (≤
  `max_iters` passes, checked); the f32 masters hold it exactly. The two bf16 casts add ≤ 2·15·2⁻⁸·s and
  the scale of the cast may be one bf16 ulp larger: |w′ − w| ≤ (1/2 + 2⁻²)·s. Any other format the rules
  select (FP8, MXFP8, NVFP4) gets the same fixed-point iteration (no bound is claimed for them).
* `policy_jolt(forward_fn, params, rules)` measures KL(π_float ‖ π_QAT) of the next-token distribution,
  token-mean over a mask, with the bound below; `next_token_kl` is the same on two sets of logits.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from lrl_jax.quant.optim import _flat, _is_sibling
from lrl_jax.quant.qarray import dequantize, fake_quant, quantize
from lrl_jax.quant.rules import SCALE_SUFFIX, ZERO_SUFFIX, QuantRules, path_str
from lrl_jax.quant.specs import INT4_SCALE_FLOOR, Int4

__all__ = ["int4_aware_init", "grid_residual", "next_token_kl", "policy_jolt"]


def _fake(x, spec, axis, scale, zero):
  """One fake-quant pass of x (in x.dtype): with the learned scale / zero point when given."""
  if scale is None:
    return fake_quant(x, spec, axis=axis)
  return dequantize(quantize(x, spec, axis=axis, scale=scale, zero_point=zero), x.dtype)


# One compiled program per (shape, dtype, spec): eager op-by-op dispatch compiles every primitive.
_fake = jax.jit(_fake, static_argnums=(1, 2))


def _minmax_snap(x, spec: Int4, axis):
  """One minmax pass that lands on a fixed point: the group's codes are made to span the full range.

  ŵ = (q − z)·s is a fixed point of minmax fake quant iff the recomputed range max(ŵ, 0) − min(ŵ, 0)
  is 15·s again (then s, z and the codes come back exactly: 15·s is exact in f32). The smallest element
  always maps to q = −8 (or z = −8 with the group ≥ 0); the largest can land on 6 when bf16(s) rounded up,
  so that element alone is moved up to q = 7 (a move of at most 0.5 + 15·2⁻⁹ steps).
  """
  q = quantize(x, spec, axis=axis)
  w_hat = dequantize(q, jnp.float32)
  ax = axis % x.ndim
  G = spec.group_size
  wg = w_hat.reshape(w_hat.shape[:ax] + (w_hat.shape[ax] // G, G) + w_hat.shape[ax + 1 :])
  s = jnp.expand_dims(q.scale.astype(jnp.float32), ax + 1)
  z = jnp.expand_dims(q.zero_point.astype(jnp.float32), ax + 1)
  top = (spec.qmax - z) * s  # the value of the largest code
  hi = jnp.max(wg, axis=ax + 1, keepdims=True)
  # A group at the 1e-5 scale floor is a fixed point already (the floor comes back whatever its range).
  floor = jnp.asarray(INT4_SCALE_FLOOR, jnp.float32).astype(jnp.dtype(spec.scale_dtype)).astype(jnp.float32)
  need = (hi < top) & (s > floor) & jnp.isfinite(hi)
  xg = x.astype(jnp.float32).reshape(wg.shape)
  first = jax.nn.one_hot(jnp.argmax(xg, axis=ax + 1), G, axis=ax + 1, dtype=bool)  # the largest input element
  wg = jnp.where(need & first, top, wg)
  return wg.reshape(w_hat.shape).astype(x.dtype)


_minmax_snap_jit = jax.jit(_minmax_snap, static_argnums=(1, 2))


def _leaf_fixed_point(w, spec, axis, scale, zero, dtype, max_iters, path):
  x = jnp.asarray(w).astype(dtype or jnp.asarray(w).dtype)
  if isinstance(spec, Int4) and spec.asymmetric and scale is None:  # computed minmax s, z (or their learned init)
    x = _minmax_snap_jit(x, spec, axis)
  for i in range(max_iters):
    y = _fake(x, spec, axis, scale, zero)
    if bool(jnp.array_equal(y, x, equal_nan=True)):
      return x.astype(jnp.asarray(w).dtype), i
    x = y
  if bool(jnp.array_equal(_fake(x, spec, axis, scale, zero), x, equal_nan=True)):
    return x.astype(jnp.asarray(w).dtype), max_iters
  raise ValueError(
    f"int4_aware_init: {path!r} ({spec}) reached no fixed point of fake quant in {max_iters} "
    f"passes (shape {tuple(x.shape)}, dtype {x.dtype}); raise max_iters"
  )


def int4_aware_init(params, rules: QuantRules, *, dtype=None, max_iters: int = 8, info: dict | None = None):
  """Params whose selected kernels are fixed points of their fake quant (see the module docstring).

  Args:
    params: a parameter tree (float kernels; learned `P/kernel_scale` / `P/kernel_zero` siblings, when
      present, are used as the grid and left unchanged).
    rules: the learner's `QuantRules`.
    dtype: the dtype the matmul sees (`LearnerConfig.compute_dtype`); None: each kernel's own dtype.
      The returned kernels keep their dtype (f32 masters hold the bf16 fixed point exactly).
    max_iters: largest number of fake-quant passes per kernel.
    info: if a dict, receives path -> number of passes that moved the kernel (0: already on its grid).

  Returns:
    The tree with each selected kernel w replaced by w′, `fake_quant(w′.astype(dtype)) == w′.astype(dtype)`
    bit for bit; other leaves unchanged.

  Raises:
    ValueError naming the path when no fixed point is reached within `max_iters` passes.
  """
  flat = _flat(params)

  def visit(kp, w):
    path = path_str(kp)
    spec = rules.spec_for(path)
    if spec is None or _is_sibling(path, flat, rules):
      return w
    scale = flat.get(path + SCALE_SUFFIX) if isinstance(spec, Int4) else None
    zero = flat.get(path + ZERO_SUFFIX) if scale is not None else None
    out, n = _leaf_fixed_point(w, spec, rules.axis, scale, zero, dtype, max_iters, path)
    if info is not None:
      info[path] = n
    return out

  return jax.tree_util.tree_map_with_path(visit, params)


def grid_residual(params, rules: QuantRules, *, dtype=None) -> dict[str, float]:
  """path -> max |fake_quant(w) − w| over each selected kernel (0 for a kernel on its grid).

  dtype: as in `int4_aware_init` (the cast the matmul sees).
  """
  flat = _flat(params)
  out = {}
  for path, w in flat.items():
    spec = rules.spec_for(path)
    if spec is None or _is_sibling(path, flat, rules):
      continue
    scale = flat.get(path + SCALE_SUFFIX) if isinstance(spec, Int4) else None
    zero = flat.get(path + ZERO_SUFFIX) if scale is not None else None
    x = jnp.asarray(w).astype(dtype or jnp.asarray(w).dtype)
    d = _fake(x, spec, rules.axis, scale, zero).astype(jnp.float32) - x.astype(jnp.float32)
    out[path] = float(jnp.max(jnp.abs(d)))
  return out


def next_token_kl(logits_p_BTV: jax.Array, logits_q_BTV: jax.Array, mask_BT: jax.Array | None = None):
  """Token-mean KL(p ‖ q) of two next-token distributions, with its Hoeffding bound.

  Per token, with δ = logits_q − logits_p over the vocabulary:
    KL(p‖q) = log E_p[e^δ] − E_p[δ] ≤ (max_v δ − min_v δ)² / 8     (Hoeffding's lemma),
  and KL ≤ max_v δ − min_v δ. So identical logits give KL = 0 exactly, and a forward whose logits move
  by at most ε each has KL ≤ ε²/2 per token.

  Args:
    logits_p_BTV, logits_q_BTV: [B, T, V] logits (any float dtype; computed in float32).
    mask_BT: bool [B, T], the tokens to average over (None: all).

  Returns:
    (kl, metrics): kl = Σ_t mask·KL_t / max(Σ mask, 1), float32 scalar; metrics: "kl_max" (largest
    per-token KL), "bound" (token-mean of range(δ)²/8, ≥ kl), "logit_diff_max" (max |δ|), "count".
  """
  if logits_p_BTV.shape != logits_q_BTV.shape or logits_p_BTV.ndim != 3:
    raise ValueError(
      f"next_token_kl: logits must be two [B, T, V] arrays of one shape; got "
      f"{tuple(logits_p_BTV.shape)} and {tuple(logits_q_BTV.shape)}"
    )
  B, T, _ = logits_p_BTV.shape
  if mask_BT is None:
    mask_BT = jnp.ones((B, T), bool)
  if tuple(mask_BT.shape) != (B, T):
    raise ValueError(f"next_token_kl: mask must be [B, T] = {(B, T)}; got {tuple(mask_BT.shape)}")
  lp = jax.nn.log_softmax(logits_p_BTV.astype(jnp.float32), axis=-1)
  lq = jax.nn.log_softmax(logits_q_BTV.astype(jnp.float32), axis=-1)
  kl_BT = jnp.sum(jnp.exp(lp) * (lp - lq), axis=-1)
  kl_BT = jnp.maximum(kl_BT, 0.0)  # KL >= 0; f32 rounding can leave −1e-9 for near-equal logits
  d = logits_q_BTV.astype(jnp.float32) - logits_p_BTV.astype(jnp.float32)
  rng_BT = jnp.max(d, axis=-1) - jnp.min(d, axis=-1)
  m = mask_BT.astype(jnp.float32)
  n = jnp.sum(m)
  den = jnp.maximum(n, 1.0)
  kl = jnp.sum(kl_BT * m) / den
  metrics = {
    "kl_max": jnp.max(jnp.where(mask_BT, kl_BT, 0.0)),
    "bound": jnp.sum(rng_BT**2 / 8 * m) / den,
    "logit_diff_max": jnp.max(jnp.where(mask_BT[..., None], jnp.abs(d), 0.0)),
    "count": n,
  }
  return kl, metrics


def policy_jolt(
  forward_fn: Callable[[Any, QuantRules | None], jax.Array],
  params,
  rules: QuantRules,
  *,
  mask_BT: jax.Array | None = None,
):
  """The jolt of switching QAT on: token-mean KL(π_float ‖ π_QAT) of the next-token distribution.

  Args:
    forward_fn: (params, qat_rules or None) -> logits [B, T, V] on a fixed batch, e.g.
      `lambda p, r: models.forward(p, tokens_BT, cfg, valid_BT=valid_BT, numerics=models.Numerics(qat_rules=r))[0]`;
      with `r=None` the float forward, with `rules` the learner's QAT forward.
    params: the parameters at the step QAT turns on.
    rules: the learner's `QuantRules`.
    mask_BT: bool [B, T], the positions to average over (e.g. the valid tokens).

  Returns:
    `next_token_kl(float logits, QAT logits, mask_BT)`: (kl, metrics). Bound (Hoeffding):
    KL_t ≤ (max_v δ_t − min_v δ_t)²/8 with δ the QAT − float logits (metrics["bound"]); after
    `int4_aware_init` the QAT forward equals the float forward and the jolt is 0.
  """
  return next_token_kl(forward_fn(params, None), forward_fn(params, rules), mask_BT)
