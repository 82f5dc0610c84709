"""Prompt encoders over a `tokenizers.Tokenizer`: plain text, and SmolLM2's ChatML chat template."""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["TextEncoder", "ChatPromptFormatter", "SMOLLM2_SYSTEM"]

# The system turn SmolLM2-Instruct's own chat template inserts when a conversation has none.
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def _special_id(tokenizer, token: str, what: str) -> int:
  i = tokenizer.token_to_id(token)
  if i is None:
    raise ValueError(f"{what}: token {token!r} is not in the tokenizer's vocabulary (it must be a single token)")
  return int(i)


class TextEncoder:
  """Encodes `user_template.format(prompt=...)` as plain text with a `tokenizers.Tokenizer`.

  Implements the `PromptEncoder` protocol: `encode_prompt`, `encode_answer` (text + EOS),
  `decode_completion` (up to the first EOS), `pad_id`, `eos_id`, `vocab_size`.
  No special tokens are added by the tokenizer's post-processor (`add_special_tokens=False`);
  a BOS, when given, is prepended explicitly.

  Args:
    tokenizer: a `tokenizers.Tokenizer` (for `lrl_jax.models`' Tokenizer wrapper, pass its `.backend`).
    eos_token: the token that ends a completion.
    pad_token: the padding token; None -> the EOS token.
    bos_token: prepended to every prompt when given.
    user_template: str.format template with a `{prompt}` field, applied to each task prompt.
  """

  def __init__(
    self,
    tokenizer: Any,
    *,
    eos_token: str,
    pad_token: str | None = None,
    bos_token: str | None = None,
    user_template: str = "{prompt}",
  ):
    for name in ("encode", "decode", "token_to_id", "get_vocab_size"):
      if not callable(getattr(type(tokenizer), name, None)):
        raise TypeError(
          f"{type(self).__name__}: tokenizer must be a tokenizers.Tokenizer (missing .{name}); "
          f"got {type(tokenizer).__name__}"
        )
    if "{prompt}" not in user_template:
      raise ValueError(f"{type(self).__name__}: user_template must contain '{{prompt}}'; got {user_template!r}")
    self.tokenizer = tokenizer
    self.user_template = user_template
    self.eos_id = _special_id(tokenizer, eos_token, type(self).__name__)
    self.pad_id = self.eos_id if pad_token is None else _special_id(tokenizer, pad_token, type(self).__name__)
    self.bos_id = None if bos_token is None else _special_id(tokenizer, bos_token, type(self).__name__)

  @property
  def vocab_size(self) -> int:
    return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

  def format(self, prompt: str) -> str:
    """The text a prompt is encoded as."""
    return self.user_template.format(prompt=prompt)

  def _encode(self, text: str) -> list[int]:
    return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

  def encode_prompt(self, prompt: str) -> list[int]:
    ids = self._encode(self.format(prompt))
    return ids if self.bos_id is None else [self.bos_id] + ids

  def encode_answer(self, text: str) -> list[int]:
    return self._encode(text) + [self.eos_id]

  def decode_completion(self, ids: Sequence[int]) -> str:
    ids = [int(i) for i in ids]
    if self.eos_id in ids:
      ids = ids[: ids.index(self.eos_id)]
    return self.tokenizer.decode(ids, skip_special_tokens=True)


class ChatPromptFormatter(TextEncoder):
  """Wraps each prompt in SmolLM2-Instruct's ChatML template and encodes it.

  The text is exactly what SmolLM2's `apply_chat_template(..., add_generation_prompt=True)` renders
  for one user turn:

    <|im_start|>system\\n{system}<|im_end|>\\n<|im_start|>user\\n{question}<|im_end|>\\n<|im_start|>assistant\\n

  with question = user_template.format(prompt=prompt). The completion ends at `<|im_end|>` (EOS),
  which `encode_answer` appends to a supervised target. `<|im_start|>` / `<|im_end|>` must be single
  (added) tokens of the tokenizer; no model or file is fetched.

  Args:
    tokenizer: a `tokenizers.Tokenizer`.
    system: the system turn (SmolLM2's default); None -> no system turn.
    user_template: str.format template with a `{prompt}` field.
    eos_token, pad_token: as in `TextEncoder` (pad None -> EOS, as SmolLM2-Instruct pads with <|im_end|>).
  """

  def __init__(
    self,
    tokenizer: Any,
    *,
    system: str | None = SMOLLM2_SYSTEM,
    user_template: str = "{prompt}",
    eos_token: str = "<|im_end|>",
    pad_token: str | None = None,
  ):
    super().__init__(tokenizer, eos_token=eos_token, pad_token=pad_token, user_template=user_template)
    _special_id(tokenizer, "<|im_start|>", type(self).__name__)
    self.system = system

  def format(self, prompt: str) -> str:
    text = "" if self.system is None else f"<|im_start|>system\n{self.system}<|im_end|>\n"
    return text + f"<|im_start|>user\n{self.user_template.format(prompt=prompt)}<|im_end|>\n<|im_start|>assistant\n"
