"""Test-wide settings: 8 simulated CPU devices (for sharding tests), strict rank promotion, a faster XLA compile."""

import importlib.machinery
import importlib.util
import os
import sys

# The repository root is on sys.path (for `tests.*`; pytest puts it first before each test module, so does `python
# -m`). It holds `kernels/`, the source of `lrl_jax.kernels`, which shadows the PyPI package `kernels` that
# transformers >= 5.25 requires and imports (`from kernels import CUDAProperties`: an ImportError in every reference
# test). Where that package is installed it is imported here, from sys.path without the root, so `kernels` is it.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.machinery.PathFinder.find_spec(
  "kernels", [p for p in sys.path if os.path.abspath(p or os.curdir) != _ROOT]
)
if _spec is not None and "kernels" not in sys.modules:
  sys.modules["kernels"] = importlib.util.module_from_spec(_spec)
  try:
    _spec.loader.exec_module(sys.modules["kernels"])
  except Exception:  # a broken install: leave it to transformers to fail on it (the reference tests), not every test
    del sys.modules["kernels"]

# The device and ahead-of-time runs keep XLA's defaults: their compiles are the thing tested.
_CPU_RUN = os.environ.get("LRL_JAX_REQUIRE_DEVICE") != "1" and os.environ.get("LRL_JAX_REQUIRE_AOT") != "1"
_XLA_FLAGS = "--xla_force_host_platform_device_count=8"
if _CPU_RUN:
  # CPU runs: LLVM at -O0 (XLA's own HLO passes, fusion included, still run). Compiling, not running, is what
  # the suite's tiny programs spend their time on, and -O0 compiles them about 2x faster.
  _XLA_FLAGS += " --xla_backend_optimization_level=0"
  # glibc returns freed memory to the kernel (`lrl_jax.hostmem` off): its one shared arena slows the multi-threaded
  # compiles the suite spends its time on (~9%); the suite's numbers do not depend on it, and test_hostmem sets it.
  os.environ.setdefault("LRL_JAX_KEEP_HOST_MEMORY", "0")
os.environ.setdefault("XLA_FLAGS", _XLA_FLAGS)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")

import pytest  # noqa: E402

# Reference-only modules import torch at module level. Without torch (the default `make test` venv) they
# are not collected at all rather than reported as skipped; `make test-ref` installs torch and runs them,
# and there (LRL_JAX_REQUIRE_REF=1) nothing is ignored, so a missing torch fails loudly.
collect_ignore = []
if os.environ.get("LRL_JAX_REQUIRE_REF") != "1" and importlib.util.find_spec("torch") is None:
  collect_ignore.append("models/test_parity_ref.py")
# Ahead-of-time compiles for GPU (the `aot` extra: triton; jax's CUDA plugin) and TPU (libtpu), which `make
# test-aot` puts on the path: without them (the default venv) the modules are not collected; under
# LRL_JAX_REQUIRE_AOT=1 (`make test-aot`, CI) nothing is ignored and a skip is a failure.
if os.environ.get("LRL_JAX_REQUIRE_AOT") != "1":
  if importlib.util.find_spec("triton") is None:
    collect_ignore.append("kernels/test_aot_triton.py")
  if importlib.util.find_spec("libtpu") is None:
    collect_ignore += ["kernels/test_aot_tpu.py", "learner/test_aot_tpu_step.py"]
  if importlib.util.find_spec("jax_plugins") is None or importlib.util.find_spec("jax_plugins.xla_cuda13") is None:
    collect_ignore.append("learner/test_aot_gpu_step.py")
# Compiled-kernel tests need a GPU / TPU: collected only when asked for (scripts/device_check.sh sets
# LRL_JAX_REQUIRE_DEVICE=1; there a CPU-only backend is an error, not a skip).
if os.environ.get("LRL_JAX_REQUIRE_DEVICE") != "1":
  collect_ignore.append("device")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  """Under LRL_JAX_REQUIRE_REF=1 (`make test-ref`, CI) a skipped reference test is a failure:
  a missing torch / transformers must never hide a parity failure."""
  outcome = yield
  report = outcome.get_result()
  if report.skipped and item.get_closest_marker("ref") and os.environ.get("LRL_JAX_REQUIRE_REF") == "1":
    report.outcome = "failed"
    report.longrepr = f"reference test skipped under LRL_JAX_REQUIRE_REF=1: {report.longrepr}"
  if report.skipped and item.get_closest_marker("aot") and os.environ.get("LRL_JAX_REQUIRE_AOT") == "1":
    report.outcome = "failed"
    report.longrepr = f"ahead-of-time compile test skipped under LRL_JAX_REQUIRE_AOT=1: {report.longrepr}"


@pytest.fixture(autouse=True, scope="module")
def _free_executables():
  """jax's compiled programs are dropped after each test module (`jax.clear_caches`). Each XLA:CPU executable holds
  three memory mappings of its code; a worker that kept every program it compiled passed the kernel's limit of
  65530 mappings (vm.max_map_count) late in the suite, and the next compile died of a segmentation fault."""
  yield
  jax.clear_caches()


def pytest_collection_modifyitems(config, items):
  """The notebooks first: they are the longest tests (20-45 s each under -n 2), and collected last they left
  one xdist worker idle while the other finished them."""
  items.sort(key=lambda item: item.path.name != "test_notebooks.py")  # stable: every other order is kept
