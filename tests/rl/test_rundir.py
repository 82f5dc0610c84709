"""A run directory survives mistakes: a failed start changes nothing in it, a resume refuses a config that changes
what the checkpoint holds (and records what it allows), a forgotten --resume does not delete a run, a damaged newest
checkpoint falls back to the next intact one, and nothing non-finite is ever checkpointed."""

import hashlib
import logging
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from lrl_jax import learner as L
from lrl_jax import models
from lrl_jax.config import ConfigError, load_config
from lrl_jax.rl import cli, train
from lrl_jax.rl.rundir import check_run_dir

QS = "configs/quickstart.yaml"
SMALL = ["run.sft_steps=3", "run.sft_batch=16", "run.batch_prompts=4", "task.eval_size=16", "learner.mesh=[1,1,1]"]


def _snapshot(d: Path) -> dict[str, str]:
  return {
    str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*")) if p.is_file()
  }


def _fake_run(tmp_path, *extra):
  """A directory as a finished run leaves it (config.yaml, metrics, a checkpoint directory): what the checks read."""
  out = tmp_path / "run"
  cfg = load_config(QS, SMALL + [f"run.out_dir={out}", *extra])
  (out / "checkpoints" / "8").mkdir(parents=True)
  (out / "checkpoints" / "8" / "state").write_bytes(b"weights")
  cfg.dump_yaml(out / "config.yaml")
  (out / "metrics.jsonl").write_text('{"step": 0, "phase": "rl"}\n')
  return cfg, out


def test_failed_or_refused_starts_leave_the_directory_unchanged(tmp_path):
  cfg, out = _fake_run(tmp_path)
  before = _snapshot(out)
  with pytest.raises(ConfigError, match=r"already holds a run \(checkpoints at steps \[8\]\).*--resume.*--overwrite"):
    train(cfg, progress=False)  # a forgotten --resume
  bad_source = load_config(QS, SMALL + [f"run.out_dir={out}", "model.source=gguf:/no/such.gguf"])
  with pytest.raises(FileNotFoundError, match="GGUF file not found: /no/such.gguf"):
    train(bad_source, overwrite=True, progress=False)  # fails while building the model: before anything is written
  wider = load_config(QS, SMALL + [f"run.out_dir={out}", "model.hidden_size=128"])
  with pytest.raises(ConfigError, match=r"model.hidden_size: saved 64, now 128"):
    train(wider, resume=True, progress=False)
  assert _snapshot(out) == before
  empty = load_config(QS, SMALL + [f"run.out_dir={tmp_path / 'empty'}"])
  with pytest.raises(ConfigError, match="no checkpoint in"):
    train(empty, resume=True, progress=False)
  assert not (tmp_path / "empty").exists()
  # The CLI: exit 2 and one line, the directory unchanged.
  rc = cli.train_main([QS, *SMALL, f"run.out_dir={out}", "--no-progress"])
  assert rc == 2 and _snapshot(out) == before


def test_resume_allows_what_steers_the_rest_of_the_run(tmp_path):
  cfg, out = _fake_run(tmp_path)
  more = load_config(QS, SMALL + [f"run.out_dir={out}", "run.steps=400", "run.eval_every=7", "task.eval_size=32"])
  changes = check_run_dir(more, resume=True, overwrite=False)
  assert changes == {"run.steps": (200, 400), "run.eval_every": (25, 7), "task.eval_size": (16, 32)}
  with pytest.raises(ConfigError, match=r"learner.lr: saved .*, now 0.5; sampler.group_size: saved 4, now 8"):
    check_run_dir(
      load_config(QS, SMALL + [f"run.out_dir={out}", "learner.lr=0.5", "sampler.group_size=8"]),
      resume=True,
      overwrite=False,
    )


def _state(seed=0):
  mc = models.ModelConfig(
    arch="qwen2", vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2, num_kv_heads=1
  )
  return L.create_train_state(jax.random.PRNGKey(seed), mc, L.LearnerConfig(lr=1e-3, compute_dtype="float32"))


def test_a_damaged_checkpoint_falls_back_to_the_newest_intact_one(tmp_path, caplog):
  st = _state()
  ck = L.Checkpointer(tmp_path / "ck", save_every=1)
  ck.save(st)
  st2 = st.replace(step=st.step + 1, params=jax.tree_util.tree_map(lambda x: x + 1.0, st.params))
  ck.save(st2)
  ck.close()
  (tmp_path / "ck" / "0.orbax-checkpoint-tmp-123").mkdir()  # what a save killed half-way leaves
  files = sorted(f for f in (tmp_path / "ck" / "1").rglob("*") if f.is_file() and f.stat().st_size > 200)
  big = max(files, key=lambda f: f.stat().st_size)
  big.write_bytes(big.read_bytes()[:-100])  # 100 bytes short: orbax alone does not notice
  ck = L.Checkpointer(tmp_path / "ck", save_every=1)
  assert not (tmp_path / "ck" / "0.orbax-checkpoint-tmp-123").exists()
  with caplog.at_level(logging.WARNING):
    back = ck.restore_latest(st)
  assert int(back.step) == 0  # step 1 was damaged
  assert any("/1 is damaged" in r.getMessage() and "bytes" in r.getMessage() for r in caplog.records)
  for f in (tmp_path / "ck" / "0").rglob("*"):
    if f.is_file() and f.stat().st_size > 200:
      f.write_bytes(b"")
  with pytest.raises(L.CheckpointError, match=r"no intact checkpoint .* step 1: .* step 0: "):
    ck.restore_latest(st)
  ck.close()


