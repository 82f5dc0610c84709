"""The learner's two jit'd functions on a `Rollout`: `prepare_rollout` (advantages, critic values and returns,
π_old, π_ref) and `train_step` (π from the (QAT) forward, policy loss + corrections, micro-batching, NaN guard).

Log-prob alignment: `token_logprobs(...)[b, t]` is log π(tokens[b, t] | the valid tokens
before it), computed from the logits at the previous *valid* position (t − 1 unless padding
sits in between); 0 where token t is padding or has no valid token before it. The sampler's
μ, the loss mask and π_old use the same alignment: position t scores token t.

Numerics (`LearnerConfig.compute_dtype`, `LearnerConfig.qat`): the fp32 masters are cast to
the compute dtype inside each matmul and *that cast* is fake-quantized (`models.decoder._matmul`,
the contract rule of `quant/aqt.py`: quantize the array the matmul sees). So with bf16 compute
the sampler must serve `quantize(w.astype(bfloat16))` — `rl.sync` quantizes the bf16 cast of
the masters, not the f32 masters. Log-probs, the entropy, the losses and the accumulated
gradients are float32.

Micro-batching: rows m, m + M, m + 2M, ... form micro-batch m (so each data shard holds a
slice of every micro-batch). The loss normaliser (`denom`: Σ mask for "token-mean", the
number of non-empty sequences otherwise) is computed on the full batch, so the micro-batch
losses and gradients *sum* to the full-batch ones; metrics are `Mean(total, count)` pairs
summed over micro-batches. Correction weights (TIS / MIS / ACRL) and the mismatch metrics
are computed on the full batch (they need batch statistics), so they are exact too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.sharding import Mesh

from lrl_jax import losses, quant
from lrl_jax.learner.adam8 import Adam8State
from lrl_jax.learner.config import LearnerConfig, ValueConfig
from lrl_jax.learner.mesh import activation_rules, batch_sharding
from lrl_jax.learner.state import (
  TrainState,
  make_optimizer,
  make_schedule,
  replace_trainable,
  state_shardings,
  trainable_params,
)
from lrl_jax.losses import Max, Mean
from lrl_jax.models import (
  ACTIVATION_AXES,
  LoadedModel,
  Lora,
  ModelConfig,
  Numerics,
  decoder,
  forward_hidden,
  forward_hidden_grouped,
  logits_from_hidden,
)
from lrl_jax.rollout import Rollout

__all__ = [
  "logprobs_from_logits",
  "logprobs_from_hidden",
  "completion_logits",
  "token_logprobs",
  "group_advantages",
  "gae_targets",
  "value_mask",
  "needs_old_logp",
  "prepare_rollout",
  "train_step",
  "learned_qat_start",
  "restarts_learned_scales",
  "NonFiniteGuard",
  "NonFiniteError",
]


# --------------------------------------------------------------------------- log-probs


def _prev_next(valid_BT):
  """prev[b, t]: last valid index < t (−1 if none); next[b, s]: first valid index > s (T if none)."""
  T = valid_BT.shape[1]
  ar = jnp.arange(T, dtype=jnp.int32)[None, :]
  last_le = lax.cummax(jnp.where(valid_BT, ar, -1), axis=1)
  first_ge = lax.cummin(jnp.where(valid_BT, ar, T), axis=1, reverse=True)
  fill = lambda v: jnp.full((valid_BT.shape[0], 1), v, jnp.int32)
  prev = jnp.concatenate([fill(-1), last_le[:, :-1]], axis=1)
  nxt = jnp.concatenate([first_ge[:, 1:], fill(T)], axis=1)
  return prev, nxt


def _shift_to_targets(per_pos_BT, prev_BT, has_prev_BT):
  """out[b, t] = per_pos[b, prev[b, t]] where token t has a valid predecessor, else 0."""
  g = jnp.take_along_axis(per_pos_BT, jnp.maximum(prev_BT, 0), axis=1)
  return jnp.where(has_prev_BT, g, 0.0)


def logprobs_from_logits(logits_BTV, tokens_BT, valid_BT=None, *, with_entropy: bool = False):
  """log π of each token from the logits at its previous valid position.

  Args:
    logits_BTV: [B, T, V] logits (any float dtype; computed in f32).
    tokens_BT: int [B, T].
    valid_BT: bool [B, T] or None (all valid).
    with_entropy: also return the entropy [B, T] of the distribution that predicted token t.

  Returns:
    logp [B, T] f32 (0 where token t is padding or first), and the entropy if asked.
  """
  B, T, V = logits_BTV.shape
  if tuple(tokens_BT.shape) != (B, T):
    raise ValueError(f"logprobs_from_logits: tokens {tuple(tokens_BT.shape)} do not match logits {(B, T, V)}")
  valid_BT = jnp.ones((B, T), bool) if valid_BT is None else jnp.asarray(valid_BT).astype(bool)
  z = logits_BTV.astype(jnp.float32)  # f32: log-softmax of bf16 logits loses the small probabilities
  prev, nxt = _prev_next(valid_BT)
  has_prev = valid_BT & (prev >= 0)
  next_tok = jnp.take_along_axis(tokens_BT, jnp.minimum(nxt, T - 1), axis=1)  # the token position s predicts
  lse = jax.nn.logsumexp(z, axis=-1)
  picked = jnp.take_along_axis(z, next_tok[..., None].astype(jnp.int32), axis=-1)[..., 0]
  logp = _shift_to_targets(picked - lse, prev, has_prev)
  if not with_entropy:
    return logp
  return logp, _shift_to_targets(losses.softmax_entropy(z, lse), prev, has_prev)


def _compute_cfg(model_cfg: ModelConfig, cfg: LearnerConfig) -> ModelConfig:
  return model_cfg if model_cfg.dtype == cfg.compute_dtype else model_cfg.replace(dtype=cfg.compute_dtype)


def _numerics(cfg: LearnerConfig, qat_alpha, step=None) -> Numerics:
  """The learner's matmul numerics: QAT on the rules of `cfg` (faded in by α when scheduled); NVFP4 W/A/G's
  backward draws from fold_in(PRNGKey(0), step) (deterministic, new each step; PRNGKey(0) without a step)."""
  key = None
  if isinstance(cfg.qat, quant.NVFP4WAG) and step is not None:
    key = jax.random.fold_in(jax.random.PRNGKey(0), jnp.asarray(step, jnp.uint32))
  return Numerics(qat_rules=cfg.qat_rules, qat_alpha=qat_alpha, key=key)


def _hidden(
  params, lora, r: Rollout, mcfg: ModelConfig, cfg: LearnerConfig, numerics: Numerics, remat=False, unroll=False
):
  """hidden [B, T, D] of the rollout's rows; a grouped rollout runs each group's shared prompt once."""
  common = dict(positions_BT=r.positions, valid_BT=r.valid, numerics=numerics, lora=lora, remat=remat, unroll=unroll)
  if cfg.share_prompt and r.group_size > 1 and r.prompt_len > 0:
    h, _ = forward_hidden_grouped(params, r.tokens, mcfg, group_size=r.group_size, prompt_len=r.prompt_len, **common)
  else:
    h, _ = forward_hidden(params, r.tokens, mcfg, **common)
  return h


def _predicting_hidden(h_BTD, valid_BT, start: int):
  """(h [B, T − start, D], has_prev bool [B, T − start]): h[:, n] is the hidden state at the last valid slot before
  slot start + n, which predicts its token (has_prev False where that token is padding or has no valid token before
  it)."""
  B, T, _ = h_BTD.shape
  valid_BT = jnp.ones((B, T), bool) if valid_BT is None else jnp.asarray(valid_BT).astype(bool)
  prev, _ = _prev_next(valid_BT)
  prev, has_prev = prev[:, start:], (valid_BT & (prev >= 0))[:, start:]
  return jnp.take_along_axis(h_BTD, jnp.maximum(prev, 0)[..., None], axis=1), has_prev


def _predicting_logits(params, h_BTD, valid_BT, mcfg: ModelConfig, start: int, temperature: float):
  """(z f32 [B, T − start, V], has_prev): z[:, n] = logits / T of `_predicting_hidden`'s h[:, n]."""
  h, has_prev = _predicting_hidden(h_BTD, valid_BT, start)
  z = logits_from_hidden(params, h, mcfg)  # f32 [B, N, V]
  z = nn.with_logical_constraint(z, ACTIVATION_AXES["logits_BTV"])
  if temperature != 1.0:
    z = z / temperature  # as the sampler's μ: log softmax(logits / T)
  return z, has_prev


