"""KV-cache generation: a jit'd prefill, then a `lax.while_loop` of one-token decode steps, into a `Rollout`.

Layout: the cache has S = P + N slots per row, slot s <-> `Rollout.tokens[:, s]`. The prompt
(left- or right-padded, padding marked by `prompt_valid_BP`) fills slots [0, P); generated token t
goes to slot P + t. RoPE positions count valid tokens only, so a row's numbers do not depend on
how its prompt was padded. The loop stops when every row has emitted EOS (or after N tokens).

With right-padded prompts a row's padding sits between its prompt and its completion: token s is
predicted by the logits at the last valid slot before s, `predictor_index(rollout.valid)[:, s]`
(s - 1 for left-padded or unpadded prompts).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from lrl_jax import kernels
from lrl_jax.models.bundle import LoadedModel
from lrl_jax.models.config import ModelConfig
from lrl_jax.models.decoder import Numerics, forward_hidden, init_cache, logits_from_hidden
from lrl_jax.rollout import Rollout, pad_prompts
from lrl_jax.sampler.engine import run_engine
from lrl_jax.sampler.sampling import SamplingConfig, is_eos, sample_tokens, with_special_ids
from lrl_jax.sampler.sharding import SAMPLER_RULES, batch_axis_size

__all__ = ["generate", "row_keys"]


def row_keys(key: jax.Array, batch: int) -> jax.Array:
  """One PRNG key per row: `fold_in(key, b)` for a single key, or the given [B] keys (one seed per request)."""
  if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    key = jax.random.wrap_key_data(key) if key.ndim >= 1 and key.shape[-1] == 2 and key.dtype == jnp.uint32 else key
  if key.ndim == 0:
    return jax.vmap(lambda b: jax.random.fold_in(key, b))(jnp.arange(batch, dtype=jnp.uint32))
  if key.shape != (batch,):
    raise ValueError(f"key must be a single PRNG key or one per row [{batch}]; got shape {key.shape}")
  return key


@functools.partial(jax.jit, static_argnames=("cfg", "sampling", "cache_dtype", "act_spec", "predecode"))
def _generate(
  params,
  prompts_BP,
  prompt_valid_BP,
  keys_B,
  cfg,
  sampling,
  cache_dtype,
  act_spec,
  lora,
  predecode=False,
  limits_B=None,
):
  if predecode:  # decode the served weights once, not at every step (a compute-bound backend; same numbers)
    params = kernels.predecode_params(params, cfg.compute_dtype)
  B, P = prompts_BP.shape
  N = sampling.max_new_tokens
  cache = init_cache(cfg, B, P + N, cache_dtype)

  # Prefill: the whole prompt in one pass; logits only at each row's last valid token.
  numerics = Numerics(act_spec=act_spec)
  h_BPD, cache = forward_hidden(
    params, prompts_BP, cfg, valid_BT=prompt_valid_BP, cache=cache, cache_index=0, numerics=numerics, lora=lora
  )
  last_B = P - 1 - jnp.argmax(prompt_valid_BP[:, ::-1], axis=1)
  h_BD = jnp.take_along_axis(h_BPD, last_B[:, None, None], axis=1)[:, 0]
  logits_BV = logits_from_hidden(params, h_BD, cfg)
  pos_B = jnp.sum(prompt_valid_BP, axis=1, dtype=jnp.int32)  # RoPE position of generated token 0

  step_keys = lambda t: jax.vmap(lambda k: jax.random.fold_in(k, t))(keys_B)
  tok_B, lp_B = sample_tokens(logits_BV, step_keys(0), sampling)
  toks_BN = jnp.full((B, N), sampling.pad_id or 0, jnp.int32).at[:, 0].set(tok_B)
  lps_BN = jnp.zeros((B, N), jnp.float32).at[:, 0].set(lp_B)
  mask_BN = jnp.zeros((B, N), bool).at[:, 0].set(True)
  limits_B = jnp.full((B,), N, jnp.int32) if limits_B is None else limits_B
  done_B = is_eos(tok_B, sampling) | (limits_B <= 1)

  def cond(c):
    t, _, _, _, _, _, done_B = c
    return (t < N) & ~jnp.all(done_B)

  def body(c):
    t, cache, prev_B, toks_BN, lps_BN, mask_BN, done_B = c
    h, cache = forward_hidden(
      params,
      prev_B[:, None],
      cfg,
      positions_BT=(pos_B + t - 1)[:, None],
      cache=cache,
      cache_index=P + t - 1,
      numerics=numerics,
      lora=lora,
    )
    logits_BV = logits_from_hidden(params, h[:, 0], cfg)
    tok_B, lp_B = sample_tokens(logits_BV, step_keys(t), sampling)
    active_B = ~done_B
    tok_B = jnp.where(active_B, tok_B, sampling.pad_id or 0)
    toks_BN = lax.dynamic_update_slice(toks_BN, tok_B[:, None], (0, t))
    lps_BN = lax.dynamic_update_slice(lps_BN, jnp.where(active_B, lp_B, 0.0)[:, None], (0, t))
    mask_BN = lax.dynamic_update_slice(mask_BN, active_B[:, None], (0, t))
    done_B = done_B | (active_B & (is_eos(tok_B, sampling) | (t + 1 >= limits_B)))
    return t + 1, cache, tok_B, toks_BN, lps_BN, mask_BN, done_B

  c = (jnp.int32(1), cache, tok_B, toks_BN, lps_BN, mask_BN, done_B)
  _, _, _, toks_BN, lps_BN, mask_BN, _ = lax.while_loop(cond, body, c)

  prompt_valid_BP = prompt_valid_BP.astype(bool)
  return Rollout(
    tokens=jnp.concatenate([prompts_BP.astype(jnp.int32), toks_BN], axis=1),
    valid=jnp.concatenate([prompt_valid_BP, mask_BN], axis=1),
    loss_mask=jnp.concatenate([jnp.zeros((B, P), bool), mask_BN], axis=1),
    sampler_logp=jnp.concatenate([jnp.zeros((B, P), jnp.float32), lps_BN], axis=1),
  )


def generate(
  params,
  prompts_BP,
  prompt_valid_BP=None,
  cfg: ModelConfig | None = None,
  sampling: SamplingConfig | None = None,
  key=None,
  *,
  group_size: int = 1,
  slots: int | None = None,
  cache_dtype=None,
  act_spec=None,
  lora=None,
  predecode: bool | None = None,
  limits=None,
) -> Rollout:
  """Samples up to `sampling.max_new_tokens` tokens after each prompt, `group_size` times.

  Defaults follow from the model: `generate(model, [ids, ...])` with a `models.LoadedModel` pads the prompts on the
  left, decodes greedily until the tokenizer's EOS, with a KV cache in the model's compute dtype.

  Args:
    params: a served tree (`serve_params`: QArray kernels) or a float parameter tree; or a `models.LoadedModel`
      (cfg from it, and EOS / pad ids from its tokenizer where `sampling` leaves them None).
    prompts_BP: int [B, P] prompt tokens, left- or right-padded (or both); or B lists of token ids of any lengths,
      left-padded here (`pad_prompts`).
    prompt_valid_BP: bool [B, P], True on real prompt tokens; every row needs at least one. None: every token of
      an array is valid (an unpadded batch), or the mask of the padding done here.
    group_size: G completions per prompt: the rollout has B·G rows, prompt b's group in rows bG … bG + G − 1
      (`Rollout.group_size` = G).
    slots: None: the static batch (every row decodes until the longest one ends; each row prefills its prompt).
      An int S: the rollout engine (`engine.py`): each distinct prompt is prefilled once and shared by its G
      rows, and S decode slots take the B·G requests in order, a finished row's slot taking the next request
      (continuous batching; attention over the filled part of the cache). Same keys, same tokens; μ equal up to
      the order of float sums.
    cfg: model config; `cfg.dtype` is the compute dtype of the served model. None: the `LoadedModel`'s.
    sampling: temperature / top-k / top-p / EOS / pad. None: greedy, `SamplingConfig.max_new_tokens` tokens.
    key: one PRNG key (row b draws with `fold_in(key, b)`) or [B] keys, one seed per request;
      step t of a row draws with `fold_in(row_key, t)`, so a row's tokens do not depend on the batch.
      None: allowed for greedy decoding only.
    cache_dtype: KV-cache dtype: float32, bfloat16 or float8_e4m3fn (per-(token, head) scales). None: `cfg.dtype`.
    act_spec: `quant.FP8(granularity="token")` serves W8A8 (FP8 weights from `serve_params` plus
      per-token FP8 activations, dynamic scales); `quant.NVFP4()` serves W4A4 (NVFP4 weights, e.g. the 16x16-tiled
      ones of `serve_params(params, quant.NVFP4WAG())`, plus NVFP4 activations 1x16 along K, one per-tensor scale
      per matmul call: the forward of `quant.nvfp4_wag_matmul`), or that learner's `quant.NVFP4WAG` spec itself
      (its `act_scale`: "token" gives one scale per token); or None (weight-only).
    lora: `models.Lora` adapters applied over the (possibly low-bit) served base, as the learner
      computes π in LoRA-only training (QeRL: frozen NVFP4 base + float adapters), or None.
    predecode: decode the served QArrays once per call, before the decode loop (`kernels.predecode_params`), instead
      of at every step: where the step is compute-bound (CPU) that per-step decode costs more than the matmuls. The
      same dot on the same operand, so μ does not change. None: on the CPU backend only (GPU / TPU keep the
      low-bit kernels, which read the codes).
    limits: int [B·G], each row's new-token limit in [1, max_new_tokens] (a row stops at EOS or at its limit), or
      None: max_new_tokens for every row.

  Returns:
    A `Rollout` (tokens, valid, loss_mask, sampler_logp; group_size, prompt_len = P) with T = P + max_new_tokens.

  Raises:
    ValueError: shapes disagree, a row has no valid prompt token, or a prompt plus max_new_tokens exceeds the
      model's context (`cfg.max_position_embeddings`), naming the row; `group_size` or `slots` not a positive
      int, or a slot count the batch axis of the served tree's mesh does not divide. Checked before anything is
      generated (the prompt checks when the mask is concrete).
  """
  tokenizer = None
  if isinstance(params, LoadedModel):
    cfg = params.cfg if cfg is None else cfg
    params, tokenizer = params.params, params.tokenizer
  if cfg is None:
    raise ValueError("generate: cfg is required (the model's ModelConfig), or pass a models.LoadedModel as params")
  sampling = SamplingConfig(temperature=0.0) if sampling is None else sampling
  sampling = with_special_ids(sampling, tokenizer)
  if key is None:
    if not sampling.greedy:
      raise ValueError(f"generate: sampling at temperature {sampling.temperature} needs a PRNG key (key=...)")
    key = jax.random.PRNGKey(0)  # greedy draws nothing
  cache_dtype = cfg.dtype if cache_dtype is None else cache_dtype
  if isinstance(prompts_BP, (list, tuple)) and not isinstance(prompts_BP[0] if prompts_BP else 0, (int, np.integer)):
    if prompt_valid_BP is not None:
      raise ValueError("generate: prompt_valid_BP goes with a padded [B, P] array; lists of ids are padded here")
    prompts_BP, prompt_valid_BP = pad_prompts(prompts_BP, pad_id=sampling.pad_id, side="left")
  prompts_BP = jnp.asarray(prompts_BP)
  if prompt_valid_BP is None:
    prompt_valid_BP = jnp.ones(prompts_BP.shape, bool)
  prompt_valid_BP = jnp.asarray(prompt_valid_BP).astype(bool)
  if prompts_BP.ndim != 2 or prompt_valid_BP.shape != prompts_BP.shape:
    raise ValueError(
      f"prompts_BP {prompts_BP.shape} and prompt_valid_BP {prompt_valid_BP.shape} must be the same [B, P] shape"
    )
  if not isinstance(prompt_valid_BP, jax.core.Tracer) and not bool(jnp.all(jnp.any(prompt_valid_BP, axis=1))):
    rows = [int(i) for i in jnp.nonzero(~jnp.any(prompt_valid_BP, axis=1))[0]]
    raise ValueError(f"prompt rows {rows} have no valid token")
  if not isinstance(prompt_valid_BP, jax.core.Tracer):
    lens = jnp.sum(prompt_valid_BP, axis=1) + sampling.max_new_tokens
    over = [int(i) for i in jnp.nonzero(lens > cfg.max_position_embeddings)[0]]
    if over:
      raise ValueError(
        f"prompt rows {over} with max_new_tokens={sampling.max_new_tokens} need "
        f"{int(lens[over[0]])} positions; the model's context is {cfg.max_position_embeddings}"
      )
  if not isinstance(group_size, int) or group_size < 1:
    raise ValueError(f"generate: group_size must be a positive int; got {group_size!r}")
  if slots is not None and (not isinstance(slots, int) or isinstance(slots, bool) or slots < 1):
    raise ValueError(f"generate: slots must be a positive int or None (the static batch); got {slots!r}")
  if slots is not None:
    d, mesh = batch_axis_size(params)
    if slots % d:
      raise ValueError(
        f"generate: slots={slots} do not fit the sampler's mesh {dict(mesh.shape)}: its batch axis "
        f"({dict(SAMPLER_RULES)['batch']!r}, {d} devices) must divide them"
      )
  predecode = kernels.predecode_by_default() if predecode is None else bool(predecode)
  R = prompts_BP.shape[0] * group_size
  if limits is not None:
    limits = jnp.asarray(limits, jnp.int32)
    if limits.shape != (R,):
      raise ValueError(f"generate: limits must be one new-token limit per row [B·G] = [{R}]; got {limits.shape}")
    bad = [int(i) for i in jnp.nonzero((limits < 1) | (limits > sampling.max_new_tokens))[0]]
    if bad:
      raise ValueError(
        f"generate: rows {bad} have limits {[int(limits[i]) for i in bad]} outside "
        f"[1, max_new_tokens={sampling.max_new_tokens}]"
      )
  if slots is not None:
    keys_R = row_keys(key, R)
    return run_engine(
      params,
      prompts_BP,
      prompt_valid_BP,
      keys_R,
      cfg,
      sampling,
      group_size=group_size,
      slots=slots,
      cache_dtype=jnp.dtype(cache_dtype),
      act_spec=act_spec,
      lora=lora,
      predecode=predecode,
      limits_R=limits,
    )
  if group_size > 1:
    prompts_BP, prompt_valid_BP = (jnp.repeat(x, group_size, axis=0) for x in (prompts_BP, prompt_valid_BP))
  keys_B = row_keys(key, prompts_BP.shape[0])
  out = _generate(
    params,
    prompts_BP,
    prompt_valid_BP,
    keys_B,
    cfg,
    sampling,
    jnp.dtype(cache_dtype),
    act_spec,
    lora,
    predecode,
    limits,
  )
  return out.replace(group_size=group_size, prompt_len=prompts_BP.shape[1])
