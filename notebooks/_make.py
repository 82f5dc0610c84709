"""Writes the notebooks in this folder, outputs stripped: `python notebooks/_make.py`.

Each notebook is a list of cells below; edit here, then regenerate (the test suite checks that the
committed notebooks carry no outputs and executes each with LRL_NB_SMALL=1).
"""

from __future__ import annotations

from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent

SETUP = '''\
import os
SMALL = os.environ.get("LRL_NB_SMALL") == "1"  # small sizes: the test suite runs every notebook this way
%matplotlib inline
import matplotlib.pyplot as plt
import numpy as np
import jax
import jax.numpy as jnp
from IPython.display import display


def show(fig):
  """Displays a figure (works whatever backend a library switched matplotlib to) and closes it."""
  display(fig)
  plt.close(fig)


print("backend:", jax.default_backend(), "| small:", SMALL)'''


def md(s):
  return nbformat.v4.new_markdown_cell(s)


def code(s):
  return nbformat.v4.new_code_cell(s)


NUMERICS = [
  md("""# 01 · Numerics explorer

Quantize one weight matrix per layer in every format `lrl_jax.quant` supports (INT4 g32 / g128, FP8
per-channel / 128-blocks, MXFP8, NVFP4), along the contraction axis (`axis=-2`) as the model does, and
look at the error: its histogram, the per-layer relative error, and the storage cost in bits per weight
(codes + scales). Full mode loads SmolLM2-135M-Instruct (`models.smollm2()`, its
MLP `down_proj` [30, 1536, 576]); `LRL_NB_SMALL=1` uses a few random heavy-tailed (Student-t, ν=4)
matrices instead."""),
  code(SETUP),
  code("""\
from lrl_jax import models, quant

if SMALL:
  rng = np.random.default_rng(0)
  W = (0.02 * rng.standard_t(df=4, size=(4, 256, 512))).astype(np.float32)  # 4 random "layers" [L, K, N]
  source = "random Student-t (ν=4) matrices"
else:
  cfg, params, _ = models.smollm2(tokenizer=False)
  W = np.asarray(params["layers"]["mlp"]["down_proj"]["kernel"], np.float32)  # [30, 1536, 576]
  source = "SmolLM2-135M-Instruct mlp/down_proj"
L, K, N = W.shape
print(source, W.shape)"""),
  code("""\
# FP8 block scales need K and N divisible by the block: SmolLM2's N = 576 is not a multiple of 128 -> use 64.
fp8_block = 128 if (K % 128 == 0 and N % 128 == 0) else 64
SPECS = {
  "INT4 g32": quant.Int4(group_size=32),
  "INT4 g128": quant.Int4(group_size=128),
  "FP8 channel": quant.FP8(granularity="channel"),
  f"FP8 block{fp8_block}": quant.FP8(granularity="block", block=fp8_block),
  "MXFP8": quant.MXFP8(),
  "NVFP4": quant.NVFP4(),
}
w = jnp.asarray(W)
results = {}
for name, spec in SPECS.items():
  q = quant.quantize(w, spec, axis=-2)                      # stacked: every layer quantized on its own
  w_hat = np.asarray(quant.dequantize(q))
  fq = np.asarray(quant.fake_quant(w, spec, axis=-2))
  # The numerics contract: fake quantization (what the QAT learner sees) == the served codes, bit for bit.
  np.testing.assert_array_equal(fq, w_hat)
  err = w_hat.astype(np.float64) - W
  rel = np.linalg.norm(err.reshape(L, -1), axis=1) / np.linalg.norm(W.reshape(L, -1).astype(np.float64), axis=1)
  results[name] = dict(q=q, err=err, rel=rel, bpw=q.bits_per_weight)
  print(f"{name:12s} bits/weight {q.bits_per_weight:6.3f}   mean rel. error {rel.mean():.4f}   "
        "fake_quant == dequantize(quantize): OK")"""),
  md("## Error histogram (ŵ − w), all layers"),
  code("""\
fig, axes = plt.subplots(2, 3, figsize=(13, 6.5), sharey=True)
for ax, (name, r) in zip(axes.ravel(), results.items()):
  e = r["err"].ravel()
  lim = np.quantile(np.abs(e), 0.999)
  ax.hist(e, bins=121, range=(-lim, lim), color="C0")
  ax.set_yscale("log")
  ax.set_title(f"{name}  ({r['bpw']:.3f} bits/w)")
  ax.set_xlabel("ŵ − w")
fig.suptitle(f"Quantization error — {source}")
fig.tight_layout()
show(fig)"""),
  md("## Relative error ‖ŵ − w‖ / ‖w‖ per layer"),
  code("""\
fig, ax = plt.subplots(figsize=(9, 4))
for name, r in results.items():
  ax.plot(np.arange(L), r["rel"], marker="o", ms=3, label=f"{name} ({r['bpw']:.2f} b/w)")
ax.set_yscale("log")
ax.set_xlabel("layer")
ax.set_ylabel("relative Frobenius error")
ax.set_title(source)
ax.legend(fontsize=8, ncol=2)
show(fig)"""),
  md("## Storage cost vs error"),
  code("""\
fig, ax = plt.subplots(figsize=(6, 4))
for name, r in results.items():
  ax.scatter(r["bpw"], r["rel"].mean())
  ax.annotate(name, (r["bpw"], r["rel"].mean()), textcoords="offset points", xytext=(4, 4), fontsize=8)
ax.axvline(16, color="gray", ls=":", label="bf16 = 16 bits/w")
ax.set_xlabel("bits per weight (codes + scales)")
ax.set_ylabel("mean relative error")
ax.set_yscale("log")
ax.legend()
show(fig)
for name, r in results.items():
  assert r["rel"].max() < 0.25, (name, r["rel"].max())  # sanity: every format keeps the matrix recognisable"""),
]

