"""The sampler: padding invariance, EOS stop, mu against a NumPy reference of the truncated
distribution and against a teacher-forced forward, served low-bit weights, sharded == unsharded."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lrl_jax import models, quant, sampler
from lrl_jax.models import ModelConfig
from lrl_jax.sampler import SamplingConfig
from tests._fp_bound import rounding_bound

CFG = ModelConfig(
  arch="llama",
  vocab_size=101,
  hidden_size=64,
  intermediate_size=96,
  num_layers=2,
  num_heads=4,
  num_kv_heads=2,
  rope_theta=1000.0,
  tie_word_embeddings=True,
)
GREEDY = SamplingConfig(max_new_tokens=8, temperature=0.0, pad_id=0)
PROMPTS = [[5, 17, 23, 42, 8], [61, 9, 30], [77, 3, 14, 55]]  # lengths 5, 3, 4
F32 = jnp.float32  # f32 KV cache in the exactness tests (the default bf16 cache rounds keys/values)
fwd = jax.jit(models.forward, static_argnames=("cfg",))


@pytest.fixture(scope="module")
def params():
  # std 0.3: logits far apart, so greedy choices are not decided by rounding.
  return models.init_params(CFG, jax.random.key(0), std=0.3)


def pad(prompts, side, P=None):
  P = P or max(map(len, prompts))
  toks = np.zeros((len(prompts), P), np.int32)
  valid = np.zeros((len(prompts), P), bool)
  for i, p in enumerate(prompts):
    sl = slice(P - len(p), P) if side == "left" else slice(0, len(p))
    toks[i, sl], valid[i, sl] = p, True
  return toks, valid


def completions(r, n=GREEDY.max_new_tokens):
  """(tokens, mu, mask) of the last n (generated) slots."""
  P = r.tokens.shape[1] - n
  return np.asarray(r.tokens)[:, P:], np.asarray(r.sampler_logp)[:, P:], np.asarray(r.loss_mask)[:, P:]


def teacher_forced_logits(params, r, cfg=CFG):
  """Logits [B, T-1, V] predicting tokens 1.. from a full (cache-free) forward on the rollout (token s
  is predicted at the last valid slot before s: with right padding that is not s - 1)."""
  logits, _ = fwd(params, r.tokens, cfg, valid_BT=r.valid)
  valid = np.asarray(r.valid)
  prev = np.asarray(sampler.predictor_index(valid))
  for b in range(valid.shape[0]):  # the NumPy definition of predictor_index
    last = -1
    for s in range(valid.shape[1]):
      assert prev[b, s] == last
      last = s if valid[b, s] else last
  prev = np.maximum(prev, 0)[:, 1:]
  return np.take_along_axis(np.asarray(logits, np.float64), prev[:, :, None], axis=1)


def np_log_softmax(z):
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def np_truncated_logprobs(logits, *, temperature, top_k, top_p):
  """Float64 reference: z = logits/T; keep the top_k largest; then the smallest prefix (sorted by z
  descending) whose mass before the token is < top_p; renormalise over the kept tokens."""
  z = np.asarray(logits, np.float64) / temperature
  out = np.full_like(z, -np.inf)
  for b in range(z.shape[0]):
    order = np.argsort(-z[b], kind="stable")
    keep = order[:top_k] if top_k else order
    p = np.exp(z[b, keep] - z[b, keep].max())
    p /= p.sum()
    before = np.cumsum(p) - p
    keep = keep[before < top_p]
    out[b, keep] = np_log_softmax(z[b, keep])
  return out


def draw_logprob_bound(params, r, sampling, n, *, lora=None):
  """sampling_logprobs of the teacher-forced logits at the last n (generated) slots, [B, n, V]: what the sampler
  drew each token from, with a first-order rounding bound on every entry (tests/_fp_bound.py, probabilistic:
  exceeded with probability < 3e-8 in the model of mean-independent rounding errors, Higham & Mary 2019).

  The KV-cache decode computes the same function with the same operations (the same dot products; masked cache
  slots add exact zeros), so every run of it, sharded or not, padded or not, lies within `err` of the exact
  value: two runs differ by at most the sum of their bounds. The weights are taken as f32 roundings (an ulp
  each): that covers NVFP4's ŵ = fl(e2m1·s_b·dec), whose dec the served dot applies after the K sum.
  """

  def fn(p, tokens, valid):
    logits, _ = models.forward(p, tokens, CFG, valid_BT=valid, lora=lora)
    prev = jnp.maximum(sampler.predictor_index(valid), 0)[:, -n:]
    z = jnp.take_along_axis(logits, prev[:, :, None], axis=1)
    return sampler.sampling_logprobs(z.reshape(-1, z.shape[-1]), sampling).reshape(z.shape)

  return rounding_bound(fn, params, np.asarray(r.tokens), np.asarray(r.valid), rounded_args=(0,))


def assert_draws_are_stable(b, r, sampling, key, n):
  """Every token of r is farther from a tie than the bound lets any run move it (the top-k threshold, then the
  greedy argmax or the Gumbel-max draw of jax.random.categorical), so every run within the bound draws the same
  tokens: comparing tokens is exact by construction, not by luck."""
  b.assert_stable()  # the threshold comparisons inside sampling_logprobs
  tok, m = np.asarray(r.tokens)[:, -n:], np.asarray(r.loss_mask)[:, -n:]
  score, err = b.out.astype(np.float64), b.err.astype(np.float64)
  if not sampling.greedy:  # token = argmax(logp + gumbel(fold_in(row key, step)))
    B, _, V = score.shape
    keys = jax.vmap(lambda k: jax.vmap(lambda t: jax.random.fold_in(k, t))(jnp.arange(n)))(sampler.row_keys(key, B))
    g = rounding_bound(lambda k: jax.vmap(lambda kk: jax.random.gumbel(kk, (V,)))(k), keys.reshape(-1))
    g.assert_stable()
    score = score + g.out.reshape(score.shape)
    err = err + g.err.reshape(score.shape) + 2.0**-24 * np.abs(score)  # and fl(logp + g)
  y = score.argmax(-1)
  np.testing.assert_array_equal(y[m], tok[m])  # this replica draws what the sampler drew
  gap = np.take_along_axis(score, y[..., None], -1) - score
  tie = 2 * (np.take_along_axis(err, y[..., None], -1) + err)
  other = np.isfinite(gap) & (np.arange(score.shape[-1]) != y[..., None]) & m[..., None]
  np.testing.assert_array_less(tie[other], gap[other], err_msg="a draw is within its rounding bound of a tie")


def drawn_err(b, r, n):
  """[B, T]: the bound on mu of each generated token (0 on the prompt slots, where mu is 0)."""
  tok = np.asarray(r.tokens)
  err = np.zeros(tok.shape)
  err[:, -n:] = np.take_along_axis(b.err, tok[:, -n:, None], -1)[..., 0]
  return err


def assert_within(got, want, tol):
  d = np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64))
  assert np.all(d <= tol), f"|difference| / bound up to {np.max(d / np.maximum(tol, 1e-300))}"


# --------------------------------------------------------------------------- tests


def test_left_right_and_unpadded_prompts_generate_the_same(params):
  key = jax.random.key(0)
  rl = sampler.generate(params, *pad(PROMPTS, "left"), CFG, GREEDY, key, cache_dtype=F32)
  rr = sampler.generate(params, *pad(PROMPTS, "right"), CFG, GREEDY, key, cache_dtype=F32)
  tl, ll, ml = completions(rl)
  tr, lr, mr = completions(rr)
  # The paddings change the order of the f32 sums, not their terms: every run is within the rounding bound of
  # the exact log-probs (a batch of one sums the same terms without the padding's zeros), no draw near a tie.
  n = GREEDY.max_new_tokens
  bounds = {id(r): draw_logprob_bound(params, r, GREEDY, n) for r in (rl, rr)}
  for r in (rl, rr):
    assert_draws_are_stable(bounds[id(r)], r, GREEDY, key, n)
  el, er = (drawn_err(bounds[id(r)], r, n)[:, -n:] for r in (rl, rr))
  np.testing.assert_array_equal(tl, tr)
  assert_within(ll, lr, el + er)
  assert ml.all() and mr.all() and np.all(np.asarray(rl.lengths) == GREEDY.max_new_tokens)
  for i in (0, 1):  # a batch of one, no padding at all
    ru = sampler.generate(
      params, np.asarray([PROMPTS[i]]), np.ones((1, len(PROMPTS[i])), bool), CFG, GREEDY, key, cache_dtype=F32
    )
    tu, lu, _ = completions(ru)
    np.testing.assert_array_equal(tu[0], tl[i])
    assert_within(lu[0], ll[i], 2 * el[i])
  # mu of greedy decoding = log softmax of a teacher-forced full forward (f32, accumulation order only; the
  # float64 log softmax of its f32 logits is within the same bound).
  for r in (rl, rr):
    lp = np_log_softmax(teacher_forced_logits(params, r))
    want = np.take_along_axis(lp, np.asarray(r.tokens)[:, 1:, None], -1)[..., 0]
    m = np.asarray(r.loss_mask)[:, 1:]
    tol = 2 * drawn_err(bounds[id(r)], r, n)[:, 1:]
    assert_within(np.asarray(r.sampler_logp)[:, 1:][m], want[m], tol[m])
    # greedy: each generated token is the argmax of the teacher-forced logits
    np.testing.assert_array_equal(np.asarray(r.tokens)[:, 1:][m], teacher_forced_logits(params, r).argmax(-1)[m])


def test_eos_stops_each_row(params):
  toks, valid = pad(PROMPTS, "left")
  free = sampler.generate(params, toks, valid, CFG, GREEDY, jax.random.key(0), cache_dtype=F32)
  gen, lps, _ = completions(free)
  eos = int(gen[1, 2])  # a token row 1 emits at step 2 (maybe earlier elsewhere)
  stop = SamplingConfig(max_new_tokens=8, temperature=0.0, eos_id=eos, pad_id=0)
  r = sampler.generate(params, toks, valid, CFG, stop, jax.random.key(0), cache_dtype=F32)
  g2, l2, m2 = completions(r)
  for b in range(len(PROMPTS)):
    hits = np.nonzero(gen[b] == eos)[0]
    n = hits[0] + 1 if hits.size else gen.shape[1]  # EOS itself is generated (mask 1)
    assert int(r.lengths[b]) == n and m2[b, :n].all() and not m2[b, n:].any()
    np.testing.assert_array_equal(g2[b, :n], gen[b, :n])
    assert np.all(g2[b, n:] == stop.pad_id) and np.all(l2[b, n:] == 0)
    # Bit for bit: up to its EOS a row runs the same operations on the same values (only the integer
    # bookkeeping of which rows are done differs).
    np.testing.assert_array_equal(l2[b, :n], lps[b, :n])
  np.testing.assert_array_equal(r.valid, np.concatenate([valid, m2], 1))


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.6), (0.8, 7, 0.5)])
def test_sampling_logprobs_match_numpy_truncated_distribution(temperature, top_k, top_p):
  logits = np.asarray(jax.random.normal(jax.random.key(1), (3, 50)) * 2.0, np.float32)
  s = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
  got = np.asarray(sampler.sampling_logprobs(logits, s))
  want = np_truncated_logprobs(logits, temperature=temperature, top_k=top_k, top_p=top_p)
  np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))  # same kept set
  np.testing.assert_allclose(got[np.isfinite(want)], want[np.isfinite(want)], rtol=0, atol=2e-6)
  # Drawn tokens follow exp(want): empirical frequencies within 5 binomial sigmas, mu = want[token].
  n = 4000
  keys = jax.random.split(jax.random.key(2), n)
  draw = jax.jit(jax.vmap(lambda k: sampler.sample_tokens(logits[:1], k[None], s)))
  tok, mu = (np.asarray(a)[:, 0] for a in draw(keys))
  np.testing.assert_allclose(mu, want[0, tok], rtol=0, atol=2e-6)
  p = np.exp(want[0])
  freq = np.bincount(tok, minlength=50) / n
  assert np.all(np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / n) + 1e-12)


def test_sampled_generation_mu_is_the_truncated_logprob_of_its_own_logits(params):
  s = SamplingConfig(max_new_tokens=6, temperature=0.7, top_k=10, top_p=0.8)
  r = sampler.generate(params, *pad(PROMPTS, "right"), CFG, s, jax.random.key(3), cache_dtype=F32)
  b = draw_logprob_bound(params, r, s, s.max_new_tokens)  # the kept sets and the draws are no near-ties
  assert_draws_are_stable(b, r, s, jax.random.key(3), s.max_new_tokens)
  tf = teacher_forced_logits(params, r)
  m = np.asarray(r.loss_mask)[:, 1:]
  tok = np.asarray(r.tokens)[:, 1:][m]
  ref = np_truncated_logprobs(tf[m], temperature=0.7, top_k=10, top_p=0.8)
  want = ref[np.arange(len(tok)), tok]
  assert np.all(np.isfinite(want))  # every drawn token is in the kept set
  # The sampler and the f32 teacher-forced logits are each within the rounding bound of the exact mu.
  tol = 2 * drawn_err(b, r, s.max_new_tokens)[:, 1:]
  assert_within(np.asarray(r.sampler_logp)[:, 1:][m], want, tol[m])


@pytest.mark.slow  # the engine's tests (the RL loop's path) check a request alone and in company in the default suite
def test_seed_per_request_is_independent_of_the_batch(params):
  s = SamplingConfig(max_new_tokens=6, temperature=1.0)
  toks, valid = pad(PROMPTS, "left")
  key = jax.random.key(4)
  rb = sampler.generate(params, toks, valid, CFG, s, key, cache_dtype=F32)
  keys = sampler.row_keys(key, 3)
  r1 = sampler.generate(params, toks[2:], valid[2:], CFG, s, keys[2:], cache_dtype=F32)
  # A batch of one may sum in another order: equal draws need every draw to be no near-tie.
  assert_draws_are_stable(draw_logprob_bound(params, rb, s, s.max_new_tokens), rb, s, key, s.max_new_tokens)
  np.testing.assert_array_equal(r1.tokens[0], rb.tokens[2])
  other = sampler.generate(params, toks, valid, CFG, s, jax.random.key(5), cache_dtype=F32)
  assert not np.array_equal(other.tokens, rb.tokens)


def test_group_size_samples_each_prompt_g_times(params):
  """generate(group_size=G) == generate of the prompts repeated G times (row b·G + g draws with fold_in(key,
  b·G + g) either way: bit for bit), and the rollout records its grouping."""
  s = SamplingConfig(max_new_tokens=6, temperature=1.0)
  toks, valid = pad(PROMPTS, "left")
  key = jax.random.key(6)
  grouped = sampler.generate(params, toks, valid, CFG, s, key, group_size=2, cache_dtype=F32)
  repeated = sampler.generate(params, np.repeat(toks, 2, 0), np.repeat(valid, 2, 0), CFG, s, key, cache_dtype=F32)
  assert grouped.group_size == 2 and repeated.group_size == 1 and grouped.size == 6
  for a, b in zip(jax.tree_util.tree_leaves(grouped), jax.tree_util.tree_leaves(repeated)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  grouped.check()
  with pytest.raises(ValueError, match="group_size"):
    sampler.generate(params, toks, valid, CFG, s, key, group_size=0)


@pytest.mark.parametrize("spec", [quant.Int4(group_size=32), quant.NVFP4(), quant.FP8()], ids=lambda s: s.name)
def test_served_low_bit_sampler_equals_dequantized_float_forward(params, spec):
  served = sampler.serve_params(params, spec, dtype=jnp.float32)
  r = sampler.generate(served, *pad(PROMPTS, "left"), CFG, GREEDY, jax.random.key(0), cache_dtype=F32)
  deq = jax.jit(quant.dequantize_params)(served)
  # The sampler's logits are those of a float forward on dequantize(served), up to accumulation
  # order: mu within the rounding bound of each, and greedy tokens are the argmax of the teacher-forced logits.
  # INT4 / FP8: the sampler's XLA matmul is dequantize-then-dot (the same ŵ, the same dots), another evaluation of
  # the float forward on deq. NVFP4 multiplies by dec after the K sum instead: ŵ = fl(e2m1·s_b·dec) is the rounded
  # weight the bound allows for, and the extra rounding of y·dec (u·|y| <= u·Σ|x||w|) adds at most 1/K = 1/64 of
  # a dot's own term (u·√K·Σ|x||w|) in quadrature: its side is within sqrt(1 + 1/64) of the bound.
  n = GREEDY.max_new_tokens
  b = draw_logprob_bound(deq, r, GREEDY, n).scaled(np.sqrt(1 + 1 / 64) if isinstance(spec, quant.NVFP4) else 1.0)
  assert_draws_are_stable(b, r, GREEDY, jax.random.key(0), n)
  tf = teacher_forced_logits(deq, r)
  m = np.asarray(r.loss_mask)[:, 1:]
  want = np.take_along_axis(np_log_softmax(tf), np.asarray(r.tokens)[:, 1:, None], -1)[..., 0]
  tol = 2 * drawn_err(b, r, n)[:, 1:]
  assert_within(np.asarray(r.sampler_logp)[:, 1:][m], want[m], tol[m])
  np.testing.assert_array_equal(np.asarray(r.tokens)[:, 1:][m], tf.argmax(-1)[m])


def test_serve_params_quantizes_the_compute_dtype_cast(params):
  spec = quant.Int4(group_size=32)
  served = sampler.serve_params(params, spec, dtype=jnp.bfloat16)
  w = params["layers"]["mlp"]["up_proj"]["kernel"]
  q = served["layers"]["mlp"]["up_proj"]["kernel"]
  ref = quant.quantize(w.astype(jnp.bfloat16), spec, axis=-2)
  assert isinstance(q, quant.QArray) and q.shape == w.shape
  np.testing.assert_array_equal(q.codes, ref.codes)
  np.testing.assert_array_equal(q.scale.astype(np.float32), ref.scale.astype(np.float32))
  assert served["embed"]["embedding"].dtype == jnp.bfloat16
  bf16 = sampler.serve_params(params, None)
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree_util.tree_leaves(bf16))
  with pytest.raises(ValueError, match="QArrays"):
    sampler.serve_params(served, spec)
  with pytest.raises(ValueError, match="QuantRules"):
    sampler.serve_params(params, "int4")


def test_sharded_generation_equals_unsharded(params):
  assert jax.device_count() >= 8, "tests/conftest.py simulates 8 CPU devices"
  mesh = jax.make_mesh((2, 4), ("data", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  served = sampler.serve_params(params, quant.Int4(group_size=32), dtype=jnp.float32)
  toks, valid = pad(PROMPTS + [[7, 7, 8]], "left")  # B = 4: divisible by the data axis
  s = SamplingConfig(max_new_tokens=6, temperature=0.9, top_k=20)
  want = sampler.generate(served, toks, valid, CFG, s, jax.random.key(6), cache_dtype=F32)
  sharded = sampler.shard_params(served, mesh)
  q = sharded["layers"]["attn"]["q_proj"]["kernel"]
  assert q.codes.sharding.spec == jax.sharding.PartitionSpec(None, None, "tensor")
  assert sharded["layers"]["attn"]["o_proj"]["kernel"].codes.sharding.spec[1] == "tensor"
  got = sampler.generate(
    sharded,
    sampler.shard_batch(jnp.asarray(toks), mesh),
    sampler.shard_batch(jnp.asarray(valid), mesh),
    CFG,
    s,
    jax.random.key(6),
    cache_dtype=F32,
  )
  # Tensor parallelism reorders the f32 sums (o_proj / down_proj partial sums and a psum): both runs lie within
  # the rounding bound of the exact log-probs, and no draw is near enough a tie to flip.
  b = draw_logprob_bound(served, want, s, 6)
  assert_draws_are_stable(b, want, s, jax.random.key(6), 6)
  np.testing.assert_array_equal(got.tokens, want.tokens)
  assert_within(got.sampler_logp, want.sampler_logp, 2 * drawn_err(b, want, 6))


@pytest.mark.parametrize(
  "spec", [quant.Int4(group_size=32), pytest.param(quant.NVFP4(), marks=pytest.mark.slow)], ids=lambda s: s.name
)  # NVFP4: the same XLA path on CPU (linear_layout of every format: test_linear)
def test_linear_layout_serving_generates_what_kn_serving_does(params, spec):
  """serve_params(layout="linear") stores every QArray as [.., N, K] (the same codes, transposed) and the decoder
  runs it through qlinear: the same rollouts, sharded too (the tensor axis follows the transposed dimension)."""
  kn = sampler.serve_params(params, spec, dtype=jnp.float32)
  lin = sampler.serve_params(params, spec, dtype=jnp.float32, layout="linear")
  a, b = kn["layers"]["mlp"]["down_proj"]["kernel"], lin["layers"]["mlp"]["down_proj"]["kernel"]
  assert (a.shape, a.axis, b.shape, b.axis) == ((2, 96, 64), -2, (2, 64, 96), -1)
  np.testing.assert_array_equal(np.swapaxes(np.asarray(a.codes), -1, -2), np.asarray(b.codes))
  toks, valid = pad(PROMPTS + [[7, 7, 8]], "left")
  s = SamplingConfig(max_new_tokens=6, temperature=0.9, top_k=20)
  want = sampler.generate(kn, toks, valid, CFG, s, jax.random.key(5), cache_dtype=F32)
  got = sampler.generate(lin, toks, valid, CFG, s, jax.random.key(5), cache_dtype=F32)
  # The linear layout computes the same dot products in its own order. (Key 5: with key 3 a top-k boundary was
  # within the rounding bound of a tie, so equal draws were luck, not a consequence of the bound.)
  b = draw_logprob_bound(kn, want, s, 6)
  assert_draws_are_stable(b, want, s, jax.random.key(5), 6)
  np.testing.assert_array_equal(got.tokens, want.tokens)
  assert_within(got.sampler_logp, want.sampler_logp, 2 * drawn_err(b, want, 6))
  mesh = jax.make_mesh((2, 4), ("data", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  sharded = sampler.shard_params(lin, mesh)
  assert sharded["layers"]["attn"]["q_proj"]["kernel"].codes.sharding.spec == jax.sharding.PartitionSpec(
    None, "tensor", None
  )  # [L, H·Dh, D/2]: heads on the tensor axis, as [L, D/2, H·Dh] had them last
  got = sampler.generate(
    sharded,
    sampler.shard_batch(jnp.asarray(toks), mesh),
    sampler.shard_batch(jnp.asarray(valid), mesh),
    CFG,
    s,
    jax.random.key(5),
    cache_dtype=F32,
  )
  np.testing.assert_array_equal(got.tokens, want.tokens)
  with pytest.raises(ValueError, match="layout must be one of"):
    sampler.serve_params(params, spec, layout="nk")


def test_bad_input_is_named():
  with pytest.raises(ValueError, match="top_p"):
    SamplingConfig(top_p=0.0)
  with pytest.raises(ValueError, match="temperature"):
    SamplingConfig(temperature=-1.0)
  with pytest.raises(ValueError, match="eos_id"):
    SamplingConfig(eos_id=-3)
  assert SamplingConfig(eos_id=2).eos_id == (2,)
  toks, valid = pad(PROMPTS, "left")
  valid[1] = False
  with pytest.raises(ValueError, match=r"rows \[1\]"):
    sampler.generate({}, toks, valid, CFG, GREEDY, jax.random.key(0))
  with pytest.raises(ValueError, match="key"):
    sampler.row_keys(jax.random.split(jax.random.key(0), 2), 3)


@pytest.mark.slow  # LoRA over NVFP4 in the default suite: tests/models/test_lora.py, tests/learner/test_learner_step.py
def test_generation_with_lora_over_an_nvfp4_base(params):
  """QeRL serving: a frozen NVFP4 base plus float adapters; μ is the teacher-forced log-prob of the
  same base + adapters (the learner's π in LoRA-only training), and the adapters change the output."""
  served = sampler.serve_params(params, quant.NVFP4(), dtype=jnp.float32)
  lora = models.init_lora(CFG, models.LoraConfig(rank=4, alpha=8.0, targets="(q|v|up)_proj"), jax.random.key(1))
  lora.params["layers"]["mlp"]["up_proj"]["b"] = 0.5 * jax.random.normal(
    jax.random.key(2), lora.params["layers"]["mlp"]["up_proj"]["b"].shape
  )
  toks, valid = pad(PROMPTS, "left")
  r = sampler.generate(served, toks, valid, CFG, GREEDY, jax.random.key(0), cache_dtype=F32, lora=lora)
  logits, _ = jax.jit(models.forward, static_argnames=("cfg",))(served, r.tokens, CFG, valid_BT=r.valid, lora=lora)
  prev = np.maximum(np.asarray(sampler.predictor_index(np.asarray(r.valid))), 0)[:, 1:]
  tf = np.take_along_axis(np.asarray(logits, np.float64), prev[:, :, None], axis=1)
  m = np.asarray(r.loss_mask)[:, 1:]
  want = np.take_along_axis(np_log_softmax(tf), np.asarray(r.tokens)[:, 1:, None], -1)[..., 0]
  b = draw_logprob_bound(served, r, GREEDY, GREEDY.max_new_tokens, lora=lora)  # each within it of the exact mu
  assert_draws_are_stable(b, r, GREEDY, jax.random.key(0), GREEDY.max_new_tokens)
  tol = 2 * drawn_err(b, r, GREEDY.max_new_tokens)[:, 1:]
  assert_within(np.asarray(r.sampler_logp)[:, 1:][m], want[m], tol[m])
  base = sampler.generate(served, toks, valid, CFG, GREEDY, jax.random.key(0), cache_dtype=F32)
  assert not np.array_equal(np.asarray(base.sampler_logp), np.asarray(r.sampler_logp))
