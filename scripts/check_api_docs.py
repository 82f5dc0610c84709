#!/usr/bin/env python
"""Builds the API reference from the docstrings (pdoc, Google style) and checks it; `make docs` runs it.

  python scripts/check_api_docs.py build/api    # HTML into build/api/, then the checks; exit 1 on any problem

It fails, one line per problem naming the module, the name and what is wrong, when
  - pdoc warns while building (a module it cannot import, an annotation it cannot resolve, ...);
  - a name of a package's `__all__` is not on that package's page, or is there without its signature (a
    function or class whose parameters do not all appear in the signature pdoc rendered);
  - a docstring names in backticks a dotted name of this package that does not resolve: `lrl_jax.x.y`, or one
    that starts with a subpackage's short name as the docstrings write them (`quant.qdot`, `models.forward(...)`,
    `rl.setup.Setup`). Nothing else in backticks is read (code, shapes, overrides such as `quant.sampler=bf16`),
    and a short name that is a config key (`sampler.temperature`, a field of `lrl_jax.config.Config`) resolves.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import html
import importlib
import importlib.util
import inspect
import os
import re
import sys
import time
import types
import typing
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Where each package's source lives (pyproject's `package-dir`: kernels/ ships as lrl_jax.kernels).
SOURCES = {"lrl_jax": ROOT / "lrl_jax", "lrl_jax.kernels": ROOT / "kernels"}
PACKAGES = tuple(
  sorted(
    {"lrl_jax", "lrl_jax.kernels"} | {f"lrl_jax.{p.parent.name}" for p in (ROOT / "lrl_jax").glob("*/__init__.py")}
  )
)
# The subpackages' short names, as the docstrings write them (`quant.qdot`, `kernels.qmatmul`).
SHORT_NAMES = tuple(sorted(p.rsplit(".", 1)[1] for p in PACKAGES if p != "lrl_jax"))
# What pdoc renders: lrl_jax with its subpackages (pdoc follows each package's `__all__`) and lrl_jax.kernels, which
# pdoc does not find under lrl_jax/ in an editable install. The `!` pattern keeps out the ahead-of-time compile
# drivers (triton / libtpu) should kernels' `__all__` ever name them: they are tools, not the API.
PDOC_SPECS = ("lrl_jax", "lrl_jax.kernels", r"!lrl_jax\.kernels\.(triton_aot|tpu_aot)$")

_UNRESOLVED = object()


class _Unimportable(Exception):
  """A module of the path could not be imported (a missing optional dependency): the name cannot be checked."""


# ---------------------------------------------------------------------------------------------------------------
# The build


def build(out_dir: Path, specs=PDOC_SPECS) -> list[str]:
  """Renders `specs` into `out_dir` with pdoc; returns pdoc's warnings, one problem each."""
  import pdoc  # noqa: PLC0415 (the `docs` extra: only the build needs it)
  import pdoc.render  # noqa: PLC0415

  pdoc.render.configure(docformat="google")
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    pdoc.pdoc(*specs, output_directory=Path(out_dir))
  pdoc_dir = Path(pdoc.__file__).resolve().parent
  problems = []
  for w in caught:
    message = str(w.message).strip()
    if Path(w.filename).resolve().is_relative_to(pdoc_dir) and not _namedtuple_annotation(message):
      problems.append(f"pdoc warning: {message}")
  return list(dict.fromkeys(problems))


# pdoc evaluates the annotations of a NamedTuple's generated constructor in the namespace namedtuple() made for it,
# where the names a `from __future__ import annotations` module imports do not resolve; it then shows them as
# written (`tokens: 'np.ndarray'`). A limitation of pdoc, not of the docstrings: not a problem.
_NAMEDTUPLE_INIT = re.compile(r"Error parsing type annotation .* for (?P<owner>[\w.]+)\.__init__\. Import of ")


def _namedtuple_annotation(message: str) -> bool:
  m = _NAMEDTUPLE_INIT.match(message)
  if m is None:
    return False
  try:
    owner = _resolve(m["owner"].split("."))
  except _Unimportable:
    return False
  return isinstance(owner, type) and issubclass(owner, tuple) and hasattr(owner, "_fields")


# ---------------------------------------------------------------------------------------------------------------
# The pages: every name of every `__all__`, with its signature


def page_path(out_dir: Path, module: str) -> Path:
  """pdoc's page of `module` under `out_dir` (lrl_jax.quant -> lrl_jax/quant.html)."""
  return Path(out_dir) / f"{module.replace('.', '/')}.html"


def _member_html(page: str, ident: str) -> str | None:
  """pdoc's markup of one member: from its `id` to its header link (signature and name; not the docstring)."""
  start = page.find(f'id="{ident}"')
  if start < 0:
    return None
  end = page.find(f'<a class="headerlink" href="#{ident}"></a>', start)
  return page[start : end if end >= 0 else None]


