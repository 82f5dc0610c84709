"""Rollout: the one pytree a batch of sampled completions is, from `sampler.generate` to `learner.train_step`.

The sampler fills the token layout and μ; the RL loop adds the rewards; `learner.prepare_rollout` adds what the
learner computes before its updates (advantages, the critic's values and returns, π_old, π_ref), all on device
and under jit; `learner.train_step` takes it (or a minibatch of its rows). One name per quantity along the path.

Layout (T = P + N: P prompt slots, then N generated slots): position t holds token t; its log-probs (μ, π_old,
π_ref) are those of token t given the valid tokens before it, predicted from the last valid slot before t
(`predictor_index`: t − 1 unless padding sits in between). Every per-token array is 0 off `loss_mask`.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["Rollout", "predictor_index", "pad_prompts"]

_PER_TOKEN = ("valid", "loss_mask", "sampler_logp", "positions", "values", "returns", "old_logp", "ref_logp")


@flax.struct.dataclass
class Rollout:
  """B completions (a pytree; None fields are absent; `group_size` is static).

  Attributes:
    tokens: int32 [B, T] prompt + completion (pad_id after EOS).
    loss_mask: bool [B, T] the generated tokens up to and including EOS: what the loss trains on.
    sampler_logp: f32 [B, T] log μ of each generated token under the sampler's numerics (the behaviour policy).
    valid: bool [B, T] real tokens (prompt and completion, not padding); None: all valid.
    positions: int32 [B, T] RoPE positions; None: the count of valid tokens before each.
    rewards: f32 [B] outcome rewards (the loop's `task.score`).
    advantages: f32 [B] per sequence (group estimators) or [B, T] per token (GAE).
    values: f32 [B, T] (or [B, T, K] quantiles) the critic's head at each position: the value of the state after
      token t, i.e. of the state in which token t + 1 is chosen.
    returns: f32 [B, T] the critic's target at each position (the GAE return of token t + 1; 0 after the last).
    old_logp: f32 [B, T] log π_old, the learner's log-probs of the weights that were synced; None: π_old is π_θ
      detached (one update per batch, no correction).
    ref_logp: f32 [B, T] log π_ref of the frozen reference policy (KL penalty), or None.
    group_size: G, completions per prompt, rows of a group contiguous (1: ungrouped, e.g. a minibatch of rows).
    prompt_len: P (static), where the completions start: slots [0, P) hold the prompt (no loss_mask there), and
      the G rows of a group hold the same prompt there (the sampler's layout). The learner computes logits only
      for the slots >= P and, for G > 1, runs each group's prompt once (`learner.LearnerConfig.share_prompt`).
      0: unknown (logits everywhere, no sharing).
  """

  tokens: jax.Array
  loss_mask: jax.Array
  sampler_logp: jax.Array
  valid: jax.Array | None = None
  positions: jax.Array | None = None
  rewards: jax.Array | None = None
  advantages: jax.Array | None = None
  values: jax.Array | None = None
  returns: jax.Array | None = None
  old_logp: jax.Array | None = None
  ref_logp: jax.Array | None = None
  group_size: int = flax.struct.field(pytree_node=False, default=1)
  prompt_len: int = flax.struct.field(pytree_node=False, default=0)

  @property
  def size(self) -> int:
    """B, the number of completions."""
    return self.tokens.shape[0]

  @property
  def lengths(self) -> jax.Array:
    """int32 [B], generated tokens per row (EOS included)."""
    return jnp.sum(self.loss_mask, axis=1, dtype=jnp.int32)

  def completion_ids(self) -> list[list[int]]:
    """Each row's generated token ids (through its EOS, without padding), on the host: `Tokenizer.decode_batch`
    turns them into text."""
    toks, mask = np.asarray(self.tokens), np.asarray(self.loss_mask).astype(bool)
    return [t[m].tolist() for t, m in zip(toks, mask)]

  def check(self) -> None:
    """Raises ValueError naming a field whose shape does not fit tokens [B, T] (or the group size B)."""
    if jnp.ndim(self.tokens) != 2:
      raise ValueError(f"Rollout.tokens must be [B, T]; got shape {jnp.shape(self.tokens)}")
    bt = tuple(jnp.shape(self.tokens))
    for name in _PER_TOKEN:
      x = getattr(self, name)
      ok = x is None or tuple(jnp.shape(x)) == bt or (name == "values" and tuple(jnp.shape(x))[:2] == bt)
      if not ok:
        raise ValueError(f"Rollout.{name} must have the shape of tokens {bt}; got {tuple(jnp.shape(x))}")
    if self.rewards is not None and tuple(jnp.shape(self.rewards)) != bt[:1]:
      raise ValueError(f"Rollout.rewards must be [B] = {bt[:1]}; got {tuple(jnp.shape(self.rewards))}")
    if self.advantages is not None and tuple(jnp.shape(self.advantages)) not in (bt[:1], bt):
      raise ValueError(
        f"Rollout.advantages must be [B] or [B, T] with [B, T] = {bt}; got {tuple(jnp.shape(self.advantages))}"
      )
    if self.group_size < 1 or bt[0] % self.group_size:
      raise ValueError(f"Rollout.group_size={self.group_size} must divide the batch B={bt[0]}")
    if not 0 <= self.prompt_len < bt[1]:
      raise ValueError(f"Rollout.prompt_len={self.prompt_len} must be in [0, T) with [B, T] = {bt}")

  def take(self, rows) -> "Rollout":
    """The rollout of rows `rows` (int [R]); a row subset is ungrouped (group_size 1)."""
    return jax.tree_util.tree_map(lambda x: jnp.take(x, rows, axis=0), self.replace(group_size=1))


def predictor_index(valid_BT) -> jax.Array:
  """int32 [B, T]: the last valid slot before each slot (−1 if none): where its token is predicted from."""
  valid_BT = jnp.asarray(valid_BT).astype(bool)
  T = valid_BT.shape[1]
  idx = jnp.where(valid_BT, jnp.arange(T, dtype=jnp.int32)[None, :], -1)
  last_upto = lax.cummax(idx, axis=1)  # last valid slot <= s
  return jnp.concatenate([jnp.full_like(last_upto[:, :1], -1), last_upto[:, :-1]], axis=1)


def pad_prompts(
  seqs, *, pad_id: int = 0, side: str = "left", length: int | None = None, multiple_of: int = 1
) -> tuple[jax.Array, jax.Array]:
  """Token-id lists of different lengths -> (prompts int32 [B, P], valid bool [B, P]), as `sampler.generate` takes
  them.

  Args:
    seqs: B sequences of token ids (lists, tuples or 1-D arrays), each non-empty.
    pad_id: the id written in the padding slots (masked out by `valid`; any id works).
    side: "left" (the prompts end together at slot P − 1: what a sampler wants) or "right".
    length: P; None: the longest sequence, rounded up to `multiple_of` (bucketing P keeps the number of
      compiled shapes small).
    multiple_of: round P up to a multiple of this.

  Raises:
    ValueError: no sequences, an empty or non-1-D sequence, a `length` shorter than a sequence (naming the row and
      its length), or an unknown `side`.
  """
  if side not in ("left", "right"):
    raise ValueError(f"pad_prompts: side must be 'left' or 'right'; got {side!r}")
  rows = [np.asarray(s) for s in seqs]
  if not rows:
    raise ValueError("pad_prompts: no sequences")
  for b, r in enumerate(rows):
    if r.ndim != 1 or r.size == 0:
      raise ValueError(f"pad_prompts: sequence {b} must be a non-empty 1-D list of token ids; got shape {r.shape}")
    if not np.issubdtype(r.dtype, np.integer):
      raise ValueError(f"pad_prompts: sequence {b} holds {r.dtype} values, not token ids")
  if not isinstance(multiple_of, int) or multiple_of < 1:
    raise ValueError(f"pad_prompts: multiple_of must be a positive int; got {multiple_of!r}")
  longest = max(len(r) for r in rows)
  if length is None:
    length = -(-longest // multiple_of) * multiple_of
  elif longest > length:
    b = next(i for i, r in enumerate(rows) if len(r) > length)
    raise ValueError(f"pad_prompts: sequence {b} has {len(rows[b])} tokens, more than length={length}")
  tokens = np.full((len(rows), length), pad_id, np.int32)
  valid = np.zeros((len(rows), length), bool)
  for b, r in enumerate(rows):
    sl = slice(length - len(r), length) if side == "left" else slice(0, len(r))
    tokens[b, sl], valid[b, sl] = r, True
  return jnp.asarray(tokens), jnp.asarray(valid)
