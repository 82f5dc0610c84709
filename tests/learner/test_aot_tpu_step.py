"""The learner step compiled for a TPU chip that is not here (`lrl-jax bench learner aot`), and what its cost counts.

`make test-aot` (CI) puts libtpu on the path; there a missing libtpu fails instead of skipping (tests/conftest.py).
"""

import pytest

from lrl_jax import models
from lrl_jax.kernels import tpu_aot
from lrl_jax.learner import LearnerConfig, bench

pytestmark = pytest.mark.aot
pytest.importorskip("libtpu", reason="libtpu (make test-aot) compiles for TPU")

# hidden 256, MLP 1024: a layer's matmuls cost 2 * (2 * 256^2 + 2 * 256 * 128 + 3 * 256 * 1024) ~ 2.0 M flops a
# token forward (0.95 G for the step's 160 trunk tokens, forward and backward). What else a layer adds to the count:
# the elementwise work on its activations (norms, SwiGLU, residuals, rotary, a softmax over <= 32 positions: ~10 k
# flops a token forward, about 3x that with the backward, ~1.5%) and AdamW on its 0.98 M parameters (~20 flops
# each: moments, bias corrections, square root, division, decay, clip scale; ~2%). Bound: 10%, twice their sum.
TINY = models.ModelConfig(
  arch="llama",
  vocab_size=512,
  hidden_size=256,
  intermediate_size=1024,
  num_layers=1,
  num_heads=4,
  num_kv_heads=2,
  head_dim=64,
  max_position_embeddings=64,
  dtype="bfloat16",
)
SHAPE = dict(batch=8, seq=32, prompt=16, group=4)


def test_unrolled_tpu_step_counts_every_layer():
  # One layer more adds that layer's matmul flops (from the shapes) to the unrolled step's cost_analysis(), plus
  # its elementwise and optimizer work (< 10%, above); the scan program counts its loop body once, so its count
  # barely moves.
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
