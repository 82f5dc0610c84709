"""Config: every configs/*.yaml loads; overrides parse with their field's type; unknown keys, wrong types and
bad choices raise ConfigError listing what is valid; dump -> load is the identity."""

import dataclasses
import typing
from pathlib import Path

import pytest

from lrl_jax import config as C
from lrl_jax import schema
from lrl_jax.config import Config, ConfigError, apply_overrides, load_config
from lrl_jax.learner import LearnerConfig

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))
REQUIRED = {
  "quickstart",
  "int4_qat_grpo",
  "int4_rollout_no_qat",
  "fp8_rollout_none",
  "fp8_rollout_tis",
  "fp8_rollout_mis",
  "fp8_rollout_acrl",
  "nvfp4_lora",
  "ppo_qae",
  "ppo_baseline",
  "bf16_baseline",
  "smollm2_int4_qat_grpo",
}


def test_required_configs_exist():
  assert REQUIRED <= {p.stem for p in CONFIGS}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_config_loads_and_round_trips(path, tmp_path):
  assert path.read_text().startswith("#"), "each config starts with a comment saying what it is"
  cfg = load_config(path)
  out = tmp_path / "resolved.yaml"
  cfg.dump_yaml(out)
  assert load_config(out) == cfg
  assert Config.from_dict(cfg.to_dict()) == cfg


