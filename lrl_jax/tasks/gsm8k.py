"""GSM8KTask: grade-school math from a local GSM8K-format JSONL file (the user brings the data)."""

from __future__ import annotations

from pathlib import Path

from lrl_jax.tasks.base import PromptEncoder, RowsTask
from lrl_jax.tasks.numbers import extract_completion_answer, extract_reference_answer, parse_number
from lrl_jax.tasks.prompts import load_prompts

__all__ = ["GSM8KTask", "load_gsm8k"]


def load_gsm8k(path) -> list[tuple[str, str]]:
  """(question, answer) rows of a JSONL file of {"question": str, "answer": "... #### 42"} objects.

  Blank lines are skipped. Raises FileNotFoundError, or ValueError naming the file and line of a row
  that is not JSON, lacks a string question / answer, or whose answer has no number after '####'.
  """

  def no_number(question: str, answer: str) -> str | None:
    del question
    if extract_reference_answer(answer) is None:
      return f"answer has no number after '####': {answer[-80:]!r}"
    return None

  return load_prompts(path, prompt_key="question", reference_key="answer", what="GSM8K", check=no_number)


class GSM8KTask(RowsTask):
  """Questions from a GSM8K-format JSONL file; reward 1 iff the extracted number equals the reference's.

  Data order: the train split runs through the rows in a fresh permutation per epoch,
  `np.random.default_rng([seed, epoch]).permutation(n)`, so batch `step` is a pure function of
  (seed, step, batch size). The eval split is `eval_path` (or `path` when None) in file order, wrapping.

  Reward: the reference answer is the last number after '####'; the completion's is the number right
  after its last '####', else its last number (commas stripped; exact decimal comparison, so "42.0" == "42").
  1.0 if equal, `format_reward` if the completion holds a different number, else 0.

  Args:
    path: training JSONL file.
    encoder: a `PromptEncoder` over a text tokenizer (e.g. `ChatPromptFormatter`).
    eval_path: evaluation JSONL file (e.g. GSM8K's test.jsonl); None -> `path`.
    seed: data seed.
    format_reward: reward in [0, 1) for a completion with a wrong number.
  """

  def __init__(self, path, *, encoder: PromptEncoder, eval_path=None, seed: int = 0, format_reward: float = 0.0):
    if not 0.0 <= format_reward < 1.0:
      raise ValueError(f"GSM8KTask.format_reward must be in [0, 1); got {format_reward!r}")
    self.path = Path(path)
    self.encoder = encoder
    self.seed = int(seed)
    self.format_reward = float(format_reward)
    self.rows = load_gsm8k(self.path)
    self.eval_rows = self.rows if eval_path is None else load_gsm8k(eval_path)

  def reward(self, completion: str, reference: str) -> float:
    ref = extract_reference_answer(reference)
    if ref is None:
      raise ValueError(f"GSM8KTask.reward: reference has no number after '####': {reference[-80:]!r}")
    got = extract_completion_answer(completion)
    if got is None:
      return 0.0
    return 1.0 if parse_number(got) == parse_number(ref) else self.format_reward
