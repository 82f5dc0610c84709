"""Test-wide settings: 8 simulated CPU devices (for sharding tests) and strict rank promotion."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")

import pytest  # noqa: E402


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  """Under LRL_JAX_REQUIRE_REF=1 (`make test-ref`, CI) a skipped reference test is a failure:
  a missing torch / transformers must never hide a parity failure."""
  outcome = yield
  report = outcome.get_result()
  if report.skipped and item.get_closest_marker("ref") and os.environ.get("LRL_JAX_REQUIRE_REF") == "1":
    report.outcome = "failed"
    report.longrepr = f"reference test skipped under LRL_JAX_REQUIRE_REF=1: {report.longrepr}"
