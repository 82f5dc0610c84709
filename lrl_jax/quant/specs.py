"""Format specs: one frozen, keyword-only dataclass per low-precision format.

A spec says *what* a format is; `quantize` / `dequantize` / `fake_quant` say how
it is computed. Specs are hashable and carry no arrays, so they can be static
fields of a pytree and static arguments of `jit`.

The formulas, with their sources, are in `lrl_jax/quant/README.md`.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Union

import jax.numpy as jnp

__all__ = ["Int4", "FP8", "MXFP8", "NVFP4", "Spec"]

FP8_MAX = 448.0  # largest finite float8_e4m3fn
FP4_MAX = 6.0  # largest float4_e2m1fn
INT4_MAX = 7  # symmetric INT4 codes live in [-7, 7]; -8 is never produced


@dataclasses.dataclass(frozen=True, kw_only=True)
class Int4:
  """Symmetric group-wise INT4 (W4A16), as slime / compressed-tensors `pack-quantized`.

  s = max(amax_group / 7, 1e-5), rounded to `scale_dtype` before use;
  q = clip(round_half_even(w / s), -7, 7); ŵ = q · s.

  Attributes:
    group_size: elements per group along the quantized (contraction) axis.
    scale_dtype: storage dtype of the group scales (bf16 in slime and vLLM).
  """

  group_size: int = 128
  scale_dtype: str = "bfloat16"

  def __post_init__(self):
    if self.group_size not in (16, 32, 64, 128, 256):
      raise ValueError(f"Int4.group_size must be one of 16, 32, 64, 128, 256; got {self.group_size}")
    if self.scale_dtype not in ("bfloat16", "float16", "float32"):
      raise ValueError(f"Int4.scale_dtype must be bfloat16, float16 or float32; got {self.scale_dtype!r}")

  @property
  def block(self) -> int:
    return self.group_size

  @property
  def name(self) -> str:
    return f"int4_g{self.group_size}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class FP8:
  """FP8 E4M3 with a float32 scale s = amax / 448 over a channel, a token or a 2-D block.

  q = e4m3(clip(x / s, -448, 448)); x̂ = f32(q) · s.

  Attributes:
    granularity: "channel" — one scale per slice along `axis` (weights [K, N] with
      axis=0: one per output channel); "token" — the same reduction, named for
      activations [M, K] with axis=-1 (one per token, computed dynamically);
      "block" — one scale per `block` × `block` tile of the last two dimensions
      (DeepSeek-V3 style 128 × 128 weight blocks).
    block: tile edge for granularity="block".
  """

  granularity: Literal["channel", "token", "block"] = "channel"
  block: int = 128

  def __post_init__(self):
    if self.granularity not in ("channel", "token", "block"):
      raise ValueError(f"FP8.granularity must be 'channel', 'token' or 'block'; got {self.granularity!r}")
    if self.block <= 0:
      raise ValueError(f"FP8.block must be positive; got {self.block}")

  @property
  def name(self) -> str:
    return f"fp8_{self.granularity}" + (f"{self.block}" if self.granularity == "block" else "")


@dataclasses.dataclass(frozen=True, kw_only=True)
class MXFP8:
  """OCP microscaling MXFP8: 32-element blocks, E8M0 scale, E4M3 elements.

  e = ceil(log2(amax_block / 448)) clamped to [-126, 127]; scale = 2^e;
  q = e4m3(clip(x / 2^e, -448, 448)); x̂ = f32(q) · 2^e.
  The round-up exponent is what jax.nn.scaled_matmul and cuBLAS expect.
  """

  block_size: int = 32

  def __post_init__(self):
    if self.block_size != 32:
      raise ValueError(f"MXFP8.block_size is 32 in the OCP MX spec; got {self.block_size}")

  @property
  def block(self) -> int:
    return self.block_size

  @property
  def name(self) -> str:
    return "mxfp8"


@dataclasses.dataclass(frozen=True, kw_only=True)
class NVFP4:
  """NVFP4: E2M1 codes, one E4M3 scale per 16 elements, one float32 scale per tensor.

  TransformerEngine reference recipe (also compressed-tensors `nvfp4-pack-quantized`):
  enc = 448·6 / amax_tensor (1 when amax is 0), dec = 1 / enc;
  s_b = e4m3(min(amax_block · enc / 6, 448));
  q = e2m1(clip(x / (f32(s_b) · dec), -6, 6)); x̂ = q · f32(s_b) · dec.
  """

  block_size: int = 16

  def __post_init__(self):
    if self.block_size != 16:
      raise ValueError(f"NVFP4.block_size is 16; got {self.block_size}")

  @property
  def block(self) -> int:
    return self.block_size

  @property
  def name(self) -> str:
    return "nvfp4"


Spec = Union[Int4, FP8, MXFP8, NVFP4]
