"""The kernels lower for TPU (Pallas -> Mosaic) and GPU (Pallas -> Triton) from this CPU machine.

`jax.export` lowers for a platform without its hardware: the Pallas lowering rules (block
shapes, op support, dtypes) run and emit the Mosaic / Triton IR. Mosaic's compile and Triton's PTX
compile are in test_aot_tpu.py / test_aot_triton.py (`make test-aot`); the numbers need the device.
"""

import re

import jax
import jax.numpy as jnp
import pytest
from jax import export

from lrl_jax import quant
from lrl_jax.kernels import BlockConfig, pallas_matmul
from lrl_jax.kernels.triton_aot import cuda_target, triton_ir

SPECS = [
  quant.Int4(group_size=32),
  quant.Int4(group_size=128),
  quant.Int4(group_size=32, scheme="minmax"),
  quant.NVFP4(),
  quant.FP8(),
  quant.FP8(granularity="block"),
  quant.MXFP8(),
]
CUSTOM_CALL = {"tpu": "tpu_custom_call", "cuda": "__gpu$xla.gpu.triton"}


CASES = [(s, 2048, 512, 3) for s in SPECS] + [(quant.Int4(), 8192, 8192, 1), (quant.NVFP4(), 8192, 8192, 16)]


@pytest.mark.parametrize("spec,k,n,m", CASES, ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize("platform", ["tpu", "cuda"])
def test_lowers(spec, k, n, m, platform):
  q = jax.eval_shape(lambda w: quant.quantize(w, spec, axis=-2), jax.ShapeDtypeStruct((k, n), jnp.float32))
  x = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
  target = "tpu" if platform == "tpu" else "gpu"
  block = BlockConfig()
  if platform == "tpu" and isinstance(spec, quant.FP8) and spec.granularity == "block":
    with pytest.raises(ValueError, match="breaks Mosaic's"):  # no legal tile: XLA path on TPU
      jax.eval_shape(lambda x, q: pallas_matmul(x, q, block=block, target=target, interpret=False), x, q)
    return
  f = jax.jit(lambda x, q: pallas_matmul(x, q, block=block, target=target, interpret=False))
  checks = [export.DisabledSafetyCheck.custom_call(CUSTOM_CALL["cuda"])]  # Triton calls carry no compat promise
  with cuda_target():  # jax >= 0.11 asks which GPU it lowers for
    exp = export.export(f, platforms=[platform], disabled_checks=checks)(x, q)
  assert f"@{CUSTOM_CALL[platform]}" in exp.mlir_module()


@pytest.mark.parametrize("m,masked", [(1, True), (3, True), (16, False), (100, True)])
def test_gpu_row_tile_overhang_is_masked(m, masked):
  """Pallas Triton does not mask a block that overhangs its array, so the kernel does: when M is not a multiple
  of the row tile, the activation loads and the partial-sum store carry a row mask in the Triton IR (x and the
  [S, M, N] partials are not padded to the tile: at M = 1 padding wrote and re-read 16 rows)."""
  q = jax.eval_shape(
    lambda w: quant.quantize(w, quant.Int4(), axis=-2), jax.ShapeDtypeStruct((4096, 4096), jnp.float32)
  )
  (ir,) = triton_ir(jax.ShapeDtypeStruct((m, 4096), jnp.bfloat16), q)
  stores = re.findall(r"tt\.store ([^:]*):", ir.ttir)
  x_loads = re.findall(r"tt\.load ([^:]*): tensor<\d+x\d+x!tt\.ptr<bf16>>", ir.ttir)
  x_loads = [ld for ld in x_loads if ld.count("%") > 0]
  assert len(stores) == 1
  n_operands = lambda s: s.count("%")
  assert n_operands(stores[0]) == (3 if masked else 2)  # ptr, value[, mask]
  x_plane_loads = [ld for ld in x_loads if n_operands(ld) == 3]  # ptr, mask, other
  assert len(x_plane_loads) == (2 if masked else 0)  # the two nibble planes of x
