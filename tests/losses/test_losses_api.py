"""The public face of lrl_jax.losses: `__all__`, docstrings, and its dependency rule."""

import ast
import pathlib

import lrl_jax.losses as L

ALLOWED_ROOTS = {"__future__", "jax", "numpy", "flax", "typing", "math", "lrl_jax"}


def test_depends_only_on_jax_numpy_flax_struct():
  """`losses` depends on nothing but jax (DESIGN.md): no other lrl_jax package, only flax.struct."""
  root = pathlib.Path(L.__file__).parent
  for path in root.glob("*.py"):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        mods = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        mods = [node.module or ""]
      else:
        continue
      for mod in mods:
        assert mod.split(".")[0] in ALLOWED_ROOTS, (path.name, mod)
        if mod.startswith("lrl_jax"):
          assert mod.startswith("lrl_jax.losses"), (path.name, mod)
        if mod.startswith("flax"):
          assert mod == "flax.struct", (path.name, mod)


def test_all_is_exported_and_documented():
  for name in L.__all__:
    obj = getattr(L, name)
    if callable(obj) and not isinstance(obj, type(L.AggMode)):
      assert obj.__doc__ and len(obj.__doc__.strip()) > 20, name
