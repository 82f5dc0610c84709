#!/usr/bin/env python
"""The real-model campaign: SmolLM2-135M-Instruct learning 2-digit addition under each rollout / learner precision.

    python scripts/smollm2_results.py --seeds 0 1 2 --steps 30            # the table of docs/smollm2_results.md
    python scripts/smollm2_results.py --arms bf16 --seeds 0 --steps 2 --out /tmp/s.md --root /tmp/s   # smoke run

Arms (one committed config each; every arm the same prompts, seeds, step budget and held-out eval set):
  bf16         configs/smollm2_grpo.yaml            bf16 rollouts, bf16 learner
  int4_qat     configs/smollm2_int4_qat_grpo.yaml   INT4 g64 rollouts + INT4 QAT learner, after a QAT recovery
  int4_no_qat  configs/smollm2_int4_rollout.yaml    INT4 g64 rollouts, bf16 learner
  fp8          configs/smollm2_fp8.yaml             FP8 W8A8 rollouts, no correction
  fp8_tis      configs/smollm2_fp8_tis.yaml         FP8 W8A8 rollouts + token TIS
  fp8_acrl     configs/smollm2_fp8_acrl.yaml        FP8 W8A8 rollouts + ACRL
  nvfp4_lora   configs/smollm2_nvfp4_lora.yaml      NVFP4 frozen base + LoRA (QeRL)

The INT4 QAT recovery runs once (seed 0, `run.recover_steps` of its config or --recover-steps): the recovered float
masters are exported (`lrl-jax export --format hf`) and every int4_qat seed starts RL from them. Its curve (served
INT4 accuracy vs recovery step) and cost are reported separately.

Statistics. Each run's accuracy carries its 95% Wilson interval over the eval problems. Claims comparing arms (or
before / after) use a paired hierarchical bootstrap: resample seeds, then eval problems within each seed (the same
problems in both arms: the eval set is fixed), 10,000 times; the 95% percentile interval of the difference decides
"holds" (the interval is on the claim's side of its threshold), "does not hold" (on the other side) or
"inconclusive" (it straddles it). With 3 seeds the seed level is coarse; the table says how many seeds each used.
Every number in the report comes from the run directories this script writes (`--root`).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from lrl_jax.config import load_config
from lrl_jax.rl import train
from lrl_jax.rl.metrics import read_metrics

ARMS: dict[str, tuple[str, str]] = {
  "bf16": ("configs/smollm2_grpo.yaml", "bf16 rollouts, bf16 learner"),
  "int4_qat": ("configs/smollm2_int4_qat_grpo.yaml", "INT4 g64 rollouts + INT4 QAT (after recovery)"),
  "int4_no_qat": ("configs/smollm2_int4_rollout.yaml", "INT4 g64 rollouts, no QAT"),
  "fp8": ("configs/smollm2_fp8.yaml", "FP8 W8A8 rollouts, no correction"),
  "fp8_tis": ("configs/smollm2_fp8_tis.yaml", "FP8 W8A8 rollouts + TIS"),
  "fp8_acrl": ("configs/smollm2_fp8_acrl.yaml", "FP8 W8A8 rollouts + ACRL"),
  "nvfp4_lora": ("configs/smollm2_nvfp4_lora.yaml", "NVFP4 frozen base + LoRA"),
}
BOOT = 10_000


# --------------------------------------------------------------------------- running


def _run(config: str, overrides: list[str], out: Path, reuse: bool, *, export: bool = False) -> Path:
  """Trains `config` + overrides into `out` unless --reuse finds a finished run with the same overrides there (or
  a stopped one to continue)."""
  key = out / "campaign_key.json"
  if reuse and key.is_file() and json.loads(key.read_text()) == overrides and (out / "eval_after.jsonl").is_file():
    return out
  cfg = load_config(config, [*overrides, f"run.out_dir={out}"])
  # --reuse also continues a run that was stopped part-way (its checkpoints; the run directory refuses a resume
  # whose config changed in a way that matters)
  partial = reuse and not key.is_file() and (out / "checkpoints").is_dir() and any((out / "checkpoints").iterdir())
  train(cfg, resume=partial, overwrite=not partial, progress=False, export=export)
  key.write_text(json.dumps(overrides))
  return out


def recovery_stage(root: Path, recover_steps: int | None, eval_every: int, reuse: bool, extra=()) -> Path:
  """The INT4 QAT recovery (seed 0, no RL step) and the float HF export of its masters; returns the export dir."""
  over = ["run.seed=0", "run.steps=0", "run.eval_every=0", *extra]
  if recover_steps is not None:
    over.append(f"run.recover_steps={recover_steps}")
  if eval_every:
    over.append(f"run.recover_eval_every={eval_every}")
  out = _run(ARMS["int4_qat"][0], over, root / "recover", reuse)
  hf = out / "recovered_hf"
  if not (reuse and (hf / "config.json").is_file()):
    subprocess.run(
      [sys.executable, "-m", "lrl_jax", "export", "--format", "hf", str(out), str(hf)], check=True, capture_output=True
    )
  return hf


def arm_overrides(arm: str, seed: int, steps: int, eval_every: int, recovered: Path | None) -> list[str]:
  over = [f"run.seed={seed}", f"run.steps={steps}", f"run.eval_every={eval_every}"]
  if arm == "int4_qat":
    over += [f"model.source=hf:{recovered}", "run.recover_steps=0"]
  return over


# --------------------------------------------------------------------------- reading a run


@dataclasses.dataclass
class Run:
  arm: str
  seed: int
  before: dict  # the eval record before RL (eval_accuracy, _lo, _hi, _n, transfer sets)
  after: dict
  correct_before: np.ndarray  # [n] 0/1 per eval problem (the fixed held-out set, in its order)
  correct_after: np.ndarray
  curve: list  # (step, elapsed s, accuracy, lo, hi) at each evaluation
  mismatch: float  # mean over RL steps of the token-mean |π − μ|
  acrl_yx: list  # Y/X per RL step (ACRL arms)
  reward: list  # train reward per RL step
  step_s: dict  # mean seconds per RL step: generate, reward, learner, sync
  wall_s: float  # the run's wall time (evaluations included)


def _correct(path: Path) -> np.ndarray:
  rows = [json.loads(x) for x in path.read_text().splitlines()]
  return np.asarray([r["reward"] >= 1.0 for r in rows if r["set"] == ""], np.float64)


def _run_clock(recs: list[dict]) -> list[dict]:
  """Records with `time/elapsed_s` as the run's clock: a run resumed by an older loop restarted its clock at the
  resume, so from the first record whose clock goes back, the last kept record's time is added."""
  out, offset, last = [], 0.0, 0.0
  for r in recs:
    if "time/elapsed_s" in r:
      t = r["time/elapsed_s"] + offset
      if t < last:  # a restart: this clock began again at 0
        offset, t = last, r["time/elapsed_s"] + last
      last = t
      r = {**r, "time/elapsed_s": t}
    out.append(r)
  return out


