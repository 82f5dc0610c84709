"""Format specs: one frozen, keyword-only dataclass per low-precision format.

A spec says *what* a format is; `quantize` / `dequantize` / `fake_quant` say how
it is computed. Specs are hashable and carry no arrays, so they can be static
fields of a pytree and static arguments of `jit`.

The formulas, with their sources, are in `lrl_jax/quant/README.md`.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Union

__all__ = ["Int4", "FP8", "MXFP8", "NVFP4", "NVFP4WAG", "Spec"]

FP8_MAX = 448.0  # largest finite float8_e4m3fn
FP4_MAX = 6.0  # largest float4_e2m1fn
INT4_MAX = 7  # symmetric INT4 codes live in [-7, 7]; -8 is never produced
INT4_SCALE_FLOOR = 1e-5  # slime / compressed-tensors floor on amax / 7 (and on learned scales)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Int4:
  """Group-wise INT4 (W4A16): codes q, a scale s and a zero point z per group; ŵ = (q − z) · s.

  Schemes (`scheme`), all with s rounded to `scale_dtype` before use and round-half-to-even codes:
    absmax (slime / compressed-tensors `pack-quantized`, symmetric): s = max(amax / 7, 1e-5),
      z = 0, q = clip(round(w / s), -7, 7).
    minmax (asymmetric, AWQ / compressed-tensors asymmetric): over the group with 0 included,
      lo = min(min w, 0), hi = max(max w, 0); s = max((hi − lo) / 15, 1e-5);
      z_u = clip(round(−lo / s), 0, 15) and u = clip(round(w / s) + z_u, 0, 15) in the unsigned
      convention, i.e. z = z_u − 8 and q = u − 8 in [-8, 7] in the signed one stored here.
    learned (LSQ, Esser et al. 2020; LSQ+ zero point, Bhalgat et al. 2020): s (and z when
      `learn_zero_point`) are trainable parameters next to the kernel (`kernel_scale`, `kernel_zero`),
      initialised by absmax (or minmax with a zero point); the forward uses s and round(z) clipped
      to [-8, 7]: q = clip(round(w / s) + z, -8, 7), the full INT4 range.

  Attributes:
    group_size: elements per group along the quantized (contraction) axis.
    scale_dtype: storage dtype of the group scales (bf16 in slime and vLLM).
    scheme: "absmax", "minmax" or "learned".
    learn_zero_point: learned scheme only: train a zero point per group as well (asymmetric).
  """

  group_size: int = 128
  scale_dtype: str = "bfloat16"
  scheme: Literal["absmax", "minmax", "learned"] = "absmax"
  learn_zero_point: bool = False

  def __post_init__(self):
    if self.group_size not in (16, 32, 64, 128, 256):
      raise ValueError(f"Int4.group_size must be one of 16, 32, 64, 128, 256; got {self.group_size}")
    if self.scale_dtype not in ("bfloat16", "float16", "float32"):
      raise ValueError(f"Int4.scale_dtype must be bfloat16, float16 or float32; got {self.scale_dtype!r}")
    if self.scheme not in ("absmax", "minmax", "learned"):
      raise ValueError(f"Int4.scheme must be 'absmax', 'minmax' or 'learned'; got {self.scheme!r}")
    if self.learn_zero_point and self.scheme != "learned":
      raise ValueError(f"Int4.learn_zero_point needs scheme='learned'; got scheme={self.scheme!r}")

  @property
  def block(self) -> int:
    return self.group_size

  @property
  def qmin(self) -> int:
    """Smallest signed code: -7 for absmax (symmetric, -8 never produced), else -8."""
    return -INT4_MAX if self.scheme == "absmax" else -8

  @property
  def qmax(self) -> int:
    return INT4_MAX

  @property
  def asymmetric(self) -> bool:
    """Whether quantized arrays carry a zero point per group."""
    return self.scheme == "minmax" or self.learn_zero_point

  @property
  def learned(self) -> bool:
    return self.scheme == "learned"

  @property
  def name(self) -> str:
    suffix = {"absmax": "", "minmax": "_minmax", "learned": "_lsq"}[self.scheme]
    return f"int4_g{self.group_size}{suffix}" + ("z" if self.learn_zero_point else "")


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


@dataclasses.dataclass(frozen=True, kw_only=True)
class NVFP4WAG:
  """NVFP4 weights, activations and gradients in the learner (NVIDIA's NVFP4 training recipe, arXiv 2509.25149).

  A learner-only QAT spec: the selected linear layers run `quant.nvfp4_wag_matmul` (`wag.py`), whose three GEMMs
  all take NVFP4 operands (forward x 1x16 RNE and W 16x16 RNE; dgrad dy 1x16 SR; wgrad x and dy 16x1 along the
  tokens after a random Hadamard transform, dy SR). As a weight format it is NVFP4 with 16x16 scale tiles:
  `quantize(w, NVFP4WAG(), axis=-2)` gives a plain `NVFP4()` QArray (1x16 along K, each tile's E4M3 scale
  repeated over its 16 columns), what the sampler serves.

  Attributes:
    rht: random Hadamard transform of the wgrad operands (16x16, random signs per step).
    sr: stochastic rounding of the gradient dy (dgrad and wgrad operands); False: round to nearest even.
    act_scale: the forward's activation FP32 scale: "tensor" (the recipe: one amax over all the tokens of the
      call) or "token" (one per row: a token's codes then do not depend on which tokens share the matmul, so the
      sampler's prefill and decode steps and the learner's forward quantize it alike).
  """

  rht: bool = True
  sr: bool = True
  act_scale: Literal["tensor", "token"] = "tensor"

  def __post_init__(self):
    if self.act_scale not in ("tensor", "token"):
      raise ValueError(f"NVFP4WAG.act_scale must be 'tensor' or 'token'; got {self.act_scale!r}")

  @property
  def block(self) -> int:
    return 16

  @property
  def block_size(self) -> int:
    return 16

  @property
  def name(self) -> str:
    suffix = (
      ("" if self.rht else "_norht") + ("" if self.sr else "_nosr") + ("_tok" if self.act_scale == "token" else "")
    )
    return "nvfp4_wag" + suffix


Spec = Union[Int4, FP8, MXFP8, NVFP4, NVFP4WAG]
