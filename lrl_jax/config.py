"""Run configuration: the sections of one job, loaded from YAML plus `key=value` overrides.

  model      the policy (tiny / SmolLM2 / HF directory / GGUF file)      ModelSection
  quant      the learner's QAT format and the sampler's served format     QuantSection
  sampler    rollout generation                                           SamplerSection
  learner    the learner, as the library takes it                         learner.LearnerConfig
               (learner.correction, learner.value, learner.lora nested)
  task       prompts and reward                                           TaskSection
  run        steps, batch sizes, warm-up, seeds, outputs                  RunSection

Each section is a typed frozen dataclass (`lrl_jax.schema`): a YAML file in `configs/` only sets values,

  learner:
    lr: 1.0e-4
    correction:
      method: tis
  quant:
    learner: int4
    sampler: int4

and `load_config(path, ["learner.lr=3e-4", "learner.correction.method=mis"])` applies dotted overrides on top
(values parsed with `yaml.safe_load`), checking every value against its field's annotation and each section's
rules; a `ConfigError` names the key and lists the valid keys or choices. The `learner` section *is*
`learner.LearnerConfig`: the run only adds what the other sections own (its QAT spec from `quant`, the cosine
length from `run.steps`). `Config.dump_yaml()` writes the resolved config next to a run; loading it back gives
an equal `Config`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar, Literal, Mapping, Sequence

import yaml

from lrl_jax import models, quant
from lrl_jax.learner.config import LearnerConfig
from lrl_jax.sampler import SamplingConfig
from lrl_jax.schema import ConfigError, Schema, check_regex, merge_overrides, suggest
from lrl_jax.schema import describe as _describe

__all__ = [
  "ConfigError",
  "Config",
  "ModelSection",
  "QuantSection",
  "SamplerSection",
  "TaskSection",
  "RunSection",
  "DapoSection",
  "SECTIONS",
  "load_config",
  "apply_overrides",
  "describe",
]

_DTYPE = Literal["float32", "bfloat16"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSection(Schema):
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
  layers: int | None = None  # pretrained sources: keep only the first k decoder blocks (smoke tests); null = all

  def _validate(self):
    s = self.source
    ok = s in ("tiny", "smollm2") or (s.startswith(("hf:", "gguf:")) and len(s.split(":", 1)[1]) > 0)
    self._check(ok, "source", 'must be "tiny", "smollm2", "hf:<dir>" or "gguf:<file>"')
    for name in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads"):
      self._check(getattr(self, name) > 0, name, "must be > 0")
    self._check(self.hidden_size % self.num_heads == 0, "num_heads", f"must divide hidden_size={self.hidden_size}")
    self._check(
      (self.hidden_size // self.num_heads) % 2 == 0,
      "num_heads",
      f"must leave an even head_dim (hidden_size / num_heads) for RoPE; hidden_size={self.hidden_size}",
    )
    self._check(self.num_heads % self.num_kv_heads == 0, "num_kv_heads", f"must divide num_heads={self.num_heads}")
    self._check(self.rope_theta > 0, "rope_theta", "must be > 0")
    self._check(self.init_std > 0, "init_std", "must be > 0")
    self._check(self.layers is None or self.layers >= 1, "layers", "must be >= 1 or null")
    self._check(self.layers is None or s != "tiny", "layers", "applies to pretrained sources (tiny: num_layers)")

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  def tiny_model_config(self, *, vocab_size: int, dtype: str = "float32"):
    """The `lrl_jax.models.ModelConfig` of the tiny model (vocab_size from the task's tokenizer; `dtype` is
    the compute dtype of the side that runs it: learner.compute_dtype or sampler.dtype)."""
    if self.source != "tiny":
      raise ConfigError(f"model.source={self.source!r}: only the tiny model is built from these sizes")
    return models.ModelConfig(
      arch=self.arch,
      vocab_size=vocab_size,
      hidden_size=self.hidden_size,
      intermediate_size=self.intermediate_size,
      num_layers=self.num_layers,
      num_heads=self.num_heads,
      num_kv_heads=self.num_kv_heads,
      rope_theta=self.rope_theta,
      tie_word_embeddings=self.tie_word_embeddings,
      dtype=dtype,
      param_dtype=self.dtype,
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantSection(Schema):
  """Formats of the learner's QAT forward and of the sampler's served weights (lrl_jax.quant specs)."""

  section: ClassVar[str] = "quant"

  learner: Literal["none", "int4", "fp8", "nvfp4", "mxfp8", "nvfp4_wag"] = "none"  # QAT format; nvfp4_wag: W/A/G
  sampler: Literal["bf16", "int4", "fp8", "nvfp4", "mxfp8"] = "bf16"  # served weights: bf16 = a bf16 cast, else codes
  group_size: int = 128  # INT4 group size along K: 16, 32, 64, 128 or 256
  int4_scheme: Literal["absmax", "minmax", "learned"] = "absmax"  # INT4 scales: absmax/7, (max−min)/15 + zero, LSQ
  int4_zero_point: bool = False  # int4_scheme=learned: learn a zero point per group too (LSQ+)
  fp8_granularity: Literal["channel", "block"] = "channel"  # FP8 weight scale per output channel or per fp8_block² tile
  fp8_block: int = 128  # FP8 tile edge when fp8_granularity is block
  wag_rht: bool = True  # nvfp4_wag: random Hadamard transform of the wgrad operands (the recipe; false: ablation)
  wag_sr: bool = True  # nvfp4_wag: stochastic rounding of the gradient dy (the recipe; false: round to nearest)
  wag_act_scale: Literal["tensor", "token"] = "tensor"  # nvfp4_wag: activations' FP32 scale per tensor (recipe) / token
  wag_keep_last_layers: int = 0  # nvfp4_wag: the last k layers train in the compute dtype (the recipe keeps a few;
  # they are still served in NVFP4, a train-inference mismatch there)
  act: Literal["none", "fp8", "nvfp4"] = "none"  # sampler activations: none = compute dtype; fp8 = per-token E4M3;
  # nvfp4 = 1x16 E2M1 blocks along K (W4A4, with quant.sampler=nvfp4)
  targets: str = quant.DEFAULT_TARGETS  # regex on the '/'-joined paths of the quantized kernels (learner and sampler)

  def _validate(self):
    self._check(self.group_size in (16, 32, 64, 128, 256), "group_size", "must be one of 16, 32, 64, 128, 256")
    self._check(self.int4_scheme in ("absmax", "minmax", "learned"), "int4_scheme", "must be absmax, minmax or learned")
    self._check(
      not self.int4_zero_point or self.int4_scheme == "learned",
      "int4_zero_point",
      "needs int4_scheme=learned (minmax always has a zero point)",
    )
    self._check(
      self.int4_scheme != "learned" or self.learner == "int4",
      "int4_scheme",
      "learned scales are trained by the learner's QAT: needs quant.learner=int4",
    )
    self._check(self.fp8_block > 0, "fp8_block", "must be > 0")
    self._check(
      isinstance(self.wag_keep_last_layers, int) and self.wag_keep_last_layers >= 0,
      "wag_keep_last_layers",
      "must be an int >= 0",
    )
    self._check(
      self.wag_keep_last_layers == 0 or self.learner == "nvfp4_wag",
      "wag_keep_last_layers",
      "applies to quant.learner=nvfp4_wag only",
    )
    self._check(self.act != "nvfp4" or self.sampler == "nvfp4", "act", "nvfp4 activations need quant.sampler=nvfp4")
    self._check(
      {"nvfp4_wag": "nvfp4"}.get(self.learner, self.learner) in ("none", self.sampler),
      "learner",
      f"needs quant.sampler={self.learner!r} (QAT trains for the format the sampler serves); "
      f"got quant.sampler={self.sampler!r}",
    )
    check_regex(self, "targets")

  def spec(self, fmt: str):
    """The `lrl_jax.quant` spec of a format name of this section ("none" and "bf16" -> None)."""
    if fmt in ("none", "bf16"):
      return None
    return {
      "int4": lambda: quant.Int4(
        group_size=self.group_size, scheme=self.int4_scheme, learn_zero_point=self.int4_zero_point
      ),
      "fp8": lambda: quant.FP8(granularity=self.fp8_granularity, block=self.fp8_block),
      "nvfp4": quant.NVFP4,
      "mxfp8": quant.MXFP8,
      "nvfp4_wag": lambda: quant.NVFP4WAG(rht=self.wag_rht, sr=self.wag_sr, act_scale=self.wag_act_scale),
    }[fmt]()

  @property
  def learner_spec(self):
    """Spec of the learner's QAT forward, or None."""
    return self.spec(self.learner)

  @property
  def sampler_spec(self):
    """Spec of the sampler's served weights, or None (bf16). With learner nvfp4_wag, `NVFP4WAG`: NVFP4 QArrays
    whose scales are the forward's 16x16 tiles (the forward's Ŵ, served as it is trained)."""
    return self.spec("nvfp4_wag" if self.learner == "nvfp4_wag" else self.sampler)

  @property
  def act_spec(self):
    """Spec of the sampler's activations (per-token FP8, or NVFP4 1x16 along K), or None."""
    if self.act == "nvfp4" and self.learner == "nvfp4_wag":
      return self.learner_spec  # the W/A/G forward's own activations (its act_scale: per tensor or per token)
    return {"fp8": quant.FP8(granularity="token"), "nvfp4": quant.NVFP4()}.get(self.act)

  def rules(self, spec):
    """`QuantRules` sending the `targets` kernels to `spec` (`QuantRules.default`)."""
    return quant.QuantRules.default(spec, targets=self.targets)

  @property
  def block(self) -> int | None:
    """Elements per scale along K of the served format (None for bf16 and per-channel FP8)."""
    return {
      "int4": self.group_size,
      "nvfp4": 16,
      "mxfp8": 32,
      "fp8": self.fp8_block if self.fp8_granularity == "block" else None,
    }.get(self.sampler)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplerSection(Schema):
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
  slots: int | None = None  # decode slots of the rollout engine (continuous batching); null = one per completion
  mesh: tuple[int, int] | None = None  # the sampler's own mesh (data, tensor) sizes; null = the learner's placement

  def _validate(self):
    self._check(self.group_size >= 1, "group_size", "must be >= 1")
    self._check(self.mesh is None or all(m >= 1 for m in self.mesh), "mesh", "must hold sizes >= 1, or be null")
    self._check(self.slots is None or self.slots >= 1, "slots", "must be >= 1 or null")
    self._check(self.max_new_tokens >= 1, "max_new_tokens", "must be >= 1")
    self._check(self.temperature >= 0, "temperature", "must be >= 0")
    self._check(self.eval_temperature >= 0, "eval_temperature", "must be >= 0")
    self._check(self.top_k >= 0, "top_k", "must be >= 0")
    self._check(0 < self.top_p <= 1, "top_p", "must be in (0, 1]")

  def sampling(self, *, eos_id, pad_id: int, evaluation: bool = False):
    """The `lrl_jax.sampler.SamplingConfig` of rollouts (or of evaluation: `eval_temperature`)."""
    return SamplingConfig(
      max_new_tokens=self.max_new_tokens,
      temperature=self.eval_temperature if evaluation else self.temperature,
      top_k=self.top_k,
      top_p=self.top_p,
      eos_id=eos_id,
      pad_id=pad_id,
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskSection(Schema):
  """The verifiable-reward task (lrl_jax.tasks)."""

  section: ClassVar[str] = "task"

  name: Literal["arithmetic", "gsm8k", "prompts"] = "arithmetic"  # embedded arithmetic, GSM8K JSONL, your own prompts
  path: str | None = None  # gsm8k / prompts: training JSONL file (prompts: {"prompt": ..., "reference": ...} lines)
  eval_path: str | None = None  # gsm8k / prompts: evaluation JSONL file; null = path
  reward: str | None = None  # prompts: exact | last_number | "module:function" (reward(completion, ref)); null = exact
  digits: int = 2  # arithmetic: operand digits (1..9)
  ops: tuple[Literal["+", "-", "*", "eq"], ...] = ("+",)  # arithmetic: operations drawn per problem
  answer: Literal["exact", "last_number"] = "exact"  # arithmetic reward: completion == answer, or its last number is
  format_reward: float = 0.0  # reward in [0, 1) for a well-formed but wrong answer
  template: Literal["none", "chat"] = "none"  # none: plain prompt text; chat: SmolLM2 ChatML template
  system_prompt: str | None = None  # chat system turn; null = SmolLM2's default
  user_template: str = "{prompt}"  # str.format template of the user text, with a {prompt} field
  eval_size: int = 128  # prompts per evaluation
  holdout: float = 0.0  # arithmetic: fraction of problems kept for eval only (disjoint from training; fixed eval set)
  transfer_digits: tuple[int, ...] = ()  # arithmetic: extra eval sets with these operand digits (before / after RL)
  reward_timeout_s: float | None = 1.0  # per-sample reward timeout in seconds; null = none
  reward_workers: int = 2  # reward processes (a call past its timeout is killed); 0 = threads in the trainer

  def _validate(self):
    self._check(1 <= self.digits <= 9, "digits", "must be in [1, 9]")
    self._check(len(self.ops) >= 1 and len(set(self.ops)) == len(self.ops), "ops", "must be distinct, at least one")
    self._check(0 <= self.format_reward < 1, "format_reward", "must be in [0, 1)")
    self._check("{prompt}" in self.user_template, "user_template", "must contain {prompt}")
    self._check(self.eval_size >= 1, "eval_size", "must be >= 1")
    self._check(0 <= self.holdout < 1, "holdout", "must be in [0, 1)")
    self._check(all(1 <= d <= 9 for d in self.transfer_digits), "transfer_digits", "must be digits in [1, 9]")
    self._check(self.reward_timeout_s is None or self.reward_timeout_s > 0, "reward_timeout_s", "must be > 0 or null")
    self._check(self.reward_workers >= 0, "reward_workers", "must be >= 0")
    self._check(
      self.name not in ("gsm8k", "prompts") or self.path is not None, "path", f"is required for task.name={self.name}"
    )
    self._check(self.reward is None or self.name == "prompts", "reward", "applies to task.name=prompts")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunSection(Schema):
  """Steps, batch sizes, seeds and outputs of a run."""

  section: ClassVar[str] = "run"

  seed: int = 0  # seed of parameters, data order and sampling (per-step keys by fold_in)
  steps: int = 100  # RL steps
  sft_steps: int = 0  # supervised warm-up steps on the task's answers before RL
  batch_prompts: int = 16  # prompts per RL step (each sampled G times)
  sft_batch: int | None = None  # sequences per supervised step; null = batch_prompts × sampler.group_size
  sft_lr: float | None = None  # constant learning rate of the supervised warm-up; null = learner.lr
  warmup_cache: str | None = None  # directory of finished warm-ups keyed by all their inputs; null = always train
  recover_steps: int = 0  # QAT recovery before RL: steps distilling the float model into its quantized copy
  recover_lr: float | None = None  # constant learning rate of the recovery; null = learner.lr
  recover_eval_every: int = 0  # recovery steps between evaluations of the served weights (0 = none during it)
  eval_every: int = 10  # RL steps between evaluations (0 = only before and after RL)
  ckpt_every: int = 0  # RL steps between checkpoints (0 = only at the end)
  out_dir: str = "runs/default"  # metrics, plots, checkpoints and the resolved config go here
  off_policy: bool = False  # one-step off-policy: batch k is generated with the weights synced at step k − 1
  async_rollouts: bool = False  # generate batch k+1 while the learner trains on batch k (implies off_policy)
  max_staleness: int = 1  # off-policy: batch k is generated with the weights of step k − max_staleness; older: dropped
  placement: Literal["colocated", "disaggregated"] = "colocated"  # disaggregated: the sampler on its own devices
  max_nonfinite_steps: int = 3  # stop after this many non-finite steps in a row

  def _validate(self):
    self._check(self.seed >= 0, "seed", "must be >= 0")
    for name in ("steps", "sft_steps", "eval_every", "ckpt_every", "recover_steps", "recover_eval_every"):
      self._check(getattr(self, name) >= 0, name, "must be >= 0")
    self._check(self.batch_prompts >= 1, "batch_prompts", "must be >= 1")
    self._check(self.sft_batch is None or self.sft_batch >= 1, "sft_batch", "must be >= 1 or null")
    self._check(self.sft_lr is None or self.sft_lr > 0, "sft_lr", "must be > 0 or null")
    self._check(self.warmup_cache is None or bool(self.warmup_cache), "warmup_cache", "must be a directory or null")
    self._check(self.recover_lr is None or self.recover_lr > 0, "recover_lr", "must be > 0 or null")
    self._check(bool(self.out_dir), "out_dir", "must not be empty")
    self._check(self.max_nonfinite_steps >= 1, "max_nonfinite_steps", "must be >= 1")
    self._check(self.max_staleness >= 1, "max_staleness", "must be >= 1")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DapoSection(Schema):
  """DAPO's dynamic sampling and overlong shaping (Yu et al. 2025; lrl_jax/rl/dapo.py). All off by default; DAPO
  itself runs all three (L_cache = 4096 of L_max = 20480, penalty 1)."""

  section: ClassVar[str] = "dapo"

  dynamic_sampling: bool = False  # drop groups whose rewards are all equal; sample more prompts to fill the batch
  max_rounds: int = 3  # generation rounds per step at most (the first included); then fill with dropped groups
  overlong_buffer: int = 0  # L_cache: tokens before sampler.max_new_tokens over which the length penalty grows; 0 = off
  overlong_penalty: float = 1.0  # the penalty at sampler.max_new_tokens (DAPO: 1)
  overlong_filter: bool = False  # completions cut at sampler.max_new_tokens without EOS leave the loss

  def _validate(self):
    self._check(self.max_rounds >= 1, "max_rounds", "must be >= 1")
    self._check(self.overlong_buffer >= 0, "overlong_buffer", "must be >= 0")
    self._check(self.overlong_penalty >= 0, "overlong_penalty", "must be >= 0")


# --------------------------------------------------------------------------- the whole config


def _learner_given(
  quant_s: QuantSection, sampler: SamplerSection, run: RunSection, learner: Mapping[str, Any] | LearnerConfig
) -> dict:
  """The `set_by` fields of the learner: QAT spec and targets from `quant`, the temperature π is computed at from
  `sampler` (that of μ; 1 for greedy rollouts, as μ is then reported), the cosine length from `run`."""
  get = (
    (lambda k: getattr(learner, k))
    if isinstance(learner, LearnerConfig)
    else (lambda k: learner.get(k, getattr(LearnerConfig, k)))
  )
  total = None
  try:
    if get("schedule") == "cosine":
      total = max(run.steps * int(get("minibatches")), int(get("warmup_steps")) + 1)
  except (TypeError, ValueError):  # a mistyped value: the learner's own check names it
    pass
  temperature = sampler.temperature if sampler.temperature > 0 else 1.0
  return {
    "qat": quant_s.learner_spec,
    "qat_targets": quant_s.targets,
    "qat_keep_last_layers": quant_s.wag_keep_last_layers,
    "total_steps": total,
    "temperature": temperature,
  }


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
  """A whole run: one section per component, checked together in `__post_init__`."""

  model: ModelSection = dataclasses.field(default_factory=ModelSection)  # the policy model
  quant: QuantSection = dataclasses.field(default_factory=QuantSection)  # learner QAT and sampler formats
  sampler: SamplerSection = dataclasses.field(default_factory=SamplerSection)  # rollout generation
  learner: LearnerConfig = dataclasses.field(default_factory=LearnerConfig)  # the learner (lrl_jax.learner)
  task: TaskSection = dataclasses.field(default_factory=TaskSection)  # prompts and reward
  run: RunSection = dataclasses.field(default_factory=RunSection)  # steps, batches, warm-up, outputs
  dapo: DapoSection = dataclasses.field(default_factory=DapoSection)  # DAPO dynamic sampling, overlong shaping

  def __post_init__(self):
    for name, cls in SECTIONS.items():
      if not isinstance(getattr(self, name), cls):
        raise ConfigError(f"Config.{name} must be a {cls.__name__}; got {type(getattr(self, name)).__name__}")
    given = _learner_given(self.quant, self.sampler, self.run, self.learner)
    if any(getattr(self.learner, k) != v for k, v in given.items()):
      object.__setattr__(self, "learner", self.learner.replace(**given))
    m, q, s, lrn, t, r = self.model, self.quant, self.sampler, self.learner, self.task, self.run
    if lrn.policy_loss in ("grpo", "gspo") and s.group_size < 2:
      raise ConfigError(
        f"sampler.group_size={s.group_size} must be >= 2 for learner.policy_loss={lrn.policy_loss} "
        "(group advantages compare completions of one prompt)"
      )
    d = self.dapo
    if d.dynamic_sampling and lrn.policy_loss == "ppo":
      raise ConfigError(
        "dapo.dynamic_sampling drops groups whose group advantages are 0: it needs learner.policy_loss grpo or gspo "
        "(ppo's advantages come from the critic)"
      )
    if d.overlong_buffer > s.max_new_tokens:
      raise ConfigError(
        f"dapo.overlong_buffer={d.overlong_buffer} must not exceed sampler.max_new_tokens={s.max_new_tokens} (L_max)"
      )
    if r.recover_steps and (q.learner == "none" or lrn.lora is not None):
      raise ConfigError(
        f"run.recover_steps={r.recover_steps} distils the float model into its QAT copy: it needs quant.learner "
        f"set (got {q.learner!r}) and full fine-tuning (learner.lora null)"
      )
    if r.placement == "disaggregated" and s.mesh is None:
      raise ConfigError(
        "run.placement=disaggregated puts the sampler on devices of its own: it needs sampler.mesh, the (data, "
        "tensor) sizes of its mesh (e.g. [1, 4]); the learner takes the devices before them (learner.mesh)"
      )
    rollouts, split = r.batch_prompts * s.group_size, lrn.minibatches * lrn.micro_batches
    if rollouts % split:
      raise ConfigError(
        f"run.batch_prompts × sampler.group_size = {rollouts} completions must divide into "
        f"learner.minibatches × learner.micro_batches = {split} equal parts"
      )
    if t.name == "prompts" and t.reward not in (None, "exact", "last_number"):
      from lrl_jax.tasks import resolve_reward  # noqa: PLC0415  (only a module:function reward needs it)

      try:
        resolve_reward(t.reward)
      except ValueError as e:
        raise ConfigError(str(e)) from None
    if m.source == "tiny":
      if t.template != "none" or t.name != "arithmetic":
        raise ConfigError(
          f"model.source=tiny uses the arithmetic character tokenizer: it needs task.name=arithmetic "
          f"and task.template=none; got task.name={t.name}, task.template={t.template}"
        )
      block = q.block
      dims = {"model.hidden_size": m.hidden_size, "model.intermediate_size": m.intermediate_size}
      if q.sampler == "fp8" and block is not None:
        dims["model.num_kv_heads × head_dim"] = m.num_kv_heads * m.head_dim
      for name, d in dims.items():
        if block is not None and d % block:
          raise ConfigError(
            f"{name}={d} is not a multiple of the {q.sampler} block {block} (quant.sampler); "
            "choose sizes the format's blocks divide, or a smaller quant.group_size / quant.fp8_block"
          )

  def to_dict(self) -> dict[str, dict[str, Any]]:
    """{section: {key: value}} of every YAML key (nested sections as mappings, tuples as lists)."""
    return {name: getattr(self, name).to_dict() for name in SECTIONS}

  def dump_yaml(self, path=None) -> str:
    """The resolved config as YAML (written to `path` when given); `load_config` reads it back equal."""
    text = "# lrl_jax resolved config (every value; load with lrl_jax.config.load_config)\n" + yaml.safe_dump(
      self.to_dict(), sort_keys=False, allow_unicode=True
    )
    if path is not None:
      Path(path).write_text(text, encoding="utf-8")
    return text

  @classmethod
  def from_dict(cls, data: Mapping[str, Any], *, source: str = "config") -> "Config":
    """Builds a Config from {section: {key: value}}; missing sections and keys keep their defaults."""
    if not isinstance(data, Mapping):
      raise ConfigError(f"{source}: expected a mapping of sections ({', '.join(SECTIONS)}); got {type(data).__name__}")
    for name, values in data.items():
      if name not in SECTIONS:
        raise ConfigError(
          f"{source}: unknown section {name!r}{suggest(name, list(SECTIONS))}; valid sections: {', '.join(SECTIONS)}"
        )
      if values is not None and not isinstance(values, Mapping):
        raise ConfigError(
          f"{source}: section {name!r} must be a mapping of keys to values; got {type(values).__name__}"
        )
    values = {name: dict(data.get(name) or {}) for name in SECTIONS}
    try:
      built = {name: SECTIONS[name].from_mapping(values[name]) for name in SECTIONS if name != "learner"}
      built["learner"] = LearnerConfig.from_mapping(
        values["learner"], **_learner_given(built["quant"], built["sampler"], built["run"], values["learner"])
      )
      return cls(**built)
    except ConfigError as e:
      raise ConfigError(f"{source}: {e}") from None


SECTIONS: dict[str, type[Schema]] = {
  "model": ModelSection,
  "quant": QuantSection,
  "sampler": SamplerSection,
  "learner": LearnerConfig,
  "task": TaskSection,
  "run": RunSection,
  "dapo": DapoSection,
}


def load_config(path=None, overrides: Sequence[str] = ()) -> Config:
  """Reads a YAML config (None: all defaults) and applies `section.key=value` overrides in order.

  Raises:
    FileNotFoundError: no such file. ConfigError: unknown section or key, wrong type, bad choice or a rule of
      a section, naming the key and listing the valid keys / choices.
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
    raise ConfigError(f"{source}: expected a mapping of sections ({', '.join(SECTIONS)}); got {type(data).__name__}")
  try:
    return Config.from_dict(merge_overrides(data, overrides, SECTIONS), source=source)
  except ConfigError as e:
    # A value that came from the command line is named as the override it was, not as the file's.
    given = [o for o in overrides if "=" in o and f"{o.split('=', 1)[0].strip()}=" in str(e).replace("'", "")]
    if given:
      raise ConfigError(f"override {given[-1]}: {str(e).removeprefix(f'{source}: ')}") from None
    raise


def apply_overrides(config: Config, overrides: Sequence[str]) -> Config:
  """`config` with `section.key=value` overrides applied (same parsing and checks as `load_config`)."""
  return Config.from_dict(merge_overrides(config.to_dict(), overrides, SECTIONS), source="overrides")


def describe() -> str:
  """Every section and key with its type, default and comment (for `lrl-jax train --help-config`)."""
  return _describe(SECTIONS)