def logprobs_from_hidden(
  params,
  h_BTD,
  tokens_BT,
  valid_BT,
  mcfg: ModelConfig,
  *,
  start: int = 0,
  temperature: float = 1.0,
  with_entropy: bool = False,
  chunk: int | None = None,
):
  """log π of each token t >= `start` (and the entropy of the distribution that predicted it) from the hidden state
  at its previous valid slot; 0 before `start`, where token t is padding or has no valid token before it.
  π = softmax(logits / `temperature`): the distribution a sampler at that temperature draws from.

  The logits [B, T − start, V] are computed only for the slots that score a token at or after `start` (a rollout's
  completions: `Rollout.prompt_len`); the same numbers as `logprobs_from_logits` on the full logits, row for row.
  `chunk`: computed `chunk` positions at a time and recomputed in the backward pass, so that the whole [B, N, V]
  never exists (the same numbers, up to how XLA blocks the smaller matmuls).
  """
  B = h_BTD.shape[0]
  if chunk is not None:
    return _chunked_logprobs(
      params,
      h_BTD,
      tokens_BT,
      valid_BT,
      mcfg,
      start=start,
      temperature=temperature,
      chunk=chunk,
      with_entropy=with_entropy,
    )
  z, has_prev = _predicting_logits(params, h_BTD, valid_BT, mcfg, start, temperature)
  lse = jax.nn.logsumexp(z, axis=-1)
  picked = jnp.take_along_axis(z, tokens_BT[:, start:, None].astype(jnp.int32), axis=-1)[..., 0]
  pad = lambda x: jnp.concatenate([jnp.zeros((B, start), jnp.float32), jnp.where(has_prev, x, 0.0)], axis=1)
  logp = pad(picked - lse)
  if not with_entropy:
    return logp
  return logp, pad(losses.softmax_entropy(z, lse))


def _chunked_logprobs(params, h_BTD, tokens_BT, valid_BT, mcfg, *, start, temperature, chunk, with_entropy):
  """`logprobs_from_hidden` with the [B·N, V] logits computed `chunk` positions at a time (`lax.map`) and recomputed
  in the backward pass (`jax.checkpoint`): at most [chunk, V] of them live at once, forward or backward."""
  B, T, D = h_BTD.shape
  h, has_prev = _predicting_hidden(h_BTD, valid_BT, start)
  h = h.reshape(-1, D)  # [B·N, D]
  tok = tokens_BT[:, start:].reshape(-1).astype(jnp.int32)
  n = h.shape[0]
  pad = -n % chunk
  h = jnp.pad(h, ((0, pad), (0, 0))).reshape(-1, chunk, D)
  tok = jnp.pad(tok, (0, pad)).reshape(-1, chunk)

  @jax.checkpoint
  def one(xs):
    h_c, t_c = xs
    z = logits_from_hidden(params, h_c, mcfg)  # f32 [chunk, V]
    if temperature != 1.0:
      z = z / temperature
    lse = jax.nn.logsumexp(z, axis=-1)
    lp = jnp.take_along_axis(z, t_c[:, None], axis=-1)[:, 0] - lse
    if not with_entropy:
      return lp, jnp.zeros_like(lp)
    return lp, losses.softmax_entropy(z, lse)

  lp, ent = lax.map(one, (h, tok))
  back = lambda x: jnp.concatenate(
    [jnp.zeros((B, start), jnp.float32), jnp.where(has_prev, x.reshape(-1)[:n].reshape(B, T - start), 0.0)], axis=1
  )
  return (back(lp), back(ent)) if with_entropy else back(lp)