RL_RUN = [
  md("""# 04 · A short quickstart RL run, from Python

`config.load_config("configs/quickstart.yaml", overrides)` then `rl.train(cfg)`: a tiny Qwen2-shaped
model learns 2-digit addition (supervised warm-up, then GRPO with INT4 QAT in the learner and real INT4
weights in the sampler). Then reward, accuracy and the learner–sampler mismatch |π − μ| from its
`metrics.jsonl`. `LRL_NB_SMALL=1` shortens the run: 1-digit sums, a 150-step warm-up on batches of 32 (the
2-digit task needs the full 500 x 128 to leave its near-zero accuracy), then 10 RL steps with smaller batches."""),
  code(SETUP),
  code("""\
import json, tempfile
from pathlib import Path
from lrl_jax import config, rl

out_dir = Path(tempfile.mkdtemp(prefix="lrl_nb_rl_"))
if SMALL:
  overrides = ["task.digits=1", "run.sft_steps=150", "run.sft_batch=32", "run.steps=10", "run.batch_prompts=16",
               "run.eval_every=5", "run.ckpt_every=10", "task.eval_size=128"]
else:
  overrides = []  # the quickstart as configured: 500 warm-up steps, 200 GRPO steps
cfg = config.load_config("configs/quickstart.yaml", overrides + [f"run.out_dir={out_dir}"])
result = rl.train(cfg, progress=False, export=False)
print(f"{result.steps} RL steps in {result.wall_s:.0f} s; "
      f"accuracy {result.accuracy_before} -> {result.accuracy_after}; "
      f"reward {result.reward_first:.3f} -> {result.reward_last:.3f}; mean |π−μ| {result.mismatch_mean:.2e}")
assert result.steps == cfg.run.steps and result.skipped_steps == 0"""),
  code("""\
metrics_path = Path(result.paths.get("metrics", out_dir / "metrics.jsonl"))
records = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
print(len(records), "records; keys of the last:", sorted(records[-1]))"""),
  code('''\
def series(phase, key):
  """(steps, values) of metric `key` in the records of `phase` ("sft", "rl" or "eval")."""
  pts = [(r["step"], r[key]) for r in records if r.get("phase") == phase and r.get(key) is not None]
  return np.array(pts, dtype=float).T if pts else np.zeros((2, 0))

fig, axes = plt.subplots(1, 4, figsize=(17, 3.6))
x, y = series("sft", "sft_loss")
axes[0].plot(x, y); axes[0].set_title("supervised warm-up loss"); axes[0].set_xlabel("SFT step")
x, y = series("rl", "reward_mean")
axes[1].plot(x, y, marker="o", ms=3); axes[1].set_title("train reward (mean over rollouts)")
x, y = series("rl", "accuracy")
axes[2].plot(x, y, marker="o", ms=3, label="train rollouts (sampled)")
x, y = series("eval", "eval_accuracy")
axes[2].plot(x, y, marker="s", label="eval set (greedy, served INT4)")
axes[2].set_title("accuracy"); axes[2].legend(fontsize=8)
x, y = series("rl", "mismatch/prob_abs_diff_mean")
axes[3].plot(x, y, marker="o", ms=3, label="token-mean |π − μ|")
x, y = series("rl", "mismatch/prob_abs_diff_max")
axes[3].plot(x, y, marker="^", ms=3, label="max |π − μ|")
axes[3].set_yscale("log"); axes[3].set_title("learner–sampler mismatch"); axes[3].legend(fontsize=8)
for ax in axes[1:]:
  ax.set_xlabel("RL step")
fig.tight_layout()
show(fig)
assert len(series("rl", "reward_mean")[0]) == cfg.run.steps'''),
  md("""## Your own prompts and reward

A task is rows of (prompt, reference) and a function `reward(completion, reference) -> float`.
`tasks.PromptsTask` turns them into what the loop needs (batches in a seeded order, an eval split, the
supervised warm-up's targets); `rl.train(cfg, task=factory)` takes a factory that receives the model's prompt
encoder. Here: subtraction with a non-negative result, a reward with partial credit for being close (the
same function would be `task.reward: my_module:close_enough` with `task.name: prompts` and a JSONL file in
YAML, as `configs/smollm2_own_task.yaml` does). The reward runs in worker processes with a timeout
(`task.reward_timeout_s`): a reward that raises, hangs or returns a non-number scores 0 and is counted in
`reward_failed`."""),
  code('''\
from lrl_jax.tasks import PromptsTask

rows = [(f"{a}-{b}=", str(a - b)) for a in range(10) for b in range(a + 1)]  # 55 problems, results 0..9
np.random.default_rng(0).shuffle(rows)
train_rows, eval_rows = rows[:40], rows[40:]


def close_enough(completion: str, reference: str) -> float:
  """1 for the right number, less the further off it is, 0 for no number."""
  try:
    return max(0.0, 1.0 - abs(int(completion.strip()) - int(reference)) / 5)
  except ValueError:
    return 0.0


own_dir = Path(tempfile.mkdtemp(prefix="lrl_nb_own_"))
own = config.load_config(
  "configs/quickstart.yaml",
  [f"run.sft_steps={100 if SMALL else 300}", "run.sft_batch=32", f"run.steps={6 if SMALL else 40}",
   "run.batch_prompts=8", "run.eval_every=0", "task.eval_size=15", f"run.out_dir={own_dir}"],
)
own_result = rl.train(
  own, progress=False, export=False,
  task=lambda encoder, seed: PromptsTask(train_rows, reward=close_enough, encoder=encoder, eval_rows=eval_rows,
                                         seed=seed),
)
own_records = [json.loads(x) for x in Path(own_result.paths["metrics"]).read_text().splitlines() if x.strip()]
rl_rewards = [r["reward_mean"] for r in own_records if r["phase"] == "rl"]
print(f"held-out exact accuracy {own_result.accuracy_before} -> {own_result.accuracy_after}; "
      f"train reward per step {np.round(rl_rewards, 3)}")
assert len(rl_rewards) == own.run.steps and all(0.0 <= r <= 1.0 for r in rl_rewards)'''),
]

