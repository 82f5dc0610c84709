"""lrl_jax.quant — the numerics contract shared by the learner (fake quant) and the sampler (real codes).

Formats: `Int4` (W4A16, slime / compressed-tensors), `FP8` (E4M3, channel/token/block),
`MXFP8` (OCP microscaling), `NVFP4` (E2M1 + E4M3 per 16 + FP32 per tensor), `NVFP4WAG` (the learner's NVFP4
weights, activations and gradients: `nvfp4_wag_matmul`, NVIDIA's NVFP4 training recipe).
`fake_quant(x, spec) == dequantize(quantize(x, spec), x.dtype)` bit for bit.
`qdot(x, q)`: the one definition of a matmul on a QArray (NVFP4: its per-matrix scale after the K sum), which
the sampler's kernels and the learner's QAT dot both compute.
"""

from lrl_jax.quant.aqt import aqt_fake_quant, dot_general_for
from lrl_jax.quant.debug import check_finite, checked
from lrl_jax.quant.dot import qdot
from lrl_jax.quant.init import grid_residual, int4_aware_init, next_token_kl, policy_jolt
from lrl_jax.quant.optim import int4_group_steps, int4_update_clip
from lrl_jax.quant.packing import (
  pack_int4_compressed_tensors,
  pack_nibbles,
  unpack_int4_compressed_tensors,
  unpack_nibbles,
)
from lrl_jax.quant.qarray import (
  QArray,
  check_spec,
  dequantize,
  fake_quant,
  learned_fake_quant,
  nvfp4_operand,
  quantize,
  tree_nbytes,
)
from lrl_jax.quant.rules import (
  DEFAULT_TARGETS,
  SCALE_SUFFIX,
  ZERO_SUFFIX,
  QuantRules,
  dequantize_params,
  fake_quant_params,
  init_learned,
  path_str,
  quantize_params,
)
from lrl_jax.quant.specs import FP8, MXFP8, NVFP4, NVFP4WAG, Int4, Spec
from lrl_jax.quant.wag import (
  hadamard16,
  nvfp4_activations,
  nvfp4_blocks,
  nvfp4_wag_matmul,
  rht,
  sr_e2m1,
  wag_draws,
)

__all__ = [
  "Int4",
  "FP8",
  "MXFP8",
  "NVFP4",
  "NVFP4WAG",
  "Spec",
  "QArray",
  "tree_nbytes",
  "quantize",
  "dequantize",
  "fake_quant",
  "learned_fake_quant",
  "nvfp4_operand",
  "check_spec",
  "qdot",
  "dot_general_for",
  "aqt_fake_quant",
  "check_finite",
  "checked",
  "QuantRules",
  "DEFAULT_TARGETS",
  "quantize_params",
  "fake_quant_params",
  "dequantize_params",
  "path_str",
  "init_learned",
  "SCALE_SUFFIX",
  "ZERO_SUFFIX",
  "pack_nibbles",
  "unpack_nibbles",
  "pack_int4_compressed_tensors",
  "unpack_int4_compressed_tensors",
  "int4_update_clip",
  "int4_group_steps",
  "int4_aware_init",
  "grid_residual",
  "next_token_kl",
  "policy_jolt",
  "nvfp4_wag_matmul",
  "nvfp4_blocks",
  "nvfp4_activations",
  "sr_e2m1",
  "hadamard16",
  "rht",
  "wag_draws",
]
