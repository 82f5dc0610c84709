"""lrl_jax.rl — the RL loop: weight sync, rollout buffer, warm-up, train / evaluate, metrics, CLI commands.

`train(cfg)` runs a whole job from a `lrl_jax.config.Config` (warm-up, RL steps, evaluation,
checkpoints, plots, summary, export); `sync(params, cfg)` is the per-step weight sync to the
low-bit sampler; `RolloutBuffer` holds the step's `Rollout` on device and hands out minibatch rows. Across
JAX processes every process runs `train` with the same config (`rl.procs`).
"""

from lrl_jax.rl.buffer import OffPolicyQueue, RolloutBuffer, minibatch_rows
from lrl_jax.rl.loop import RunResult, SamplerError, encode_prompt_batch, evaluate, restore_run, train
from lrl_jax.rl.metrics import MetricsLogger, plot_run, read_metrics, smoothness, timeline_overlap, write_summary
from lrl_jax.rl.setup import Setup, build_model, learner_mesh, new_state, sampler_mesh
from lrl_jax.rl.sync import SyncSpec, merge_lora, sync, sync_spec
from lrl_jax.rl.warmup import supervised_warmup

__all__ = [
  "sync",
  "sync_spec",
  "SyncSpec",
  "merge_lora",
  "RolloutBuffer",
  "OffPolicyQueue",
  "minibatch_rows",
  "train",
  "evaluate",
  "supervised_warmup",
  "encode_prompt_batch",
  "restore_run",
  "RunResult",
  "SamplerError",
  "learner_mesh",
  "sampler_mesh",
  "Setup",
  "build_model",
  "new_state",
  "MetricsLogger",
  "read_metrics",
  "plot_run",
  "write_summary",
  "smoothness",
  "timeline_overlap",
]
