"""CharTokenizer: the embedded task's character-level tokenizer (one id per character)."""

from __future__ import annotations

import dataclasses
from typing import Sequence

__all__ = ["CharTokenizer", "ARITHMETIC_CHARS"]

# Digits, the operators of `ArithmeticTask`, '=', the unknown 'x' of its equations, ';' and ' '.
ARITHMETIC_CHARS = "0123456789+-*=x; "


@dataclasses.dataclass(frozen=True, kw_only=True)
class CharTokenizer:
  """A fixed character vocabulary with three special ids.

  Ids: `pad_id` 0, `bos_id` 1, `eos_id` 2, then one id per character of `chars` in order
  (vocab_size = 3 + len(chars); 20 for the default). Prompts are encoded as BOS + characters,
  answers as characters + EOS. It implements the `PromptEncoder` protocol of `lrl_jax.tasks`.

  Attributes:
    chars: the characters, each once.
  """

  chars: str = ARITHMETIC_CHARS
  pad_id: int = dataclasses.field(default=0, init=False)
  bos_id: int = dataclasses.field(default=1, init=False)
  eos_id: int = dataclasses.field(default=2, init=False)

  def __post_init__(self):
    if not self.chars or len(set(self.chars)) != len(self.chars):
      raise ValueError(f"CharTokenizer.chars must be non-empty and hold each character once; got {self.chars!r}")

  @property
  def vocab_size(self) -> int:
    return 3 + len(self.chars)

  @property
  def _ids(self) -> dict[str, int]:
    return {c: 3 + i for i, c in enumerate(self.chars)}

  def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
    """Ids of `text`, one per character; ValueError naming a character outside the vocabulary."""
    table = self._ids
    ids = [self.bos_id] if add_bos else []
    for i, c in enumerate(text):
      if c not in table:
        raise ValueError(
          f"CharTokenizer: character {c!r} at position {i} of {text!r} is not in the vocabulary {self.chars!r}"
        )
      ids.append(table[c])
    if add_eos:
      ids.append(self.eos_id)
    return ids

  def decode(self, ids: Sequence[int], *, stop_at_eos: bool = True) -> str:
    """Text of `ids`: PAD and BOS are skipped; with `stop_at_eos` everything from the first EOS on is dropped."""
    out = []
    for i in ids:
      i = int(i)
      if i == self.eos_id:
        if stop_at_eos:
          break
        continue
      if i in (self.pad_id, self.bos_id):
        continue
      if not 3 <= i < self.vocab_size:
        raise ValueError(f"CharTokenizer: id {i} is outside the vocabulary [0, {self.vocab_size})")
      out.append(self.chars[i - 3])
    return "".join(out)

  # PromptEncoder protocol.
  def encode_prompt(self, prompt: str) -> list[int]:
    return self.encode(prompt, add_bos=True)

  def encode_answer(self, text: str) -> list[int]:
    return self.encode(text, add_eos=True)

  def decode_completion(self, ids: Sequence[int]) -> str:
    return self.decode(ids, stop_at_eos=True)
