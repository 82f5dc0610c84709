"""Run metrics: one JSON line per step (`<out_dir>/metrics.jsonl`), TensorBoard, a progress bar, plots, summary.

Every record is flat: {"step": k, "phase": "rl" | "eval" | "sft", name: float, ...}. TensorBoard
(`tensorboardX`, optional) gets the same scalars under `<phase>/<name>`; without it the run logs JSONL
only and warns once. At the end `plot_run` draws reward / accuracy and mismatch vs step (matplotlib,
Agg backend) and `write_summary` prints a short table and writes `<out_dir>/summary.md`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

__all__ = [
  "timeline_overlap",
  "MetricsLogger",
  "read_metrics",
  "plot_run",
  "summary_table",
  "write_summary",
  "write_run_summary",
  "smoothness",
  "wilson_interval",
]

log = logging.getLogger(__name__)


def _scalar(v) -> float | int | str | None:
  if isinstance(v, (str, bool)) or v is None:
    return v
  a = np.asarray(v)
  if a.size != 1:
    return None
  x = a.reshape(()).item()
  return int(x) if isinstance(x, (int, np.integer)) and not isinstance(x, bool) else float(x)


class MetricsLogger:
  """Appends metric records to `<out_dir>/metrics.jsonl` (and TensorBoard when available).

  Args:
    out_dir: the run directory.
    tensorboard: write TensorBoard event files under `<out_dir>/tb` (needs tensorboardX; warns if missing).
    resume_from_step: on a resumed run, drop records of RL steps >= this (they are recomputed) and append.
    write: False: write nothing, only return the records (the processes of a multi-process run other than
      process 0, which writes the run's files: `rl.procs`).
  """

  def __init__(
    self,
    out_dir: str | os.PathLike,
    *,
    tensorboard: bool = True,
    resume_from_step: int | None = None,
    write: bool = True,
  ):
    self.out_dir = Path(out_dir)
    self.path = self.out_dir / "metrics.jsonl"
    self._f = self._tb = None
    if not write:
      return
    self.out_dir.mkdir(parents=True, exist_ok=True)
    if resume_from_step is None:
      self.path.write_text("")
      shutil.rmtree(self.out_dir / "tb", ignore_errors=True)  # a fresh run: no stale event files
    else:
      keep = [
        r for r in read_metrics(self.path) if r.get("phase") in ("sft", "pre") or r.get("step", 0) < resume_from_step
      ]
      self.path.write_text("".join(json.dumps(r) + "\n" for r in keep))
    self._f = open(self.path, "a", encoding="utf-8")
    if tensorboard:
      try:
        from tensorboardX import SummaryWriter  # lazy: protobuf-heavy, and only when TensorBoard is asked for  # noqa: PLC0415

        self._tb = SummaryWriter(str(self.out_dir / "tb"))
      except ImportError:
        log.warning("tensorboardX is not installed: metrics go to %s only (pip install tensorboardX)", self.path)

  @property
  def tensorboard_dir(self) -> Path | None:
    """Where the TensorBoard event files go, or None (tensorboardX missing or disabled)."""
    return None if self._tb is None else self.out_dir / "tb"

  def log(self, step: int, metrics: Mapping[str, Any], *, phase: str = "rl") -> dict:
    """Writes one record; non-scalar values are dropped, non-finite floats are written as null."""
    rec: dict[str, Any] = {"step": int(step), "phase": phase}
    for k, v in metrics.items():
      s = _scalar(v)
      if isinstance(s, float) and not math.isfinite(s):
        rec[k] = None
      elif s is not None:
        rec[k] = s
    if self._f is None:
      return rec
    self._f.write(json.dumps(rec) + "\n")
    self._f.flush()
    if self._tb is not None:
      for k, v in rec.items():
        if k not in ("step", "phase") and isinstance(v, (int, float)) and not isinstance(v, bool):
          self._tb.add_scalar(f"{phase}/{k}", v, step)
    return rec

  def close(self) -> None:
    if self._f is not None:
      self._f.close()
    if self._tb is not None:
      self._tb.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def read_metrics(path: str | os.PathLike) -> list[dict]:
  """The records of a metrics.jsonl file ([] if it does not exist)."""
  p = Path(path)
  if not p.is_file():
    return []
  return [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]


def _series(records: Iterable[dict], phase: str, key: str) -> tuple[np.ndarray, np.ndarray]:
  pts = [(r["step"], r[key]) for r in records if r.get("phase") == phase and r.get(key) is not None]
  if not pts:
    return np.zeros(0), np.zeros(0)
  s, v = zip(*pts)
  return np.asarray(s, float), np.asarray(v, float)


def wilson_interval(successes: int, n: int, *, z: float = 1.959963984540054) -> tuple[float, float]:
  """Wilson's score interval (Wilson 1927) of a binomial proportion k / n; z = 1.96: 95% coverage.

  (p̂ + z²/2n ± z·sqrt(p̂(1 − p̂)/n + z²/4n²)) / (1 + z²/n); unlike p̂ ± z·sqrt(p̂(1 − p̂)/n) it stays in [0, 1]
  and does not collapse to a point at 0 or n successes.
  """
  if n <= 0 or not 0 <= successes <= n:
    raise ValueError(f"wilson_interval: need 0 <= successes <= n and n > 0; got {successes} of {n}")
  p, z2 = successes / n, z * z
  centre = (p + z2 / (2 * n)) / (1 + z2 / n)
  half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
  return max(0.0, centre - half), min(1.0, centre + half)


def smoothness(values) -> float:
  """Std of the step-to-step change of a curve (lower = smoother); nan for fewer than 3 points."""
  v = np.asarray(values, np.float64)
  v = v[np.isfinite(v)]
  return float(np.std(np.diff(v))) if v.size >= 3 else float("nan")


def timeline_overlap(records: Iterable[dict], *, skip: int = 1) -> dict[str, float]:
  """How much the sampler and the learner overlapped in time, from the RL records' timeline.

  Each record k carries `time/sample_start`/`_end` (generation + rewards of its rollouts) and `time/learn_start`/
  `_end` (the learner on them), in seconds since the run's start. The window runs from the end of record `skip` − 1's
  learning (`skip` = 1: after the first step, which compiles) to the last record's learning end.

  Returns:
    {"overlap_frac": seconds both sides are busy / window, "sampler_busy_frac", "learner_busy_frac",
    "step_s": window / steps in it, "steps"}; NaNs when the records have no timeline or too few steps.
  """
  rl = [r for r in records if r.get("phase", "rl") == "rl" and "time/learn_end" in r]
  if len(rl) <= skip:
    return {
      "overlap_frac": math.nan,
      "sampler_busy_frac": math.nan,
      "learner_busy_frac": math.nan,
      "step_s": math.nan,
      "steps": 0,
    }
  lo = rl[skip - 1]["time/learn_end"] if skip else min(r["time/sample_start"] for r in rl)
  hi = rl[-1]["time/learn_end"]
  clip = lambda a, b: (max(a, lo), min(b, hi))  # noqa: E731
  samp = [clip(r["time/sample_start"], r["time/sample_end"]) for r in rl]
  learn = [clip(r["time/learn_start"], r["time/learn_end"]) for r in rl]
  length = lambda iv: sum(max(b - a, 0.0) for a, b in iv)  # noqa: E731  (each side's intervals are disjoint)
  both = sum(max(min(b, d) - max(a, c), 0.0) for a, b in samp for c, d in learn)
  w = max(hi - lo, 1e-12)
  n = len(rl) - skip
  return {
    "overlap_frac": both / w,
    "sampler_busy_frac": length(samp) / w,
    "learner_busy_frac": length(learn) / w,
    "step_s": w / n,
    "steps": n,
  }


def plot_run(out_dir: str | os.PathLike, records: list[dict] | None = None) -> list[Path]:
  """PNG plots of a run: reward & accuracy vs step, mismatch vs step. Returns the written paths ([] if
  matplotlib is missing)."""
  out_dir = Path(out_dir)
  records = read_metrics(out_dir / "metrics.jsonl") if records is None else records
  try:
    import matplotlib  # lazy: selecting the Agg backend at import would override a notebook's inline one  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
  except ImportError:
    log.warning("matplotlib is not installed: no plots")
    return []
  paths = []
  fig, ax = plt.subplots(figsize=(6.4, 4.0))
  s, r = _series(records, "rl", "reward_mean")
  ax.plot(s, r, label="train reward (mean)", color="tab:blue", alpha=0.8)
  s, a = _series(records, "eval", "eval_accuracy")
  ax.plot(s, a, "o-", label="eval accuracy (greedy, served weights)", color="tab:orange")
  ax.set_xlabel("RL step")
  ax.set_ylim(-0.02, 1.02)
  ax.grid(alpha=0.3)
  ax.legend(loc="lower right")
  ax.set_title("reward and accuracy")
  fig.tight_layout()
  paths.append(out_dir / "reward.png")
  fig.savefig(paths[-1], dpi=100)
  plt.close(fig)

  fig, ax = plt.subplots(figsize=(6.4, 4.0))
  for key, label in (
    ("mismatch/prob_abs_diff_mean", "mean |π − μ|"),
    ("mismatch/kl_k3", "KL(μ‖π) k3"),
    ("correction/acrl_y", "ACRL Y"),
    ("correction/acrl_x", "ACRL X"),
  ):
    s, v = _series(records, "rl", key)
    if s.size:
      ax.plot(s, np.maximum(v, 1e-16), label=label)  # log axis: exact zeros drawn at 1e-16
  ax.set_xlabel("RL step")
  ax.set_yscale("log")
  ax.grid(alpha=0.3)
  if ax.get_lines():  # a run without RL steps (a recovery alone) has no mismatch to draw
    ax.legend(loc="upper right")
  ax.set_title("train-inference mismatch (learner π vs sampler μ)")
  fig.tight_layout()
  paths.append(out_dir / "mismatch.png")
  fig.savefig(paths[-1], dpi=100)
  plt.close(fig)
  return paths


def summary_table(rows: list[tuple[str, str]]) -> str:
  """A two-column Markdown table."""
  w = max(len(k) for k, _ in rows)
  out = [f"| {'':<{w}} | value |", f"|{'-' * (w + 2)}|-------|"]
  out += [f"| {k:<{w}} | {v} |" for k, v in rows]
  return "\n".join(out)


def write_summary(out_dir: str | os.PathLike, title: str, rows: list[tuple[str, str]]) -> str:
  """Writes `<out_dir>/summary.md` (title + table) and returns its text."""
  text = f"# {title}\n\n{summary_table(rows)}\n"
  Path(out_dir, "summary.md").write_text(text, encoding="utf-8")
  return text


def _fmt(x, pct: bool = False) -> str:
  if x is None or (isinstance(x, float) and math.isnan(x)):
    return "n/a"
  return f"{100 * x:.1f}%" if pct else f"{x:.3g}"


def _accuracy(ev: Mapping[str, Any], prefix: str, acc) -> str:
  """'12.5% [9.1, 17.2] of 256': an eval accuracy with its 95% interval when the record has one."""
  lo, hi, n = ev.get(f"{prefix}accuracy_lo"), ev.get(f"{prefix}accuracy_hi"), ev.get(f"{prefix}n")
  if acc is None or lo is None or hi is None or n is None:
    return _fmt(acc, True)
  return f"{100 * acc:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}] of {int(n)}"


def write_run_summary(cfg, r, rl: list[dict]) -> str:
  """The end-of-run table of `rl.train` (a `RunResult` `r` and its RL-step records), written to summary.md."""
  kl = [x.get("mismatch/kl_k3") for x in rl if x.get("mismatch/kl_k3") is not None]
  tgen = sum(x.get("time/generate_s", 0) for x in rl)
  tlearn = sum(x.get("time/learner_s", 0) for x in rl)
  tsync = sum(x.get("time/sync_s", 0) or 0 for x in rl)
  lrn = cfg.learner
  rows = [
    ("model", f"{cfg.model.source} ({cfg.model.arch})" if cfg.model.source == "tiny" else cfg.model.source),
    (
      "learner QAT / sampler weights",
      f"{cfg.quant.learner} / {cfg.quant.sampler}" + (" + fp8 activations" if cfg.quant.act == "fp8" else ""),
    ),
    (
      "policy loss / correction",
      f"{lrn.policy_loss} / {lrn.correction.method}" + (" (LoRA)" if lrn.lora is not None else ""),
    ),
    ("warm-up steps / RL steps", f"{cfg.run.sft_steps} / {r.steps}"),
    ("eval accuracy before RL", _accuracy(getattr(r, "eval_before", {}), "eval_", r.accuracy_before)),
    ("eval accuracy after RL", _accuracy(getattr(r, "eval_after", {}), "eval_", r.accuracy_after)),
    ("train reward, first 5 -> last 5 steps", f"{_fmt(r.reward_first)} -> {_fmt(r.reward_last)}"),
    ("mean abs(π − μ) per token (mismatch)", _fmt(r.mismatch_mean)),
    ("mean KL(μ‖π) k3", _fmt(float(np.mean(kl)) if kl else None)),
    ("reward failures (scored 0) / skipped steps", f"{r.reward_failures} / {r.skipped_steps}"),
    ("time: generate / learner / sync", f"{tgen:.0f} s / {tlearn:.0f} s / {tsync:.1f} s"),
    ("sampler and learner busy at once (after step 0)", _fmt(timeline_overlap(rl)["overlap_frac"], pct=True)),
    ("wall time", f"{r.wall_s:.0f} s"),
  ]
  after = getattr(r, "eval_after", {}) or {}
  for key in sorted(k for k in after if k.endswith("_accuracy") and k != "eval_accuracy"):
    pre = key[: -len("accuracy")]
    before = getattr(r, "eval_before", {}) or {}
    rows.append(
      (
        f"eval {pre[5:-1]} (transfer) before -> after RL",
        f"{_accuracy(before, pre, before.get(key))} -> {_accuracy(after, pre, after[key])}",
      )
    )
  rows += [(f"output: {k}", f"`{v}`") for k, v in r.paths.items() if v]
  return "\n" + write_summary(r.out_dir, f"lrl_jax run: {r.out_dir}", rows)
