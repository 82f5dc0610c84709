"""End-to-end checks of the RL loop on the tiny model: metrics, resume, reward failures, NaN guard, CLI."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lrl_jax import learner as L
from lrl_jax import models, quant
from lrl_jax.config import ConfigError, load_config
from lrl_jax.rl import cli, loop, read_metrics, train
from lrl_jax.rl import metrics as M

QS = "configs/quickstart.yaml"
# A few-step run: 4 prompts x G=4, short warm-up, small eval set, single-device learner.
SMALL = [
  "run.sft_steps=3",
  "run.sft_batch=16",
  "run.batch_prompts=4",
  "task.eval_size=16",
  "run.eval_every=2",
  "learner.mesh=[1,1,1]",
  "learner.lr=3e-4",
]

RL_KEYS = [
  "reward_mean",
  "reward_std",
  "accuracy",
  "response_len",
  "entropy",
  "clip_frac_low",
  "clip_frac_high",
  "loss",
  "grad_norm",
  "mismatch/prob_abs_diff_mean",
  "mismatch/prob_abs_diff_max",
  "mismatch/kl_k1",
  "mismatch/kl_k3",
  "mismatch/log_abs_diff_mean",
  "time/generate_s",
  "time/reward_s",
  "time/learner_s",
  "time/sync_s",
  "tokens_per_s",
  "reward_failed",
]


# Every default test's run has 4 RL steps: the cosine schedule's length (`run.steps`) is part of the compiled
# learner step, so that one compile (per process) serves them all.
STEPS = "run.steps=4"


def _cfg(tmp_path, name, *extra):
  return load_config(QS, SMALL + [f"run.out_dir={tmp_path / name}", *extra])


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
  """One full run (export included), checkpointed every 2 steps: the uninterrupted run of the resume test."""
  tmp = tmp_path_factory.mktemp("rl")
  cfg = _cfg(tmp, "run", STEPS, "run.ckpt_every=2")
  return cfg, train(cfg, progress=False)


def test_end_to_end_run_writes_finite_metrics_and_outputs(e2e):
  cfg, r = e2e
  recs = read_metrics(r.paths["metrics"])
  rl = [x for x in recs if x["phase"] == "rl"]
  assert [x["step"] for x in rl] == [0, 1, 2, 3] and r.steps == 4
  for rec in rl:
    for k in RL_KEYS:
      assert k in rec and rec[k] is not None and math.isfinite(rec[k]), (k, rec.get(k))
    # accuracy and reward agree with each other (0/1 rewards): both are the fraction of correct answers
    assert rec["accuracy"] == pytest.approx(rec["reward_mean"])
    assert 0 <= rec["mismatch/prob_abs_diff_mean"] <= rec["mismatch/prob_abs_diff_max"] <= 1
  evals = [x for x in recs if x["phase"] == "eval"]
  assert [x["step"] for x in evals] == [0, 2, 4]
  assert r.accuracy_before == evals[0]["eval_accuracy"] and r.accuracy_after == evals[-1]["eval_accuracy"]
  out = r.out_dir
  for f in ("summary.md", "reward.png", "mismatch.png", "config.yaml", "export_int4/config.json"):
    assert (out / f).is_file(), f
  assert L.Checkpointer(out / "checkpoints").latest_step() == 4  # K = 1 update per RL step
  # INT4 QAT learner + INT4 sampler, both in f32: π and μ share their weights; only op order differs.
  assert r.mismatch_mean < 1e-4


def test_exported_int4_checkpoint_holds_the_final_weights(e2e):
  cfg, r = e2e
  setup, state = loop.restore_run(cfg)
  mcfg, loaded, _ = models.load_compressed_tensors(r.out_dir / "export_int4")
  w = state.params["layers"]["mlp"]["down_proj"]["kernel"]
  want = quant.dequantize(quant.quantize(w.astype(jnp.bfloat16), quant.Int4(group_size=32), axis=-2), jnp.float32)
  got = quant.dequantize(loaded["layers"]["mlp"]["down_proj"]["kernel"], jnp.float32)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  assert mcfg.arch == "qwen2" and mcfg.vocab_size == 20


def test_cli_eval_and_export(e2e, tmp_path, capsys):
  cfg, r = e2e
  over = SMALL + [f"run.out_dir={r.out_dir}"]
  assert cli.eval_main([QS, *over]) == 0
  out = capsys.readouterr().out
  assert f"eval accuracy {100 * r.accuracy_after:.1f}%" in out
  assert cli.eval_main(["--size", "0", QS, *over]) == 2  # flags before the config, overrides after: both read
  assert "--size 0: the number of eval problems must be >= 1" in capsys.readouterr().err
  assert cli.eval_main([str(r.out_dir)]) == 0  # a run directory: its own config.yaml
  assert f"eval accuracy {100 * r.accuracy_after:.1f}%" in capsys.readouterr().out
  assert cli.export_main(["--format", "nvfp4", str(r.out_dir), str(tmp_path / "nv")]) == 0
  _, loaded, _ = models.load_compressed_tensors(tmp_path / "nv")
  assert isinstance(loaded["layers"]["attn"]["q_proj"]["kernel"], quant.QArray)
  assert isinstance(loaded["layers"]["attn"]["q_proj"]["kernel"].spec, quant.NVFP4)


def test_resume_gives_the_same_next_step_metrics(e2e, tmp_path):
  full = e2e[1]  # the same config, uninterrupted (its export comes after the last step)
  cfg_b = _cfg(tmp_path, "b", STEPS, "run.ckpt_every=2")
  with pytest.raises(KeyboardInterrupt):
    train(cfg_b, progress=False, export=False, _fail_after=2)  # dies before step 2; checkpoint at step 2
  resumed = train(cfg_b, resume=True, progress=False, export=False)
  a = {x["step"]: x for x in full.records}
  b = {x["step"]: x for x in resumed.records}
  assert sorted(b) == [2, 3]
  for k in (2, 3):
    for key in ("loss", "reward_mean", "grad_norm", "mismatch/prob_abs_diff_mean", "entropy"):
      assert b[k][key] == pytest.approx(a[k][key], rel=1e-6, abs=1e-9), (k, key)
  assert resumed.accuracy_after == full.accuracy_after
  assert resumed.accuracy_before == full.accuracy_before  # read back from the run directory
  recs = read_metrics(tmp_path / "b" / "metrics.jsonl")
  assert [x["step"] for x in recs if x["phase"] == "rl"] == [0, 1, 2, 3]
  clock = [x["time/elapsed_s"] for x in recs if "time/elapsed_s" in x]
  assert clock == sorted(clock)  # the run's clock goes on across the resume


@pytest.mark.slow  # the default suite resumes an asynchronous off-policy run instead (test_a_failing_sampler_...)
def test_off_policy_resume_generates_with_the_stale_weights_it_had(tmp_path):
  """An off-policy run's checkpoint keeps the served weights its next step generates with (offpolicy_<k>.npz): after
  an interruption the resumed steps have policy lag 1 and the uninterrupted run's numbers."""
  full = train(_cfg(tmp_path, "full", STEPS, "run.ckpt_every=2", "run.off_policy=true"), progress=False, export=False)
  cfg_b = _cfg(tmp_path, "b", STEPS, "run.ckpt_every=2", "run.off_policy=true")
  with pytest.raises(KeyboardInterrupt):
    train(cfg_b, progress=False, export=False, _fail_after=2)
  assert (tmp_path / "b" / "offpolicy_2.npz").is_file()
  resumed = train(cfg_b, resume=True, progress=False, export=False)
  a = {x["step"]: x for x in full.records}
  b = {x["step"]: x for x in resumed.records}
  for k in (2, 3):
    assert b[k]["policy_lag"] == 1 == a[k]["policy_lag"]
    for key in ("loss", "reward_mean", "grad_norm", "mismatch/prob_abs_diff_mean"):
      assert b[k][key] == pytest.approx(a[k][key], rel=1e-6, abs=1e-9), (k, key)