KERNELS = [
  md("""# 03 · Low-bit matmul benchmark

`lrl_jax.kernels.bench.run` times each format's matmul (`x[M, K] @ ŵ[K, N]`) next to a bf16 `jnp.dot` of
the same shape on whatever backend is present. At decode sizes (small M) a matmul is memory-bound: its
time is the bytes it reads divided by the HBM bandwidth, so the best possible speed-up over bf16 is
bf16 bytes / low-bit bytes (the dashed roofline). On CPU only the XLA dequantize-then-dot path is timed
(Pallas would run in interpret mode) and the roofline shown is an H200's (4.8 TB/s HBM), labelled as such.
`LRL_NB_SMALL=1` runs one small shape with few iterations."""),
  code(SETUP),
  code("""\
from lrl_jax.kernels import bench

if SMALL:
  shapes, ms, iters, warmup = ((1024, 1024),), (1, 8, 32, 128), 3, 1
else:
  shapes, ms, iters, warmup = ((4096, 4096),), bench.M_ALL, 10, 2
rows = bench.run(shapes=shapes, ms=ms, iters=iters, warmup=warmup)
print(bench.format_table(rows))"""),
  code("""\
dev = jax.devices()[0]
kind = getattr(dev, "device_kind", str(dev))
HBM = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12}  # bytes/s, vendor datasheets
bw = next((v for k, v in HBM.items() if k in kind), None)
if jax.default_backend() == "cpu" or bw is None:
  bw, bw_label = 4.8e12, "H200: 4.8 TB/s HBM, 989 TFLOP/s bf16 (figures for an H200, NOT this device)"
else:
  bw_label = f"{kind}: {bw / 1e12:.2f} TB/s HBM"
PEAK = {"H200": 989e12, "H100": 989e12, "A100": 312e12}  # dense bf16 FLOP/s, vendor datasheets
peak = next((v for k, v in PEAK.items() if k in kind), 989e12)
print("device:", kind, "| roofline:", bw_label)

k, n = shapes[0]
fmts = [f for f in bench.FORMATS]
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 4.5))
for i, f in enumerate(fmts):
  for path, ls in (("pallas", "-"), ("xla", "--")):
    pts = [(r.m, r.speedup) for r in rows if r.fmt == f and r.path == path and r.speedup is not None]
    if pts:
      m_, s_ = zip(*pts)
      ax1.plot(m_, s_, ls, marker="o", color=f"C{i}", label=f"{f} ({path})")
  # memory-bound roofline: bf16 bytes / low-bit bytes (weights + scales + activations), per M
  ideal = [(r.m, [b for b in rows if b.m == r.m and b.fmt == "bf16"][0].bytes_read / r.bytes_read)
           for r in rows if r.fmt == f and r.path == "xla"]
  m_, s_ = zip(*ideal)
  ax1.plot(m_, s_, ":", color=f"C{i}", alpha=0.7)
ax1.axhline(1.0, color="gray", lw=0.8)
ax1.set_xscale("log", base=2)
ax1.set_xlabel("M (tokens per matmul)")
ax1.set_ylabel("speed-up over bf16 jnp.dot")
ax1.set_title(f"{k}×{n} on {jax.default_backend()} — dotted: memory-bound bound (bytes ratio)")
ax1.legend(fontsize=7, ncol=2)

colors = {"bf16": "k", **{f: f"C{i}" for i, f in enumerate(fmts)}}
for f in ["bf16"] + fmts:
  sel = [r for r in rows if r.fmt == f and r.path in ("bf16 dot", "xla") and r.seconds is not None]
  ax2.plot([r.m for r in sel], [r.seconds * 1e6 for r in sel], marker="o", color=colors[f], label=f"{f} measured")
  # roofline floor: max(bytes / bandwidth, flops / bf16 peak) — memory-bound at small M
  ax2.plot([r.m for r in sel], [max(r.bytes_read / bw, 2 * r.m * r.k * r.n / peak) * 1e6 for r in sel], ":",
           color=colors[f])
ax2.set_xscale("log", base=2)
ax2.set_yscale("log")
ax2.set_xlabel("M")
ax2.set_ylabel("µs per matmul")
ax2.set_title(f"dotted: roofline time, max(bytes / BW, flops / peak) — {bw_label}", fontsize=8)
ax2.legend(fontsize=7)
fig.tight_layout()
show(fig)"""),
]

