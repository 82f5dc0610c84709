"""compressed-tensors export: schema, byte layout (checked against NumPy packings written here
from the format's description), and export -> import bit-exact against `quant.quantize`."""

import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from lrl_jax import quant
from lrl_jax.models import ModelConfig, decoder, hf
from lrl_jax.models import _checkpoint as ckpt
from lrl_jax.quant import NVFP4, Int4, QArray, QuantRules

PROJ = {
  "q_proj": "attn",
  "k_proj": "attn",
  "v_proj": "attn",
  "o_proj": "attn",
  "gate_proj": "mlp",
  "up_proj": "mlp",
  "down_proj": "mlp",
}


def cfg_for(arch="llama", tied=True):
  return ModelConfig(
    arch=arch,
    vocab_size=64,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    tie_word_embeddings=tied,
  )


def rand_params(cfg, seed=0):
  shapes = jax.eval_shape(lambda: decoder.init_params(cfg, jax.random.key(seed)))  # the decoder's tree
  leaves, tdef = jax.tree_util.tree_flatten(shapes)
  rng = np.random.default_rng(seed)
  # Different magnitudes per leaf, so the per-matrix NVFP4 scales differ between q, k and v.
  return jax.tree_util.tree_unflatten(
    tdef, [jnp.asarray(rng.standard_normal(l.shape, np.float32) * (1 + j)) for j, l in enumerate(leaves)]
  )


# quant.quantize under jit (one compile per shape instead of one per primitive);
# test_jit_quantize_is_eager_quantize checks the two agree bit for bit.
quantize = jax.jit(quant.quantize, static_argnames=("spec", "axis"))
dequantize = jax.jit(quant.dequantize)


def kernel(params, name, dtype=jnp.bfloat16):
  """A stacked kernel, cast to the served dtype (the export quantizes that cast, as serve_params does)."""
  return params["layers"][PROJ[name]][name]["kernel"].astype(dtype)


def read_all(d):
  """Every tensor of the checkpoint (safetensors.numpy cannot read float8, hence our reader,
  itself checked against the safetensors package in test_hf.py)."""
  out = {}
  for f in d.glob("*.safetensors"):
    st = ckpt.SafetensorsFile(f)
    out.update({k: np.array(st.get(k)) for k in st.keys()})
  return out


def _same(a: QArray, b: QArray):
  assert a.spec == b.spec and a.axis == b.axis
  np.testing.assert_array_equal(np.asarray(a.codes), np.asarray(b.codes))
  np.testing.assert_array_equal(np.asarray(a.scale).view(np.uint8), np.asarray(b.scale).view(np.uint8))
  if a.global_scale is None:
    assert b.global_scale is None
  else:
    np.testing.assert_array_equal(np.asarray(a.global_scale), np.asarray(b.global_scale))


# --------------------------------------------------------------------------- INT4


@pytest.mark.parametrize("spec", [Int4(group_size=32), NVFP4()])
def test_jit_quantize_is_eager_quantize(spec):
  w = kernel(rand_params(cfg_for()), "down_proj")
  _same(quantize(w, spec, axis=-2), quant.quantize(w, spec, axis=-2))


