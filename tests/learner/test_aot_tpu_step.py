"""The learner step compiled for a TPU chip that is not here (`lrl-jax bench learner aot`), and what its cost counts.

`make test-aot` (CI) puts libtpu on the path; there a missing libtpu fails instead of skipping (tests/conftest.py).
"""

import pytest
from _learner_util import AOT_SHAPE as SHAPE
from _learner_util import AOT_TINY as TINY

from lrl_jax.kernels import tpu_aot
from lrl_jax.learner import LearnerConfig, bench

pytestmark = pytest.mark.aot
pytest.importorskip("libtpu", reason="libtpu (make test-aot) compiles for TPU")


def test_unrolled_tpu_step_counts_every_layer():
  # One layer more adds that layer's matmul flops (from the shapes) to the unrolled step's cost_analysis(), plus
  # its elementwise and optimizer work (< 10%: `_learner_util.AOT_TINY`); the scan program counts its loop body
  # once, so its count barely moves.
  chip = tpu_aot.chip("v5e:2x2")
  roll = bench.abstract_rollout(**SHAPE)
  cfg = LearnerConfig(lr=1e-6, compute_dtype="bfloat16")

  def flops(layers, unroll):
    mc = TINY.replace(num_layers=layers)
    return bench.step_memory(mc, cfg, roll, sharding=chip, unroll=unroll)["flops"]

  per_layer = bench.matmul_flops(TINY.replace(num_layers=2), **SHAPE) - bench.matmul_flops(TINY, **SHAPE)
  unrolled = flops(2, True) - flops(1, True)
  assert per_layer <= unrolled <= 1.10 * per_layer, (unrolled, per_layer)
  assert flops(2, False) - flops(1, False) < 0.5 * per_layer


def test_tpu_step_dumps_its_buffer_assignment(tmp_path):
  # libtpu refuses XLA_FLAGS' --xla_dump_to; per compile (`compiler_options`) it writes the dumps. The bytes live at
  # the peak in HBM, each counted once, are at most the compiled peak (its allocations; VMEM values left out).
  chip = tpu_aot.chip("v5e:2x2")
  roll = bench.abstract_rollout(**SHAPE)
  m = bench.step_memory(TINY, LearnerConfig(lr=1e-6, compute_dtype="bfloat16"), roll, sharding=chip, dump=str(tmp_path))
  live, _ = bench.live_at_peak(str(tmp_path))
  assert 0 < live <= m["peak_bytes"], (live, m)