def completion_logits(
  params,
  rollout: Rollout,
  model_cfg: ModelConfig,
  *,
  cfg: LearnerConfig | None = None,
  lora: Lora | None = None,
  step=None,
) -> tuple[jax.Array, jax.Array]:
  """The learner's full next-token distributions over a rollout's completions (for distillation and analysis).

  Returns:
    (logits f32 [B, N, V], has_prev bool [B, N]) with N = T − `rollout.prompt_len`: logits[:, n] (divided by
    `cfg.temperature`) is the distribution that scores token prompt_len + n, under the learner's numerics
    (compute dtype, QAT at `step` as in `token_logprobs`); has_prev is False where that slot holds no token to score.
  """
  h, mcfg, cfg = _learner_hidden(params, rollout, model_cfg, cfg, lora, step)
  return _predicting_logits(params, h, rollout.valid, mcfg, rollout.prompt_len, cfg.temperature)


def _learner_hidden(params, rollout: Rollout, model_cfg: ModelConfig, cfg: LearnerConfig | None, lora, step):
  """(hidden [B, T, D], the compute ModelConfig, the LearnerConfig) of the public scoring functions: `cfg` None is
  float32 compute without QAT; `step` None is QAT fully on."""
  mcfg = model_cfg if cfg is None else _compute_cfg(model_cfg, cfg)
  cfg = LearnerConfig(compute_dtype="float32") if cfg is None else cfg
  alpha = None if step is None else cfg.qat_alpha(step)
  return _hidden(params, lora, rollout, mcfg, cfg, _numerics(cfg, alpha)), mcfg, cfg


def _policy(params, lora, r: Rollout, mcfg: ModelConfig, cfg: LearnerConfig, *, step, with_entropy=False):
  """(logp [B, T], entropy [B, T] or None, hidden [B, T, D]) under the learner's numerics at `step`."""
  numerics = _numerics(cfg, cfg.qat_alpha(step), step)
  h = _hidden(params, lora, r, mcfg, cfg, numerics, remat=cfg.remat, unroll=cfg.unroll_layers)
  out = logprobs_from_hidden(
    params,
    h,
    r.tokens,
    r.valid,
    mcfg,
    start=r.prompt_len,
    temperature=cfg.temperature,
    with_entropy=with_entropy,
    chunk=cfg.logit_chunk,
  )
  return (out if with_entropy else (out, None)) + (h,)


@functools.partial(jax.jit, static_argnames=("model_cfg", "cfg"))
def token_logprobs(
  params,
  rollout: Rollout,
  model_cfg: ModelConfig,
  *,
  cfg: LearnerConfig | None = None,
  lora: Lora | None = None,
  step=None,
) -> jax.Array:
  """log π(tokens[b, t] | tokens before) [B, T] f32 under the learner's numerics (compute dtype, QAT).

  Args:
    params: model parameters (float masters, or a served tree with QArray kernels).
    rollout: tokens, valid, positions are used (and group_size, prompt_len: the completions only are scored, each
      group's prompt run once).
    model_cfg: the model.
    cfg: learner config giving compute dtype and QAT (None: `model_cfg.dtype`, no QAT).
    lora: adapters, or None.
    step: the learner step, for a scheduled QAT (`cfg.qat_start_step` / `qat_warmup_steps`); None: QAT as
      at the end of its warm-up (fully on) when scheduled.
  """
  h, mcfg, cfg = _learner_hidden(params, rollout, model_cfg, cfg, lora, step)
  return logprobs_from_hidden(
    params,
    h,
    rollout.tokens,
    rollout.valid,
    mcfg,
    start=rollout.prompt_len,
    temperature=cfg.temperature,
    chunk=cfg.logit_chunk,
  )


def logprobs(
  params,
  rollout: Rollout,
  model_cfg: ModelConfig | None = None,
  *,
  numerics=None,
  temperature: float | None = None,
  lora: Lora | None = None,
  step=None,
) -> jax.Array:
  """The learner's log π of a rollout's completion tokens, in one call: f32 [B, T], 0 off the completions.

  Compare it with the rollout's μ (`rollout.sampler_logp`: `losses.mismatch_metrics`) or feed it to the losses
  (`losses.ppo_loss`, `losses.tis_weights`, `losses.acrl_weights`); it is differentiable in `params`. The number
  `prepare_rollout` / `train_step` compute for π, bit for bit, when given the same `LearnerConfig`.

  Args:
    params: the learner's float parameters, a served tree (QArray kernels: π of exactly what was served), or a
      `models.LoadedModel`.
    rollout: from `sampler.generate` (its tokens, valid, positions, group_size and prompt_len are read).
    model_cfg: the model; None: the `LoadedModel`'s. `model_cfg.dtype` is the compute dtype unless `numerics`
      is a `LearnerConfig`.
    numerics: None: `model_cfg.dtype`, no fake quantization (the bf16 / f32 learner). A quantization spec
      (`quant.Int4(group_size=64)`, `quant.FP8()`, `quant.NVFP4()`, ...): the QAT learner of that format (its default
      targets: what `sampler.serve_params(params, spec)` serves, fake-quantized from the same compute-dtype cast).
      A `learner.LearnerConfig`: exactly that learner (its compute dtype, QAT format, targets and schedule at `step`,
      temperature, logit chunking).
    temperature: π = softmax(logits / temperature): pass the sampler's temperature to compare with its μ. None:
      the `LearnerConfig`'s, else 1.
    lora: adapters over `params`, or None.
    step: the learner step of a scheduled QAT (`LearnerConfig.qat_start_step` / `qat_warmup_steps`); None: QAT on.

  Raises:
    ValueError: no model config, or `numerics` of another kind.
  """
  if isinstance(params, LoadedModel):
    model_cfg = params.cfg if model_cfg is None else model_cfg
    params = params.params
  if model_cfg is None:
    raise ValueError("logprobs: model_cfg is required (or pass a models.LoadedModel as params)")
  if isinstance(numerics, LearnerConfig):
    cfg = numerics
  elif numerics is None or isinstance(numerics, (quant.Int4, quant.FP8, quant.MXFP8, quant.NVFP4, quant.NVFP4WAG)):
    cfg = LearnerConfig(compute_dtype=model_cfg.dtype, qat=numerics)
  else:
    raise ValueError(f"logprobs: numerics must be None, a quantization spec or a LearnerConfig; got {numerics!r}")
  if temperature is not None:
    cfg = dataclasses.replace(cfg, temperature=float(temperature))
  return token_logprobs(params, rollout, model_cfg, cfg=cfg, lora=lora, step=step)


