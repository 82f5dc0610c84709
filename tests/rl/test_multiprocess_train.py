"""`rl.train` across 2 processes on localhost (`jax.distributed` over 127.0.0.1, 4 simulated CPU devices each) gives
the run one process with 8 devices gives: the same rollouts and rewards, the same evaluations, the learner's numbers
within the reordering of its cross-device sums; process 0 alone writes the run directory, and the orbax checkpoint
both wrote restores in one process; synchronous and asynchronous; a sampler failing in one process stops both, and
both resume (`_mp_train.py` runs the processes' side)."""

import json
import os
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from tests._mp_launch import run_processes

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _mp_train  # noqa: E402


def _timed(key: str) -> bool:
  """Record keys that are clock readings (each process its own)."""
  return key.startswith("time/") or key == "tokens_per_s"


def _two_processes(script: str, tmp_path):
  """(their run directory, what each returned) of `script` run by 2 processes of 4 CPU devices each."""
  env = dict(os.environ)
  # the children compile as this process does (tests/conftest.py's flags: LLVM -O0 changes the CPU code, and so
  # the last bits), with 4 devices each
  env["XLA_FLAGS"] = env.get("XLA_FLAGS", "").replace("device_count=8", "device_count=4")
  run_dir = tmp_path / "two"
  run_processes(
    HERE / script, lambda i, port: [i, port, run_dir, tmp_path / f"{i}.json"], tmp_path, env=env, timeout=600
  )
  return run_dir, [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(2)]


@pytest.mark.multiprocess
def test_train_across_two_processes_equals_one(tmp_path):
  from lrl_jax.config import load_config  # noqa: PLC0415
  from lrl_jax.rl import train  # noqa: PLC0415

  run_dir, got = _two_processes("_mp_train.py", tmp_path)

  # the reference: this process, its 8 devices (tests/conftest.py), the same configs
  assert jax.device_count() == 8
  for mode, over in _mp_train.MODES.items():
    cfg = load_config("configs/quickstart.yaml", [*_mp_train.OVERRIDES, *over, f"run.out_dir={tmp_path / mode}"])
    want = train(cfg, progress=False, export=True)
    _check_equal(mode, [g[mode] for g in got], want, run_dir / mode)
    _check_checkpoint(cfg, run_dir / mode, tmp_path / mode)

  # A sampler failing on one process (process 1, RL step 1): both processes stop with a SamplerError naming the step
  # (process 0's names process 1), and `resume=True` in both continues from the step-1 checkpoint to the records the
  # uninterrupted synchronous run made, bit for bit (the same processes, the same numbers).
  untimed = lambda r: {k: v for k, v in r.items() if not _timed(k)}  # noqa: E731
  for i in range(2):
    f = got[i]["fault"]
    assert f["error"] is not None and "RL step 1" in f["error"], f["error"]
    assert ("injected sampler failure" if i == 1 else "the sampler of process [1] failed") in f["error"]
    assert f["steps"] == 2 and len(f["records"]) == 1
    assert untimed(f["records"][0]) == untimed(got[i]["sync"]["records"][1])
    assert f["accuracy_after"] == got[i]["sync"]["accuracy_after"]