def test_train_takes_the_users_task(tmp_path):
  """rl.train(cfg, task=factory): the factory gets the model's prompt encoder; its prompts are trained on and its
  reward scores them (here a reward that records its calls)."""
  from lrl_jax.tasks import PromptsTask  # noqa: PLC0415

  seen = []

  def reward(completion, reference):
    seen.append(reference)
    return float(completion.strip() == reference)

  rows = [(f"{a}+{b}=", str(a + b)) for a in range(10) for b in range(10)]
  cfg = _cfg(tmp_path, "user", "run.steps=2", "run.eval_every=0", "run.sft_steps=0")
  r = train(
    cfg,
    progress=False,
    export=False,
    task=lambda enc, seed: PromptsTask(rows, reward=reward, encoder=enc, eval_rows=rows[:16], seed=seed),
  )
  assert r.steps == 2 and len(seen) == 2 * 4 * 4 + 2 * 16  # 2 steps x 4 prompts x G = 4, and 2 evaluations of 16
  assert set(seen) <= {ref for _, ref in rows}


class _Broken:
  """A task wrapper whose reward raises on every completion of odd length."""

  def __init__(self, task):
    self._task = task
    self.calls = []

  def __getattr__(self, name):
    return getattr(self._task, name)

  def reward(self, completion, reference):
    self.calls.append(completion)
    if len(completion) % 2:
      raise RuntimeError("verifier crashed")
    return self._task.reward(completion, reference)

  def score(self, completions, references, *, timeout_s=1.0):
    from lrl_jax.tasks import score_batch

    return score_batch(self, completions, references, timeout_s=timeout_s)


