"""DAPO's dynamic sampling on vs off on the embedded task (issue 21): accuracy per generated token.

Both arms are configs/dapo_quickstart.yaml (INT4 QAT learner + INT4 rollouts, overlong shaping and filtering on)
and differ only in `dapo.dynamic_sampling`; the same seeds in both. Per run: greedy eval accuracy (256 held-out
sums, served INT4 weights) before and after RL, at every evaluation, against the cumulative number of generated
completion tokens (every round's, dropped groups included: what the sampler paid). Claims, paired by seed (the
same problems: problems and seeds resampled, 95% bootstrap):
  * dynamic sampling reaches a higher final accuracy (on − off > 0);
  * at the same generated-token budget (the off arm's total) its accuracy is higher (on at the last evaluation
    whose cumulative tokens fit the budget − off at its end > 0): the write-up's "sampling strategy" claim,
    accuracy per generated token.

  python scripts/dapo_results.py --seeds 5             # the table in docs/dapo_results.md
  python scripts/dapo_results.py --seeds 1 --steps 3 --sft-steps 20 --root /tmp/d   # a smoke run
  python scripts/dapo_results.py --config configs/dapo_smollm2.yaml --seeds 3 \
      --root runs/dapo_smollm2 --out docs/dapo_smollm2.md  # SmolLM2-135M-Instruct (the config's steps, no warm-up)

`--steps`, `--sft-steps` and `--eval-every` default to the config's own.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from smollm2_results import _correct, paired_bootstrap  # noqa: E402  (the same statistics as the SmolLM2 report)

from lrl_jax.config import load_config  # noqa: E402
from lrl_jax.rl.loop import train  # noqa: E402
from lrl_jax.rl.metrics import read_metrics  # noqa: E402

CONFIG = "configs/dapo_quickstart.yaml"
ARMS = {"off": "dapo.dynamic_sampling=false", "on": "dapo.dynamic_sampling=true"}


def run(arm: str, seed: int, args) -> Path:
  out = Path(args.root) / arm / f"seed{seed}"
  key = {"steps": args.steps, "sft_steps": args.sft_steps, "eval_every": args.eval_every}
  if args.config != CONFIG:
    key["config"] = args.config
  done = out / "done.json"
  if args.reuse and done.is_file() and json.loads(done.read_text()) == key:
    return out
  cfg = load_config(
    args.config,
    [
      ARMS[arm],
      f"run.seed={seed}",
      f"run.steps={args.steps}",
      f"run.sft_steps={args.sft_steps}",
      f"run.eval_every={args.eval_every}",
      "run.ckpt_every=0",
      f"run.out_dir={out}",
    ],
  )
  train(cfg, overwrite=True, progress=False, export=False)
  done.write_text(json.dumps(key))
  return out


def read(out: Path) -> dict:
  recs = read_metrics(out / "metrics.jsonl")
  rl = [r for r in recs if r["phase"] == "rl"]
  ev = [r for r in recs if r["phase"] == "eval"]
  cum = np.cumsum([r["generated_tokens"] for r in rl])
  by_step = {r["step"]: c for r, c in zip(rl, cum)}
  # an evaluation at step s follows RL step s - 1 (step 0: before RL)
  curve = [(float(by_step.get(r["step"] - 1, 0)), r["eval_accuracy"]) for r in ev]
  mean = lambda k: float(np.mean([r[k] for r in rl if k in r])) if any(k in r for r in rl) else float("nan")  # noqa: E731
  return {
    "curve": curve,
    "tokens": float(cum[-1]),
    "before": _correct(out / "eval_before.jsonl"),
    "after": _correct(out / "eval_after.jsonl"),
    "rounds": mean("sampling/rounds"),
    "dropped": mean("sampling/dropped_frac"),
    "filled": mean("sampling/filled_groups"),
    "wall_s": ev[-1].get("time/elapsed_s", float("nan")),
  }


def verdict(lo: float, hi: float) -> str:
  """Of a claim "> 0": holds if the whole interval is above 0, does not hold if none of it is."""
  return "holds" if lo > 0 else "does not hold" if hi <= 0 else "inconclusive at 95%"


def _f(x: float, fmt: str) -> str:
  return "-" if not np.isfinite(x) else fmt.format(x)


def at_budget(curve, budget: float) -> float:
  """Accuracy at the last evaluation whose cumulative generated tokens fit `budget`."""
  fit = [acc for tok, acc in curve if tok <= budget * (1 + 1e-9)]
  return fit[-1]


def figure(out: str) -> str:
  """The plot's file name under docs/figures (the embedded task's keeps its first name)."""
  stem = Path(out).stem
  return "dapo_accuracy_vs_tokens.png" if stem == "dapo_results" else f"{stem}_accuracy_vs_tokens.png"


def describe(cfg) -> str:
  """The arms' shared settings, read from the config (what the table was measured with)."""
  q, s, d = cfg.quant, cfg.sampler, cfg.dapo
  learner = "bf16" if q.learner == "none" else f"{q.learner} QAT"
  model = cfg.model.source if cfg.model.source != "tiny" else f"tiny {cfg.model.arch}"
  return (
    f"model {model}, {learner} learner, {q.sampler} rollouts, {cfg.task.digits}-digit addition, "
    f"G = {s.group_size} x {cfg.run.batch_prompts} prompts, {cfg.run.sft_steps} warm-up steps, {cfg.run.steps} RL "
    f"steps; overlong shaping with L_max = {s.max_new_tokens}, L_cache = {d.overlong_buffer}, overlong filtering "
    f"{'on' if d.overlong_filter else 'off'}"
  )


