"""Sampler benchmarks on SmolLM2-135M.

    lrl-jax bench sampler [--batches 16 64 256] [--formats bf16 int4 fp8 nvfp4] [--repeats 3] [--no-torch]
      (= python -m lrl_jax.sampler.bench): the real SmolLM2-135M-Instruct (GGUF) on a fixed chat prompt set;
      transformers `generate` (torch f32, the `ref` extra; skipped without it) vs this sampler's static batch vs
      its rollout engine, every served format; a fixed 32-token workload (greedy and T=1) and a mixed-length one
      (per-request limits 2-40; S = b/4 rows decode at once in both paths: the static batch in waves of S, the
      engine on S slots); tokens/s and ratios, median of 3.
    python -m lrl_jax.sampler.bench --random-weights [--batches 1 16] [--prompt-len 32] [--new-tokens 64]
                                    [--formats bf16 int4] [--serve-formats int4 nvfp4 fp8]
      generation tokens/s and `serve_params` time on SmolLM2-135M shapes (random init)
    python -m lrl_jax.sampler.bench --mismatch [--new-tokens 48]
      the train-inference mismatch |pi - mu| on the real SmolLM2-135M-Instruct

Every format runs in one process, side by side, on the same random weights and prompts. Tokens/s
counts generated tokens (batch × new tokens, no EOS) over the wall time of one `generate` call
(prefill included), after a compile-and-warm-up call.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from lrl_jax import models, quant
from lrl_jax.rollout import predictor_index
from lrl_jax.sampler.generate import generate
from lrl_jax.sampler.sampling import SamplingConfig
from lrl_jax.sampler.serve import serve_params
from lrl_jax.tasks import ChatPromptFormatter

SMOLLM2_135M = models.SMOLLM2_135M

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
  cfg0, params, tok = models.smollm2()
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


def random_weights_bench(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--batches", type=int, nargs="+", default=[1, 16])
  ap.add_argument("--prompt-len", type=int, default=32)
  ap.add_argument("--new-tokens", type=int, default=64)
  ap.add_argument("--formats", nargs="+", default=["bf16", "int4"], choices=sorted(FORMATS))
  ap.add_argument("--serve-formats", nargs="*", default=["int4", "nvfp4", "fp8"], choices=sorted(FORMATS))
  ap.add_argument("--layers", type=int, default=SMOLLM2_135M.num_layers)
  args = ap.parse_args(argv)
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


# --------------------------------------------------------------------------- the rollout engine vs transformers

CHAT_PROMPTS = [
  "What is 7 + 5?",
  "What is 23 + 19? Answer with the number only.",
  "Write a haiku about the sea.",
  "What is the capital of France?",
  "List three prime numbers.",
  "Explain what a neural network is in one sentence.",
  "What is 9 times 8?",
  "Translate 'good morning' to French.",
  "Name a famous physicist.",
  "What colour is the sky on a clear day?",
  "Give me a synonym for 'happy'.",
  "How many legs does a spider have?",
  "What is the boiling point of water in Celsius?",
  "Write one sentence about autumn.",
  "What is 100 minus 37?",
  "Who wrote Romeo and Juliet?",
]


def _median_tps(run, tokens, repeats: int) -> float:
  """tokens / median wall seconds of `run()` over `repeats` calls, after one compile-and-warm-up call."""
  jax.block_until_ready(run())
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(run())
    times.append(time.perf_counter() - t)
  return tokens / sorted(times)[len(times) // 2]


def mixed_workload(served, prompts, valid, cfg, key, *, group_size: int, limits, repeats: int, pad_id: int):
  """(static tok/s, engine tok/s, S, tokens) of a mixed-length workload: request r stops after limits[r] tokens (the
  way RL completions end at EOS). S = b/4 rows decode at a time in both paths (the memory a deployment gives the
  decode batch): the static batch takes the requests in waves of S, each running until its longest row ends; the
  engine's S slots take the next request as soon as a row ends."""
  b, G = len(limits), group_size
  S = max(G, b // 4)
  s = SamplingConfig(max_new_tokens=int(max(limits)), temperature=1.0, eos_id=None, pad_id=pad_id)
  n = int(np.sum(limits))
  waves = [(i * S // G, (i + 1) * S // G) for i in range(b // S)]
  dt = jnp.dtype(cfg.dtype)

  def static_waves():
    return [
      generate(
        served,
        prompts[a:z],
        valid[a:z],
        cfg,
        s,
        jax.random.fold_in(key, a),
        group_size=G,
        cache_dtype=dt,
        limits=jnp.asarray(limits[a * G : z * G], jnp.int32),
      )
      for a, z in waves
    ]

  lim = jnp.asarray(limits, jnp.int32)
  engine = lambda: generate(served, prompts, valid, cfg, s, key, group_size=G, slots=S, cache_dtype=dt, limits=lim)  # noqa: E731
  return _median_tps(static_waves, n, repeats), _median_tps(engine, n, repeats), S, n


def _torch_row(path, ids, new_tokens: int, repeats: int, threads: int):
  """transformers generate tok/s (f32 CPU, greedy and T=1), or None with the reason when torch is missing."""
  try:
    import torch  # noqa: PLC0415  (the `ref` extra: not a dependency of the library)
    import transformers  # noqa: PLC0415
  except ImportError as e:
    return None, f"skipped: {e} (pip install -e '.[ref]')"
  torch.set_num_threads(threads)
  model = transformers.AutoModelForCausalLM.from_pretrained(
    path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="sdpa"
  ).eval()
  P = max(map(len, ids))
  inp = torch.tensor([[0] * (P - len(i)) + i for i in ids])
  att = torch.tensor([[0] * (P - len(i)) + [1] * len(i) for i in ids])
  out = {}
  for name, kw in (("greedy", dict(do_sample=False)), ("T=1", dict(do_sample=True, temperature=1.0, top_k=0))):

    def run(kw=kw):
      with torch.no_grad():
        return model.generate(
          input_ids=inp, attention_mask=att, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0, **kw
        )

    run()
    times = []
    for _ in range(repeats):
      t = time.perf_counter()
      run()
      times.append(time.perf_counter() - t)
    out[name] = len(ids) * new_tokens / sorted(times)[len(times) // 2]
  return out, "transformers (torch f32 CPU, sdpa)"


def engine_bench(argv=None) -> int:
  """`lrl-jax bench sampler`: SmolLM2-135M-Instruct (GGUF), transformers generate vs this sampler's static batch vs
  its engine, bf16 / INT4 g64 / FP8 / NVFP4 served, fixed and mixed-length workloads; tokens/s and ratios."""
  ap = argparse.ArgumentParser(prog="lrl-jax bench sampler", description=engine_bench.__doc__)
  ap.add_argument("--batches", type=int, nargs="+", default=[16, 64, 256])
  ap.add_argument("--formats", nargs="+", default=["bf16", "int4", "fp8", "nvfp4"], choices=sorted(FORMATS))
  ap.add_argument("--new-tokens", type=int, default=32, help="the fixed workload's tokens per request")
  ap.add_argument(
    "--mixed",
    type=int,
    nargs=2,
    default=[2, 40],
    metavar=("MIN", "MAX"),
    help="the mixed workload's per-request limits, uniform in [MIN, MAX]",
  )
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--no-torch", action="store_true", help="skip the transformers rows")
  ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="this sampler's compute dtype")
  args = ap.parse_args(argv)
  path = models.smollm2_path()
  cfg0, params, tok = models.load_gguf(path)
  cfg = cfg0.replace(dtype=args.dtype)
  enc = ChatPromptFormatter(tok.backend)
  threads = os.cpu_count() or 1  # XLA:CPU's thread pool uses every core; torch gets as many
  print(
    f"SmolLM2-135M-Instruct ({path.name}), backend {jax.default_backend()}, {threads} cores; this sampler in "
    f"{args.dtype}, KV cache {args.dtype}; median of {args.repeats}, compile excluded",
    flush=True,
  )
  served = {f: serve_params(params, FORMATS[f], dtype=jnp.dtype(args.dtype)) for f in args.formats}
  lo, hi = args.mixed
  lim_all = {b: np.random.default_rng(b).integers(lo, hi + 1, b) for b in args.batches}
  rows = []
  for b in args.batches:
    G = max(1, b // len(CHAT_PROMPTS))
    texts = [CHAT_PROMPTS[i % len(CHAT_PROMPTS)] for i in range(b // G)]
    ids = [enc.encode_prompt(t) for t in texts]
    P = max(map(len, ids))
    prompts = jnp.asarray([[enc.pad_id] * (P - len(i)) + i for i in ids], jnp.int32)
    valid = jnp.asarray([[False] * (P - len(i)) + [True] * len(i) for i in ids])
    key = jax.random.key(0)
    if not args.no_torch:
      rep_ids = [i for i in ids for _ in range(G)]
      t_out, label = _torch_row(path, rep_ids, args.new_tokens, args.repeats, threads)
      rows.append((b, "fixed", label, "f32", t_out))
      shown = ", ".join(f"{m} {v:.1f} tok/s" for m, v in t_out.items()) if t_out else label
      print(f"batch {b:4d} fixed {args.new_tokens} transformers: {shown}", flush=True)
    for f in args.formats:
      for temp in (0.0, 1.0):
        s = SamplingConfig(max_new_tokens=args.new_tokens, temperature=temp, eos_id=None, pad_id=enc.pad_id)
        n = b * args.new_tokens
        common = dict(group_size=G, cache_dtype=jnp.dtype(args.dtype))
        st = _median_tps(lambda s=s: generate(served[f], prompts, valid, cfg, s, key, **common), n, args.repeats)
        en = _median_tps(
          lambda s=s: generate(served[f], prompts, valid, cfg, s, key, slots=b, **common), n, args.repeats
        )
        rows.append((b, "fixed", f"static T={temp:g}", f, st))
        rows.append((b, "fixed", f"engine T={temp:g}", f, en))
        print(
          f"batch {b:4d} fixed {args.new_tokens} {f:6s} T={temp:g}: static {st:8.1f} tok/s, engine {en:8.1f} "
          f"({en / st:.2f}x)",
          flush=True,
        )
      st, en, S, n = mixed_workload(
        served[f], prompts, valid, cfg, key, group_size=G, limits=lim_all[b], repeats=args.repeats, pad_id=enc.pad_id
      )
      lo, hi = args.mixed
      rows.append((b, f"mixed {lo}-{hi}", f"static T=1, waves of {S}", f, st))
      rows.append((b, f"mixed {lo}-{hi}", f"engine T=1, {S} slots", f, en))
      print(
        f"batch {b:4d} mixed {lo}-{hi} {f:6s}: static (waves of {S}) {st:8.1f} tok/s, engine ({S} slots) "
        f"{en:8.1f} ({en / st:.2f}x)",
        flush=True,
      )
  _print_table(rows)
  return 0


def _print_table(rows) -> None:
  print("\n| batch | workload | path | weights | tok/s | vs bf16 (same path) | vs transformers greedy |")
  print("|---|---|---|---|---|---|---|")
  by = {(b, w, p, f): v for b, w, p, f, v in rows if not isinstance(v, dict)}
  for b, w, p, f, v in rows:
    if isinstance(v, dict) or v is None:
      note = p if v is None else ""
      vals = {} if v is None else v
      for mode in ("greedy", "T=1"):
        shown = f"{vals[mode]:.1f}" if mode in vals else "—"
        print(f"| {b} | {w} | transformers {mode} | f32 | {shown} | | {note} |")
      continue
    base = by.get((b, w, p, "bf16"))
    torch_rows = [x for x in rows if x[0] == b and isinstance(x[4], dict)]
    tg = torch_rows[0][4].get("greedy") if torch_rows else None
    r_bf = f"{v / base:.2f}x" if base else ""
    r_t = f"{v / tg:.2f}x" if tg and w == "fixed" else ""
    print(f"| {b} | {w} | {p} | {f} | {v:.1f} | {r_bf} | {r_t} |")


def main(argv=None) -> int:
  """`python -m lrl_jax.sampler.bench [--random-weights | --mismatch] ...` (module docstring)."""
  argv = sys.argv[1:] if argv is None else list(argv)
  if "--mismatch" in argv:
    ap = argparse.ArgumentParser(prog="python -m lrl_jax.sampler.bench --mismatch")
    ap.add_argument("--mismatch", action="store_true")
    ap.add_argument("--new-tokens", type=int, default=48)
    return mismatch(ap.parse_args(argv).new_tokens) or 0
  if "--random-weights" in argv:
    return random_weights_bench([a for a in argv if a != "--random-weights"]) or 0
  return engine_bench(argv)


if __name__ == "__main__":
  raise SystemExit(main())
