"""The benchmark runs on CPU and counts bytes right; the tile plans of its shapes obey each target's rules."""

import pytest

from lrl_jax import quant
from lrl_jax.kernels import bench
from lrl_jax.kernels.blocks import DEFAULTS, BlockConfig, plan


def test_bench_main_on_cpu(capsys):
  assert (
    bench.main(
      ["--shapes", "256x256", "--m", "1,3", "--iters", "1", "--warmup", "1", "--formats", "int4_g128,fp8_channel"]
    )
    == 0
  )
  out = capsys.readouterr().out
  assert "accelerator (Pallas) rows were NOT measured" in out
  assert out.count("| bf16 dot |") == 2


def test_bench_rows_bytes_and_speedup():
  rows = bench.run(shapes=((256, 512),), ms=(3,), formats=("int4_g128", "nvfp4"), iters=1, warmup=1)
  by = {(r.fmt, r.path): r for r in rows}
  x_bytes = 3 * 256 * 2
  assert by["bf16", "bf16 dot"].bytes_read == 256 * 512 * 2 + x_bytes
  # INT4 g128: K/2·N code bytes + K/128·N bf16 scales; NVFP4: K/2·N + K/16·N e4m3 scales + one f32.
  assert by["int4_g128", "xla"].bytes_read == 128 * 512 + 2 * 512 * 2 + x_bytes
  assert by["nvfp4", "xla"].bytes_read == 128 * 512 + 16 * 512 + 4 + x_bytes
  r = by["int4_g128", "xla"]
  assert r.speedup == pytest.approx(by["bf16", "bf16 dot"].seconds / r.seconds)
  assert by["int4_g128", "pallas"].seconds is None and "not measured" in by["int4_g128", "pallas"].note


@pytest.mark.parametrize("target", ["gpu", "tpu"])
@pytest.mark.parametrize("fmt", list(bench.FORMATS))
def test_benchmark_shapes_have_legal_plans(fmt, target):
  spec = bench.FORMATS[fmt]
  for k, n in bench.SHAPES_ALL:
    for m in bench.M_ALL:
      p = plan(m, k, n, spec, BlockConfig(), target)
      assert p.m_pad % p.bm == 0 and p.m_pad >= m and n % p.bn == 0 and k % (p.bk * p.split_k) == 0
      assert p.bk % p.kg == 0 or p.kg == k
      if target == "gpu":
        rows = p.bk // (2 if p.packed else 1)
        assert all(v & (v - 1) == 0 and v >= 16 for v in (p.bm, p.bn, rows))
        assert p.bn <= DEFAULTS["gpu"]["bn"] and p.bk <= DEFAULTS["gpu"]["bk"]
      else:
        assert p.bn % 128 == 0 and (p.bk // (2 if p.packed else 1)) % 128 == 0
        assert (p.bk // p.kg) % 8 == 0 or p.kg == k
        assert p.split_k == 1 and p.schedule == "k_grid"


def test_split_k_heuristic_fills_the_gpu_at_decode():
  # M = 1, 8192 x 8192, INT4: 64 column tiles of 128 -> split K in 4 (256 programs <= 2 waves of 132 SMs).
  p = plan(1, 8192, 8192, quant.Int4(), BlockConfig(), "gpu")
  assert (p.bn, p.bk, p.split_k, p.bm, p.num_warps) == (128, 128, 4, 16, 4)
  p = plan(128, 8192, 8192, quant.Int4(), BlockConfig(), "gpu")
  assert p.split_k * (128 // p.bm) * (8192 // p.bn) <= 264
  assert (p.bm, p.num_warps) == (64, 8)  # the 64-row tile gets 8 warps (spill-free on sm_90, README.md)
  assert plan(128, 8192, 8192, quant.Int4(), BlockConfig(num_warps=2), "gpu").num_warps == 2


def test_tpu_refuses_k_without_a_legal_chunk():
  # 11008 = 2^8 · 43: no chunk holds a multiple of 8 groups of 128, and all of K would crowd VMEM.
  with pytest.raises(ValueError, match="no legal tile divides K=11008"):
    plan(1, 11008, 4096, quant.Int4(group_size=128), BlockConfig(), "tpu")
  p = plan(1, 11008, 4096, quant.Int4(group_size=128), BlockConfig(), "gpu")
  assert (p.bk, p.split_k) == (128, 2)  # 11008 / 2 = 5504 = 43 chunks of 128; a split in 4 would not divide


def test_tpu_8bit_scales_take_blocks_of_32_rows():
  """Mosaic tiles 8-bit arrays (32, 128) in memory: NVFP4's e4m3 and MXFP8's e8m0 scale blocks need 32k rows
  (a (48, 576) block of SmolLM2's [96, 576] NVFP4 scales failed to compile: test_aot_tpu.py). bf16 INT4 scales
  keep the 8-row rule."""
  p = plan(16, 1536, 576, quant.NVFP4(), BlockConfig(), "tpu")
  assert (p.bk, (p.bk // 16) % 32) == (512, 0)
  p = plan(16, 1536, 576, quant.MXFP8(), BlockConfig(), "tpu")
  assert p.bk == 1536  # 32-row blocks of 32-element groups need bk = 1024, which does not divide 1536: all of K
  assert plan(16, 1536, 576, quant.Int4(group_size=64), BlockConfig(), "tpu").bk == 512  # 8 bf16 scale rows


def test_a_failing_kernel_costs_only_its_own_rows(monkeypatch):
  """On the one device run, a kernel that does not compile (the Mosaic GPU kernel has only been lowered) gets a
  "failed" row and a FAILED line; the Triton and XLA rows of the same shape are still timed."""
  from lrl_jax.kernels import xla_matmul  # pylint: disable=g-import-not-at-top

  def fake_kernel(x, q, *, block, target, interpret):
    del block, interpret
    if target == "mosaic_gpu":
      raise RuntimeError("Mosaic GPU compile failed (simulated)")
    return xla_matmul(x, q)

  monkeypatch.setattr(bench.jax, "default_backend", lambda: "gpu")
  monkeypatch.setattr(bench, "_gpu_compute_capability", lambda: 9.0)
  monkeypatch.setattr(bench, "triton_available", lambda: True)
  monkeypatch.setattr(bench, "pallas_matmul", fake_kernel)
  seen = []

  def fake_linear(x, w, *, split_k, interpret):
    del interpret
    seen.append((w.shape, w.axis, split_k))  # the weight in the nn.Linear layout
    from lrl_jax.kernels.linear import xla_linear  # pylint: disable=g-import-not-at-top

    return xla_linear(x, w)

  monkeypatch.setattr(bench, "mosaic_linear", fake_linear)
  rows = bench.run(shapes=((256, 512),), ms=(1,), formats=("int4_g128",), iters=1, warmup=1, linear_split_k=2)
  by = {r.path: r for r in rows if r.fmt == "int4_g128"}
  assert set(by) == {"xla", "pallas", "mosaic", "linear"}
  assert seen[0] == ((512, 256), -1, 2) and by["linear"].seconds is not None
  assert by["linear"].bytes_read == by["xla"].bytes_read
  assert by["pallas"].seconds is not None and by["xla"].seconds is not None
  assert by["mosaic"].seconds is None and by["mosaic"].note.startswith("failed: RuntimeError")