def render(runs: dict, args, wall: float, cfg) -> str:
  seeds = sorted(runs["off"])
  flags = f"--seeds {args.seeds} --steps {cfg.run.steps} --sft-steps {cfg.run.sft_steps}"
  if args.config != CONFIG:
    flags = f"--config {args.config} {flags} --eval-every {cfg.run.eval_every}"
  lines = [
    f"# DAPO dynamic sampling: accuracy per generated token ({cfg.model.source})",
    "",
    f"Made by `python scripts/dapo_results.py {flags}` "
    f"on {datetime.date.today().isoformat()}, {platform.machine()} CPU, {os.cpu_count()} cores "
    f"({wall / 60:.0f} min of runs, summed). Both arms: `{args.config}` ({describe(cfg)}); `on` sets "
    f"`dapo.dynamic_sampling=true` (at most {cfg.dapo.max_rounds} generation rounds a step). Seeds "
    f"{seeds}, the same in both arms. Accuracy: greedy, {cfg.task.eval_size} held-out sums, on the served "
    "weights.",
    "",
    "| arm | accuracy before | accuracy after | generated tokens (M) | rounds / step | groups dropped | "
    "groups filled / step |",
    "|---|---|---|---|---|---|---|",
  ]
  for arm in ARMS:
    rs = [runs[arm][s] for s in seeds]
    acc_b = np.mean([r["before"].mean() for r in rs])
    acc_a = [r["after"].mean() for r in rs]
    per_seed = ", ".join(f"{100 * a:.1f}" for a in acc_a)
    col = lambda k: [r[k] for r in rs]  # noqa: E731
    lines.append(
      f"| {arm} | {100 * acc_b:.1f} | {100 * np.mean(acc_a):.1f} (per seed {per_seed}) "
      f"| {np.mean([r['tokens'] for r in rs]) / 1e6:.3f} | {_f(np.mean(col('rounds')), '{:.2f}')} | "
      f"{_f(100 * np.mean(col('dropped')), '{:.0f}%')} | {_f(np.mean(col('filled')), '{:.1f}')} |"
    )
  off, on = runs["off"], runs["on"]
  d_final = paired_bootstrap({s: on[s]["after"] for s in seeds}, {s: off[s]["after"] for s in seeds})
  # at the off arm's token budget: the on arm's accuracy at the last evaluation within it (one number per seed,
  # resampled over seeds only: the evaluation may not be the final one, whose per-problem results are kept)
  gaps = np.asarray([at_budget(on[s]["curve"], off[s]["tokens"]) - off[s]["after"].mean() for s in seeds])
  rng = np.random.default_rng(0)
  boot = [rng.choice(gaps, len(gaps)).mean() for _ in range(10_000)]
  d_budget = (float(gaps.mean()), float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5)))
  lines += [
    "",
    "| claim | estimate (points) | 95% interval | verdict |",
    "|---|---|---|---|",
    f"| dynamic sampling ends higher (on − off final accuracy > 0) | {100 * d_final[0]:+.1f} | "
    f"[{100 * d_final[1]:+.1f}, {100 * d_final[2]:+.1f}] | {verdict(d_final[1], d_final[2])} |",
    f"| at the same generated tokens it is higher (on at off's budget − off final > 0) | {100 * d_budget[0]:+.1f} | "
    f"[{100 * d_budget[1]:+.1f}, {100 * d_budget[2]:+.1f}] | {verdict(d_budget[1], d_budget[2])} |",
    "",
    f"![accuracy vs generated tokens](figures/{figure(args.out)})",
    "",
    "The first interval resamples seeds and the 256 problems within each (paired: the same problems in both arms); "
    "the second resamples seeds only (the on arm's accuracy at the budget comes from an intermediate evaluation, "
    "recorded as a rate). With a handful of seeds an interval that spans 0 is reported as inconclusive, not as no "
    "effect.",
  ]
  return "\n".join(lines) + "\n"


