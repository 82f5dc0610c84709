"""lrl_jax.models — the decoder (Llama / Qwen2 / Qwen3), LoRA adapters, logical axes, HF / GGUF I/O.

`forward(params, tokens_BT, cfg, ...)` is one functional forward pass over a plain parameter
tree (see `decoder.py` for the table of paths and shapes); kernels may be float arrays (learner,
optionally fake-quantized by `qat_rules`) or `quant.QArray`s (sampler). `logits(params, tokens_BT, cfg)` is the
same pass jitted, without a cache, returning the logits only.

Every loader (`load_hf`, `load_gguf`, `smollm2`, `load_compressed_tensors`) returns a `LoadedModel` (cfg, params,
tokenizer) and reads `dtype` (the parameters') and `compute_dtype` (`cfg.dtype`, default: dtype) the same way
(`bundle.py`).
"""

from lrl_jax.models.bundle import LoadedModel
from lrl_jax.models.config import ARCHS, QWEN2_5_7B, SMOLLM2_135M, ModelConfig
from lrl_jax.models.decoder import (
  ACTIVATION_AXES,
  REMAT_POLICIES,
  KVCache,
  Numerics,
  check_params,
  forward,
  forward_hidden,
  forward_hidden_grouped,
  hoist_qat_operands,
  init_cache,
  init_params,
  logits,
  logits_from_hidden,
  param_logical_axes,
  param_shapes,
  remat_policy,
)
from lrl_jax.models.hf import (
  Tokenizer,
  config_from_hf_file,
  export_compressed_tensors,
  load_compressed_tensors,
  load_gguf,
  load_hf,
  load_tokenizer,
  save_hf,
  smollm2,
  smollm2_path,
)
from lrl_jax.models.lora import Lora, LoraConfig, init_lora, lora_logical_axes

__all__ = [
  "ARCHS",
  "ModelConfig",
  "LoadedModel",
  "SMOLLM2_135M",
  "QWEN2_5_7B",
  "ACTIVATION_AXES",
  "KVCache",
  "Numerics",
  "check_params",
  "forward",
  "forward_hidden",
  "forward_hidden_grouped",
  "hoist_qat_operands",
  "remat_policy",
  "REMAT_POLICIES",
  "init_cache",
  "init_params",
  "logits",
  "logits_from_hidden",
  "param_logical_axes",
  "param_shapes",
  "Lora",
  "LoraConfig",
  "init_lora",
  "lora_logical_axes",
  "Tokenizer",
  "config_from_hf_file",
  "export_compressed_tensors",
  "load_compressed_tensors",
  "load_gguf",
  "load_hf",
  "load_tokenizer",
  "save_hf",
  "smollm2",
  "smollm2_path",
]
