"""The bytes each op of a compiled XLA program reads and writes, counted from its optimized HLO text.

`compiled.cost_analysis()` gives one total and counts a loop body once; a profile gives each op's time but not its
bytes. `op_bytes(compiled.as_text())` gives every top-level op (by its HLO name, the name a `jax.profiler` trace of
the program shows for it) its bytes and how many times one run of the program runs it (the known trip counts of the
loops around it), so that a step can be split into its dots, timed against a dot rate, and the rest, timed against
the machine's memory bandwidth (`program_bytes`; `scripts/learner_profile.py --bytes` does it op by op).

The count is the compulsory traffic of the op as XLA fused it: every operand read once and the result written once,
except where an op reads or writes part of a buffer:
  - a slice or dynamic slice of an operand (inside a fusion too) reads the slice, not the operand;
  - a dynamic update slice updates its buffer in place: it writes the update and does not read the buffer;
  - bitcasts, tuples, parameters, constants and control flow (while, call, conditional) move nothing themselves;
  - a loop's body and condition run as often as its known trip count says; a conditional runs its costliest branch
    (XLA's HloCostAnalysis takes each property's largest value over the branches), the others not at all; a call
    runs its computation once.
These are XLA's own rules (HloCostAnalysis: `compiled.cost_analysis()["bytes accessed"]` of a program without loops
or gathers is the sum of `op_bytes` and the tables of pointers of the tuples it runs, its output's among them, 8
bytes an element in the XLA of jax 0.10 and 4 in 0.11's, which tests/learner/test_traffic.py checks), but for one: a
gather reads the rows it gathers here, where XLA counts its whole operand (an embedding lookup reads B·T rows, not
the table).
Caches are not modelled: a result read back while it is still in cache counts again.
"""

from __future__ import annotations

import dataclasses
import functools
import re

# bits per element of each HLO element type
_BITS = {
  "pred": 8, "s2": 2, "u2": 2, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16, "s32": 32, "u32": 32,
  "s64": 64, "u64": 64, "f16": 16, "bf16": 16, "f32": 32, "f64": 64, "c64": 64, "c128": 128, "token": 0,
  "f8e4m3fn": 8, "f8e5m2": 8, "f8e4m3": 8, "f8e4m3fnuz": 8, "f8e5m2fnuz": 8, "f8e4m3b11fnuz": 8, "f8e3m4": 8,
  "f8e8m0fnu": 8, "f4e2m1fn": 4,
}  # fmt: skip
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_HEADER = re.compile(r"^(?:ENTRY\s+)?%([\w.\-]+)\s.*\{\s*$")
_NAME = re.compile(r"%([\w.\-]+)")
_FREE = {"parameter", "constant", "bitcast", "get-tuple-element", "tuple", "while", "call", "conditional", "after-all"}
_PART_READ = {"slice", "dynamic-slice", "gather"}  # ops that read part of their operand 0
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_DOTS = {"dot", "convolution"}


def shape_bytes(shape: str) -> int:
  """Bytes of an HLO shape string, a tuple's elements summed: "f32[2,3]{1,0}" -> 24, "(s32[], bf16[4])" -> 12."""
  total = 0
  for dtype, dims in _ARRAY.findall(shape):
    if dtype not in _BITS:
      raise ValueError(f"HLO element type {dtype!r} in shape {shape!r} is not one traffic.py knows")
    n = 1
    for d in filter(None, dims.split(",")):
      n *= int(d)
    total += n * _BITS[dtype]
  return (total + 7) // 8


@dataclasses.dataclass(frozen=True)
class Instr:
  name: str
  shape: str
  opcode: str
  operands: tuple[str, ...]
  calls: str | None  # the fused computation of a fusion
  body: str | None = None  # a while loop's body and condition, and its known trip count
  condition: str | None = None
  trip: int | None = None
  branches: tuple[str, ...] = ()  # a conditional's branch computations, or the computation a call runs


@dataclasses.dataclass(frozen=True)
class Op:
  """One top-level op: its HLO opcode, the bytes it reads and writes each time it runs, whether it is a dot (a dot
  or a convolution, alone or in a fusion), and how many times one run of the program runs it (None: inside a loop
  whose trip count XLA does not know; 0: in a conditional's branch other than its costliest)."""

  opcode: str
  bytes: int
  is_dot: bool
  runs: int | None = 1


