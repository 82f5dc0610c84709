"""ChatPromptFormatter: SmolLM2's ChatML template encoded with a tiny `tokenizers` tokenizer built here.

The tokenizer maps every character to its own id and the two ChatML markers to single ids, so the expected
ids are written by hand from the template text (no model is fetched)."""

import numpy as np
import pytest

tokenizers = pytest.importorskip("tokenizers")

from lrl_jax.tasks import SMOLLM2_SYSTEM, ArithmeticTask, ChatPromptFormatter, TextEncoder  # noqa: E402

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
CHARS = sorted(set(SMOLLM2_SYSTEM + "systemuserassistant\n 0123456789+=?What is Answer.,Thejunk"))


def _tiny_tokenizer():
  vocab = {s: i for i, s in enumerate(SPECIALS)}
  vocab.update({c: len(SPECIALS) + i for i, c in enumerate(CHARS)})
  vocab["[UNK]"] = len(vocab)
  tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=[], unk_token="[UNK]"))
  tok.add_special_tokens(SPECIALS)
  tok.decoder = tokenizers.decoders.Fuse()
  return tok, vocab


def _ids(pieces, vocab):
  """Hand encoding: a special marker is one id, any other text one id per character."""
  out = []
  for p in pieces:
    out += [vocab[p]] if p in SPECIALS else [vocab[c] for c in p]
  return out


def test_chat_template_encoding():
  tok, vocab = _tiny_tokenizer()
  f = ChatPromptFormatter(tok, user_template="What is {prompt}?")
  expected = _ids(
    [
      "<|im_start|>",
      "system\n" + SMOLLM2_SYSTEM,
      "<|im_end|>",
      "\n",
      "<|im_start|>",
      "user\nWhat is 12+7=?",
      "<|im_end|>",
      "\n",
      "<|im_start|>",
      "assistant\n",
    ],
    vocab,
  )
  assert f.encode_prompt("12+7=") == expected
  assert f.format("12+7=") == (
    f"<|im_start|>system\n{SMOLLM2_SYSTEM}<|im_end|>\n<|im_start|>user\nWhat is 12+7=?"
    "<|im_end|>\n<|im_start|>assistant\n"
  )
  assert (f.eos_id, f.pad_id) == (vocab["<|im_end|>"], vocab["<|im_end|>"])
  assert f.encode_answer("19") == [vocab["1"], vocab["9"], vocab["<|im_end|>"]]
  # A completion is read up to its first <|im_end|>.
  assert f.decode_completion(_ids(["The answer is 19.", "<|im_end|>", "junk 5"], vocab)) == "The answer is 19."
  no_system = ChatPromptFormatter(tok, system=None)
  assert no_system.encode_prompt("1") == _ids(
    ["<|im_start|>", "user\n1", "<|im_end|>", "\n", "<|im_start|>", "assistant\n"], vocab
  )


def test_chat_arithmetic_task_batches():
  tok, vocab = _tiny_tokenizer()
  f = ChatPromptFormatter(tok, user_template="What is {prompt}?")
  t = ArithmeticTask(seed=0, digits=2, answer="last_number", encoder=f)
  prompts, refs = t.prompts(0, 4)
  tokens, valid = t.encode_prompts(prompts)
  lens = [len(f.encode_prompt(p)) for p in prompts]
  assert tokens.shape == (4, max(lens))  # no fixed maximum for a text tokenizer: the longest prompt
  for i, p in enumerate(prompts):
    assert list(tokens[i][valid[i]]) == f.encode_prompt(p) and valid[i, -lens[i] :].all()  # left-padded
  b = t.supervised_batch(0, 4)
  for i, r in enumerate(refs):
    assert list(b.tokens[i][b.loss_mask[i]]) == [vocab[c] for c in r] + [vocab["<|im_end|>"]]
  assert t.reward(f.decode_completion(_ids([f"{prompts[0]}{refs[0]}", "<|im_end|>"], vocab)), refs[0]) == 1.0


def test_plain_text_encoder_and_errors():
  tok, vocab = _tiny_tokenizer()
  e = TextEncoder(tok, eos_token="<|endoftext|>", user_template="{prompt}?")
  assert e.encode_prompt("1+2=") == [vocab[c] for c in "1+2=?"]
  assert e.eos_id == vocab["<|endoftext|>"]
  with pytest.raises(ValueError, match="'<eos>' is not in the tokenizer"):
    TextEncoder(tok, eos_token="<eos>")
  with pytest.raises(ValueError, match="user_template must contain"):
    ChatPromptFormatter(tok, user_template="no field")
  with pytest.raises(TypeError, match="tokenizers.Tokenizer"):
    ChatPromptFormatter("not a tokenizer")
  np.testing.assert_equal(len(e.encode_answer("12")), 3)