def read_run(arm: str, seed: int, out: Path) -> Run:
  recs = _run_clock(read_metrics(out / "metrics.jsonl"))
  ev = [r for r in recs if r["phase"] == "eval"]
  rl = [r for r in recs if r["phase"] == "rl"]
  mean = lambda k: float(np.mean([r[k] for r in rl if r.get(k) is not None])) if rl else float("nan")  # noqa: E731
  yx = [r["correction/acrl_y"] / r["correction/acrl_x"] for r in rl if r.get("correction/acrl_x")]
  return Run(
    arm=arm,
    seed=seed,
    before=ev[0],
    after=ev[-1],
    correct_before=_correct(out / "eval_before.jsonl"),
    correct_after=_correct(out / "eval_after.jsonl"),
    curve=[
      (r["step"], r["time/elapsed_s"], r["eval_accuracy"], r["eval_accuracy_lo"], r["eval_accuracy_hi"]) for r in ev
    ],
    mismatch=mean("mismatch/prob_abs_diff_mean"),
    acrl_yx=yx,
    reward=[r["reward_mean"] for r in rl],
    step_s={k: mean(f"time/{k}_s") for k in ("generate", "reward", "learner", "sync")},
    wall_s=ev[-1]["time/elapsed_s"],
  )


# --------------------------------------------------------------------------- statistics


