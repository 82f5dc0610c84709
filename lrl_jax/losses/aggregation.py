"""How per-token losses become a scalar, and how metrics survive micro-batches and hosts.

Aggregation modes of a per-token loss ℓ[b, t] with mask m[b, t] (n_b = Σ_t m[b, t];
S = the sequences with n_b > 0, so all-padding rows never count):

| mode                        | scalar                          | used by                      |
|-----------------------------|---------------------------------|------------------------------|
| "token-mean"                | Σ_bt m ℓ / Σ_bt m               | DAPO (Yu et al. 2025)        |
| "seq-mean-token-mean"       | (1/#S) Σ_b (Σ_t m ℓ / n_b)     | GRPO (Shao et al. 2024), GSPO|
| "seq-mean-token-sum"        | (1/#S) Σ_b Σ_t m ℓ             | sequence-sum                 |
| "seq-mean-token-sum-norm"   | Σ_bt m ℓ / (#S · L)            | Dr.GRPO (Liu et al. 2025)    |

L (`norm_len`) is a constant generation budget (Dr.GRPO); it defaults to T, the padded
length, so pass it explicitly if T varies between batches.

`denom` overrides the local normaliser (Σ m for "token-mean", #S otherwise) with a
global one, e.g. the token count over every micro-batch of a gradient-accumulation
step and every host: then the sum of the micro-batch losses is the loss of the batch.

Metrics: a mean that will be combined across micro-batches or hosts is a `Mean(total,
count)` pair; a maximum is `Max(value)`; a plain array is a per-batch statistic that
does not combine exactly (ESS, correlation, ACRL's X) and is averaged by
`merge_metrics`. `finalize_metrics` turns the pairs into numbers.
"""

from __future__ import annotations

from typing import Literal, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp

from lrl_jax.losses import _common as C

__all__ = ["AGG_MODES", "AggMode", "aggregate", "Mean", "Max", "merge_metrics", "finalize_metrics"]

AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


class Mean(NamedTuple):
  """A mean carried as (total, count): combine by adding both, read as total / count."""

  total: jax.Array
  count: jax.Array

  @property
  def value(self) -> jax.Array:
    """total / count, or 0 when count is 0 (no data)."""
    return C.safe_div(self.total, self.count)


class Max(NamedTuple):
  """A maximum: combine by taking the max."""

  value: jax.Array


def check_agg(fn: str, agg: str) -> None:
  if agg not in AGG_MODES:
    raise ValueError(f"{fn}: agg must be one of {AGG_MODES}; got {agg!r}")


def aggregate(loss, mask, *, agg: AggMode = "token-mean", norm_len: int | None = None, denom=None) -> jax.Array:
  """Reduces a per-token loss [B, T] to a scalar f32 (the modes in the module docstring).

  Args:
    loss: [B, T] per-token loss; masked positions may hold anything (even NaN).
    mask: [B, T], 1 (True) for a real generated token.
    agg: aggregation mode.
    norm_len: L of "seq-mean-token-sum-norm" (default T).
    denom: optional global normaliser replacing Σ m (token-mean) or #S (other modes).

  Returns:
    A scalar f32; 0 when there is no real token.
  """
  check_agg("aggregate", agg)
  m, _ = C.bt_mask("aggregate", mask, loss=loss)
  loss = C.clean(loss, m)
  n_b = jnp.sum(m, axis=1).astype(C.F32)
  n_seq = jnp.sum(n_b > 0).astype(C.F32)
  if agg == "token-mean":
    return C.safe_div(jnp.sum(loss), jnp.sum(n_b) if denom is None else C.f32(denom))
  den_seq = n_seq if denom is None else C.f32(denom)
  if agg == "seq-mean-token-mean":
    return C.safe_div(jnp.sum(C.safe_div(jnp.sum(loss, axis=1), n_b)), den_seq)
  if agg == "seq-mean-token-sum":
    return C.safe_div(jnp.sum(loss), den_seq)
  length = loss.shape[1] if norm_len is None else norm_len
  C.check_positive("aggregate", norm_len=length)
  return C.safe_div(jnp.sum(loss), den_seq * length)


def merge_metrics(metrics: Sequence[Mapping[str, object]]) -> dict[str, object]:
  """Combines the metric dicts of several micro-batches (or hosts, after a gather).

  `Mean` pairs add, `Max` takes the max, plain arrays (per-batch statistics) are averaged.
  """
  if not metrics:
    return {}
  out = {}
  for key in metrics[0]:
    vals = [m[key] for m in metrics]
    v0 = vals[0]
    if isinstance(v0, Mean):
      out[key] = Mean(sum(v.total for v in vals), sum(v.count for v in vals))
    elif isinstance(v0, Max):
      out[key] = Max(jnp.max(jnp.stack([v.value for v in vals])))
    else:
      out[key] = jnp.mean(jnp.stack([jnp.asarray(v) for v in vals]), axis=0)
  return out


def finalize_metrics(metrics: Mapping[str, object]) -> dict[str, jax.Array]:
  """Mean -> total / count, Max -> value, others unchanged: a flat dict of numbers to log."""
  out = {}
  for k, v in metrics.items():
    if isinstance(v, (Mean, Max)):
      out[k] = v.value
    else:
      out[k] = v
  return out
