"""A run directory's safety rules: what `train` may do to `run.out_dir` before it has built anything.

* Nothing is written until the run's model, task and learner are built: a start that fails (a mistyped
  `model.source`, a shape that does not fit) leaves the directory as it was. `config.yaml` is written whole (a
  temporary file renamed into place).
* A directory that already holds a run (a checkpoint or metrics) is continued with `resume=True` or replaced with
  `overwrite=True`; otherwise `train` refuses, naming what is there. `resume=True` without a checkpoint refuses too.
* A resume compares the new config with the saved one. A change to what the checkpoint *is* (model, formats,
  task, learner numerics, sampler, seed, batch: anything not listed in `RESUMABLE`) is refused, naming each key
  with its saved and new value; a change that only steers the rest of the run (more steps, other evaluation or
  checkpoint cadence, ...) is allowed, printed and appended to `config_history.jsonl`.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lrl_jax.config import ConfigError, load_config

__all__ = [
  "RESUMABLE",
  "CHECKPOINT_KEYS",
  "existing_run",
  "config_changes",
  "checkpoint_mismatch",
  "check_run_dir",
  "write_config",
  "clear_run",
  "save_tree",
  "load_tree",
]

# Keys a resumed run may change: they steer what is left of the run, not what the checkpoint holds. (run.steps
# also sets a cosine schedule's length: the learning rate of the steps still to come follows the new length.)
RESUMABLE = frozenset(
  {
    "run.steps",
    "run.eval_every",
    "run.ckpt_every",
    "run.max_nonfinite_steps",
    "run.out_dir",
    "run.warmup_cache",
    "run.max_staleness",
    "task.eval_size",
    "task.reward_timeout_s",
    "task.transfer_digits",
    "sampler.eval_temperature",
    "sampler.slots",
  }
)


# Keys (dotted prefixes) that decide what a run's checkpoint holds and how its served weights follow from it: `eval`
# and `export` refuse a config that differs from the run's own on one of them (the rest -- served format, group size,
# eval set, sampling -- are evaluation choices).
CHECKPOINT_KEYS = (
  "model.",
  "learner.lora",
  "learner.opt_state_",
  "learner.value.",
  "learner.policy_loss",
  "quant.learner",
  "quant.int4_scheme",
  "quant.int4_zero_point",
)


def _flat(d: dict, prefix: str = "") -> dict[str, Any]:
  out = {}
  for k, v in d.items():
    key = f"{prefix}{k}"
    if isinstance(v, dict):
      out.update(_flat(v, key + "."))
    else:
      out[key] = v
  return out


def config_changes(old, new) -> dict[str, tuple[Any, Any]]:
  """{dotted key: (old value, new value)} of every key the two configs disagree on."""
  a, b = _flat(old.to_dict()), _flat(new.to_dict())
  return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def checkpoint_mismatch(run: Path, cfg) -> str | None:
  """None if `cfg` agrees with the run directory's own config.yaml on every `CHECKPOINT_KEYS` key (or the run has
  none), else one line naming each differing key with the run's and the given value."""
  saved_path = Path(run) / "config.yaml"
  if not saved_path.is_file():
    return None
  bad = {k: v for k, v in config_changes(load_config(saved_path), cfg).items() if k.startswith(CHECKPOINT_KEYS)}
  if not bad:
    return None
  listed = "; ".join(f"{k}: the run's {a!r}, given {b!r}" for k, (a, b) in bad.items())
  return f"the config differs from {saved_path} in what the checkpoint holds ({listed}); drop those overrides"


def existing_run(out: Path) -> dict[str, Any]:
  """What a directory holds of an earlier run: {"checkpoints": [steps], "metrics": bool, "config": bool}."""
  ck = out / "checkpoints"
  steps = sorted(int(p.name) for p in ck.iterdir() if p.is_dir() and p.name.isdigit()) if ck.is_dir() else []
  metrics = out / "metrics.jsonl"
  return {
    "checkpoints": steps,
    "metrics": metrics.is_file() and metrics.stat().st_size > 0,
    "config": (out / "config.yaml").is_file(),
  }


