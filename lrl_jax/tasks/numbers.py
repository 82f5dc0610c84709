"""Numeric answer extraction for verifiable rewards (GSM8K convention: the answer follows '####')."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

__all__ = ["find_numbers", "parse_number", "extract_reference_answer", "extract_completion_answer"]

# An optional minus, digits with optional thousands commas, an optional fraction: "-1,234.50".
# A leading '$' or a trailing '.' (end of a sentence) is not part of the number.
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def find_numbers(text: str) -> list[str]:
  """Every number in `text`, in order, with commas stripped ("1,234" -> "1234")."""
  out = []
  for m in _NUMBER.finditer(text):
    s = m.group(0).replace(",", "")
    if s not in ("", "-"):
      out.append(s)
  return out


def parse_number(s: str) -> Decimal | None:
  """Exact decimal value of a number string ("42", "42.0", "-3.5"), or None if it is not one."""
  try:
    d = Decimal(s.replace(",", "").strip())
  except InvalidOperation:
    return None
  return d if d.is_finite() else None


def extract_reference_answer(reference: str) -> str | None:
  """The last number after the last '####' of a GSM8K reference answer; None without '####' or a number there."""
  if "####" not in reference:
    return None
  nums = find_numbers(reference.rsplit("####", 1)[1])
  return nums[-1] if nums else None


def extract_completion_answer(completion: str) -> str | None:
  """The number right after the last '####' of a completion, else its last number; None if it has none."""
  if "####" in completion:
    nums = find_numbers(completion.rsplit("####", 1)[1])
    if nums:
      return nums[0]
  nums = find_numbers(completion)
  return nums[-1] if nums else None
