"""The rollout engine (generate(..., slots=S)): a request's tokens and μ do not depend on the slot it ran in, when it
joined, how many other requests there were or whether its prompt was shared; results come in request order.

Tolerance: the engine and the static batch compute every log-prob from the same terms (rows never mix; masked
cache slots add exact zeros) in another order (matmuls over S rows instead of B, attention over a window of the
cache instead of all of it, a shared prefill). Each run therefore lies within the first-order rounding bound of the
exact log-probs that `draw_logprob_bound` computes for the teacher-forced forward (tests/_fp_bound.py), so two runs
differ by at most twice it; the draws are checked to be farther from a tie than the bound lets a run move them, so
equal tokens follow from the bound, not from luck. One bound (one reference run) serves every engine run of a
test: the bound costs one reverse pass per log-prob entry, so the runs compared against it share it.

The first attention window is shrunk to 4 generated slots (module constant) so that N = 8 new tokens cross from
one window into the next and the next.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lrl_jax import learner as L
from lrl_jax import quant, sampler
from lrl_jax.sampler import SamplingConfig, engine
from tests.sampler.test_sampler import (
  CFG,
  F32,
  PROMPTS,
  assert_draws_are_stable,
  assert_within,
  draw_logprob_bound,
  drawn_err,
  pad,
)
from tests.sampler.test_sampler import params as params  # noqa: F401  (the module's fixture)

N, G = 8, 2
SAMPLED = SamplingConfig(max_new_tokens=N, temperature=1.0, eos_id=(5, 7, 9, 11), pad_id=0)
GREEDY = SamplingConfig(max_new_tokens=N, temperature=0.0, eos_id=(5, 7, 9, 11), pad_id=0)
TOKS, VALID = pad(PROMPTS, "left")  # 3 prompts, lengths 5, 3, 4: 6 requests with G = 2
R, P = TOKS.shape[0] * G, TOKS.shape[1]


@pytest.fixture(autouse=True)
def small_windows(monkeypatch):
  monkeypatch.setattr(engine, "_FIRST_WINDOW", 4)
  assert engine.windows(P, N) == (P + 4, P + 8)


def _run(served, sampling, key, toks=TOKS, valid=VALID, **kw):
  return sampler.generate(served, toks, valid, CFG, sampling, key, cache_dtype=F32, **kw)


def _assert_same_requests(got, want, err, rows=slice(None)):
  """got's requests are want's (rows of want): equal tokens, masks and μ within 2·err (two runs, each within err
  of the exact value); a request cut short by a limit has the first tokens of its uncut run."""
  gm, wm = np.asarray(got.loss_mask), np.asarray(want.loss_mask)[rows]
  assert not (gm & ~wm).any()  # a request never runs past where its uncut run ended
  np.testing.assert_array_equal(np.where(gm, got.tokens, -1), np.where(gm, np.asarray(want.tokens)[rows], -1))
  np.testing.assert_array_equal(np.asarray(got.tokens)[:, :P], np.asarray(want.tokens)[rows, :P])
  assert_within(np.where(gm, got.sampler_logp, 0.0), np.where(gm, np.asarray(want.sampler_logp)[rows], 0.0), err)


@pytest.fixture
def static_sampled(params):
  """The static batch's 6 requests (sampled) and each token's μ bound."""
  key = jax.random.key(1)
  want = _run(params, SAMPLED, key, group_size=G)
  b = draw_logprob_bound(params, want, SAMPLED, N)
  assert_draws_are_stable(b, want, SAMPLED, key, N)
  return key, want, 2 * drawn_err(b, want, N)


def test_every_request_is_the_same_whatever_its_slot_arrival_or_limit(params, static_sampled):
  """6 requests (3 prompts x G = 2) through 4 slots, prefixes shared (4 at first, 2 as slots free), with and without
  per-row limits: each == the static batch's request."""
  key, want, err = static_sampled
  got = _run(params, SAMPLED, key, group_size=G, slots=4)
  assert got.group_size == G and got.size == R
  _assert_same_requests(got, want, err)
  np.testing.assert_array_equal(got.loss_mask, want.loss_mask)  # no limits: every request ends where it did

  lim = np.array([2, 8, 1, 5, 3, 7])
  cut = _run(params, SAMPLED, key, group_size=G, slots=4, limits=lim)
  np.testing.assert_array_equal(cut.lengths, np.minimum(want.lengths, lim))  # each row stops at its EOS or its limit
  gen = np.asarray(cut.tokens)[:, P:]
  assert (gen[~np.asarray(cut.loss_mask)[:, P:]] == 0).all()  # pad after
  _assert_same_requests(cut, want, err)
  np.testing.assert_array_equal(np.asarray(cut.valid)[:, :P], np.repeat(VALID, G, 0))


