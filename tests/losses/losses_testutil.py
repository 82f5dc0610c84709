"""Test helper: `jitted(lrl_jax.losses)` — the same API with every array function run under `jax.jit`.

Eager (op-by-op) execution compiles each primitive for each new shape; one jit per function and
shape is several times faster on the shared CI cores. Python scalars, strings, tuples and None are
static arguments; arrays and pytrees (ACRLState) are traced. `test_losses_jit_grad.py` checks
jit == eager for every function, so the other tests may use either.
"""

import types

import jax

_PASS_THROUGH = {"finalize_metrics", "merge_metrics", "acrl_init", "acrl_set_reference"}


def _is_static(x):
  return x is None or isinstance(x, (bool, int, float, str, tuple))


class _Jit:
  def __init__(self, fn):
    self.fn = fn
    self.cache = {}

  def __call__(self, *args, **kwargs):
    static_pos = tuple(i for i, a in enumerate(args) if _is_static(a))
    static_kw = tuple(sorted((k, v) for k, v in kwargs.items() if _is_static(v)))
    dyn_names = tuple(sorted(k for k, v in kwargs.items() if not _is_static(v)))
    key = (len(args), static_pos, tuple(repr(args[i]) for i in static_pos), repr(static_kw), dyn_names)
    f = self.cache.get(key)
    if f is None:
      fixed = {i: args[i] for i in static_pos}
      n, fn, skw = len(args), self.fn, dict(static_kw)

      def inner(dyn_args, dyn_kw):
        it = iter(dyn_args)
        full = [fixed[i] if i in fixed else next(it) for i in range(n)]
        return fn(*full, **skw, **dyn_kw)

      f = self.cache[key] = jax.jit(inner)
    dyn_args = [a for i, a in enumerate(args) if i not in static_pos]
    return f(dyn_args, {k: kwargs[k] for k in dyn_names})


def jitted(module) -> types.SimpleNamespace:
  ns = {}
  for name in module.__all__:
    obj = getattr(module, name)
    is_fn = isinstance(obj, types.FunctionType) and name not in _PASS_THROUGH
    ns[name] = _Jit(obj) if is_fn else obj
  return types.SimpleNamespace(**ns)
