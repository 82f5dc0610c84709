"""A grouped rollout (G completions sharing a prompt): the learner runs each prompt once and computes logits only
for the completions (`Rollout.prompt_len`), with the same numbers as the full forward; π at the sampler's
temperature; the full next-token distributions (`completion_logits`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _learner_util import _forward, assert_update_close, host, np_log_softmax, np_token_logprobs, tiny_cfg

from lrl_jax import learner as L
from lrl_jax import models
from lrl_jax.sampler import SamplingConfig, generate
from tests._fp_bound import rounding_bound

MC = tiny_cfg()
G, P, N = 4, 6, 5
F32 = L.LearnerConfig(compute_dtype="float32", lr=1e-3)


@pytest.fixture(scope="module")
def rollout():
  """3 prompts (left-padded by 0, 2, 4) x G = 4 sampled completions of the tiny model (EOS = 3 ends some early)."""
  params = models.init_params(MC, jax.random.PRNGKey(0), std=0.3)
  rng = np.random.default_rng(0)
  prompts = jnp.asarray(rng.integers(4, MC.vocab_size, (3, P)), jnp.int32)
  valid = jnp.asarray(np.arange(P)[None] >= np.array([[0], [2], [4]]))
  s = SamplingConfig(max_new_tokens=N, temperature=1.0, eos_id=3, pad_id=0)
  r = generate(params, prompts, valid, MC, s, jax.random.PRNGKey(1), group_size=G, cache_dtype=jnp.float32)
  assert (r.group_size, r.prompt_len) == (G, P)
  adv = jnp.asarray(rng.normal(size=(3 * G,)), jnp.float32)
  return params, r.replace(advantages=adv)


def test_grouped_logprobs_equal_full_forward(rollout):
  """Shared prompt + completion-only logits vs the f64 log-softmax of the full forward's logits, both within the
  first-order rounding bound of the exact log-probs (the same dot products and attention sums in another grouping:
  tests/_fp_bound.py); 0 on the prompt slots."""
  params, r = rollout
  got = np.asarray(L.token_logprobs(params, r, MC, cfg=F32), np.float64)
  logits, _ = _forward(params, r.tokens, MC.replace(dtype="float32"), valid_BT=r.valid)
  want = np_token_logprobs(np.asarray(logits), np.asarray(r.tokens), np.asarray(r.valid))
  want[:, :P] = 0.0
  plain = r.replace(group_size=1, prompt_len=0)
  bound = rounding_bound(
    lambda p, t, v: L.token_logprobs(p, plain.replace(tokens=t, valid=v), MC, cfg=F32),
    params,
    np.asarray(r.tokens),
    np.asarray(r.valid),
  )
  bound.assert_stable()
  np.testing.assert_array_less(np.abs(got - want), 2 * bound.err + 1e-30)
  # Logits 5 positions at a time (`learner.logit_chunk`): the same dot products and sums, in smaller matmuls.
  chunked = np.asarray(L.token_logprobs(params, r, MC, cfg=F32.replace(logit_chunk=5)), np.float64)
  np.testing.assert_array_less(np.abs(chunked - want), 2 * bound.err + 1e-30)
  assert np.all(got[:, :P] == 0)
  m = np.asarray(r.loss_mask)
  assert np.all(got[~m & (np.arange(P + N) >= P)] == 0)  # after EOS: no token, no score


_VARIANTS = [
  dict(micro_batches=1),
  dict(micro_batches=3),
  dict(logit_chunk=5, remat="full"),
  dict(unroll_layers=True),
  dict(unroll_layers=True, share_prompt=False),
  pytest.param(dict(remat="dots"), marks=pytest.mark.slow),  # a compile each (~10 s): `make test-slow`
  pytest.param(dict(remat="dots_no_batch", micro_batches=3), marks=pytest.mark.slow),
]


@pytest.fixture(scope="module")
def ungrouped_update(rollout):
  params, r = rollout
  ref_cfg = F32.replace(share_prompt=False)
  state = L.create_train_state(jax.random.PRNGKey(0), MC, ref_cfg, params=params)
  new, m_ref = L.train_step(state, r, model_cfg=MC, cfg=ref_cfg)
  return host(new.params), host(new.opt_state), float(m_ref["loss"])


@pytest.mark.parametrize("kw", _VARIANTS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_grouped_step_equals_ungrouped(rollout, ungrouped_update, kw):
  """One update with the prompt shared (whole groups per micro-batch, M = 1 and 3), with chunked logits, with each
  remat policy and with the layer loop unrolled (shared or not) == without sharing, chunking, remat or unrolling
  (M = 1), to f32 reordering (assert_update_close's stated tolerances): remat recomputes the same operations,
  chunking splits one matmul into smaller ones, unrolling runs the same layers as straight-line code."""
  params, r = rollout
  *ref, loss_ref = ungrouped_update
  cfg = F32.replace(**kw)
  state = L.create_train_state(jax.random.PRNGKey(0), MC, cfg, params=params)
  new, m = L.train_step(state, r, model_cfg=MC, cfg=cfg)
  assert_update_close(host(new.params), host(new.opt_state), *ref)
  np.testing.assert_allclose(float(m["loss"]), loss_ref, rtol=1e-5)


@pytest.mark.parametrize("share", [True, False])
def test_unroll_layers_leaves_no_layer_loop(rollout, share):
  """`unroll_layers`: the compiled train step has no while loop (the layer scan and its transpose are the step's only
  loops without chunked logits or micro-batches); without it, it has them."""
  params, r = rollout
  texts = {}
  for unroll in (False, True):
    cfg = F32.replace(unroll_layers=unroll, share_prompt=share)
    state = L.create_train_state(jax.random.PRNGKey(0), MC, cfg, params=params)
    texts[unroll] = L.train_step.lower(state, r, model_cfg=MC, cfg=cfg).compile().as_text()
  assert " while(" in texts[False]
  assert " while(" not in texts[True]


def test_learner_temperature_and_completion_logits(rollout):
  """π at temperature τ = log_softmax(logits / τ) (the distribution a τ-sampler draws from, as μ is): against f64
  NumPy of the full forward's logits; `completion_logits` gives the whole distribution at each completion slot."""
  params, r = rollout
  tau = 0.7
  cfg = F32.replace(temperature=tau)
  got = np.asarray(L.token_logprobs(params, r, MC, cfg=cfg), np.float64)
  logits, _ = _forward(params, r.tokens, MC.replace(dtype="float32"), valid_BT=r.valid)
  want = np_token_logprobs(np.asarray(logits, np.float64) / tau, np.asarray(r.tokens), np.asarray(r.valid))
  m = np.asarray(r.loss_mask)
  # f32 logits (|z| < 10 here) divided by τ and log-softmaxed in f32 vs f64: a few ulps of |z|/τ per term,
  # amplified by the forward's own rounding that the other test bounds; 1e-4 absolute is > 100x both.
  np.testing.assert_allclose(got[m], want[m], rtol=0, atol=1e-4)
  z, has = L.completion_logits(params, r, MC, cfg=cfg)
  assert z.shape == (3 * G, N, MC.vocab_size) and has.shape == (3 * G, N)
  ls = np_log_softmax(np.asarray(z))
  picked = np.take_along_axis(ls, np.asarray(r.tokens)[:, P:, None], -1)[..., 0]
  np.testing.assert_allclose(picked[m[:, P:]], got[:, P:][m[:, P:]], rtol=0, atol=1e-5)  # same numbers, f64 vs f32
  np.testing.assert_array_equal(np.asarray(has), np.asarray(r.valid)[:, P:])  # every valid completion slot is scored