def test_int4_schema_layout_and_roundtrip(tmp_path):
  cfg, spec = cfg_for("qwen2", tied=False), Int4(group_size=32)
  params = rand_params(cfg)
  d = hf.export_compressed_tensors(tmp_path / "ct", cfg, params, spec)
  conf = json.loads((d / "config.json").read_text())
  qc = conf["quantization_config"]
  assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "pack-quantized"
  assert qc["quantization_status"] == "compressed"
  (group,) = qc["config_groups"].values()
  assert group["targets"] == ["Linear"] and group["input_activations"] is None
  w = group["weights"]
  assert (w["num_bits"], w["type"], w["symmetric"], w["strategy"], w["group_size"], w["dynamic"]) == (
    4,
    "int",
    True,
    "group",
    32,
    False,
  )
  assert qc["ignore"] == ["lm_head"]
  assert conf["model_type"] == "qwen2" and conf["dtype"] == "bfloat16"

  t = read_all(d)
  # Dense tensors: bf16 copies.
  assert t["model.embed_tokens.weight"].dtype == ml_dtypes.bfloat16
  np.testing.assert_array_equal(
    t["model.layers.1.self_attn.q_proj.bias"],
    np.asarray(params["layers"]["attn"]["q_proj"]["bias"][1]).astype(ml_dtypes.bfloat16),
  )
  assert "model.layers.0.self_attn.q_proj.weight" not in t

  # Byte layout, by hand from the description: W = kernel.T [N, K]; s = bf16(max(amax_g / 7, 1e-5));
  # q = clip(rint(W / s), -7, 7); word j of row n holds q[n, 8j + i] + 8 at bits 4i.
  for name in PROJ:
    for layer in range(cfg.num_layers):
      W = np.asarray(kernel(params, name)[layer]).astype(np.float64).T
      n, k = W.shape
      g = W.reshape(n, k // 32, 32)
      s = np.maximum(np.abs(g).max(-1) / 7, 1e-5).astype(ml_dtypes.bfloat16)
      q = np.clip(np.rint(g / s.astype(np.float64)[..., None]), -7, 7).astype(np.int64).reshape(n, k)
      words = np.zeros((n, k // 8), np.uint64)
      for i in range(8):
        words |= (q[:, i::8] + 8).astype(np.uint64) << np.uint64(4 * i)
      mod = f"model.layers.{layer}.{'self_attn' if PROJ[name] == 'attn' else 'mlp'}.{name}"
      packed = t[mod + ".weight_packed"]
      assert packed.dtype == np.int32 and packed.shape == (n, k // 8)
      np.testing.assert_array_equal(packed.view(np.uint32), words.astype(np.uint32), err_msg=mod)
      np.testing.assert_array_equal(t[mod + ".weight_scale"].view(np.uint16), s.view(np.uint16))
      np.testing.assert_array_equal(t[mod + ".weight_shape"], [n, k])

  # Import: bit-exact against quant.quantize of the same weights.
  cfg2, served, tok = hf.load_compressed_tensors(d, dtype=jnp.bfloat16)  # served as the bf16 sampler serves
  assert cfg2 == cfg.replace(dtype="bfloat16", param_dtype="bfloat16") and tok is None
  # the loaders' defaults: float32 dense parameters, computing in float32; the codes are the same
  m = hf.load_compressed_tensors(d)
  assert (m.cfg.dtype, m.cfg.param_dtype, m.params["lm_head"]["kernel"].dtype) == ("float32", "float32", jnp.float32)
  np.testing.assert_array_equal(
    m.params["layers"]["mlp"]["up_proj"]["kernel"].codes, served["layers"]["mlp"]["up_proj"]["kernel"].codes
  )
  for name in PROJ:
    _same(served["layers"][PROJ[name]][name]["kernel"], quantize(kernel(params, name), spec, axis=-2))
  np.testing.assert_array_equal(
    served["lm_head"]["kernel"], np.asarray(params["lm_head"]["kernel"]).astype(ml_dtypes.bfloat16)
  )
  # The whole served tree is the sampler's: serve_params (bf16 cast, then quant.quantize_params).
  from lrl_jax.sampler import serve_params

  ref = serve_params(params, spec, dtype=jnp.bfloat16)
  assert jax.tree_util.tree_structure(served) == jax.tree_util.tree_structure(ref)
  for a, b in zip(jax.tree_util.tree_leaves(served), jax.tree_util.tree_leaves(ref)):
    assert a.dtype == b.dtype
    np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))


def test_int4_rules_and_ignore(tmp_path):
  cfg, spec = cfg_for(), Int4(group_size=32)
  params = rand_params(cfg)
  rules = QuantRules(rules=((r"down_proj", None),) + QuantRules.default(spec).rules)
  d = hf.export_compressed_tensors(tmp_path / "ct", cfg, params, spec, rules=rules)
  qc = json.loads((d / "config.json").read_text())["quantization_config"]
  assert qc["ignore"] == ["lm_head", "model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"]
  t = read_all(d)
  assert t["model.layers.1.mlp.down_proj.weight"].dtype == ml_dtypes.bfloat16
  _, served, _ = hf.load_compressed_tensors(d)
  assert not isinstance(served["layers"]["mlp"]["down_proj"]["kernel"], QArray)
  assert isinstance(served["layers"]["mlp"]["up_proj"]["kernel"], QArray)
  # vLLM fuses q/k/v: one of them alone cannot be left dense.
  rules = QuantRules(rules=((r"k_proj", None),) + QuantRules.default(spec).rules)
  with pytest.raises(ValueError, match="vLLM fuses"):
    hf.export_compressed_tensors(tmp_path / "bad", cfg, params, spec, rules=rules)
  with pytest.raises(ValueError, match="supports Int4 and NVFP4"):
    hf.export_compressed_tensors(tmp_path / "bad", cfg, params, quant.FP8())
  assert not (tmp_path / "bad").exists()


# --------------------------------------------------------------------------- NVFP4

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float64)


def _decode_nvfp4(packed, scale, global_scale):
  """compressed-tensors' decoding, by hand: low nibble first; bit 3 sign, bits 0-2 index E2M1;
  Ŵ = e2m1 · s_b / global_scale."""
  nib = np.stack([packed & 0xF, packed >> 4], -1).reshape(packed.shape[0], -1)
  vals = np.where(nib & 8, -1.0, 1.0) * E2M1[nib & 7]
  s = np.repeat(scale.astype(np.float64), 16, axis=1)
  return vals * s / np.float64(global_scale[0])


@pytest.mark.parametrize("fuse", [True, False])
def test_nvfp4_schema_layout_and_roundtrip(tmp_path, fuse):
  cfg, spec = cfg_for("qwen3", tied=True), NVFP4()
  params = rand_params(cfg)
  d = hf.export_compressed_tensors(tmp_path / "ct", cfg, params, spec, fuse_global_scales=fuse)
  qc = json.loads((d / "config.json").read_text())["quantization_config"]
  assert qc["format"] == "nvfp4-pack-quantized"
  (group,) = qc["config_groups"].values()
  w = group["weights"]
  assert (w["num_bits"], w["type"], w["symmetric"], w["strategy"], w["group_size"]) == (
    4,
    "float",
    True,
    "tensor_group",
    16,
  )
  assert qc["ignore"] == ["lm_head"]
  t = read_all(d)
  _, served, _ = hf.load_compressed_tensors(d)
  for layer in range(cfg.num_layers):
    gs = {}
    for name in PROJ:
      mod = f"model.layers.{layer}.{'self_attn' if PROJ[name] == 'attn' else 'mlp'}.{name}"
      packed, scale, g = t[mod + ".weight_packed"], t[mod + ".weight_scale"], t[mod + ".weight_global_scale"]
      W = np.asarray(kernel(params, name)[layer]).astype(np.float64).T
      n, k = W.shape
      assert packed.dtype == np.uint8 and packed.shape == (n, k // 2)
      assert scale.dtype == ml_dtypes.float8_e4m3fn and scale.shape == (n, k // 16)
      assert g.dtype == np.float32 and g.shape == (1,)
      gs[name] = g[0]
      # The file decodes (compressed-tensors' way) to our dequantize, up to the rounding of
      # s_b / g versus s_b · dec (a few f32 ulps), and to W within NVFP4's error.
      ours = np.asarray(dequantize(served["layers"][PROJ[name]][name]["kernel"]))[layer].T
      theirs = _decode_nvfp4(packed, scale, g)
      np.testing.assert_allclose(theirs, ours, rtol=5e-7, atol=0)
      # E2M1 rounds to within 1/6 of the block amax; the E4M3 block scale adds < 1/16 of that.
      amax_b = np.repeat(np.abs(W).reshape(n, k // 16, 16).max(-1), 16, axis=1)
      assert np.all(np.abs(theirs - W) <= 0.25 * amax_b)
    if fuse:  # one global scale per vLLM-fused layer
      assert gs["q_proj"] == gs["k_proj"] == gs["v_proj"] and gs["gate_proj"] == gs["up_proj"]
    else:
      assert len({gs["q_proj"], gs["k_proj"], gs["v_proj"]}) == 3
  # Import is bit-exact against quant.quantize: of each kernel, or of the fused concatenation.
  for name in PROJ:
    got = served["layers"][PROJ[name]][name]["kernel"]
    group = next((gr for gr in (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")) if name in gr), None)
    if fuse and group:
      ws = [kernel(params, m) for m in group]
      q = quantize(jnp.concatenate(ws, -1), spec, axis=-2)
      start = sum(kernel(params, m).shape[-1] for m in group[: group.index(name)])
      n = kernel(params, name).shape[-1]
      ref = QArray(
        codes=q.codes[..., start : start + n],
        scale=q.scale[..., start : start + n],
        global_scale=q.global_scale,
        spec=spec,
        axis=-2,
      )
    else:
      ref = quantize(kernel(params, name), spec, axis=-2)
    _same(got, ref)
  # The encode scale written is the one compressed-tensors computes (448·6 / amax), to 1 ulp.
  W = np.asarray(kernel(params, "o_proj")[0]).astype(np.float32)
  enc = np.float32(448 * 6) / np.abs(W).max()
  g = t["model.layers.0.self_attn.o_proj.weight_global_scale"][0]
  assert abs(int(g.view(np.int32)) - int(enc.view(np.int32))) <= 1


# --------------------------------------------------------------------------- bad input


def test_load_compressed_tensors_errors(tmp_path):
  cfg, spec = cfg_for(), Int4(group_size=32)
  d = hf.export_compressed_tensors(tmp_path / "ct", cfg, rand_params(cfg), spec)
  f = d / "model.safetensors"
  t = dict(load_file(str(f)))
  bad = dict(t)
  bad["model.layers.1.mlp.up_proj.weight_packed"] = bad["model.layers.1.mlp.up_proj.weight_packed"][:, :4]
  save_file(bad, str(f))
  with pytest.raises(
    ValueError,
    match=r"'model.layers.1.mlp.up_proj.weight_packed' in .*model\.safetensors has "
    r"shape \(128, 4\), expected \(128, 8\)",
  ):
    hf.load_compressed_tensors(d)
  bad = dict(t)
  bad["model.layers.0.mlp.up_proj.weight_shape"] = np.array([128, 32], np.int64)
  save_file(bad, str(f))
  with pytest.raises(ValueError, match=r"model.layers.0.mlp.up_proj.weight_shape is \[128, 32\], expected \[128, 64\]"):
    hf.load_compressed_tensors(d)
  bad = dict(t)
  bad["model.layers.0.extra"] = np.zeros(3, np.float32)
  save_file(bad, str(f))
  with pytest.raises(ValueError, match=r"unexpected tensors: model.layers.0.extra"):
    hf.load_compressed_tensors(d)
  bad = dict(t)
  del bad["model.layers.1.self_attn.v_proj.weight_scale"]
  save_file(bad, str(f))
  with pytest.raises(ValueError, match=r"missing tensor 'model.layers.1.self_attn.v_proj.weight_scale'"):
    hf.load_compressed_tensors(d)
  save_file(t, str(f))
  conf = json.loads((d / "config.json").read_text())
  conf["quantization_config"]["config_groups"]["group_0"]["weights"]["type"] = "float"
  (d / "config.json").write_text(json.dumps(conf))
  with pytest.raises(ValueError, match=r"config\.json: unsupported compressed-tensors scheme"):
    hf.load_compressed_tensors(d)


@pytest.mark.parametrize(
  "spec",
  [
    Int4(group_size=32, scheme="minmax"),
    pytest.param(Int4(group_size=32, scheme="learned", learn_zero_point=True), marks=pytest.mark.slow),
  ],
  ids=lambda s: s.name,
)
def test_int4_asymmetric_zero_points_layout_and_roundtrip(tmp_path, spec):
  """symmetric: false; weight_zero_point int32 [N/8, K/G]: signed z packed eight per word along N (code i of
  column g of word row j at bits 4i is z[8j + i, g] + 8). Export -> import keeps s and z bit for bit."""
  cfg = cfg_for("llama", tied=True)
  params = rand_params(cfg)
  rules = QuantRules.default(spec)
  if spec.learned:
    params = quant.init_learned(params, rules)
    rng = np.random.default_rng(3)
    params = jax.tree_util.tree_map_with_path(
      lambda kp, x: (
        x * jnp.asarray(rng.uniform(0.8, 1.2, x.shape), jnp.float32)
        if quant.path_str(kp).endswith("_scale")
        else (x + 1.4 if quant.path_str(kp).endswith("_zero") else x)
      ),
      params,
    )
  d = hf.export_compressed_tensors(tmp_path / "ct", cfg, params, spec)
  (group,) = json.loads((d / "config.json").read_text())["quantization_config"]["config_groups"].values()
  assert group["weights"]["symmetric"] is False
  t = read_all(d)
  from lrl_jax.sampler import serve_params

  served_ref = serve_params(params, rules, dtype=jnp.bfloat16)
  for name in ("k_proj", "down_proj"):
    q = served_ref["layers"][PROJ[name]][name]["kernel"]
    z = np.asarray(q.zero_point).astype(np.int64)  # [L, K/G, N]
    for layer in range(cfg.num_layers):
      zt = z[layer].T  # [N, K/G]
      n = zt.shape[0]
      words = np.zeros((n // 8, zt.shape[1]), np.uint64)
      for i in range(8):
        words |= (zt[i::8] + 8).astype(np.uint64) << np.uint64(4 * i)
      mod = f"model.layers.{layer}.{'self_attn' if PROJ[name] == 'attn' else 'mlp'}.{name}"
      got = t[mod + ".weight_zero_point"]
      assert got.dtype == np.int32 and got.shape == words.shape
      np.testing.assert_array_equal(got.view(np.uint32), words.astype(np.uint32), err_msg=mod)
  _, served, _ = hf.load_compressed_tensors(d)
  for name in PROJ:
    a, b = served["layers"][PROJ[name]][name]["kernel"], served_ref["layers"][PROJ[name]][name]["kernel"]
    assert a.spec == Int4(group_size=32, scheme="minmax")  # the file records asymmetric, not how s was found
    np.testing.assert_array_equal(np.asarray(a.codes), np.asarray(b.codes))
    np.testing.assert_array_equal(np.asarray(a.scale).view(np.uint16), np.asarray(b.scale).view(np.uint16))
    np.testing.assert_array_equal(np.asarray(a.zero_point), np.asarray(b.zero_point))
    np.testing.assert_array_equal(np.asarray(dequantize(a)), np.asarray(dequantize(b)))
