"""SIGKILL at a random moment after the first checkpoint, then `--resume`: the resumed run ends with the uninterrupted
run's checkpoint bit for bit and its metrics records equal, for the default (on-policy) loop and for
`run.off_policy=true` (whose checkpoint also holds the stale served weights its next step generates with).

Each run is `lrl-jax train` in its own process (the same XLA flags as the reference run), so that nothing in this
process's caches can make a resume look exact."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from lrl_jax.config import load_config
from lrl_jax.rl import loop, read_metrics
from tests.rl.test_rl_loop import QS, SMALL

BASE = [
  *SMALL,
  "run.steps=6",
  "run.ckpt_every=1",
  "task.format_reward=0.5",  # non-zero advantages from the start: the weights move at every step
]
# Time-dependent record fields: everything else in a record must be equal.
_CLOCK = ("time/", "tokens_per_s")


def _env():
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform")]
  return dict(os.environ, XLA_FLAGS=" ".join(["--xla_force_host_platform_device_count=1", *flags]), JAX_PLATFORMS="cpu")


def _cmd(out: Path, extra, *flags):
  over = [*BASE, *extra, f"run.out_dir={out}"]
  return [sys.executable, "-m", "lrl_jax.cli", "train", QS, *over, "--no-progress", "--no-export", *flags]


def _run(out, extra, *flags):
  p = subprocess.run(_cmd(out, extra, *flags), env=_env(), capture_output=True, text=True, timeout=600)
  assert p.returncode == 0, p.stderr[-3000:]
  return p


def _records(out: Path):
  recs = [r for r in read_metrics(out / "metrics.jsonl") if r.get("phase") in ("rl", "eval")]
  return [{k: v for k, v in r.items() if not k.startswith(_CLOCK)} for r in recs]


def _leaves(out: Path, extra):
  cfg = load_config(QS, [*BASE, *extra, f"run.out_dir={out}"])
  state = loop.restore_run(cfg)[1]
  return int(state.step), [np.asarray(x) for x in jax.tree_util.tree_leaves(state)]


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["run.off_policy=true"]], ids=["on_policy", "off_policy"])
def test_sigkill_at_a_random_moment_then_resume_is_exact(tmp_path, extra):
  full, cut = tmp_path / "full", tmp_path / "cut"
  t0 = time.perf_counter()
  _run(full, extra)
  t_full = time.perf_counter() - t0

  # The moment: uniform over the rest of the run after its first checkpoint appears (the seed is printed on failure).
  # A run that ends before the drawn moment is started again with half the delay: a kill must happen.
  seed = int.from_bytes(os.urandom(4), "little")
  rng = np.random.default_rng(seed)
  frac = first = float(rng.uniform(0.0, 0.8))
  killed = False
  while not killed and frac > 1e-3:
    shutil.rmtree(cut, ignore_errors=True)  # a checkpoint left by an earlier try must not count as the first
    t0 = time.perf_counter()
    proc = subprocess.Popen(_cmd(cut, extra), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
      ck = cut / "checkpoints"
      while proc.poll() is None and not (ck.is_dir() and any(p.name.isdigit() for p in ck.iterdir())):
        time.sleep(0.05)
      assert proc.poll() is None, f"the run ended before its first checkpoint: {proc.stderr.read()[-2000:]}"
      delay = frac * max(t_full - (time.perf_counter() - t0), 1.0)
      time.sleep(delay)
      killed = proc.poll() is None
      if killed:
        os.kill(proc.pid, signal.SIGKILL)
    finally:
      proc.wait(timeout=600)
    frac /= 2
  tries = int(round(np.log2(first / frac)))
  where = f"(kill seed {seed}, try {tries}: {delay:.2f} s after the first checkpoint; kept {sorted(os.listdir(ck))})"
  assert killed and proc.returncode == -signal.SIGKILL, where
  _run(cut, extra, "--resume")

  step_a, a = _leaves(full, extra)
  step_b, b = _leaves(cut, extra)
  assert step_a == step_b == 6, where
  assert len(a) == len(b), where
  for i, (x, y) in enumerate(zip(a, b)):
    assert x.dtype == y.dtype and x.shape == y.shape, (i, where)
    assert x.tobytes() == y.tobytes(), (f"checkpoint leaf {i} differs", where)
  ra, rb = _records(full), _records(cut)
  assert [(r["phase"], r["step"]) for r in rb] == [(r["phase"], r["step"]) for r in ra], where
  for x, y in zip(ra, rb):
    assert x == y, ((x["phase"], x["step"]), where)
  if "run.off_policy=true" in extra:
    assert [r["policy_lag"] for r in rb if r["phase"] == "rl"] == [0, 1, 1, 1, 1, 1], where