def paired_bootstrap(a: dict[int, np.ndarray], b: dict[int, np.ndarray], stat=None, *, seed: int = 0):
  """95% interval of mean(a) − mean(b) (or `stat(mean_a, mean_b)`): seeds resampled, then problems within a seed
  (the same indices for a and b: paired). a, b: seed -> per-problem 0/1 (or per-run values of length 1)."""
  seeds = sorted(set(a) & set(b))
  rng = np.random.default_rng(seed)
  stat = stat or (lambda x, y: x - y)
  out = np.empty(BOOT)
  for i in range(BOOT):
    ss = rng.choice(seeds, len(seeds))
    xa, xb = [], []
    for s in ss:
      idx = rng.integers(0, len(a[s]), len(a[s]))
      xa.append(a[s][idx].mean())
      xb.append(b[s][idx].mean())
    out[i] = stat(np.mean(xa), np.mean(xb))
  point = stat(np.mean([a[s].mean() for s in seeds]), np.mean([b[s].mean() for s in seeds]))
  return float(point), float(np.percentile(out, 2.5)), float(np.percentile(out, 97.5))


def verdict(lo: float, hi: float, threshold: float, *, at_least: bool = True) -> str:
  """'holds' if the interval clears the threshold on the claim's side, 'does not hold' if it lies wholly on the
  other, else 'inconclusive at 95%'."""
  if at_least:
    return "holds" if lo >= threshold else "does not hold" if hi < threshold else "inconclusive at 95%"
  return "holds" if hi <= threshold else "does not hold" if lo > threshold else "inconclusive at 95%"


# --------------------------------------------------------------------------- report


def _pct(x) -> str:
  return "n/a" if x is None or not np.isfinite(x) else f"{100 * x:.1f}"


def _ci(ev: dict, pre: str = "eval_") -> str:
  if f"{pre}accuracy" not in ev:
    return "n/a"
  return f"{_pct(ev[f'{pre}accuracy'])} [{_pct(ev[f'{pre}accuracy_lo'])}, {_pct(ev[f'{pre}accuracy_hi'])}]"


