"""ModelConfig: the decoder's hyperparameters, and their transformers `config.json` mapping.

One config covers the three supported families (they differ only in a few switches):

| arch    | q/k/v bias (`attention_bias`) | q/k RMSNorm per head (`qk_norm`) |
|---------|-------------------------------|----------------------------------|
| llama   | no                            | no                               |
| qwen2   | yes                           | no                               |
| qwen3   | no                            | yes                              |
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import jax.numpy as jnp

__all__ = ["ModelConfig", "ARCHS", "SMOLLM2_135M", "QWEN2_5_7B"]

ARCHS = ("llama", "qwen2", "qwen3")
_HF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
_FLOAT_DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
  """Decoder hyperparameters (Llama / Qwen2 / Qwen3 families).

  Attributes:
    arch: "llama", "qwen2" or "qwen3".
    vocab_size: V, rows of the embedding table.
    hidden_size: D, model width.
    intermediate_size: F, SwiGLU hidden width.
    num_layers: L, decoder blocks.
    num_heads: H, query heads.
    num_kv_heads: Hkv, key/value heads (grouped-query attention); must divide H.
      None -> H.
    head_dim: Dh, width of one head. None -> D // H.
    rope_theta: RoPE base frequency θ.
    rms_norm_eps: ε of every RMSNorm.
    tie_word_embeddings: logits = h @ embedding.T (no lm_head parameter).
    attention_bias: q/k/v projections carry a bias (Qwen2). None -> arch == "qwen2".
    qk_norm: RMSNorm over Dh on each query/key head before RoPE (Qwen3). None -> arch == "qwen3".
    max_position_embeddings: longest context the checkpoint was trained for (metadata;
      RoPE itself has no table and no hard limit).
    dtype: compute dtype of activations and matmuls ("float32", "bfloat16", "float16").
      Norm statistics, softmax and logits stay float32 whatever this is.
    param_dtype: dtype `init_params` creates float parameters in.
  """

  arch: Literal["llama", "qwen2", "qwen3"]
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int | None = None
  head_dim: int | None = None
  rope_theta: float = 10000.0
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = False
  attention_bias: bool | None = None
  qk_norm: bool | None = None
  max_position_embeddings: int = 2048
  dtype: str = "float32"
  param_dtype: str = "float32"

  def __post_init__(self):
    if self.arch not in ARCHS:
      raise ValueError(f"ModelConfig.arch must be one of {ARCHS}; got {self.arch!r}")
    for name in (
      "vocab_size",
      "hidden_size",
      "intermediate_size",
      "num_layers",
      "num_heads",
      "max_position_embeddings",
    ):
      v = getattr(self, name)
      if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ValueError(f"ModelConfig.{name} must be a positive int; got {v!r}")
    set_ = lambda k, v: object.__setattr__(self, k, v)  # frozen: resolve defaults once, here
    if self.num_kv_heads is None:
      set_("num_kv_heads", self.num_heads)
    if self.head_dim is None:
      if self.hidden_size % self.num_heads:
        raise ValueError(
          f"ModelConfig: head_dim not given and hidden_size {self.hidden_size} is not a multiple "
          f"of num_heads {self.num_heads}"
        )
      set_("head_dim", self.hidden_size // self.num_heads)
    if self.attention_bias is None:
      set_("attention_bias", self.arch == "qwen2")
    if self.qk_norm is None:
      set_("qk_norm", self.arch == "qwen3")
    for name in ("num_kv_heads", "head_dim"):
      v = getattr(self, name)
      if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ValueError(f"ModelConfig.{name} must be a positive int; got {v!r}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"ModelConfig.num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads})")
    if self.head_dim % 2:
      raise ValueError(f"ModelConfig.head_dim must be even for RoPE; got {self.head_dim}")
    if not self.rope_theta > 0:
      raise ValueError(f"ModelConfig.rope_theta must be > 0; got {self.rope_theta}")
    if not self.rms_norm_eps > 0:
      raise ValueError(f"ModelConfig.rms_norm_eps must be > 0; got {self.rms_norm_eps}")
    for name in ("dtype", "param_dtype"):
      if getattr(self, name) not in _FLOAT_DTYPES:
        raise ValueError(f"ModelConfig.{name} must be one of {_FLOAT_DTYPES}; got {getattr(self, name)!r}")
    for name in ("tie_word_embeddings", "attention_bias", "qk_norm"):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f"ModelConfig.{name} must be a bool; got {getattr(self, name)!r}")

  # ------------------------------------------------------------------ derived

  @property
  def q_dim(self) -> int:
    """H·Dh, output width of q_proj."""
    return self.num_heads * self.head_dim

  @property
  def kv_dim(self) -> int:
    """Hkv·Dh, output width of k_proj / v_proj."""
    return self.num_kv_heads * self.head_dim

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  def replace(self, **changes) -> "ModelConfig":
    return dataclasses.replace(self, **changes)

  # ------------------------------------------------------------------ transformers

  @classmethod
  def from_hf(cls, config: dict[str, Any], **overrides) -> "ModelConfig":
    """Builds a config from a transformers `config.json` dict (model_type llama / qwen2 / qwen3).

    Reads RoPE θ from `rope_theta` (transformers 4.x) or `rope_parameters.rope_theta` (5.x), and the
    dtype from `dtype` (5.x) or `torch_dtype` (4.x); `overrides` replace any field afterwards.

    Raises:
      ValueError: unsupported model_type, or a feature this decoder does not implement
        (RoPE scaling, sliding-window attention, MLP or o_proj biases, a non-SiLU activation).
    """
    if not isinstance(config, dict):
      raise ValueError(f"ModelConfig.from_hf expects a config dict, got {type(config).__name__}")
    mt = config.get("model_type")
    if mt not in ARCHS:
      raise ValueError(f"unsupported model_type {mt!r} in config; supported: {ARCHS}")
    missing = [
      k
      for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
      if k not in config
    ]
    if missing:
      raise ValueError(f"{mt} config lacks required keys {missing}")
    act = config.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
      raise ValueError(f"{mt} config: hidden_act {act!r} is not supported (SwiGLU with silu only)")
    rope = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type")) or scaling.get("rope_type", scaling.get("type")) or "default"
    if rope_type != "default":
      raise ValueError(f"{mt} config: RoPE scaling type {rope_type!r} is not supported (only 'default')")
    theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
    if config.get("use_sliding_window", False):
      raise ValueError(f"{mt} config: use_sliding_window=True is not supported")
    if config.get("mlp_bias", False):
      raise ValueError(f"{mt} config: mlp_bias=True is not supported")
    if mt in ("llama", "qwen3") and config.get("attention_bias", False):
      raise ValueError(f"{mt} config: attention_bias=True (which biases o_proj too) is not supported")
    dtype = config.get("dtype") or config.get("torch_dtype") or "float32"
    if dtype not in _FLOAT_DTYPES:
      dtype = "float32"
    heads = config["num_attention_heads"]
    kw = dict(
      arch=mt,
      vocab_size=config["vocab_size"],
      hidden_size=config["hidden_size"],
      intermediate_size=config["intermediate_size"],
      num_layers=config["num_hidden_layers"],
      num_heads=heads,
      num_kv_heads=config.get("num_key_value_heads") or heads,
      head_dim=config.get("head_dim") or config["hidden_size"] // heads,
      rope_theta=float(theta),
      rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
      tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
      attention_bias=mt == "qwen2",
      qk_norm=mt == "qwen3",
      max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
      dtype=dtype,
      param_dtype="float32",
    )
    kw.update(overrides)
    return cls(**kw)

  def to_hf(self) -> dict[str, Any]:
    """The transformers `config.json` dict (5.x layout, with the 4.x `rope_theta` / `torch_dtype` keys too)."""
    if self.attention_bias != (self.arch == "qwen2") or self.qk_norm != (self.arch == "qwen3"):
      raise ValueError(
        f"ModelConfig.to_hf: arch {self.arch!r} with attention_bias={self.attention_bias}, "
        f"qk_norm={self.qk_norm} has no transformers equivalent"
      )
    d: dict[str, Any] = {
      "architectures": [_HF_ARCHITECTURES[self.arch]],
      "model_type": self.arch,
      "vocab_size": self.vocab_size,
      "hidden_size": self.hidden_size,
      "intermediate_size": self.intermediate_size,
      "num_hidden_layers": self.num_layers,
      "num_attention_heads": self.num_heads,
      "num_key_value_heads": self.num_kv_heads,
      "head_dim": self.head_dim,
      "hidden_act": "silu",
      "max_position_embeddings": self.max_position_embeddings,
      "rms_norm_eps": self.rms_norm_eps,
      "tie_word_embeddings": self.tie_word_embeddings,
      "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
      "rope_theta": self.rope_theta,
      "dtype": self.param_dtype,
      "torch_dtype": self.param_dtype,
      "use_cache": True,
    }
    if self.arch in ("llama", "qwen3"):
      d["attention_bias"] = False
    if self.arch == "llama":
      d["mlp_bias"] = False
    if self.arch in ("qwen2", "qwen3"):
      d["use_sliding_window"] = False
      d["sliding_window"] = None
    return d


# The shapes of two real models (random-weight benchmarks and ahead-of-time compiles; `models.smollm2()` loads the
# weights of the first). SmolLM2-135M: Llama architecture, tied embeddings; its K = 576 is not a multiple of 128
# (INT4 runs with groups of 64).
SMOLLM2_135M = ModelConfig(
  arch="llama",
  vocab_size=49152,
  hidden_size=576,
  intermediate_size=1536,
  num_layers=30,
  num_heads=9,
  num_kv_heads=3,
  head_dim=64,
  rope_theta=100000.0,
  rms_norm_eps=1e-5,
  tie_word_embeddings=True,
  max_position_embeddings=8192,
  dtype="bfloat16",
)
# Qwen2.5-7B (config.json of Qwen/Qwen2.5-7B): 28 layers, 3584 wide, GQA 28 / 4 heads, SwiGLU 18944, q/k/v biases.
QWEN2_5_7B = ModelConfig(
  arch="qwen2",
  vocab_size=152064,
  hidden_size=3584,
  intermediate_size=18944,
  num_layers=28,
  num_heads=28,
  num_kv_heads=4,
  head_dim=128,
  rope_theta=1000000.0,
  rms_norm_eps=1e-6,
  tie_word_embeddings=False,
  attention_bias=True,
  max_position_embeddings=32768,
  dtype="bfloat16",
)
