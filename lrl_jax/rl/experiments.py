"""The experiment arms on the embedded task, and `docs/results.md`: every claim with a 95% interval over seeds.

Every arm is one of the committed configs (plus, for the ACRL γ sweep, one override); all arms run the same seeds
with the configs' own warm-up and RL settings, each in `<root>/<arm>/seed<s>`. Arms whose warm-ups compute the same
thing (the float-learner arms; see `rl.warmup.warmup_key`) share it through `run.warmup_cache` = `<root>/warmups`.
Per run: final greedy eval accuracy (served weights), the RL gain, reward-curve smoothness (std of the step-to-step
change of the mean train reward), mean |π − μ|, mean KL(μ‖π) (k3), for ACRL its reference X, mean Y, mean |α| and
how far ρ = r^α departs from 1, and the per-step curves. The report gives each arm's mean with a 95% bootstrap
interval over seeds, compares every arm with the bf16 baseline paired by seed (`rl.stats.paired`), and states each
published claim as "holds", "does not hold" or "inconclusive at 95%" (`rl.stats.verdict`).

  python scripts/results.py --reuse                          # the full campaign (10 seeds, every arm)
  python scripts/results.py --seeds 1 --steps 2 --sft-steps 5 --out /tmp/results.md   # a smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import sys
import time
from pathlib import Path

import jax
import numpy as np

from lrl_jax.config import load_config
from lrl_jax.rl import stats
from lrl_jax.rl.loop import train
from lrl_jax.rl.metrics import smoothness

__all__ = ["ARMS", "GROUPS", "RunSummary", "run_arm", "run_experiments", "render", "plot_bands", "main"]

# arm name -> (config file, label, extra overrides of the arm)
ARMS: dict[str, tuple[str, str, tuple[str, ...]]] = {
  "bf16": ("configs/bf16_baseline.yaml", "bf16 rollouts (baseline)", ()),
  "int4_no_qat": ("configs/int4_rollout_no_qat.yaml", "INT4 rollouts, no QAT", ()),
  "int4_qat": ("configs/int4_qat_grpo.yaml", "INT4 rollouts + INT4 QAT", ()),
  "fp8_none": ("configs/fp8_rollout_none.yaml", "FP8 W8A8 rollouts, no correction", ()),
  "fp8_tis": ("configs/fp8_rollout_tis.yaml", "FP8 W8A8 rollouts + TIS", ()),
  "fp8_mis": ("configs/fp8_rollout_mis.yaml", "FP8 W8A8 rollouts + MIS", ()),
  "fp8_acrl": ("configs/fp8_rollout_acrl.yaml", "FP8 W8A8 rollouts + ACRL", ()),
  "nvfp4_lora": ("configs/nvfp4_lora.yaml", "NVFP4 base + LoRA", ()),
  "ppo": ("configs/ppo_baseline.yaml", "PPO (critic, GAE; critic lr 1e-3, zero init)", ()),
  "ppo_qae": ("configs/ppo_qae.yaml", "PPO + QAE", ()),
  "ppo_nowhiten": ("configs/ppo_baseline.yaml", "PPO, advantages not whitened", ("learner.value.whiten=false",)),
  "ppo_vclip": ("configs/ppo_baseline.yaml", "PPO, value clipping ε 0.5", ("learner.value.clip=0.5",)),
  # the critic before the fix (it shared the policy's optimizer and lr and started at V ~ N(0, 1)), and each half of
  # the fix alone
  "ppo_v0": (
    "configs/ppo_baseline.yaml",
    "PPO, critic as before (policy's lr, N(0, 1/D) init)",
    ("learner.value.lr=null", "learner.value.init_std=null"),
  ),
  "ppo_v0_zero_init": (
    "configs/ppo_baseline.yaml",
    "PPO, critic at the policy's lr, zero init",
    ("learner.value.lr=null",),
  ),
  "ppo_v0_critic_lr": (
    "configs/ppo_baseline.yaml",
    "PPO, critic with its own lr 1e-3, N(0, 1/D) init",
    ("learner.value.init_std=null",),
  ),
  "w4a8_none": ("configs/int4_w4a8_rollout_none.yaml", "stress: INT4 g64 W4A8 rollouts, no correction", ()),
  "w4a8_tis": ("configs/int4_w4a8_rollout_tis.yaml", "stress: INT4 g64 W4A8 rollouts + TIS", ()),
  "w4a8_mis": ("configs/int4_w4a8_rollout_mis.yaml", "stress: INT4 g64 W4A8 rollouts + MIS", ()),
  "w4a8_acrl": ("configs/int4_w4a8_rollout_acrl.yaml", "stress: INT4 g64 W4A8 rollouts + ACRL γ 0.65", ()),
  **{
    f"w4a8_acrl_g{g}": (
      "configs/int4_w4a8_rollout_acrl.yaml",
      f"stress: INT4 g64 W4A8 rollouts + ACRL γ {g}",
      (f"learner.correction.gamma={g}",),
    )
    for g in ("0.1", "1.3", "2.1")
  },
}
# the report's sections and figures: title -> arms
GROUPS: dict[str, list[str]] = {
  "formats": ["bf16", "int4_no_qat", "int4_qat", "fp8_none", "nvfp4_lora"],
  "fp8 corrections": ["fp8_none", "fp8_tis", "fp8_mis", "fp8_acrl"],
  "stress corrections": ["w4a8_none", "w4a8_tis", "w4a8_mis", "w4a8_acrl"],
  "acrl gamma": ["w4a8_acrl_g0.1", "w4a8_acrl", "w4a8_acrl_g1.3", "w4a8_acrl_g2.1"],
  "ppo": ["int4_qat", "ppo", "ppo_nowhiten", "ppo_vclip", "ppo_qae"],
  "ppo critic": ["ppo_v0", "ppo_v0_zero_init", "ppo_v0_critic_lr", "ppo"],
}
# a warm-up that ends below this accuracy is counted as stalled (the plateau was at 14-20%)
STALL = 0.25
# the critic's fit is reported over the last this many RL steps
CRITIC_TAIL = 20


@dataclasses.dataclass
class RunSummary:
  arm: str
  seed: int
  accuracy_before: float
  accuracy_after: float
  smoothness: float
  mismatch_mean: float
  kl_k3_mean: float
  acrl_x: float
  acrl_y_mean: float
  reward_first: float
  reward_last: float
  wall_s: float
  acrl_alpha_mean: float = math.nan  # mean over steps of the token-mean |α|
  acrl_rho_dev_mean: float = math.nan  # mean over steps of the token-mean |ρ − 1|
  value_mse_last: float = math.nan  # the critic's MSE (value/vf_mse) over the last CRITIC_TAIL RL steps
  reward_var_last: float = math.nan  # mean r̄(1 − r̄) over the same steps: a constant predictor's MSE on 0/1 rewards
  acrl_rho_dev_max: float = math.nan  # max over steps of max |ρ − 1|
  curves: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # per RL step: reward, mismatch, acrl_y


def _mean(recs, key):
  v = [r[key] for r in recs if r.get(key) is not None]
  return float(np.mean(v)) if v else float("nan")


def _curve(recs, key):
  return [float(r[key]) if r.get(key) is not None else math.nan for r in recs]


def run_arm(
  arm: str,
  seed: int,
  *,
  root: Path,
  steps: int | None = None,
  sft_steps: int | None = None,
  eval_every: int = 0,
  extra: list[str] = (),
  reuse: bool = False,
  warmup_cache: bool = True,
) -> RunSummary:
  """Trains one arm with one seed; returns its summary (metrics also in `<root>/<arm>/seed<seed>`).

  steps / sft_steps: None = the config's. reuse: return the saved summary of an earlier run with the same steps
  and overrides instead of training. warmup_cache: share warm-ups under `<root>/warmups` (`run.warmup_cache`).
  """
  path, _, arm_extra = ARMS[arm]
  out = root / arm / f"seed{seed}"
  done = out / "run_summary.json"
  extra = [*arm_extra, *extra]
  key = {"steps": steps, "sft_steps": sft_steps, "extra": list(extra)}
  if reuse and done.is_file():
    saved = json.loads(done.read_text())
    if saved.pop("key", None) == key:
      return RunSummary(**saved)
  overrides = [f"run.seed={seed}", f"run.eval_every={eval_every}", f"run.out_dir={out}"]
  overrides += [f"run.steps={steps}"] if steps is not None else []
  overrides += [f"run.sft_steps={sft_steps}"] if sft_steps is not None else []
  overrides += [f"run.warmup_cache={root / 'warmups'}"] if warmup_cache else []
  cfg = load_config(path, [*overrides, *extra])
  r = train(cfg, overwrite=True, progress=False, export=False)
  rl = list(r.records)
  rewards = [x["reward_mean"] for x in rl]
  dev_max = [x["correction/rho_dev_max"] for x in rl if x.get("correction/rho_dev_max") is not None]
  s = RunSummary(
    arm=arm,
    seed=seed,
    accuracy_before=r.accuracy_before,
    accuracy_after=r.accuracy_after,
    smoothness=smoothness(rewards),
    mismatch_mean=r.mismatch_mean,
    kl_k3_mean=_mean(rl, "mismatch/kl_k3"),
    acrl_x=rl[-1].get("correction/acrl_x", float("nan")) if rl else float("nan"),
    acrl_y_mean=_mean(rl, "correction/acrl_y"),
    reward_first=r.reward_first,
    reward_last=r.reward_last,
    wall_s=r.wall_s,
    acrl_alpha_mean=_mean(rl, "correction/alpha_abs_mean"),
    acrl_rho_dev_mean=_mean(rl, "correction/rho_dev_mean"),
    acrl_rho_dev_max=float(max(dev_max)) if dev_max else float("nan"),
    value_mse_last=_mean(rl[-CRITIC_TAIL:], "value/vf_mse"),
    reward_var_last=float(np.mean([x * (1 - x) for x in rewards[-CRITIC_TAIL:]])) if rewards else math.nan,
    curves={
      "reward": rewards,
      "mismatch": _curve(rl, "mismatch/prob_abs_diff_mean"),
      "acrl_y": _curve(rl, "correction/acrl_y"),
    },
  )
  done.write_text(json.dumps({**dataclasses.asdict(s), "key": key}))
  return s


def run_experiments(
  arms,
  seeds,
  *,
  root: Path,
  steps: int | None = None,
  sft_steps: int | None = None,
  eval_every: int = 0,
  extra: list[str] = (),
  reuse: bool = False,
  log=print,
) -> list[RunSummary]:
  """Every arm for every seed, seed by seed (an interrupted campaign has all arms on its first seeds)."""
  out = []
  for seed in seeds:
    for arm in arms:
      t0 = time.perf_counter()
      s = run_arm(
        arm, seed, root=root, steps=steps, sft_steps=sft_steps, eval_every=eval_every, extra=extra, reuse=reuse
      )
      log(
        f"{arm:16s} seed {seed}: accuracy {s.accuracy_before:.3f} -> {s.accuracy_after:.3f}, "
        f"|π−μ| {s.mismatch_mean:.3g}, smoothness {s.smoothness:.3g} ({time.perf_counter() - t0:.0f} s)"
      )
      out.append(s)
  return out


# --------------------------------------------------------------------------- report


def _by_seed(runs, arm, fn) -> dict[int, float]:
  return {r.seed: float(fn(r)) for r in runs if r.arm == arm}


def _iv(runs, arm, fn) -> stats.Interval:
  return stats.mean_interval(list(_by_seed(runs, arm, fn).values()))


_AFTER = lambda r: r.accuracy_after  # noqa: E731
_GAIN = lambda r: r.accuracy_after - r.accuracy_before  # noqa: E731


def _log_mismatch_ratio(runs, a, b) -> stats.Paired:
  """log10 of arm a's mean |π − μ| over arm b's, paired by seed (the ratio's log: ratios multiply, logs add)."""
  log_mismatch = lambda r: math.log10(max(r.mismatch_mean, 1e-30))  # noqa: E731
  return stats.paired(_by_seed(runs, a, log_mismatch), _by_seed(runs, b, log_mismatch))


def _paired_text(p: stats.Paired, scale=100.0, unit=" points") -> str:
  return (
    f"{p.diff.fmt(scale, sign=True)}{unit} (paired over {p.diff.n} seeds: {p.wins} higher, {p.losses} lower, "
    f"{p.ties} equal; sign test p = {p.p_sign:.3g})"
  )


def _beats(runs, arm, base) -> str:
  """'<paired text> — <verdict>' of the claim "arm's final accuracy > base's" (paired by seed, strict)."""
  p = stats.paired(_by_seed(runs, arm, _AFTER), _by_seed(runs, base, _AFTER))
  return f"{_paired_text(p)} — {stats.verdict(p.diff.lo, p.diff.hi, 0.0, strict=True)}"


def _claims(runs, arms) -> list[str]:
  has = lambda *a: all(x in arms for x in a)  # noqa: E731
  out = []
  if has("bf16", "int4_qat"):
    p = stats.paired(_by_seed(runs, "int4_qat", _AFTER), _by_seed(runs, "bf16", _AFTER))
    v = stats.within(p.diff.lo, p.diff.hi, -0.01, 0.01)
    out.append(
      f"- **INT4 QAT final accuracy within 1 point of bf16**: {_paired_text(p)} — {v} (the interval must lie "
      "inside ±1 point)."
    )
    ratio = _log_mismatch_ratio(runs, "int4_qat", "bf16")
    out.append(
      f"- **INT4 QAT mismatch near bf16's** (at most 2x): log10 of the per-seed ratio {ratio.diff.fmt(1, '.2f')} "
      f"— {stats.verdict(ratio.diff.lo, ratio.diff.hi, math.log10(2), at_least=False)} (QAT + f32 rollouts share "
      "their weights exactly; bf16 rollouts differ from the f32 learner by bf16 rounding)."
    )
  if has("int4_qat", "int4_no_qat"):
    ratio = _log_mismatch_ratio(runs, "int4_no_qat", "int4_qat")
    out.append(
      f"- **INT4 rollouts without QAT have several times the mismatch of INT4 QAT** (at least 2x): log10 of the "
      f"per-seed ratio {ratio.diff.fmt(1, '.2f')} — {stats.verdict(ratio.diff.lo, ratio.diff.hi, math.log10(2))}."
    )
  for arm in ("fp8_acrl", "w4a8_acrl"):
    if has(arm):
      yx = _iv(runs, arm, lambda r: r.acrl_y_mean / r.acrl_x if r.acrl_x else math.nan)
      near = stats.within(yx.lo, yx.hi, 0.9, 1.1)
      out.append(
        f"- **ACRL holds Y near X** ({ARMS[arm][1]}; |Y/X − 1| <= 0.1): mean Y/X over the run {yx.fmt(1, '.2f')} — "
        f"{near}. |α| {_iv(runs, arm, lambda r: r.acrl_alpha_mean).fmt(1, '.3f')}, mean |ρ − 1| "
        f"{_iv(runs, arm, lambda r: r.acrl_rho_dev_mean).fmt(1, '.2e')}, largest |ρ − 1| "
        f"{_iv(runs, arm, lambda r: r.acrl_rho_dev_max).fmt(1, '.3f')} (means over seeds)."
      )
  if has("bf16", "nvfp4_lora"):
    rel = stats.mean_interval(
      [
        r.accuracy_after / b
        for r in runs
        if r.arm == "nvfp4_lora" and (b := _by_seed(runs, "bf16", _AFTER).get(r.seed)) and b > 0
      ]
    )
    out.append(
      f"- **NVFP4 + LoRA reaches >= 98% of bf16's final accuracy**: per-seed ratio {rel.fmt(100, '.1f')}% — "
      f"{stats.verdict(rel.lo, rel.hi, 0.98)}."
    )
  for none, arms_c in (
    ("fp8_none", ("fp8_tis", "fp8_mis", "fp8_acrl")),
    ("w4a8_none", ("w4a8_tis", "w4a8_mis", "w4a8_acrl")),
  ):
    for arm in arms_c:
      if has(none, arm):
        out.append(
          f"- {ARMS[arm][1]} vs no correction, final accuracy: {_beats(runs, arm, none)} (claim: the correction helps)."
        )
  if has("w4a8_acrl", "w4a8_tis", "w4a8_mis"):
    for other in ("w4a8_tis", "w4a8_mis"):
      out.append(
        f"- ACRL vs {other.split('_')[1].upper()} under the stress format, final accuracy: "
        f"{_beats(runs, 'w4a8_acrl', other)} (claim: ACRL beats it)."
      )
  for arm in ("ppo", "ppo_nowhiten", "ppo_v0"):
    if has(arm):
      g = _iv(runs, arm, _GAIN)
      out.append(
        f"- **{ARMS[arm][1]} ends at or above its own starting accuracy**: RL gain {g.fmt(100, '.1f', sign=True)} "
        f"points — {stats.verdict(g.lo, g.hi, 0.0)}."
      )
  for arm in ("ppo", "ppo_v0"):
    if has(arm, "int4_qat"):
      p = stats.paired(_by_seed(runs, arm, _AFTER), _by_seed(runs, "int4_qat", _AFTER))
      out.append(
        f"- **{ARMS[arm][1]} within 3 points of GRPO** (both INT4 QAT, same warm-up), final accuracy: "
        f"{_paired_text(p)} — {stats.within(p.diff.lo, p.diff.hi, -0.03, 0.03)} (the interval must lie inside ±3)."
      )
  for arm in ("ppo", "ppo_v0_zero_init", "ppo_v0_critic_lr"):
    if has(arm, "ppo_v0"):
      out.append(
        f"- {ARMS[arm][1]} vs the critic as before, final accuracy: {_beats(runs, arm, 'ppo_v0')} (claim: helps)."
      )
  if has("ppo", "ppo_nowhiten"):
    p = stats.paired(_by_seed(runs, "ppo_nowhiten", _AFTER), _by_seed(runs, "ppo", _AFTER))
    out.append(f"- PPO without advantage whitening vs with, final accuracy: {_paired_text(p)}.")
  if has("ppo", "ppo_vclip"):
    out.append(
      f"- PPO with value clipping (ε 0.5) vs without, final accuracy: {_beats(runs, 'ppo_vclip', 'ppo')} "
      "(claim: helps)."
    )
  if has("ppo", "ppo_qae"):
    out.append(f"- PPO + QAE vs PPO, final accuracy: {_beats(runs, 'ppo_qae', 'ppo')} (claim: QAE helps).")
  stalled = []
  for a in arms:
    before = [r.accuracy_before for r in runs if r.arm == a]
    stalled.append(f"{ARMS[a][1]} {sum(1 for b in before if b < STALL)}/{len(before)}")
  out.append(f"- Warm-ups that ended below {100 * STALL:.0f}% (the old plateau): " + ", ".join(stalled) + ".")
  return out


def render(
  runs: list[RunSummary],
  *,
  command: str,
  seeds,
  date: str,
  setting: str,
  figures: list[str] = (),
) -> str:
  """The Markdown of docs/results.md."""
  arms = list(dict.fromkeys(r.arm for r in runs))
  n_seeds = {a: sum(1 for r in runs if r.arm == a) for a in arms}
  lines = ["# Results: low-precision RL on the embedded arithmetic task", ""]
  if min(n_seeds.values(), default=0) < 10:
    lines += [
      f"> **Reduced run** ({min(n_seeds.values(), default=0)} seed(s) in some arms): fewer than the 10 seeds the "
      "claims below are meant to rest on.",
      "",
    ]
  lines += [
    f"Produced by `{command}` on {date} (CPU). {setting}. Seeds {', '.join(map(str, seeds))}, the same in every "
    "arm. Accuracy: greedy, on a fixed set of held-out problems, generated by the sampler on its served (low-bit) "
    "weights. Smoothness: std of the step-to-step change of the mean train reward (lower = smoother). |π−μ|: "
    "token-mean absolute difference of the learner's and the sampler's probabilities of the sampled tokens, "
    "averaged over steps. Each cell: mean over seeds [95% percentile-bootstrap interval over seeds]. The warm-up "
    "runs in each arm's own learner numerics (QAT or not), so the accuracy at the start of RL differs between "
    "arms; the paired column compares each arm's final accuracy with the bf16 arm's on the same seed.",
    "",
    "| arm | seeds | accuracy before RL (%) | final accuracy (%) | RL gain (points) | vs bf16, paired (points) | "
    "smoothness | mean abs(π−μ) |",
    "|---|---|---|---|---|---|---|---|",
  ]
  base = _by_seed(runs, "bf16", _AFTER)
  for arm in arms:
    paired = "—"
    if arm != "bf16" and base:
      p = stats.paired(_by_seed(runs, arm, _AFTER), base)
      paired = f"{p.diff.fmt(100, sign=True)} ({p.wins}/{p.losses})"
    lines.append(
      f"| {ARMS[arm][1]} | {n_seeds[arm]} | {_iv(runs, arm, lambda r: r.accuracy_before).fmt(100)} | "
      f"{_iv(runs, arm, _AFTER).fmt(100)} | {_iv(runs, arm, _GAIN).fmt(100, sign=True)} | {paired} | "
      f"{_iv(runs, arm, lambda r: r.smoothness).fmt(1, '.3f')} | "
      f"{_iv(runs, arm, lambda r: r.mismatch_mean).fmt(1, '.2e')} |"
    )
  lines += ["", "(vs bf16: mean paired difference [95% interval], then seeds higher / lower than bf16.)", ""]
  acrl_arms = [a for a in arms if "acrl" in a]
  if acrl_arms:
    lines += [
      "## ACRL: what the controller did",
      "",
      "Y: the batch's mean |π − μ| per sequence; X: its reference (the first batch's); α = γ·sign(A)·(1 − Y/X); "
      "ρ = (π/μ)^α before the clip. Means over seeds [95% interval] of each run's mean over steps (largest |ρ − 1|: "
      "each run's maximum over steps and tokens).",
      "",
      "| arm | final accuracy (%) | Y/X | mean abs(α) | mean abs(ρ − 1) | largest abs(ρ − 1) |",
      "|---|---|---|---|---|---|",
    ]
    for a in acrl_arms:
      lines.append(
        f"| {ARMS[a][1]} | {_iv(runs, a, _AFTER).fmt(100)} | "
        f"{_iv(runs, a, lambda r: r.acrl_y_mean / r.acrl_x if r.acrl_x else math.nan).fmt(1, '.2f')} | "
        f"{_iv(runs, a, lambda r: r.acrl_alpha_mean).fmt(1, '.3f')} | "
        f"{_iv(runs, a, lambda r: r.acrl_rho_dev_mean).fmt(1, '.2e')} | "
        f"{_iv(runs, a, lambda r: r.acrl_rho_dev_max).fmt(1, '.3f')} |"
      )
    lines.append("")
  critic_arms = [a for a in arms if any(r.arm == a and math.isfinite(r.value_mse_last) for r in runs)]
  if critic_arms:
    lines += [
      "## PPO: how well the critic fits",
      "",
      f"The critic's MSE against its GAE targets over the last {CRITIC_TAIL} RL steps, next to r̄(1 − r̄) of the "
      "same steps' mean train reward r̄: the variance of a 0/1 outcome with mean r̄, what a critic that knew only the "
      "batch's mean reward would score against the outcome (GAE's targets at λ = 0.95 are close to it). A critic well "
      "above it adds noise to the advantages instead of removing it. Means over seeds [95% interval].",
      "",
      "| arm | final accuracy (%) | critic MSE | r̄(1 − r̄) |",
      "|---|---|---|---|",
    ]
    for a in critic_arms:
      lines.append(
        f"| {ARMS[a][1]} | {_iv(runs, a, _AFTER).fmt(100)} | {_iv(runs, a, lambda r: r.value_mse_last).fmt(1, '.3f')} "
        f"| {_iv(runs, a, lambda r: r.reward_var_last).fmt(1, '.3f')} |"
      )
    lines.append("")
  lines += ["## The claims, checked against these numbers", "", *_claims(runs, arms), ""]
  if figures:
    lines += ["## Curves", "", "Mean train reward per RL step, mean over seeds with its 95% bootstrap band.", ""]
    lines += [f"![{Path(f).stem}]({f})" for f in figures] + [""]
  lines += [
    "## Per run",
    "",
    "| arm | seed | before | after | smoothness | mean abs(π−μ) | wall (s) |",
    "|---|---|---|---|---|---|---|",
  ]
  for r in sorted(runs, key=lambda r: (list(ARMS).index(r.arm), r.seed)):
    lines.append(
      f"| {r.arm} | {r.seed} | {100 * r.accuracy_before:.1f} | {100 * r.accuracy_after:.1f} | "
      f"{r.smoothness:.3f} | {r.mismatch_mean:.2e} | {r.wall_s:.0f} |"
    )
  return "\n".join(lines) + "\n"


def plot_bands(runs: list[RunSummary], out_dir: Path, *, key: str = "reward") -> list[Path]:
  """One PNG per `GROUPS` entry with arms in `runs`: the per-step curve `key`, mean over seeds with its 95%
  bootstrap band (`stats.bands`). Returns the written paths ([] without matplotlib)."""
  try:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
  except ImportError:
    return []
  out_dir.mkdir(parents=True, exist_ok=True)
  paths = []
  for title, group in GROUPS.items():
    present = [a for a in group if any(r.arm == a for r in runs)]
    if not present:
      continue
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for arm in present:
      curves = [r.curves.get(key, []) for r in runs if r.arm == arm]
      n = min(len(c) for c in curves)
      if n == 0:
        continue
      m, lo, hi = stats.bands([c[:n] for c in curves])
      x = np.arange(n)
      (line,) = ax.plot(x, m, label=f"{ARMS[arm][1]} ({len(curves)} seeds)")
      ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2)
    ax.set_xlabel("RL step")
    ax.set_ylabel(f"train {key} (mean)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(f"{title}: mean over seeds, 95% bootstrap band")
    fig.tight_layout()
    paths.append(out_dir / f"results_{title.replace(' ', '_')}.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
  return paths


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description="Run the experiment arms and write docs/results.md.")
  p.add_argument("--seeds", type=int, default=10, help="seeds 0 .. N-1 (default 10)")
  p.add_argument("--steps", type=int, default=None, help="RL steps per run (default: the configs' run.steps)")
  p.add_argument("--sft-steps", type=int, default=None, help="supervised warm-up steps (default: the configs')")
  p.add_argument("--eval-every", type=int, default=0, help="evaluations during RL (0: before and after only)")
  p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated subset of {', '.join(ARMS)}")
  p.add_argument("--root", default="runs/results", help="run directories go here")
  p.add_argument("--out", default="docs/results.md", help="the Markdown report")
  p.add_argument("--figures", default="docs/figures", help="the curves' PNGs go here ('' = none)")
  p.add_argument(
    "--reuse",
    action="store_true",
    help="reuse finished runs under --root with the same steps and overrides (resume a sweep)",
  )
  p.add_argument("overrides", nargs="*", help="extra section.key=value overrides for every arm")
  args = p.parse_args(argv)
  arms = [a.strip() for a in args.arms.split(",") if a.strip()]
  bad = [a for a in arms if a not in ARMS]
  if bad:
    p.error(f"unknown arm(s) {bad}; valid: {', '.join(ARMS)}")
  seeds = list(range(args.seeds))
  # Runs of one arm differ only in their seed: a persistent compilation cache lets every seed after the first reuse
  # the first one's executables (each run builds its jitted steps anew).
  jax.config.update("jax_compilation_cache_dir", str(Path(args.root) / "jax_cache"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  t0 = time.perf_counter()
  runs = run_experiments(
    arms,
    seeds,
    root=Path(args.root),
    steps=args.steps,
    sft_steps=args.sft_steps,
    eval_every=args.eval_every,
    extra=args.overrides,
    reuse=args.reuse,
  )
  wall = time.perf_counter() - t0
  command = "python scripts/results.py " + " ".join(argv if argv is not None else sys.argv[1:])
  date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
  c = load_config(ARMS[arms[0]][0], list(args.overrides))
  setting = (
    f"Tiny Qwen2-shaped model (D={c.model.hidden_size}, L={c.model.num_layers}), {c.task.digits}-digit addition; "
    f"{args.sft_steps if args.sft_steps is not None else c.run.sft_steps} supervised warm-up steps (batch "
    f"{c.run.sft_batch}, lr {c.run.sft_lr:g}), then {args.steps if args.steps is not None else c.run.steps} RL "
    f"steps of {c.run.batch_prompts} prompts x {c.sampler.group_size} completions (lr {c.learner.lr:g}, "
    f"{c.learner.schedule}); {c.task.eval_size} eval problems; the runs took {sum(r.wall_s for r in runs) / 60:.0f} "
    f"min of wall time in all (each run's own; a shared warm-up counts in the run that trained it), this invocation "
    f"{wall / 60:.0f} min" + (" (finished runs read back with --reuse)" if args.reuse else "")
  )
  figures = []
  if args.figures:
    out_md = Path(args.out).resolve().parent
    for f in plot_bands(runs, Path(args.figures)):
      try:
        figures.append(str(f.resolve().relative_to(out_md)))
      except ValueError:
        figures.append(str(f.resolve()))
  text = render(runs, command=command.strip(), seeds=seeds, date=date, setting=setting, figures=figures)
  Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  Path(args.out).write_text(text, encoding="utf-8")
  print(text)
  return 0
