"""Recovery before RL: distil the float model into its own QAT-quantized copy (`run.recover_steps`).

A pretrained model served in INT4 loses accuracy (SmolLM2-135M-Instruct, INT4 g64: about a third of its bf16
2-digit accuracy), so RL on it would first spend its steps re-learning what quantization broke. Here the float
model (the teacher, frozen: the starting parameters in the learner's compute dtype, no QAT) samples completions
of the task's training prompts (no rewards or references are used), and the learner's QAT forward (the student:
the same masters, fake-quantized as the sampler will serve them) is trained to match the teacher's whole next-token
distribution at every generated position: `losses.distill_kl`, forward KL(p_teacher ‖ p_student), token mean.
Sequence-level distillation on the teacher's samples (Kim & Rush 2016) with soft targets (Hinton et al. 2015).

Each step: batch i of the training split (`run.batch_prompts` prompts × `sampler.group_size` teacher samples, at
`sampler.temperature`), one AdamW update at the constant `run.recover_lr` (default `learner.lr`) with a fresh
optimizer state (the RL optimizer starts after it). Every `run.recover_eval_every` steps the served weights are
evaluated (greedy, the eval split) and logged with phase "recover": the recovery curve.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import optax
from tqdm.auto import tqdm

from lrl_jax import learner as L
from lrl_jax import losses
from lrl_jax.rl import metrics as M
from lrl_jax.rl.rollouts import encode_prompt_batch, generate_rollout
from lrl_jax.rl.sync import SyncSpec, sync
from lrl_jax.rl.warmup import NonFiniteCounter, keep_if_finite

__all__ = ["recover", "recover_learner_config"]


def recover_learner_config(cfg) -> L.LearnerConfig:
  """The student's settings: `cfg.learner` with QAT fully on, at the constant `run.recover_lr`, temperature 1 (the
  distributions themselves are matched), one update per batch."""
  return cfg.learner.replace(
    lr=cfg.run.recover_lr or cfg.learner.lr,
    schedule="constant",
    warmup_steps=0,
    total_steps=None,
    minibatches=1,
    micro_batches=1,
    qat_start_step=0,
    qat_warmup_steps=0,
    temperature=1.0,
    correction=L.CorrectionConfig(),
    value=L.ValueConfig(),  # no critic is trained here (its own optimizer would expect a value head)
  )


@functools.partial(jax.jit, static_argnames=("model_cfg", "lcfg"), donate_argnums=(0, 1))
def _recover_step(params, opt_state, teacher, rollout, *, model_cfg, lcfg):
  tx = L.make_optimizer(lcfg)
  t_logits, has = L.completion_logits(teacher, rollout, model_cfg, cfg=lcfg.without_qat())
  mask = has & rollout.loss_mask[:, rollout.prompt_len :]

  def loss_fn(p):
    s_logits, _ = L.completion_logits(p, rollout, model_cfg, cfg=lcfg)
    return losses.distill_kl(s_logits, t_logits, mask)

  (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  updates, new_opt = tx.update(grads, opt_state, params)
  out = losses.finalize_metrics(metrics)
  out["grad_norm"] = optax.tree.norm(grads)
  (params, opt_state), ok = keep_if_finite(
    loss, grads, (optax.apply_updates(params, updates), new_opt), (params, opt_state)
  )
  out["skipped"] = (~ok).astype(jnp.float32)
  return params, opt_state, {k: jnp.asarray(v, jnp.float32) for k, v in out.items()}


def recover(cfg, setup, params, *, logger: M.MetricsLogger | None = None, progress: bool = True, evaluate=None):
  """`run.recover_steps` distillation steps of the QAT student towards the float teacher (module docstring).

  Args:
    cfg: the run config (`quant.learner` set, full fine-tuning: the config checks both).
    setup: the run's `Setup`.
    params: the starting float parameters: the teacher, and the student's initial masters.
    logger: metrics go here (phase "recover").
    evaluate: `evaluate(served_tree) -> dict` for the recovery curve (every `run.recover_eval_every` steps), or None.

  Returns:
    The student's parameters (float masters).
  """
  steps = cfg.run.recover_steps
  if steps == 0:
    return params
  lcfg = recover_learner_config(cfg)
  params = jax.tree_util.tree_map(lambda x: jnp.array(x, jnp.float32), params)
  teacher = jax.tree_util.tree_map(jnp.copy, params)  # frozen (the student's masters are donated to each step)
  teacher_served = sync(params, SyncSpec(rules=None, dtype=setup.sync.dtype, layout=setup.sync.layout))
  opt_state = L.make_optimizer(lcfg).init(params)
  key = jax.random.fold_in(jax.random.PRNGKey(cfg.run.seed), 3)
  G, every = cfg.sampler.group_size, cfg.run.recover_eval_every
  bar = tqdm(range(steps), desc="recovery (distillation)", disable=not progress, leave=False, dynamic_ncols=True)
  guard = NonFiniteCounter("QAT recovery (run.recover_lr)", cfg.run.max_nonfinite_steps)
  for i in bar:
    if evaluate is not None and every and i % every == 0:
      if logger is not None:
        logger.log(i, evaluate(sync(params, setup.sync)), phase="recover")
    t0 = time.perf_counter()
    prompts, _ = setup.task.prompts(i, cfg.run.batch_prompts)
    tok, val = encode_prompt_batch(setup.task, prompts)
    roll = generate_rollout(
      teacher_served, tok, val, setup, cfg, jax.random.fold_in(key, i), evaluation=False, group_size=G
    )
    t_gen = time.perf_counter() - t0
    params, opt_state, m = _recover_step(params, opt_state, teacher, roll, model_cfg=setup.model_cfg, lcfg=lcfg)
    m = {k: float(v) for k, v in jax.device_get(m).items()}
    guard.check(float("nan") if m["skipped"] else m["distill_kl"], i)  # a skipped step left the student as it was
    m.update({"time/generate_s": t_gen, "time/step_s": time.perf_counter() - t0})
    bar.set_postfix(kl=f"{m['distill_kl']:.3f}", agree=f"{m['distill_top1_agree']:.2f}")
    if logger is not None:
      logger.log(i, m, phase="recover")
  bar.close()
  return params
