"""lrl_jax.learner.traffic: each op's bytes from the optimized HLO, checked against XLA's own count
(`compiled.cost_analysis()["bytes accessed"]`, HloCostAnalysis in C++) where the two count alike, and against the
shapes' arithmetic where they do not (gathers, loops)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lrl_jax.learner import traffic


def _compiled(f, *args):
  return jax.jit(f).lower(*args).compile()


def _xla_bytes(c) -> float:
  cost = c.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return cost["bytes accessed"]


@pytest.mark.parametrize(
  "shape, nbytes",
  [
    ("f32[2,3]{1,0}", 24),
    ("bf16[4]{0}", 8),
    ("s32[]", 4),
    ("(f32[2]{0}, s8[3]{0}, pred[])", 12),
    ("u4[5]{0}", 3),  # 20 bits, rounded up to whole bytes
    ("f8e4m3fn[16,16]{1,0}", 256),
  ],
)
def test_shape_bytes(shape, nbytes):
  assert traffic.shape_bytes(shape) == nbytes


def test_shape_bytes_names_an_unknown_type():
  with pytest.raises(ValueError, match="q7"):
    traffic.shape_bytes("q7[3]{0}")


def _mlp_adamw_step():
  w = [jnp.ones((256, 512)), jnp.ones((512, 256))]
  opt = optax.adamw(1e-3)

  def step(w, s, x):
    g = jax.grad(lambda w, x: jnp.mean(jnp.tanh(x @ w[0]) @ w[1]))(w, x)
    u, s = opt.update(g, s, w)
    return optax.apply_updates(w, u), s

  return step, (w, opt.init(w), jnp.ones((64, 256)))


x = jnp.ones((1000, 100))
PROGRAMS = {
  "elementwise": (lambda x, y: x * 2 + y, (x, x)),
  "dot and reduce": (lambda x, y: jnp.tanh(x @ y.T).sum(0), (x, x)),
  "update slice (a copy: not donated)": (lambda x, y: jax.lax.dynamic_update_slice(x, y[:10] * 2, (5, 0)), (x, x)),
  "scatter-add": (lambda e, i, g: jnp.zeros_like(e).at[i].add(g), (x, jnp.arange(50) % 7, x[:50])),
  "cumsum": (lambda x: jnp.cumsum(x, 0), (x,)),
  "pad and concatenate": (lambda x, y: jnp.concatenate([jnp.pad(x, ((1, 2), (0, 0))), y]) + 1, (x, x[:7])),
  "logsumexp": (lambda x: jax.nn.logsumexp(x, -1), (x,)),
  "sort": (lambda x: jnp.sort(x, 0), (x,)),
  "mlp + adamw step": _mlp_adamw_step(),
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_sum_is_xla_count_without_loops_or_gathers(name):
  """Exact: both count whole bytes of the same compiled program's ops by the same rules, but for the program's
  output tuple, whose table of pointers XLA counts (8 bytes an element) and traffic.py does not."""
  f, args = PROGRAMS[name]
  c = _compiled(f, *args)
  ops = traffic.op_bytes(c.as_text())
  leaves = len(jax.tree.leaves(jax.eval_shape(f, *args)))
  assert all(op.runs == 1 for op in ops.values())
  assert sum(op.bytes for op in ops.values()) == _xla_bytes(c) - (_table_bytes() * leaves if leaves > 1 else 0)


def _table_bytes() -> float:
  """What XLA counts for each element of a program's output tuple (its table of pointers): 8 bytes in the XLA of
  jax 0.10, 4 in 0.11's. Measured on a program whose bytes are known by hand: two outputs of 10 x 10 f32, each one
  input read and one result written (1600 bytes), so the rest of XLA's count is the two elements' table."""
  a = jnp.ones((10, 10))
  extra = _xla_bytes(_compiled(lambda x, y: (x * 2, y * 3), a, a)) - 4 * 400
  assert extra in (8, 16), f"XLA counts {extra} bytes beyond the two outputs' traffic: not a table of 2 pointers"
  return extra / 2


def test_dots_are_marked():
  c = _compiled(lambda x, y: jnp.tanh(x @ y.T), x, x)
  ops = traffic.op_bytes(c.as_text())
  dots = [op for op in ops.values() if op.is_dot]
  assert len(dots) == 1
  dot_bytes, rest = traffic.program_bytes(c.as_text())
  assert dot_bytes == dots[0].bytes and dot_bytes + rest == _xla_bytes(c)
  # the dot reads both [1000, 100] operands and writes [1000, 1000] at the least (tanh may fuse into it)
  assert dot_bytes >= 4 * (2 * 1000 * 100 + 1000 * 1000)


def test_gather_reads_the_rows_it_gathers():
  """An embedding lookup: the rows, the indices and the result; XLA counts the whole table instead."""
  table, idx = jnp.ones((1000, 64)), jnp.arange(100) % 7
  c = _compiled(lambda t, i: t[i], table, idx)
  rows = 100 * 64 * 4
  assert sum(op.bytes for op in traffic.op_bytes(c.as_text()).values()) == rows + 100 * 4 + rows
  assert _xla_bytes(c) >= 1000 * 64 * 4


def test_loop_ops_run_their_trip_count():
  """A scan over 12 steps that stacks its outputs: the body's ops run 12 times, and what they move adds up to at
  least the stacked [12, 256, 128] f32 outputs written and the xs read, with the buffer updated in place."""
  n, shape = 12, (256, 128)
  xs = jnp.asarray(np.random.default_rng(0).standard_normal((n, *shape)), jnp.float32)

  def f(xs):
    return jax.lax.scan(lambda c, x: (c + x, jnp.sin(x) * c), jnp.zeros(shape), xs)

  text = _compiled(f, xs).as_text()
  ops = traffic.op_bytes(text)
  assert {op.runs for op in ops.values() if op.bytes} >= {n}
  total = sum(op.bytes * op.runs for op in ops.values())
  assert sum(traffic.program_bytes(text)) == total
  slab = int(np.prod(shape)) * 4
  assert total >= 2 * n * slab  # xs read, ys written
  # in place: a few slabs a step (the slice, the carry, the update), where copying the stacked [12, ...] buffer
  # would read and write 2 x 12 slabs a step
  assert total < 12 * n * slab


def _tuple_elements_run(text: str, ops) -> int:
  """Elements of the tuples the program runs (XLA counts a table of pointers for each; traffic.py does not)."""
  comps, _, _, _ = traffic.parse(text)
  return sum(len(i.operands) for body in comps.values() for i in body if i.opcode == "tuple" and ops[i.name].runs)


def test_conditional_counts_its_costliest_branch_as_xla_does():
  """XLA's rule (HloCostAnalysis::HandleConditional takes each property's largest value over the branches): the
  costly branch's ops run once, the cheap one's not at all. Exact against XLA's count but for the tables of the
  tuples that run, which XLA counts (`_table_bytes` an element) and traffic.py does not."""

  def f(p, x, y):
    return jax.lax.cond(p > 0, lambda x, y: jnp.tanh(x) * y + 1, lambda x, y: x[:10].sum() * y, x, y)

  c = _compiled(f, 1.0, x, x)
  text = c.as_text()
  assert "conditional(" in text
  ops = traffic.op_bytes(text)
  assert {op.runs for op in ops.values()} == {0, 1}
  total = sum(op.bytes * op.runs for op in ops.values())
  assert total >= 3 * x.size * 4  # the costly branch reads x and y and writes its result
  assert total == _xla_bytes(c) - _table_bytes() * _tuple_elements_run(text, ops)


def test_loop_in_a_branch_runs_its_trip_count():
  """A scan of 12 steps inside the costly branch: its body runs 12 times (it ran once before the conditional's
  branches were followed), and the program moves at least the xs read and the ys written."""
  n, shape = 12, (256, 128)
  xs = jnp.asarray(np.random.default_rng(0).standard_normal((n, *shape)), jnp.float32)

  def f(p, xs):
    scan = lambda xs: jax.lax.scan(lambda c, x: (c + x, jnp.sin(x) * c), jnp.zeros(shape), xs)[1]  # noqa: E731
    return jax.lax.cond(p > 0, scan, lambda xs: xs * 2, xs)

  text = _compiled(f, 1.0, xs).as_text()
  ops = traffic.op_bytes(text)
  assert n in {op.runs for op in ops.values() if op.bytes}
  slab = int(np.prod(shape)) * 4
  assert sum(traffic.program_bytes(text)) >= 2 * n * slab


CALL_HLO = """HloModule m