def test_reward_failures_are_counted_not_fatal(tmp_path, monkeypatch):
  broken = {}
  real = loop.build_model

  def build(cfg, **kw):
    s = real(cfg, **kw)
    broken["task"] = _Broken(s.task)
    import dataclasses

    return dataclasses.replace(s, task=broken["task"])

  monkeypatch.setattr(loop, "build_model", build)
  # reward_workers=0: the wrapper counts its calls in this process (worker processes would count their own)
  r = train(_cfg(tmp_path, "broken", STEPS, "run.eval_every=0", "task.reward_workers=0"), progress=False, export=False)
  assert r.steps == 4
  calls = broken["task"].calls  # eval (16) + 4 steps x 16 rollouts + final eval (16), in order
  assert len(calls) == 16 + 64 + 16
  for k, rec in enumerate(r.records):
    batch = calls[16 + 16 * k : 32 + 16 * k]
    assert rec["reward_failed"] == sum(len(c) % 2 for c in batch)
  assert r.reward_failures == sum(len(c) % 2 for c in calls[16:80])


def test_nonfinite_guard_stops_the_run_and_keeps_the_last_checkpoint(tmp_path, monkeypatch):
  cfg = _cfg(tmp_path, "nan", STEPS, "run.ckpt_every=1", "run.max_nonfinite_steps=2", "run.eval_every=0")
  real = loop.score_rollout

  def poisoned(task, rollout, prompt_len, refs, cfg_, pool=None):
    rewards, stats = real(task, rollout, prompt_len, refs, cfg_, pool)
    poisoned.calls += 1  # call 1 is the evaluation before RL
    return (rewards * np.nan if poisoned.calls > 3 else rewards), stats  # steps 2, 3, ... give NaN advantages

  poisoned.calls = 0
  monkeypatch.setattr(loop, "score_rollout", poisoned)
  with pytest.raises(L.NonFiniteError, match="2 consecutive"):
    train(cfg, progress=False, export=False)
  ck = L.Checkpointer(tmp_path / "nan" / "checkpoints")
  assert ck.latest_step() == 3  # steps 0, 1 applied; step 2 skipped (saved, unchanged); step 3 raised
  state = loop.restore_run(cfg)[1]
  assert int(state.skipped) == 1
  assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree_util.tree_leaves(state.params))
  rl = [x for x in read_metrics(tmp_path / "nan" / "metrics.jsonl") if x["phase"] == "rl"]
  assert [x["skipped"] for x in rl] == [0.0, 0.0, 1.0]


# format_reward: well-formed wrong answers score 0.5, so that even the barely warmed-up model gets non-zero
# advantages and its weights move between steps.
OFF = (STEPS, "run.eval_every=2", "task.format_reward=0.5")
# The sampler on device 7, generating step k + 1 in a thread while the learner (device 0) trains on step k. One
# sampler device, so that its programs are the colocated run's (a tensor-parallel sampler sums its matmuls in
# another order: μ then moves by ulps; tokens need not stay the same).
ASYNC = ("run.async_rollouts=true", "run.placement=disaggregated", "sampler.mesh=[1,1]")


@pytest.fixture(scope="module")
def off_policy_run(tmp_path_factory):
  """The synchronous one-step off-policy run, everything on the learner's device."""
  return train(_cfg(tmp_path_factory.mktemp("off"), "off", *OFF, "run.off_policy=true"), progress=False, export=False)


