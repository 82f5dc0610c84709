"""The notebooks in notebooks/: stored without outputs, and each executes headless (LRL_NB_SMALL=1)."""

import json
import os
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# ~50 s each under -n 2: `make test-slow` runs them; 01 (the numerics) and 03 (the kernels) run in the default suite
SLOW: set[str] = {"02_mismatch.ipynb", "04_rl_run.ipynb"}


def test_notebooks_exist():
  names = {p.name for p in NOTEBOOKS}
  assert {"01_numerics.ipynb", "02_mismatch.ipynb", "03_kernels.ipynb", "04_rl_run.ipynb"} <= names, names


def _dirty_cells(nb) -> list[int]:
  """Indices of code cells that carry outputs or an execution count."""
  return [
    i
    for i, c in enumerate(nb.cells)
    if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count") is not None)
  ]


def test_dirty_cell_check_catches_outputs_and_counts():
  nb = nbformat.v4.new_notebook()
  nb.cells = [
    nbformat.v4.new_code_cell("1"),
    nbformat.v4.new_code_cell("2"),
    nbformat.v4.new_code_cell("3"),
    nbformat.v4.new_markdown_cell("x"),
  ]
  nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="2")]
  nb.cells[2].execution_count = 7
  assert _dirty_cells(nb) == [1, 2]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_outputs_stripped(path):
  nb = nbformat.read(path, as_version=4)
  dirty = _dirty_cells(nb)
  assert not dirty, f"{path.name}: cells {dirty} carry outputs or execution counts; run `python notebooks/_make.py`"


@pytest.mark.parametrize(
  "path", [pytest.param(p, marks=pytest.mark.slow) if p.name in SLOW else p for p in NOTEBOOKS], ids=lambda p: p.name
)
def test_notebook_executes(path, tmp_path, monkeypatch):
  pytest.importorskip("ipykernel")
  pytest.importorskip("matplotlib")
  nb = nbformat.read(path, as_version=4)
  monkeypatch.setenv("LRL_NB_SMALL", "1")  # the kernel inherits this process's environment
  monkeypatch.setenv("MPLBACKEND", "Agg")
  # conftest's 8 fake host devices are not wanted in the kernel (a notebook runs as a user's would); its other
  # XLA flags (the faster compile) are
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform")]
  if flags:
    monkeypatch.setenv("XLA_FLAGS", " ".join(flags))
  else:
    monkeypatch.delenv("XLA_FLAGS", raising=False)
  # Kernel "python3" must run THIS interpreter (the venv with lrl_jax), whatever kernelspecs the machine has:
  # a spec in JUPYTER_PATH takes precedence over user / system ones. The notebook's cwd is the repo root.
  spec_dir = tmp_path / "jupyter" / "kernels" / "python3"
  spec_dir.mkdir(parents=True)
  (spec_dir / "kernel.json").write_text(
    json.dumps(
      {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (lrl_jax tests)",
        "language": "python",
      }
    )
  )
  monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
  client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}})
  client.execute()  # raises CellExecutionError (with the failing cell and its traceback)
  errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.get("output_type") == "error"]
  assert not errors