def plot_curves(runs: list[Run], path_step: Path, path_wall: Path) -> None:
  import matplotlib  # noqa: PLC0415  (optional; the Agg backend before pyplot)

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415

  arms = [a for a in ARMS if any(r.arm == a for r in runs)]
  for path, col, xlabel in ((path_step, 0, "RL step"), (path_wall, 1, "wall time (min, 2 CPU cores)")):
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for arm in arms:
      rs = [r for r in runs if r.arm == arm]
      n = min(len(r.curve) for r in rs)
      x = np.mean([[c[col] for c in r.curve[:n]] for r in rs], axis=0) / (60.0 if col else 1.0)
      y = np.asarray([[c[2] for c in r.curve[:n]] for r in rs]) * 100
      m = y.mean(0)
      ax.plot(x, m, marker="o", ms=3, label=f"{arm} ({len(rs)} seeds)")
      if len(rs) > 1:
        ax.fill_between(x, y.min(0), y.max(0), alpha=0.15)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("held-out 2-digit accuracy, greedy (%)")
    ax.set_title("SmolLM2-135M-Instruct, GRPO: mean over seeds, band = min-max")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def render(runs: list[Run], rec: dict | None, args, wall_total: float) -> str:
  by = {a: {r.seed: r for r in runs if r.arm == a} for a in ARMS}
  by = {a: v for a, v in by.items() if v}
  L = [
    "# SmolLM2-135M-Instruct: RL under low-precision rollouts",
    "",
    f"Produced by `python scripts/smollm2_results.py {' '.join(sys.argv[1:])}` on "
    f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC ({platform.machine()} CPU, 2 cores; "
    f"{wall_total / 3600:.1f} h of runs in all). Every number below comes from the run directories it wrote.",
    "",
    "Task: 2-digit additions in SmolLM2's chat template (`What is a+b=? Answer with the number only.`), reward 1 "
    "iff the last number of the reply is the sum. Evaluation: a fixed set of "
    f"{runs[0].after['eval_n']} held-out 2-digit sums that no training prompt contains (`task.holdout`), greedy, "
    "on the sampler's served weights; transfer sets of 1-digit and 3-digit sums before and after. Intervals: 95% "
    "Wilson for one run's accuracy; paired hierarchical bootstrap (seeds, then problems) for comparisons "
    "(script docstring).",
    "",
  ]
  if rec is not None:
    c = rec["curve"]
    L += [
      "## INT4 QAT recovery (before RL, once)",
      "",
      f"Served INT4 g64 accuracy vs recovery step (distillation of the float model into its QAT copy on its own "
      f"samples, {rec['steps']} steps, {rec['wall_s'] / 60:.1f} min, {rec['step_s']:.1f} s per step):",
      "",
      "| recovery step | " + " | ".join(str(s) for s, _ in c) + " |",
      "|---|" + "---|" * len(c),
      "| served INT4 accuracy (%) | " + " | ".join(_pct(a) for _, a in c) + " |",
      "",
      f"Start of RL: INT4 served {_ci(rec['after'])} vs bf16 {_ci(next(iter(by['bf16'].values())).before)}"
      if "bf16" in by
      else f"Start of RL: INT4 served {_ci(rec['after'])}",
      "",
    ]
  L += [
    "## Arms",
    "",
    "| arm | seeds | accuracy before (%) | after (%) | gain, points [95%] | 1-digit before → after | "
    "3-digit before → after | mean abs(π − μ) | s / RL step (gen / learner) | wall (min) |",
    "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for arm, rs in by.items():
    seeds = sorted(rs)
    gain = paired_bootstrap({s: rs[s].correct_after for s in seeds}, {s: rs[s].correct_before for s in seeds})
    mb = lambda k, pre="eval_": np.mean([rs[s].__dict__[k][f"{pre}accuracy"] for s in seeds])  # noqa: E731
    step = {k: np.mean([rs[s].step_s[k] for s in seeds]) for k in ("generate", "learner")}
    per_seed = ", ".join(_pct(rs[s].after["eval_accuracy"]) for s in seeds)
    L.append(
      f"| {ARMS[arm][1]} | {len(seeds)} | {_pct(mb('before'))} | {_pct(mb('after'))} (seeds: {per_seed}) | "
      f"{100 * gain[0]:+.1f} [{100 * gain[1]:+.1f}, {100 * gain[2]:+.1f}] | "
      f"{_pct(mb('before', 'eval_d1_'))} → {_pct(mb('after', 'eval_d1_'))} | "
      f"{_pct(mb('before', 'eval_d3_'))} → {_pct(mb('after', 'eval_d3_'))} | "
      f"{np.mean([rs[s].mismatch for s in seeds]):.2e} | {step['generate']:.1f} / {step['learner']:.1f} | "
      f"{np.mean([rs[s].wall_s for s in seeds]) / 60:.1f} |"
    )
  L += ["", "Per run (accuracy with its 95% Wilson interval over the eval problems):", ""]
  L += ["| arm | seed | before (%) | after (%) | train reward first 5 → last 5 | ACRL Y/X (min / mean / max) |"]
  L += ["|---|---|---|---|---|---|"]
  for arm, rs in by.items():
    for s, r in sorted(rs.items()):
      yx = f"{min(r.acrl_yx):.2f} / {np.mean(r.acrl_yx):.2f} / {max(r.acrl_yx):.2f}" if r.acrl_yx else ""
      L.append(
        f"| {arm} | {s} | {_ci(r.before)} | {_ci(r.after)} | {np.mean(r.reward[:5]):.2f} → "
        f"{np.mean(r.reward[-5:]):.2f} | {yx} |"
      )
  L += ["", "## Claims", "", "| claim | measured | verdict |", "|---|---|---|"]
  L += claims(by, rec)
  L += [
    "",
    "Curves: `docs/figures/smollm2_accuracy_vs_step.png`, `docs/figures/smollm2_accuracy_vs_wall.png` (mean over "
    "seeds, band = min-max).",
    "",
  ]
  return "\n".join(L) + "\n"


def claims(by: dict, rec: dict | None) -> list[str]:
  out = []
  acc = lambda arm: {s: r.correct_after for s, r in by[arm].items()}  # noqa: E731
  if "bf16" in by:
    rs = by["bf16"]
    p, lo, hi = paired_bootstrap(acc("bf16"), {s: r.correct_before for s, r in rs.items()})
    minutes = max(r.wall_s for r in rs.values()) / 60
    out.append(
      f"| bf16: held-out accuracy up by >= 25 points within 45 min of one run | {100 * p:+.1f} points "
      f"[{100 * lo:+.1f}, {100 * hi:+.1f}] in {minutes:.0f} min (longest seed) | "
      f"{verdict(lo, hi, 0.25) if minutes <= 45 else 'does not hold (over 45 min)'} |"
    )
  if rec is not None and "bf16" in by:
    b0 = np.mean([r.correct_before.mean() for r in by["bf16"].values()])
    a0 = rec["after"]["eval_accuracy"]
    out.append(
      f"| INT4 recovery: served INT4 at the start of RL within 2 points of bf16 | INT4 {_pct(a0)} vs bf16 "
      f"{_pct(b0)} ({100 * (a0 - b0):+.1f} points; one recovery, one eval set: the interval of each is about ±5) | "
      f"{'holds' if a0 >= b0 - 0.02 else 'does not hold'} (point estimate) |"
    )
  for arm, margin, label in (
    ("int4_qat", 0.02, "INT4 QAT: final accuracy within 2 points of bf16"),
    ("fp8_acrl", 0.01, "FP8 + ACRL: final accuracy >= bf16 − 1 point"),
  ):
    if arm in by and "bf16" in by:
      p, lo, hi = paired_bootstrap(acc(arm), acc("bf16"))
      out.append(f"| {label} | {100 * p:+.1f} points [{100 * lo:+.1f}, {100 * hi:+.1f}] | {verdict(lo, hi, -margin)} |")
  if "int4_qat" in by and "int4_no_qat" in by:
    m = lambda arm: {s: np.asarray([r.mismatch]) for s, r in by[arm].items()}  # noqa: E731
    p, lo, hi = paired_bootstrap(m("int4_no_qat"), m("int4_qat"), lambda x, y: x / y)
    bf = f", bf16 arm {np.mean([r.mismatch for r in by['bf16'].values()]):.2e}" if "bf16" in by else ""
    out.append(
      f"| INT4 QAT: mismatch abs(π − μ) >= 5x below INT4 without QAT | ratio {p:.1f} [{lo:.1f}, {hi:.1f}] (QAT "
      f"{np.mean([r.mismatch for r in by['int4_qat'].values()]):.2e}{bf}) | {verdict(lo, hi, 5.0)} |"
    )
  if "fp8_acrl" in by:
    yx = np.concatenate([r.acrl_yx for r in by["fp8_acrl"].values()])
    inside = float(np.mean((yx >= 0.8) & (yx <= 1.25)))
    out.append(
      f"| FP8 + ACRL: Y/X held in [0.8, 1.25] | {100 * inside:.0f}% of RL steps inside (range "
      f"{yx.min():.2f}-{yx.max():.2f}) | {'holds' if inside >= 0.95 else 'does not hold'} (>= 95% of steps) |"
    )
    if "fp8_tis" in by:
      p, lo, hi = paired_bootstrap(acc("fp8_acrl"), acc("fp8_tis"))
      out.append(
        f"| FP8 + ACRL: no worse than TIS (margin 1 point) | {100 * p:+.1f} points [{100 * lo:+.1f}, "
        f"{100 * hi:+.1f}] | {verdict(lo, hi, -0.01)} |"
      )
  if "nvfp4_lora" in by and "bf16" in by:
    p, lo, hi = paired_bootstrap(acc("nvfp4_lora"), acc("bf16"), lambda x, y: x / max(y, 1e-9))
    out.append(
      f"| NVFP4 + LoRA: >= 98% of bf16's final accuracy | {100 * p:.0f}% [{100 * lo:.0f}, {100 * hi:.0f}] | "
      f"{verdict(lo, hi, 0.98)} |"
    )
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
  ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
  ap.add_argument("--steps", type=int, default=30, help="RL steps per run")
  ap.add_argument("--eval-every", type=int, default=5)
  ap.add_argument("--recover-steps", type=int, default=None, help="default: the int4_qat config's run.recover_steps")
  ap.add_argument("--recover-eval-every", type=int, default=10)
  ap.add_argument("--root", default="runs/smollm2_results")
  ap.add_argument("--out", default="docs/smollm2_results.md")
  ap.add_argument("--figures", default="docs/figures")
  ap.add_argument("--reuse", action="store_true", help="keep finished runs with the same overrides")
  ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="extra overrides of every run (smoke runs)")
  args = ap.parse_args(argv)
  root = Path(args.root)
  rec = None
  recovered = None
  if "int4_qat" in args.arms:
    recovered = recovery_stage(root, args.recover_steps, args.recover_eval_every, args.reuse, args.set)
    recs = read_metrics(root / "recover" / "metrics.jsonl")
    kl = [r for r in recs if r["phase"] == "recover" and "distill_kl" in r]
    curve = [(r["step"], r["eval_accuracy"]) for r in recs if r["phase"] == "recover" and "eval_accuracy" in r]
    after = [r for r in recs if r["phase"] == "eval"][-1]
    curve.append((len(kl), after["eval_accuracy"]))
    rec = {
      "curve": curve,
      "after": after,
      "steps": len(kl),
      "step_s": float(np.mean([r["time/step_s"] for r in kl])) if kl else float("nan"),
      "wall_s": max(
        (r["time/elapsed_s"] for r in _run_clock(recs) if "time/elapsed_s" in r),
        default=sum(r["time/step_s"] for r in kl),
      ),
    }
    print(f"recovery: {curve}", flush=True)
  runs = []
  for seed in args.seeds:  # every arm at a seed before the next seed: an interrupted campaign stays comparable
    for arm in args.arms:
      ts = time.perf_counter()
      out = root / arm / f"seed{seed}"
      _run(ARMS[arm][0], arm_overrides(arm, seed, args.steps, args.eval_every, recovered) + args.set, out, args.reuse)
      r = read_run(arm, seed, out)
      runs.append(r)
      print(
        f"{arm:12s} seed {seed}: {_ci(r.before)} -> {_ci(r.after)}, |π−μ| {r.mismatch:.2e}, "
        f"{(time.perf_counter() - ts) / 60:.1f} min",
        flush=True,
      )
  figs = Path(args.figures)
  figs.mkdir(parents=True, exist_ok=True)
  plot_curves(runs, figs / "smollm2_accuracy_vs_step.png", figs / "smollm2_accuracy_vs_wall.png")
  # the campaign's compute: every run's own clock (a --reuse report reads it from the runs, not from this call)
  text = render(runs, rec, args, (rec["wall_s"] if rec else 0.0) + sum(r.wall_s for r in runs))
  Path(args.out).write_text(text, encoding="utf-8")
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
