"""The learner step compiled by XLA:GPU for an H100 that is not here (`lrl-jax bench learner aot --gpu h100`).

`make test-aot` (CI) puts jax's CUDA plugin on the path; there a missing plugin fails instead of skipping
(tests/conftest.py).
"""

import jax
import numpy as np
import pytest
from _learner_util import AOT_SHAPE as SHAPE
from _learner_util import AOT_TINY as TINY

from lrl_jax.learner import LearnerConfig, bench
from lrl_jax.learner.state import create_train_state

pytestmark = pytest.mark.aot
pytest.importorskip("jax_plugins.xla_cuda13", reason="jax's CUDA plugin (make test-aot) compiles for the GPU")

from lrl_jax.kernels import gpu_aot  # noqa: E402

CFG = LearnerConfig(lr=1e-6, compute_dtype="bfloat16")


def _nbytes(tree) -> int:
  return sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in jax.tree.leaves(tree))


def test_gpu_target_describes_the_card():
  h100 = gpu_aot.TARGETS["h100"]
  # XLA computes a card's bandwidth from the driver's memory clock and bus width; H100 SXM: 3.35 TB/s
  assert h100.bandwidth == 2 * 2619 * 10**6 * 5120 // 8 == 3_352_320_000_000
  dev = gpu_aot.chip("h100").device_set.pop()
  assert dev.device_kind == h100.name
  with pytest.raises(ValueError, match="unknown GPU target 'a100'"):
    gpu_aot.chip("a100")


def test_gpu_step_takes_the_state_and_the_rollout_and_counts_each_layer():
  # The compiled step's arguments are the train state and the rollout, byte for byte (no padding on the GPU). One
  # layer more moves at least what AdamW must move for that layer's parameters: read the f32 gradient, read and
  # write the parameter and both moments, 28 bytes a parameter (its forward and backward move more, not counted).
  sharding = gpu_aot.chip("h100")
  roll = bench.abstract_rollout(**SHAPE)
  runs = {}
  for layers in (1, 2):
    mc = TINY.replace(num_layers=layers)
    m = bench.step_memory(mc, CFG, roll, sharding=sharding, count_bytes=True)
    state = jax.eval_shape(lambda k, mc=mc: create_train_state(k, mc, CFG), jax.ShapeDtypeStruct((2,), np.uint32))
    assert m["argument_bytes"] == _nbytes(state) + _nbytes(roll), (m, _nbytes(state), _nbytes(roll))
    assert m["argument_bytes"] <= m["peak_bytes"] <= gpu_aot.TARGETS["h100"].memory_bytes
    assert np.isnan(m["bytes_accessed"])  # no cost_analysis() for a deviceless GPU executable: program_bytes instead
    runs[layers] = m
  h, f = TINY.hidden_size, TINY.intermediate_size
  kv = TINY.num_kv_heads * TINY.head_dim
  layer_params = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h  # q, o; k, v; gate, up, down; two norms
  assert runs[2]["program_bytes"] - runs[1]["program_bytes"] >= 28 * layer_params, (runs, layer_params)


def test_gpu_step_is_compiled_by_xla_gpu_and_dumps_its_buffers(tmp_path):
  # The dots are XLA:GPU's (Triton gemm fusions or cuBLAS calls), not XLA:CPU's; the bytes live at the peak, each
  # counted once, are at most the compiled peak.
  sharding = gpu_aot.chip("h100")
  roll = bench.abstract_rollout(**SHAPE)
  m = bench.step_memory(TINY, CFG, roll, sharding=sharding, dump=str(tmp_path))
  live, _ = bench.live_at_peak(str(tmp_path))
  assert 0 < live <= m["peak_bytes"], (live, m)
  hlo = "\n".join(p.read_text() for p in tmp_path.glob("*train_step*after_optimizations.txt"))
  assert "__triton_nested_gemm_fusion" in hlo or "__cublas$gemm" in hlo


@pytest.mark.parametrize(
  "technique", ["baseline (f32 Adam, no remat, logits whole)", "all: fp8 moments + full remat + chunks"]
)
def test_gpu_step_skips_by_select_cheaper_than_by_branch(monkeypatch, technique):
  # Why `step._update_if` takes the select on CUDA: XLA:GPU copies every leaf a conditional passes through or returns,
  # so the conditional's step peaks higher and moves more bytes (the costliest branch counted, XLA's rule). At
  # SmolLM2's shapes: 3.51 -> 2.64 GiB, 25.3 -> 20.9 GB (f32 Adam); 2.47 -> 1.60 GiB, 30.3 -> 27.2 GB (all three).
  from lrl_jax.learner import step

  cfg = bench.technique_config(technique)
  roll, sharding = bench.abstract_rollout(**SHAPE), gpu_aot.chip("h100")
  select = bench.step_memory(TINY, cfg, roll, sharding=sharding, count_bytes=True)
  monkeypatch.setattr(step, "_update_if", step._update_by_branch)
  jax.clear_caches()  # the step traced with the select is cached under the same arguments
  branch = bench.step_memory(TINY, cfg, roll, sharding=sharding, count_bytes=True)
  jax.clear_caches()
  assert select["peak_bytes"] < branch["peak_bytes"], (select, branch)
  assert select["program_bytes"] < branch["program_bytes"], (select, branch)