_KIND = re.compile(r'<div class="attr (\w+)">')
_TAG = re.compile(r"<[^>]+>")
_PARAM_NAME = re.compile(r"\s*\**(\w+)")


def _rendered_params(member: str) -> list[str] | None:
  """The parameter names in a member's rendered signature; None where it has no signature."""
  i = member.find('<span class="signature')
  if i < 0:
    return None
  signature = member[i:].split('<span class="return-annotation">')[0]
  # One `<span class="param">` per parameter, highlighted (`<span class="n">x</span>...`) or, where pygments gave up
  # on a default's repr, plain text (`dtype=&lt;class ...&gt;`); a bare `*` or `/` has no name.
  params = [html.unescape(_TAG.sub("", p)) for p in signature.split('<span class="param">')[1:]]
  return [m[1] for p in params if (m := _PARAM_NAME.match(p))]


def _signature_params(obj) -> list[str] | None:
  try:
    return list(inspect.signature(obj).parameters)
  except (TypeError, ValueError):  # no signature to check (a builtin's, an exception's `*args`)
    return None


def _expected_kind(obj) -> str:
  if isinstance(obj, types.ModuleType):
    return "module"
  if inspect.isclass(obj):
    return "class"
  if typing.get_origin(obj) is not None:  # a type alias (`AggMode = Literal[...]`): callable, but a variable
    return "variable"
  return "function" if callable(obj) else "variable"


def check_page(page: str, module: types.ModuleType) -> tuple[list[str], int]:
  """Checks that every name of `module.__all__` is on its page (pdoc's HTML), functions and classes with a signature.

  Returns:
    (problems, the number of names checked).
  """
  names = getattr(module, "__all__", ())
  problems = []
  for name in names:
    where = f"{module.__name__}: {name}"
    member = _member_html(page, name)
    if member is None:
      problems.append(f"{where} is in __all__ but not on the module's page")
      continue
    if not hasattr(module, name):
      problems.append(f"{where} is in __all__ but the module has no such name")
      continue
    obj = getattr(module, name)
    kind = _KIND.search(member)
    kind = kind[1] if kind else "?"
    want = _expected_kind(obj)
    if kind != want:
      problems.append(f"{where} is a {want} but the page renders it as a {kind}")
      continue
    if want not in ("function", "class"):
      continue
    params = _signature_params(obj)
    if want == "class":
      if not params:
        continue  # pdoc shows a constructor only where it takes arguments
      member = _member_html(page, f"{name}.__init__")
      if member is None:
        problems.append(f"{where} is rendered without its constructor signature ({', '.join(params)})")
        continue
    rendered = _rendered_params(member)
    if rendered is None:
      problems.append(f"{where} is rendered without its signature")
    elif params is not None and (missing := [p for p in params if p not in rendered]):
      problems.append(
        f"{where} is rendered without its parameter(s) {', '.join(missing)} (signature shows: {rendered})"
      )
  return problems, len(names)


def check_pages(out_dir: Path, packages=PACKAGES) -> tuple[list[str], int]:
  """Checks the page of each package in `packages` (see check_page); returns (problems, names checked)."""
  problems, count = [], 0
  for package in packages:
    path = page_path(out_dir, package)
    if not path.exists():
      problems.append(f"{package}: no page ({path} was not built)")
      continue
    p, n = check_page(path.read_text(encoding="utf-8"), importlib.import_module(package))
    problems += p
    count += n
  return problems, count


# ---------------------------------------------------------------------------------------------------------------
# The references: backticked dotted names of this package in the docstrings

_BACKTICKED = re.compile(r"(?<![`\w])`([^`\n]+)`(?!`)")
# A dotted name of the package, optionally called (`sampler.generate(..., group_size=G)`) and then read
# (`models.smollm2().cfg`); anything else after the name (`=`, `:`, words) means it is not a reference.
_REFERENCE = re.compile(
  rf"^(?P<name>(?:lrl_jax|{'|'.join(SHORT_NAMES)})(?:\.[A-Za-z_]\w*)+)(?:\(.*\)(?:\.[A-Za-z_][\w.]*)?)?$"
)


def _has(obj, attr: str) -> bool:
  if hasattr(obj, attr):
    return True
  if inspect.isclass(obj):  # fields without a default are not class attributes
    if dataclasses.is_dataclass(obj) and attr in {f.name for f in dataclasses.fields(obj)}:
      return True
    return any(attr in getattr(c, "__annotations__", {}) for c in obj.__mro__)
  return False


def _resolve(parts: list[str]):
  """The object a dotted path of the package names (`lrl_jax` first), or _UNRESOLVED."""
  return _lookup(importlib.import_module(parts[0]), parts[1:])


_FIELD = object()  # a class's field without a default: there, but with no value to look further into


