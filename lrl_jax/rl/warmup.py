"""The supervised warm-up before RL: cross-entropy on the task's answers with the learner's optimizer and numerics.

A policy that never answers correctly gets no GRPO signal; `run.sft_steps` steps of supervised training on the
task's reference answers (+ EOS) put it at partial accuracy first. The warm-up uses the learner's AdamW at the
constant `run.sft_lr` and the learner's forward (QAT when `quant.learner` is set and not scheduled for later).
"""

from __future__ import annotations

import functools
import hashlib
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

from lrl_jax import learner as L
from lrl_jax import quant
from lrl_jax.rl import metrics as M
from lrl_jax.rl import procs
from lrl_jax.rl.rundir import load_tree, save_tree
from lrl_jax.rollout import Rollout

__all__ = [
  "supervised_warmup",
  "warmup_key",
  "prepare_qat_params",
  "warmup_learner_config",
  "keep_if_finite",
  "NonFiniteCounter",
]


def warmup_learner_config(cfg) -> L.LearnerConfig:
  """The learner settings of the warm-up: `cfg.learner` at the constant `run.sft_lr`, one batch per update, no
  correction, the critic's settings at their defaults (the warm-up trains no critic: runs that differ only there share
  a warm-up, and the critic's own optimizer, `learner.value.lr`, is not built over a tree without a value head);
  without QAT when QAT is scheduled on the RL steps (`learner.qat_start_step` / `qat_warmup_steps`)."""
  lcfg = cfg.learner.replace(
    value=L.ValueConfig(),
    lr=cfg.run.sft_lr or cfg.learner.lr,
    schedule="constant",
    warmup_steps=0,
    total_steps=None,
    minibatches=1,
    micro_batches=1,
    correction=L.CorrectionConfig(),
  )
  return lcfg.without_qat() if lcfg.qat_fades else lcfg


def prepare_qat_params(cfg, params):
  """The starting parameters under the learner's QAT options, before any step.

  `learner.qat_init=grid`: the quantized kernels are snapped to their own INT4 grid
  (`quant.int4_aware_init`; for a pretrained model that is a one-time quantization of the masters).
  `quant.int4_scheme=learned`: the learned scales (and zero points) are added next to the kernels
  (`quant.init_learned`), so that the warm-up already trains them.
  """
  lcfg = cfg.learner
  if params is None or lcfg.qat is None or lcfg.lora is not None:
    return params
  if lcfg.qat_init == "grid":
    params = quant.int4_aware_init(params, lcfg.qat_rules, dtype=jnp.dtype(lcfg.compute_dtype))
  if getattr(lcfg.qat, "learned", False):
    params = quant.init_learned(params, lcfg.qat_rules, dtype=jnp.dtype(lcfg.compute_dtype))
  return params


@functools.partial(jax.jit, static_argnames=("model_cfg", "lcfg"), donate_argnums=(0, 1))
def _sft_step(params, opt_state, tokens, valid, mask, *, model_cfg, lcfg):
  tx = L.make_optimizer(lcfg)
  zeros = jnp.zeros(tokens.shape, jnp.float32)

  def loss_fn(p):
    r = Rollout(tokens=tokens, loss_mask=mask, sampler_logp=zeros, valid=valid)
    logp = L.token_logprobs(p, r, model_cfg, cfg=lcfg)  # the learner's numerics (QAT forward when set)
    m = mask.astype(jnp.float32)
    return -jnp.sum(jnp.where(mask, logp, 0.0)) / jnp.maximum(jnp.sum(m), 1.0)

  loss, grads = jax.value_and_grad(loss_fn)(params)
  updates, new_opt = tx.update(grads, opt_state, params)
  (params, opt_state), ok = keep_if_finite(
    loss, grads, (optax.apply_updates(params, updates), new_opt), (params, opt_state)
  )
  return params, opt_state, jnp.where(ok, loss, jnp.nan)


def keep_if_finite(loss, grads, new, old):
  """(`new` when the loss and the gradient norm are finite, else `old`; that bool): the learner's NaN guard, for
  the updates before RL."""
  ok = jnp.isfinite(loss) & jnp.isfinite(optax.tree.norm(grads))
  return jax.tree_util.tree_map(lambda a, b: jnp.where(ok, a, b), new, old), ok


