"""First-order rounding-error bounds of a JAX program, for the tolerances of tests that compare two float runs.

`rounding_bound(fn, *args)` bounds |y - y*| for every float output y of fn(*args), y* the value in exact real
arithmetic on the same inputs (taken as exact). Every equation of fn's jaxpr that rounds is a site: its
result is v(1 + θ) (a sum: Σ of its terms, each partial sum so), |θ| <= δ/|v| below. To first order in the
unit roundoff u (2^-24 in f32, 2^-8 in bf16) the output moves by Σ_i g_i·θ_i·v_i, g_i = ∂y/∂v_i over every
element i of every site (the adjoint form of running error analysis: Linnainmaa 1976; Higham, "Accuracy
and Stability of Numerical Algorithms", 2nd ed. 2002, ch. 3). Reverse-mode AD computes it: each site is
wrapped in a custom_vjp whose backward adds its share to one shared scalar.

Two bounds:
  "worst":          Σ_i |g_i|·δ_i, with δ = γ_n·Σ|terms| for a length-n sum (γ_n = n·u/(1 - n·u): any order,
                    any blocking; Higham Thm 3.4-3.5). Deterministic, and very pessimistic: it lets
                    ~10^5 roundings all push the same way.
  "probabilistic":  λ·sqrt(Σ_i (g_i·δ_i)²), with δ = √n·u·Σ|terms| for a length-n sum (its n roundings
                    one by one). In the model of Higham & Mary ("A new approach to probabilistic rounding
                    error analysis", SIAM J. Sci. Comput. 41, 2019), rounding errors are mean-independent
                    random variables, so the first-order error is a martingale with bounded increments
                    and, by Azuma-Hoeffding, exceeds this with probability <= 2·exp(-λ²/2) (λ = 6: 3e-8).

Local bounds δ of one site (each plus the smallest normal, for flush-to-zero of subnormals):
  add, sub, mul, sqrt, square          correctly rounded: u·|v|
  div                                  2u·|v| (XLA may compute x·(1/y))
  integer_pow x^n                      |n|·u·|v|
  exp, log, logistic, rsqrt, sin, ...  TRANSCENDENTAL_ULPS·u·|v|: an assumption about XLA's polynomial
                                       approximations, taken generously at 8 ulps
  dot_general over K; reduce_sum,      as a length-K (n) sum of |x|·|w| (|x|): a sharded dot's partial
  cumsum over n                        sums plus a psum are one summation order
  convert to a narrower float          u(target)·|v|; integer -> float is exact below 2^(mantissa + 1)
  layout ops, neg, abs, max, min,      exact
  reduce_max, sort, top_k values

So the bound holds for every order XLA may evaluate in (sharded or not, fused or not, FMA-contracted or
not, -O0 or -O3): two runs of one program differ by at most twice it. It also holds for another program
that computes the same function with the same operations (a KV-cache decode against a full forward: the
same dot products, the masked slots adding exact zeros): each run lies within its bound of y*.

Decisions are checked, not assumed: every float comparison, elementwise max / min / clamp, sign and argmax. One is
stable when |x - y| > 2·(b(x) + b(y)): the exact values are then farther apart than either run's error, so
every run decides alike. A comparison of x against an order statistic of x (top_k / sort values, sliced or
gathered: the top-k and top-p thresholds) decides which elements are kept: it is stable when every kept
element exceeds every dropped one by more than twice their bounds (a near-tie inside the kept set is
harmless). An exact tie x == y is taken to be one value reached by two paths and passes (two independently
rounded values that tie exactly are a coincidence this check does not see). `Bound.ratio` = max
2·(b(x) + b(y)) / |x - y| over the decisions: < 1 means every run takes the same branches, which the bound
on the outputs needs. reduce_max / top_k values follow one candidate's sensitivity, exact as long as those
values are used under stop_gradient (the softmax shift) or as such thresholds (checked as above).

Primitives without a rule raise NotImplementedError (none is silently taken as exact); while loops are
not supported (reverse mode does not go through them: bound a full forward instead).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jcore

__all__ = ["Bound", "rounding_bound", "TRANSCENDENTAL_ULPS", "LAMBDA"]

TRANSCENDENTAL_ULPS = 8
LAMBDA = 6.0  # probabilistic bound: exceeded with probability <= 2·exp(-λ²/2) = 3e-8 per output

# no rounding: layout, selection, sign; max / min / clamp are decisions too (below)
_EXACT = set(
  "reshape broadcast_in_dim squeeze expand_dims transpose rev slice dynamic_slice dynamic_update_slice "
  "gather scatter concatenate pad select_n copy copy_p stack split sharding_constraint neg abs "
  "stop_gradient optimization_barrier real reduce_max reduce_min cummax cummin sort top_k max min "
  "clamp layout_constraint".split()
)
_ROUNDED = {"add": 1, "add_any": 1, "sub": 1, "mul": 1, "sqrt": 1, "square": 1, "div": 2}
_TRANSCENDENTAL = set(
  "exp exp2 log log1p expm1 logistic tanh sin cos tan rsqrt cbrt pow erf erfc erf_inv atan2 atan asin "
  "acos sinh cosh lgamma digamma".split()
)
_COMPARE = {"lt", "le", "gt", "ge", "eq", "ne", "max", "min"}  # max / min: the selected side is a decision
_CALLS = set(
  "jit pjit closed_call core_call custom_jvp_call custom_vjp_call custom_vjp_call_jaxpr checkpoint remat".split()
)
_ORDER_KEEPING = set("slice reshape broadcast_in_dim squeeze expand_dims gather dynamic_slice copy copy_p".split())
_NO_FLOAT_RESULT_OK = {"is_finite"}  # float in, bool out: finite values are taken to stay finite
_INT_SOURCES = {"iota", "random_bits", "random_wrap", "random_unwrap", "random_seed", "random_fold_in"}


def _is_float(x) -> bool:
  dt = getattr(x, "dtype", None)
  return dt is not None and jnp.issubdtype(dt, jnp.floating)


def _u(dtype) -> float:
  return float(jnp.finfo(dtype).eps) / 2  # unit roundoff


def _f32abs(x):
  return jnp.abs(lax.stop_gradient(x).astype(jnp.float32))


def _make_site(square: bool):
  @jax.custom_vjp
  def site(v, s, delta):
    del s, delta
    return v

  def fwd(v, s, delta):
    del s
    return v, delta

  def bwd(delta, ct):
    t = jnp.abs(ct.astype(jnp.float32)) * delta
    return ct, jnp.sum(t * t if square else t), jnp.zeros_like(delta)

  site.defvjp(fwd, bwd)
  return site


_SITES = {"worst": _make_site(False), "probabilistic": _make_site(True)}


def _same_rank(vals):
  """Operands of an elementwise op with leading 1s up to one rank (stacked copies still broadcast)."""
  vals = [jnp.asarray(v) for v in vals]
  r = max(v.ndim for v in vals)
  return [v.reshape((1,) * (r - v.ndim) + v.shape) for v in vals]


class _Eval:
  """Evaluates a jaxpr; every rounding site hangs on the scalar `s`, whose cotangent is the bound."""

  def __init__(self, s, model: str, order=None):
    self.s, self.model = s, model
    self.site_fn = _SITES[model]
    # ("cmp", 0, [x, y]), ("arg", axis < 0, [x]) or ("set>=" / "set>", axis < 0, [x, y]) (below)
    self.probes: list[tuple[str, int, list]] = []
    # id(v) -> (v, x, axis): v is an order statistic of x along axis (top_k / sort values, sliced or gathered)
    self.order = {} if order is None else order

  def child(self):
    return _Eval(self.s, self.model, self.order)

  def track_order(self, name, params, vals, outs):
    if name == "top_k" and _is_float(vals[0]):
      self.order[id(outs[0])] = (outs[0], vals[0], vals[0].ndim - 1)
    elif name == "sort" and len(vals) == 1 and _is_float(vals[0]):
      self.order[id(outs[0])] = (outs[0], vals[0], params["dimension"])
    elif name in _ORDER_KEEPING and vals and id(vals[0]) in self.order:
      self.order[id(outs[0])] = (outs[0], *self.order[id(vals[0])][1:])

  def set_decision(self, name, vals):
    """x >= t (or >, <=, <) with t an order statistic of x along an axis: the decision is which elements are
    in the kept set, stable when every member is farther from every non-member than their bounds allow."""
    if name not in ("ge", "gt", "le", "lt") or len(vals) != 2:
      return None
    for a, b in ((0, 1), (1, 0)):
      t = self.order.get(id(vals[b]))
      if t is not None and t[1] is vals[a] and jnp.ndim(vals[b]) == vals[a].ndim and vals[b].shape[t[2]] == 1:
        above = (name in ("ge", "gt")) == (a == 0)  # members lie above the threshold
        x, y = (vals[a], vals[b]) if above else (-vals[a], -vals[b])
        return ("set>" if name in ("gt", "lt") else "set>=", t[2] - vals[a].ndim, [x, y])
    return None

  def site(self, v, delta):
    delta = jnp.where(jnp.isfinite(v.astype(jnp.float32)), delta, 0.0)  # inf ± x is exact
    return self.site_fn(v, self.s, lax.stop_gradient(delta))

  def local(self, v, c):
    return c * _u(v.dtype) * _f32abs(v) + float(jnp.finfo(v.dtype).tiny)

  def sum_delta(self, n, mag, out):
    """A length-n sum of terms whose |.| sum to mag."""
    u = _u(out.dtype)
    if self.model == "worst":
      assert n * u < 0.5, (n, u)
      scale = n * u / (1 - n * u)
    else:
      scale = math.sqrt(n) * u
    return scale * mag + float(jnp.finfo(out.dtype).tiny)

  def run(self, jaxpr: jcore.Jaxpr, consts, args):
    env = {}
    read = lambda x: x.val if isinstance(x, jcore.Literal) else env[x]
    used = {x for q in jaxpr.eqns for x in q.invars if not isinstance(x, jcore.Literal)}
    used |= {x for x in jaxpr.outvars if not isinstance(x, jcore.Literal)}
    env.update(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    for eqn in jaxpr.eqns:
      env.update(zip(eqn.outvars, self.eqn(eqn, [read(x) for x in eqn.invars], used)))
    return [read(x) for x in jaxpr.outvars]

  def closed(self, cj, args):
    """Run a ClosedJaxpr, or an open Jaxpr without constants (jax >= 0.11 gives scan its body as one)."""
    if isinstance(cj, jcore.ClosedJaxpr):
      return self.run(cj.jaxpr, cj.consts, args)
    return self.run(cj, [], args)

  def eqn(self, eqn, vals, used):
    name, params = eqn.primitive.name, eqn.params
    if name in _CALLS:
      sub = params.get("jaxpr", params.get("call_jaxpr", params.get("fun_jaxpr")))
      return self.closed(sub, vals) if isinstance(sub, jcore.ClosedJaxpr) else self.run(sub, [], vals)
    if name == "scan":
      return self.scan(params, vals)
    if name == "cond":
      return self.cond(params, vals)
    if name == "while":
      raise NotImplementedError("while loops (reverse mode does not go through them): bound a full forward")
    res = eqn.primitive.bind(*vals, **params)
    outs = list(res) if eqn.primitive.multiple_results else [res]
    fin = any(_is_float(v) for v in vals)
    self.track_order(name, params, vals, outs)
    if (
      name in _COMPARE
      and fin
      and not any(isinstance(x, jcore.Literal) and not np.all(np.isfinite(x.val)) for x in eqn.invars)
    ):
      # (against a literal ±inf: no decision)
      self.probes.append(self.set_decision(name, vals) or ("cmp", 0, _same_rank(vals)))
    if name == "clamp" and fin:  # clamp(lo, x, hi): x against each end is a decision (the kinks)
      for end in (0, 2):
        if not (isinstance(eqn.invars[end], jcore.Literal) and not np.all(np.isfinite(eqn.invars[end].val))):
          self.probes.append(("cmp", 0, _same_rank([vals[1], vals[end]])))
    if name == "sign" and fin:  # a decision against 0; the result (-1, 0, 1) is exact
      self.probes.append(("cmp", 0, [vals[0], jnp.zeros_like(vals[0])]))
      return outs
    if name in ("argmax", "argmin") and fin:
      (ax,) = params["axes"]
      self.probes.append(("arg", ax - vals[0].ndim, [vals[0] if name == "argmax" else -vals[0]]))
      return outs
    if name == "top_k" and fin and eqn.outvars[1] in used:
      raise NotImplementedError("top_k: the indices of float values are used (a decision without a rule)")
    if name == "sort" and fin and len(vals) > 1 and any(v in used for v in eqn.outvars[1:]):
      raise NotImplementedError("sort with several operands (argsort) of float values")
    if name in _EXACT or name in _COMPARE:
      return outs
    if not any(_is_float(v) for v in outs):
      if fin and name not in _NO_FLOAT_RESULT_OK:
        raise NotImplementedError(f"{name}: a non-float result of float operands (a decision without a rule)")
      return outs
    (out,) = outs
    if name == "convert_element_type":
      if not _is_float(vals[0]):
        big = 2.0 ** (jnp.finfo(out.dtype).nmant + 1)
        return [self.site(out, jnp.where(_f32abs(out) < big, 0.0, self.local(out, 1)))]
      if jnp.finfo(out.dtype).nmant < jnp.finfo(vals[0].dtype).nmant:
        return [self.site(out, self.local(out, 1))]
      return [out]
    if name == "bitcast_convert_type":
      if fin:
        raise NotImplementedError("bitcast of a float")
      return [out]
    if name in _ROUNDED or name in _TRANSCENDENTAL or name == "integer_pow":
      c = max(1, abs(params["y"])) if name == "integer_pow" else _ROUNDED.get(name, TRANSCENDENTAL_ULPS)
      return [self.site(out, self.local(out, c))]
    if name in ("reduce_sum", "cumsum"):
      x = vals[0]
      axes = params["axes"] if name == "reduce_sum" else (params["axis"],)
      mag = eqn.primitive.bind(_f32abs(x), **params)
      return [self.site(out, self.sum_delta(math.prod(x.shape[a] for a in axes), mag, out))]
    if name == "dot_general":
      x, w = vals
      (cx, _), _ = params["dimension_numbers"]
      mag = lax.dot_general_p.bind(_f32abs(x), _f32abs(w), **dict(params, preferred_element_type=jnp.float32))
      return [self.site(out, self.sum_delta(math.prod(x.shape[a] for a in cx), mag, out))]
    if name in _INT_SOURCES:
      return outs
    raise NotImplementedError(f"no rounding rule for primitive {name!r}")

  def scan(self, params, vals):
    if "num_consts" in params:  # jax < 0.11
      nc, nk = params["num_consts"], params["num_carry"]
      consts, init, xs = vals[:nc], vals[nc : nc + nk], vals[nc + nk :]
    else:  # jax >= 0.11: `ft_in`, the flat tree of (consts, carry, xs)
      consts, init, xs = (list(part) for part in params["ft_in"].update(list(vals)).unpack())
      nk = len(init)
    meta = []

    def f(carry, x):
      sub = self.child()
      o = sub.closed(params["jaxpr"], [*consts, *carry, *x])
      meta[:] = [(k, a) for k, a, _ in sub.probes]
      return o[:nk], (o[nk:], [arrs for _, _, arrs in sub.probes])

    c, (ys, probes) = lax.scan(f, list(init), list(xs), length=params["length"], reverse=params["reverse"])
    self.probes += [(k, a, list(arrs)) for (k, a), arrs in zip(meta, probes)]
    return list(c) + list(ys)

  def cond(self, params, vals):
    def branch(b):
      def f(ops):
        sub = self.child()
        o = sub.closed(b, ops)
        if sub.probes:
          raise NotImplementedError("cond: a decision inside a branch")
        return o

      return f

    return list(lax.switch(vals[0], [branch(b) for b in params["branches"]], vals[1:]))


@dataclasses.dataclass
class Bound:
  """What `rounding_bound` returns.

  Attributes:
    out: fn's outputs as this evaluation computes them (NumPy).
    err: a matching tree of float32 bounds on |output - exact| (0 for non-float leaves).
    ratio: the largest decision ratio 2·(b(x) + b(y)) / |x - y| (< 1: every decision is stable).
    ratios: that ratio for each decision, in program order ("cmp" / "arg", operand shape, ratio).
  """

  out: object
  err: object
  ratio: float
  ratios: list

  def scaled(self, f: float) -> "Bound":
    """The bound times f >= 1 (for a run known to be within f times this one's bound of the exact value)."""
    return Bound(
      out=self.out,
      err=jax.tree_util.tree_map(lambda e: e * np.float32(f), self.err),
      ratio=self.ratio * f,
      ratios=[(k, sh, r * f) for k, sh, r in self.ratios],
    )

  def assert_stable(self):
    assert self.ratio < 1, (
      f"a decision (comparison / argmax) is within twice its rounding bound of a tie "
      f"(ratios {self.ratios}): runs may branch differently; change the fixture"
    )


_COMPILED = {}


def _live(kind, axis, arrs):
  """Which elements of a decision's operands need a bound: those with a finite, nonzero gap."""
  if kind == "arg":
    (x,) = arrs
    return [jnp.isfinite(jnp.max(x, axis=axis, keepdims=True) - x)]
  if kind.startswith("set"):
    x, y = arrs
    return [jnp.isfinite(x), jnp.zeros(y.shape, bool)]  # the threshold is one of the x
  x, y = (a.astype(jnp.float32) for a in arrs)
  live = jnp.isfinite(x - y) & (x != y)
  out = []
  for a in arrs:
    axes = tuple(d for d in range(live.ndim) if a.shape[d] == 1 and live.shape[d] != 1)
    out.append(jnp.any(live, axis=axes, keepdims=True) if axes else live)
  return out


def rounding_bound(
  fn, *args, rounded_args=(), model: str = "probabilistic", lam: float = LAMBDA, batch_size: int = 64
) -> Bound:
  """First-order rounding-error bounds of every float output of fn(*args) (module docstring).

  rounded_args: indices of the args whose float leaves are taken as float32 roundings of exact values (an f32
  ulp each, a site at the input): the bound then also covers fn of the unrounded values (ŵ = fl(w·s)).

  One compiled program per (jaxpr, input shapes, model): a second call with other values of the same
  shapes reuses it. It runs one reverse pass per finite output element and live decision operand, so
  return only what the test needs.
  """
  closed = jax.make_jaxpr(fn)(*args)
  out_tree = jax.tree_util.tree_structure(jax.eval_shape(fn, *args))
  leaves, rounded = [], []
  for i, a in enumerate(args):
    for x in jax.tree_util.tree_leaves(a):
      leaves.append(x if isinstance(x, jax.Array) else jnp.asarray(x))
      rounded.append(i in rounded_args and _is_float(leaves[-1]))
  leaves += [c if isinstance(c, jax.Array) else jnp.asarray(c) for c in closed.consts]
  rounded += [False] * len(closed.consts)
  key = (str(closed.jaxpr), tuple((x.shape, str(x.dtype)) for x in leaves), tuple(rounded), model, batch_size)
  if key not in _COMPILED:
    jaxpr, n_args = closed.jaxpr, len(leaves) - len(closed.consts)
    meta = []

    def program(s, leaves):
      ev = _Eval(s, model)
      leaves = [ev.site(x, _u(jnp.float32) * _f32abs(x)) if r else x for x, r in zip(leaves, rounded)]
      outs = ev.run(jaxpr, leaves[n_args:], leaves[:n_args])
      meta[:] = [(k, a) for k, a, _ in ev.probes]
      flat, live = [], []
      for o in outs:
        if _is_float(o):
          flat.append(o.astype(jnp.float32).ravel())
          live.append(jnp.isfinite(o.astype(jnp.float32)).ravel())
      for k, a, arrs in ev.probes:
        flat += [x.astype(jnp.float32).ravel() for x in arrs]
        live += [m.ravel() for m in _live(k, a, arrs)]
      return jnp.concatenate(flat), (outs, [arrs for _, _, arrs in ev.probes], jnp.concatenate(live))

    def go(leaves):
      flat, vjp, (outs, probes, live) = jax.vjp(lambda s: program(s, leaves), jnp.float32(0.0), has_aux=True)
      R = flat.shape[0]
      C = -(-R // batch_size)
      rows = jnp.nonzero(live, size=C * batch_size, fill_value=0)[0].reshape(C, batch_size)
      n = jnp.sum(live.astype(jnp.int32))

      def chunk(c, acc):
        r = rows[c]
        return acc.at[r].set(jax.vmap(lambda i: vjp(jax.nn.one_hot(i, R, dtype=jnp.float32))[0])(r))

      b = lax.fori_loop(0, (n + batch_size - 1) // batch_size, chunk, jnp.zeros((R,), jnp.float32))
      return outs, probes, jnp.where(live, b, 0.0)

    _COMPILED[key] = (jax.jit(go), meta)
  go, meta = _COMPILED[key]
  outs, probes, b = go(leaves)
  b = np.asarray(b, np.float64)
  b = lam * np.sqrt(b) if model == "probabilistic" else b
  errs, k = [], 0
  for o in outs:
    if _is_float(o):
      errs.append(b[k : k + o.size].reshape(o.shape).astype(np.float32))
      k += o.size
    else:
      errs.append(np.zeros(np.shape(o), np.float32))
  ratios = []
  for (kind, axis), arrs in zip(meta, probes):
    xs = [np.asarray(a, np.float64) for a in arrs]
    es = []
    for a in xs:
      es.append(b[k : k + a.size].reshape(a.shape))
      k += a.size
    if kind == "cmp":
      x, y = np.broadcast_arrays(*xs)
      e = np.broadcast_to(es[0], x.shape) + np.broadcast_to(es[1], x.shape)
      gap = np.abs(x - y)
      live = np.isfinite(gap) & (gap > 0)
    elif kind.startswith("set"):  # every member i against every non-member j along the axis
      x, y = xs
      member = x > y if kind == "set>" else x >= y
      xm, em, mm = (np.moveaxis(a, axis, -1) for a in (x, es[0], np.broadcast_to(member, x.shape)))
      pair = mm[..., :, None] & ~mm[..., None, :]
      with np.errstate(invalid="ignore"):  # -inf - -inf off the pairs
        gap = np.where(pair, xm[..., :, None] - xm[..., None, :], np.inf)
      e = em[..., :, None] + em[..., None, :]
      live = pair & np.isfinite(gap)
      gap = np.where(gap > 0, gap, 0.0)  # a member not above a non-member: ratio inf
    else:
      (x,), (e1,) = xs, es
      i = np.expand_dims(np.argmax(x, axis=axis), axis)
      e = np.take_along_axis(e1, i, axis=axis) + e1
      gap = np.take_along_axis(x, i, axis=axis) - x
      other = np.arange(x.shape[axis]).reshape([-1 if d == x.ndim + axis else 1 for d in range(x.ndim)]) != i
      live = other & np.isfinite(gap) & (e > 0)  # an exact tie of two elements: gap 0, ratio inf
    with np.errstate(divide="ignore"):
      ratios.append((kind, x.shape, float(np.max(2 * e[live] / gap[live])) if live.any() else 0.0))
  out = jax.tree_util.tree_unflatten(out_tree, [np.asarray(o) for o in outs])
  return Bound(
    out=out,
    err=jax.tree_util.tree_unflatten(out_tree, errs),
    ratio=max([r for _, _, r in ratios], default=0.0),
    ratios=ratios,
  )