def _split_shape(rest: str) -> tuple[str, str]:
  """("shape", "the rest") of the text after "name = "; a tuple shape is a parenthesised group."""
  if not rest.startswith("("):
    shape, _, tail = rest.partition(" ")
    return shape, tail
  depth = 0
  for i, ch in enumerate(rest):
    depth += ch == "("
    depth -= ch == ")"
    if depth == 0:
      return rest[: i + 1], rest[i + 1 :].lstrip()
  raise ValueError(f"unbalanced tuple shape in HLO line: {rest[:200]!r}")


def _operands(tail: str) -> tuple[str, tuple[str, ...], str]:
  """(opcode, operand names, attributes) of "opcode(%a, %b), attr=..."."""
  opcode, _, args = tail.partition("(")
  depth, end = 1, len(args)
  for i, ch in enumerate(args):
    depth += ch == "("
    depth -= ch == ")"
    if depth == 0:
      end = i
      break
  return opcode.strip(), tuple(_NAME.findall(args[:end])), args[end + 1 :]


def parse(hlo_text: str) -> tuple[dict[str, list[Instr]], dict[str, str], set[str], str]:
  """({computation: its instructions}, {computation: its root's name}, the computations applied element by element
  inside an op (a reduction's or a scatter's `to_apply`), the entry computation's name)."""
  comps: dict[str, list[Instr]] = {}
  applied: set[str] = set()
  roots: dict[str, str] = {}
  entry, current = "", None
  for line in hlo_text.splitlines():
    if current is None:
      m = _HEADER.match(line)
      if m and "=" not in line.split("(")[0]:
        current = m.group(1)
        comps[current] = []
        if line.startswith("ENTRY"):
          entry = current
      continue
    s = line.strip()
    if s == "}":
      current = None
      continue
    root = s.startswith("ROOT ")
    s = s.removeprefix("ROOT ")
    if not s.startswith("%") or " = " not in s:
      continue
    name, _, rest = s.partition(" = ")
    shape, tail = _split_shape(rest)
    opcode, operands, attrs = _operands(tail)
    calls, body, cond, trip = (
      re.search(p, attrs) for p in (r"calls=%([\w.\-]+)", r"body=%([\w.\-]+)", r"condition=%([\w.\-]+)", _TRIP)
    )
    if opcode == "conditional":
      branches = tuple(re.findall(r"(?:true|false)_computation=%([\w.\-]+)", attrs))
      if m := re.search(r"branch_computations=\{([^}]*)\}", attrs):
        branches = tuple(_NAME.findall(m.group(1)))
    elif opcode == "call":
      branches = tuple(re.findall(r"to_apply=%([\w.\-]+)", attrs))
    else:
      branches = ()
      applied.update(re.findall(r"to_apply=%([\w.\-]+)", attrs))
    comps[current].append(
      Instr(
        name[1:],
        shape,
        opcode,
        operands,
        calls and calls.group(1),
        body and body.group(1),
        cond and cond.group(1),
        trip and int(trip.group(1)),
        branches,
      )
    )
    if root:
      roots[current] = name[1:]
  if not entry:
    raise ValueError("no ENTRY computation in the HLO text (pass compiled.as_text())")
  return comps, roots, applied, entry


def _fusion_bytes(body: list[Instr], root: str, shapes: dict[str, str]) -> int:
  """Bytes a fusion reads and writes: its parameters, each as far as its fused computation reads it, and its
  result, an in-place update's update only."""
  by_name = {i.name: i for i in body}
  users: dict[str, list[tuple[Instr, int]]] = {}
  for ins in body:
    for k, o in enumerate(ins.operands):
      users.setdefault(o, []).append((ins, k))

  def read(name: str) -> int:
    """Bytes the fusion reads of the value `name` (a parameter, or a bitcast of one)."""
    full = shape_bytes(shapes[name])
    total = 0
    for user, k in users.get(name, []):
      if user.opcode == "bitcast":
        total += read(user.name)
      elif user.opcode in _PART_READ and k == 0:
        total += shape_bytes(user.shape)
      elif user.opcode == "dynamic-update-slice" and k == 0:
        pass  # the buffer updated in place
      else:
        return full
    return min(total, full)

  def written(name: str) -> int:
    ins = by_name[name]
    if ins.opcode == "tuple":
      return sum(written(o) for o in ins.operands)
    if ins.opcode == "bitcast" and ins.operands[0] in by_name:
      return written(ins.operands[0])
    if ins.opcode == "dynamic-update-slice":
      return shape_bytes(shapes[ins.operands[1]])
    return shape_bytes(ins.shape)

  return sum(read(i.name) for i in body if i.opcode == "parameter") + written(root)