def test_nothing_non_finite_is_checkpointed(tmp_path):
  st = _state()
  bad = st.replace(params=jax.tree_util.tree_map(lambda x: x * jnp.nan, st.params))
  ck = L.Checkpointer(tmp_path / "ck", save_every=1)
  with pytest.raises(L.NonFiniteError, match="refusing to checkpoint step 0"):
    ck.save(bad)
  ck.close()
  assert ck.all_steps() == []
  # A warm-up that diverges stops the run before RL; its non-finite updates were skipped, nothing was saved.
  cfg = load_config(QS, SMALL + [f"run.out_dir={tmp_path / 'run'}", "run.sft_lr=1e30", "run.max_nonfinite_steps=2"])
  with pytest.raises(L.NonFiniteError, match=r"supervised warm-up .* 2 consecutive steps"):
    train(cfg, progress=False, export=False)
  assert not any((tmp_path / "run" / "checkpoints").glob("[0-9]*"))


def test_cli_reports_a_broken_model_file_in_one_line(tmp_path, capsys, monkeypatch):
  """A file that is not GGUF: exit 1 and one line naming the file (LRL_JAX_DEBUG=1 would show the traceback)."""
  monkeypatch.delenv("LRL_JAX_DEBUG", raising=False)
  bad = tmp_path / "model.gguf"
  bad.write_bytes(b"not a gguf file at all")
  rc = cli.train_main(
    ["configs/smollm2_grpo.yaml", f"model.source=gguf:{bad}", f"run.out_dir={tmp_path / 'run'}", "--no-progress"]
  )
  err = capsys.readouterr().err.strip().splitlines()
  assert rc == 1 and len(err) == 1 and str(bad) in err[0] and "LRL_JAX_DEBUG" in err[0]
  assert not (tmp_path / "run").exists()


def _err_lines(capsys) -> list[str]:
  return [x for x in capsys.readouterr().err.strip().splitlines() if x]


def test_cli_errors_name_the_thing_in_one_line_and_change_nothing(tmp_path, capsys, monkeypatch):
  """Each bad input of the issue's list through the CLI: a non-zero exit, one line naming the file / key / value (a
  damaged checkpoint adds the fallback's one warning line per checkpoint tried), and the run directory's files
  byte for byte as they were."""
  monkeypatch.delenv("LRL_JAX_DEBUG", raising=False)
  run = tmp_path / "run"
  over = [*SMALL, "run.steps=2", "run.eval_every=0", f"run.out_dir={run}"]
  assert cli.train_main([QS, *over, "--no-progress", "--no-export"]) == 0
  capsys.readouterr()
  before = _snapshot(run)

  # eval with a model config other than the run's: refused before restoring, the key named (both ways to name the run)
  for argv in ([QS, "--run", str(run), *over, "model.hidden_size=128"], [str(run), "model.hidden_size=128"]):
    assert cli.eval_main(argv) == 2
    (line,) = _err_lines(capsys)
    assert "model.hidden_size: the run's 64, given 128" in line and str(run / "config.yaml") in line
  for size in ("0", "-5"):
    assert cli.eval_main(["--size", size, str(run)]) == 2
    assert _err_lines(capsys) == [f"lrl-jax eval: --size {size}: the number of eval problems must be >= 1"]

  # a model source that is not there, or a safetensors file cut short: one line naming the path, nothing written
  missing = tmp_path / "no_such_hf_dir"
  rc = cli.train_main([QS, *SMALL, f"model.source=hf:{missing}", f"run.out_dir={tmp_path / 'x'}", "--no-progress"])
  (line,) = _err_lines(capsys)
  assert rc == 2 and str(missing) in line
  mc = models.ModelConfig(
    arch="qwen2", vocab_size=20, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2
  )
  hf = models.save_hf(tmp_path / "hf", mc, models.init_params(mc, jax.random.PRNGKey(0)))
  st = next(Path(hf).glob("*.safetensors"))
  st.write_bytes(st.read_bytes()[: st.stat().st_size // 2])
  rc = cli.train_main([QS, *SMALL, f"model.source=hf:{hf}", f"run.out_dir={tmp_path / 'y'}", "--no-progress"])
  (line,) = _err_lines(capsys)
  assert rc in (1, 2) and st.name in line, line
  assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
  assert _snapshot(run) == before

  # every checkpoint damaged: eval and export name the directory and why; the orbax logs stay quiet
  for f in (run / "checkpoints").rglob("*"):
    if f.is_file() and f.stat().st_size > 200:
      f.write_bytes(f.read_bytes()[:-100])
  damaged = _snapshot(run)
  steps = L.Checkpointer(run / "checkpoints").all_steps()
  for argv, main in (
    ([str(run)], cli.eval_main),
    (["--format", "int4", str(run), str(tmp_path / "exp")], cli.export_main),
  ):
    assert main(argv) == 2
    lines = _err_lines(capsys)
    # (the fallback's warnings go through `logging`: on stderr in a shell, to pytest's log capture here)
    assert len(lines) <= len(steps) + 1 and all("is damaged" in x for x in lines[:-1]), lines
    assert f"no intact checkpoint in {run / 'checkpoints'}" in lines[-1]
  assert not (tmp_path / "exp").exists()
  assert _snapshot(run) == damaged
