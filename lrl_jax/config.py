"""Run configuration: one typed, frozen dataclass per component, loaded from YAML plus `key=value` overrides.

The dataclasses below are the only schema. A YAML file in `configs/` only sets values:

  learner:
    lr: 1.0e-4
  quant:
    learner: int4
    sampler: int4

`load_config(path, ["learner.lr=3e-4", "quant.sampler=fp8"])` applies dotted overrides on top (values
parsed with `yaml.safe_load`), checks every value against its field's annotation (int, float, bool, str,
Literal, Optional, tuple) and each section's `__post_init__` rules, and raises `ConfigError` listing the
valid keys or choices on an unknown key, a wrong type or a bad choice. `Config.dump_yaml()` writes the
resolved config next to a run; loading it back gives an equal `Config`.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import re
import types
import typing
from pathlib import Path
from typing import Any, ClassVar, Literal, Mapping, Sequence, Union

import yaml

__all__ = [
    "ConfigError", "Config", "ModelSection", "QuantSection", "SamplerSection", "LearnerSection",
    "CorrectionSection", "ValueSection", "LoraSection", "TaskSection", "RunSection",
    "load_config", "apply_overrides", "describe",
]

_PROJ_KERNELS = r"(q|k|v|o|gate|up|down)_proj/kernel$"
_DTYPE = Literal["float32", "bfloat16"]


class ConfigError(ValueError):
  """A config value or key is invalid; the message names it and lists what is valid."""


# --------------------------------------------------------------------------- type checking


@functools.cache
def _hints(cls) -> dict[str, Any]:
  return typing.get_type_hints(cls)


def _type_name(hint) -> str:
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if origin is Literal:
    return "one of " + ", ".join(str(a) for a in args)
  if origin in (Union, types.UnionType):
    return " or ".join("null" if a is type(None) else _type_name(a) for a in args)
  if origin is tuple:
    if len(args) == 2 and args[1] is Ellipsis:
      return f"a list of {_type_name(args[0])}"
    return f"a list of {len(args)} values ({', '.join(_type_name(a) for a in args)})"
  return {bool: "a bool (true / false)", int: "an int", float: "a float", str: "a string"}.get(hint, str(hint))


def _coerce(value, hint, key: str):
  """`value` checked against the annotation `hint` (ints widen to float, lists become tuples)."""
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  bad = ConfigError(f"{key}={value!r} must be {_type_name(hint)}")
  if origin in (Union, types.UnionType):
    if value is None and type(None) in args:
      return None
    for a in (a for a in args if a is not type(None)):
      try:
        return _coerce(value, a, key)
      except ConfigError:
        pass
    raise bad
  if origin is Literal:
    if any(type(value) is type(a) and value == a for a in args):
      return value
    raise bad
  if origin is tuple:
    if not isinstance(value, (list, tuple)):
      raise bad
    if len(args) == 2 and args[1] is Ellipsis:
      return tuple(_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))
    if len(value) != len(args):
      raise bad
    return tuple(_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
  if hint is bool:
    if isinstance(value, bool):
      return value
    raise bad
  if hint is int:
    if isinstance(value, int) and not isinstance(value, bool):
      return value
    raise bad
  if hint is float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
      return float(value)
    if isinstance(value, str):  # YAML 1.1 reads "1e-4" (no dot) as a string
      try:
        return float(value)
      except ValueError:
        pass
    raise bad
  if hint is str:
    if isinstance(value, str):
      return value
    raise bad
  raise TypeError(f"{key}: unsupported annotation {hint!r}")  # a schema bug, not a user error


def _is_text(hint) -> bool:
  """Whether the field takes a string (str, or a Literal of strings), Optional or not."""
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if origin in (Union, types.UnionType):
    return any(_is_text(a) for a in args if a is not type(None))
  if origin is Literal:
    return all(isinstance(a, str) for a in args)
  return hint is str


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Section:
  """Base of every section: type-checks each field against its annotation, then runs `_validate`."""

  section: ClassVar[str] = ""

  def __post_init__(self):
    for f in dataclasses.fields(self):
      object.__setattr__(self, f.name, _coerce(getattr(self, f.name), _hints(type(self))[f.name],
                                               f"{self.section}.{f.name}"))
    self._validate()

  def _validate(self) -> None:
    pass

  def _set(self, name: str, value) -> None:  # frozen: resolve a default once, in _validate
    object.__setattr__(self, name, value)

  def _check(self, ok: bool, name: str, rule: str) -> None:
    if not ok:
      raise ConfigError(f"{self.section}.{name}={getattr(self, name)!r} {rule}")


def _check_regex(section: _Section, name: str) -> None:
  try:
    re.compile(getattr(section, name))
  except re.error as e:
    raise ConfigError(f"{section.section}.{name}={getattr(section, name)!r} is not a valid regex ({e})") from None


# --------------------------------------------------------------------------- sections


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSection(_Section):
  """The policy model. The tiny-model sizes apply to source "tiny" only (its vocabulary is the task's)."""

  section: ClassVar[str] = "model"

  source: str = "tiny"  # "tiny" (embedded Qwen2-shaped), "smollm2" (SmolLM2-135M-Instruct), "hf:<dir>", "gguf:<file>"
  arch: Literal["llama", "qwen2", "qwen3"] = "qwen2"  # tiny model family
  hidden_size: int = 64  # tiny model width D
  intermediate_size: int = 256  # tiny model SwiGLU hidden width F
  num_layers: int = 2  # tiny model decoder blocks L
  num_heads: int = 4  # tiny model query heads H
  num_kv_heads: int = 2  # tiny model key/value heads (grouped-query attention); divides num_heads
  tie_word_embeddings: bool = True  # tiny model computes logits with the embedding table
  rope_theta: float = 10000.0  # tiny model RoPE base θ
  init_std: float = 0.02  # tiny model std of the random initial weights
  dtype: _DTYPE = "float32"  # master (optimizer-updated) parameter dtype

  def _validate(self):
    s = self.source
    ok = s in ("tiny", "smollm2") or (s.startswith(("hf:", "gguf:")) and len(s.split(":", 1)[1]) > 0)
    self._check(ok, "source", 'must be "tiny", "smollm2", "hf:<dir>" or "gguf:<file>"')
    for name in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads"):
      self._check(getattr(self, name) > 0, name, "must be > 0")
    self._check(self.hidden_size % self.num_heads == 0, "num_heads", f"must divide hidden_size={self.hidden_size}")
    self._check((self.hidden_size // self.num_heads) % 2 == 0, "num_heads",
                f"must leave an even head_dim (hidden_size / num_heads) for RoPE; hidden_size={self.hidden_size}")
    self._check(self.num_heads % self.num_kv_heads == 0, "num_kv_heads", f"must divide num_heads={self.num_heads}")
    self._check(self.rope_theta > 0, "rope_theta", "must be > 0")
    self._check(self.init_std > 0, "init_std", "must be > 0")

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  def tiny_model_config(self, *, vocab_size: int, dtype: str = "float32"):
    """The `lrl_jax.models.ModelConfig` of the tiny model (vocab_size from the task's tokenizer; `dtype` is
    the compute dtype of the side that runs it: learner.compute_dtype or sampler.dtype)."""
    if self.source != "tiny":
      raise ConfigError(f"model.source={self.source!r}: only the tiny model is built from these sizes")
    from lrl_jax.models import ModelConfig

    return ModelConfig(arch=self.arch, vocab_size=vocab_size, hidden_size=self.hidden_size,
                       intermediate_size=self.intermediate_size, num_layers=self.num_layers,
                       num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, rope_theta=self.rope_theta,
                       tie_word_embeddings=self.tie_word_embeddings, dtype=dtype, param_dtype=self.dtype)


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantSection(_Section):
  """Formats of the learner's QAT forward and of the sampler's served weights (lrl_jax.quant specs)."""

  section: ClassVar[str] = "quant"

  learner: Literal["none", "int4", "fp8", "nvfp4", "mxfp8"] = "none"  # QAT format of the learner's forward; none = plain
  sampler: Literal["bf16", "int4", "fp8", "nvfp4", "mxfp8"] = "bf16"  # served weights: bf16 = cast to bfloat16, else real codes
  group_size: int = 128  # INT4 group size along K: 16, 32, 64, 128 or 256
  int4_scheme: Literal["absmax", "minmax", "learned"] = "absmax"  # INT4 scales: absmax/7 (symmetric), (max−min)/15 with a zero point, or learned (LSQ)
  int4_zero_point: bool = False  # int4_scheme=learned: learn a zero point per group too (LSQ+)
  fp8_granularity: Literal["channel", "block"] = "channel"  # FP8 weight scale per output channel or per fp8_block² tile
  fp8_block: int = 128  # FP8 tile edge when fp8_granularity is block
  act: Literal["none", "fp8"] = "none"  # sampler activations: none = compute dtype; fp8 = per-token dynamic E4M3
  targets: str = _PROJ_KERNELS  # regex on '/'-joined parameter paths of the quantized layers

  def _validate(self):
    self._check(self.group_size in (16, 32, 64, 128, 256), "group_size", "must be one of 16, 32, 64, 128, 256")
    self._check(self.int4_scheme in ("absmax", "minmax", "learned"), "int4_scheme",
                "must be absmax, minmax or learned")
    self._check(not self.int4_zero_point or self.int4_scheme == "learned", "int4_zero_point",
                "needs int4_scheme=learned (minmax always has a zero point)")
    self._check(self.int4_scheme != "learned" or self.learner == "int4", "int4_scheme",
                "learned scales are trained by the learner's QAT: needs quant.learner=int4")
    self._check(self.fp8_block > 0, "fp8_block", "must be > 0")
    self._check(self.learner in ("none", self.sampler), "learner",
                f"needs quant.sampler={self.learner!r} (QAT trains for the format the sampler serves); "
                f"got quant.sampler={self.sampler!r}")
    _check_regex(self, "targets")

  def spec(self, fmt: str):
    """The `lrl_jax.quant` spec of a format name of this section ("none" and "bf16" -> None)."""
    from lrl_jax import quant

    if fmt in ("none", "bf16"):
      return None
    return {"int4": lambda: quant.Int4(group_size=self.group_size, scheme=self.int4_scheme,
                                       learn_zero_point=self.int4_zero_point),
            "fp8": lambda: quant.FP8(granularity=self.fp8_granularity, block=self.fp8_block),
            "nvfp4": quant.NVFP4, "mxfp8": quant.MXFP8}[fmt]()

  @property
  def learner_spec(self):
    """Spec of the learner's QAT forward, or None."""
    return self.spec(self.learner)

  @property
  def sampler_spec(self):
    """Spec of the sampler's served weights, or None (bf16)."""
    return self.spec(self.sampler)

  @property
  def act_spec(self):
    """Spec of the sampler's activations (per-token FP8), or None."""
    from lrl_jax import quant

    return quant.FP8(granularity="token") if self.act == "fp8" else None

  def rules(self, spec):
    """`QuantRules` sending the `targets` kernels to `spec`; embeddings, lm_head, norms, routers, biases kept."""
    from lrl_jax.quant.rules import DEFAULT_KEEP, QuantRules

    return QuantRules(rules=tuple((p, None) for p in DEFAULT_KEEP) + ((self.targets, spec),))

  @property
  def block(self) -> int | None:
    """Elements per scale along K of the served format (None for bf16 and per-channel FP8)."""
    return {"int4": self.group_size, "nvfp4": 16, "mxfp8": 32,
            "fp8": self.fp8_block if self.fp8_granularity == "block" else None}.get(self.sampler)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplerSection(_Section):
  """Rollout generation (lrl_jax.sampler.SamplingConfig)."""

  section: ClassVar[str] = "sampler"

  group_size: int = 4  # G completions sampled per prompt
  max_new_tokens: int = 8  # N, longest completion in tokens (EOS included)
  temperature: float = 1.0  # rollout sampling temperature (0 = greedy)
  top_k: int = 0  # keep the k most likely tokens (0 = off)
  top_p: float = 1.0  # nucleus mass in (0, 1] (1 = off)
  eval_temperature: float = 0.0  # temperature of evaluation runs (0 = greedy)
  dtype: _DTYPE = "bfloat16"  # sampler activation and KV-cache dtype
  weight_layout: Literal["kn", "linear"] = "kn"  # served QArrays: kn = [K, N] (qmatmul); linear = [N, K] (qlinear)

  def _validate(self):
    self._check(self.group_size >= 1, "group_size", "must be >= 1")
    self._check(self.max_new_tokens >= 1, "max_new_tokens", "must be >= 1")
    self._check(self.temperature >= 0, "temperature", "must be >= 0")
    self._check(self.eval_temperature >= 0, "eval_temperature", "must be >= 0")
    self._check(self.top_k >= 0, "top_k", "must be >= 0")
    self._check(0 < self.top_p <= 1, "top_p", "must be in (0, 1]")

  def sampling(self, *, eos_id, pad_id: int, evaluation: bool = False):
    """The `lrl_jax.sampler.SamplingConfig` of rollouts (or of evaluation: `eval_temperature`)."""
    from lrl_jax.sampler import SamplingConfig

    return SamplingConfig(max_new_tokens=self.max_new_tokens,
                          temperature=self.eval_temperature if evaluation else self.temperature,
                          top_k=self.top_k, top_p=self.top_p, eos_id=eos_id, pad_id=pad_id)


_AGG = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LearnerSection(_Section):
  """Optimizer, precision and policy loss of the learner (lrl_jax.losses for the formulas)."""

  section: ClassVar[str] = "learner"

  lr: float = 1e-5  # AdamW peak learning rate of the RL steps
  sft_lr: float | None = None  # learning rate of the supervised warm-up steps; null = lr
  weight_decay: float = 0.0  # AdamW decoupled weight decay
  grad_clip: float = 1.0  # global-norm gradient clipping threshold (0 = off)
  warmup_steps: int = 0  # linear learning-rate warm-up steps
  schedule: Literal["constant", "cosine"] = "constant"  # learning rate after warm-up
  micro_batches: int = 1  # gradient-accumulation splits of each minibatch
  compute_dtype: _DTYPE = "bfloat16"  # forward / backward activation dtype (log-probs and losses stay float32)
  opt_state_dtype: _DTYPE = "float32"  # AdamW moment dtype
  remat: bool = False  # recompute each decoder block in the backward pass (saves memory)
  qat_start_step: int = 0  # learner step (RL updates) at which QAT switches on; the supervised warm-up runs without QAT when > 0
  qat_warmup_steps: int = 0  # fade QAT in over this many learner steps: w + α·(ŵ − w), α → 1 (0 = at once)
  qat_init: Literal["default", "grid"] = "default"  # grid: start the quantized kernels on their own INT4 grid (INT4-aware init)
  int4_update_clip: float | None = None  # k: no INT4 weight moves more than k grid steps per update (null = off)
  policy_loss: Literal["grpo", "ppo", "gspo"] = "grpo"  # grpo: group advantages; ppo: GAE on a critic; gspo: sequence ratio
  advantage: Literal["grpo", "dr_grpo", "rloo"] = "grpo"  # group baseline: (r − mean)/std, r − mean, or leave-one-out
  clip_eps_low: float | None = None  # ratio clip below 1 − ε_low; null = the loss's default (0.2; gspo 3e-4)
  clip_eps_high: float | None = None  # ratio clip above 1 + ε_high; null = the loss's default (0.28 DAPO; gspo 4e-4)
  dual_clip_c: float | None = None  # dual-clip bound c > 1 for negative advantages; null = off
  agg: _AGG = "token-mean"  # loss aggregation over tokens and sequences (lrl_jax.losses.aggregate)
  kl_coef: float = 0.0  # β of the KL penalty to a frozen reference policy (0 = no reference model)
  kl_estimator: Literal["k1", "k2", "k3"] = "k3"  # KL estimator (Schulman 2020)
  entropy_coef: float = 0.0  # weight of the entropy bonus
  minibatches: int = 1  # K: each rollout batch is split into K minibatches, one optimizer update each
  mesh: tuple[int, int, int] = (-1, 1, 1)  # learner mesh (data, fsdp, tensor) sizes; one -1 = the remaining devices

  def _validate(self):
    self._check(self.lr > 0, "lr", "must be > 0")
    self._check(self.sft_lr is None or self.sft_lr > 0, "sft_lr", "must be > 0 or null")
    self._check(self.weight_decay >= 0, "weight_decay", "must be >= 0")
    self._check(self.grad_clip >= 0, "grad_clip", "must be >= 0")
    self._check(self.warmup_steps >= 0, "warmup_steps", "must be >= 0")
    self._check(self.micro_batches >= 1, "micro_batches", "must be >= 1")
    self._check(self.minibatches >= 1, "minibatches", "must be >= 1")
    self._check(self.qat_start_step >= 0, "qat_start_step", "must be >= 0")
    self._check(self.qat_warmup_steps >= 0, "qat_warmup_steps", "must be >= 0")
    self._check(self.int4_update_clip is None or self.int4_update_clip > 0, "int4_update_clip", "must be > 0 or null")
    low, high = (3e-4, 4e-4) if self.policy_loss == "gspo" else (0.2, 0.28)
    if self.clip_eps_low is None:
      self._set("clip_eps_low", low)
    if self.clip_eps_high is None:
      self._set("clip_eps_high", high)
    self._check(0 < self.clip_eps_low < 1, "clip_eps_low", "must be in (0, 1)")
    self._check(self.clip_eps_high > 0, "clip_eps_high", "must be > 0")
    self._check(self.dual_clip_c is None or self.dual_clip_c > 1, "dual_clip_c", "must be > 1 or null")
    self._check(self.kl_coef >= 0, "kl_coef", "must be >= 0")
    self._check(self.entropy_coef >= 0, "entropy_coef", "must be >= 0")
    self._check(all(m == -1 or m >= 1 for m in self.mesh) and list(self.mesh).count(-1) <= 1, "mesh",
                "must hold sizes >= 1 and at most one -1")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CorrectionSection(_Section):
  """Train-inference mismatch correction (lrl_jax.losses.corrections)."""

  section: ClassVar[str] = "correction"

  method: Literal["none", "tis", "mis", "acrl"] = "none"  # none, truncated IS (TIS), masked IS (MIS) or ACRL
  level: Literal["token", "sequence", "geometric"] | None = None  # tis: token | sequence; mis: also geometric; null: first
  clip_c: float = 2.0  # C: TIS truncation min(π/μ, C) and ACRL's clip
  lo: float = 0.5  # MIS keeps a sample iff lo <= ρ <= hi
  hi: float = 2.0  # MIS upper bound
  gamma: float = 0.65  # ACRL gain γ in α = γ·sign(A)·(1 − Y/X)
  acrl_x: float | None = None  # ACRL reference discrepancy X; null = measured on the first batch
  batch_normalize: bool = False  # TIS: divide the weights by their batch mean

  def _validate(self):
    levels = {"tis": ("token", "sequence"), "mis": ("sequence", "geometric", "token"), "none": (), "acrl": ()}
    if self.level is None and levels[self.method]:
      self._set("level", levels[self.method][0])
    valid = levels[self.method]
    self._check(self.level in valid if valid else self.level is None, "level",
                f"must be one of {', '.join(valid)} for method {self.method}" if valid
                else f"must be null for method {self.method}")
    self._check(self.clip_c > 0, "clip_c", "must be > 0")
    self._check(0 <= self.lo < self.hi, "lo", f"must be >= 0 and < hi={self.hi}")
    self._check(self.gamma > 0, "gamma", "must be > 0")
    self._check(self.acrl_x is None or self.acrl_x > 0, "acrl_x", "must be > 0 or null")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ValueSection(_Section):
  """PPO critic, optionally with quantized advantage estimation (QAE; lrl_jax.losses.value).

  The defaults are a plain critic (no quantization, MSE only, no smoothing); QAE sets quantized,
  alpha and beta.
  """

  section: ClassVar[str] = "value"

  enabled: bool = False  # train a value head (critic) for PPO's GAE advantages
  quantized: bool = False  # QAE: values are multiples of a learnable step Δ
  delta0: float = 0.1  # QAE initial step Δ₀
  schedule: Literal["step", "constant"] = "step"  # Δ multiplier: step = 3, 2, then 1 at the boundaries; constant = 1
  boundaries: tuple[int, ...] = (1000, 5000)  # steps where the step schedule's multiplier drops
  alpha: float = 0.0  # weight of the quantile loss against the MSE (0 = MSE only)
  quantile_levels: tuple[float, ...] = (0.5,)  # quantile levels τ of the value heads
  beta: float = 1.0  # advantage smoothing A' = βA_t + (1 − β)A_prev (1 = off)
  coef: float = 0.5  # weight of the value loss in the total loss
  gamma: float = 1.0  # GAE discount γ
  lam: float = 0.95  # GAE λ
  lr: float | None = None  # critic learning rate; null = learner.lr

  def _validate(self):
    self._check(self.delta0 > 0, "delta0", "must be > 0")
    b = self.boundaries
    self._check(all(x > 0 for x in b) and all(x < y for x, y in zip(b, b[1:])), "boundaries",
                "must be positive and strictly increasing")
    self._check(0 <= self.alpha <= 1, "alpha", "must be in [0, 1]")
    self._check(len(self.quantile_levels) >= 1 and all(0 < t < 1 for t in self.quantile_levels),
                "quantile_levels", "must be one or more levels in (0, 1)")
    self._check(0 <= self.beta <= 1, "beta", "must be in [0, 1]")
    self._check(self.coef >= 0, "coef", "must be >= 0")
    self._check(0 < self.gamma <= 1, "gamma", "must be in (0, 1]")
    self._check(0 <= self.lam <= 1, "lam", "must be in [0, 1]")
    self._check(self.lr is None or self.lr > 0, "lr", "must be > 0 or null")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoraSection(_Section):
  """LoRA adapters over a frozen (possibly low-bit) base (lrl_jax.models.LoraConfig)."""

  section: ClassVar[str] = "lora"

  enabled: bool = False  # train only LoRA adapters; the base stays frozen
  rank: int = 8  # adapter rank r
  alpha: float = 16.0  # adapter scale α (output scaled by α / r)
  targets: str = _PROJ_KERNELS  # regex on stacked weight paths that get adapters

  def _validate(self):
    self._check(self.rank > 0, "rank", "must be > 0")
    self._check(self.alpha > 0, "alpha", "must be > 0")
    _check_regex(self, "targets")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskSection(_Section):
  """The verifiable-reward task (lrl_jax.tasks)."""

  section: ClassVar[str] = "task"

  name: Literal["arithmetic", "gsm8k"] = "arithmetic"  # embedded synthetic arithmetic, or a GSM8K-format JSONL file
  path: str | None = None  # gsm8k: training JSONL file
  eval_path: str | None = None  # gsm8k: evaluation JSONL file; null = path
  digits: int = 2  # arithmetic: operand digits (1..9)
  ops: tuple[Literal["+", "-", "*", "eq"], ...] = ("+",)  # arithmetic: operations drawn per problem
  answer: Literal["exact", "last_number"] = "exact"  # arithmetic reward: completion == answer, or its last number is
  format_reward: float = 0.0  # reward in [0, 1) for a well-formed but wrong answer
  template: Literal["none", "chat"] = "none"  # none: plain prompt text; chat: SmolLM2 ChatML template
  system_prompt: str | None = None  # chat system turn; null = SmolLM2's default
  user_template: str = "{prompt}"  # str.format template of the user text, with a {prompt} field
  eval_size: int = 128  # prompts per evaluation
  reward_timeout_s: float | None = 1.0  # per-sample reward timeout in seconds; null = none

  def _validate(self):
    self._check(1 <= self.digits <= 9, "digits", "must be in [1, 9]")
    self._check(len(self.ops) >= 1 and len(set(self.ops)) == len(self.ops), "ops", "must be distinct, at least one")
    self._check(0 <= self.format_reward < 1, "format_reward", "must be in [0, 1)")
    self._check("{prompt}" in self.user_template, "user_template", "must contain {prompt}")
    self._check(self.eval_size >= 1, "eval_size", "must be >= 1")
    self._check(self.reward_timeout_s is None or self.reward_timeout_s > 0, "reward_timeout_s", "must be > 0 or null")
    self._check(self.name != "gsm8k" or self.path is not None, "path", "is required for task.name=gsm8k")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunSection(_Section):
  """Steps, batch sizes, seeds and outputs of a run."""

  section: ClassVar[str] = "run"

  seed: int = 0  # seed of parameters, data order and sampling (per-step keys by fold_in)
  steps: int = 100  # RL steps
  sft_steps: int = 0  # supervised warm-up steps on the task's answers before RL
  batch_prompts: int = 16  # prompts per RL step (each sampled G times)
  sft_batch: int | None = None  # sequences per supervised step; null = batch_prompts × sampler.group_size
  eval_every: int = 10  # RL steps between evaluations (0 = only before and after RL)
  ckpt_every: int = 0  # RL steps between checkpoints (0 = only at the end)
  out_dir: str = "runs/default"  # metrics, plots, checkpoints and the resolved config go here
  off_policy: bool = False  # one-step off-policy: the sampler generates batch k+1 while the learner trains on batch k
  max_nonfinite_steps: int = 3  # stop after this many non-finite steps in a row

  def _validate(self):
    self._check(self.seed >= 0, "seed", "must be >= 0")
    for name in ("steps", "sft_steps", "eval_every", "ckpt_every"):
      self._check(getattr(self, name) >= 0, name, "must be >= 0")
    self._check(self.batch_prompts >= 1, "batch_prompts", "must be >= 1")
    self._check(self.sft_batch is None or self.sft_batch >= 1, "sft_batch", "must be >= 1 or null")
    self._check(bool(self.out_dir), "out_dir", "must not be empty")
    self._check(self.max_nonfinite_steps >= 1, "max_nonfinite_steps", "must be >= 1")


# --------------------------------------------------------------------------- the whole config


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
  """A whole run: one section per component, checked together in `__post_init__`."""

  model: ModelSection = dataclasses.field(default_factory=ModelSection)  # the policy model
  quant: QuantSection = dataclasses.field(default_factory=QuantSection)  # learner QAT and sampler formats
  sampler: SamplerSection = dataclasses.field(default_factory=SamplerSection)  # rollout generation
  learner: LearnerSection = dataclasses.field(default_factory=LearnerSection)  # optimizer and policy loss
  correction: CorrectionSection = dataclasses.field(default_factory=CorrectionSection)  # mismatch correction
  value: ValueSection = dataclasses.field(default_factory=ValueSection)  # PPO critic / QAE
  lora: LoraSection = dataclasses.field(default_factory=LoraSection)  # LoRA adapters
  task: TaskSection = dataclasses.field(default_factory=TaskSection)  # prompts and reward
  run: RunSection = dataclasses.field(default_factory=RunSection)  # steps, batches, outputs

  def __post_init__(self):
    for f in dataclasses.fields(self):
      cls = _hints(Config)[f.name]
      if not isinstance(getattr(self, f.name), cls):
        raise ConfigError(f"Config.{f.name} must be a {cls.__name__}; got {type(getattr(self, f.name)).__name__}")
    m, q, s, lrn, t, r = self.model, self.quant, self.sampler, self.learner, self.task, self.run
    if (lrn.policy_loss == "ppo") != self.value.enabled:
      raise ConfigError(f"learner.policy_loss={lrn.policy_loss!r} with value.enabled={self.value.enabled}: "
                        "ppo needs the critic (value.enabled=true) and the critic is used only by ppo")
    if lrn.policy_loss in ("grpo", "gspo") and s.group_size < 2:
      raise ConfigError(f"sampler.group_size={s.group_size} must be >= 2 for learner.policy_loss={lrn.policy_loss} "
                        "(group advantages compare completions of one prompt)")
    rollouts, split = r.batch_prompts * s.group_size, lrn.minibatches * lrn.micro_batches
    if rollouts % split:
      raise ConfigError(f"run.batch_prompts × sampler.group_size = {rollouts} completions must divide into "
                        f"learner.minibatches × learner.micro_batches = {split} equal parts")
    if m.source == "tiny":
      if t.template != "none" or t.name != "arithmetic":
        raise ConfigError(f"model.source=tiny uses the arithmetic character tokenizer: it needs task.name=arithmetic "
                          f"and task.template=none; got task.name={t.name}, task.template={t.template}")
      block = q.block
      dims = {"model.hidden_size": m.hidden_size, "model.intermediate_size": m.intermediate_size}
      if q.sampler == "fp8" and block is not None:
        dims["model.num_kv_heads × head_dim"] = m.num_kv_heads * m.head_dim
      for name, d in dims.items():
        if block is not None and d % block:
          raise ConfigError(f"{name}={d} is not a multiple of the {q.sampler} block {block} (quant.sampler); "
                            "choose sizes the format's blocks divide, or a smaller quant.group_size / quant.fp8_block")

  def to_dict(self) -> dict[str, dict[str, Any]]:
    """{section: {field: value}} with tuples as lists (YAML-ready)."""
    out = {}
    for f in dataclasses.fields(self):
      sec = getattr(self, f.name)
      out[f.name] = {g.name: (list(v) if isinstance(v := getattr(sec, g.name), tuple) else v)
                     for g in dataclasses.fields(sec)}
    return out

  def dump_yaml(self, path=None) -> str:
    """The resolved config as YAML (written to `path` when given); `load_config` reads it back equal."""
    text = "# lrl_jax resolved config (every value; load with lrl_jax.config.load_config)\n" + \
        yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True)
    if path is not None:
      Path(path).write_text(text, encoding="utf-8")
    return text

  @classmethod
  def from_dict(cls, data: Mapping[str, Any], *, source: str = "config") -> "Config":
    """Builds a Config from {section: {field: value}}; missing sections and fields keep their defaults."""
    if not isinstance(data, Mapping):
      raise ConfigError(f"{source}: expected a mapping of sections ({', '.join(_SECTIONS)}); "
                        f"got {type(data).__name__}")
    sections = {}
    for name, values in data.items():
      if name not in _SECTIONS:
        raise ConfigError(f"{source}: unknown section {name!r}{_suggest(name, _SECTIONS)}; "
                          f"valid sections: {', '.join(_SECTIONS)}")
      if values is None:
        values = {}
      if not isinstance(values, Mapping):
        raise ConfigError(f"{source}: section {name!r} must be a mapping of keys to values; "
                          f"got {type(values).__name__}")
      sec_cls = _SECTIONS[name]
      keys = [f.name for f in dataclasses.fields(sec_cls)]
      for k in values:
        if k not in keys:
          raise ConfigError(f"{source}: unknown key '{name}.{k}'{_suggest(str(k), keys)}; "
                            f"valid keys in {name}: {', '.join(keys)}")
      try:
        sections[name] = sec_cls(**values)
      except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    try:
      return cls(**sections)
    except ConfigError as e:
      raise ConfigError(f"{source}: {e}") from None


_SECTIONS: dict[str, type[_Section]] = {f.name: f.default_factory for f in dataclasses.fields(Config)}


def _suggest(name: str, valid: Sequence[str]) -> str:
  close = difflib.get_close_matches(name, valid, n=1)
  return f" (did you mean {close[0]!r}?)" if close else ""


def _parse_override(item: str) -> tuple[str, str, Any]:
  if "=" not in item:
    raise ConfigError(f"override {item!r} must be section.key=value (e.g. learner.lr=1e-4)")
  key, raw = item.split("=", 1)
  key = key.strip()
  if key.count(".") != 1:
    raise ConfigError(f"override key {key!r} must be section.key; valid sections: {', '.join(_SECTIONS)}")
  section, field = key.split(".")
  if section not in _SECTIONS:
    raise ConfigError(f"unknown section {section!r} in override {item!r}{_suggest(section, _SECTIONS)}; "
                      f"valid sections: {', '.join(_SECTIONS)}")
  hints = _hints(_SECTIONS[section])
  if field not in hints or field == "section":
    keys = [f.name for f in dataclasses.fields(_SECTIONS[section])]
    raise ConfigError(f"unknown key '{key}'{_suggest(field, keys)}; valid keys in {section}: {', '.join(keys)}")
  try:
    value = yaml.safe_load(raw)
  except yaml.YAMLError:
    value = raw
  # A text field takes the text as written ("task.user_template=12" is "12"; "null" is still null).
  if _is_text(hints[field]) and not isinstance(value, str) and not (value is None and raw.strip() in
                                                                     ("null", "~", "Null", "NULL")):
    value = raw
  return section, field, value


def _merge_overrides(data: dict, overrides: Sequence[str]) -> dict:
  data = {k: dict(v or {}) if isinstance(v, Mapping) else v for k, v in data.items()}
  for item in overrides:
    section, field, value = _parse_override(item)
    sec = data.setdefault(section, {})
    if not isinstance(sec, dict):
      data[section] = sec = {}
    sec[field] = value
  return data


def load_config(path=None, overrides: Sequence[str] = ()) -> Config:
  """Reads a YAML config (None: all defaults) and applies `section.key=value` overrides in order.

  Raises:
    FileNotFoundError: no such file. ConfigError: unknown section or key, wrong type, bad choice or a rule of
      a section's `__post_init__`, naming the key and listing the valid keys / choices.
  """
  data: Any = {}
  source = "overrides"
  if path is not None:
    path = Path(path)
    if not path.is_file():
      raise FileNotFoundError(f"config file not found: {path}")
    source = str(path)
    try:
      data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
      raise ConfigError(f"{path}: not valid YAML ({e})") from None
  if not isinstance(data, Mapping):
    raise ConfigError(f"{source}: expected a mapping of sections ({', '.join(_SECTIONS)}); got {type(data).__name__}")
  return Config.from_dict(_merge_overrides(dict(data), overrides), source=source)


def apply_overrides(config: Config, overrides: Sequence[str]) -> Config:
  """`config` with `section.key=value` overrides applied (same parsing and checks as `load_config`)."""
  return Config.from_dict(_merge_overrides(config.to_dict(), overrides), source="overrides")


@functools.cache
def _field_comments(cls) -> dict[str, str]:
  """The one-line comment of each field, read from this module's source (no second copy of the schema)."""
  out = {}
  for line in inspect.getsource(cls).splitlines():
    m = re.match(r"\s+(\w+): [^#]*?#\s*(.*)$", line)
    if m:
      out[m.group(1)] = m.group(2)
  return out


def describe() -> str:
  """Every section and key with its type, default and comment (for `lrl-jax train --help-config`)."""
  lines = []
  for name, cls in _SECTIONS.items():
    lines.append(f"{name}:  # {(cls.__doc__ or '').strip().splitlines()[0]}")
    comments = _field_comments(cls)
    for f in dataclasses.fields(cls):
      default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
      lines.append(f"  {f.name}: {default!r}  # {_type_name(_hints(cls)[f.name])}. {comments.get(f.name, '')}")
  return "\n".join(lines)