@pytest.mark.slow  # four more engine shapes to compile (~35 s here): `make test-slow`
def test_every_request_is_the_same_whatever_its_company(params, static_sampled):
  """The same 6 requests through 1 slot; given as repeated prompts through 6 slots; the prompts in reverse order;
  one group alone: each == the static batch's request."""
  key, want, err = static_sampled
  keys = sampler.row_keys(key, R)
  one = _run(params, SAMPLED, key, group_size=G, slots=1)  # one request at a time
  _assert_same_requests(one, want, err)
  np.testing.assert_array_equal(one.loss_mask, want.loss_mask)

  # R prefills, R slots: every request admitted at once (one select, not row copies)
  rep = _run(params, SAMPLED, keys, np.repeat(TOKS, G, 0), np.repeat(VALID, G, 0), slots=R)
  assert rep.group_size == 1
  _assert_same_requests(rep, want, err)

  order = np.arange(3)[::-1]
  rows = (order[:, None] * G + np.arange(G)).reshape(-1)  # the requests of the reversed prompts
  rev = _run(params, SAMPLED, keys[rows], TOKS[order], VALID[order], group_size=G, slots=4)
  _assert_same_requests(rev, want, err[rows], rows)

  alone = _run(params, SAMPLED, keys[2:4], TOKS[1:2], VALID[1:2], group_size=G, slots=1)
  _assert_same_requests(alone, want, err[2:4], slice(2, 4))


@pytest.mark.slow  # 50 s on 2 cores; the engine's logic is the float tests' above, INT4 serving test_predecode's
def test_int4_served_engine_rollouts_equal_the_static_batch_and_the_learner_scores_them(params):
  """Greedy decoding on served INT4 weights through 4 slots == the static batch; π of the served tree (the
  learner's numbers on the weights it syncs) on the engine rollout equals its μ within the same bound (a full
  forward vs the cached decode)."""
  served = sampler.serve_params(params, quant.Int4(group_size=32), dtype=jnp.float32)
  key = jax.random.key(5)
  want = _run(served, GREEDY, key, group_size=G)
  b = draw_logprob_bound(served, want, GREEDY, N)
  assert_draws_are_stable(b, want, GREEDY, key, N)
  err = 2 * drawn_err(b, want, N)
  got = _run(served, GREEDY, key, group_size=G, slots=4)
  np.testing.assert_array_equal(got.loss_mask, want.loss_mask)
  _assert_same_requests(got, want, err)
  pi = L.token_logprobs(served, got, CFG.replace(dtype="float32"), cfg=L.LearnerConfig(compute_dtype="float32"))
  m = np.asarray(got.loss_mask)
  assert_within(np.where(m, np.asarray(pi), 0.0), got.sampler_logp, err)


def test_bad_input_is_refused_before_generating(params):
  long = SamplingConfig(max_new_tokens=CFG.max_position_embeddings - 3, temperature=1.0)
  with pytest.raises(ValueError, match=r"prompt rows \[0, 2\] .* the model's context is"):
    sampler.generate(params, TOKS, VALID, CFG, long, jax.random.key(0), slots=2)
  empty = VALID.copy()
  empty[2] = False
  with pytest.raises(ValueError, match=r"prompt rows \[2\] have no valid token"):
    sampler.generate(params, TOKS, empty, CFG, SAMPLED, jax.random.key(0), slots=2)
  with pytest.raises(ValueError, match="slots must be a positive int"):
    sampler.generate(params, TOKS, VALID, CFG, SAMPLED, jax.random.key(0), slots=0)
  with pytest.raises(ValueError, match=r"rows \[1\] have limits \[9\] outside \[1, max_new_tokens=8\]"):
    sampler.generate(params, TOKS, VALID, CFG, SAMPLED, jax.random.key(0), slots=2, limits=[3, 9, 4])
  with pytest.raises(ValueError, match=r"one new-token limit per row \[B·G\] = \[6\]"):
    sampler.generate(params, TOKS, VALID, CFG, SAMPLED, jax.random.key(0), group_size=2, limits=[3, 4])
  with pytest.raises(ValueError, match="max_new_tokens must be a positive int"):
    SamplingConfig(max_new_tokens=0)
  mesh = jax.make_mesh((4, 2), ("data", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  on_mesh = sampler.shard_params(params, mesh)
  with pytest.raises(ValueError, match=r"slots=6 do not fit the sampler's mesh .* \('data', 4 devices\)"):
    sampler.generate(on_mesh, TOKS, VALID, CFG, SAMPLED, jax.random.key(0), group_size=2, slots=6)


def test_windows_cover_the_filled_cache(monkeypatch):
  monkeypatch.setattr(engine, "_FIRST_WINDOW", 16)
  assert engine.windows(36, 32) == (52, 68)
  assert engine.windows(8, 4) == (12,)
  assert engine.windows(5, 100) == (21, 37, 69, 105)
