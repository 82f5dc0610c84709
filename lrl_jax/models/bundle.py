"""What every loader returns, `LoadedModel(cfg, params, tokenizer)`, and the one meaning of `dtype` / `compute_dtype`.

Every loader (`load_hf`, `load_gguf`, `smollm2`, `load_compressed_tensors`) takes the same two dtype arguments:

  dtype          the dtype of the float parameters it returns (`cfg.param_dtype`): the learner's master weights.
                 float32 unless told.
  compute_dtype  `cfg.dtype`: what activations and matmul inputs are cast to in `models.forward`, `sampler.generate`
                 (its KV cache too, unless told) and the learner; `sampler.serve_params(model, ...)` serves the kernels
                 from this cast. None: the same as `dtype`.

So `load_...(path)` is a float32 model computing in float32 (the parity setting), and
`load_...(path, compute_dtype="bfloat16")` keeps float32 masters for the learner and computes in bf16.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from lrl_jax.models._tokenizer import Tokenizer
from lrl_jax.models.config import ModelConfig

__all__ = ["LoadedModel", "resolve_dtypes"]


def resolve_dtypes(dtype, compute_dtype) -> tuple[str, str]:
  """(param dtype name, compute dtype name) of a loader's `dtype` / `compute_dtype` (None: `dtype`)."""
  param = jnp.dtype(dtype).name
  return param, param if compute_dtype is None else jnp.dtype(compute_dtype).name


class LoadedModel(NamedTuple):
  """A model as the loaders return it; unpacks as `cfg, params, tokenizer = models.load_hf(path)`.

  Attributes:
    cfg: the `ModelConfig` (`cfg.dtype` the compute dtype, `cfg.param_dtype` the parameters').
    params: the parameter tree (`models.decoder` layout): float arrays, or QArray kernels for a served tree
      (`load_compressed_tensors`, `sampler.serve_params(model, spec)`).
    tokenizer: the `Tokenizer` (EOS / pad ids, chat template), or None where the checkpoint ships none.
  """

  cfg: ModelConfig
  params: Any
  tokenizer: Tokenizer | None = None

  def replace(self, **changes) -> "LoadedModel":
    """A copy with some of (cfg, params, tokenizer) replaced."""
    return self._replace(**changes)

  def first_layers(self, k: int) -> "LoadedModel":
    """The model cut to its first `k` decoder blocks (the same embeddings, final norm and head): quick experiments
    and tests on a real model's weights.

    Raises:
      ValueError: k is not in [1, cfg.num_layers].
    """
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= self.cfg.num_layers:
      raise ValueError(f"first_layers: k must be an int in [1, {self.cfg.num_layers}] (the model's blocks); got {k!r}")
    layers = jax.tree_util.tree_map(lambda x: x[:k], self.params["layers"])
    return self._replace(cfg=self.cfg.replace(num_layers=k), params={**self.params, "layers": layers})
