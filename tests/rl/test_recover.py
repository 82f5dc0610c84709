"""The QAT recovery phase: its distillation step's KL against float64 NumPy of the teacher's and the QAT student's
distributions, and that repeated steps on one batch lower it; the config's checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lrl_jax import learner as L
from lrl_jax.config import ConfigError, load_config
from lrl_jax.rl.recover import _recover_step, recover_learner_config
from lrl_jax.rl.rollouts import encode_prompt_batch, generate_rollout
from lrl_jax.rl.setup import build_model
from lrl_jax.rl.sync import sync

OVR = [
  "quant.learner=int4",
  "quant.sampler=int4",
  "quant.group_size=16",
  "model.hidden_size=32",
  "model.intermediate_size=64",
  "model.init_std=0.3",  # peaked distributions: INT4 moves them measurably
  "learner.compute_dtype=float32",
  "sampler.dtype=float32",
  "run.batch_prompts=4",
  "sampler.group_size=4",
  "run.recover_steps=4",
  "run.recover_lr=3e-3",
]


def _np_kl(s, t, m):
  ls = s - np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1, keepdims=True)) - s.max(-1, keepdims=True)
  lt = t - np.log(np.exp(t - t.max(-1, keepdims=True)).sum(-1, keepdims=True)) - t.max(-1, keepdims=True)
  return float(((np.exp(lt) * (lt - ls)).sum(-1) * m).sum() / m.sum())


def test_recover_step_kl_matches_numpy_and_descends():
  cfg = load_config(None, OVR)
  setup = build_model(cfg)
  params = jax.tree_util.tree_map(lambda x: jnp.array(x, jnp.float32), setup.params)
  teacher = jax.tree_util.tree_map(jnp.copy, params)
  prompts, _ = setup.task.prompts(0, 4)
  tok, val = encode_prompt_batch(setup.task, prompts)
  roll = generate_rollout(sync(params, setup.sync), tok, val, setup, cfg, jax.random.PRNGKey(0), evaluation=False,
                          group_size=4)  # fmt: skip
  lcfg = recover_learner_config(cfg)
  assert lcfg.qat is not None and lcfg.temperature == 1.0 and lcfg.lr == 3e-3
  t_z, has = L.completion_logits(teacher, roll, setup.model_cfg, cfg=lcfg.without_qat())
  s_z, _ = L.completion_logits(params, roll, setup.model_cfg, cfg=lcfg)
  m = np.asarray(has & roll.loss_mask[:, roll.prompt_len :])
  want = _np_kl(np.asarray(s_z, np.float64), np.asarray(t_z, np.float64), m)
  assert want > 1e-4  # INT4 g16 of a random tiny model moves its distributions
  opt = L.make_optimizer(lcfg).init(params)
  kls = []
  for _ in range(4):
    params, opt, met = _recover_step(params, opt, teacher, roll, model_cfg=setup.model_cfg, lcfg=lcfg)
    kls.append(float(met["distill_kl"]))
  # f32 log-softmax over V = 20 of O(1) logits vs f64: ~1e-6 relative per term
  assert kls[0] == pytest.approx(want, rel=1e-4)
  assert kls[-1] < kls[0]  # descent on a fixed batch


def test_recover_needs_qat_and_full_training():
  with pytest.raises(ConfigError, match="recover_steps"):
    load_config(None, ["run.recover_steps=2"])
  with pytest.raises(ConfigError, match="lora"):
    load_config(None, OVR + ["learner.lora.rank=4"])
