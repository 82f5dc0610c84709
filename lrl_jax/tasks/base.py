"""Task: prompts + a verifiable reward, and the token layout shared by RL prompts and supervised batches."""

from __future__ import annotations

import abc
from typing import Literal, NamedTuple, Protocol, Sequence

import numpy as np

from lrl_jax.tasks.reward import score_batch

__all__ = ["Task", "RowsTask", "PromptEncoder", "SupervisedBatch", "pad_sequences", "Split"]

Split = Literal["train", "eval"]


class PromptEncoder(Protocol):
  """Text <-> ids for a task (`CharTokenizer`, `TextEncoder`, `ChatPromptFormatter`)."""

  pad_id: int
  eos_id: int

  @property
  def vocab_size(self) -> int: ...

  def encode_prompt(self, prompt: str) -> list[int]:
    """Ids the model is prompted with (template and BOS included)."""

  def encode_answer(self, text: str) -> list[int]:
    """Ids of a target completion, EOS included."""

  def decode_completion(self, ids: Sequence[int]) -> str:
    """Text of a generated completion up to (not including) its first EOS."""


class SupervisedBatch(NamedTuple):
  """Prompt + target answer, laid out as the sampler's `Rollout` (T = P + A).

  Attributes:
    tokens: int32 [B, T]: the prompt left-padded to P slots, then answer + EOS right-padded to A slots.
    valid: bool [B, T]: real tokens (prompt and answer, not padding).
    loss_mask: bool [B, T]: the answer tokens and EOS: where a supervised loss is taken
      (the token at slot s is predicted from the last valid slot before s).
    prompt_len: P.
  """

  tokens: np.ndarray
  valid: np.ndarray
  loss_mask: np.ndarray
  prompt_len: int


def pad_sequences(
  seqs: Sequence[Sequence[int]],
  *,
  pad_id: int,
  length: int | None = None,
  padding: Literal["left", "right"] = "left",
  what: str = "sequence",
) -> tuple[np.ndarray, np.ndarray]:
  """Pads id lists into (tokens int32 [B, L], valid bool [B, L]); L = `length` or the longest.

  Raises:
    ValueError: a sequence longer than `length`, an empty batch, or an unknown `padding`.
  """
  if padding not in ("left", "right"):
    raise ValueError(f"padding must be 'left' or 'right'; got {padding!r}")
  if not len(seqs):
    raise ValueError(f"cannot pad an empty batch of {what}s")
  longest = max(len(s) for s in seqs)
  L = longest if length is None else int(length)
  if longest > L:
    i = max(range(len(seqs)), key=lambda j: len(seqs[j]))
    raise ValueError(f"{what} {i} has {longest} tokens, more than length={L}")
  tokens = np.full((len(seqs), L), pad_id, np.int32)
  valid = np.zeros((len(seqs), L), bool)
  for b, s in enumerate(seqs):
    n = len(s)
    if n == 0:
      continue
    sl = slice(L - n, L) if padding == "left" else slice(0, n)
    tokens[b, sl] = np.asarray(s, np.int32)
    valid[b, sl] = True
  return tokens, valid


