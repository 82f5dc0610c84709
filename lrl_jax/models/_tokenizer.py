"""A `tokenizers.Tokenizer` with the special token ids a sampler needs (BOS, EOS, PAD), and its HF files:
`load_tokenizer` reads them, `write_tokenizer` writes them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from lrl_jax.rollout import pad_prompts

if TYPE_CHECKING:  # `tokenizers` is an optional dependency (the `hf` extra): imported when used
  import tokenizers


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tokenizer:
  """A text tokenizer and its special ids.

  Attributes:
    backend: the `tokenizers.Tokenizer` (its post-processor adds BOS if the model wants one).
    bos_id: begin-of-sequence id, or None.
    eos_ids: ids that end a generation (the first is the canonical EOS); may be empty.
    pad_id: padding id, or None.
    chat_template: the Jinja chat template shipped with the model, or None.
  """

  backend: Any  # tokenizers.Tokenizer
  bos_id: int | None = None
  eos_ids: tuple[int, ...] = ()
  pad_id: int | None = None
  chat_template: str | None = None

  @property
  def eos_id(self) -> int | None:
    return self.eos_ids[0] if self.eos_ids else None

  @property
  def vocab_size(self) -> int:
    return self.backend.get_vocab_size(with_added_tokens=True)

  def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
    return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

  def encode_batch(self, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[list[int]]:
    return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=add_special_tokens)]

  def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
    return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  def decode_batch(self, seqs: Sequence[Sequence[int]], *, skip_special_tokens: bool = True) -> list[str]:
    return [self.decode(s, skip_special_tokens=skip_special_tokens) for s in seqs]

  def token_to_id(self, token: str) -> int | None:
    return self.backend.token_to_id(token)

  @property
  def pad_or_eos_id(self) -> int:
    """The id a padded slot holds: the pad id, else the EOS id, else 0 (masked out wherever it is used)."""
    return next(i for i in (self.pad_id, self.eos_id, 0) if i is not None)

  def pad(self, seqs, *, side: str = "left", length: int | None = None, multiple_of: int = 1):
    """`rollout.pad_prompts` with this tokenizer's pad id (`pad_or_eos_id`): (prompts int32 [B, P], valid
    bool [B, P]) for `sampler.generate`."""
    return pad_prompts(seqs, pad_id=self.pad_or_eos_id, side=side, length=length, multiple_of=multiple_of)

  def apply_chat_template(self, messages: Sequence[dict], *, add_generation_prompt: bool = True, **kwargs) -> str:
    """Renders a conversation with the model's own chat template (Jinja, as transformers renders it: trimmed
    blocks, `bos_token` / `eos_token` and `raise_exception` defined).

    Args:
      messages: [{"role": "system" | "user" | "assistant", "content": str}, ...].
      add_generation_prompt: end with the assistant turn's header, so that generation writes the reply.
      **kwargs: further template variables.

    Raises:
      ValueError: the tokenizer has no chat template, or the template raises.
    """
    if not self.chat_template:
      raise ValueError("apply_chat_template: this tokenizer has no chat template")
    import jinja2.sandbox  # lazy: jinja2 comes with the `hf` extra  # noqa: PLC0415

    def raise_exception(msg):
      raise jinja2.exceptions.TemplateError(msg)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    tok = lambda i: None if i is None else self.backend.id_to_token(i)  # noqa: E731
    try:
      return env.from_string(self.chat_template).render(
        messages=list(messages),
        add_generation_prompt=add_generation_prompt,
        bos_token=tok(self.bos_id) or "",
        eos_token=tok(self.eos_id) or "",
        **kwargs,
      )
    except jinja2.exceptions.TemplateError as err:
      raise ValueError(f"apply_chat_template: {err}") from None

  def encode_chat(self, messages: Sequence[dict], *, add_generation_prompt: bool = True) -> list[int]:
    """The token ids of `apply_chat_template(messages)` (the template writes its own special tokens: none are
    added)."""
    return self.encode(
      self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt), add_special_tokens=False
    )


def _token_id(backend: "tokenizers.Tokenizer", tok) -> int | None:
  if isinstance(tok, dict):
    tok = tok.get("content")
  return backend.token_to_id(tok) if isinstance(tok, str) else None


def _ids(v) -> tuple[int, ...]:
  if v is None:
    return ()
  return tuple(int(x) for x in (v if isinstance(v, list) else [v]))


def load_tokenizer(path) -> Tokenizer:
  """Reads `tokenizer.json` (and the special ids of tokenizer_config.json / generation_config.json /
  config.json when present) from an HF checkpoint directory, or a tokenizer.json path.

  Raises:
    FileNotFoundError if there is no tokenizer.json; ValueError if it does not parse.
  """
  import tokenizers  # lazy: tokenizers is optional (the `hf` extra)  # noqa: PLC0415

  path = Path(path)
  file = path / "tokenizer.json" if path.is_dir() else path
  if not file.is_file():
    raise FileNotFoundError(f"tokenizer.json not found: {file}")
  try:
    backend = tokenizers.Tokenizer.from_file(str(file))
  except Exception as err:  # tokenizers raises a bare Exception on malformed files
    raise ValueError(f"{file}: cannot parse tokenizer ({err})") from None
  d = file.parent

  def js(name):
    p = d / name
    return json.loads(p.read_text()) if p.is_file() else {}

  tcfg, gcfg, mcfg = js("tokenizer_config.json"), js("generation_config.json"), js("config.json")
  bos = _token_id(backend, tcfg.get("bos_token"))
  if bos is None:
    bos = next(iter(_ids(gcfg.get("bos_token_id")) or _ids(mcfg.get("bos_token_id"))), None)
  eos = _ids(gcfg.get("eos_token_id")) or _ids(mcfg.get("eos_token_id"))
  tok_eos = _token_id(backend, tcfg.get("eos_token"))
  if tok_eos is not None and tok_eos not in eos:
    eos = (tok_eos,) + eos
  pad = _token_id(backend, tcfg.get("pad_token"))
  if pad is None:
    pad = next(iter(_ids(gcfg.get("pad_token_id")) or _ids(mcfg.get("pad_token_id"))), None)
  template = tcfg.get("chat_template")
  if template is None and (d / "chat_template.jinja").is_file():
    template = (d / "chat_template.jinja").read_text()
  return Tokenizer(
    backend=backend, bos_id=bos, eos_ids=eos, pad_id=pad, chat_template=template if isinstance(template, str) else None
  )


def special_ids(tok: Tokenizer) -> dict:
  """The special ids of config.json / generation_config.json (bos_token_id, eos_token_id, pad_token_id)."""
  out = {}
  if tok.bos_id is not None:
    out["bos_token_id"] = tok.bos_id
  if tok.eos_ids:
    out["eos_token_id"] = tok.eos_ids[0] if len(tok.eos_ids) == 1 else list(tok.eos_ids)
  if tok.pad_id is not None:
    out["pad_token_id"] = tok.pad_id
  return out


def write_tokenizer(directory: Path, tok: Tokenizer):
  """tokenizer.json + tokenizer_config.json (special tokens, chat template) + generation_config.json."""
  tok.backend.save(str(directory / "tokenizer.json"))
  tcfg = {"tokenizer_class": "PreTrainedTokenizerFast"}
  for key, i in (("bos_token", tok.bos_id), ("eos_token", tok.eos_id), ("pad_token", tok.pad_id)):
    if i is not None:
      tcfg[key] = tok.backend.id_to_token(i)
  if tok.chat_template:
    tcfg["chat_template"] = tok.chat_template
  (directory / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2))
  (directory / "generation_config.json").write_text(json.dumps(special_ids(tok), indent=2))
