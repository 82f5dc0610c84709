"""ArithmeticTask and CharTokenizer: deterministic data by (seed, step), token layouts, exact-answer rewards.

References are independent of the task's code: each prompt is parsed back with a regex and evaluated with
Python integers; token layouts are checked against hand-written id lists."""

import re

import numpy as np
import pytest

from lrl_jax.tasks import ArithmeticTask, CharTokenizer

ALL_OPS = ("+", "-", "*", "eq")
TOK = CharTokenizer()


def _solve(prompt: str) -> int:
  """Evaluates a prompt independently of ArithmeticTask.problem."""
  if m := re.fullmatch(r"x\+(\d+)=(\d+);x=", prompt):
    return int(m[2]) - int(m[1])
  m = re.fullmatch(r"(\d+)([-+*])(\d+)=", prompt)
  assert m, prompt
  a, op, b = int(m[1]), m[2], int(m[3])
  return {"+": a + b, "-": a - b, "*": a * b}[op]


def test_prompts_are_deterministic_per_seed_and_step():
  t = ArithmeticTask(seed=3, digits=3, ops=ALL_OPS)
  assert t.prompts(5, 16) == ArithmeticTask(seed=3, digits=3, ops=ALL_OPS).prompts(5, 16)
  assert t.prompts(5, 16) != t.prompts(6, 16)
  assert t.prompts(5, 16) != ArithmeticTask(seed=4, digits=3, ops=ALL_OPS).prompts(5, 16)
  assert t.prompts(5, 16, split="eval") != t.prompts(5, 16)
  # Batch `step` of size B holds problems step*B ... step*B + B - 1, whatever B was used before.
  p8, r8 = t.prompts(0, 8)
  p4, r4 = t.prompts(1, 4)
  assert (p4, r4) == (p8[4:], r8[4:])


@pytest.mark.parametrize("digits", [1, 2, 4])
def test_references_are_correct_and_within_digits(digits):
  t = ArithmeticTask(seed=0, digits=digits, ops=ALL_OPS)
  prompts, refs = t.prompts(0, 400)
  seen = set()
  for p, r in zip(prompts, refs):
    assert int(r) == _solve(p) and r == str(int(r)) and int(r) >= 0, (p, r)
    nums = [int(x) for x in re.findall(r"\d+", p)]
    seen.add(p[1] if p.startswith("x") else re.search(r"[-+*]", p)[0])
    if p.startswith("x"):
      assert nums[0] < 10**digits and 0 <= int(r) < 10**digits
    else:
      assert nums[0] < 10**digits and nums[1] < 10 ** (1 if "*" in p else digits)
  assert seen == {"+", "-", "*"}  # eq prompts start "x+"; all four ops appear in 400 draws
  assert any(p.startswith("x") for p in prompts)


def test_max_lengths_bound_every_problem():
  t = ArithmeticTask(seed=1, digits=2, ops=ALL_OPS)
  prompts, refs = t.prompts(0, 3000)
  assert max(len(p) for p in prompts) + 1 == t.max_prompt_len  # + BOS; the bound is reached
  assert max(len(r) for r in refs) + 1 <= t.max_answer_len  # + EOS
  assert ArithmeticTask(digits=2).max_prompt_len == 1 + len("99+99=")
  assert ArithmeticTask(digits=2).max_answer_len == 1 + len("198")


def test_tokenizer_round_trip_and_layout():
  assert TOK.vocab_size == 20 < 32
  assert (TOK.pad_id, TOK.bos_id, TOK.eos_id) == (0, 1, 2)
  text = "0123456789+-*=x; "
  ids = TOK.encode(text)
  assert ids == list(range(3, 20))
  assert TOK.decode(ids) == text
  assert TOK.encode("12+7=", add_bos=True, add_eos=True) == [1, 4, 5, 13, 10, 16, 2]
  # PAD and BOS are skipped; everything from the first EOS on is dropped.
  assert TOK.decode([0, 1, 4, 12, 2, 5, 5]) == "19"
  assert TOK.decode([4, 12, 2, 5], stop_at_eos=False) == "192"
  with pytest.raises(ValueError, match=r"character 'a' at position 2"):
    TOK.encode("12a")
  with pytest.raises(ValueError, match="id 20 is outside"):
    TOK.decode([20])


def test_encode_prompts_left_and_right_padding():
  t = ArithmeticTask(digits=2)
  tok, valid = t.encode_prompts(["1+2=", "12+7="], length=7)
  # BOS=1, digits d -> d+3, '+' 13, '=' 16, pad 0.
  np.testing.assert_array_equal(tok, [[0, 0, 1, 4, 13, 5, 16], [0, 1, 4, 5, 13, 10, 16]])
  np.testing.assert_array_equal(valid, tok != 0)
  assert tok.dtype == np.int32 and valid.dtype == bool
  tok, valid = t.encode_prompts(["1+2=", "12+7="], padding="right")
  assert tok.shape == (2, t.max_prompt_len)  # default length: the task's fixed maximum
  np.testing.assert_array_equal(tok[0, :5], [1, 4, 13, 5, 16])
  assert not valid[0, 5:].any() and valid[0, :5].all()
  with pytest.raises(ValueError, match="prompt 1 has 6 tokens, more than length=5"):
    t.encode_prompts(["1+2=", "12+7="], length=5)


