"""PromptsTask, the user's own task: JSONL rows with errors that name the file and line, rewards by name, from a
module or a callable, a data order that is a function of (seed, step), and the config's checks."""

import json

import pytest

from lrl_jax.config import ConfigError, load_config
from lrl_jax.tasks import CharTokenizer, PromptsTask, load_prompts, resolve_reward


def _jsonl(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return path


def test_rows_rewards_and_order(tmp_path):
  f = _jsonl(tmp_path / "t.jsonl", [{"prompt": f"{i}+1=", "reference": str(i + 1)} for i in range(10)])
  rows = load_prompts(f)
  assert rows[3] == ("3+1=", "4")
  t = PromptsTask(rows, reward="last_number", encoder=CharTokenizer(), seed=4)
  p0, r0 = t.prompts(0, 10)
  assert sorted(p0) == sorted(p for p, _ in rows)  # one epoch = a permutation of the rows
  assert t.prompts(0, 10) == PromptsTask(rows, encoder=CharTokenizer(), seed=4).prompts(0, 10)
  assert t.prompts(0, 3, split="eval") == (["0+1=", "1+1=", "2+1="], ["1", "2", "3"])
  assert t.reward("it is 4", "4") == 1.0 and t.reward("it is 5", "4") == 0.0
  assert resolve_reward("exact")(" 4 ", "4") == 1.0
  assert resolve_reward("lrl_jax.tasks.prompts:last_number_match")("x 7", "7") == 1.0
  calls = []
  t2 = PromptsTask(rows, reward=lambda c, r: calls.append((c, r)) or 0.5, encoder=CharTokenizer())
  rewards, stats = t2.score(["a", "b"], ["1", "2"])
  assert list(rewards) == [0.5, 0.5] and calls == [("a", "1"), ("b", "2")] and stats["failed"] == 0


def test_bad_input_names_the_file_line_or_spec(tmp_path):
  with pytest.raises(FileNotFoundError, match="prompts file not found"):
    load_prompts(tmp_path / "none.jsonl")
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"prompt": "a", "reference": "b"}\n\n{"prompt": "a"}\n')
  with pytest.raises(ValueError, match=r"bad.jsonl:3: field 'reference' must be a string"):
    load_prompts(bad)
  bad.write_text("not json\n")
  with pytest.raises(ValueError, match=r"bad.jsonl:1: not valid JSON"):
    load_prompts(bad)
  for spec, msg in [
    ("nope", "expected 'exact'"),
    ("no_such_mod_xyz:f", "does not import"),
    ("json:nope", "no callable"),
  ]:
    with pytest.raises(ValueError, match=msg):
      resolve_reward(spec)
  with pytest.raises(ConfigError, match="path"):
    load_config(None, ["task.name=prompts"])
  with pytest.raises(ConfigError, match="does not import"):
    load_config(None, ["task.name=prompts", "task.path=x.jsonl", "task.reward=no_such_mod_xyz:f"])
  with pytest.raises(ConfigError, match="applies to task.name=prompts"):
    load_config(None, ["task.reward=exact"])
