"""Model shapes and formats both ahead-of-time compile suites (test_aot_tpu.py, test_aot_triton.py) run the
sampler on."""

from lrl_jax import quant
from lrl_jax.models import ModelConfig

SAMPLER_FORMATS = {
  "int4_g128": quant.Int4(group_size=128),
  "int4_g128_zp": quant.Int4(group_size=128, scheme="minmax"),
  "nvfp4": quant.NVFP4(),
  "fp8_channel": quant.FP8(),
  "int4_g64": quant.Int4(group_size=64),
}
MODELS = {  # a Llama-shaped toy, and SmolLM2-135M's shapes (width 576: INT4 needs G = 64) with two of its 30 layers
  "llama_1k": ModelConfig(
    arch="llama",
    vocab_size=4096,
    hidden_size=1024,
    intermediate_size=4096,
    num_layers=2,
    num_heads=8,
    num_kv_heads=4,
    dtype="bfloat16",
    param_dtype="float32",
  ),
  "smollm2": ModelConfig(
    arch="llama",
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=2,
    num_heads=9,
    num_kv_heads=3,
    tie_word_embeddings=True,
    dtype="bfloat16",
    param_dtype="float32",
  ),
}
SAMPLER_CASES = [("llama_1k", f) for f in ("int4_g128", "int4_g128_zp", "nvfp4", "fp8_channel")] + [
  ("smollm2", "int4_g64"),
  ("smollm2", "nvfp4"),
]