def _lookup(obj, parts: list[str]):
  if not parts or obj is _FIELD:
    return obj
  part, rest = parts[0], parts[1:]
  candidates = [getattr(obj, part, _FIELD)] if _has(obj, part) else []
  if isinstance(obj, types.ModuleType) and hasattr(obj, "__path__"):
    # A submodule, also where the package binds its name to something else (`rl.sync`, the function of
    # `lrl_jax.rl.sync`).
    sub = f"{obj.__name__}.{part}"
    if importlib.util.find_spec(sub) is not None:
      try:
        candidates.append(importlib.import_module(sub))
      except ImportError as e:
        raise _Unimportable(sub) from e
  for candidate in candidates:
    if (found := _lookup(candidate, rest)) is not _UNRESOLVED:
      return found
  return _UNRESOLVED


def _dataclass_in(t):
  if dataclasses.is_dataclass(t):
    return t
  return next((a for a in typing.get_args(t) if dataclasses.is_dataclass(a)), None)


def _config() -> type:
  from lrl_jax.config import Config  # noqa: PLC0415 (imports the whole package; only a fallback needs it)

  return Config


def _is_config_key(parts: list[str]) -> bool:
  """Whether `parts` is a key path of the YAML config (`sampler.temperature`, `learner.correction.method`)."""
  t = _config()
  for part in parts:
    if t is None:
      return False
    fields = {f.name for f in dataclasses.fields(t)}
    if part not in fields:
      return False
    try:
      t = _dataclass_in(typing.get_type_hints(t).get(part))
    except Exception:  # an annotation that does not evaluate: the key is there, its type is unknown
      t = None
  return True


def unresolved_reference(text: str) -> str | None:
  """Why the backticked `text` is a broken reference to this package, or None (it resolves, or is no reference)."""
  m = _REFERENCE.match(text.strip())
  if m is None:
    return None
  parts = m["name"].split(".")
  full = parts if parts[0] == "lrl_jax" else ["lrl_jax", *parts]
  try:
    if _resolve(full) is not _UNRESOLVED:
      return None
  except _Unimportable:
    return None  # cannot be checked here (an optional dependency); not a problem of the docstring
  if parts[0] != "lrl_jax" and _is_config_key(parts):
    return None
  # Name the longest prefix that resolves, to say where the lookup stopped.
  i = len(full) - 1
  while i > 1 and _resolve(full[:i]) is _UNRESOLVED:
    i -= 1
  why = f"{'.'.join(full[:i])} has no {full[i]!r}"
  return why + (" and it is no config key" if parts[0] in {f.name for f in dataclasses.fields(_config())} else "")


def check_docstring(doc: str, where: str, first_line: int = 1) -> tuple[list[str], int]:
  """Checks the package references in one docstring.

  Args:
    doc: the docstring as written.
    where: the file it is in, for the messages.
    first_line: the line of the docstring's first line in that file.

  Returns:
    (problems as `file:line: reference: why`, the number of references checked).
  """
  problems, count = [], 0
  for m in _BACKTICKED.finditer(doc):
    if _REFERENCE.match(m[1].strip()) is None:
      continue
    count += 1
    why = unresolved_reference(m[1])
    if why is not None:
      line = first_line + doc.count("\n", 0, m.start())
      problems.append(f"{where}:{line}: `{m[1]}` does not resolve ({why})")
  return problems, count


def _docstrings(tree: ast.Module):
  """(text, first line) of the module's docstrings: module, class and function docstrings and the bare strings
  after assignments that pdoc shows as the variables' docstrings."""
  for node in ast.walk(tree):
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
      yield node.value.value, node.value.lineno


def source_files() -> list[Path]:
  """Every source file of the package."""
  return [path for src in SOURCES.values() for path in sorted(src.rglob("*.py"))]


def check_references(files=None) -> tuple[list[str], int]:
  """Checks the package references in the docstrings of `files` (paths; all the package's by default)."""
  problems, count = [], 0
  for path in files if files is not None else source_files():
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    for doc, line in _docstrings(tree):
      p, n = check_docstring(doc, str(rel), line)
      problems += p
      count += n
  return problems, count


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("out_dir", type=Path, help="where the HTML goes (e.g. build/api)")
  args = parser.parse_args(argv)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  t0 = time.perf_counter()
  problems = build(args.out_dir)
  pages = sorted(args.out_dir.rglob("*.html"))
  p, names = check_pages(args.out_dir)
  problems += p
  p, refs = check_references()
  problems += p
  for problem in problems:
    print(problem)
  print(
    f"API reference in {args.out_dir}/: {len(pages)} pages; {names} names of {len(PACKAGES)} packages' __all__ "
    f"checked with their signatures; {refs} docstring references checked; {len(problems)} problem(s) "
    f"({time.perf_counter() - t0:.0f} s)"
  )
  return 1 if problems else 0


if __name__ == "__main__":
  sys.exit(main())
