"""lrl_jax.kernels — low-bit matmuls that read QArray codes directly.

`qmatmul(x, q)` computes `quant.qdot(x, q)` (x @ dequantize(q, x.dtype); NVFP4's per-matrix scale after
the sum) for a weight QArray q of logical
shape [K, N] quantized along its contraction axis (axis=-2): a Pallas kernel on TPU / GPU
when `supported(x, q)` says so, the XLA dequantize-then-dot otherwise (and on CPU).
`w4a16_matmul`, `nvfp4_matmul` and `fp8_matmul` call the kernels directly. `qlinear(x, w)` is the same
product for a weight in the nn.Linear layout [N, K] (`linear_layout(q)`), whose Hopper kernel decodes the
weights in registers as the tensor cores' left operand. `predecode_params` decodes a served tree once for a
compute-bound backend (CPU), where decoding every weight at every decode step costs more than the matmul. See
README.md.
"""

from lrl_jax.kernels.blocks import BlockConfig, Unsupported
from lrl_jax.kernels.dispatch import Support, qmatmul, supported, xla_matmul
from lrl_jax.kernels.linear import linear_layout, qlinear, supported_linear, xla_linear
from lrl_jax.kernels.matmul import fp8_matmul, nvfp4_matmul, pallas_matmul, w4a16_matmul
from lrl_jax.kernels.predecode import (
  Predecoded,
  dense_dot,
  predecode,
  predecode_by_default,
  predecode_params,
  predecoded_dot,
)

__all__ = [
  "qmatmul",
  "supported",
  "Support",
  "xla_matmul",
  "qlinear",
  "linear_layout",
  "supported_linear",
  "xla_linear",
  "w4a16_matmul",
  "nvfp4_matmul",
  "fp8_matmul",
  "pallas_matmul",
  "BlockConfig",
  "Unsupported",
  "Predecoded",
  "predecode",
  "predecode_params",
  "predecoded_dot",
  "predecode_by_default",
  "dense_dot",
]