def test_configs_say_what_they_claim():
  cfg = {p.stem: load_config(p) for p in CONFIGS}
  q = cfg["quickstart"]
  assert (q.model.source, q.quant.learner, q.quant.sampler, q.task.name) == ("tiny", "int4", "int4", "arithmetic")
  assert q.run.sft_steps > 0 and q.learner.policy_loss == "grpo"
  assert cfg["int4_rollout_no_qat"].quant.learner == "none" and cfg["int4_rollout_no_qat"].quant.sampler == "int4"
  assert cfg["bf16_baseline"].quant.sampler == "bf16"
  assert cfg["nvfp4_lora"].learner.lora is not None and cfg["nvfp4_lora"].quant.sampler == "nvfp4"
  assert cfg["ppo_qae"].learner.value.quantized and not cfg["ppo_baseline"].learner.value.quantized
  s = cfg["smollm2_int4_qat_grpo"]
  assert (s.model.source, s.task.template, s.task.name) == ("smollm2", "chat", "arithmetic")
  # The FP8 arms differ only in the correction (and their output directory).
  base = cfg["fp8_rollout_none"].to_dict()
  for m in ("tis", "mis", "acrl"):
    d = cfg[f"fp8_rollout_{m}"].to_dict()
    assert d["learner"]["correction"]["method"] == m
    assert {k: v for k, v in d.items() if k not in ("learner", "run")} == {
      k: v for k, v in base.items() if k not in ("learner", "run")
    }
    assert {**d["learner"], "correction": None} == {**base["learner"], "correction": None}
    assert {**d["run"], "out_dir": None} == {**base["run"], "out_dir": None}
  # The experiment arms share model, data, steps and seeds.
  arms = [c for n, c in cfg.items() if not n.startswith(("quickstart", "smollm2", "dapo"))]
  # The asynchronous quickstart is the quickstart with its placement (and its output directory).
  a, b = cfg["quickstart_async"].to_dict(), q.to_dict()
  assert (a["run"].pop("placement"), a["run"].pop("async_rollouts"), a["sampler"].pop("mesh")) == (
    "disaggregated",
    True,
    [1, 4],
  )
  assert a["learner"].pop("mesh") == [4, 1, 1] and a["run"].pop("out_dir") != b["run"].pop("out_dir")
  for sec, key in (("run", "placement"), ("run", "async_rollouts"), ("sampler", "mesh"), ("learner", "mesh")):
    b[sec].pop(key)
  assert a == b
  assert len({(c.model, c.task, c.run.steps, c.run.seed, c.run.sft_steps, c.run.batch_prompts) for c in arms}) == 1
  # The DAPO configs are their base configs plus the dapo section (and, on the quickstart, room for the length penalty).
  for name, base_name in (("dapo_quickstart", "quickstart"), ("dapo_smollm2", "smollm2_grpo")):
    d, b = cfg[name].to_dict(), cfg[base_name].to_dict()
    assert d["dapo"]["dynamic_sampling"] and d["dapo"]["overlong_filter"] and d["dapo"]["overlong_buffer"] > 0, name
    d["run"]["out_dir"] = b["run"]["out_dir"]
    d["sampler"]["max_new_tokens"] = b["sampler"]["max_new_tokens"]
    assert {k: v for k, v in d.items() if k != "dapo"} == {k: v for k, v in b.items() if k != "dapo"}, name
  assert cfg["dapo_quickstart"].sampler.max_new_tokens - cfg["dapo_quickstart"].dapo.overlong_buffer >= 4  # "123"+EOS
  # The SmolLM2 arms (docs/smollm2_results.md): the same model, task, sampler and schedule; each differs from the
  # bf16 arm only in its formats, correction, LoRA (and its learning rate) and the INT4 recovery.
  own = cfg["smollm2_own_task"]
  assert (own.task.name, own.task.reward) == ("prompts", "last_number") and own.model.source == "smollm2"
  real = {n: c for n, c in cfg.items() if n.startswith("smollm2") and n != "smollm2_own_task"}
  assert set(real) == {f"smollm2_{a}" for a in ("grpo", "int4_qat_grpo", "int4_rollout", "fp8", "fp8_tis", "fp8_acrl",
                                                 "nvfp4_lora")}  # fmt: skip
  ref = real["smollm2_grpo"]
  for name, c in real.items():
    assert (c.model, c.task, c.sampler) == (ref.model, ref.task, ref.sampler), name
    assert {**c.run.to_dict(), "out_dir": 0, "recover_steps": 0, "recover_lr": 0, "recover_eval_every": 0} == {
      **ref.run.to_dict(),
      "out_dir": 0,
      "recover_steps": 0,
      "recover_lr": 0,
      "recover_eval_every": 0,
    }, name
    same = ("lr", "qat", "qat_targets", "correction", "lora")
    assert {k: v for k, v in c.learner.to_dict().items() if k not in same} == {
      k: v for k, v in ref.learner.to_dict().items() if k not in same
    }, name
  assert real["smollm2_int4_qat_grpo"].run.recover_steps > 0 and real["smollm2_int4_qat_grpo"].quant.learner == "int4"
  assert real["smollm2_fp8_acrl"].learner.correction.method == "acrl" and real["smollm2_fp8"].quant.act == "fp8"


def test_overrides_apply_with_types():
  cfg = load_config(
    CONFIGS[0].parent / "quickstart.yaml",
    [
      "learner.lr=1e-4",
      "run.steps=7",
      "run.off_policy=true",
      "quant.sampler=int4",
      "learner.value.boundaries=[10, 20]",
      "task.user_template=12{prompt}",
      "run.sft_batch=null",
      "learner.mesh=[2, 2, 2]",
      "learner.correction.method=tis",
      "task.ops=['+', 'eq']",
    ],
  )
  assert cfg.learner.lr == 1e-4 and type(cfg.learner.lr) is float  # YAML 1.1 reads '1e-4' as a string
  assert cfg.run.steps == 7 and type(cfg.run.steps) is int
  assert cfg.run.off_policy is True
  assert cfg.learner.value.boundaries == (10, 20) and cfg.learner.mesh == (2, 2, 2)
  assert cfg.task.user_template == "12{prompt}" and cfg.run.sft_batch is None
  assert cfg.learner.correction.method == "tis" and cfg.learner.correction.level is None  # null: tis_weights' default
  assert cfg.task.ops == ("+", "eq")
  assert apply_overrides(cfg, ["run.steps=9"]).run.steps == 9
  assert load_config(None, ["run.out_dir=2024"]).run.out_dir == "2024"  # text fields keep the text
  # Later overrides win; integer literals widen to float fields.
  assert load_config(None, ["learner.lr=1", "learner.lr=2"]).learner.lr == 2.0


