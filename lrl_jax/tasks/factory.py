"""Builds a Task from a `TaskSection` of the run config."""

from __future__ import annotations

from typing import Any

from lrl_jax.tasks.arithmetic import ArithmeticTask
from lrl_jax.tasks.base import Task
from lrl_jax.tasks.chat import SMOLLM2_SYSTEM, ChatPromptFormatter, TextEncoder
from lrl_jax.tasks.gsm8k import GSM8KTask
from lrl_jax.tasks.tokenizer import CharTokenizer

__all__ = ["task_from_config"]


def task_from_config(section, *, seed: int, tokenizer: Any = None, eos_token: str = "<|im_end|>") -> Task:
  """The task a `lrl_jax.config.TaskSection` describes.

  Args:
    section: a TaskSection.
    seed: data seed (the run seed).
    tokenizer: None for the embedded CharTokenizer (tiny model), else the model's `tokenizers.Tokenizer`.
    eos_token: EOS of a plain-text (template none) encoder over `tokenizer`.
  """
  if tokenizer is None:
    if section.template != "none":
      raise ValueError(
        f"task.template={section.template!r} needs the model's tokenizer; got tokenizer=None "
        "(the character tokenizer has no chat template)"
      )
    encoder = CharTokenizer()
  elif section.template == "chat":
    system = SMOLLM2_SYSTEM if section.system_prompt is None else section.system_prompt
    encoder = ChatPromptFormatter(tokenizer, system=system, user_template=section.user_template)
  else:
    encoder = TextEncoder(tokenizer, eos_token=eos_token, user_template=section.user_template)
  if section.name == "arithmetic":
    return ArithmeticTask(
      seed=seed,
      digits=section.digits,
      ops=section.ops,
      answer=section.answer,
      format_reward=section.format_reward,
      encoder=encoder,
      holdout=section.holdout,
      transfer_digits=section.transfer_digits,
    )
  if section.name == "gsm8k":
    if isinstance(encoder, CharTokenizer):
      raise ValueError(
        "task.name='gsm8k' needs a text tokenizer (pass the model's tokenizer); the character "
        "tokenizer only covers arithmetic"
      )
    return GSM8KTask(
      section.path, encoder=encoder, eval_path=section.eval_path, seed=seed, format_reward=section.format_reward
    )
  raise ValueError(f"task.name={section.name!r} must be one of arithmetic, gsm8k")
