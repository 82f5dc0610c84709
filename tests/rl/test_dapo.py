"""DAPO's dynamic sampling and overlong shaping (lrl_jax/rl/dapo.py and the loop's generation rounds), against
hand-computed values of DAPO's formulas (arXiv 2503.14476, Eq. 13 and §3.2 / §3.4)."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lrl_jax import learner, models
from lrl_jax.config import ConfigError, load_config
from lrl_jax.rl import dapo
from lrl_jax.rl import loop as loop_mod
from lrl_jax.rollout import Rollout


def test_overlong_penalty_is_dapos_soft_punishment():
  # L_max = 10, L_cache = 4: 0 up to 6 tokens, then (6 - |y|) / 4: -0.25, -0.5, -0.75, -1 at 10
  got = dapo.overlong_penalty([1, 6, 7, 8, 9, 10], max_len=10, buffer=4)
  np.testing.assert_array_equal(got, np.float32([0, 0, -0.25, -0.5, -0.75, -1.0]))
  np.testing.assert_array_equal(dapo.overlong_penalty([8, 10], max_len=10, buffer=4, factor=2.0), np.float32([-1, -2]))
  np.testing.assert_array_equal(dapo.overlong_penalty([10, 3], max_len=10, buffer=0), np.float32([0, 0]))
  with pytest.raises(ValueError, match="buffer .12. must not exceed the maximum length .10."):
    dapo.overlong_penalty([1], max_len=10, buffer=12)


def _rollout(tokens, loss_mask, P, G=1):
  tokens = jnp.asarray(tokens, jnp.int32)
  loss_mask = jnp.asarray(loss_mask, bool)
  valid = jnp.ones(tokens.shape, bool).at[:, P:].set(loss_mask[:, P:])
  return Rollout(
    tokens=tokens,
    valid=valid,
    loss_mask=loss_mask,
    sampler_logp=jnp.where(loss_mask, -0.5, 0.0),
    group_size=G,
    prompt_len=P,
  )


def test_truncated_rows_are_the_ones_cut_without_eos():
  EOS = 9
  r = _rollout(
    [[5, 1, 2, 3], [5, 1, EOS, 0], [5, 1, 2, EOS], [5, 4, 0, 0]],
    [[0, 1, 1, 1], [0, 1, 1, 0], [0, 1, 1, 1], [0, 1, 0, 0]],
    P=1,
  )
  # N = 3: row 0 used all 3 tokens without EOS (cut); row 2 used all 3 and ended in EOS; rows 1, 3 are shorter
  np.testing.assert_array_equal(dapo.truncated_rows(r, [EOS], 3), [True, False, False, False])


def test_groups_with_signal():
  r = [1, 1, 1, 0, 0, 0, 1, 0, 0.5, 0.5]
  np.testing.assert_array_equal(dapo.groups_with_signal(r, 2), [False, True, False, True, False])


def test_concat_pads_prompts_on_the_left_and_keeps_the_numbers():
  cfg = models.ModelConfig(
    arch="qwen2", vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2
  )
  params = models.init_params(cfg, jax.random.PRNGKey(0), std=0.3)
  a = _rollout([[3, 4, 5, 6], [3, 4, 7, 8]], [[0, 0, 1, 1], [0, 0, 1, 1]], P=2, G=2)
  b = _rollout([[9, 3, 4, 5, 6], [9, 3, 4, 7, 2]], [[0, 0, 0, 1, 1], [0, 0, 0, 1, 1]], P=3, G=2)
  cat = dapo.concat_rollouts([a, b])
  assert cat.prompt_len == 3 and cat.group_size == 2 and cat.tokens.shape == (4, 5)
  np.testing.assert_array_equal(cat.tokens[:2, 1:], a.tokens)
  np.testing.assert_array_equal(cat.valid[:2, 0], [False, False])  # the new slot is padding
  np.testing.assert_array_equal(cat.loss_mask[:2, 1:], a.loss_mask)
  np.testing.assert_array_equal(cat.tokens[2:], b.tokens)
  # the padded rows score their completions as before: padding is attended by no token and RoPE positions count
  # valid tokens, so only the length of masked reductions changes (exact zeros added: f32 ulps of the sums)
  lp_a = learner.logprobs(params, a, cfg)
  lp_cat = learner.logprobs(params, cat.take(jnp.arange(2)).replace(group_size=2), cfg)
  np.testing.assert_allclose(lp_cat[:, 1:], lp_a, rtol=0, atol=1e-5)
  picked = dapo.take_groups(cat, [1], 2)
  assert picked.group_size == 2
  np.testing.assert_array_equal(picked.tokens, b.tokens)


# --------------------------------------------------------------------------- the loop's rounds


def _fake_step(monkeypatch, round_rewards, *, B, G, max_rounds, dynamic=True):
  """Runs `loop._sample_step` with generation and scoring replaced: round r's rollout has prompt length 2 + r and
  tokens that name (round, row); its rewards are `round_rewards[r]`."""
  calls = []

  def fake_generate(served, tok, val, setup, cfg, key, *, evaluation, lora, group_size):
    r = len(calls)
    calls.append(np.asarray(jax.random.key_data(key)) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key)
    P, N, R = 2 + r, 3, B * G
    toks = np.zeros((R, P + N), np.int32)
    toks[:, P:] = (100 * r + np.arange(R))[:, None]
    mask = np.zeros((R, P + N), bool)
    mask[:, P:] = True
    return _rollout(toks, mask, P, G)

  def fake_score(task, roll, P, refs, cfg, pool=None):
    return np.asarray(round_rewards[len(calls) - 1], np.float32), {"failed": 0, "timeouts": 0}

  monkeypatch.setattr(loop_mod, "generate_rollout", fake_generate)
  monkeypatch.setattr(loop_mod, "score_rollout", fake_score)
  monkeypatch.setattr(loop_mod, "encode_prompt_batch", lambda task, prompts: (np.zeros((B, 2)), np.ones((B, 2))))
  task = types.SimpleNamespace(prompts=lambda i, n: ([f"p{i}"] * n, [f"r{i}"] * n))
  cfg = load_config(
    None,
    [
      f"run.batch_prompts={B}",
      f"sampler.group_size={G}",
      f"dapo.dynamic_sampling={str(dynamic).lower()}",
      f"dapo.max_rounds={max_rounds}",
    ],
  )
  out = loop_mod._sample_step(
    0, task, None, cfg, None, None, np.zeros((B, 2)), np.ones((B, 2)), [], jax.random.PRNGKey(7), None
  )
  return out, calls


def test_dynamic_sampling_keeps_groups_with_signal_across_rounds(monkeypatch):
  B, G = 4, 2
  r0 = [1, 0, 1, 1, 0, 0, 0, 1]  # groups: signal, none, none, signal
  r1 = [1, 1, 1, 0, 0, 1, 0, 0]  # groups: none, signal, signal, none
  (roll, rewards, _, rec), calls = _fake_step(monkeypatch, [r0, r1], B=B, G=G, max_rounds=3)
  assert len(calls) == 2 and rec["sampling/rounds"] == 2  # 2 + 2 groups with signal: the batch is full
  # the kept groups in sampled order: round 0's groups 0 and 3, round 1's groups 1 and 2 (global 0, 3, 5, 6)
  want_rows = [0, 1, 6, 7, 102, 103, 104, 105]
  np.testing.assert_array_equal(roll.tokens[:, -1], want_rows)
  np.testing.assert_array_equal(rewards, [1, 0, 0, 1, 1, 0, 0, 1])  # r0[0:2], r0[6:8], r1[2:6]
  assert roll.prompt_len == 3 and roll.group_size == G and roll.tokens.shape == (8, 6)
  assert rec["sampling/dropped_frac"] == 0.5 and rec["sampling/filled_groups"] == 0
  assert rec["tokens"] == 2 * B * G * 3  # every generated token counts, dropped groups' too
  np.testing.assert_array_equal(rec["rewards"], r0 + r1)
  # round 0 draws with the step key itself, round r with fold_in(step key, r)
  np.testing.assert_array_equal(calls[0], jax.random.PRNGKey(7))
  np.testing.assert_array_equal(calls[1], jax.random.fold_in(jax.random.PRNGKey(7), 1))


def test_dynamic_sampling_fills_with_dropped_groups_when_rounds_run_out(monkeypatch):
  B, G = 4, 2
  flat = [1, 1, 0, 0, 1, 1, 0, 0]  # no group has signal
  one = [1, 0, 1, 1, 0, 0, 1, 1]  # group 0 only
  (roll, rewards, _, rec), calls = _fake_step(monkeypatch, [flat, one], B=B, G=G, max_rounds=2)
  assert len(calls) == 2 and rec["sampling/filled_groups"] == 3
  # round 1's group 0 (global 4) has signal; the first three dropped ones fill: global groups 0, 1, 2
  np.testing.assert_array_equal(roll.tokens[:, -1], [0, 1, 2, 3, 4, 5, 100, 101])
  assert rec["sampling/dropped_frac"] == 7 / 8


def test_without_dynamic_sampling_the_step_is_one_round(monkeypatch):
  (roll, rewards, _, rec), calls = _fake_step(monkeypatch, [[1, 1, 0, 0]], B=2, G=2, max_rounds=3, dynamic=False)
  assert len(calls) == 1 and "sampling/rounds" not in rec
  np.testing.assert_array_equal(roll.tokens[:, -1], [0, 1, 2, 3])


def test_config_rules():
  with pytest.raises(ConfigError, match="dapo.dynamic_sampling .* needs learner.policy_loss grpo or gspo"):
    load_config(None, ["dapo.dynamic_sampling=true", "learner.policy_loss=ppo"])
  with pytest.raises(ConfigError, match="dapo.overlong_buffer=9 must not exceed sampler.max_new_tokens=8"):
    load_config(None, ["dapo.overlong_buffer=9", "sampler.max_new_tokens=8"])
  with pytest.raises(ConfigError, match="max_rounds"):
    load_config(None, ["dapo.max_rounds=0"])