@pytest.mark.parametrize(
  "override, message",
  [
    (
      "learner.lrr=1",
      "unknown key 'learner.lrr' (did you mean 'lr'?); valid keys in learner: lr, weight_decay, b1, "
      "b2, eps, nesterov, grad_clip",
    ),
    (
      "lerner.lr=1",
      "unknown section 'lerner' in override 'lerner.lr=1' (did you mean 'learner'?); valid sections: "
      "model, quant, sampler, learner, task, run",
    ),
    ("quant.sampler=int3", "quant.sampler='int3' must be one of bf16, int4, fp8, nvfp4, mxfp8"),
    ("run.steps=abc", "run.steps='abc' must be an int"),
    ("run.steps=2.5", "run.steps=2.5 must be an int"),
    ("run.off_policy=2", "run.off_policy=2 must be a bool (true / false)"),
    ("learner.lr=fast", "learner.lr='fast' must be a float"),
    ("run.sft_lr=fast", "run.sft_lr='fast' must be a float or null"),
    ("learner.mesh=[1, 2]", "learner.mesh=[1, 2] must be a list of 3 values (an int, an int, an int)"),
    ("task.ops=['/']", "task.ops[0]='/' must be one of +, -, *, eq"),
    ("learner.lr=-1", "learner.lr=-1.0 must be > 0"),
    ("learner.correction.method=mis", None),  # valid
    ("run.steps", "override 'run.steps' must be section.key=value"),
    ("steps=3", "override key 'steps' must be section.key"),
    ("learner.section=x", "unknown key 'learner.section'"),
  ],
)
def test_override_errors_list_what_is_valid(override, message):
  if message is None:
    load_config(None, [override])
    return
  with pytest.raises(ConfigError) as e:
    load_config(None, [override])
  assert message in str(e.value), str(e.value)


@pytest.mark.parametrize(
  "overrides, message",
  [
    (["quant.learner=int4", "quant.sampler=fp8"], "quant.learner='int4' needs quant.sampler='int4'"),
    (["quant.sampler=int4"], "model.hidden_size=64 is not a multiple of the int4 block 128"),
    (["sampler.group_size=1"], "sampler.group_size=1 must be >= 2 for learner.policy_loss=grpo"),
    (["learner.minibatches=3"], "must divide into learner.minibatches × learner.micro_batches = 3"),
    (["task.template=chat"], "model.source=tiny uses the arithmetic character tokenizer"),
    (["task.name=gsm8k"], "task.path=None is required for task.name=gsm8k"),
    (
      ["learner.correction.method=tis", "learner.correction.level=geometric"],
      "learner.correction.level='geometric' must be one of token, sequence for method tis",
    ),
    (["model.source=hf:"], 'model.source=\'hf:\' must be "tiny", "smollm2", "hf:<dir>" or "gguf:<file>"'),
    (["model.num_kv_heads=3"], "model.num_kv_heads=3 must divide num_heads=4"),
    (["learner.lora.targets=(unclosed"], "learner.lora.targets='(unclosed' is not a valid regex"),
  ],
)
def test_rules_across_fields(overrides, message):
  with pytest.raises(ConfigError) as e:
    load_config(None, overrides)
  assert message in str(e.value), str(e.value)


