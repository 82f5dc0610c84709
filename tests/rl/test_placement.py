"""Placement of the learner and the sampler (`run.placement`, `sampler.mesh`): which devices each side gets, and the
weight sync that quantizes on the learner's devices and moves the packed low-bit tree to the sampler's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lrl_jax import learner as L
from lrl_jax import models, quant
from lrl_jax.config import ConfigError, load_config
from lrl_jax.quant.rules import path_str
from lrl_jax.rl import sync
from lrl_jax.rl.setup import learner_mesh, sampler_mesh
from lrl_jax.rl.sync import align_for_quantize

QS = "configs/quickstart.yaml"


def _ids(mesh):
  return sorted(d.id for d in mesh.devices.flat)


def test_disaggregated_sampler_takes_the_last_devices_and_the_learner_the_rest():
  assert jax.device_count() == 8  # tests/conftest.py
  cfg = load_config(QS, ["run.placement=disaggregated", "sampler.mesh=[1,2]", "learner.mesh=[-1,1,1]"])
  lm, sm = learner_mesh(cfg), sampler_mesh(cfg)
  assert _ids(lm) == [0, 1, 2, 3, 4, 5] and dict(lm.shape) == {"data": 6, "fsdp": 1, "tensor": 1}
  assert _ids(sm) == [6, 7] and dict(sm.shape) == {"data": 1, "tensor": 2}
  # colocated: the sampler's mesh on the first devices, which the learner uses too
  cfg = load_config(QS, ["sampler.mesh=[2,2]", "learner.mesh=[-1,1,1]"])
  assert _ids(sampler_mesh(cfg)) == [0, 1, 2, 3] and _ids(learner_mesh(cfg)) == list(range(8))
  # no sampler mesh (the default): the served tree stays where the sync leaves it
  assert sampler_mesh(load_config(QS, [])) is None


@pytest.mark.parametrize(
  "overrides,message",
  [
    (["run.placement=disaggregated"], "run.placement=disaggregated puts the sampler on devices of its own: it needs"),
    (["run.placement=disaggregated", "sampler.mesh=[2,4]"], "takes 8 devices of the 8 visible and leaves none"),
    (
      ["run.placement=disaggregated", "sampler.mesh=[1,4]", "learner.mesh=[8,1,1]"],
      "learner.mesh=(8, 1, 1) needs 8 devices; the 4 left to the learner by sampler.mesh=(1, 4) are there",
    ),
    (["sampler.mesh=[4,4]"], "sampler.mesh=(4, 4) needs 16 devices; 8 are visible"),
    (["sampler.mesh=[0,4]"], "sampler.mesh"),
  ],
)
def test_placement_errors_name_the_keys_and_the_device_counts(overrides, message):
  with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
    cfg = load_config(QS, overrides)
    learner_mesh(cfg), sampler_mesh(cfg)


def _params():
  cfg = models.ModelConfig(
    arch="qwen2", vocab_size=24, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2
  )
  return models.init_params(cfg, jax.random.PRNGKey(0), std=0.5)


def _flat(tree):
  isq = lambda x: isinstance(x, quant.QArray)  # noqa: E731
  out = {}
  for kp, x in jax.tree_util.tree_leaves_with_path(tree, is_leaf=isq):
    fields = {"": x} if not isq(x) else {f: getattr(x, f) for f in ("codes", "scale", "global_scale")}
    out.update({f"{path_str(kp)}.{f}": a for f, a in fields.items() if a is not None})
  return out


@pytest.mark.parametrize("fmt", ["int4", "nvfp4", "bf16"])
def test_sync_moves_the_packed_tree_to_the_sampler_devices_bit_for_bit(fmt):
  """Quantized on the learner's (fsdp-sharded) devices, moved to the sampler's disjoint mesh: every code and scale
  equals the single-device sync's bit for bit, every shard lives on the sampler's devices only, and the bytes moved
  are the packed formats' (INT4: K·N/2 code bytes + (K/32)·N bf16 scales per kernel)."""
  cfg = load_config(
    QS, [f"quant.sampler={fmt}", "quant.learner=none", "run.placement=disaggregated", "sampler.mesh=[1,4]"]
  )
  lm, sm = L.make_mesh(fsdp=4, devices=jax.devices()[:4]), sampler_mesh(cfg)
  params = _params()
  on_learner = jax.device_put(params, L.param_shardings(jax.eval_shape(lambda: params), lm))
  t: dict = {}
  moved = sync(on_learner, cfg, mesh=sm, timings=t)
  want = _flat(sync(params, cfg))
  got = _flat(moved)
  assert set(got) == set(want)
  for k, a in got.items():
    assert {d.id for d in a.sharding.device_set} <= {4, 5, 6, 7}, k
    assert a.dtype == want[k].dtype and a.shape == want[k].shape, k
    np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(want[k]).view(np.uint8), err_msg=k)
  assert set(t) == {"sync_s", "sync_quantize_s", "sync_transfer_s", "sync_bytes"}
  assert t["sync_bytes"] == quant.tree_nbytes(moved) == sum(int(np.asarray(a).nbytes) for a in got.values())
  if fmt == "int4":
    k = moved["layers"]["mlp"]["up_proj"]["kernel"]  # [L, K=64, N=128], groups of 32 along K
    assert k.codes.nbytes == 2 * 64 * 128 // 2 and k.scale.nbytes == 2 * (64 // 32) * 128 * 2
  if fmt == "bf16":
    n = sum(x.size for x in jax.tree_util.tree_leaves(params))
    assert t["sync_bytes"] == 2 * n and all(a.dtype == jnp.bfloat16 for a in got.values())


