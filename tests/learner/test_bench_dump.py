"""`lrl-jax bench learner memory --dump`: XLA's dumps of the compiled step, and the bytes live at its peak read from
the buffer assignment (`bench.live_at_peak`)."""

import pytest
from _learner_util import tiny_cfg

from lrl_jax.learner import LearnerConfig, bench


@pytest.mark.parametrize("opt", ["float32", "fp8"])
def test_live_at_the_peak_is_within_the_compiled_peak(tmp_path, opt):
  # The compiled peak (arguments + temporaries + outputs − aliased) is the size of the buffer assignment's
  # allocations, so the bytes live at any one point, each counted once, are at most that: exact byte counts, no
  # tolerance. Summing the listed values instead broke it: at Qwen2.5-7B shapes (`bench learner memory --dump`,
  # 143.3 GiB against a 141.9 GiB peak: values sharing a buffer) and on the v5e target of test_aot_tpu_step.py (VMEM).
  roll = bench.abstract_rollout(8, 32, 16, 4)
  cfg = LearnerConfig(lr=1e-6, compute_dtype="bfloat16", opt_state_dtype=opt)
  m = bench.step_memory(tiny_cfg(), cfg, roll, dump=str(tmp_path))
  assert list(tmp_path.glob("*train_step*after_optimizations-live-range.txt"))
  live, values = bench.live_at_peak(str(tmp_path))
  assert values[0][1] <= live <= m["peak_bytes"], (values[0], m)
  assert [b for _, b in values] == sorted((b for _, b in values), reverse=True)


def test_live_at_peak_names_the_folder_without_a_dump(tmp_path):
  with pytest.raises(FileNotFoundError, match=str(tmp_path)):
    bench.live_at_peak(str(tmp_path))
