"""Sampler benchmark: generation tokens/s and `serve_params` time on SmolLM2-135M shapes (random init),
and the train-inference mismatch |pi - mu| on the real SmolLM2-135M-Instruct (GGUF).

    python -m lrl_jax.sampler.bench [--batches 1 16] [--prompt-len 32] [--new-tokens 64]
                                    [--formats bf16 int4] [--serve-formats int4 nvfp4 fp8]
    python -m lrl_jax.sampler.bench --mismatch [--new-tokens 48]

Every format runs in one process, side by side, on the same random weights and prompts. Tokens/s
counts generated tokens (batch × new tokens, no EOS) over the wall time of one `generate` call
(prefill included), after a compile-and-warm-up call.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

from lrl_jax import models, quant
from lrl_jax.rollout import predictor_index
from lrl_jax.sampler.generate import generate
from lrl_jax.sampler.sampling import SamplingConfig
from lrl_jax.sampler.serve import serve_params

# SmolLM2-135M (Llama architecture, tied embeddings). Its K = 576 is not a multiple of 128:
# INT4 runs with groups of 64 (576 = 9 · 64).
SMOLLM2_135M = models.ModelConfig(
  arch="llama",
  vocab_size=49152,
  hidden_size=576,
  intermediate_size=1536,
  num_layers=30,
  num_heads=9,
  num_kv_heads=3,
  head_dim=64,
  rope_theta=100000.0,
  rms_norm_eps=1e-5,
  tie_word_embeddings=True,
  max_position_embeddings=8192,
  dtype="bfloat16",
)

FORMATS = {
  "bf16": None,
  "int4": quant.Int4(group_size=64),
  "fp8": quant.FP8(),
  "nvfp4": quant.NVFP4(),
  "mxfp8": quant.MXFP8(),
}


def _block(tree):
  return jax.block_until_ready(tree)


def time_serve_params(params, spec, *, dtype, repeats=3) -> float:
  """Seconds per `serve_params` call (jit'd; compile excluded; best of `repeats`)."""
  _block(serve_params(params, spec, dtype=dtype))
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    _block(serve_params(params, spec, dtype=dtype))
    best = min(best, time.perf_counter() - t)
  return best


def time_generate(served, cfg, batch, prompt_len, new_tokens, *, seed=0) -> tuple[float, float]:
  """(compile + first call seconds, tokens/s of the second call)."""
  prompts = jax.random.randint(jax.random.key(seed), (batch, prompt_len), 1, cfg.vocab_size)
  valid = jnp.ones((batch, prompt_len), bool)
  s = SamplingConfig(max_new_tokens=new_tokens, temperature=1.0, eos_id=None)
  t = time.perf_counter()
  _block(generate(served, prompts, valid, cfg, s, jax.random.key(1)))
  first = time.perf_counter() - t
  t = time.perf_counter()
  r = _block(generate(served, prompts, valid, cfg, s, jax.random.key(2)))
  dt = time.perf_counter() - t
  return first, int(r.lengths.sum()) / dt


PROMPTS = [
  "What is 7 + 5? Answer:",
  "What is 23 + 19? Answer:",
  "Write a haiku about the sea.",
  "The capital of France is",
  "List three prime numbers:",
  "Explain what a neural network is.",
  "What is 9 times 8?",
  "Translate 'good morning' to French:",
]


def _learner_logprobs(params, r, cfg, rules):
  """pi: a cache-free (learner) forward of the rollout, optionally QAT-fake-quantized by `rules`."""
  logits, _ = jax.jit(models.forward, static_argnames=("cfg",))(
    params, r.tokens, cfg, valid_BT=r.valid, numerics=models.Numerics(qat_rules=rules)
  )
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
  prev = jnp.maximum(predictor_index(r.valid), 0)
  logp = jnp.take_along_axis(logp, prev[:, :, None], axis=1)  # row s: the logits that predict token s
  return jnp.take_along_axis(logp, r.tokens[:, :, None], axis=-1)[..., 0]


def mismatch(new_tokens: int, spec=quant.Int4(group_size=64)):
  """|pi - mu| per generated token on SmolLM2-135M-Instruct, sampled at temperature 1."""
  cfg0, params, tok = models.load_gguf(models.smollm2())
  ids = tok.encode_batch(PROMPTS)
  P = max(map(len, ids))
  prompts = jnp.asarray([[0] * (P - len(i)) + i for i in ids], jnp.int32)  # left-padded
  valid = jnp.asarray([[False] * (P - len(i)) + [True] * len(i) for i in ids])
  s = SamplingConfig(max_new_tokens=new_tokens, temperature=1.0, eos_id=tok.eos_id, pad_id=0)
  rules = quant.QuantRules.default(spec)
  rows = [  # (label, compute dtype, served format, learner QAT rules)
    ("bf16 learner vs bf16 sampler", "bfloat16", None, None),
    (f"{spec.name} QAT learner vs {spec.name} sampler (bf16)", "bfloat16", spec, rules),
    (f"unquantized learner vs {spec.name} sampler (bf16)", "bfloat16", spec, None),
    ("f32 learner vs f32 sampler", "float32", None, None),
    (f"{spec.name} QAT learner vs {spec.name} sampler (f32)", "float32", spec, rules),
    (f"unquantized learner vs {spec.name} sampler (f32)", "float32", spec, None),
  ]
  print(
    f"SmolLM2-135M-Instruct, {len(PROMPTS)} prompts, <= {new_tokens} tokens at temperature 1; "
    f"per generated token: |pi - mu| (probabilities) and |log pi - log mu|"
  )
  print(f"{'pair':52s} {'|p-m| mean':>11s} {'p99':>9s} {'max':>9s} {'|dlog| mean':>12s} {'max':>9s} {'tokens':>6s}")
  for label, dt, fmt, qat in rows:
    cfg = cfg0.replace(dtype=dt)
    served = serve_params(params, fmt, dtype=jnp.dtype(dt))
    cache_dtype = jnp.float32 if dt == "float32" else jnp.bfloat16
    r = generate(served, prompts, valid, cfg, s, jax.random.key(0), cache_dtype=cache_dtype)
    # the learner sees its master weights cast to the compute dtype (QAT quantizes that cast)
    pi = _learner_logprobs(jax.tree_util.tree_map(lambda x: x.astype(dt), params), r, cfg, qat)
    m = r.loss_mask
    dlog = jnp.abs(pi - r.sampler_logp)[m]
    d = jnp.abs(jnp.exp(pi) - jnp.exp(r.sampler_logp))[m]
    print(
      f"{label:52s} {float(d.mean()):11.2e} {float(jnp.quantile(d, 0.99)):9.2e} {float(d.max()):9.2e} "
      f"{float(dlog.mean()):12.2e} {float(dlog.max()):9.2e} {int(m.sum()):6d}",
      flush=True,
    )


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--batches", type=int, nargs="+", default=[1, 16])
  ap.add_argument("--prompt-len", type=int, default=32)
  ap.add_argument("--new-tokens", type=int, default=64)
  ap.add_argument("--formats", nargs="+", default=["bf16", "int4"], choices=sorted(FORMATS))
  ap.add_argument("--serve-formats", nargs="*", default=["int4", "nvfp4", "fp8"], choices=sorted(FORMATS))
  ap.add_argument("--layers", type=int, default=SMOLLM2_135M.num_layers)
  ap.add_argument("--mismatch", action="store_true", help="measure |pi - mu| on SmolLM2 (GGUF) instead")
  args = ap.parse_args(argv)
  if args.mismatch:
    return mismatch(args.new_tokens)
  cfg = SMOLLM2_135M.replace(num_layers=args.layers)
  dtype = jnp.dtype(cfg.dtype)
  print(f"backend {jax.default_backend()}, devices {jax.device_count()}, config {cfg}")
  params = _block(models.init_params(cfg, jax.random.key(0)))
  print(f"params: {sum(x.size for x in jax.tree_util.tree_leaves(params)) / 1e6:.1f} M")

  for name in args.serve_formats:
    dt = time_serve_params(params, FORMATS[name], dtype=dtype)
    print(f"serve_params {name:6s}: {dt * 1e3:8.1f} ms")

  print(
    f"{'format':8s} {'batch':>5s} {'tok/s':>9s} {'first call s':>13s}  (prompt {args.prompt_len}, "
    f"new {args.new_tokens})"
  )
  served = {name: _block(serve_params(params, FORMATS[name], dtype=dtype)) for name in args.formats}
  for b in args.batches:
    for name in args.formats:
      first, tps = time_generate(served[name], cfg, b, args.prompt_len, args.new_tokens)
      print(f"{name:8s} {b:5d} {tps:9.1f} {first:13.1f}", flush=True)


if __name__ == "__main__":
  main()