%callee (a: f32[1000]) -> f32[1000] {
  %a = f32[1000]{0} parameter(0)
  ROOT %neg = f32[1000]{0} negate(%a)
}

ENTRY %main (p: f32[1000]) -> f32[1000] {
  %p = f32[1000]{0} parameter(0)
  %c = f32[1000]{0} call(%p), to_apply=%callee
  ROOT %e = f32[1000]{0} exponential(%c)
}
"""


def test_called_computation_runs_once_per_call():
  """A `call` runs its computation's ops (here a negate: 4000 bytes read, 4000 written) as often as the call runs."""
  ops = traffic.op_bytes(CALL_HLO)
  assert ops["neg"].runs == 1 and ops["neg"].bytes == 8000
  assert sum(traffic.program_bytes(CALL_HLO)) == 2 * 8000


def test_unknown_trip_count_is_refused():
  def f(x):
    return jax.lax.while_loop(lambda c: c[0] < c[1].sum(), lambda c: (c[0] + 1, c[1] * 2), (0, x))[1]

  text = _compiled(f, x).as_text()
  assert any(op.runs is None for op in traffic.op_bytes(text).values())
  with pytest.raises(ValueError, match="unknown trip count"):
    traffic.program_bytes(text)


def test_text_without_entry_is_refused():
  with pytest.raises(ValueError, match="ENTRY"):
    traffic.op_bytes("HloModule m\n")
