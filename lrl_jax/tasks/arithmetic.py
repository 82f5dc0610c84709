"""ArithmeticTask: the embedded synthetic task (multi-digit addition, subtraction, products, equations)."""

from __future__ import annotations

import dataclasses
import functools
import re
import zlib
from typing import Literal

import numpy as np

from lrl_jax.tasks.base import PromptEncoder, Split, Task
from lrl_jax.tasks.numbers import find_numbers, parse_number
from lrl_jax.tasks.tokenizer import CharTokenizer

__all__ = ["ArithmeticTask", "ARITHMETIC_OPS"]

ARITHMETIC_OPS = ("+", "-", "*", "eq")
_SPLIT_IDS = {"train": 0, "eval": 1}
_INTEGER = re.compile(r"-?\d+")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArithmeticTask(Task):
  """Synthetic arithmetic with an exact, verifiable answer.

  Problem i of a split is drawn from `np.random.default_rng([seed, split, i])`, so batch `step` of size B
  holds problems step·B ... step·B + B − 1: the data order is a pure function of (seed, step, B).
  Operands a, b are uniform in [0, 10^digits); one op per problem, uniform over `ops`:

  | op   | prompt         | reference |
  |------|----------------|-----------|
  | "+"  | "12+7="        | "19"      |
  | "-"  | "12-7="        | "5"       | (a ≥ b: the larger operand first, never negative)
  | "*"  | "12*7="        | "84"      | (b is one digit)
  | "eq" | "x+7=19;x="    | "12"      | (solve x + b = c for x)

  Reward (completion = text up to EOS):
    answer="exact": 1.0 iff completion.strip() == reference (so "019" or "19 " + junk before EOS is wrong);
    answer="last_number": 1.0 iff the last number in the completion equals the reference (for chat models
      that write "12 + 7 = 19"). Otherwise `format_reward` if the completion is (exact) or holds (last_number)
      an integer, else 0. format_reward = 0 (the default) makes the reward purely 1/0.

  Held-out evaluation (`holdout` = f > 0): a problem belongs to the held-out part of the problem space iff
  u(prompt) < f, u a fixed hash of its prompt text to [0, 1) (splitmix64 of its CRC-32), the same for every seed
  and run. The train split then draws only problems outside it (problem i: the first draw of its stream that is
  not held out), and the eval split is the distinct held-out problems in a fixed order, the same for every seed:
  eval and training never share a problem. f = 0: both splits draw independently from the whole space, with the
  seed (the default; eval problems may then also occur in training).

  Attributes:
    seed: data seed.
    digits: operand digits (1..9).
    ops: subset of ("+", "-", "*", "eq").
    answer: "exact" or "last_number".
    format_reward: reward in [0, 1) for a well-formed but wrong answer.
    encoder: text <-> ids; the default CharTokenizer has vocab_size 20.
    holdout: fraction of the problem space reserved for the eval split (0 = no reservation, see above).
    transfer_digits: operand digit counts of extra evaluation sets (`eval_sets`), e.g. (1, 3) for a 2-digit task.
  """

  seed: int = 0
  digits: int = 2
  ops: tuple[str, ...] = ("+",)
  answer: Literal["exact", "last_number"] = "exact"
  format_reward: float = 0.0
  encoder: PromptEncoder = dataclasses.field(default_factory=CharTokenizer)
  holdout: float = 0.0
  transfer_digits: tuple[int, ...] = ()

  def __post_init__(self):
    if not isinstance(self.digits, int) or not 1 <= self.digits <= 9:
      raise ValueError(f"ArithmeticTask.digits must be an int in [1, 9]; got {self.digits!r}")
    object.__setattr__(self, "ops", tuple(self.ops))
    if not self.ops or any(op not in ARITHMETIC_OPS for op in self.ops) or len(set(self.ops)) != len(self.ops):
      raise ValueError(f"ArithmeticTask.ops must be distinct values from {ARITHMETIC_OPS}; got {self.ops!r}")
    if self.answer not in ("exact", "last_number"):
      raise ValueError(f"ArithmeticTask.answer must be 'exact' or 'last_number'; got {self.answer!r}")
    if not 0.0 <= self.format_reward < 1.0:
      raise ValueError(f"ArithmeticTask.format_reward must be in [0, 1); got {self.format_reward!r}")
    if not isinstance(self.seed, int) or self.seed < 0:
      raise ValueError(f"ArithmeticTask.seed must be a non-negative int; got {self.seed!r}")
    if not 0.0 <= self.holdout < 1.0:
      raise ValueError(f"ArithmeticTask.holdout must be in [0, 1); got {self.holdout!r}")
    object.__setattr__(self, "transfer_digits", tuple(self.transfer_digits))
    if any(not isinstance(d, int) or not 1 <= d <= 9 for d in self.transfer_digits):
      raise ValueError(f"ArithmeticTask.transfer_digits must be ints in [1, 9]; got {self.transfer_digits!r}")

  def problem(self, index: int, *, split: Split = "train") -> tuple[str, str]:
    """(prompt, reference) of problem `index` of `split`."""
    if split not in _SPLIT_IDS:
      raise ValueError(f"split must be 'train' or 'eval'; got {split!r}")
    if index < 0:
      raise ValueError(f"problem index must be >= 0; got {index}")
    if self.holdout > 0:
      if split == "eval":
        return self._heldout(index + 1)[index]
      rng = np.random.default_rng([self.seed, _SPLIT_IDS[split], index])
      while True:  # the first draw outside the held-out part (expected 1 / (1 − holdout) draws)
        pair = _draw(rng, self.digits, self.ops)
        if heldout_u(pair[0]) >= self.holdout:
          return pair
    return _draw(np.random.default_rng([self.seed, _SPLIT_IDS[split], index]), self.digits, self.ops)

  def eval_sets(self, size: int) -> dict[str, tuple[list[str], list[str]]]:
    """{"": the first `size` eval problems, "d<k>": up to `size` distinct problems with k-digit operands for each k
    of `transfer_digits`} as (prompts, references). The transfer sets come from the same fixed stream for every
    seed and are not checked against training (a 2-digit task also draws 1-digit sums, at 1% of its problems)."""
    out = {"": self.prompts(0, size, split="eval")}
    for d in self.transfer_digits:
      pairs = _distinct_problems(d, self.ops, 0.0, size)
      out[f"d{d}"] = ([p for p, _ in pairs], [r for _, r in pairs])
    return out

  def _heldout(self, n: int) -> tuple[tuple[str, str], ...]:
    """The first n held-out problems (the eval split when holdout > 0)."""
    pairs = _distinct_problems(self.digits, self.ops, self.holdout, n)
    if len(pairs) < n:
      raise ValueError(
        f"ArithmeticTask: the eval split holds {len(pairs)} held-out problems (digits={self.digits}, "
        f"ops={self.ops}, holdout={self.holdout}); {n} were asked for: raise holdout or ask for fewer"
      )
    return pairs

  def prompts(self, step: int, batch_size: int, *, split: Split = "train") -> tuple[list[str], list[str]]:
    if step < 0 or batch_size <= 0:
      raise ValueError(f"prompts: need step >= 0 and batch_size > 0; got step={step}, batch_size={batch_size}")
    if self.holdout > 0 and split == "eval":
      pairs = self._heldout((step + 1) * batch_size)[step * batch_size :]
    else:
      pairs = [self.problem(step * batch_size + j, split=split) for j in range(batch_size)]
    return [p for p, _ in pairs], [r for _, r in pairs]

  def reward(self, completion: str, reference: str) -> float:
    if self.answer == "exact":
      s = completion.strip()
      if s == reference:
        return 1.0
      return self.format_reward if _INTEGER.fullmatch(s) else 0.0
    nums = find_numbers(completion)
    if not nums:
      return 0.0
    return 1.0 if parse_number(nums[-1]) == parse_number(reference) else self.format_reward

  @property
  def max_prompt_len(self) -> int | None:
    if not isinstance(self.encoder, CharTokenizer):
      return None
    d = self.digits
    chars = {"+": 2 * d + 2, "-": 2 * d + 2, "*": d + 3, "eq": 2 * d + 7}  # eq: c = a + b has d + 1 digits
    return 1 + max(chars[op] for op in self.ops)  # + BOS

  @property
  def max_answer_len(self) -> int | None:
    if not isinstance(self.encoder, CharTokenizer):
      return None
    d = self.digits
    chars = {"+": d + 1, "-": d, "*": d + 1, "eq": d}
    return 1 + max(chars[op] for op in self.ops)  # + EOS


