"""lrl_jax.rl — the RL loop: weight sync, rollout buffer, train / evaluate, metrics, CLI commands.

`train(cfg)` runs a whole job from a `lrl_jax.config.Config` (warm-up, RL steps, evaluation,
checkpoints, plots, summary, export); `sync(params, cfg)` is the per-step weight sync to the
low-bit sampler; `RolloutBuffer` holds raw rollout data and hands the learner its batches.
"""

from lrl_jax.rl.buffer import OffPolicyQueue, RolloutBatch, RolloutBuffer
from lrl_jax.rl.loop import (RunResult, encode_prompt_batch, evaluate, gae_for_rollouts, group_advantages,
                             restore_run, supervised_warmup, train)
from lrl_jax.rl.metrics import MetricsLogger, plot_run, read_metrics, smoothness, write_summary
from lrl_jax.rl.setup import Setup, build_model, learner_config, new_state
from lrl_jax.rl.sync import SyncSpec, merge_lora, sync, sync_spec

__all__ = [
    "sync", "sync_spec", "SyncSpec", "merge_lora",
    "RolloutBatch", "RolloutBuffer", "OffPolicyQueue",
    "train", "evaluate", "supervised_warmup", "group_advantages", "gae_for_rollouts", "encode_prompt_batch",
    "restore_run", "RunResult",
    "Setup", "build_model", "learner_config", "new_state",
    "MetricsLogger", "read_metrics", "plot_run", "write_summary", "smoothness",
]