def test_supervised_batch_masks_exactly_the_answer():
  t = ArithmeticTask(seed=2, digits=2, ops=ALL_OPS)
  b = t.supervised_batch(3, 32)
  prompts, refs = t.prompts(3, 32)
  P = b.prompt_len
  assert P == t.max_prompt_len and b.tokens.shape == (32, P + t.max_answer_len)
  assert not b.loss_mask[:, :P].any()
  for i, (p, r) in enumerate(zip(prompts, refs)):
    prompt_ids = b.tokens[i, :P][b.valid[i, :P]]
    assert list(prompt_ids) == [1] + TOK.encode(p)
    answer_ids = b.tokens[i][b.loss_mask[i]]
    assert list(answer_ids) == TOK.encode(r) + [TOK.eos_id]
    assert (b.loss_mask[i] <= b.valid[i]).all() and b.valid[i, P:].sum() == len(r) + 1
    assert b.valid[i, :P].sum() == len(p) + 1 and not b.valid[i, :P][: P - len(p) - 1].any()  # left pad


def test_exact_reward():
  t = ArithmeticTask()
  assert t.reward("19", "19") == 1.0
  assert t.reward(" 19 ", "19") == 1.0
  assert t.reward("18", "19") == 0.0
  assert t.reward("019", "19") == 0.0
  assert t.reward("19 5", "19") == 0.0  # extra text before EOS is part of the answer
  assert t.reward("", "19") == 0.0
  # Decoding stops at EOS: text generated after it does not count.
  ids = TOK.encode("19") + [TOK.eos_id] + TOK.encode("55+")
  assert t.reward(TOK.decode_completion(ids), "19") == 1.0
  assert t.decode_completions(np.array([ids, TOK.encode("1") + [TOK.eos_id, 0, 0, 0, 0]])) == ["19", "1"]
  mask = np.array([[True] * 3 + [False] * 3, [True] * 6])
  assert t.decode_completions(np.array([ids, ids]), mask) == ["19", "19"]
  f = ArithmeticTask(format_reward=0.1)
  assert (f.reward("19", "19"), f.reward("18", "19"), f.reward("1+8", "19"), f.reward("", "19")) == (1.0, 0.1, 0, 0)


def test_last_number_reward():
  t = ArithmeticTask(answer="last_number")
  assert t.reward("12+7=19", "19") == 1.0
  assert t.reward("The answer is 1,019.", "1019") == 1.0
  assert t.reward("19.0", "19") == 1.0
  assert t.reward("19 or 20", "19") == 0.0
  assert t.reward("no idea", "19") == 0.0


def test_bad_arguments():
  with pytest.raises(ValueError, match="digits"):
    ArithmeticTask(digits=0)
  with pytest.raises(ValueError, match="ops"):
    ArithmeticTask(ops=("/",))
  with pytest.raises(ValueError, match="split"):
    ArithmeticTask().prompts(0, 2, split="test")


def test_holdout_eval_is_disjoint_fixed_and_distinct():
  """holdout = f: eval problems are distinct, held out (u < f), the same for every seed, and never drawn for training;
  the held-out share of the space is f within a binomial 6-sigma bound."""
  from lrl_jax.tasks.arithmetic import heldout_u  # noqa: PLC0415  (a module helper, not public API)

  t = ArithmeticTask(seed=0, digits=2, holdout=0.1, transfer_digits=(1, 3))
  ev, refs = t.prompts(0, 300, split="eval")
  assert len(set(ev)) == 300 and all(heldout_u(p) < 0.1 for p in ev)
  assert [str(_solve(p)) for p in ev] == refs
  assert ev == ArithmeticTask(seed=5, digits=2, holdout=0.1).prompts(0, 300, split="eval")[0]  # fixed set
  assert t.prompts(1, 100, split="eval")[0] == ev[100:200]  # batches of the same list
  train = set(t.prompts(0, 4000)[0]) | set(ArithmeticTask(seed=1, digits=2, holdout=0.1).prompts(0, 4000)[0])
  assert not train & set(t.prompts(0, 900, split="eval")[0])
  space = [f"{a}+{b}=" for a in range(100) for b in range(100)]
  share = np.mean([heldout_u(p) < 0.1 for p in space])
  assert abs(share - 0.1) < 6 * np.sqrt(0.1 * 0.9 / len(space))
  sets = t.eval_sets(150)
  assert sets[""] == t.prompts(0, 150, split="eval")
  assert len(sets["d1"][0]) == 100 and len(set(sets["d1"][0])) == 100  # all 100 one-digit sums (fewer than asked)
  assert all(re.fullmatch(r"\d\+\d=", p) for p in sets["d1"][0])
  assert len(set(sets["d3"][0])) == 150 and [str(_solve(p)) for p in sets["d3"][0]] == sets["d3"][1]
  with pytest.raises(ValueError, match="held-out problems"):
    ArithmeticTask(digits=1, holdout=0.1).prompts(0, 50, split="eval")
  with pytest.raises(ValueError, match="holdout"):
    ArithmeticTask(holdout=1.0)