class Task(abc.ABC):
  """A source of prompts with a verifiable reward.

  Subclasses define `encoder`, `prompts` and `reward`; the encoding helpers here are shared.
  Data order is reproducible by step: `prompts(step, B)` is a pure function of (seed, step, B, split).
  """

  encoder: PromptEncoder

  @abc.abstractmethod
  def prompts(self, step: int, batch_size: int, *, split: Split = "train") -> tuple[list[str], list[str]]:
    """(prompt strings, reference strings) of batch `step`."""

  @abc.abstractmethod
  def reward(self, completion: str, reference: str) -> float:
    """Reward of one decoded completion (text up to EOS) against its reference."""

  def eval_sets(self, size: int) -> dict[str, tuple[list[str], list[str]]]:
    """The evaluation sets {name: (prompts, references)}: "" is the eval split's first `size` problems (others, e.g.
    an arithmetic task's transfer sets "d1", "d3", are reported beside it)."""
    return {"": self.prompts(0, size, split="eval")}

  def target(self, reference: str) -> str:
    """The completion text a supervised step teaches for `reference` (the reference itself by default)."""
    return reference

  @property
  def max_prompt_len(self) -> int | None:
    """Longest encoded prompt the task can produce, when known (fixed shapes under jit); else None."""
    return None

  @property
  def max_answer_len(self) -> int | None:
    """Longest encoded target (EOS included), when known; else None."""
    return None

  def encode_prompts(
    self, prompts: Sequence[str], *, padding: Literal["left", "right"] = "left", length: int | None = None
  ) -> tuple[np.ndarray, np.ndarray]:
    """(tokens_BP int32, valid_BP bool); P = `length`, else `max_prompt_len`, else the longest prompt."""
    length = self.max_prompt_len if length is None else length
    seqs = [self.encoder.encode_prompt(p) for p in prompts]
    return pad_sequences(seqs, pad_id=self.encoder.pad_id, length=length, padding=padding, what="prompt")

  def decode_completions(self, tokens_BN, mask_BN=None) -> list[str]:
    """Completion texts of generated tokens [B, N] (each up to its first EOS; masked-out slots dropped)."""
    tokens_BN = np.asarray(tokens_BN)
    if tokens_BN.ndim != 2:
      raise ValueError(f"decode_completions: tokens must be [B, N]; got shape {tokens_BN.shape}")
    if mask_BN is not None:
      mask_BN = np.asarray(mask_BN, bool)
      if mask_BN.shape != tokens_BN.shape:
        raise ValueError(f"decode_completions: mask shape {mask_BN.shape} != tokens shape {tokens_BN.shape}")
    return [
      self.encoder.decode_completion(row if mask_BN is None else row[mask_BN[b]]) for b, row in enumerate(tokens_BN)
    ]

  def supervised_batch(
    self,
    step: int,
    batch_size: int,
    *,
    split: Split = "train",
    prompt_len: int | None = None,
    answer_len: int | None = None,
  ) -> SupervisedBatch:
    """Prompts of batch `step` followed by their targets + EOS; loss mask on the answer (see `SupervisedBatch`).

    P = `prompt_len`, else `max_prompt_len`, else the longest prompt; A likewise with `answer_len`.
    """
    prompts, refs = self.prompts(step, batch_size, split=split)
    p_tok, p_val = self.encode_prompts(prompts, padding="left", length=prompt_len)
    answers = [self.encoder.encode_answer(self.target(r)) for r in refs]
    a_len = self.max_answer_len if answer_len is None else answer_len
    a_tok, a_val = pad_sequences(answers, pad_id=self.encoder.pad_id, length=a_len, padding="right", what="answer")
    P = p_tok.shape[1]
    return SupervisedBatch(
      tokens=np.concatenate([p_tok, a_tok], axis=1),
      valid=np.concatenate([p_val, a_val], axis=1),
      loss_mask=np.concatenate([np.zeros_like(p_val), a_val], axis=1),
      prompt_len=P,
    )

  def score(self, completions: Sequence[str], references: Sequence[str], *, timeout_s: float | None = 1.0):
    """`score_batch(self, completions, references, timeout_s=...)`: (rewards float32 [B], stats)."""
    return score_batch(self, completions, references, timeout_s=timeout_s)


class RowsTask(Task):
  """A task whose problems are rows of (prompt, reference): `rows` (train), `eval_rows`, `seed` set by the subclass.

  Data order: the train split runs through the rows in a fresh permutation per epoch,
  `np.random.default_rng([seed, epoch]).permutation(n)`, so batch `step` is a pure function of (seed, step, batch
  size). The eval split is `eval_rows` in order, wrapping."""

  rows: list[tuple[str, str]]
  eval_rows: list[tuple[str, str]]
  seed: int

  def _row(self, i: int, split: Split) -> tuple[str, str]:
    if split == "eval":
      return self.eval_rows[i % len(self.eval_rows)]
    if split != "train":
      raise ValueError(f"split must be 'train' or 'eval'; got {split!r}")
    n = len(self.rows)
    perm = np.random.default_rng([self.seed, i // n]).permutation(n)
    return self.rows[int(perm[i % n])]

  def prompts(self, step: int, batch_size: int, *, split: Split = "train") -> tuple[list[str], list[str]]:
    if step < 0 or batch_size <= 0:
      raise ValueError(f"prompts: need step >= 0 and batch_size > 0; got step={step}, batch_size={batch_size}")
    rows = [self._row(step * batch_size + j, split) for j in range(batch_size)]
    return [p for p, _ in rows], [r for _, r in rows]
