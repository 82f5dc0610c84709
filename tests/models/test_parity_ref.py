"""Parity with transformers (the `ref` extra): checkpoints written by transformers load here and
give the same float32 logits; checkpoints written here load in transformers; SmolLM2's GGUF
gives the same weights, tokens, logits and greedy continuation as transformers reading it.

Run: python -m pytest -m ref tests/models -q   (add -s to see the measured differences)
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from lrl_jax.models import _checkpoint as ckpt  # noqa: E402
from lrl_jax.models import decoder, hf  # noqa: E402

pytestmark = pytest.mark.ref

_forward = jax.jit(decoder.forward, static_argnames=("cfg",))


def _tiny_hf_config(arch):
  common = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    max_position_embeddings=256,
  )
  if arch == "llama":
    return transformers.LlamaConfig(head_dim=16, rope_theta=5000.0, tie_word_embeddings=False, **common)
  if arch == "qwen2":
    return transformers.Qwen2Config(rope_theta=20000.0, tie_word_embeddings=True, **common)
  # Qwen3 with head_dim != hidden / heads, as in the real Qwen3 family.
  return transformers.Qwen3Config(head_dim=24, rope_theta=1e6, tie_word_embeddings=False, **common)


def _random_model(arch, seed=0):
  torch.manual_seed(seed)
  config = _tiny_hf_config(arch)
  config._attn_implementation = "eager"
  model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
  with torch.no_grad():  # O(1) logits, and norms / biases away from their 1 / 0 init
    for name, p in model.named_parameters():
      if "norm" in name:
        p.copy_(1 + 0.3 * torch.randn_like(p))
      elif name.endswith("bias"):
        p.copy_(0.2 * torch.randn_like(p))
      else:
        p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5 * (3.0 if "embed" in name else 1.0))
  return model


def _torch_logits(model, ids):
  with torch.no_grad():
    return model(torch.tensor(np.asarray(ids), dtype=torch.long)).logits.float().numpy()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_transformers_checkpoint_logits(tmp_path, arch):
  model = _random_model(arch)
  model.save_pretrained(tmp_path / "ck", safe_serialization=True)
  cfg, params, _ = hf.load_hf(tmp_path / "ck", compute_dtype="float32")
  assert cfg.arch == arch and cfg.tie_word_embeddings == model.config.tie_word_embeddings
  ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 13))
  ours, _ = _forward(params, jnp.asarray(ids, jnp.int32), cfg)
  ref = _torch_logits(model, ids)
  diff = float(np.max(np.abs(np.asarray(ours) - ref)))
  print(f"\n{arch}: max |logits - transformers| = {diff:.3g} (logit scale {np.abs(ref).max():.3g})")
  assert diff < 1e-4


def test_transformers_sharded_checkpoint(tmp_path):
  model = _random_model("llama", seed=1)
  model.save_pretrained(tmp_path / "ck", safe_serialization=True, max_shard_size="100KB")
  assert (tmp_path / "ck" / "model.safetensors.index.json").is_file()
  assert len(list((tmp_path / "ck").glob("*.safetensors"))) > 1
  cfg, params, _ = hf.load_hf(tmp_path / "ck", compute_dtype="float32")
  ids = np.arange(20).reshape(2, 10) % cfg.vocab_size
  ours, _ = _forward(params, jnp.asarray(ids, jnp.int32), cfg)
  diff = float(np.max(np.abs(np.asarray(ours) - _torch_logits(model, ids))))
  print(f"\nsharded llama: max |logits - transformers| = {diff:.3g}")
  assert diff < 1e-4


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_save_hf_loads_in_transformers(tmp_path, arch):
  model = _random_model(arch, seed=2)
  model.save_pretrained(tmp_path / "src", safe_serialization=True)
  cfg, params, _ = hf.load_hf(tmp_path / "src", compute_dtype="float32")
  hf.save_hf(tmp_path / "out", cfg, params)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(
    tmp_path / "out", dtype=torch.float32, attn_implementation="eager"
  ).eval()
  for (n1, p1), (n2, p2) in zip(model.state_dict().items(), reloaded.state_dict().items()):
    assert n1 == n2
    assert torch.equal(p1, p2), n1
  ids = np.random.default_rng(3).integers(0, cfg.vocab_size, (1, 9))
  ours, _ = _forward(params, jnp.asarray(ids, jnp.int32), cfg)
  diff = float(np.max(np.abs(np.asarray(ours) - _torch_logits(reloaded, ids))))
  assert diff < 1e-4


# --------------------------------------------------------------------------- SmolLM2 from GGUF

PROMPTS = [
  "What is 12+7? Answer:",
  "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
  "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.fixture(scope="module")
def smollm2():
  try:
    path = hf.smollm2_path()
  except RuntimeError as err:
    pytest.skip(f"SmolLM2 GGUF unavailable: {err}")
  cfg, params, tok = hf.load_gguf(path)
  model = transformers.AutoModelForCausalLM.from_pretrained(
    path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
  ).eval()
  ttok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
  return cfg, params, tok, model, ttok


@pytest.mark.slow
def test_smollm2_gguf_matches_transformers(smollm2):
  cfg, params, tok, model, ttok = smollm2
  assert (cfg.arch, cfg.num_layers, cfg.hidden_size, cfg.num_kv_heads, cfg.tie_word_embeddings) == (
    "llama",
    30,
    576,
    3,
    True,
  )
  # Weights: transformers dequantizes the same blocks; q/k rows must come back un-permuted.
  sd = model.state_dict()
  ours = ckpt.hf_tensors_from_tree(cfg, params)
  worst = max(float(np.max(np.abs(v - sd[k].numpy()))) for k, v in ours.items())
  print(f"\nSmolLM2 weights: max |ours - transformers| = {worst:.3g}")
  assert worst == 0.0
  # Tokenizer.
  for p in PROMPTS:
    assert tok.encode(p) == ttok(p).input_ids, p
  assert tok.eos_id == model.config.eos_token_id
  # Logits.
  for p in PROMPTS:
    ids = np.asarray([tok.encode(p)])
    ours, _ = _forward(params, jnp.asarray(ids, jnp.int32), cfg)
    ref = _torch_logits(model, ids)
    diff = float(np.max(np.abs(np.asarray(ours) - ref)))
    print(
      f"SmolLM2 {ids.shape[1]:3d}-token prompt: max |logits - transformers| = {diff:.3g} "
      f"(logit scale {np.abs(ref).max():.3g})"
    )
    assert diff < 1e-4


@pytest.mark.slow
def test_smollm2_greedy_generation_matches_transformers(smollm2):
  from lrl_jax import sampler

  cfg, params, tok, model, _ = smollm2
  n_new = 32
  prompts = [tok.encode(p) for p in PROMPTS[1:]]
  # transformers: a plain greedy loop over its KV cache, no EOS stop.
  ref = []
  for ids in prompts:
    x = torch.tensor([ids])
    out, past = [], None
    with torch.no_grad():
      for _ in range(n_new):
        o = model(x, past_key_values=past, use_cache=True)
        past = o.past_key_values
        nxt = int(torch.argmax(o.logits[0, -1]))
        out.append(nxt)
        x = torch.tensor([[nxt]])
    ref.append(out)
  # Ours: the sampler, greedy, f32 cache, left-padded batch.
  P = max(map(len, prompts))
  toks = np.zeros((len(prompts), P), np.int32)
  valid = np.zeros((len(prompts), P), bool)
  for b, ids in enumerate(prompts):
    toks[b, P - len(ids) :] = ids
    valid[b, P - len(ids) :] = True
  sc = sampler.SamplingConfig(max_new_tokens=n_new, temperature=0.0, eos_id=None)
  ro = sampler.generate(
    params, jnp.asarray(toks), jnp.asarray(valid), cfg, sc, jax.random.key(0), cache_dtype=jnp.float32
  )
  got = np.asarray(ro.tokens)[:, P:]
  for b in range(len(prompts)):
    print(f"\nSmolLM2 greedy: {tok.decode(got[b].tolist())!r}")
    assert got[b].tolist() == ref[b]


# --------------------------------------------------------------------------- compressed-tensors


@pytest.mark.parametrize("spec_name", ["int4", "int4_minmax", "int4_lsq", "int4_lsqz", "nvfp4"])
def test_compressed_tensors_export_loads_in_transformers(tmp_path, spec_name):
  """transformers + the `compressed-tensors` package decompress our export to our weights.

  compressed-tensors decompresses in bf16 (the scale dtype), so its weights are compared with
  bf16(dequantize(ours)): equal for INT4; within one bf16 ulp for NVFP4, whose decoder divides
  by the global scale where ours multiplies by its inverse.
  """
  pytest.importorskip("compressed_tensors", reason="needs the compressed-tensors package")
  import ml_dtypes

  from lrl_jax import quant

  spec = {
    "int4": quant.Int4(group_size=32),
    "int4_minmax": quant.Int4(group_size=32, scheme="minmax"),
    "int4_lsq": quant.Int4(group_size=32, scheme="learned"),
    "int4_lsqz": quant.Int4(group_size=32, scheme="learned", learn_zero_point=True),
    "nvfp4": quant.NVFP4(),
  }[spec_name]
  model = _random_model("llama", seed=4)
  model.save_pretrained(tmp_path / "src", safe_serialization=True)
  cfg, params, _ = hf.load_hf(tmp_path / "src", compute_dtype="float32")
  if spec.__class__ is quant.Int4 and spec.learned:
    # Learned scales and zero points, moved off their initial values, are what gets written.
    params = quant.init_learned(params, quant.QuantRules.default(spec))
    rng = np.random.default_rng(5)
    params = jax.tree_util.tree_map_with_path(
      lambda kp, x: (
        x * jnp.asarray(rng.uniform(0.8, 1.2, x.shape), jnp.float32)
        if quant.path_str(kp).endswith("_scale")
        else (x + jnp.asarray(rng.integers(-2, 3, x.shape), jnp.float32) if quant.path_str(kp).endswith("_zero") else x)
      ),
      params,
    )
  hf.export_compressed_tensors(tmp_path / "ct", cfg, params, spec)
  _, served, _ = hf.load_compressed_tensors(tmp_path / "ct")
  ours = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float32), quant.dequantize_params(served))
  qcfg = transformers.CompressedTensorsConfig(dequantize=True)
  ct = transformers.AutoModelForCausalLM.from_pretrained(
    tmp_path / "ct", dtype=torch.float32, quantization_config=qcfg, attn_implementation="eager"
  ).eval()
  sd = ct.state_dict()
  worst = 0.0
  for i in range(cfg.num_layers):
    for group, names in (
      ("attn", ("q_proj", "k_proj", "v_proj", "o_proj")),
      ("mlp", ("gate_proj", "up_proj", "down_proj")),
    ):
      for n in names:
        mod = "self_attn" if group == "attn" else "mlp"
        theirs = sd[f"model.layers.{i}.{mod}.{n}.weight"].float().numpy()
        mine = ours["layers"][group][n]["kernel"][i].T.astype(ml_dtypes.bfloat16).astype(np.float32)
        ulp = np.abs(mine) * 2.0**-7
        worst = max(worst, float(np.max(np.abs(theirs - mine) / np.maximum(ulp, 1e-30))))
  print(f"\n{spec_name}: compressed-tensors weights vs bf16(ours): max diff {worst:.3g} bf16 ulp")
  assert worst == 0.0 if spec_name.startswith("int4") else worst <= 1.0
  if spec_name.startswith("int4"):
    # What transformers serves is what our sampler serves from the same (learned) scales.
    from lrl_jax.sampler import serve_params

    mine = quant.dequantize_params(serve_params(params, spec, dtype=jnp.bfloat16))  # the export quantizes the bf16 cast
    for n in ("q_proj", "down_proj"):
      g = "attn" if n == "q_proj" else "mlp"
      np.testing.assert_array_equal(
        np.asarray(mine["layers"][g][n]["kernel"]), np.asarray(ours["layers"][g][n]["kernel"])
      )
    ids = np.arange(12).reshape(1, 12) % cfg.vocab_size
    bf = jax.tree_util.tree_map(lambda x: jnp.asarray(x.astype(ml_dtypes.bfloat16).astype(np.float32)), ours)
    logits, _ = _forward(bf, jnp.asarray(ids, jnp.int32), cfg)
    diff = float(np.max(np.abs(np.asarray(logits) - _torch_logits(ct, ids))))
    print(f"int4 export served by transformers: max |logits - ours| = {diff:.3g}")
    assert diff < 1e-4


@pytest.mark.slow
def test_smollm2_chat_template_matches_transformers(smollm2):
  """`Tokenizer.apply_chat_template` (the GGUF's Jinja template, rendered here) == transformers' rendering of it,
  text and ids, for a user turn, a system + user pair, and a multi-turn conversation."""
  _, _, tok, _, ttok = smollm2
  user = {"role": "user", "content": "What is 7 * 8?"}
  convs = [
    [user],
    [{"role": "system", "content": "Answer briefly."}, user],
    [user, {"role": "assistant", "content": "56"}, {"role": "user", "content": "And 7 * 9?"}],
  ]
  for msgs in convs:
    for gen in (True, False):
      want = ttok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
      assert tok.apply_chat_template(msgs, add_generation_prompt=gen) == want
      assert tok.encode_chat(msgs, add_generation_prompt=gen) == ttok.encode(want, add_special_tokens=False)