class NonFiniteCounter:
  """Counts non-finite updates in a row (they were skipped); raises NonFiniteError after `max_in_row`."""

  def __init__(self, what: str, max_in_row: int):
    self.what, self.max_in_row, self.in_row = what, max_in_row, 0

  def check(self, loss: float, step: int) -> None:
    """`loss`: the step's loss, NaN when the step was skipped."""
    self.in_row = 0 if math.isfinite(loss) else self.in_row + 1
    if self.in_row >= self.max_in_row:
      raise L.NonFiniteError(
        f"{self.what}: {self.in_row} consecutive steps had a non-finite loss or gradient (last at step {step}); "
        f"they were skipped and nothing was checkpointed: lower its learning rate"
      )


def _sft_batch(cfg) -> int:
  """Sequences per supervised step: `run.sft_batch`, default batch_prompts × group_size."""
  return cfg.run.sft_batch or cfg.run.batch_prompts * cfg.sampler.group_size


def warmup_key(cfg, setup, params) -> str:
  """A digest of everything the warm-up's result depends on: the starting parameters (bytes, dtypes, shapes and
  tree structure, so the model's init and the seed), the model config, the task (its data seed and settings), the
  warm-up's learner config (numerics, optimizer, learning rate), the batch size and the step count. Two runs with
  the same key train the same warm-up; the code is not part of the key (clear the cache after changing it)."""
  h = hashlib.sha256()
  n = _sft_batch(cfg)
  for part in (setup.model_cfg, warmup_learner_config(cfg), setup.task, n, cfg.run.sft_steps):
    h.update(repr(part).encode())
  h.update(str(jax.tree_util.tree_structure(params)).encode())
  for x in jax.tree_util.tree_leaves(params):
    a = np.asarray(x)
    h.update(f"{a.dtype}{a.shape}".encode())
    h.update(a.tobytes())
  return h.hexdigest()[:32]


def supervised_warmup(cfg, setup, params, *, logger: M.MetricsLogger | None = None, progress: bool = True):
  """`run.sft_steps` steps of cross-entropy on the task's answers (+ EOS) (`warmup_learner_config`); batches of
  `run.sft_batch` sequences (default: batch_prompts × group_size). Returns the params.

  With `run.warmup_cache` set, a finished warm-up is saved there under `warmup_key` and read back by any later run
  with the same key (experiment arms that differ only after the warm-up share it: the same numbers, trained once).
  """
  params = prepare_qat_params(cfg, params)
  steps = cfg.run.sft_steps
  if steps == 0:
    return params
  cached = None
  if cfg.run.warmup_cache:
    cached = Path(cfg.run.warmup_cache) / f"warmup_{warmup_key(cfg, setup, params)}.npz"
    if cached.is_file():
      like = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.float32), params)
      print(f"warm-up: read from {cached} (run.warmup_cache)", flush=True)
      return load_tree(cached, like)
  params = _train_warmup(cfg, setup, params, logger=logger, progress=progress)
  if cached is not None and procs.primary():  # across processes each trains the same warm-up; one writes
    cached.parent.mkdir(parents=True, exist_ok=True)
    save_tree(cached, params)
  return params


def _train_warmup(cfg, setup, params, *, logger, progress):
  steps = cfg.run.sft_steps
  lcfg = warmup_learner_config(cfg)
  n = _sft_batch(cfg)
  params = jax.tree_util.tree_map(lambda x: jnp.array(x, jnp.float32), params)
  opt_state = L.make_optimizer(lcfg).init(params)
  bar = tqdm(range(steps), desc="warm-up (supervised)", disable=not progress, leave=False, dynamic_ncols=True)
  guard = NonFiniteCounter("supervised warm-up (run.sft_lr)", cfg.run.max_nonfinite_steps)
  for i in bar:
    sb = setup.task.supervised_batch(i, n)
    params, opt_state, loss = _sft_step(
      params,
      opt_state,
      jnp.asarray(sb.tokens),
      jnp.asarray(sb.valid),
      jnp.asarray(sb.loss_mask),
      model_cfg=setup.model_cfg,
      lcfg=lcfg,
    )
    lv = float(loss)
    guard.check(lv, i)
    if i % 10 == 0 or i == steps - 1:
      bar.set_postfix(loss=f"{lv:.3f}")
      if logger is not None:
        logger.log(i, {"sft_loss": lv}, phase="sft")
  bar.close()
  return params
