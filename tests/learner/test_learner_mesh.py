"""Mesh, logical-axis rules, shardings of params / QArrays / LoRA / optimizer state; multihost wrapper."""

import jax
import jax.numpy as jnp
import pytest
from _learner_util import tiny_cfg
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

from lrl_jax import learner as L
from lrl_jax import models, quant

MC = tiny_cfg()


@pytest.fixture(scope="module")
def mesh():
  return L.make_mesh(data=2, fsdp=2, tensor=2)


def test_make_mesh(mesh):
  assert mesh.axis_names == ("data", "fsdp", "tensor")
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
  assert tuple(mesh.axis_types) == (AxisType.Auto,) * 3
  with pytest.raises(ValueError, match="8 devices"):
    L.make_mesh(data=2, fsdp=2)
  with pytest.raises(ValueError, match="tensor must be a positive int"):
    L.make_mesh(data=8, tensor=0)


def test_logical_to_spec_rules_and_fallback(mesh):
  assert L.logical_to_spec(("layers", "embed", "heads"), (2, 32, 32), mesh) == P(None, "fsdp", "tensor")
  assert L.logical_to_spec(("vocab", "embed"), (64, 32), mesh) == P("tensor", "fsdp")
  # 3 is not divisible by tensor = 2: that dimension falls back to replicated, the other keeps fsdp.
  assert L.logical_to_spec(("embed", "kv_heads"), (32, 3), mesh) == P("fsdp", None)
  # batch over (data, fsdp) = 4 rows per step of the split; a mesh axis is used at most once per array.
  assert L.logical_to_spec(("batch", "length", "embed"), (8, 5, 32), mesh, L.ACTIVATION_RULES) == P(
    ("data", "fsdp"), None, None
  )
  assert L.logical_to_spec(("heads", "mlp"), (4, 4), mesh) == P("tensor", None)
  with pytest.raises(ValueError, match="names"):
    L.logical_to_spec(("embed",), (4, 4), mesh)


def test_param_shardings_float_and_served(mesh):
  params = jax.eval_shape(lambda: models.init_params(MC, jax.random.PRNGKey(0)))
  sh = L.param_shardings(params, mesh)
  assert sh["embed"]["embedding"].spec == P("tensor", "fsdp")
  assert sh["layers"]["mlp"]["down_proj"]["kernel"].spec == P(None, "tensor", "fsdp")
  assert sh["layers"]["input_norm"]["scale"].spec == P(None, "fsdp")
  rules = quant.QuantRules.default(quant.Int4(group_size=32))
  # one compiled program (op by op, every leaf's quantize would compile its own dozen small ones)
  served = jax.jit(lambda p: quant.quantize_params(p, rules))(models.init_params(MC, jax.random.PRNGKey(0)))
  ssh = L.param_shardings(served, mesh)
  q = ssh["layers"]["attn"]["q_proj"]["kernel"]
  assert isinstance(q, quant.QArray)
  assert q.codes.spec == P(None, "fsdp", "tensor")  # codes [L, D/2 = 16, 32]
  assert q.scale.spec == P(None, None, "tensor")  # scale [L, D/32 = 1, 32]: 1 row does not split over fsdp
  placed = jax.device_put(served, ssh)
  assert placed["layers"]["attn"]["q_proj"]["kernel"].codes.sharding.spec == P(None, "fsdp", "tensor")


def test_state_shardings_follow_params(mesh):
  cfg = L.LearnerConfig(lora=models.LoraConfig(rank=4), policy_loss="ppo")  # LoRA adapters + a critic
  state = L.create_train_state(jax.random.PRNGKey(0), MC, cfg, mesh=mesh)
  a = state.lora.params["layers"]["mlp"]["up_proj"]["a"]  # [L, D, r]: (layers, embed, None)
  assert a.sharding.spec == P(None, "fsdp", None)
  mu = state.opt_state[1][0].mu
  assert mu["policy"]["layers"]["mlp"]["up_proj"]["a"].sharding.spec == P(None, "fsdp", None)
  assert mu["value_head"]["kernel"].sharding.spec == P()
  assert state.step.sharding.spec == P() and state.rng.sharding.spec == P()
  assert state.params["layers"]["attn"]["o_proj"]["kernel"].sharding.spec == P(None, "tensor", "fsdp")


def test_state_shardings_with_a_critic_lr(mesh):
  """value.lr (per-subtree clip and a stateless rescale of the head's updates in the chain): the Adam moments are
  still sharded like their parameters."""
  cfg = L.LearnerConfig(policy_loss="ppo", value=L.ValueConfig(lr=1e-2), compute_dtype="float32")
  state = L.create_train_state(jax.random.PRNGKey(0), MC, cfg, mesh=mesh)
  mu = state.opt_state[1][0].mu
  assert mu["policy"]["layers"]["attn"]["o_proj"]["kernel"].sharding.spec == P(None, "tensor", "fsdp")
  assert mu["value_head"]["kernel"].sharding.spec == P()


def test_shard_batch_checks_divisibility(mesh):
  with pytest.raises(ValueError, match="data\\*fsdp = 4"):
    L.shard_batch({"tokens": jnp.zeros((6, 3), jnp.int32)}, mesh)
  out = L.shard_batch({"tokens": jnp.zeros((8, 3), jnp.int32)}, mesh)
  assert out["tokens"].sharding.spec == P(("data", "fsdp"), None)


def test_initialize_distributed_single_process(monkeypatch):
  for k in (
    "LRL_JAX_COORDINATOR",
    "LRL_JAX_NUM_PROCESSES",
    "LRL_JAX_PROCESS_ID",
    "JAX_COORDINATOR_ADDRESS",
    "SLURM_JOB_ID",
    "OMPI_COMM_WORLD_SIZE",
    "TPU_WORKER_HOSTNAMES",
  ):
    monkeypatch.delenv(k, raising=False)
  assert L.initialize_distributed() is False
  with pytest.raises(ValueError, match="together"):
    L.initialize_distributed(coordinator_address="10.0.0.1:1234")
  with pytest.raises(ValueError, match="process_id < num_processes"):
    L.initialize_distributed(coordinator_address="10.0.0.1:1234", num_processes=2, process_id=2)
