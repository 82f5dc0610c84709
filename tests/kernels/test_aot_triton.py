"""The GPU kernels compile to sm_90 machine code, with resources inside the SM's limits (no GPU needed).

`make test-aot` (CI) installs the pinned `triton` and runs these with LRL_JAX_REQUIRE_AOT=1, where a
missing triton fails instead of skipping. The references are independent of this repository: `ptxas`'s own
resource report (through cuobjdump) and the per-SM limits of the CUDA C Programming Guide.
"""

import functools

import jax
import jax.numpy as jnp
import pytest

from lrl_jax import quant
from lrl_jax.kernels import dispatch
from lrl_jax.kernels import triton_aot as aot
from lrl_jax.models import init_params
from lrl_jax.sampler import SamplingConfig, generate, serve_params
from tests.kernels._aot_cases import MODELS, SAMPLER_CASES, SAMPLER_FORMATS

pytestmark = pytest.mark.aot
triton = pytest.importorskip("triton", reason="the `aot` extra (make test-aot) compiles the TTIR")

# (format, K, N, M): every format at the #3 benchmark's decode shapes, the M = 64 row tile (wgmma, the
# largest shared-memory footprint) and f32 activations (an f32 dot).
CASES = (
  [(f, 8192, 8192, 1) for f in aot.FORMATS]
  + [(f, 4096, 14336, 16) for f in aot.FORMATS]
  + [(f, 8192, 8192, 64) for f in aot.FORMATS]
)
H200 = aot.SMS[90]


