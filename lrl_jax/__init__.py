"""lrl_jax: low-precision reinforcement learning of LLMs in JAX.

Train what you serve: one numerics contract (`lrl_jax.quant`) for INT4, FP8, MXFP8 and NVFP4,
used by the learner as fake quantization and by the sampler as real low-bit weights.

Shape glossary (docstrings and array names use these letters):
  B batch · T tokens · G group (completions per prompt) · V vocab · D model width
  H heads · K contraction (matmul input features) · N output features · M matmul rows
"""

__version__ = "0.1.0"

from lrl_jax import hostmem as _hostmem

# Before anything runs on XLA's CPU backend: glibc keeps the memory XLA frees (`lrl_jax.hostmem`).
_hostmem.keep_freed_memory()
