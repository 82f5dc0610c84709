"""GSM8K-format JSONL: numeric answer extraction, rewards, data order, and errors naming the file and line."""

import json

import pytest

from lrl_jax.tasks import (
  CharTokenizer,
  GSM8KTask,
  extract_completion_answer,
  extract_reference_answer,
  load_gsm8k,
  parse_number,
)

ROWS = [
  {"question": "Ann has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
  {"question": "A car costs $1,200 more than 800. Price?", "answer": "800 + 1,200 = 2000\n#### 2,000"},
  {"question": "Temperature drops from 2 by 7?", "answer": "2 - 7 = -5\n#### -5"},
  {"question": "Half of 7?", "answer": "7 / 2 = 3.5\n#### 3.50"},
]


@pytest.mark.parametrize(
  "reference, expected",
  [
    ("#### 42", "42"),
    ("so 1,234 + 1 ... #### 1,235", "1235"),
    ("#### -5", "-5"),
    ("#### 3.50", "3.50"),
    ("#### $18.", "18"),
    ("12 then #### 7 or 8", "8"),  # the last number after '####'
    ("the answer is 42", None),  # no '####'
    ("#### none", None),
  ],
)
def test_reference_extraction(reference, expected):
  assert extract_reference_answer(reference) == expected


@pytest.mark.parametrize(
  "completion, expected",
  [
    ("The total is 5 + 2 = 7.\n#### 7", "7"),
    ("#### 1,000 dollars and 5 cents", "1000"),  # the number right after '####'
    ("It costs 1,000 dollars.", "1000"),  # no '####': the last number
    ("first 3 then -4", "-4"),
    ("x = 2.25", "2.25"),
    ("#### unknown, maybe 12", "12"),
    ("no numbers here", None),
    ("", None),
  ],
)
def test_completion_extraction(completion, expected):
  assert extract_completion_answer(completion) == expected


def test_parse_number_is_exact():
  assert parse_number("3.50") == parse_number("3.5") and parse_number("1,000") == parse_number("1000")
  assert parse_number("0.1") != parse_number("0.10000001") and parse_number("abc") is None


def _write(tmp_path, lines, name="train.jsonl"):
  p = tmp_path / name
  p.write_text("\n".join(lines) + "\n", encoding="utf-8")
  return p


def test_load_and_reward(tmp_path):
  path = _write(tmp_path, [json.dumps(r) for r in ROWS[:2]] + [""] + [json.dumps(r) for r in ROWS[2:]])
  assert load_gsm8k(path) == [(r["question"], r["answer"]) for r in ROWS]
  t = GSM8KTask(path, encoder=CharTokenizer(), format_reward=0.1)
  ref = {r["question"]: r["answer"] for r in ROWS}
  assert t.reward("so #### 2000", ref[ROWS[1]["question"]]) == 1.0
  assert t.reward("It is 2,000.", ref[ROWS[1]["question"]]) == 1.0
  assert t.reward("#### -5", ROWS[2]["answer"]) == 1.0 and t.reward("#### 5", ROWS[2]["answer"]) == 0.1
  assert t.reward("#### 3.5", ROWS[3]["answer"]) == 1.0
  assert t.reward("I don't know", ROWS[0]["answer"]) == 0.0


def test_data_order_is_a_permutation_per_epoch(tmp_path):
  path = _write(tmp_path, [json.dumps(r) for r in ROWS])
  t = GSM8KTask(path, encoder=CharTokenizer(), seed=1)
  qs, refs = t.prompts(0, 8)  # two epochs of 4 rows
  assert sorted(qs[:4]) == sorted(r["question"] for r in ROWS) == sorted(qs[4:])
  assert (qs, refs) == GSM8KTask(path, encoder=CharTokenizer(), seed=1).prompts(0, 8)
  assert t.prompts(1, 4) == (qs[4:], refs[4:])
  assert t.prompts(0, 4, split="eval")[0] == [r["question"] for r in ROWS]  # eval: file order


@pytest.mark.parametrize(
  "bad, match",
  [
    ('{"question": "q", "answer": "#### 1"', r"bad\.jsonl:3: not valid JSON"),
    ('{"question": "q"}', r"bad\.jsonl:3: field 'answer' must be a string"),
    ('{"question": 5, "answer": "#### 1"}', r"bad\.jsonl:3: field 'question' must be a string"),
    ('{"question": "q", "answer": "42"}', r"bad\.jsonl:3: answer has no number after '####'"),
    ("[1, 2]", r"bad\.jsonl:3: expected a JSON object"),
  ],
)
def test_bad_row_names_file_and_line(tmp_path, bad, match):
  path = _write(tmp_path, [json.dumps(ROWS[0]), json.dumps(ROWS[1]), bad], name="bad.jsonl")
  with pytest.raises(ValueError, match=match):
    load_gsm8k(path)


def test_missing_file(tmp_path):
  with pytest.raises(FileNotFoundError, match="nope.jsonl"):
    GSM8KTask(tmp_path / "nope.jsonl", encoder=CharTokenizer())