def test_off_policy_generates_with_the_previous_weights(off_policy_run):
  r = off_policy_run
  assert [x["policy_lag"] for x in r.records] == [0, 1, 1, 1]
  # one-step-stale μ: the mismatch is the size of one update, far above the QAT round-off of step 0
  assert r.records[1]["mismatch/prob_abs_diff_mean"] > 100 * max(r.records[0]["mismatch/prob_abs_diff_mean"], 1e-9)


def _numbers(rec):
  """A record without its clock readings (times, rates, the timeline)."""
  return {k: v for k, v in rec.items() if not k.startswith("time/") and k != "tokens_per_s"}


@pytest.fixture(scope="module")
def async_run(tmp_path_factory):
  return train(_cfg(tmp_path_factory.mktemp("async"), "async", *OFF, *ASYNC), progress=False, export=False)


def test_async_disaggregated_rollouts_equal_the_synchronous_off_policy_run(async_run, off_policy_run):
  """Step k + 1 generated on the sampler's own devices while the learner trains on step k gives the synchronous
  off-policy run's numbers bit for bit (the same weights version per step, the same keys); only the timeline
  changes: step k + 1's generation starts before step k's learning ends."""
  a, b = async_run, off_policy_run
  for x, y in zip(a.records, b.records):
    assert _numbers(x) == _numbers(y), {k: (v, y.get(k)) for k, v in _numbers(x).items() if v != y.get(k)}
  assert a.accuracy_before == b.accuracy_before and a.accuracy_after == b.accuracy_after
  assert [x["policy_lag"] for x in a.records] == [0, 1, 1, 1]
  recs = a.records
  for k in range(len(recs) - 1):
    assert recs[k + 1]["time/sample_start"] < recs[k]["time/learn_end"], k
  assert all(x["sync/bytes"] > 0 and x["time/sync_transfer_s"] >= 0 for x in recs)
  assert all(x["time/sync_transfer_s"] == 0 for x in b.records)  # no sampler mesh: nothing moves
  assert M.timeline_overlap(a.records)["overlap_frac"] > 0 == M.timeline_overlap(b.records)["overlap_frac"]


def test_a_failing_sampler_stops_the_run_with_the_step_and_resume_continues(tmp_path, monkeypatch, async_run):
  """The sampler raising while it generates step 2 (in its thread, beside the learner's step 1): the run stops with
  a `SamplerError` naming the step, the checkpoint of step 2 is intact, and --resume finishes the run as the
  uninterrupted one did."""
  cfg = _cfg(tmp_path, "fault", *OFF, *ASYNC, "run.ckpt_every=1")
  real = loop._sample

  def flaky(k, *args, **kw):
    if k == 2:
      raise OSError("sampler host lost")
    return real(k, *args, **kw)

  monkeypatch.setattr(loop, "_sample", flaky)
  with pytest.raises(
    loop.SamplerError, match=r"the sampler failed on RL step 2 \(weights version 1\): OSError: sampler"
  ):
    train(cfg, progress=False, export=False)
  ck = L.Checkpointer(tmp_path / "fault" / "checkpoints", save_every=1)
  assert ck.latest_step() == 2 and (tmp_path / "fault" / "offpolicy_2.npz").is_file()  # + the weights step 2 uses
  ck.close()
  monkeypatch.setattr(loop, "_sample", real)
  r = train(cfg, resume=True, progress=False, export=False)
  assert [_numbers(x) for x in r.records] == [_numbers(x) for x in async_run.records[2:]]
  assert r.accuracy_after == async_run.accuracy_after


def test_async_rollouts_two_steps_stale_resume_with_the_weights_they_held(tmp_path):
  """run.max_staleness=2: step k generates with the weights synced at step k − 2 (policy lag 0, 1, 2, 2); the
  checkpoint keeps both weights the next steps need, with their versions, and a resume after an interruption gives
  the uninterrupted run's numbers."""
  extra = (*OFF, *ASYNC, "run.max_staleness=2", "run.ckpt_every=2")
  full = train(_cfg(tmp_path, "full", *extra), progress=False, export=False)
  assert [x["policy_lag"] for x in full.records] == [0, 1, 2, 2]
  assert all(x["stale_dropped"] == 0 for x in full.records)
  cfg = _cfg(tmp_path, "b", *extra)
  with pytest.raises(KeyboardInterrupt):
    train(cfg, progress=False, export=False, _fail_after=2)
  assert json.loads((tmp_path / "b" / "offpolicy_2.json").read_text()) == {"versions": [0, 1]}
  resumed = train(cfg, resume=True, progress=False, export=False)
  assert [_numbers(x) for x in resumed.records] == [_numbers(x) for x in full.records[2:]]


