"""No `learner:` YAML key is silently dropped on its way to the library.

The YAML `learner` section (`config.LearnerSection`) and the library's `learner.LearnerConfig` share field names;
`rl.setup.learner_config` maps one onto the other. Each shared field, set to a non-default value in YAML, must
arrive in LearnerConfig (through the documented translation where there is one); the section's other fields
are consumed by the RL loop itself (listed here, so that a new key fails this test until it is placed).
"""

import dataclasses

import pytest

from lrl_jax.config import LearnerSection, load_config
from lrl_jax.learner import LearnerConfig
from lrl_jax.rl.setup import learner_config

# Section keys the loop reads itself (rl.loop / rl.setup), not LearnerConfig.
LOOP_ONLY = {"sft_lr", "advantage", "minibatches", "mesh"}

# key -> (YAML override value, the LearnerConfig value it must become)
SHARED = {
    "lr": ("3e-4", 3e-4),
    "weight_decay": ("0.1", 0.1),
    "grad_clip": ("0.5", 0.5),
    "warmup_steps": ("7", 7),
    "schedule": ("cosine", "cosine"),
    "micro_batches": ("2", 2),
    "compute_dtype": ("float32", "float32"),
    "opt_state_dtype": ("bfloat16", "bfloat16"),
    "remat": ("true", True),
    "qat_start_step": ("3", 3),
    "qat_warmup_steps": ("4", 4),
    "qat_init": ("grid", "grid"),
    "int4_update_clip": ("2.0", 2.0),
    "policy_loss": ("gspo", "gspo"),
    "clip_eps_low": ("0.1", 0.1),
    "clip_eps_high": ("0.3", 0.3),
    "dual_clip_c": ("3.0", 3.0),
    "agg": ("seq-mean-token-sum", "seq-mean-token-sum"),
    "kl_coef": ("0.01", 0.01),
    "kl_estimator": ("k2", "k2"),
    "entropy_coef": ("0.01", 0.01),
}


def test_every_learner_key_has_a_home():
  section = {f.name for f in dataclasses.fields(LearnerSection)}
  library = {f.name for f in dataclasses.fields(LearnerConfig)}
  assert section & library == set(SHARED), "a key shared with LearnerConfig is missing from SHARED (or gone)"
  assert section - library == LOOP_ONLY, "a learner key is neither mapped to LearnerConfig nor read by the loop"


# Keys that only apply with an INT4 QAT learner.
NEEDS = {"qat_init": ["quant.learner=int4", "quant.sampler=int4", "quant.group_size=32"],
         "int4_update_clip": ["quant.learner=int4", "quant.sampler=int4", "quant.group_size=32"]}


@pytest.mark.parametrize("key", sorted(SHARED))
def test_shared_key_reaches_learner_config(key):
  yaml_value, want = SHARED[key]
  base = NEEDS.get(key, [])
  default = getattr(learner_config(load_config(None, base)), key)
  assert default != want, f"pick a non-default value for {key}"
  got = getattr(learner_config(load_config(None, [*base, f"learner.{key}={yaml_value}"])), key)
  assert got == want


def test_documented_translations():
  assert learner_config(load_config(None, ["learner.grad_clip=0"])).grad_clip is None  # YAML 0 = off
  assert learner_config(load_config(None, ["learner.policy_loss=grpo"])).policy_loss == "ppo"  # clipped surrogate