def _check_equal(mode, got, want, run_dir):
  # Process 0 wrote the run directory's files once; the metrics both processes returned are the ones it wrote.
  assert (run_dir / "metrics.jsonl").is_file() and (run_dir / "summary.md").is_file()
  assert (run_dir / "eval_after.jsonl").is_file() and Path(got[0]["paths"]["export"]).is_dir()
  written = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
  assert [r for r in written if r["phase"] == "rl"] == got[0]["records"]
  untimed = lambda recs: [{k: v for k, v in r.items() if not _timed(k)} for r in recs]  # noqa: E731
  assert untimed(got[0]["records"]) == untimed(got[1]["records"])  # both processes computed the same records

  # Rollouts: each process generated its half of the rows with the keys one process gives them. Tokens and rewards
  # are equal bit for bit (what is sampled at a step before any update is exact; after one update the learner's
  # weights differ by the reordering below, and a token would change only if a draw fell within that difference
  # of a boundary of its CDF: ~1e-5 per draw, ~400 draws a step). μ's log-probs are not bit-equal: a GEMM's
  # summation blocks depend on its row count (8 rows per process here, 16 in one), so they differ by the f32
  # rounding of sums of K <= 128 terms of |x| < 30: <= 128 x 2^-24 x 30 ~ 2.3e-4 on a log-prob; the metrics of μ
  # (the mismatch) are compared with that atol.
  # Asynchronous mode: the sampler thread made each process's share of step k + 1 while the learner trained on step
  # k, exchanged when the learner asked for it: the records equal the one-process asynchronous run's alike.
  for i in range(2):
    assert got[i]["steps"] == want.steps == 2
    assert got[i]["accuracy_before"] == want.accuracy_before
    assert got[i]["accuracy_after"] == want.accuracy_after
    assert got[i]["eval_after"] == want.eval_after  # transfer sets included
    for g, w in zip(got[i]["records"], want.records, strict=True):
      assert set(g) == set(w)
      for k, v in w.items():
        if _timed(k):
          continue
        if k.startswith("mismatch/") or k.startswith("correction/"):
          np.testing.assert_allclose(g[k], v, rtol=0, atol=2.3e-4, err_msg=f"{mode} step {w['step']}: {k}")
        elif k in ("loss", "grad_norm", "pg_loss", "entropy", "advantage_abs_mean", "kl", "clipfrac", "update_norm"):
          # the learner's sums across the 8 devices: gloo between the processes, XLA's all-reduce within one;
          # f32 reordering, <= 7 ulps of the summed magnitudes, x5 for terms of mixed sign (test_multiprocess.py)
          np.testing.assert_allclose(g[k], v, rtol=4e-6, atol=1e-7, err_msg=f"{mode} step {w['step']}: {k}")
        elif isinstance(v, float):
          np.testing.assert_allclose(g[k], v, rtol=4e-6, atol=1e-7, err_msg=f"{mode} step {w['step']}: {k}")
        else:
          assert g[k] == v, f"{mode} step {w['step']}: {k}"


def _check_checkpoint(cfg, run_dir, one_dir):
  from lrl_jax.rl import restore_run  # noqa: PLC0415

  # The checkpoint both processes wrote restores in one process, and holds what one process trains: Adam's
  # updates are ~lr * sign(g) per element, and an element whose 8 partial gradients cancel to |g| ~ eps can move by
  # up to 2 lr per step under the reordering (tests/learner/test_multiprocess.py); every element within 2 lr x 2
  # steps, all but 0.1% within lr x 1e-3.
  lr = cfg.learner.lr
  _, two = restore_run(cfg, out_dir=str(run_dir))
  _, one = restore_run(cfg, out_dir=str(one_dir))
  assert int(two.step) == int(one.step) == 2
  for a, b in zip(jax.tree_util.tree_leaves(two.params), jax.tree_util.tree_leaves(one.params), strict=True):
    a, b = np.asarray(a), np.asarray(b)
    np.testing.assert_allclose(a, b, rtol=0, atol=4 * lr)
    assert np.mean(np.abs(a - b) > lr * 1e-3) <= 1e-3