_EVAL_STREAM = 0x5EED  # the fixed stream eval problems are drawn from (independent of the run's seed)
_MAX_ENUMERATE = 200_000  # problem spaces up to this size are enumerated (a small space has few distinct problems)


def heldout_u(prompt: str) -> float:
  """A fixed hash of a problem's prompt text to [0, 1): splitmix64 (Steele et al. 2014) of its CRC-32."""
  z = (zlib.crc32(prompt.encode()) + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
  z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
  z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
  return ((z ^ (z >> 31)) >> 11) / float(1 << 53)


@functools.lru_cache(maxsize=64)
def _distinct_problems(digits: int, ops: tuple[str, ...], holdout: float, n: int) -> tuple[tuple[str, str], ...]:
  """The first n distinct problems (u < holdout when holdout > 0) of the fixed eval stream; all of them, in a fixed
  shuffled order, when the space has fewer."""
  keep = (lambda p: heldout_u(p) < holdout) if holdout > 0 else (lambda p: True)
  hi = 10**digits
  if len(ops) * hi * hi <= _MAX_ENUMERATE:
    space = {}
    for op in ops:
      for a in range(hi):
        for b in range(hi):
          p, r = _make(op, a, b)
          if keep(p):
            space[p] = r
    order = np.random.default_rng([_EVAL_STREAM, digits]).permutation(len(space))
    items = list(space.items())
    return tuple(items[i] for i in order[:n])
  seen: dict[str, str] = {}
  j = 0
  while len(seen) < n:
    p, r = _draw(np.random.default_rng([_EVAL_STREAM, digits, j]), digits, ops)
    if p not in seen and keep(p):
      seen[p] = r
    j += 1
  return tuple(seen.items())


def _draw(rng, digits: int, ops: tuple[str, ...]) -> tuple[str, str]:
  op = ops[int(rng.integers(len(ops)))]
  hi = 10**digits
  a, b = int(rng.integers(hi)), int(rng.integers(hi))
  return _make(op, a, b)


def _make(op: str, a: int, b: int) -> tuple[str, str]:
  """(prompt, reference) of operation `op` on the drawn operands a, b."""
  if op == "+":
    return f"{a}+{b}=", str(a + b)
  if op == "-":
    a, b = max(a, b), min(a, b)
    return f"{a}-{b}=", str(a - b)
  if op == "*":
    b = b % 10
    return f"{a}*{b}=", str(a * b)
  return f"x+{b}={a + b};x=", str(a)