@pytest.mark.parametrize(
  "override,message",
  [
    ("learner.lrr=1", "valid keys in learner"),
    ("run.steps=abc", "override run.steps=abc: run.steps='abc' must be an int"),  # named as the override it was
    ("quant.sampler=int3", "one of bf16, int4, fp8, nvfp4, mxfp8"),
    ("learner.correction.clip_c=0.5", "learner.correction.clip_c=0.5 must be > 1"),  # the key as typed
  ],
)
def test_cli_config_errors_exit_2_with_the_valid_choices(override, message, capsys):
  assert cli.train_main([QS, override]) == 2
  err = capsys.readouterr().err
  assert "config error" in err and message in err


def test_cli_suggests_the_command_meant(capsys):
  from lrl_jax.cli import main  # noqa: PLC0415  (the top-level command)

  assert main(["trian", "configs/quickstart.yaml"]) == 2
  assert "unknown command 'trian' (did you mean 'train'?)" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["train", "eval", "export", "demo", "numerics"])
def test_every_command_help_gives_an_example(command, capsys):
  from lrl_jax.cli import main  # noqa: PLC0415

  try:
    rc = main([command, "--help"])
  except SystemExit as e:  # argparse's --help exits 0
    rc = e.code
  out = capsys.readouterr().out
  assert rc == 0 and f"lrl-jax {command}" in out and "Example" in out, out


def test_top_level_help_lists_every_command(capsys):
  from lrl_jax.cli import _COMMANDS, main  # noqa: PLC0415

  with pytest.raises(SystemExit) as e:
    main(["--help"])
  out = capsys.readouterr().out
  assert e.value.code == 0 and all(c in out for c in _COMMANDS), out


def test_cli_missing_config_file_exits_2(capsys, tmp_path):
  assert cli.train_main([str(tmp_path / "nope.yaml")]) == 2
  assert "not found" in capsys.readouterr().err


@pytest.mark.slow
def test_sharded_learner_mesh_runs_the_loop(tmp_path):
  """The default mesh (-1, 1, 1) on the 8 simulated devices: data-parallel learner, same loop."""
  cfg = load_config(
    QS,
    [x for x in SMALL if not x.startswith("learner.mesh")]
    + [f"run.out_dir={tmp_path / 'mesh'}", "run.steps=2", "run.eval_every=0"],
  )
  assert jax.device_count() == 8
  r = train(cfg, progress=False, export=False)
  assert r.steps == 2 and r.mismatch_mean < 1e-4
  single = train(_cfg(tmp_path, "single", "run.steps=2", "run.eval_every=0"), progress=False, export=False)
  for a, b in zip(r.records, single.records):
    assert a["reward_mean"] == b["reward_mean"]
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-7)


@pytest.mark.slow
def test_minibatches_corrections_kl_and_ppo_paths(tmp_path):
  """K = 2 minibatches x 2 micro-batches with TIS and a KL reference; then PPO + QAE (critic, GAE)."""
  r = train(
    _cfg(
      tmp_path,
      "mb",
      "run.steps=2",
      "run.eval_every=0",
      "learner.minibatches=2",
      "learner.micro_batches=2",
      "learner.correction.method=tis",
      "learner.kl_coef=0.01",
      "task.format_reward=0.5",
    ),
    progress=False,
    export=False,
  )
  for rec in r.records:
    for k in ("correction/weight_mean", "kl_ref", "mismatch/prob_abs_diff_mean", "loss"):
      assert rec[k] is not None and math.isfinite(rec[k]), k
  assert L.Checkpointer(r.out_dir / "checkpoints").latest_step() == 4  # 2 updates per RL step
  cfg = load_config(
    "configs/ppo_qae.yaml",
    SMALL + [f"run.out_dir={tmp_path / 'ppo'}", "run.steps=2", "run.eval_every=0", "task.format_reward=0.5"],
  )
  r = train(cfg, progress=False, export=False)
  for rec in r.records:
    assert math.isfinite(rec["value/loss"]) and math.isfinite(rec["loss"])


