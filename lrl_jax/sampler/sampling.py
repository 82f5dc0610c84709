"""Token sampling: temperature, top-k, top-p, and the behaviour log-prob mu of each drawn token.

Order (as transformers' logits processors): z = logits / temperature; top-k keeps the k largest z;
top-p (nucleus, Holtzman et al. 2020) keeps the smallest prefix of the remaining tokens, sorted
by z descending, whose probability mass reaches top_p (the token that crosses top_p is kept; so is
the first). Every token whose z ties the smallest kept value is kept too.

mu is the log-probability of the drawn token under the distribution actually sampled from: the
softmax of z renormalised over the kept tokens, log mu(y) = z_y - logsumexp(z_kept). It is
computed from the same float32 logits the token was drawn from. With temperature 0 (greedy) the
sampled distribution is a point mass; mu is then reported as log softmax(logits)_y (temperature
1, no truncation), the number a learner at temperature 1 compares its pi against.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["SamplingConfig", "sampling_logprobs", "sample_tokens", "is_eos"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingConfig:
  """How `generate` draws tokens.

  Attributes:
    max_new_tokens: N, tokens generated per row at most.
    temperature: z = logits / temperature; 0 means greedy (argmax).
    top_k: keep the k most likely tokens (0: no top-k).
    top_p: nucleus mass in (0, 1] (1: no top-p).
    eos_id: id (or ids) that end a sequence; the EOS token itself is part of the completion
      (mask 1). None: the model's EOS ids when `generate` is given a `LoadedModel` with a tokenizer, else never
      stop early; () never stops early.
    pad_id: id written after a sequence ends. None: the tokenizer's pad id (else its EOS) when `generate` is given
      a `LoadedModel` with a tokenizer, else 0.
  """

  max_new_tokens: int = 64
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  eos_id: int | tuple[int, ...] | None = None
  pad_id: int | None = None

  def __post_init__(self):
    if not isinstance(self.max_new_tokens, int) or self.max_new_tokens <= 0:
      raise ValueError(f"SamplingConfig.max_new_tokens must be a positive int; got {self.max_new_tokens!r}")
    if not self.temperature >= 0:
      raise ValueError(f"SamplingConfig.temperature must be >= 0; got {self.temperature!r}")
    if not isinstance(self.top_k, int) or self.top_k < 0:
      raise ValueError(f"SamplingConfig.top_k must be an int >= 0; got {self.top_k!r}")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"SamplingConfig.top_p must be in (0, 1]; got {self.top_p!r}")
    eos = self.eos_id
    if isinstance(eos, int):
      eos = (eos,)
    if eos is not None:
      eos = tuple(eos)
      if not all(isinstance(e, int) and e >= 0 for e in eos):
        raise ValueError(
          f"SamplingConfig.eos_id must be a non-negative int, a tuple of them (() never stops), or None; "
          f"got {self.eos_id!r}"
        )
    object.__setattr__(self, "eos_id", eos)  # normalised to a tuple (hashable, static under jit)
    if self.pad_id is not None and (not isinstance(self.pad_id, int) or self.pad_id < 0):
      raise ValueError(f"SamplingConfig.pad_id must be a non-negative int or None; got {self.pad_id!r}")

  @property
  def greedy(self) -> bool:
    return self.temperature == 0


def is_eos(tok, sampling: SamplingConfig) -> jax.Array:
  """bool, tok's shape: where a drawn token ends its sequence (`sampling.eos_id`; None or () never)."""
  if not sampling.eos_id:
    return jnp.zeros(tok.shape, bool)
  return jnp.isin(tok, jnp.asarray(sampling.eos_id, jnp.int32))


def with_special_ids(sampling: SamplingConfig, tokenizer) -> SamplingConfig:
  """`sampling` with eos_id / pad_id None filled in from `tokenizer` (a `models.Tokenizer`, or None: never stop,
  pad with 0)."""
  eos, pad = sampling.eos_id, sampling.pad_id
  if eos is None:
    eos = tuple(tokenizer.eos_ids) if tokenizer is not None else ()
  if pad is None:
    pad = tokenizer.pad_or_eos_id if tokenizer is not None else 0
  return dataclasses.replace(sampling, eos_id=eos, pad_id=pad)


def sampling_logprobs(logits_BV: jax.Array, sampling: SamplingConfig) -> jax.Array:
  """log of the distribution tokens are drawn from: float32 [B, V], -inf outside the kept set.

  Greedy: log softmax(logits) (see module docstring).
  """
  z = logits_BV.astype(jnp.float32)
  if sampling.greedy:
    return jax.nn.log_softmax(z, axis=-1)
  z = z / jnp.float32(sampling.temperature)
  V = z.shape[-1]
  top_k = min(sampling.top_k, V)
  if top_k:
    kth = lax.top_k(z, top_k)[0][..., -1:]
    z = jnp.where(z >= kth, z, -jnp.inf)
  if sampling.top_p < 1:
    # Sorted descending; with top-k the kept tokens are exactly the top_k largest.
    srt = lax.top_k(z, top_k)[0] if top_k else -jnp.sort(-z, axis=-1)
    p = jax.nn.softmax(srt, axis=-1)
    mass_before = jnp.cumsum(p, axis=-1) - p
    n_keep = jnp.maximum(jnp.sum(mass_before < sampling.top_p, axis=-1, keepdims=True), 1)
    cutoff = jnp.take_along_axis(srt, n_keep - 1, axis=-1)
    z = jnp.where(z >= cutoff, z, -jnp.inf)
  return jax.nn.log_softmax(z, axis=-1)


def sample_tokens(logits_BV: jax.Array, keys_B: jax.Array, sampling: SamplingConfig):
  """Draws one token per row; returns (tokens_B int32, mu_B float32 = log-prob of each drawn token).

  Args:
    logits_BV: [B, V] logits (any float dtype; used in float32).
    keys_B: [B] PRNG keys, one per row (a row's draw does not depend on the other rows).
    sampling: the sampling config.
  """
  logp_BV = sampling_logprobs(logits_BV, sampling)
  if sampling.greedy:
    tok = jnp.argmax(logits_BV.astype(jnp.float32), axis=-1)
  else:
    tok = jax.vmap(lambda k, lp: jax.random.categorical(k, lp))(keys_B, logp_BV)
  tok = tok.astype(jnp.int32)
  return tok, jnp.take_along_axis(logp_BV, tok[:, None], axis=-1)[:, 0]