def op_bytes(hlo_text: str) -> dict[str, Op]:
  """{HLO name: Op} for every op of every computation the program runs at the top level (the entry computation, loop
  bodies and conditions, conditional branches, called computations), fusions counted as one op each (module
  docstring for the rules). A conditional runs its costliest branch, XLA's rule (HloCostAnalysis takes the most of
  each property over the branches): that branch's ops run as often as the conditional, the others' 0 times."""
  comps, roots, applied, entry = parse(hlo_text)
  shapes = {i.name: i.shape for body in comps.values() for i in body}
  fused = {i.calls for body in comps.values() for i in body if i.opcode == "fusion" and i.calls}

  def has_dot(comp: str) -> bool:
    return any(i.opcode in _DOTS or (i.calls and has_dot(i.calls)) for i in comps.get(comp, []))

  @functools.cache  # a conditional's branches are costed to choose one, then counted
  def moved(ins: Instr) -> int:
    """Bytes one run of the op reads and writes itself (control flow's bodies are counted as their own ops)."""
    if ins.opcode in _FREE:
      return 0
    if ins.opcode == "fusion" and ins.calls in comps:
      return _fusion_bytes(comps[ins.calls], roots[ins.calls], shapes)
    if ins.opcode in _PART_READ:  # the part read and written, and the indices
      return 2 * shape_bytes(ins.shape) + sum(shape_bytes(shapes[o]) for o in ins.operands[1:] if o in shapes)
    if ins.opcode == "dynamic-update-slice":
      return 2 * shape_bytes(shapes[ins.operands[1]])
    return sum(shape_bytes(shapes[o]) for o in ins.operands if o in shapes) + shape_bytes(ins.shape)

  @functools.cache
  def cost(comp: str) -> int:
    """Bytes one run of a computation moves, a loop of unknown trip count taken as running once (used only to
    choose a conditional's costliest branch)."""
    total = 0
    for ins in comps.get(comp, []):
      total += moved(ins)
      if ins.opcode == "while":
        k = ins.trip or 1
        total += k * cost(ins.body or "") + (k + 1) * cost(ins.condition or "")
      elif ins.branches:
        total += max(cost(b) for b in ins.branches)
    return total

  runs: dict[str, int | None] = {}  # times one run of the program runs each loop body, condition and branch

  def visit(comp: str, n: int | None):
    for ins in comps.get(comp, []):
      if ins.opcode == "while":
        inner = None if n is None or ins.trip is None else n * ins.trip
        for c, k in ((ins.body, inner), (ins.condition, None if inner is None else inner + n)):
          if c:
            runs[c] = k
            visit(c, k)
      elif ins.branches:
        taken = max(ins.branches, key=cost)
        for c in ins.branches:
          runs[c] = n if c == taken else 0
          visit(c, runs[c])

  visit(entry, 1)
  out: dict[str, Op] = {}
  for comp, body in comps.items():
    if comp in fused or comp in applied:
      continue
    for ins in body:
      dot = ins.opcode in _DOTS or (ins.opcode == "fusion" and bool(ins.calls) and has_dot(ins.calls))
      out[ins.name] = Op(ins.opcode, moved(ins), dot, runs.get(comp, 1))
  return out


def program_bytes(hlo_text: str) -> tuple[int, int]:
  """(bytes of the dots, bytes of every other op) one run of the program moves: `op_bytes` times the runs of each
  op. Raises where an op that moves bytes sits in a loop whose trip count XLA does not know."""
  dots = rest = 0
  for name, op in op_bytes(hlo_text).items():
    if op.bytes and op.runs is None:
      raise ValueError(f"op {name} ({op.opcode}, {op.bytes} bytes) runs in a loop of unknown trip count")
    if op.is_dot:
      dots += op.bytes * (op.runs or 0)
    else:
      rest += op.bytes * (op.runs or 0)
  return dots, rest
