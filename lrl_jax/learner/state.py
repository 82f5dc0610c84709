"""TrainState: everything a learner step reads and writes, as one pytree; the optimizer; sharded init.

The state is built the MaxText / nanodo way: `jax.eval_shape(init)` gives its shapes,
`state_shardings` maps them onto the mesh through the logical-axis rules, and
`jax.jit(init, out_shardings=...)` creates every array directly in its shard (the full
state is never materialized on one device).

Trainable set: "full" trains the fp32 master `params` (plus the value head, if any);
"lora" trains only the LoRA adapters (plus the value head) over a frozen base `params`,
which may be float (fp32 / bf16; fake-quantized in the forward when `LearnerConfig.qat`
is set) or a served tree with `quant.QArray` kernels (QeRL: NVFP4 base + LoRA).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from lrl_jax import quant
from lrl_jax.learner.adam8 import scale_by_adam_8bit
from lrl_jax.learner.config import LearnerConfig
from lrl_jax.learner.mesh import lora_shardings, param_shardings
from lrl_jax.losses import ACRLState, acrl_init, value_head_init
from lrl_jax.models import Lora, ModelConfig, init_lora, init_params

__all__ = [
  "TrainState",
  "make_schedule",
  "make_optimizer",
  "trainable_params",
  "replace_trainable",
  "create_train_state",
  "state_shardings",
  "step_key",
]


@flax.struct.dataclass
class TrainState:
  """The learner's state (a pytree; `trainable` is static).

  Attributes:
    step: int32 [], steps taken (applied or skipped); the data order and per-step keys derive from it.
    params: the model parameter tree: fp32 masters ("full"), or the frozen base ("lora").
    opt_state: optax state of the trainable tree (`trainable_params`).
    rng: uint32 [2], the run's base key (raw key data, so that checkpoints can store it);
      per-step keys are `step_key(state)` = fold_in(rng, step).
    acrl: `losses.ACRLState` (ACRL's reference discrepancy X; unused by other corrections).
    skipped: int32 [], steps skipped for a non-finite loss or gradient, in total.
    skipped_in_row: int32 [], consecutive skipped steps up to now (0 after an applied step).
    lora: `models.Lora` adapters ("lora" mode), else None.
    value_head: `losses.value_head_init` params (PPO critic / QAE), or None.
    trainable: "full" or "lora" (static).
  """

  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array
  acrl: ACRLState
  skipped: jax.Array
  skipped_in_row: jax.Array
  lora: Lora | None = None
  value_head: dict | None = None
  trainable: str = flax.struct.field(pytree_node=False, default="full")


def trainable_params(state: TrainState) -> dict:
  """{'policy': params or LoRA adapter params, 'value_head': ... (when present)}: what the optimizer updates."""
  t = {"policy": state.params if state.trainable == "full" else state.lora.params}
  if state.value_head is not None:
    t["value_head"] = state.value_head
  return t


def replace_trainable(state: TrainState, t: dict) -> TrainState:
  """The inverse of `trainable_params`."""
  kw = {"value_head": t["value_head"]} if "value_head" in t else {}
  if state.trainable == "full":
    return state.replace(params=t["policy"], **kw)
  return state.replace(lora=Lora(params=t["policy"], config=state.lora.config), **kw)


def make_schedule(cfg: LearnerConfig) -> optax.Schedule:
  """Learning rate vs applied updates: linear warmup 0 -> lr over warmup_steps, then constant or cosine."""
  if cfg.schedule == "cosine":
    return optax.warmup_cosine_decay_schedule(
      init_value=0.0,
      peak_value=cfg.lr,
      warmup_steps=cfg.warmup_steps,
      decay_steps=cfg.total_steps,
      end_value=cfg.lr * cfg.min_lr_ratio,
    )
  if cfg.warmup_steps == 0:
    return optax.constant_schedule(cfg.lr)
  return optax.join_schedules(
    [optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps), optax.constant_schedule(cfg.lr)], [cfg.warmup_steps]
  )


def _decay_mask(tree):
  """True for kernels, embeddings and LoRA factors; False for norm scales, biases, Δ."""

  def visit(kp, _):
    last = getattr(kp[-1], "key", None) if kp else None
    return last in ("kernel", "embedding", "a", "b")

  return jax.tree_util.tree_map_with_path(visit, tree)


def make_optimizer(cfg: LearnerConfig) -> optax.GradientTransformation:
  """clip_by_global_norm(grad_clip) -> AdamW(schedule, b1, b2, eps, weight_decay on matrices, mu_dtype; or both
  moments in 8 bits for opt_state_dtype="fp8": `adam8.scale_by_adam_8bit`)
  [-> int4_update_clip(k): no INT4 weight moves more than k steps of its group's grid per update].

  With a critic and `value.lr` set, the value head is optimized as if by its own AdamW at peak lr value.lr (as verl's
  separate actor and critic optimizers): the policy and the head are clipped each by its own global norm, and the
  head's updates are scaled by value.lr / lr after Adam (elementwise, so its moments are the head's own; decoupled
  weight decay and the schedule scale with the lr). One chain rather than `optax.multi_transform`, whose masked
  states `optax.tree_map_params` cannot shard.
  """
  critic_lr = cfg.critic and cfg.value.lr is not None
  # 8-bit Adam clips inside, slice by slice (`scale_by_adam_8bit(clip=...)`: the same numbers, 4 bytes a parameter
  # less at the update's peak); optax.identity keeps the chain's state (and so checkpoints) as with the clip here.
  inner_clip = cfg.opt_state_dtype == "fp8" and not critic_lr and cfg.grad_clip is not None
  parts = []
  if cfg.grad_clip is not None:
    clip = _clip_each(cfg.grad_clip) if critic_lr else optax.clip_by_global_norm(cfg.grad_clip)
    parts.append(optax.identity() if inner_clip else clip)
  if cfg.opt_state_dtype == "fp8":  # both moments 8-bit (adam8.py), then AdamW's decay and learning rate
    b = dict(block=cfg.opt_state_block, nesterov=cfg.nesterov, clip=cfg.grad_clip if inner_clip else None)
    parts += [
      scale_by_adam_8bit(cfg.b1, cfg.b2, cfg.eps, **b),
      optax.add_decayed_weights(cfg.weight_decay, _decay_mask),
      optax.scale_by_learning_rate(make_schedule(cfg)),
    ]
  else:
    parts.append(
      optax.adamw(
        make_schedule(cfg),
        b1=cfg.b1,
        b2=cfg.b2,
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        mu_dtype=jnp.dtype(cfg.opt_state_dtype),
        mask=_decay_mask,
        nesterov=cfg.nesterov,
      )
    )
  if critic_lr:
    ratio = cfg.value.lr / cfg.lr
    parts.append(optax.stateless(lambda u, _: {**u, "value_head": jax.tree.map(lambda x: x * ratio, u["value_head"])}))
  if cfg.int4_update_clip is not None:
    parts.append(quant.int4_update_clip(cfg.qat_rules, k=cfg.int4_update_clip))
  return optax.chain(*parts)


def _clip_each(max_norm: float) -> optax.GradientTransformation:
  """clip_by_global_norm applied to each top-level subtree of the updates on its own (the policy, the value head)."""
  clip = optax.clip_by_global_norm(max_norm)
  return optax.stateless(lambda u, _: {k: clip.update(v, clip.init(v))[0] for k, v in u.items()})


def step_key(state: TrainState) -> jax.Array:
  """fold_in(rng, step): this step's key (the same after a resume as in an uninterrupted run)."""
  return jax.random.fold_in(state.rng, state.step)


def state_shardings(abstract_state: TrainState, mesh: Mesh, cfg: LearnerConfig) -> TrainState:
  """NamedShardings for every leaf of a (possibly abstract) TrainState.

  Parameters and adapters through `mesh.PARAM_RULES`; the optimizer's per-parameter
  moments like the parameter they belong to (`optax.tree_map_params`); counters, keys,
  ACRL state and the (small) value head replicated.
  """
  rep = NamedSharding(mesh, P())
  repl = lambda tree: jax.tree_util.tree_map(lambda _: rep, tree)
  base = param_shardings(abstract_state.params, mesh)
  lora = None if abstract_state.lora is None else lora_shardings(abstract_state.lora, mesh)
  policy = base if abstract_state.trainable == "full" else lora.params
  t_shard = {"policy": policy}
  if abstract_state.value_head is not None:
    t_shard["value_head"] = repl(abstract_state.value_head)
  opt = optax.tree_map_params(
    make_optimizer(cfg),
    _fit_sharding,
    abstract_state.opt_state,
    t_shard,
    transform_non_params=lambda _: rep,
    is_leaf=lambda x: isinstance(x, NamedSharding),
  )
  return TrainState(
    step=rep,
    params=base,
    opt_state=opt,
    rng=rep,
    acrl=repl(abstract_state.acrl),
    skipped=rep,
    skipped_in_row=rep,
    lora=lora,
    value_head=None if abstract_state.value_head is None else t_shard["value_head"],
    trainable=abstract_state.trainable,
  )


def _fit_sharding(leaf, sharding: NamedSharding) -> NamedSharding:
  """The parameter's sharding for a per-parameter optimizer leaf; a dimension the leaf's shape does not let its mesh
  axes divide (8-bit moments' block scales: [..., last / block]) is replicated instead."""
  shape = getattr(leaf, "shape", None)
  if shape is None:
    return sharding
  spec = list(sharding.spec) + [None] * (len(shape) - len(sharding.spec))
  size = lambda ax: (
    1 if ax is None else math.prod(sharding.mesh.shape[a] for a in (ax if isinstance(ax, tuple) else (ax,)))
  )  # noqa: E731
  fitted = [ax if d % size(ax) == 0 else None for ax, d in zip(spec, shape)]
  return sharding if fitted == spec else NamedSharding(sharding.mesh, P(*fitted))


def _f32_masters(params):
  def cast(x):
    if isinstance(x, quant.QArray):
      raise ValueError(
        "create_train_state: full training needs float parameters; got a QArray leaf "
        "(train LoRA adapters over a served base: LearnerConfig(lora=LoraConfig(...)))"
      )
    return x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else x

  return jax.tree_util.tree_map(cast, params, is_leaf=lambda x: isinstance(x, quant.QArray))


def create_train_state(
  key: jax.Array, model_cfg: ModelConfig, cfg: LearnerConfig, *, mesh: Mesh | None = None, params=None
) -> TrainState:
  """Builds the state: eval_shape(init) -> `state_shardings` -> jit(init, out_shardings=...).

  What it holds follows `cfg`: LoRA adapters over a frozen `params` when `cfg.lora` is set (else the fp32
  masters are trained); a value head (`losses.value_head_init`, K = len(cfg.value.quantile_levels), Δ =
  `cfg.value.initial_delta`) when `cfg.critic` (policy_loss=ppo); ACRL's reference X = `cfg.correction.acrl_x`
  (None: measured on the first batch).

  Args:
    key: a PRNG key (legacy uint32 [2] or typed); split into init keys and the state's `rng`.
    model_cfg: the model; `init_params` runs when `params` is None.
    cfg: the learner config.
    mesh: from `make_mesh`; None: one device (default placement).
    params: an existing parameter tree (e.g. a loaded checkpoint). Full training keeps
      float32 copies (the masters); LoRA keeps it as given (float, bf16 or QArray kernels).

  Returns:
    The TrainState, each leaf with its sharding on `mesh`.
  """
  if jnp.issubdtype(jnp.asarray(key).dtype, jax.dtypes.prng_key):
    key = jax.random.key_data(key)
  key = jnp.asarray(key, jnp.uint32)
  if key.shape != (2,):
    raise ValueError(f"create_train_state: key must be a PRNG key (uint32 [2] or typed); got shape {key.shape}")
  if cfg.lora is None and params is not None:
    params = _f32_masters(params)
  if cfg.lora is None and params is None and cfg.qat_init == "grid":
    # INT4-aware init (eager: it checks the fixed point): the same draw init() would make, snapped to its grid.
    k_params = jax.random.split(key, 4)[0]
    params = init_params(model_cfg.replace(param_dtype="float32"), k_params)
    params = quant.int4_aware_init(params, cfg.qat_rules, dtype=jnp.dtype(cfg.compute_dtype))
  init = _init_fn(model_cfg, cfg, mesh, params is None)
  return init(key, params)


@functools.lru_cache(maxsize=64)
def _init_fn(model_cfg: ModelConfig, cfg: LearnerConfig, mesh: Mesh | None, fresh: bool):
  """The jit'd initializer for these settings (cached: repeated calls reuse one compilation)."""
  lora, acrl_x = cfg.lora, cfg.correction.acrl_x
  mcfg = model_cfg.replace(param_dtype="float32")
  tx = make_optimizer(cfg)

  def init(key, params):
    k_params, k_lora, k_value, k_rng = jax.random.split(key, 4)
    if params is None:
      params = init_params(mcfg, k_params)
    if lora is None and getattr(cfg.qat, "learned", False):
      # learned INT4 scales next to the kernels (kept if present), from the cast the QAT matmul sees
      params = quant.init_learned(params, cfg.qat_rules, dtype=jnp.dtype(cfg.compute_dtype))
    adapters = None if lora is None else init_lora(model_cfg, lora, k_lora)
    vh = None
    if cfg.critic:
      vh = value_head_init(
        k_value,
        model_cfg.hidden_size,
        delta0=cfg.value.initial_delta,
        num_quantiles=len(cfg.value.quantile_levels),
        init_std=cfg.value.init_std,
      )
    acrl = acrl_init() if acrl_x is None else acrl_init(acrl_x)
    state = TrainState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=None,
      rng=k_rng,
      acrl=acrl,
      skipped=jnp.zeros((), jnp.int32),
      skipped_in_row=jnp.zeros((), jnp.int32),
      lora=adapters,
      value_head=vh,
      trainable=cfg.trainable,
    )
    return state.replace(opt_state=tx.init(trainable_params(state)))

  if mesh is None:
    return jax.jit(init)

  jitted = {}  # one jit per input signature: eval_shape -> shardings -> jit(init, out_shardings)

  def sharded(key, params):
    sig = jax.tree_util.tree_structure(params), tuple((x.shape, x.dtype) for x in jax.tree_util.tree_leaves(params))
    if sig not in jitted:
      abstract = jax.eval_shape(init, key, params)
      jitted[sig] = jax.jit(init, out_shardings=state_shardings(abstract, mesh, cfg))
    return jitted[sig](key, params)

  return sharded
