"""Builds a Task from a `TaskSection` of the run config."""

from __future__ import annotations

from typing import Any

from lrl_jax.tasks.arithmetic import ArithmeticTask
from lrl_jax.tasks.base import Task
from lrl_jax.tasks.chat import SMOLLM2_SYSTEM, ChatPromptFormatter, TextEncoder
from lrl_jax.tasks.gsm8k import GSM8KTask
from lrl_jax.tasks.prompts import PromptsTask, load_prompts
from lrl_jax.tasks.tokenizer import CharTokenizer

__all__ = ["task_from_config", "encoder_from_config"]


def encoder_from_config(section, *, tokenizer: Any = None, eos_token: str = "<|im_end|>"):
  """The prompt encoder a `TaskSection` asks for over the model's tokenizer: its chat template, plain text, or (no
  tokenizer: the tiny model) the arithmetic CharTokenizer."""
  if tokenizer is None:
    if section.template != "none":
      raise ValueError(
        f"task.template={section.template!r} needs the model's tokenizer; got tokenizer=None "
        "(the character tokenizer has no chat template)"
      )
    return CharTokenizer()
  if section.template == "chat":
    system = SMOLLM2_SYSTEM if section.system_prompt is None else section.system_prompt
    return ChatPromptFormatter(tokenizer, system=system, user_template=section.user_template)
  return TextEncoder(tokenizer, eos_token=eos_token, user_template=section.user_template)


def task_from_config(
  section, *, seed: int, tokenizer: Any = None, eos_token: str = "<|im_end|>", task: Any = None
) -> Task:
  """The task a `lrl_jax.config.TaskSection` describes (or the user's `task`).

  Args:
    section: a TaskSection.
    seed: data seed (the run seed).
    tokenizer: None for the embedded CharTokenizer (tiny model), else the model's `tokenizers.Tokenizer`.
    eos_token: EOS of a plain-text (template none) encoder over `tokenizer`.
    task: a `Task` to use as it is, or a callable (encoder, seed) -> Task given the encoder the section asks for
      (`rl.train(cfg, task=...)`); None: the section's own task.
  """
  if isinstance(task, Task):
    return task
  if task is not None:
    if not callable(task):
      raise TypeError(f"task must be a Task or a callable (encoder, seed) -> Task; got {type(task).__name__}")
    made = task(encoder_from_config(section, tokenizer=tokenizer, eos_token=eos_token), seed)
    if not isinstance(made, Task):
      raise TypeError(f"the task factory returned a {type(made).__name__}, not a lrl_jax.tasks.Task")
    return made
  encoder = encoder_from_config(section, tokenizer=tokenizer, eos_token=eos_token)
  if section.name == "prompts":
    eval_rows = None if section.eval_path is None else load_prompts(section.eval_path)
    return PromptsTask(
      load_prompts(section.path), reward=section.reward or "exact", encoder=encoder, eval_rows=eval_rows, seed=seed
    )
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
  raise ValueError(f"task.name={section.name!r} must be one of arithmetic, gsm8k, prompts")