def test_yaml_errors_name_the_file(tmp_path):
  p = tmp_path / "bad.yaml"
  p.write_text("learner:\n  lrr: 1.0\n")
  with pytest.raises(
    ConfigError,
    match=r"bad\.yaml: unknown key 'learner\.lrr' \(did you mean 'lr'\?\); "
    r"valid keys in learner: lr, ",
  ):
    load_config(p)
  p.write_text("learner: 3\n")
  with pytest.raises(ConfigError, match="section 'learner' must be a mapping"):
    load_config(p)
  p.write_text("sampler:\n  temperature: hot\n")
  with pytest.raises(ConfigError, match=r"bad\.yaml: sampler\.temperature='hot' must be a float"):
    load_config(p)
  p.write_text("- a\n- b\n")
  with pytest.raises(ConfigError, match="expected a mapping of sections"):
    load_config(p)
  with pytest.raises(FileNotFoundError, match="nope.yaml"):
    load_config(tmp_path / "nope.yaml")


def test_sections_type_check_in_python_too():
  with pytest.raises(ConfigError, match="learner.lr='x' must be a float"):
    LearnerConfig(lr="x")
  with pytest.raises(ConfigError, match="Config.learner must be a LearnerConfig"):
    Config(learner={"lr": 1.0})
  assert LearnerConfig(policy_loss="gspo").clip_eps_low is None  # null: gspo_loss's own default (3e-4)
  with pytest.raises(dataclasses.FrozenInstanceError):
    Config().run.steps = 3


def test_schema_matches_the_library():
  from lrl_jax.losses import AGG_MODES

  assert typing.get_args(typing.get_type_hints(LearnerConfig)["agg"]) == AGG_MODES
  hint = typing.get_type_hints(C.QuantSection)["sampler"]
  assert set(typing.get_args(hint)) - {"bf16"} == {"int4", "fp8", "nvfp4", "mxfp8"}


def _configs(cls):
  """A config class and the nested config classes of its fields."""
  out = [cls]
  for f in dataclasses.fields(cls):
    sub = schema._schema_of(typing.get_type_hints(cls)[f.name])
    if sub is not None:
      out += _configs(sub)
  return out


def test_every_field_has_a_one_line_comment():
  text = C.describe()
  for name, top in C.SECTIONS.items():
    for cls in _configs(top):
      comments = schema.field_comments(cls)
      for f in dataclasses.fields(cls):
        assert comments.get(f.name), f"{cls.section}.{f.name} has no comment"
        if f.name in cls.keys():
          assert f"  {f.name}: " in text


def test_sections_build_the_library_objects():
  from lrl_jax import quant
  from lrl_jax.models import ModelConfig
  from lrl_jax.sampler import SamplingConfig

  cfg = {p.stem: load_config(p) for p in CONFIGS}
  q = cfg["quickstart"].quant
  assert q.learner_spec == q.sampler_spec == quant.Int4(group_size=32)
  assert cfg["int4_rollout_no_qat"].quant.learner_spec is None
  assert cfg["bf16_baseline"].quant.sampler_spec is None
  assert cfg["fp8_rollout_tis"].quant.sampler_spec == quant.FP8(granularity="channel")
  assert cfg["fp8_rollout_tis"].quant.act_spec == quant.FP8(granularity="token")
  assert cfg["nvfp4_lora"].quant.sampler_spec == quant.NVFP4()
  assert load_config(None, ["quant.sampler=mxfp8", "quant.learner=mxfp8"]).quant.learner_spec == quant.MXFP8()
  rules = q.rules(q.sampler_spec)
  assert rules.spec_for("layers/attn/q_proj/kernel") == quant.Int4(group_size=32)
  assert rules.spec_for("layers/mlp/down_proj/kernel") == quant.Int4(group_size=32)
  for kept in ("embed/embedding", "lm_head/kernel", "layers/attn/q_proj/bias", "layers/input_norm/scale"):
    assert rules.spec_for(kept) is None
  m = cfg["quickstart"].model.tiny_model_config(vocab_size=20, dtype="float32")
  assert m == ModelConfig(
    arch="qwen2",
    vocab_size=20,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    tie_word_embeddings=True,
    dtype="float32",
    param_dtype="float32",
  )
  with pytest.raises(ConfigError, match="only the tiny model"):
    cfg["smollm2_int4_qat_grpo"].model.tiny_model_config(vocab_size=20)
  s = cfg["quickstart"].sampler
  assert s.sampling(eos_id=2, pad_id=0) == SamplingConfig(max_new_tokens=4, temperature=1.0, eos_id=2, pad_id=0)
  assert s.sampling(eos_id=2, pad_id=0, evaluation=True).temperature == 0.0