def _char_hf_checkpoint(path):
  """A tiny Qwen2 HF checkpoint with a character-level `tokenizers` tokenizer (EOS <|im_end|>)."""
  import tokenizers
  from tokenizers import Regex, decoders, pre_tokenizers
  from tokenizers import models as tm

  chars = "0123456789+-*=x; "
  vocab = {"<pad>": 0, "<|im_end|>": 1, "<unk>": 2, **{c: 3 + i for i, c in enumerate(chars)}}
  backend = tokenizers.Tokenizer(tm.WordLevel(vocab, unk_token="<unk>"))
  backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
  backend.decoder = decoders.Fuse()
  backend.add_special_tokens(["<pad>", "<|im_end|>"])
  mcfg = models.ModelConfig(
    arch="qwen2",
    vocab_size=len(vocab),
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    tie_word_embeddings=True,
  )
  params = models.init_params(mcfg, jax.random.PRNGKey(0))
  tok = models.Tokenizer(backend=backend, eos_ids=(1,), pad_id=0)
  return models.save_hf(path, mcfg, params, tokenizer=tok)


@pytest.mark.slow
def test_hf_checkpoint_source_runs_the_loop(tmp_path):
  """model.source=hf:<dir>: the model, its tokenizer and a plain-text task encoder come from the directory."""
  d = _char_hf_checkpoint(tmp_path / "hf")
  cfg = load_config(
    QS,
    SMALL
    + [
      f"model.source=hf:{d}",
      f"run.out_dir={tmp_path / 'run'}",
      "run.steps=2",
      "run.eval_every=0",
      "task.format_reward=0.5",
    ],
  )
  r = train(cfg, progress=False)
  assert r.steps == 2 and all(math.isfinite(x["loss"]) for x in r.records)
  assert (r.out_dir / "export_int4" / "tokenizer.json").is_file()
  _, loaded, _ = models.load_compressed_tensors(r.out_dir / "export_int4")
  assert loaded["embed"]["embedding"].shape == (20, 64)


def test_a_fresh_run_replaces_the_previous_runs_checkpoints(tmp_path):
  cfg = _cfg(tmp_path, "again", STEPS, "run.ckpt_every=1", "run.eval_every=0")
  train(cfg, progress=False, export=False)
  assert L.Checkpointer(tmp_path / "again" / "checkpoints").all_steps() == [2, 3, 4]  # the newest 3 are kept
  # the same directory, checkpointed only at the end: kept stale steps would show (and block a save at 4); without
  # --overwrite (or --resume) the directory is refused (tests/rl/test_rundir.py)
  again = load_config(QS, SMALL + [f"run.out_dir={tmp_path / 'again'}", STEPS, "run.eval_every=0"])
  with pytest.raises(ConfigError, match="already holds a run"):
    train(again, progress=False, export=False)
  r = train(again, overwrite=True, progress=False, export=False)
  assert L.Checkpointer(tmp_path / "again" / "checkpoints").all_steps() == [4]
  assert [x["step"] for x in read_metrics(r.paths["metrics"]) if x["phase"] == "rl"] == [0, 1, 2, 3]


@pytest.mark.parametrize(
  "over, match",
  [
    (
      ["run.async_rollouts=true", "dapo.dynamic_sampling=true"],
      "run.async_rollouts with dapo.dynamic_sampling across processes is not built \\(process 1 of 2\\)",
    ),
    (["learner.mesh=[1,1,1]"], r"learner.mesh=\(1, 1, 1\) must span all 8 devices of the 2 processes"),
    (["run.batch_prompts=3"], "run.batch_prompts = 3 does not split across 2 processes"),
    (["sampler.mesh=[1,4]"], "a colocated sampler mesh of its own \\(sampler.mesh\\) across processes is not built"),
    # the learner's and the sampler's devices must lie in one process each (rl.roles): here all 8 are process 0's
    (
      ["sampler.mesh=[1,4]", "run.placement=disaggregated"],
      r"puts the learner's devices in process\(es\) \[0\] and the sampler's in \[0\]: built is one process each",
    ),
  ],
)
def test_train_across_processes_refuses_what_is_not_built_before_writing(tmp_path, monkeypatch, over, match):
  """Across processes (`rl.procs`; the real 2-process run: test_multiprocess_train.py) the modes not built there get
  a named error naming the process, before anything is written."""
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(jax, "process_index", lambda: 1)
  cfg = load_config(QS, [*over, f"run.out_dir={tmp_path / 'run'}"])
  with pytest.raises((NotImplementedError, ValueError), match=match):
    train(cfg, progress=False)
  assert not (tmp_path / "run").exists()