def test_misaligned_kernels_names_the_kernels_whose_k_shard_splits_a_group():
  """SmolLM2-135M shapes (D = 576, F = 1536; eval_shape only). On fsdp=4, the kernels with K = D (q, k, v, gate, up)
  have 144-row shards: INT4 g64 groups straddle them, NVFP4 16-blocks do not; down_proj and
  o_proj put K on the tensor axis (size 1 here). fsdp=3: 192-row shards, 3 groups of 64 each: nothing to report."""
  from lrl_jax.rl.setup import misaligned_kernels  # noqa: PLC0415

  abstract = jax.eval_shape(lambda: models.init_params(models.SMOLLM2_135M, jax.random.PRNGKey(0)))
  g64 = quant.QuantRules.default(quant.Int4(group_size=64))
  fsdp4 = L.make_mesh(fsdp=4, devices=jax.devices()[:4])
  got = misaligned_kernels(abstract, g64, fsdp4)
  names = sorted(x.split(":")[0] for x in got)
  want = [f"layers/{m}/{k}/kernel" for m, k in (("attn", "k_proj"), ("attn", "q_proj"), ("attn", "v_proj"))]
  want += [f"layers/mlp/{k}/kernel" for k in ("gate_proj", "up_proj")]
  assert names == sorted(want), got
  assert "K=576 over fsdp=4 is 144 rows per shard, blocks of 64" in got[0]
  assert misaligned_kernels(abstract, quant.QuantRules.default(quant.NVFP4()), fsdp4) == []
  assert misaligned_kernels(abstract, quant.QuantRules.default(quant.FP8()), fsdp4) == []  # per channel: all of K
  assert misaligned_kernels(abstract, g64, L.make_mesh(fsdp=3, devices=jax.devices()[:3])) == []
  assert misaligned_kernels(abstract, g64, None) == [] and misaligned_kernels(abstract, None, fsdp4) == []


def test_align_for_quantize_moves_fsdp_from_k_to_n_where_a_group_straddles_shards():
  """D = 64 on fsdp = 4: 16-row K shards. INT4 g32 groups straddle them: the sync moves fsdp onto N (the values are
  unchanged, only the layout: the sync test above checks the served codes bit for bit); NVFP4's 16-blocks fit, so
  its kernels keep their sharding; a kernel whose K sits on the (size-1) tensor axis is left alone."""
  from jax.sharding import PartitionSpec as P  # noqa: PLC0415

  lm = L.make_mesh(fsdp=4, devices=jax.devices()[:4])
  params = _params()
  on_learner = jax.device_put(params, L.param_shardings(jax.eval_shape(lambda: params), lm))
  g32 = quant.QuantRules.default(quant.Int4(group_size=32))
  got = align_for_quantize(on_learner, g32)
  q_before = on_learner["layers"]["attn"]["q_proj"]["kernel"]
  q = got["layers"]["attn"]["q_proj"]["kernel"]
  assert q_before.sharding.spec == P(None, "fsdp", "tensor")
  assert q.sharding.spec == P(None, None, ("tensor", "fsdp"))
  np.testing.assert_array_equal(np.asarray(q), np.asarray(q_before))
  assert got["layers"]["attn"]["o_proj"]["kernel"] is on_learner["layers"]["attn"]["o_proj"]["kernel"]  # K on tensor
  assert got["embed"]["embedding"] is on_learner["embed"]["embedding"]  # not quantized
  nv = align_for_quantize(on_learner, quant.QuantRules.default(quant.NVFP4()))
  assert nv["layers"]["attn"]["q_proj"]["kernel"] is q_before
  assert (
    align_for_quantize(params, g32)["layers"]["attn"]["q_proj"]["kernel"]
    is params["layers"]["attn"]["q_proj"]["kernel"]
  )
