"""The rollout engine: group prefix sharing and continuous batching over a fixed number of decode slots.

`generate(..., slots=S)` runs here (`generate` without `slots` is the static batch of `generate.py`).

  1. Prefill (once per distinct prompt): the Bp prompts fill a prefix cache, the bank ([L, Bp, P] keys and
     values), and give the logits of each prompt's last token. A prompt's G requests (`group_size`) share both:
     Bp prefills, not Bp·G. Token 0 of request r (row r of the result, prompt r // G) is drawn from its prompt's
     logits with the row's key, as the static batch draws it.
  2. Decode, one `lax.while_loop` on device: S slots, each holding one request. Every iteration first admits
     requests, in request order, into the free slots (a slot's prompt part of the cache is copied from the bank,
     the rest of its row invalidated), then runs one decode step for every slot, each row at its own RoPE
     position. A slot is freed when its request emits EOS or reaches `max_new_tokens`, and takes the next request
     at the next iteration. No host round trip per token or per admission.
  3. The generated part of the cache is a ring of N columns that every row writes at once: iteration j writes
     column P + (j mod N) of every slot (one in-place update, as the static batch's decode; a per-row slot made
     XLA:CPU copy the whole cache per layer: 1.6x the step time at SmolLM2-135M shapes). A request writes at most
     N − 1 consecutive iterations, so it never overwrites its own past; attention takes every valid slot of the
     row (decoder `causal_cache=False`): keys carry their RoPE positions, so where a key sits does not matter.
  4. Attention reads only the filled part of the cache: the loop runs in phases of static windows W (the prompt
     slots plus 16, 32, 64, … generated columns, up to all N), each a compiled `while_loop`; phase W runs the
     iterations j < W − P (every column written so far lies below W), the last one until every request is done.
     A run compiles the prefill, one program per window it reaches and the final assembly: for P + N = 36 + 32,
     two decode programs (W = 52, 68).

Invariance: request r's tokens are drawn with fold_in(key_r, t) from logits computed from its own prompt and
tokens only: rows never mix (attention is per row, masked slots add exact zeros), so which slot it ran in, when it
was admitted, how many other requests there were and whether its prompt was shared change no term of any sum,
only the order XLA adds them in (a matmul over S rows vs B rows, an attention over W slots vs P + N). Its μ
equals the static batch's to within that reordering (tests/sampler/test_engine.py states the bound).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from lrl_jax import kernels
from lrl_jax.models.config import ModelConfig
from lrl_jax.models.decoder import KVCache, Numerics, forward_hidden, init_cache, logits_from_hidden
from lrl_jax.rollout import Rollout
from lrl_jax.sampler.sampling import SamplingConfig, is_eos, sample_tokens

__all__ = ["windows", "run_engine"]

_FIRST_WINDOW = 16  # generated slots the first attention window covers; it doubles from there
_ROW_COPIES = 4  # admissions up to this many per iteration copy their rows one by one (else one select)


def windows(prompt_len: int, max_new_tokens: int) -> tuple[int, ...]:
  """The attention windows of a run: P + 16, P + 32, …, P + N (each the cache slots a phase attends to)."""
  out, n = [], _FIRST_WINDOW
  while n < max_new_tokens:
    out.append(prompt_len + n)
    n *= 2
  out.append(prompt_len + max_new_tokens)
  return tuple(out)


def _step_keys(keys_R, t_R):
  return jax.vmap(jax.random.fold_in)(keys_R, t_R.astype(jnp.uint32))


@functools.partial(jax.jit, static_argnames=("cfg", "sampling", "cache_dtype", "act_spec", "group_size", "slots"))
def _start(
  params,
  prompts_BP,
  prompt_valid_BP,
  keys_R,
  limits_R,
  *,
  cfg,
  sampling,
  cache_dtype,
  act_spec,
  lora,
  group_size,
  slots,
):
  """Prefill of the distinct prompts (the bank), token 0 of every request, and the empty slots."""
  Bp, P = prompts_BP.shape
  N, G, R = sampling.max_new_tokens, group_size, keys_R.shape[0]
  bank = init_cache(cfg, Bp, P, cache_dtype)
  h_BPD, bank = forward_hidden(
    params,
    prompts_BP,
    cfg,
    valid_BT=prompt_valid_BP,
    cache=bank,
    cache_index=0,
    numerics=Numerics(act_spec=act_spec),
    lora=lora,
  )
  last_B = P - 1 - jnp.argmax(prompt_valid_BP[:, ::-1], axis=1)
  h_BD = jnp.take_along_axis(h_BPD, last_B[:, None, None], axis=1)[:, 0]
  logits_R = jnp.repeat(logits_from_hidden(params, h_BD, cfg), G, axis=0)  # a group shares its prompt's logits
  tok0_R, lp0_R = sample_tokens(logits_R, _step_keys(keys_R, jnp.zeros((R,), jnp.int32)), sampling)
  S = slots
  state = {
    "cache": init_cache(cfg, S, P + N, cache_dtype),
    "req": jnp.full((S,), -1, jnp.int32),  # the request in the slot (-1: never used)
    "live": jnp.zeros((S,), bool),  # the slot's request is still generating
    "t": jnp.zeros((S,), jnp.int32),  # tokens generated so far by the slot's request
    "last": jnp.zeros((S,), jnp.int32),  # its last token (the next decode step's input)
    "pos0": jnp.zeros((S,), jnp.int32),  # RoPE position of its token 0 (its prompt's valid length)
    "next": jnp.zeros((), jnp.int32),  # the next request to admit
    "j": jnp.zeros((), jnp.int32),  # decode iterations so far (the ring column: P + j mod N)
    "tok": jnp.full((R, N), sampling.pad_id or 0, jnp.int32),
    "lp": jnp.zeros((R, N), jnp.float32),
    "mask": jnp.zeros((R, N), bool),
  }
  first = {
    "tok0": tok0_R,
    "lp0": lp0_R,
    "plen": jnp.sum(prompt_valid_BP, axis=1, dtype=jnp.int32),
    "limit": limits_R,  # each request's new-token limit
  }
  return state, bank, first


def _admit(state, bank: KVCache, first, *, G: int, P: int, N: int, sampling: SamplingConfig):
  """Free slots take the next requests in request order: prompt part of the cache from the bank, token 0 out."""
  R = first["tok0"].shape[0]
  free = ~state["live"]
  cand = state["next"] + jnp.cumsum(free, dtype=jnp.int32) - 1
  admit = free & (cand < R)
  n_admit = jnp.sum(admit, dtype=jnp.int32)

  def copy_rows(cache):
    order = jnp.argsort(~admit, stable=True)  # the admitted slots first, in slot order

    def one(k, c):
      s = order[k]
      p = cand[s] // G
      row = lambda bank_x, x: lax.dynamic_update_slice_in_dim(  # noqa: E731
        x, lax.dynamic_index_in_dim(bank_x, p, axis=1, keepdims=True).astype(x.dtype), s, axis=1
      )
      valid = jnp.concatenate(
        [lax.dynamic_index_in_dim(bank.valid_BS, p, axis=0, keepdims=False), jnp.zeros((N,), bool)]
      )
      return KVCache(
        k=lax.dynamic_update_slice(
          c.k, lax.dynamic_index_in_dim(bank.k, p, 1, True).astype(c.k.dtype), (0, s, 0, 0, 0)
        ),
        v=lax.dynamic_update_slice(
          c.v, lax.dynamic_index_in_dim(bank.v, p, 1, True).astype(c.v.dtype), (0, s, 0, 0, 0)
        ),
        valid_BS=c.valid_BS.at[s].set(valid),
        k_scale=None if c.k_scale is None else row(bank.k_scale, c.k_scale),
        v_scale=None if c.v_scale is None else row(bank.v_scale, c.v_scale),
      )

    return lax.fori_loop(0, n_admit, one, cache)

  def copy_all(cache):  # many at once (the first iteration admits every slot): one gather and select
    p_S = jnp.where(admit, cand, 0) // G
    sel = (
      lambda bank_x, x: x.at[:, :, :P].set(  # noqa: E731
        jnp.where(admit.reshape((1, -1) + (1,) * (x.ndim - 2)), bank_x[:, p_S].astype(x.dtype), x[:, :, :P])
      )
    )
    valid = jnp.concatenate([bank.valid_BS[p_S], jnp.zeros((admit.shape[0], N), bool)], axis=1)
    return KVCache(
      k=sel(bank.k, cache.k),
      v=sel(bank.v, cache.v),
      valid_BS=jnp.where(admit[:, None], valid, cache.valid_BS),
      k_scale=None if cache.k_scale is None else sel(bank.k_scale, cache.k_scale),
      v_scale=None if cache.v_scale is None else sel(bank.v_scale, cache.v_scale),
    )

  # One slot's copy touches 1/S of the cache; the select touches the prompt part of every row: a few slots
  # (the steady state of continuous batching) go one by one, a crowd at once.
  how = jnp.where(n_admit == 0, 0, jnp.where(n_admit <= _ROW_COPIES, 1, 2))
  cache = lax.switch(how, [lambda c: c, copy_rows, copy_all], state["cache"])
  r = jnp.where(admit, cand, state["req"])
  r_safe = jnp.maximum(r, 0)
  tok0 = first["tok0"][r_safe]
  out_r = jnp.where(admit, cand, R)  # R: out of bounds, dropped
  done0 = is_eos(tok0, sampling) | (first["limit"][r_safe] <= 1)
  return dict(
    state,
    cache=cache,
    req=r,
    live=jnp.where(admit, ~done0, state["live"]),
    t=jnp.where(admit, 1, state["t"]),
    last=jnp.where(admit, tok0, state["last"]),
    pos0=jnp.where(admit, first["plen"][r_safe // G], state["pos0"]),
    next=state["next"] + n_admit,
    tok=state["tok"].at[out_r, 0].set(tok0, mode="drop"),
    lp=state["lp"].at[out_r, 0].set(first["lp0"][r_safe], mode="drop"),
    mask=state["mask"].at[out_r, 0].set(True, mode="drop"),
  )


@functools.partial(jax.jit, static_argnames=("cfg", "sampling", "act_spec", "group_size", "window"))
def _phase(params, state, bank, first, keys_R, *, cfg: ModelConfig, sampling, act_spec, lora, group_size, window):
  """Admit-and-decode iterations attending to cache slots [0, window), until every request is done or (a window
  short of all N generated columns) the next ring column would fall outside it."""
  P, N, R = bank.max_len, sampling.max_new_tokens, first["tok0"].shape[0]
  numerics = Numerics(act_spec=act_spec)

  def cond(s):
    busy = jnp.any(s["live"]) | (s["next"] < R)
    return busy if window == P + N else busy & (s["j"] < window - P)

  def body(s):
    s = _admit(s, bank, first, G=group_size, P=P, N=N, sampling=sampling)
    live, t = s["live"], s["t"]
    h, cache = forward_hidden(  # token t − 1 of every live row at the ring column (idle rows: written invalid)
      params,
      s["last"][:, None],
      cfg,
      positions_BT=(s["pos0"] + t - 1)[:, None],
      valid_BT=live[:, None],
      cache=s["cache"],
      cache_index=P + s["j"] % N,
      attn_window=window,
      causal_cache=False,
      numerics=numerics,
      lora=lora,
    )
    logits = logits_from_hidden(params, h[:, 0], cfg)
    r = jnp.maximum(s["req"], 0)
    tok, lp = sample_tokens(logits, _step_keys(keys_R[r], t), sampling)
    out_r = jnp.where(live, s["req"], R)
    tok = jnp.where(live, tok, sampling.pad_id or 0)
    return dict(
      s,
      cache=cache,
      j=s["j"] + 1,
      t=t + live,
      last=jnp.where(live, tok, s["last"]),
      live=live & ~is_eos(tok, sampling) & (t + 1 < first["limit"][r]),
      tok=s["tok"].at[out_r, t].set(tok, mode="drop"),
      lp=s["lp"].at[out_r, t].set(lp, mode="drop"),
      mask=s["mask"].at[out_r, t].set(True, mode="drop"),
    )

  return lax.while_loop(cond, body, state)


@functools.partial(jax.jit, static_argnames=("group_size",))
def _assemble(prompts_BP, prompt_valid_BP, state, *, group_size):
  prompts = jnp.repeat(prompts_BP.astype(jnp.int32), group_size, axis=0)
  pvalid = jnp.repeat(prompt_valid_BP, group_size, axis=0)
  R, P = prompts.shape
  return Rollout(
    tokens=jnp.concatenate([prompts, state["tok"]], axis=1),
    valid=jnp.concatenate([pvalid, state["mask"]], axis=1),
    loss_mask=jnp.concatenate([jnp.zeros((R, P), bool), state["mask"]], axis=1),
    sampler_logp=jnp.concatenate([jnp.zeros((R, P), jnp.float32), state["lp"]], axis=1),
    group_size=group_size,
    prompt_len=P,
  )


def run_engine(
  params,
  prompts_BP,
  prompt_valid_BP,
  keys_R,
  cfg: ModelConfig,
  sampling: SamplingConfig,
  *,
  group_size: int,
  slots: int,
  cache_dtype,
  act_spec,
  lora,
  predecode: bool,
  limits_R=None,
) -> Rollout:
  """The engine's run (`generate(..., slots=S)` checks the inputs and calls this): see the module docstring."""
  if predecode:
    params = jax.jit(kernels.predecode_params, static_argnums=1)(params, cfg.compute_dtype)
  P, N = prompts_BP.shape[1], sampling.max_new_tokens
  R = keys_R.shape[0]
  slots = min(slots, R)
  limits_R = jnp.full((R,), N, jnp.int32) if limits_R is None else limits_R
  state, bank, first = _start(
    params,
    prompts_BP,
    prompt_valid_BP,
    keys_R,
    limits_R,
    cfg=cfg,
    sampling=sampling,
    cache_dtype=cache_dtype,
    act_spec=act_spec,
    lora=lora,
    group_size=group_size,
    slots=slots,
  )
  for w in windows(P, N):
    state = _phase(
      params,
      state,
      bank,
      first,
      keys_R,
      cfg=cfg,
      sampling=sampling,
      act_spec=act_spec,
      lora=lora,
      group_size=group_size,
      window=w,
    )
    if not (bool(jnp.any(state["live"])) or int(state["next"]) < R):
      break
  return _assemble(prompts_BP, prompt_valid_BP, state, group_size=group_size)