@pytest.mark.parametrize("fmt,k,n,m", CASES, ids=lambda v: str(v))
def test_default_plans_compile_for_sm90_within_limits(fmt, k, n, m):
  r = aot.compile_kernel(aot.FORMATS[fmt], k, n, m, arch=90)
  assert r.local_bytes == 0, f"{fmt} spills {r.local_bytes} B per thread to local memory"
  assert r.registers <= H200.max_regs_thread
  # A margin under the 227 KiB launch limit: XLA compiles this TTIR with jaxlib's own Triton, whose
  # buffers may differ a little; a plan at the edge could fail to launch there (no fallback at run time).
  assert r.shared_bytes <= 0.9 * H200.smem_block, f"{fmt}: {r.shared_bytes} B of shared memory"
  assert r.fits and r.per_sm >= 1
  assert "bf16" in r.mma  # the dequantized tile feeds bf16 tensor-core MMAs
  assert r.programs == (r.plan.m_pad // r.plan.bm) * (n // r.plan.bn) * r.plan.split_k


@pytest.mark.parametrize("fmt", ["int4_g128", "nvfp4"])
def test_f32_activations_compile_but_spill_so_dispatch_takes_xla(fmt, monkeypatch):
  """Exact f32 has no tensor-core path: the dot becomes FMAs and ptxas spills. The kernel still compiles
  (impl="pallas" runs it), but `supported` sends f32 activations on a GPU to XLA."""
  r = aot.compile_kernel(aot.FORMATS[fmt], 4096, 4096, 3, arch=90, x_dtype=jnp.float32)
  assert r.fits and r.mma == "" and r.local_bytes > 0
  monkeypatch.setattr(dispatch, "_backend", lambda: "gpu")
  monkeypatch.setattr(dispatch, "_gpu_compute_capability", lambda: 9.0)
  q = jax.eval_shape(
    lambda w: quant.quantize(w, aot.FORMATS[fmt], axis=-2), jax.ShapeDtypeStruct((4096, 4096), jnp.float32)
  )
  s = dispatch.supported(jnp.zeros((3, 4096), jnp.float32), q)
  assert not s.pallas and "float32" in s.reason
  assert dispatch.supported(jnp.zeros((3, 4096), jnp.bfloat16), q).pallas


def test_sm80_compiles_int4_and_refuses_e4m3_as_dispatch_says(capfd, monkeypatch):
  """On an A100 (sm_80) Triton cannot convert e4m3: the NVFP4 / FP8 / MXFP8 kernels do not compile there,
  INT4 does. `supported` must agree: XLA for the former on a GPU below sm_89, Pallas for INT4."""
  assert aot.compile_kernel(aot.FORMATS["int4_g128"], 4096, 4096, 1, arch=80).fits
  monkeypatch.setattr(dispatch, "_backend", lambda: "gpu")
  monkeypatch.setattr(dispatch, "_gpu_compute_capability", lambda: 8.0)
  x = jnp.zeros((1, 4096), jnp.bfloat16)
  for fmt in ("int4_g128", "nvfp4", "fp8_channel", "mxfp8"):
    spec = aot.FORMATS[fmt]
    q = jax.eval_shape(lambda w, s=spec: quant.quantize(w, s, axis=-2), jax.ShapeDtypeStruct((4096, 4096), jnp.float32))
    if fmt == "int4_g128":
      assert dispatch.supported(x, q).pallas
      continue
    capfd.readouterr()
    with pytest.raises(Exception):
      aot.compile_kernel(spec, 4096, 4096, 1, arch=80)
    assert "f8e4m3nv is only supported on compute capability >= 89" in capfd.readouterr().err
    s = dispatch.supported(x, q)
    assert not s.pallas and "sm_89" in s.reason


@pytest.mark.parametrize(
  "regs,smem,warps,want",
  [
    (222, 50176, 4, (2, "registers")),  # 222 -> 224 regs/thread = 7168 per warp: 9 warps -> 2 programs of 4
    (107, 81920, 4, (2, "shared")),  # 112·32 = 3584 per warp: 18 warps -> 4; (80 + 1) KiB: 228 // 81 = 2
    (16, 0, 4, (16, "warps")),  # 64 resident warps / 4
    (32, 1024, 1, (32, "blocks")),
    (96, 240 * 1024, 4, (0, "shared")),  # over the 227 KiB a program may have: does not launch
  ],
)
def test_occupancy_rules(regs, smem, warps, want):
  assert aot.occupancy(H200, registers=regs, shared=smem, warps=warps) == want


def test_cli_table(capsys):
  assert aot.main(["--shapes", "4096x4096", "--m", "1", "--formats", "int4_g128,fp8_channel"]) == 0
  out = capsys.readouterr().out
  assert "| 4096x4096 | 1 | int4_g128 | 16×128×128 | 8 | 4 |" in out  # split-K 8, 4 warps
  assert "| 4096x4096 | 1 | fp8_channel | 16×128×128 | 8 | 4 |" in out


@pytest.mark.parametrize("model,fmt", SAMPLER_CASES)
def test_sampler_generate_kernels_compile_for_sm90(model, fmt, monkeypatch):
  """Every kernel the sampler launches — prefill (M = B·P rows) and decode (M = B) for each projection — as jax
  lowers `generate` for cuda with dispatch as on an H200, compiled for sm_90: no spills, shared memory with margin."""
  cfg = MODELS[model]
  monkeypatch.setattr(dispatch, "_backend", lambda: "gpu")
  monkeypatch.setattr(dispatch, "_gpu_compute_capability", lambda: 9.0)
  monkeypatch.setattr(dispatch._mm, "pallas_matmul", functools.partial(dispatch._mm.pallas_matmul, interpret=False))
  served = jax.eval_shape(lambda: serve_params(init_params(cfg, jax.random.key(0)), SAMPLER_FORMATS[fmt]))
  b, p = 8, 32
  sampling = SamplingConfig(max_new_tokens=4)
  fn = lambda params, prompts, valid: generate(params, prompts, valid, cfg, sampling, jax.random.key(0))
  irs = aot.lowered_triton_irs(
    fn, served, jax.ShapeDtypeStruct((b, p), jnp.int32), jax.ShapeDtypeStruct((b, p), jnp.bool_)
  )
  assert len(irs) == 14  # 7 projections in the scanned layer body, for prefill and for decode
  assert {ir.num_warps for ir in irs} == {4, 8}  # decode (16-row tile) and prefill (64-row tiles)
  for ir in irs:
    res, _ = aot.compile_ir(ir, arch=90)
    assert res["local_bytes"] == 0, f"{ir.name} ({ir.num_warps} warps) spills {res['local_bytes']} B"
    assert res["shared_bytes"] <= 0.9 * H200.smem_block and res["registers"] <= H200.max_regs_thread


def test_w4a16_loop_has_no_converts_and_no_shared_memory_round_trip():
  """The W4A16 main loop as compiled for sm_90: the nibbles become bf16 by bit operations (no I2F, a quarter-rate
  instruction), the decoded weights stay in registers as wgmma's A operand (few shared-memory instructions), and
  the static roofline puts the loop within ~2.2x of HBM's time at M = 1 (kernels/README.md, "Instruction mix")."""
  r = aot.compile_kernel(aot.FORMATS["int4_g128"], 8192, 8192, 1, arch=90)
  ops = r.mix["ops"]
  assert ops.get("I2F", 0) == 0 and ops.get("F2F", 0) == 0
  assert "wgmma" in r.mma
  md = r.model
  assert md.per_weight["conv"] == 0 and md.per_weight["mio"] < 0.6
  assert md.hbm_fraction >= 0.4, f"{md}"
  # Before (an f32 decode with an int -> float convert per weight, ŵ as the dot's right operand): 128 I2F and
  # 227 shared-memory instructions per thread per chunk, ~1 convert and 1.8 shared-memory instructions per weight.


def test_nvfp4_loop_decodes_in_bf16_without_select_chains():
  """NVFP4's main loop on sm_90: E2M1 built in bf16 (`_e2m1_bf16`) and e2m1 · s_b multiplied there; by the static
  roofline about 13.7 instructions per weight (27 % of HBM at M = 1), where the select-chain f32 decode took 22.9
  (17 %: slower than the bf16 matmul it replaces)."""
  r = aot.compile_kernel(aot.FORMATS["nvfp4"], 8192, 8192, 1, arch=90)
  md = r.model
  assert md.per_weight["issue"] < 16 and md.per_weight["int"] < 8.5, f"{md.per_weight}"
  assert md.hbm_fraction >= 0.24, f"{md}"