def test_the_learner_section_is_the_library_config():
  """One schema: the YAML `learner` section is `learner.LearnerConfig` itself; every key reaches it as typed
  (the ones a hand mapping used to drop included), the run only supplies the `set_by` fields, and a learner
  error names the key as the user typed it."""
  cfg = load_config(
    None,
    [
      "learner.b1=0.8",
      "learner.b2=0.99",
      "learner.eps=1e-6",
      "learner.min_lr_ratio=0.1",
      "learner.norm_len=8",
      "learner.correction.method=mis",
      "learner.correction.keep_ratio=true",
    ],
  )
  lrn = cfg.learner
  assert type(lrn) is LearnerConfig
  assert (lrn.b1, lrn.b2, lrn.eps, lrn.min_lr_ratio, lrn.norm_len) == (0.8, 0.99, 1e-6, 0.1, 8)
  assert lrn.correction.method == "mis" and lrn.correction.keep_ratio is True
  assert lrn == LearnerConfig.from_mapping(cfg.to_dict()["learner"])  # YAML dict -> the library object, as is
  # The set_by fields: the QAT spec and targets from `quant`, the cosine length from `run` (re-derived on change).
  c = load_config(
    None,
    [
      "quant.learner=int4",
      "quant.sampler=int4",
      "quant.group_size=32",
      "learner.schedule=cosine",
      "learner.minibatches=2",
      "run.steps=7",
      "run.batch_prompts=2",
    ],
  )
  assert c.learner.qat == quant_spec("int4") and c.learner.total_steps == 14
  assert c.learner.qat_rules == c.quant.rules(c.quant.sampler_spec)  # what the sampler serves
  assert apply_overrides(c, ["run.steps=9"]).learner.total_steps == 18
  assert "qat" not in c.to_dict()["learner"] and "total_steps" not in c.to_dict()["learner"]
  with pytest.raises(ConfigError, match="'learner.qat' is not a config key: it is set by quant.learner"):
    load_config(None, ["learner.qat=int4"])
  with pytest.raises(ConfigError, match=r"learner.correction.clip_c=0.8 must be > 1"):
    load_config(None, ["learner.correction.clip_c=0.8"])
  with pytest.raises(ConfigError, match=r"learner.grad_clip=0.0 must be > 0 or null"):
    load_config(None, ["learner.grad_clip=0"])  # one meaning of "off": null, in YAML and in Python
  with pytest.raises(ConfigError, match="unknown key 'learner.correction.metod' \\(did you mean 'method'\\?\\)"):
    load_config(None, ["learner.correction.metod=tis"])


def test_optional_nested_sections_switch_on_and_off():
  on = load_config(None, ["learner.lora.rank=4"])
  assert on.learner.lora.rank == 4 and on.learner.trainable == "lora"
  assert load_config(None, ["learner.lora.rank=4", "learner.lora=null"]).learner.lora is None
  assert load_config("configs/nvfp4_lora.yaml", ["learner.lora=null"]).learner.trainable == "full"
  with pytest.raises(ConfigError, match="is a section; set one of its keys"):
    load_config(None, ["learner.correction=tis"])
  with pytest.raises(ConfigError, match="'learner.lr' is a value, not a section"):
    load_config(None, ["learner.lr.x=1"])


def quant_spec(fmt):
  return C.QuantSection(learner=fmt, sampler=fmt, group_size=32).learner_spec
