"""DAPO's sampling strategy and length shaping (Yu et al. 2025, arXiv 2503.14476), as host-side steps of the RL loop.

Dynamic sampling (DAPO §3.2): a group whose G rewards are all equal (every completion right, or every one wrong) has
GRPO advantages of 0: it costs a forward and backward and carries no signal. The step drops such groups and samples
more prompts until `run.batch_prompts` groups with signal are gathered, in at most `dapo.max_rounds` generation
rounds. Groups are judged on the task's reward before length shaping (DAPO filters on accuracy, not on the shaped
score: verl's `filter_groups.metric: acc`). If the rounds run out first, the batch is filled with dropped groups in
the order they were sampled (their advantages are 0: they add no policy gradient, but every step keeps one shape and
one compiled program); the number filled is reported.

Round r > 0 of step k samples `batch_prompts` prompts of the task's batch index `steps + k · (max_rounds − 1) + r − 1`
(a stream past the run's own batches, so that round 0 is exactly the prompts of the step without dynamic sampling)
with the key `fold_in(step_key, r)`: the rounds are a function of (seed, k), and a resumed run repeats them.

Soft overlong punishment (DAPO Eq. 13), with L_max = `sampler.max_new_tokens` and L_cache = `dapo.overlong_buffer`:

  R_length(|y|) = 0                                   |y| <= L_max − L_cache
                = ((L_max − L_cache) − |y|) / L_cache  L_max − L_cache < |y| <= L_max

times `dapo.overlong_penalty` (1 in DAPO: −1 at L_max), added to the reward. |y| counts the generated tokens, EOS
included. Overlong filtering (DAPO §3.4): completions cut at L_max without an EOS leave the loss (their `loss_mask`
rows are cleared); they still count in their group's reward statistics. DAPO's own settings: L_max = 20480,
L_cache = 4096 (20% of L_max), penalty factor 1, both on together with dynamic sampling.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from lrl_jax.rollout import Rollout

__all__ = ["overlong_penalty", "truncated_rows", "groups_with_signal", "concat_rollouts", "take_groups"]


def overlong_penalty(lengths, *, max_len: int, buffer: int, factor: float = 1.0) -> np.ndarray:
  """DAPO's soft overlong punishment per completion (f32 [B], <= 0; module docstring): 0 up to max_len − buffer,
  then falling linearly to −factor at max_len (and below it past max_len). `buffer` 0: all zeros."""
  lengths = np.asarray(lengths, np.float64)
  if buffer <= 0:
    return np.zeros(lengths.shape, np.float32)
  if buffer > max_len:
    raise ValueError(f"overlong_penalty: the buffer ({buffer}) must not exceed the maximum length ({max_len})")
  return (factor * np.minimum((max_len - buffer - lengths) / buffer, 0.0)).astype(np.float32)


def truncated_rows(rollout: Rollout, eos_ids, max_new_tokens: int) -> np.ndarray:
  """bool [B]: rows that used all `max_new_tokens` without ending in an EOS (cut off, not finished)."""
  mask = np.asarray(rollout.loss_mask).astype(bool)
  tokens = np.asarray(rollout.tokens)
  n = mask.sum(axis=1)
  T = mask.shape[1]
  last = T - 1 - np.argmax(mask[:, ::-1], axis=1)
  last_tok = tokens[np.arange(len(tokens)), last]
  eos = np.asarray(sorted({int(e) for e in (eos_ids or ())}), np.int64)
  return (n >= max_new_tokens) & ~np.isin(last_tok, eos)


def groups_with_signal(rewards, group_size: int) -> np.ndarray:
  """bool [B / G]: groups whose G rewards are not all equal (those a group advantage does not zero)."""
  r = np.asarray(rewards, np.float64).reshape(-1, group_size)
  return r.max(axis=1) > r.min(axis=1)


def _left_pad(r: Rollout, P: int) -> Rollout:
  """`r` with its prompt slots padded on the left to P (invalid, outside the loss; RoPE positions count valid slots,
  so the completions' numbers do not change)."""
  extra = P - r.prompt_len
  if extra == 0:
    return r
  pad = lambda x: None if x is None else jnp.pad(x, [(0, 0), (extra, 0)] + [(0, 0)] * (x.ndim - 2))  # noqa: E731
  return r.replace(
    tokens=pad(r.tokens),
    valid=pad(r.valid),
    loss_mask=pad(r.loss_mask),
    sampler_logp=pad(r.sampler_logp),
    positions=pad(r.positions),
    prompt_len=P,
  )


def concat_rollouts(rolls: list[Rollout]) -> Rollout:
  """The rows of several rollouts of the same group size and completion length in one, prompts left-padded to the
  longest prompt length (fields the sampler does not fill must be absent: this runs before scoring)."""
  if len(rolls) == 1:
    return rolls[0]
  P = max(r.prompt_len for r in rolls)
  padded = [_left_pad(r, P) for r in rolls]
  first = padded[0]
  cat = lambda name: (  # noqa: E731
    None if getattr(first, name) is None else jnp.concatenate([getattr(r, name) for r in padded], axis=0)
  )
  return first.replace(**{n: cat(n) for n in ("tokens", "valid", "loss_mask", "sampler_logp", "positions")})


def take_groups(rollout: Rollout, groups, group_size: int) -> Rollout:
  """The rollout of whole groups `groups` (ints, in the order given), grouped as before."""
  rows = (np.asarray(groups, np.int64)[:, None] * group_size + np.arange(group_size)[None, :]).reshape(-1)
  return rollout.take(jnp.asarray(rows)).replace(group_size=group_size)