def plot(runs: dict, path: Path) -> None:
  import matplotlib  # noqa: PLC0415  (plotting only)

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415

  fig, ax = plt.subplots(figsize=(6, 3.5))
  for arm, color in (("off", "tab:blue"), ("on", "tab:orange")):
    for i, s in enumerate(sorted(runs[arm])):
      tok, acc = zip(*runs[arm][s]["curve"])
      ax.plot(np.asarray(tok) / 1e6, 100 * np.asarray(acc), color=color, alpha=0.6, label=arm if i == 0 else None)
  ax.set_xlabel("generated completion tokens (M)")
  ax.set_ylabel("held-out accuracy (%)")
  ax.set_title("dynamic sampling off vs on (one line per seed)")
  ax.legend()
  fig.tight_layout()
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=120)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--config", default=CONFIG, help="both arms' config (they differ in dapo.dynamic_sampling only)")
  p.add_argument("--seeds", type=int, default=5)
  p.add_argument("--steps", type=int, default=None, help="RL steps (default: the config's)")
  p.add_argument("--sft-steps", type=int, default=None, help="supervised warm-up steps (default: the config's)")
  p.add_argument("--eval-every", type=int, default=None, help="default: the config's")
  p.add_argument("--root", default="runs/dapo_results")
  p.add_argument("--out", default="docs/dapo_results.md")
  p.add_argument("--reuse", action="store_true", help="keep finished runs with the same settings")
  args = p.parse_args(argv)
  base = load_config(args.config)
  args.steps = base.run.steps if args.steps is None else args.steps
  args.sft_steps = base.run.sft_steps if args.sft_steps is None else args.sft_steps
  args.eval_every = base.run.eval_every if args.eval_every is None else args.eval_every
  cfg = load_config(
    args.config, [f"run.steps={args.steps}", f"run.sft_steps={args.sft_steps}", f"run.eval_every={args.eval_every}"]
  )
  # the runs differ in seed and one flag: a persistent compilation cache lets later runs reuse the first's executables
  jax.config.update("jax_compilation_cache_dir", str(Path(args.root) / "jax_cache"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  runs: dict = {arm: {} for arm in ARMS}
  for seed in range(args.seeds):
    for arm in ARMS:
      t = time.perf_counter()
      runs[arm][seed] = read(run(arm, seed, args))
      r = runs[arm][seed]
      print(
        f"{arm:3s} seed {seed}: {100 * r['before'].mean():.1f}% -> {100 * r['after'].mean():.1f}%, "
        f"{r['tokens'] / 1e6:.3f} M tokens ({time.perf_counter() - t:.0f} s)",
        flush=True,
      )
  # the runs' own wall time, summed (a --reuse render takes none of its own)
  wall = sum(r["wall_s"] for arm in runs.values() for r in arm.values() if np.isfinite(r["wall_s"]))
  text = render(runs, args, wall, cfg)
  out = Path(args.out)
  plot(runs, out.parent / "figures" / figure(args.out))
  out.write_text(text)
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