def check_run_dir(cfg, *, resume: bool, overwrite: bool) -> dict[str, tuple[Any, Any]]:
  """Refuses (ConfigError, one line) what `train` must not do to `cfg.run.out_dir`; returns a resume's allowed
  config changes. Reads only."""
  out = Path(cfg.run.out_dir)
  have = existing_run(out) if out.is_dir() else {"checkpoints": [], "metrics": False, "config": False}
  if resume and overwrite:
    raise ConfigError("train: resume and overwrite exclude each other (continue the run, or replace it)")
  if resume:
    if not have["checkpoints"]:
      raise ConfigError(f"--resume: no checkpoint in {out / 'checkpoints'}; start the run without --resume")
    if not have["config"]:
      raise ConfigError(f"--resume: {out / 'config.yaml'} is missing: the saved run's config cannot be compared")
    saved = load_config(out / "config.yaml")
    changes = config_changes(saved, cfg)
    bad = {k: v for k, v in changes.items() if k not in RESUMABLE}
    if bad:
      listed = "; ".join(f"{k}: saved {a!r}, now {b!r}" for k, (a, b) in bad.items())
      raise ConfigError(
        f"--resume of {out}: the config changes what the checkpoint holds ({listed}); only "
        f"{', '.join(sorted(RESUMABLE))} may change on a resume (start a new run directory for the rest)"
      )
    return changes
  if (have["checkpoints"] or have["metrics"]) and not overwrite:
    what = f"checkpoints at steps {have['checkpoints']}" if have["checkpoints"] else "metrics.jsonl"
    raise ConfigError(
      f"run directory {out} already holds a run ({what}): pass --resume to continue it, or --overwrite to replace it"
    )
  return {}


def clear_run(out: Path) -> None:
  """Removes an earlier run's outputs from `out` (an overwrite): its checkpoints and the files a run writes."""
  shutil.rmtree(out / "checkpoints", ignore_errors=True)
  shutil.rmtree(out / "tb", ignore_errors=True)
  for f in [*out.glob("offpolicy_*.npz"), *out.glob("offpolicy_*.json")]:
    f.unlink(missing_ok=True)
  for name in (
    "metrics.jsonl",
    "pre_rl.json",
    "ref_params.npz",
    "config_history.jsonl",
    "eval_before.jsonl",
    "eval_after.jsonl",
  ):
    (out / name).unlink(missing_ok=True)


def write_config(cfg, out: Path, changes: dict[str, tuple[Any, Any]] | None = None, *, step: int | None = None):
  """config.yaml written whole (temporary file, then rename); a resume's changes appended to config_history.jsonl."""
  tmp = out / f".config.yaml.tmp-{os.getpid()}"
  cfg.dump_yaml(tmp)
  tmp.replace(out / "config.yaml")
  if changes:
    with open(out / "config_history.jsonl", "a", encoding="utf-8") as f:
      f.write(json.dumps({"resumed_at_rl_step": step, "changes": {k: list(v) for k, v in changes.items()}}) + "\n")


def save_tree(path: Path, tree) -> None:
  """The leaves of `tree` in one .npz, written whole (a temporary file renamed into place)."""
  leaves = jax.tree_util.tree_leaves(tree)
  tmp = path.with_name(path.name + ".tmp")
  with open(tmp, "wb") as f:
    np.savez(f, *[np.asarray(x) for x in leaves])
  tmp.replace(path)


def load_tree(path: Path, like):
  """`save_tree`'s leaves in `like`'s structure and dtypes (.npz stores bfloat16 / float8 as raw bytes).

  Raises ValueError naming the file when its leaves do not match `like`'s count or shapes (no partial load)."""
  like_leaves = jax.tree_util.tree_leaves(like)
  with np.load(path) as data:
    if len(data.files) != len(like_leaves):
      raise ValueError(f"{path}: holds {len(data.files)} arrays; the tree to load into has {len(like_leaves)} leaves")
    leaves = []
    for i, x in enumerate(like_leaves):
      a = data[f"arr_{i}"].view(np.dtype(x.dtype))
      if a.shape != tuple(x.shape):
        raise ValueError(f"{path}: array {i} has shape {a.shape}; the tree to load into has {tuple(x.shape)} there")
      leaves.append(jnp.asarray(a))
  return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(like), leaves)