MISMATCH = [
  md("""# 02 · Train–inference mismatch

Generate with the same weights served four ways (bf16, INT4, FP8 per-channel, NVFP4 —
`sampler.serve_params` + `sampler.generate`, sampled at temperature 1, μ = the sampler's own token
probabilities), then recompute π for the same tokens with the learner's forward (`learner.logprobs`, no KV
cache): once with the plain bf16 learner, once with a QAT learner that fake-quantizes its weights to
the served format (`learner.logprobs(model, rollout, numerics=spec)`). The per-token |π − μ|
distributions show how
much of the mismatch QAT removes. Then the importance weights that correct for it (TIS, MIS, ACRL) on the
same rollouts. Full mode: SmolLM2-135M-Instruct; `LRL_NB_SMALL=1`: the tiny quickstart-shaped model
(random init, random prompts)."""),
  code(SETUP),
  code("""\
from lrl_jax import learner, losses, models, quant, sampler

if SMALL:
  cfg = models.ModelConfig(arch="qwen2", vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2,
                           num_heads=4, num_kv_heads=2, dtype="bfloat16")
  params = models.init_params(cfg, jax.random.key(0), std=0.1)  # a larger std: peaked, LLM-like distributions
  model = models.LoadedModel(cfg, params)  # no tokenizer: generation never stops early
  B, P, new_tokens = 32, 8, 24
  prompts = jax.random.randint(jax.random.key(1), (B, P), 1, cfg.vocab_size).tolist()
  int4 = quant.Int4(group_size=32)
  source = "tiny qwen2 (D=64, L=2, random init)"
else:
  model = models.smollm2(compute_dtype="bfloat16")  # float32 weights, bf16 compute; stops at the tokenizer's EOS
  PROMPTS = ["What is 7 + 5? Answer:", "What is 23 + 19? Answer:", "Write a haiku about the sea.",
             "The capital of France is", "List three prime numbers:", "Explain what a neural network is.",
             "What is 9 times 8?", "Translate 'good morning' to French:"]
  prompts = model.tokenizer.encode_batch(PROMPTS)  # lists of ids: generate pads them on the left
  B, new_tokens = len(PROMPTS), 48
  int4 = quant.Int4(group_size=64)  # SmolLM2's K = 576 is not a multiple of 128
  source = "SmolLM2-135M-Instruct"
cfg = model.cfg
FORMATS = {"bf16": None, int4.name: int4,
           "fp8": quant.FP8(granularity="channel"), "nvfp4": quant.NVFP4()}
sampling = sampler.SamplingConfig(max_new_tokens=new_tokens, temperature=1.0)

runs = {}
for name, spec in FORMATS.items():
  served = sampler.serve_params(model, spec)  # real low-bit codes, computing in the model's bf16
  r = sampler.generate(served, prompts, sampling=sampling, key=jax.random.key(2))
  pi_bf16 = learner.logprobs(model, r)  # the learner's π: bf16, no fake quantization
  pi_qat = pi_bf16 if spec is None else learner.logprobs(model, r, numerics=spec)  # ... and its QAT twin
  m = np.asarray(r.loss_mask)
  mu = np.asarray(r.sampler_logp)
  pis = (("bf16 learner", pi_bf16), ("QAT learner", pi_qat))
  d = {k: np.abs(np.exp(np.asarray(v)) - np.exp(mu))[m] for k, v in pis}
  runs[name] = dict(r=r, mu=mu, pi_bf16=np.asarray(pi_bf16), pi_qat=np.asarray(pi_qat), mask=m, d=d)
  print(f"{name:6s} served | {m.sum():4d} tokens | mean |π−μ|: bf16 learner {d['bf16 learner'].mean():.2e}, "
        f"QAT learner {d['QAT learner'].mean():.2e}")
  assert np.all(np.isfinite(d["bf16 learner"])) and m.sum() > 0"""),
  md("## Per-token |π − μ|, bf16 learner vs QAT learner, per served format"),
  code("""\
fig, axes = plt.subplots(1, len(runs), figsize=(4.2 * len(runs), 3.6), sharey=True)
all_d = np.concatenate([v for r in runs.values() for v in r["d"].values()])
lo = max(np.quantile(all_d[all_d > 0], 0.001), 1e-9) if np.any(all_d > 0) else 1e-9
bins = np.logspace(np.log10(lo), np.log10(max(all_d.max(), lo * 10)), 50)
for ax, (name, r) in zip(axes, runs.items()):
  for (label, d), c in zip(r["d"].items(), ("C3", "C0")):
    zeros = int((d == 0).sum())
    ax.hist(np.clip(d, lo, None), bins=bins, alpha=0.55, color=c,
            label=f"{label}: mean {d.mean():.1e}" + (f" ({zeros} exact 0)" if zeros else ""))
  ax.set_xscale("log")
  ax.set_title(f"served {name}")
  ax.set_xlabel("|π − μ| per generated token")
  ax.legend(fontsize=7)
axes[0].set_ylabel("tokens")
fig.suptitle(f"{source}: learner vs sampler token probabilities (bf16 compute; exact zeros drawn at the left edge)")
fig.tight_layout()
show(fig)"""),
  md("""## Importance weights on the same rollouts

With the bf16 learner's π as π_old and the sampler's μ: TIS (token, C = 2), MIS (sequence, keep ρ in
[0.5, 2]) and ACRL (γ = 0.65, C = 2; X measured on this batch, so it is step 0 of a run). ACRL needs
advantages; these rollouts have no task, so the advantages are a random ±1 per sequence (their sign is
all ACRL uses)."""),
  code("""\
rng = np.random.default_rng(0)
fig, axes = plt.subplots(1, 3, figsize=(15, 3.6), sharey=True)
for i, (name, r) in enumerate(runs.items()):
  old, mu, mask = jnp.asarray(r["pi_bf16"]), jnp.asarray(r["mu"]), jnp.asarray(r["mask"])
  w_tis, _ = losses.tis_weights(old, mu, mask, level="token", clip_c=2.0)
  w_mis, _ = losses.mis_weights(old, mu, mask, level="sequence", lo=0.5, hi=2.0)
  adv = jnp.asarray(rng.choice([-1.0, 1.0], size=mask.shape[0]), jnp.float32)
  w_acrl, _, _ = losses.acrl_weights(losses.acrl_init(), old, mu, adv, mask, gamma=0.65, clip_c=2.0)
  m = r["mask"]
  for ax, (label, w) in zip(axes, (("TIS (token, C=2)", w_tis), ("MIS (sequence, [0.5, 2])", w_mis),
                                   ("ACRL (γ=0.65, C=2)", w_acrl))):
    w = np.asarray(w)[m]
    assert np.all(np.isfinite(w)) and np.all(w >= 0) and np.all(w <= 2.0 + 1e-6)
    ax.hist(w - 1.0, bins=40, histtype="step", lw=1.5, color=f"C{i}", label=f"{name}: mean {w.mean():.4f}")
    ax.set_title(label)
    ax.set_xlabel("weight − 1")
for ax in axes:
  ax.set_yscale("log")
  ax.legend(fontsize=7)
axes[0].set_ylabel("tokens")
fig.suptitle(f"{source}: correction weights (π_old = bf16 learner)")
fig.tight_layout()
show(fig)"""),
]

NOTEBOOKS = {
  "01_numerics.ipynb": NUMERICS,
  "02_mismatch.ipynb": MISMATCH,
  "03_kernels.ipynb": KERNELS,
  "04_rl_run.ipynb": RL_RUN,
}


def main():
  for name, cells in NOTEBOOKS.items():
    nb = nbformat.v4.new_notebook()
    nb.cells = cells
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for i, c in enumerate(nb.cells):  # deterministic ids: regenerating gives the same file
      c["id"] = f"{Path(name).stem}-{i:02d}"
    nbformat.validate(nb)
    nbformat.write(nb, HERE / name)
    print("wrote", HERE / name)


if __name__ == "__main__":
  main()