# --------------------------------------------------------------------------- micro-batches


def _split(x, m: int, g: int = 1):
  """[B, ...] -> [M, B/M, ...]: micro-batch j holds the units j, j + M, j + 2M, ... of g consecutive rows (g = 1:
  rows; g = G: whole groups, so that a micro-batch's groups still share their prompts)."""
  u = x.reshape((x.shape[0] // (g * m), m, g) + x.shape[1:])
  return jnp.swapaxes(u, 0, 1).reshape((m, x.shape[0] // m) + x.shape[1:])


def _unsplit(x, g: int = 1):
  """Inverse of `_split`: [M, B/M, ...] -> [B, ...]."""
  m, r = x.shape[:2]
  u = jnp.swapaxes(x.reshape((m, r // g, g) + x.shape[2:]), 0, 1)
  return u.reshape((m * r,) + x.shape[2:])


def _micro_batches(batch: Rollout, m: int, cfg: LearnerConfig) -> tuple[Rollout, int]:
  """(batch split into m micro-batches [M, B/M, ...], g): whole groups per micro-batch (g = G) when its rows can
  share their prompts (`LearnerConfig.share_prompt`), else rows interleaved (g = 1, micro-batches ungrouped)."""
  G = batch.group_size
  g = G if cfg.share_prompt and G > 1 and batch.prompt_len > 0 and (batch.size // G) % m == 0 else 1
  if g == 1:
    batch = batch.replace(group_size=1)
  return jax.tree_util.tree_map(lambda x: _split(x, m, g), batch), g


def _hoisted(params, mcfg: ModelConfig, cfg: LearnerConfig, step):
  """`decoder.hoist_qat_operands` of params under the learner's numerics at `step` (those of `_policy`)."""
  return decoder.hoist_qat_operands(params, _numerics(cfg, cfg.qat_alpha(step), step), mcfg.compute_dtype)


def _hoist_once(state: TrainState, trainable, mcfg: ModelConfig, cfg: LearnerConfig):
  """(trainable, state, back) for the step's micro-batches: with M > 1, the kernels QAT fake-quantizes once per
  forward (`decoder.hoist_qat_operands`) fake-quantized once for the whole step instead, so the M micro-batch forwards
  share one pass. Full training: the trainable policy holds the operands, and back(g) takes a micro-batch's gradient
  on them to the float kernels (the operands' straight-through vjp, per micro-batch: the same operations as the
  forward's own hoisting, so the gradients are the same bits); LoRA: the frozen base in `state` holds them, back is
  the identity. M = 1 or no QAT: everything as given."""
  if cfg.qat is None or cfg.micro_batches == 1:
    return trainable, state, lambda g: g
  hoist = lambda p: _hoisted(p, mcfg, cfg, state.step)  # noqa: E731
  if state.trainable != "full":
    return trainable, state.replace(params=hoist(state.params)), lambda g: g
  policy, vjp = jax.vjp(hoist, trainable["policy"])
  return dict(trainable, policy=policy), state, lambda g: dict(g, policy=vjp(g["policy"])[0])


def _check_micro(B: int, m: int):
  if B % m:
    raise ValueError(f"learner.micro_batches={m} must divide the batch size B={B}")


@contextlib.contextmanager
def _mesh_ctx(mesh: Mesh | None):
  """Activation sharding constraints (logical rules) while tracing under `mesh`; nothing without one."""
  if mesh is None:
    yield
    return
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), activation_rules():
    yield


def _adapters(state_like: TrainState, policy) -> tuple[Any, Lora | None]:
  if state_like.trainable == "full":
    return policy, None
  return state_like.params, Lora(params=policy, config=state_like.lora.config)


# --------------------------------------------------------------------------- before the updates


def group_advantages(rewards_B, cfg: LearnerConfig, *, group_size: int) -> jax.Array:
  """f32 [B] outcome advantages of the group estimator `cfg.advantage` (groups of `group_size` contiguous rows)."""
  fn = {"grpo": losses.grpo_advantages, "dr_grpo": losses.dr_grpo_advantages, "rloo": losses.rloo_advantages}[
    cfg.advantage
  ]
  return fn(jnp.asarray(rewards_B, jnp.float32), group_size=group_size)


def _predictor_slots(valid_BT, mask_BT):
  """(rows [B, 1], slot [B, T], mask [B, T]): slot[b, t] = prev(t), the last valid slot before loss token t (whose
  hidden state predicts t), and T (a dropped column) elsewhere. Distinct tokens have distinct predecessors, so the
  slots of a row's loss tokens are as many as its loss tokens."""
  mask = jnp.asarray(mask_BT).astype(bool)
  prev, _ = _prev_next(jnp.asarray(valid_BT).astype(bool))
  T = mask.shape[1]
  return jnp.arange(mask.shape[0])[:, None], jnp.where(mask & (prev >= 0), prev, T), mask


def value_mask(valid_BT, mask_BT) -> jax.Array:
  """bool [B, T]: the slots whose value-head output is trained (`gae_targets`): the predictor of each loss token."""
  rows, slot, mask = _predictor_slots(valid_BT, mask_BT)
  B, T = mask.shape
  return jnp.zeros((B, T + 1), bool).at[rows, slot].set(mask)[:, :T]


def gae_targets(values_BT, rewards_B, valid_BT, mask_BT, vcfg: ValueConfig) -> tuple[jax.Array, jax.Array]:
  """GAE advantages [B, T] and the critic's targets [B, T] for outcome rewards (Schulman et al. 2016).

  V(s_t), the value of the state in which token t is chosen, is the head's output at the position that predicts
  t (the last valid slot before t). The outcome reward sits on the last generated token. R_t = A_t + V(s_t), the
  GAE return of token t, is the target of that same head output: targets[prev(t)] = R_t (`value_mask` marks those
  slots: the prompt's last slot, which predicts the first token, and each generated token but the last). The head
  is thereby trained at exactly the slots GAE reads it at, V(s_0) included; the slot after the last token (a
  terminal state, whose value GAE takes as 0) is not trained. Then QAE smoothing (`vcfg.beta` < 1) and whitening
  over the batch (`vcfg.whiten`).

  Args:
    values_BT: f32 [B, T] (or [B, T, K] quantile heads, averaged) head outputs per position.
    rewards_B: f32 [B]. valid_BT, mask_BT: bool [B, T] (`Rollout.valid`, `Rollout.loss_mask`).
    vcfg: gamma, lam, beta, whiten.
  """
  values = jnp.asarray(values_BT, jnp.float32)
  if values.ndim == 3:
    values = values.mean(-1)
  mask = jnp.asarray(mask_BT).astype(bool)
  prev, _ = _prev_next(jnp.asarray(valid_BT).astype(bool))
  v_state = jnp.where(mask, jnp.take_along_axis(values, jnp.maximum(prev, 0), axis=1), 0.0)
  B, T = mask.shape
  last = T - 1 - jnp.argmax(mask[:, ::-1], axis=1)
  has = jnp.any(mask, axis=1)
  r_BT = (
    jnp.zeros((B, T), jnp.float32).at[jnp.arange(B), last].set(jnp.where(has, jnp.asarray(rewards_B, jnp.float32), 0.0))
  )
  adv, ret = losses.gae_advantages(r_BT, v_state, mask, gamma=vcfg.gamma, lam=vcfg.lam)
  if vcfg.beta < 1:
    adv = losses.smooth_advantages(adv, mask, beta=vcfg.beta)
  if vcfg.whiten:
    adv = losses.normalize_advantages(adv, mask)
  rows, slot, _ = _predictor_slots(valid_BT, mask)
  targets = jnp.zeros((B, T + 1), jnp.float32).at[rows, slot].set(jnp.where(mask, ret, 0.0))[:, :T]
  return adv, targets  # targets[prev(t)] = R_t


def _mismatch(old_logp, sampler_logp, mask) -> dict[str, jax.Array]:
  """The train-inference mismatch metrics of π_old vs μ on the loss mask (`losses.mismatch_metrics`)."""
  return losses.finalize_metrics(losses.mismatch_metrics(old_logp, sampler_logp, mask))


def needs_old_logp(cfg: LearnerConfig) -> bool:
  """Whether π_old must be computed before the updates: K > 1 minibatches (later ones see an updated π), or a
  correction (its weights compare π_old with μ on the whole batch) over M > 1 micro-batches. With K = 1 and M = 1,
  π_old is π_θ at the step's start: `train_step` takes it from its own forward (detached), one forward fewer."""
  return cfg.minibatches > 1 or (cfg.correction.method != "none" and cfg.micro_batches > 1)


@functools.partial(jax.jit, static_argnames=("model_cfg", "cfg", "mesh", "with_old_logp"))
def prepare_rollout(
  state: TrainState,
  rollout: Rollout,
  ref_params=None,
  *,
  model_cfg: ModelConfig,
  cfg: LearnerConfig,
  mesh: Mesh | None = None,
  with_old_logp: bool | None = None,
) -> tuple[Rollout, dict[str, jax.Array]]:
  """Fills in what the learner needs before its updates, on device: the fields of `rollout` that are None.

  * advantages: `group_advantages` of the rewards (grpo / gspo), or GAE on the critic (`gae_targets`, ppo; with
    `returns`, the critic's targets, and `values`, its outputs);
  * old_logp: π_old under the learner's numerics, when `with_old_logp` (None: `needs_old_logp(cfg)`; off-policy
    rollouts need it too);
  * ref_logp: π_ref of `ref_params` (a full parameter tree evaluated without adapters: the initial policy, or
    for LoRA runs the frozen base itself), when given.

  One forward of the policy serves π_old and the values (in `cfg.micro_batches` chunks, `lax.map`); a rollout
  that needs neither (GRPO, K = 1, no correction) costs no forward at all.

  Returns:
    (rollout, metrics): metrics holds "mismatch/<name>" of π_old vs μ on the whole batch when π_old was computed
    (the mismatch proper when K > 1 updates follow; `train_step` sees π after the earlier minibatches).
  """
  rollout.check()
  want_old = needs_old_logp(cfg) if with_old_logp is None else with_old_logp
  want_old = want_old and rollout.old_logp is None
  want_values = cfg.critic and rollout.values is None
  want_ref = ref_params is not None and rollout.ref_logp is None
  if cfg.critic and state.value_head is None:
    raise ValueError(
      "prepare_rollout: policy_loss=ppo needs a state with a value head (create_train_state with the same config)"
    )
  mcfg = _compute_cfg(model_cfg, cfg)
  M = cfg.micro_batches
  _check_micro(rollout.size, M)
  params, lora = _adapters(state, state.params if state.trainable == "full" else state.lora.params)
  if M > 1:  # the micro-batches' forwards share one fake-quant pass of the QAT kernels (`_hoist_once`)
    params = _hoisted(params, mcfg, cfg, state.step)
    if ref_params is not None:
      ref_params = _hoisted(ref_params, mcfg, cfg, state.step)
  mult = cfg.value.delta_multiplier(state.step)

  def one(mb):
    out = {}
    if want_old or want_values:
      logp, _, h = _policy(params, lora, mb, mcfg, cfg, step=state.step)
      if want_old:
        out["old_logp"] = lax.stop_gradient(logp)
      if want_values:
        out["values"] = losses.value_head_apply(state.value_head, h, delta_mult=mult)[0]
    if want_ref:
      out["ref_logp"] = lax.stop_gradient(_policy(ref_params, None, mb, mcfg, cfg, step=state.step)[0])
    return out

  new: dict[str, Any] = {}
  if want_old or want_values or want_ref:
    with _mesh_ctx(mesh):
      mbs, g = _micro_batches(rollout, M, cfg)
      new = {k: _unsplit(v, g) for k, v in lax.map(one, mbs).items()}
  rollout = rollout.replace(**new)
  if rollout.advantages is None:
    if rollout.rewards is None:
      raise ValueError("prepare_rollout: the rollout has neither advantages nor rewards")
    if cfg.critic:
      valid = jnp.ones(rollout.tokens.shape, bool) if rollout.valid is None else rollout.valid
      adv, targets = gae_targets(rollout.values, rollout.rewards, valid, rollout.loss_mask, cfg.value)
      rollout = rollout.replace(advantages=adv, returns=targets if rollout.returns is None else rollout.returns)
    else:
      rollout = rollout.replace(advantages=group_advantages(rollout.rewards, cfg, group_size=rollout.group_size))
  metrics = {}
  if rollout.old_logp is not None:
    metrics = {
      f"mismatch/{k}": v for k, v in _mismatch(rollout.old_logp, rollout.sampler_logp, rollout.loss_mask).items()
    }
  if mesh is not None:
    rollout = jax.tree_util.tree_map(lambda x: lax.with_sharding_constraint(x, batch_sharding(mesh, x.ndim)), rollout)
  return rollout, metrics


# --------------------------------------------------------------------------- the step


def _corrections(state: TrainState, batch: Rollout, cfg: LearnerConfig):
  """Detached token weights [B, T] (or None), the new ACRL state, and their metrics (full batch)."""
  c = cfg.correction
  if c.method == "none":
    return None, state.acrl, {}
  if batch.old_logp is None:
    raise ValueError(f"learner.correction.method={c.method!r} needs Rollout.old_logp (prepare_rollout)")
  old, mu, mask = batch.old_logp, batch.sampler_logp, batch.loss_mask
  level = {} if c.level is None else {"level": c.level}  # None: the loss function's default level
  if c.method == "tis":
    w, m = losses.tis_weights(old, mu, mask, clip_c=c.clip_c, batch_normalize=c.batch_normalize, **level)
    return w, state.acrl, m
  if c.method == "mis":
    w, m = losses.mis_weights(old, mu, mask, lo=c.lo, hi=c.hi, keep_ratio=c.keep_ratio, **level)
    return w, state.acrl, m
  w, acrl, m = losses.acrl_weights(state.acrl, old, mu, batch.advantages, mask, gamma=c.gamma, clip_c=c.clip_c)
  return w, acrl, m


def _denom(mask, agg: str):
  m = jnp.asarray(mask).astype(bool)
  if agg == "token-mean":
    return jnp.sum(m).astype(jnp.float32)
  return jnp.sum(jnp.any(m, axis=1)).astype(jnp.float32)


def _given(**kw):
  """The keywords whose value is not None (None: the loss function's own default)."""
  return {k: v for k, v in kw.items() if v is not None}


def _micro_loss(
  trainable, state: TrainState, mb: Rollout, weights, denom, mcfg, cfg: LearnerConfig, delta_mult, fused: bool = False
):
  """The loss of one micro-batch; `fused`: the batch is this one micro-batch and has no π_old, so the correction
  weights come from this forward's π_θ, detached (= π_old exactly)."""
  params, lora = _adapters(state, trainable["policy"])
  logp, ent, h = _policy(params, lora, mb, mcfg, cfg, step=state.step, with_entropy=True)
  mask = mb.loss_mask
  old = lax.stop_gradient(logp) if mb.old_logp is None else mb.old_logp
  new_acrl, corr_metrics = state.acrl, {}
  if fused:
    weights, new_acrl, corr_metrics = _corrections(state, mb.replace(old_logp=old), cfg)
  common = dict(
    agg=cfg.agg,
    norm_len=cfg.norm_len,
    denom=denom,
    token_weights=weights,
    ref_logp=mb.ref_logp,
    kl_coef=cfg.kl_coef,
    kl_estimator=cfg.kl_estimator,
    **_given(clip_eps_low=cfg.clip_eps_low, clip_eps_high=cfg.clip_eps_high),
  )
  if cfg.policy_loss == "gspo":
    loss, metrics = losses.gspo_loss(logp, old, mb.advantages, mask, **common)
    m = jnp.asarray(mask).astype(bool)
    metrics["entropy"] = Mean(jnp.sum(jnp.where(m, lax.stop_gradient(ent), 0.0)), jnp.sum(m).astype(jnp.float32))
  else:  # grpo and ppo: the clipped surrogate (PPO / GRPO / DAPO / Dr.GRPO, by agg), on their advantages
    loss, metrics = losses.ppo_loss(
      logp, old, mb.advantages, mask, dual_clip_c=cfg.dual_clip_c, entropy=ent, entropy_coef=cfg.entropy_coef, **common
    )
  sums = {"policy_loss": lax.stop_gradient(loss)}  # micro-batch losses sum to the batch loss (global denom)
  if "value_head" in trainable and mb.returns is not None:
    # The critic reads the trunk's features detached: its loss trains the head only.
    if cfg.value.clip is not None and mb.values is None:
      raise ValueError("learner.value.clip needs the rollout's values V_old (Rollout.values: prepare_rollout)")
    v, _ = losses.value_head_apply(trainable["value_head"], lax.stop_gradient(h), delta_mult=delta_mult)
    vl, vm = losses.value_loss(
      v,
      mb.returns,
      value_mask(mb.valid, mask),  # the predictor slot of each loss token (`gae_targets`)
      alpha=cfg.value.alpha,
      quantile_levels=cfg.value.quantile_levels,
      agg=cfg.agg,
      norm_len=cfg.norm_len,
      denom=denom,
      **({} if cfg.value.clip is None else {"old_values": mb.values, "clip": cfg.value.clip}),
    )
    loss = loss + cfg.value.coef * vl
    metrics.update({f"value/{k}": x for k, x in vm.items()})
    sums["value/loss"] = lax.stop_gradient(vl)
  return loss, (metrics, sums, logp, (new_acrl, corr_metrics))


def _reduce_stacked(metrics):
  """Metrics stacked over micro-batches [M, ...] -> one set: Mean pairs add, Max maxes."""
  out = {}
  for k, v in metrics.items():
    if isinstance(v, Mean):
      out[k] = Mean(jnp.sum(v.total, axis=0), jnp.sum(v.count, axis=0))
    elif isinstance(v, Max):
      out[k] = Max(jnp.max(v.value, axis=0))
    else:
      out[k] = jnp.mean(v, axis=0)
  return out


def _update_by_branch(ok, tx, trainable, opt_state, grads):
  """(new trainable, new optimizer state) where `ok`, else the old ones: one conditional around the update."""

  def update(operands):
    trainable, opt_state, grads = operands
    updates, new_opt = tx.update(grads, opt_state, trainable)
    return optax.apply_updates(trainable, updates), new_opt

  return lax.cond(ok, update, lambda o: o[:2], (trainable, opt_state, grads))


def _update_by_select(ok, tx, trainable, opt_state, grads):
  """`_update_by_branch`'s results, as the update computed always and jnp.where(ok, new, old) on every leaf (8-bit
  Adam's state selected inside its update, slice by slice: `scale_by_adam_8bit`'s `apply`)."""
  updates, new_opt = tx.update(grads, opt_state, trainable, apply=ok)
  keep = lambda new, old: jnp.where(ok, new, old)  # noqa: E731
  is_adam8 = lambda x: isinstance(x, Adam8State)  # noqa: E731
  new_opt = jax.tree_util.tree_map(lambda n, o: n if is_adam8(n) else keep(n, o), new_opt, opt_state, is_leaf=is_adam8)
  return jax.tree_util.tree_map(keep, optax.apply_updates(trainable, updates), trainable), new_opt


def _update_if(ok, tx, trainable, opt_state, grads):
  """The optimizer's update where `ok` (the step is finite), else the old parameters and state, by each backend's
  cheaper program (the same numbers: tests/learner/test_learner_step.py).

  - CPU: a conditional. With the select, XLA:CPU copied both moments before the update wrote them (the select reads
    the old ones after: 2.15 GB of SmolLM2's 11.3 GB update). ROCm (not measured) keeps it too.
  - CUDA GPUs and TPUs: the select, fused into the update (8-bit Adam's into its slice loop: its `apply`). XLA:GPU
    copies every leaf a conditional passes through or returns: 74 copies, 2.8 of the 30.3 GB SmolLM2's
    all-techniques step moves on an H100 target. 16 x 72, conditional -> select: on the H100 target, SmolLM2's
    peaks 3.51 -> 2.64 GiB (f32 Adam) and 2.47 -> 1.60 GiB (all three memory techniques), bytes -17% / -10%;
    Qwen2.5-7B shapes' 198.6 -> 116.4 GiB and 135.0 -> 82.8 GiB, bytes -25% / -21%. On a TPU v5p target,
    SmolLM2's peaks 2.99 -> 3.10 GiB and 2.12 -> 2.10 GiB, bytes -21% / -4%; Qwen2.5-7B shapes with all three
    techniques did not fit a v5p chip's 95.7 GiB (117.9 GiB of temporaries) and now peaks at 92.8 GiB
    (`lrl-jax bench learner aot|memory --gpu h100`, `lrl_jax/learner/README.md`).
  """
  return lax.platform_dependent(
    trainable,
    opt_state,
    grads,
    cuda=functools.partial(_update_by_select, ok, tx),
    tpu=functools.partial(_update_by_select, ok, tx),
    default=functools.partial(_update_by_branch, ok, tx),
  )


def restarts_learned_scales(state: TrainState, cfg: LearnerConfig) -> bool:
  """Whether `learned_qat_start` applies to this run (full training, learned INT4, QAT switched on late)."""
  return state.trainable == "full" and cfg.qat_start_step > 0 and getattr(cfg.qat, "learned", False)


def learned_qat_start(params, cfg: LearnerConfig):
  """params with the learned INT4 scales (and zero points) re-initialised from the current weights.

  With `qat_start_step > 0` the learned scales receive no gradient before QAT switches on (α = 0)
  while the weights move, so their step-0 values no longer fit; `train_step` calls this at
  `qat_start_step` (a driver that samples before the step, like `rl`, calls it first, so the
  rollouts of that step are served with the same scales). Measured on the embedded task: the policy's
  KL jolt at switch-on is 1.6 nats with the step-0 scales, 1.4e-2 with these (docs/int4_schemes.md).
  """
  return quant.init_learned(params, cfg.qat_rules, dtype=jnp.dtype(cfg.compute_dtype), overwrite=True)


@functools.partial(jax.jit, static_argnames=("model_cfg", "cfg", "mesh"), donate_argnames=("state",))
def train_step(
  state: TrainState,
  rollout: Rollout,
  *,
  model_cfg: ModelConfig,
  cfg: LearnerConfig,
  mesh: Mesh | None = None,
  rows=None,
) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer update on `rollout` (or on its rows `rows`; the state is donated: its buffers are reused).

  loss = policy loss (clipped surrogate for grpo / ppo, GSPO for gspo, with `cfg.agg`, KL and entropy terms,
         correction weights) + value.coef · value loss (if the state has a value head and the rollout has returns),
  gradients over `cfg.micro_batches` micro-batches (summed; exact), then clip + AdamW.

  NaN guard: if the loss or the gradient's global norm is not finite, params, opt_state and
  the ACRL state are left unchanged, `skipped` and `skipped_in_row` grow by one (the step
  counter still advances: the next step takes the next batch). `NonFiniteGuard` stops a run
  after N skipped steps in a row.

  Args:
    state: the `TrainState` (donated).
    rollout: a `Rollout` with advantages (`prepare_rollout`); B (or the number of `rows`) must be divisible
      by `cfg.micro_batches`. On a mesh, shard it with `shard_batch` (rows over ('data', 'fsdp')).
    model_cfg: the model (static); its `dtype` is replaced by `cfg.compute_dtype`.
    cfg: `LearnerConfig` (static).
    mesh: the mesh the state lives on (static): activations are constrained by
      `mesh.ACTIVATION_RULES` and the new state keeps `state_shardings`. None: one device.
    rows: int [R], the minibatch's rows of `rollout` (gathered on device), or None: all rows.

  Returns:
    (new_state, metrics): float32 scalars — "loss", "grad_norm", "lr", "skipped" (this step),
    "skipped_total", "skipped_in_row", the policy loss's metrics ("pg_loss", "clip_frac_low",
    "clip_frac_high", "approx_kl", "ratio_mean", "ratio_max", "entropy", "kl_ref", ...),
    "mismatch/<name>" for every `losses.mismatch_metrics` entry (π_θ at the start of the step
    vs μ, on the loss mask), "correction/<name>" (TIS / MIS / ACRL weights), "value/<name>".
  """
  rollout.check()
  batch = rollout if rows is None else rollout.take(rows)
  if batch.advantages is None:
    raise ValueError("train_step: the rollout has no advantages (prepare_rollout fills them)")
  if mesh is not None and rows is not None:
    batch = jax.tree_util.tree_map(lambda x: lax.with_sharding_constraint(x, batch_sharding(mesh, x.ndim)), batch)
  B = batch.size
  M = cfg.micro_batches
  _check_micro(B, M)
  mcfg = _compute_cfg(model_cfg, cfg)
  tx = make_optimizer(cfg)
  if restarts_learned_scales(state, cfg):
    # QAT switched on late: learned INT4 scales start from the weights of this step, not of step 0.
    params = lax.cond(
      state.step == cfg.qat_start_step, functools.partial(learned_qat_start, cfg=cfg), lambda p: p, state.params
    )
    state = state.replace(params=params)
  trainable = trainable_params(state)
  delta_mult = cfg.value.delta_multiplier(state.step)

  with _mesh_ctx(mesh):
    # One micro-batch without π_old: the correction weights come from the loss's own forward (π_θ detached is π_old).
    fused = cfg.correction.method != "none" and batch.old_logp is None and M == 1
    weights, new_acrl, corr_metrics = (None, state.acrl, {}) if fused else _corrections(state, batch, cfg)
    denom = _denom(batch.loss_mask, cfg.agg)
    mbs, g = _micro_batches(batch, M, cfg)
    w_mbs = None if weights is None else _split(weights, M, g)
    grad_fn = jax.value_and_grad(functools.partial(_micro_loss, fused=fused), has_aux=True)
    # M > 1: fake-quantize the QAT kernels once for the step, not once per micro-batch forward.
    hoisted, state_h, back = _hoist_once(state, trainable, mcfg, cfg)

    def body(carry, xs):
      g_acc, l_acc = carry
      mb, w = xs
      (loss, (metrics, sums, logp, corr)), g = grad_fn(hoisted, state_h, mb, w, denom, mcfg, cfg, delta_mult)
      g = back(g)
      g_acc = jax.tree_util.tree_map(lambda a, b: a + b.astype(jnp.float32), g_acc, g)
      return (g_acc, l_acc + loss), (metrics, sums, logp, corr)

    zeros = jax.tree_util.tree_map(lambda p: jnp.zeros(p.shape, jnp.float32), trainable)
    (grads, loss), (metrics, sums, logp_mbs, corr) = lax.scan(body, (zeros, jnp.zeros((), jnp.float32)), (mbs, w_mbs))
    if fused:  # M = 1: the scan's one step
      new_acrl, corr_metrics = jax.tree_util.tree_map(lambda x: x[0], corr)
    metrics = _reduce_stacked(metrics)
    metrics.update({k: jnp.sum(v, axis=0) for k, v in sums.items()})
    logp = _unsplit(logp_mbs, g)
    mismatch = losses.mismatch_metrics(logp, batch.sampler_logp, batch.loss_mask)

    grad_norm = optax.tree.norm(grads)
    ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)  # an overflowing norm counts as non-finite too

    new_trainable, new_opt = _update_if(ok, tx, trainable, state.opt_state, grads)
    keep = lambda new, old: jax.tree_util.tree_map(lambda a, b: jnp.where(ok, a, b), new, old)
    new_state = replace_trainable(state, new_trainable).replace(
      opt_state=new_opt,
      acrl=keep(new_acrl, state.acrl),
      step=state.step + 1,
      skipped=state.skipped + (~ok).astype(jnp.int32),
      skipped_in_row=jnp.where(ok, 0, state.skipped_in_row + 1).astype(jnp.int32),
    )
    if mesh is not None:
      new_state = lax.with_sharding_constraint(new_state, state_shardings(new_state, mesh, cfg))

  out = dict(losses.finalize_metrics(metrics))
  out.update({f"mismatch/{k}": v for k, v in losses.finalize_metrics(mismatch).items()})
  out.update({f"correction/{k}": v for k, v in losses.finalize_metrics(corr_metrics).items()})
  out.update(
    {
      "loss": loss,
      "grad_norm": grad_norm,
      "lr": make_schedule(cfg)(state.step - state.skipped),
      "skipped": (~ok).astype(jnp.float32),
      "skipped_total": new_state.skipped.astype(jnp.float32),
      "skipped_in_row": new_state.skipped_in_row.astype(jnp.float32),
    }
  )
  return new_state, {k: jnp.asarray(v, jnp.float32) for k, v in out.items()}


# --------------------------------------------------------------------------- host-side guard


class NonFiniteError(RuntimeError):
  """Raised by `NonFiniteGuard` when too many steps in a row had a non-finite loss or gradient."""


class NonFiniteGuard:
  """Stops a run after `max_in_row` consecutive skipped (non-finite) steps.

  Usage: `guard = NonFiniteGuard(max_in_row=3)`; after each step `guard.check(metrics)`.
  The skipped steps changed nothing, so the last checkpoint and the current params are the
  last good ones.
  """

  def __init__(self, *, max_in_row: int = 3):
    if not isinstance(max_in_row, int) or max_in_row < 1:
      raise ValueError(f"NonFiniteGuard.max_in_row must be a positive int; got {max_in_row!r}")
    self.max_in_row = max_in_row
    self.total_skipped = 0

  def check(self, metrics: dict, *, step: int | None = None) -> bool:
    """Returns True if this step was skipped; raises NonFiniteError after `max_in_row` in a row."""
    skipped = bool(float(metrics["skipped"]) > 0)
    in_row = int(float(metrics["skipped_in_row"]))
    self.total_skipped = int(float(metrics["skipped_total"]))
    if in_row >= self.max_in_row:
      where = "" if step is None else f" (last at step {step})"
      raise NonFiniteError(
        f"{in_row} consecutive learner steps had a non-finite loss or gradient{where}; "
        f"{self.total_skipped} skipped in total. Parameters and optimizer state are those of the last "
        f"good step (skipped steps change nothing); lower the learning rate, check the batch "
        f"(sampler log-probs, advantages) or resume from the last checkpoint."
      )
    return skipped
