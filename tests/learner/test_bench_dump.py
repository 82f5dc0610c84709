"""`lrl-jax bench learner memory --dump`: XLA's dumps of the compiled step, and the bytes live at its peak read from
the buffer assignment (`bench.live_at_peak`)."""

import pytest

from lrl_jax import models
from lrl_jax.learner import LearnerConfig, bench

TINY = models.ModelConfig(
  arch="llama",
  vocab_size=512,
  hidden_size=128,
  intermediate_size=256,
  num_layers=2,
  num_heads=4,
  num_kv_heads=2,
  head_dim=32,
  max_position_embeddings=64,
  dtype="bfloat16",
)


@pytest.mark.parametrize("opt", ["float32", "fp8"])
def test_live_at_the_peak_lies_between_the_arguments_and_the_compiled_peak(tmp_path, opt):
  # Every argument (the state, the rollout) is live when the program starts, so the largest live set holds at least
  # their bytes; the compiled peak (arguments + temporaries + outputs − aliased) holds every live value at once, so
  # it is at least the largest live set. Both are byte counts of the same buffers: exact, no tolerance.
  roll = bench.abstract_rollout(8, 32, 16, 4)
  cfg = LearnerConfig(lr=1e-6, compute_dtype="bfloat16", opt_state_dtype=opt)
  m = bench.step_memory(TINY, cfg, roll, dump=str(tmp_path))
  assert list(tmp_path.glob("*train_step*after_optimizations-live-range.txt"))
  assert m["argument_bytes"] <= m["live_peak_bytes"] <= m["peak_bytes"], m
  live, values = bench.live_at_peak(str(tmp_path))
  assert live == m["live_peak_bytes"] and live == sum(b for _, b in values)
  assert [b for _, b in values] == sorted((b for _, b in values), reverse=True)


def test_live_at_peak_names_the_folder_without_a_dump(tmp_path):
  with pytest.raises(FileNotFoundError, match=str(tmp_path)):
    bench.live_at_peak(str(tmp_path))
