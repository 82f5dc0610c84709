"""PromptsTask: the user's own prompts and reward: (prompt, reference) rows and a reward(completion, reference).

From YAML:

  task:
    name: prompts
    path: data/train.jsonl        # one {"prompt": "...", "reference": "..."} object per line
    eval_path: data/eval.jsonl    # null: the training file
    reward: my_package.rewards:score   # "module:function" on the import path; or exact / last_number (built in)

From Python: `rl.train(cfg, task=lambda encoder, seed: PromptsTask(rows, reward=my_fn, encoder=encoder, seed=seed))`
(the loop passes the model's prompt encoder: the config's chat template or plain text over its tokenizer), or
`task=` any `Task` whose encoder is the model's.

A reward is called as reward(completion text up to EOS, reference) and must return a number; one that raises, hangs
past `task.reward_timeout_s` or returns a non-number scores 0 and is counted (`tasks.reward.score_batch`).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Callable, Sequence

from lrl_jax.tasks.base import PromptEncoder, RowsTask
from lrl_jax.tasks.numbers import find_numbers, parse_number

__all__ = ["PromptsTask", "load_prompts", "resolve_reward", "exact_match", "last_number_match"]


def exact_match(completion: str, reference: str) -> float:
  """1.0 iff the completion, stripped, equals the reference, stripped."""
  return float(completion.strip() == reference.strip())


def last_number_match(completion: str, reference: str) -> float:
  """1.0 iff the last number of the completion equals the reference's number (exact decimal comparison)."""
  nums = find_numbers(completion)
  ref = find_numbers(reference)
  return float(bool(nums) and bool(ref) and parse_number(nums[-1]) == parse_number(ref[-1]))


_BUILTIN = {"exact": exact_match, "last_number": last_number_match}


def resolve_reward(spec: str | Callable) -> Callable[[str, str], float]:
  """A reward function from "exact", "last_number", "module:function" (imported), or a callable itself.

  Raises:
    ValueError naming the spec: not of the form module:function, the module does not import, or the name is not a
    callable in it.
  """
  if callable(spec):
    return spec
  if spec in _BUILTIN:
    return _BUILTIN[spec]
  if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
    raise ValueError(
      f"task.reward={spec!r}: expected 'exact', 'last_number' or 'module:function' (a function on the import path)"
    )
  mod, name = spec.split(":")
  try:
    module = importlib.import_module(mod)
  except ImportError as e:
    raise ValueError(f"task.reward={spec!r}: module {mod!r} does not import ({e})") from None
  fn = getattr(module, name, None)
  if not callable(fn):
    raise ValueError(f"task.reward={spec!r}: {mod} has no callable {name!r}")
  return fn


def load_prompts(
  path,
  *,
  prompt_key: str = "prompt",
  reference_key: str = "reference",
  what: str = "prompts",
  check: Callable[[str, str], str | None] | None = None,
) -> list[tuple[str, str]]:
  """(prompt, reference) rows of a JSONL file of {"prompt": str, "reference": str} objects (blank lines skipped).

  Raises FileNotFoundError, or ValueError naming the file and line of a row that is not a JSON object with those two
  string fields, or of a file without rows. `what` names the file in the not-found error; `check(prompt, reference)`
  returns what is wrong with a row (named with its file and line), or None.
  """
  path = Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"{what} file not found: {path}")
  rows = []
  with path.open(encoding="utf-8") as f:
    for lineno, line in enumerate(f, start=1):
      if not line.strip():
        continue
      where = f"{path}:{lineno}"
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
      if not isinstance(row, dict):
        raise ValueError(
          f"{where}: expected a JSON object with {prompt_key!r} and {reference_key!r}; got {type(row).__name__}"
        )
      for key in (prompt_key, reference_key):
        if not isinstance(row.get(key), str):
          raise ValueError(f"{where}: field {key!r} must be a string; got {row.get(key)!r:.80}")
      bad = None if check is None else check(row[prompt_key], row[reference_key])
      if bad is not None:
        raise ValueError(f"{where}: {bad}")
      rows.append((row[prompt_key], row[reference_key]))
  if not rows:
    raise ValueError(f"{path}: no rows")
  return rows


class PromptsTask(RowsTask):
  """A task from rows of (prompt, reference) and a reward function (module docstring).

  Data order: the train split runs through the rows in a fresh permutation per epoch,
  `np.random.default_rng([seed, epoch]).permutation(n)`, so batch `step` is a pure function of (seed, step, batch
  size). The eval split is `eval_rows` (or the train rows) in order, wrapping.

  Args:
    rows: training (prompt, reference) pairs.
    reward: reward(completion, reference) -> number, or a `resolve_reward` spec ("exact", "last_number",
      "module:function").
    encoder: the model's `PromptEncoder`.
    eval_rows: evaluation pairs; None -> `rows`.
    seed: data seed.
  """

  def __init__(
    self,
    rows: Sequence[tuple[str, str]],
    *,
    reward: str | Callable[[str, str], float] = "exact",
    encoder: PromptEncoder,
    eval_rows: Sequence[tuple[str, str]] | None = None,
    seed: int = 0,
  ):
    self.rows = [(str(p), str(r)) for p, r in rows]
    if not self.rows:
      raise ValueError("PromptsTask: no rows")
    self.eval_rows = self.rows if eval_rows is None else [(str(p), str(r)) for p, r in eval_rows]
    if not self.eval_rows:
      raise ValueError("PromptsTask: no eval rows")
    self.reward_fn = resolve_reward(reward)
    self.encoder = encoder
    self.seed = int(seed)

  def reward(self, completion: str, reference: str) -> float:
    return self.reward_fn(completion, reference)
