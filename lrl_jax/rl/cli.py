"""The `lrl-jax train | eval | export` commands (wired into `lrl_jax.cli`).

  lrl-jax train configs/x.yaml [section.key=value ...] [--resume | --overwrite]
  lrl-jax eval configs/x.yaml [section.key=value ...] [--run DIR] [--compressed DIR] [--size N]
  lrl-jax export --format int4|nvfp4|hf RUN_OR_CKPT OUT_DIR [--group-size G]

Exit codes: 0 success; 2 a config error (the `ConfigError` message, which lists the valid keys or
choices), a missing file or no intact checkpoint; 3 the run stopped on non-finite learner steps; 1 anything else
(one line naming what failed; `LRL_JAX_DEBUG=1` shows the traceback).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import os
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

from lrl_jax import models
from lrl_jax.config import ConfigError, describe, load_config
from lrl_jax.learner import CheckpointError, NonFiniteError, initialize_distributed
from lrl_jax.rl.loop import evaluate, restore_run, served_weights, train
from lrl_jax.rl.rundir import checkpoint_mismatch
from lrl_jax.rl.setup import build_model
from lrl_jax.rl.sync import merge_lora

__all__ = ["train_main", "eval_main", "export_main"]

EXIT_ERROR = 1
EXIT_CONFIG = 2
EXIT_NONFINITE = 3


def _load(prog: str, path, overrides):
  """(Config, None) or (None, exit code) after printing the error."""
  try:
    return load_config(path, list(overrides)), None
  except ConfigError as e:
    print(f"{prog}: config error: {e}", file=sys.stderr)
    return None, EXIT_CONFIG
  except FileNotFoundError as e:
    print(f"{prog}: {e}", file=sys.stderr)
    return None, EXIT_CONFIG


def _parse(p: argparse.ArgumentParser, argv, prog: str, missing: str):
  """(args, Config, None) to go on, or (args, None, exit code): --help-config printed, or a config error."""
  args = p.parse_intermixed_args(argv)  # overrides before or after the flags
  if args.help_config:
    print(describe())
    return args, None, 0
  if args.config is None:
    p.error(missing)
  cfg, err = _load(prog, args.config, args.overrides)
  return args, cfg, err


def _config_parser(prog: str, description: str) -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog=prog, description=description)
  p.add_argument("config", nargs="?", help="YAML config file (configs/*.yaml)")
  p.add_argument("overrides", nargs="*", metavar="section.key=value", help="overrides, e.g. learner.lr=3e-4")
  p.add_argument("--help-config", action="store_true", help="list every config key with its type and default")
  return p


def _one_line_errors(prog: str):
  """A command's unexpected error as one line on stderr and exit 1 (a bad file, a mismatched checkpoint: the message
  names it); `LRL_JAX_DEBUG=1` re-raises it with its traceback (and keeps the libraries' own error logs)."""

  def wrap(fn):
    @functools.wraps(fn)
    def run(argv: list[str] | None = None) -> int:
      if not os.environ.get("LRL_JAX_DEBUG"):
        # orbax logs what it cannot parse through absl before raising: the error this command reports says it
        logging.getLogger("absl").setLevel(logging.CRITICAL)
      try:
        return fn(argv)
      except (KeyboardInterrupt, SystemExit):
        raise
      except Exception as e:  # noqa: BLE001  (the one-line report is the point)
        if os.environ.get("LRL_JAX_DEBUG"):
          raise
        first = (str(e).strip().splitlines() or [""])[0][:400]
        print(f"{prog}: {type(e).__name__}: {first} (LRL_JAX_DEBUG=1 shows the traceback)", file=sys.stderr)
        return EXIT_ERROR

    return run

  return wrap


@_one_line_errors("lrl-jax train")
def train_main(argv: list[str] | None = None) -> int:
  """`lrl-jax train CONFIG [section.key=value ...] [--resume | --overwrite] [--no-progress] [--no-export]`."""
  p = _config_parser(
    "lrl-jax train",
    "Run an RL job: warm-up, RL steps, evaluation, checkpoints, plots. Example: `lrl-jax train "
    "configs/smollm2_grpo.yaml run.steps=60 learner.lr=1e-5`, then `lrl-jax train configs/smollm2_grpo.yaml "
    "run.steps=90 --resume` to go on (`--help-config` lists every key).",
  )
  p.add_argument(
    "--resume",
    action="store_true",
    help="continue the run in run.out_dir from its newest intact checkpoint; refused without one, or when the "
    "config changes what the checkpoint holds (only steps, evaluation and checkpoint cadence and the like may change)",
  )
  p.add_argument(
    "--overwrite",
    action="store_true",
    help="replace the run already in run.out_dir (without --resume or --overwrite, a directory holding a run is "
    "refused, so that no run's checkpoints are lost to a forgotten flag)",
  )
  p.add_argument("--no-progress", action="store_true", help="no progress bars")
  p.add_argument("--no-export", action="store_true", help="skip the compressed-tensors export at the end")
  args, cfg, err = _parse(p, argv, "lrl-jax train", "a config file is required (e.g. configs/quickstart.yaml)")
  if cfg is None:
    return err
  logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
  # one process per host: joins the others when LRL_JAX_COORDINATOR / _NUM_PROCESSES / _PROCESS_ID (or a cluster
  # JAX detects) say so, before any device is touched (learner/multihost.py); otherwise nothing happens
  initialize_distributed()
  print(
    f"lrl-jax train {args.config}: model {cfg.model.source}, learner {cfg.quant.learner} / sampler "
    f"{cfg.quant.sampler}, {cfg.learner.policy_loss} + {cfg.learner.correction.method}; "
    f"{cfg.run.sft_steps} warm-up + {cfg.run.steps} RL steps -> {cfg.run.out_dir}",
    flush=True,
  )
  try:
    r = train(
      cfg, resume=args.resume, overwrite=args.overwrite, progress=not args.no_progress, export=not args.no_export
    )
  except NonFiniteError as e:
    print(f"lrl-jax train: stopped: {e}", file=sys.stderr)
    return EXIT_NONFINITE
  except ConfigError as e:
    print(f"lrl-jax train: config error: {e}", file=sys.stderr)
    return EXIT_CONFIG
  except (CheckpointError, FileNotFoundError) as e:
    print(f"lrl-jax train: {e}", file=sys.stderr)
    return EXIT_CONFIG
  if r.accuracy_before is not None and r.accuracy_after is not None:
    print(
      f"accuracy before RL {100 * r.accuracy_before:.1f}% -> after RL {100 * r.accuracy_after:.1f}% "
      f"(95% interval after: [{100 * r.eval_after.get('eval_accuracy_lo', float('nan')):.1f}, "
      f"{100 * r.eval_after.get('eval_accuracy_hi', float('nan')):.1f}] of {r.eval_after.get('eval_n', '?')}); "
      f"mean |π − μ| {r.mismatch_mean:.3g}; outputs in {r.out_dir}",
      flush=True,
    )
  return 0


@_one_line_errors("lrl-jax eval")
def eval_main(argv: list[str] | None = None) -> int:
  """`lrl-jax eval CONFIG_OR_RUN [overrides] [--run DIR] [--compressed DIR] [--size N]`: greedy accuracy of the
  served weights of a run's newest intact checkpoint (or of an exported compressed-tensors checkpoint). A run
  directory in place of the config reads the run's own config.yaml."""
  p = _config_parser(
    "lrl-jax eval",
    "Evaluate a run's newest checkpoint on the task's eval split. Example: `lrl-jax eval runs/quickstart` (the "
    "run's own config.yaml) or `lrl-jax eval configs/quickstart.yaml --run runs/quickstart --size 512`.",
  )
  p.add_argument("--run", help="run directory (default: run.out_dir of the config)")
  p.add_argument("--compressed", help="evaluate this compressed-tensors export instead (served as stored)")
  p.add_argument("--size", type=int, help="number of eval problems (default task.eval_size)")
  argv = list(sys.argv[1:] if argv is None else argv)
  i = 0
  while i < len(argv):  # a run directory in the config's place: its own config, and the run where it is
    a = argv[i]
    if a in ("--run", "--compressed", "--size"):
      i += 2  # an option's value is not the config
      continue
    if not a.startswith("-") and "=" not in a:
      if (Path(a) / "config.yaml").is_file():
        argv[i : i + 1] = [str(Path(a) / "config.yaml"), f"run.out_dir={a}"]
      break
    i += 1
  args, cfg, err = _parse(p, argv, "lrl-jax eval", "a config file (or a run directory) is required")
  if cfg is None:
    return err
  if args.size is not None and args.size < 1:
    print(f"lrl-jax eval: --size {args.size}: the number of eval problems must be >= 1", file=sys.stderr)
    return EXIT_CONFIG
  lora = None
  if args.compressed:
    if not Path(args.compressed).is_dir():
      print(f"lrl-jax eval: no such directory: {args.compressed}", file=sys.stderr)
      return EXIT_CONFIG
    setup = build_model(cfg, init=False)
    dt = setup.sampler_cfg.dtype  # served as the run's sampler serves: its compute dtype
    mcfg, served, _ = models.load_compressed_tensors(args.compressed, dtype=dt, compute_dtype=dt)
    setup = dataclasses.replace(setup, sampler_cfg=mcfg)
    what = args.compressed
  else:
    run = args.run or cfg.run.out_dir
    if not (Path(run) / "checkpoints").is_dir():
      print(f"lrl-jax eval: no checkpoints in {run} (train first, or pass --run DIR)", file=sys.stderr)
      return EXIT_CONFIG
    why = checkpoint_mismatch(Path(run), cfg)
    if why is not None:
      print(f"lrl-jax eval: {why}", file=sys.stderr)
      return EXIT_CONFIG
    try:
      setup, state = restore_run(cfg, out_dir=run)
    except CheckpointError as e:
      print(f"lrl-jax eval: {e}", file=sys.stderr)
      return EXIT_CONFIG
    if state is None:
      print(f"lrl-jax eval: no complete checkpoint in {run}/checkpoints", file=sys.stderr)
      return EXIT_CONFIG
    served, lora = served_weights(state, setup)  # as the run's own evaluations serve it
    what = f"{run} (step {int(state.step)})"
  ev = evaluate(served, setup, cfg, size=args.size, lora=lora)
  print(
    f"{what}: eval accuracy {100 * ev['eval_accuracy']:.1f}% [{100 * ev['eval_accuracy_lo']:.1f}, "
    f"{100 * ev['eval_accuracy_hi']:.1f}] (95%) on {args.size or cfg.task.eval_size} problems "
    f"(reward mean {ev['eval_reward_mean']:.3f}, mean length {ev['eval_response_len']:.1f} tokens, "
    f"sampler weights {cfg.quant.sampler})"
  )
  return 0


@_one_line_errors("lrl-jax export")
def export_main(argv: list[str] | None = None) -> int:
  """`lrl-jax export --format int4|nvfp4|hf RUN_OR_CKPT OUT_DIR`: a run's latest checkpoint as compressed-tensors,
  or (hf) as a plain float HF checkpoint of its float32 masters, which `model.source: hf:OUT_DIR` loads (e.g. a
  QAT-recovered model that several RL runs start from).

  RUN_OR_CKPT is a run directory (with config.yaml and checkpoints/) or its checkpoints/ directory.
  """
  p = argparse.ArgumentParser(
    prog="lrl-jax export",
    description="Export a run's newest intact checkpoint as compressed-tensors (INT4 / NVFP4, loadable by vLLM and "
    "SGLang) or as a float HF checkpoint. Example: `lrl-jax export --format int4 runs/quickstart out/int4`.",
  )
  p.add_argument(
    "--format", required=True, choices=["int4", "nvfp4", "hf"], help="weight format (hf: float32, no quantization)"
  )
  p.add_argument("--group-size", type=int, default=None, help="INT4 group size (default: the run's quant.group_size)")
  p.add_argument("ckpt", help="run directory (or its checkpoints/ directory)")
  p.add_argument("out_dir", help="output directory")
  args = p.parse_args(argv)
  run = Path(args.ckpt)
  if run.name == "checkpoints":
    run = run.parent
  if not (run / "config.yaml").is_file():
    print(f"lrl-jax export: {run} has no config.yaml (pass the run directory `lrl-jax train` wrote)", file=sys.stderr)
    return EXIT_CONFIG
  over = [f"run.out_dir={run}"]
  if args.group_size is not None:
    over.append(f"quant.group_size={args.group_size}")
  cfg, err = _load("lrl-jax export", run / "config.yaml", over)
  if cfg is None:
    return err
  try:
    setup, state = restore_run(cfg, out_dir=str(run))
  except CheckpointError as e:
    print(f"lrl-jax export: {e}", file=sys.stderr)
    return EXIT_CONFIG
  if state is None:
    print(f"lrl-jax export: no complete checkpoint in {run}/checkpoints", file=sys.stderr)
    return EXIT_CONFIG
  params = merge_lora(state.params, state.lora if state.trainable == "lora" else None)
  if args.format == "hf":
    path = models.save_hf(
      args.out_dir, setup.model_cfg, jax.device_get(params), dtype=jnp.float32, tokenizer=setup.tokenizer
    )
    print(f"exported {run} (step {int(state.step)}) as a float32 HF checkpoint -> {path}")
    return 0
  spec = cfg.quant.spec(args.format)
  try:
    path = models.export_compressed_tensors(
      args.out_dir,
      setup.model_cfg,
      jax.device_get(params),
      spec,
      rules=cfg.quant.rules(spec),
      dtype=jnp.bfloat16,
      tokenizer=setup.tokenizer,
    )
  except ValueError as e:
    print(f"lrl-jax export: {e}", file=sys.stderr)
    return EXIT_CONFIG
  print(f"exported {run} (step {int(state.step)}) as {args.format} compressed-tensors -> {path}")
  return 0