@pytest.mark.multiprocess
def test_learner_and_sampler_in_two_processes_equal_one(tmp_path):
  """A disaggregated run whose learner mesh is process 0's devices and whose sampler mesh is process 1's (`rl.roles`):
  each process takes one role and they exchange the served INT4 weights and the rollouts (`_mp_roles.py`). The same
  config in this one process (8 devices: the learner on the first 4, the sampler on the last 4) does the same work on
  the same device counts, synchronous and asynchronous. What the sampler computes is equal bit for bit (tokens,
  rewards, μ, evaluations: the weights arrive bit for bit); the learner's sums over its 4 devices are made by the
  multi-process runtime's collectives in the 2-process run and by XLA's in-process all-reduce here, so its floats
  agree to the reordering of f32 sums (rtol 4e-6: <= 7 ulps of the summed magnitudes, x5 for terms of mixed sign, as
  `_check_equal`), and so does the checkpoint, which the learner's process alone wrote (`_check_checkpoint`)."""
  import _mp_roles  # noqa: PLC0415

  from lrl_jax.config import load_config  # noqa: PLC0415
  from lrl_jax.rl import train  # noqa: PLC0415

  run_dir, got = _two_processes("_mp_roles.py", tmp_path)
  untimed = lambda recs: [{k: v for k, v in r.items() if not _timed(k)} for r in recs]  # noqa: E731

  assert jax.device_count() == 8
  for mode, over in _mp_roles.MODES.items():
    cfg = load_config("configs/quickstart.yaml", [*_mp_roles.OVERRIDES, *over, f"run.out_dir={tmp_path / mode}"])
    want = train(cfg, progress=False, export=True)
    for i in range(2):  # the sampler's process returns the learner's result
      g = got[i][mode]
      assert g["steps"] == want.steps == 2
      _close(g["records"], want.records, f"{mode}, process {i}")
      assert g["records"] == got[0][mode]["records"]
      assert (g["accuracy_before"], g["accuracy_after"]) == (want.accuracy_before, want.accuracy_after)
      assert g["eval_after"] == want.eval_after  # transfer sets included
    assert [r["policy_lag"] for r in want.records] == ([0, 0] if mode == "sync" else [0, 1])
    # the sync's second half is the transfer of the served tree to the other process: its bytes are the INT4 tree's
    assert all(r["sync/bytes"] == want.records[0]["sync/bytes"] > 0 for r in got[0][mode]["records"])
    # process 0 wrote the run directory once, as one process writes it
    d = run_dir / mode
    written = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert [r for r in written if r["phase"] == "rl"] == got[0][mode]["records"]
    assert (d / "summary.md").is_file() and (d / "eval_after.jsonl").is_file() and (d / "export_int4").is_dir()
    assert (d / "eval_after.jsonl").read_text() == (tmp_path / mode / "eval_after.jsonl").read_text()
    # the learner's checkpoint (host arrays: orbax saves no one-process arrays across processes) restores here
    _check_checkpoint(cfg, d, tmp_path / mode)

  # The sampler's process failing on RL step 1 (asynchronous: in its thread, while the learner trained on step 0): the
  # learner's process stops with a SamplerError naming the step and the sampler's process, the sampler's with its own
  # error; `resume=True` in both continues from the step-1 checkpoint (the held off-policy weights sent to the
  # sampler again) to the uninterrupted asynchronous run's step-1 record, bit for bit.
  errors = [g["fault"]["error"] for g in got]
  assert errors[0].startswith("SamplerError: the sampler (process 1) failed on RL step 1"), errors[0]
  assert errors[1].startswith("SamplerError: the sampler failed on RL step 1"), errors[1]
  assert all("injected sampler failure" in e for e in errors)
  for g in got:
    assert g["fault"]["steps"] == 2 and len(g["fault"]["records"]) == 1
    assert untimed(g["fault"]["records"]) == untimed(g["async"]["records"][1:])
    assert g["fault"]["accuracy_after"] == g["async"]["accuracy_after"]


# keys computed from the rollouts alone (the sampler's side): equal bit for bit
_SAMPLED = ("reward_mean", "reward_std", "accuracy", "response_len", "generated_tokens", "reward_failed", "policy_lag")


def _close(got, want, what):
  """Records equal but for the clock; the learner's floats within the reordering of its f32 sums (see the caller)."""
  assert len(got) == len(want), what
  for g, w in zip(got, want):
    assert set(g) == set(w), what
    for k, v in w.items():
      if _timed(k):
        continue
      if isinstance(v, float) and k not in _SAMPLED:
        np.testing.assert_allclose(g[k], v, rtol=4e-6, atol=1e-7, err_msg=f"{what} step {w['step']}: {k}")
      else:
        assert g[k] == v, f"{what} step {w['step']}: {k}"
