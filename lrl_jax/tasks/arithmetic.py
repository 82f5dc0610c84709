"""ArithmeticTask: the embedded synthetic task (multi-digit addition, subtraction, products, equations)."""

from __future__ import annotations

import dataclasses
import re
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

  Attributes:
    seed: data seed.
    digits: operand digits (1..9).
    ops: subset of ("+", "-", "*", "eq").
    answer: "exact" or "last_number".
    format_reward: reward in [0, 1) for a well-formed but wrong answer.
    encoder: text <-> ids; the default CharTokenizer has vocab_size 20.
  """

  seed: int = 0
  digits: int = 2
  ops: tuple[str, ...] = ("+",)
  answer: Literal["exact", "last_number"] = "exact"
  format_reward: float = 0.0
  encoder: PromptEncoder = dataclasses.field(default_factory=CharTokenizer)

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

  def problem(self, index: int, *, split: Split = "train") -> tuple[str, str]:
    """(prompt, reference) of problem `index` of `split`."""
    if split not in _SPLIT_IDS:
      raise ValueError(f"split must be 'train' or 'eval'; got {split!r}")
    if index < 0:
      raise ValueError(f"problem index must be >= 0; got {index}")
    rng = np.random.default_rng([self.seed, _SPLIT_IDS[split], index])
    op = self.ops[int(rng.integers(len(self.ops)))]
    hi = 10**self.digits
    a, b = int(rng.integers(hi)), int(rng.integers(hi))
    if op == "+":
      return f"{a}+{b}=", str(a + b)
    if op == "-":
      a, b = max(a, b), min(a, b)
      return f"{a}-{b}=", str(a - b)
    if op == "*":
      b = b % 10
      return f"{a}*{b}=", str(a * b)
    return f"x+{b}={a + b};x=", str(a)

  def prompts(self, step: int, batch_size: int, *, split: Split = "train") -> tuple[list[str], list[str]]:
    if step < 0 or batch_size <= 0:
      raise ValueError(f"prompts: need step >= 0 and batch_size > 0; got step={step}, batch_size={batch_size}")
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
