"""Checkpoint plumbing shared by the HF, GGUF and compressed-tensors loaders.

* The name map between the decoder's parameter tree (layers stacked on a leading
  L axis; kernels [K, N] used as `x @ kernel`) and transformers' flat state dict
  (one tensor per layer; `nn.Linear.weight` [N, K], the transpose).
* A safetensors reader that checks every header offset against the file size
  before touching data, so a truncated or corrupt file names its tensor.
* Atomic directory writes, and `write_checkpoint`: the one writer of an HF checkpoint
  directory (safetensors, config.json, tokenizer files), for `save_hf` and
  `export_compressed_tensors`.

The safetensors layout (https://github.com/huggingface/safetensors, "Format"):
8 bytes little-endian u64 N, N bytes of JSON header {name: {dtype, shape,
data_offsets: [begin, end]}, "__metadata__": {...}}, then the data buffer;
offsets are relative to the start of the buffer and must cover it exactly.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from lrl_jax.models._tokenizer import Tokenizer, special_ids, write_tokenizer
from lrl_jax.models.config import ModelConfig
from lrl_jax.quant import QArray, path_str

# safetensors dtype strings -> numpy dtypes (bf16 and fp8 through ml_dtypes).
ST_DTYPES: dict[str, np.dtype] = {
  "F64": np.dtype(np.float64),
  "F32": np.dtype(np.float32),
  "F16": np.dtype(np.float16),
  "BF16": np.dtype(ml_dtypes.bfloat16),
  "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
  "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
  "I64": np.dtype(np.int64),
  "I32": np.dtype(np.int32),
  "I16": np.dtype(np.int16),
  "I8": np.dtype(np.int8),
  "U64": np.dtype(np.uint64),
  "U32": np.dtype(np.uint32),
  "U16": np.dtype(np.uint16),
  "U8": np.dtype(np.uint8),
  "BOOL": np.dtype(np.bool_),
}

# Buffers some older checkpoints carry that are recomputed here (RoPE has no table).
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


# --------------------------------------------------------------------------- name map


@dataclasses.dataclass(frozen=True)
class Entry:
  """One parameter of the tree and its transformers name.

  Attributes:
    path: keys in the parameter tree, e.g. ("layers", "attn", "q_proj", "kernel").
    hf: transformers name; per-layer names contain "{i}".
    shape: the tree shape of one layer's slice (without L for per-layer entries).
    transpose: the tree holds the transpose of the HF tensor (kernel = weight.T).
  """

  path: tuple[str, ...]
  hf: str
  shape: tuple[int, ...]
  transpose: bool = False

  @property
  def per_layer(self) -> bool:
    return "{i}" in self.hf

  @property
  def hf_shape(self) -> tuple[int, ...]:
    return tuple(reversed(self.shape)) if self.transpose else self.shape

  def hf_name(self, i: int | None = None) -> str:
    return self.hf.format(i=i) if self.per_layer else self.hf

  @property
  def path_str(self) -> str:
    return "/".join(self.path)


def layout(cfg: ModelConfig) -> list[Entry]:
  """The parameter entries of a decoder with config `cfg`, in a fixed order."""
  d, f, v, dh = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_dim
  qd, kvd = cfg.q_dim, cfg.kv_dim
  pre = "model.layers.{i}."
  e = [Entry(("embed", "embedding"), "model.embed_tokens.weight", (v, d))]
  e.append(Entry(("layers", "input_norm", "scale"), pre + "input_layernorm.weight", (d,)))
  for name, n in (("q_proj", qd), ("k_proj", kvd), ("v_proj", kvd)):
    e.append(Entry(("layers", "attn", name, "kernel"), pre + f"self_attn.{name}.weight", (d, n), True))
    if cfg.attention_bias:
      e.append(Entry(("layers", "attn", name, "bias"), pre + f"self_attn.{name}.bias", (n,)))
  e.append(Entry(("layers", "attn", "o_proj", "kernel"), pre + "self_attn.o_proj.weight", (qd, d), True))
  if cfg.qk_norm:
    e.append(Entry(("layers", "attn", "q_norm", "scale"), pre + "self_attn.q_norm.weight", (dh,)))
    e.append(Entry(("layers", "attn", "k_norm", "scale"), pre + "self_attn.k_norm.weight", (dh,)))
  e.append(Entry(("layers", "post_attn_norm", "scale"), pre + "post_attention_layernorm.weight", (d,)))
  for name, shape in (("gate_proj", (d, f)), ("up_proj", (d, f)), ("down_proj", (f, d))):
    e.append(Entry(("layers", "mlp", name, "kernel"), pre + f"mlp.{name}.weight", shape, True))
  e.append(Entry(("final_norm", "scale"), "model.norm.weight", (d,)))
  if not cfg.tie_word_embeddings:
    e.append(Entry(("lm_head", "kernel"), "lm_head.weight", (d, v), True))
  return e


def hf_names(cfg: ModelConfig) -> dict[str, tuple[Entry, int | None]]:
  """Every transformers tensor name of `cfg` -> (entry, layer index or None)."""
  out = {}
  for ent in layout(cfg):
    if ent.per_layer:
      for i in range(cfg.num_layers):
        out[ent.hf_name(i)] = (ent, i)
    else:
      out[ent.hf_name()] = (ent, None)
  return out


def _set(tree: dict, path: tuple[str, ...], value):
  for k in path[:-1]:
    tree = tree.setdefault(k, {})
  tree[path[-1]] = value


def get_path(tree: Mapping, path: tuple[str, ...]):
  for k in path:
    tree = tree[k]
  return tree


# --------------------------------------------------------------------------- building a tree


@dataclasses.dataclass(frozen=True)
class Source:
  """A tensor to be read: its shape (known before reading), where it lives, how to read it."""

  shape: tuple[int, ...]
  where: str
  load: Callable[[], np.ndarray]


def _fmt(names: Iterable[str], limit: int = 8) -> str:
  names = sorted(names)
  s = ", ".join(names[:limit])
  return s + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def tree_from_sources(
  cfg: ModelConfig, sources: Mapping[str, Source], *, dtype, origin: str, tied_ok: Callable[[], bool] | None = None
) -> dict:
  """Builds the parameter tree from transformers-named tensors, checking names and shapes first.

  Args:
    cfg: the model config.
    sources: transformers name -> Source.
    dtype: dtype of every leaf of the result.
    origin: what the tensors come from (a directory or file), for error messages.
    tied_ok: with tied embeddings, called when the checkpoint also carries `lm_head.weight`;
      it must return True if that tensor equals the embedding (it is then dropped).

  Raises:
    ValueError naming the tensors (and their files) that are missing, unexpected or of the
    wrong shape. Nothing is read before all names and shapes have been checked.
  """
  expected = hf_names(cfg)
  names = {n for n in sources if not n.endswith(IGNORED_SUFFIXES)}
  extra = names - set(expected)
  if cfg.tie_word_embeddings and "lm_head.weight" in extra:
    extra.discard("lm_head.weight")
    if tied_ok is None or not tied_ok():
      raise ValueError(
        f"{origin}: tie_word_embeddings is set but tensor 'lm_head.weight' "
        f"({sources['lm_head.weight'].where}) differs from model.embed_tokens.weight"
      )
  missing = set(expected) - names
  problems = []
  if missing:
    problems.append(f"missing tensors: {_fmt(missing)}")
  if extra:
    problems.append(f"unexpected tensors: {_fmt(f'{n} ({sources[n].where})' for n in extra)}")
  for name, (ent, _) in expected.items():
    if name in sources and tuple(sources[name].shape) != ent.hf_shape:
      problems.append(
        f"tensor {name!r} in {sources[name].where} has shape {tuple(sources[name].shape)}, "
        f"expected {ent.hf_shape} for this config"
      )
  if problems:
    raise ValueError(f"{origin}: checkpoint does not match its {cfg.arch} config: " + "; ".join(problems))

  np_dtype = jnp.dtype(dtype)
  tree: dict = {}
  for ent in layout(cfg):
    idx = range(cfg.num_layers) if ent.per_layer else [None]
    parts = []
    for i in idx:
      a = np.asarray(sources[ent.hf_name(i)].load())
      if ent.transpose:
        a = a.T
      parts.append(a.astype(np_dtype))
    arr = np.stack(parts) if ent.per_layer else parts[0]
    _set(tree, ent.path, jnp.asarray(arr))
  return tree


def hf_tensors_from_tree(cfg: ModelConfig, params, *, dtype=None) -> dict[str, np.ndarray]:
  """The parameter tree -> transformers state dict (NumPy, contiguous); checks the tree first.

  Raises:
    ValueError naming missing / unexpected parameter paths or a wrong shape.
  """
  check_tree(cfg, params)
  out = {}
  for ent in layout(cfg):
    a = np.asarray(get_path(params, ent.path))
    if dtype is not None:
      a = a.astype(jnp.dtype(dtype))
    for i in range(cfg.num_layers) if ent.per_layer else [None]:
      x = a[i] if i is not None else a
      out[ent.hf_name(i)] = np.ascontiguousarray(x.T if ent.transpose else x)
  return out


def check_tree(cfg: ModelConfig, params, *, allow_qarray: bool = False):
  """Raises ValueError unless `params` has exactly the paths and shapes of `layout(cfg)`."""
  leaves = jax.tree_util.tree_leaves_with_path(params, is_leaf=lambda x: isinstance(x, QArray))
  got = {path_str(kp): leaf for kp, leaf in leaves}
  want = {}
  for ent in layout(cfg):
    want[ent.path_str] = ((cfg.num_layers,) if ent.per_layer else ()) + ent.shape
  problems = []
  if set(want) - set(got):
    problems.append(f"missing parameters: {_fmt(set(want) - set(got))}")
  if set(got) - set(want):
    problems.append(f"unexpected parameters: {_fmt(set(got) - set(want))}")
  for p, shape in want.items():
    if p in got:
      leaf = got[p]
      if isinstance(leaf, QArray) and not allow_qarray:
        problems.append(f"parameter {p!r} is a QArray ({leaf.spec}); dequantize it or use export_compressed_tensors")
      elif tuple(leaf.shape) != shape:
        problems.append(f"parameter {p!r} has shape {tuple(leaf.shape)}, expected {shape}")
  if problems:
    raise ValueError(f"parameter tree does not match the {cfg.arch} config: " + "; ".join(problems))


# --------------------------------------------------------------------------- safetensors


class SafetensorsFile:
  """A safetensors file, header validated against the file size at open; tensors read lazily.

  Raises (at construction):
    FileNotFoundError if the file is missing; ValueError naming the file (and the tensor,
    where one is at fault) if the header is malformed or the file is truncated.
  """

  def __init__(self, path: str | os.PathLike):
    self.path = Path(path)
    if not self.path.is_file():
      raise FileNotFoundError(f"safetensors file not found: {self.path}")
    size = self.path.stat().st_size
    with open(self.path, "rb") as fh:
      head = fh.read(8)
      if len(head) < 8:
        raise ValueError(f"{self.path}: truncated safetensors file ({size} bytes, no header length)")
      (n,) = struct.unpack("<Q", head)
      if 8 + n > size:
        raise ValueError(
          f"{self.path}: truncated safetensors file: header needs {n} bytes, file has {size - 8} after the length field"
        )
      try:
        header = json.loads(fh.read(n))
      except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{self.path}: corrupt safetensors header ({err})") from None
    if not isinstance(header, dict):
      raise ValueError(f"{self.path}: corrupt safetensors header (not a JSON object)")
    self.metadata = header.pop("__metadata__", None) or {}
    self.data_start = 8 + n
    data_size = size - self.data_start
    self.infos: dict[str, tuple[np.dtype, tuple[int, ...], int, int]] = {}
    end_max = 0
    for name, info in header.items():
      try:
        dt, shape, (b, e) = info["dtype"], tuple(int(s) for s in info["shape"]), info["data_offsets"]
      except (KeyError, TypeError, ValueError):
        raise ValueError(f"{self.path}: corrupt header entry for tensor {name!r}: {info!r}") from None
      if dt not in ST_DTYPES:
        raise ValueError(f"{self.path}: tensor {name!r} has unsupported dtype {dt!r}")
      npdt = ST_DTYPES[dt]
      nbytes = int(np.prod(shape, dtype=np.int64)) * npdt.itemsize
      if e - b != nbytes or b < 0:
        raise ValueError(
          f"{self.path}: tensor {name!r} ({dt}, shape {shape}) spans bytes [{b}, {e}), expected {nbytes} bytes"
        )
      end_max = max(end_max, e)
      self.infos[name] = (npdt, shape, b, e)
    cut = sorted((b, name) for name, (_, _, b, e) in self.infos.items() if e > data_size)
    if cut:
      b, name = cut[0]
      more = f" (and {len(cut) - 1} more tensors after it)" if len(cut) > 1 else ""
      raise ValueError(
        f"{self.path}: truncated safetensors file: tensor {name!r} needs bytes "
        f"[{b}, {self.infos[name][3]}) of the data buffer, which has only {data_size}{more}"
      )
    if end_max != data_size:
      raise ValueError(
        f"{self.path}: data buffer is {data_size} bytes but the tensors cover {end_max} (trailing or missing data)"
      )

  def keys(self) -> list[str]:
    return list(self.infos)

  def shape(self, name: str) -> tuple[int, ...]:
    return self.infos[name][1]

  def dtype(self, name: str) -> np.dtype:
    return self.infos[name][0]

  def get(self, name: str) -> np.ndarray:
    """The tensor `name` (a read-only view of a memory map)."""
    npdt, shape, b, e = self.infos[name]
    if e == b:
      return np.zeros(shape, npdt)
    mm = np.memmap(self.path, dtype=np.uint8, mode="r", offset=self.data_start + b, shape=(e - b,))
    return mm.view(npdt).reshape(shape)


def write_safetensors(path: Path, tensors: Mapping[str, np.ndarray], metadata: dict[str, str] | None = None):
  """Writes `tensors` (NumPy, bf16/fp8 through ml_dtypes) with the safetensors package."""
  from safetensors.numpy import save_file  # lazy: safetensors is optional (the `hf` extra)  # noqa: PLC0415

  save_file(
    {k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path), metadata={"format": "pt", **(metadata or {})}
  )


def write_sharded(
  directory: Path,
  tensors: Mapping[str, np.ndarray],
  *,
  max_shard_bytes: int | None,
  metadata: dict[str, str] | None = None,
):
  """model.safetensors, or model-0000k-of-0000n.safetensors + model.safetensors.index.json (HF layout)."""
  names = list(tensors)
  sizes = {k: tensors[k].nbytes for k in names}
  shards: list[list[str]] = [[]]
  used = 0
  for k in names:
    if max_shard_bytes is not None and shards[-1] and used + sizes[k] > max_shard_bytes:
      shards.append([])
      used = 0
    shards[-1].append(k)
    used += sizes[k]
  if len(shards) == 1:
    write_safetensors(directory / "model.safetensors", tensors, metadata)
    return
  weight_map = {}
  for j, shard in enumerate(shards):
    fname = f"model-{j + 1:05d}-of-{len(shards):05d}.safetensors"
    write_safetensors(directory / fname, {k: tensors[k] for k in shard}, metadata)
    weight_map.update({k: fname for k in shard})
  index = {"metadata": {"total_size": int(sum(sizes.values()))}, "weight_map": weight_map}
  (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def open_checkpoint(directory: Path) -> dict[str, Source]:
  """All tensors of an HF checkpoint directory (single file, sharded index, or any *.safetensors).

  Raises:
    FileNotFoundError: no weights, or a shard named by the index is absent.
    ValueError: a malformed index, a tensor stored twice, or a corrupt / truncated file.
  """
  index_path = directory / "model.safetensors.index.json"
  if index_path.is_file():
    try:
      weight_map = json.loads(index_path.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
      raise ValueError(f"{index_path}: malformed index ({err!r})") from None
    files = sorted(set(weight_map.values()))
    for f in files:
      if not (directory / f).is_file():
        names = [k for k, v in weight_map.items() if v == f]
        raise FileNotFoundError(
          f"{directory / f}: shard listed in {index_path.name} is missing (it holds {_fmt(names, 3)})"
        )
  elif (directory / "model.safetensors").is_file():
    files, weight_map = ["model.safetensors"], None
  else:
    files, weight_map = sorted(p.name for p in directory.glob("*.safetensors")), None
    if not files:
      raise FileNotFoundError(
        f"{directory}: no model.safetensors, model.safetensors.index.json or "
        f"*.safetensors file (found: {sorted(p.name for p in directory.iterdir())})"
      )
  sources: dict[str, Source] = {}
  for f in files:
    st = SafetensorsFile(directory / f)
    for name in st.keys():
      if weight_map is not None and weight_map.get(name) != f:
        if name in weight_map:
          continue  # the index says another shard holds it
        raise ValueError(f"{directory / f}: tensor {name!r} is not listed in {index_path.name}")
      if name in sources:
        raise ValueError(f"{directory}: tensor {name!r} is stored twice ({sources[name].where} and {st.path})")
      sources[name] = Source(st.shape(name), str(st.path), lambda st=st, name=name: st.get(name))
  if weight_map is not None:
    absent = [k for k, f in weight_map.items() if k not in sources]
    if absent:
      raise ValueError(
        f"{index_path}: tensors listed but not found in their shard: " + _fmt(f"{k} ({weight_map[k]})" for k in absent)
      )
  return sources


# --------------------------------------------------------------------------- atomic directories


def atomic_dir(path: str | os.PathLike, write: Callable[[Path], Any]):
  """Calls write(tmp_dir) then renames tmp_dir to `path` (replacing an existing directory).

  A failure inside `write` leaves `path` untouched and removes the temporary directory.
  """
  path = Path(path)
  if path.exists() and not path.is_dir():
    raise ValueError(f"{path} exists and is not a directory")
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
  try:
    write(tmp)
    _follow_umask(tmp)
    if path.exists():
      old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
      os.rename(path, old / "x")
      os.rename(tmp, path)
      shutil.rmtree(old, ignore_errors=True)
    else:
      os.rename(tmp, path)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return path


def _follow_umask(root: Path) -> None:
  """Permissions of an ordinary directory tree: mkdtemp makes its directory 0700 (no other user, e.g. a serving
  engine's, could read an export); directories 0777 and files 0666, each less the process's umask."""
  mask = os.umask(0)
  os.umask(mask)
  for d, _, files in os.walk(root):
    os.chmod(d, 0o777 & ~mask)
    for f in files:
      os.chmod(os.path.join(d, f), 0o666 & ~mask)


def read_json(path: Path, what: str) -> dict:
  if not path.is_file():
    raise FileNotFoundError(f"{what} not found: {path}")
  try:
    return json.loads(path.read_text())
  except json.JSONDecodeError as err:
    raise ValueError(f"{path}: malformed JSON ({err})") from None


# --------------------------------------------------------------------------- writing a checkpoint directory


def write_checkpoint(
  path, tensors: dict, hf_cfg: dict, *, tokenizer: Tokenizer | None = None, max_shard_bytes: int | None = None
):
  """Writes tensors (sharded safetensors), config.json and the tokenizer files into `path`, atomically."""
  if tokenizer is not None:
    hf_cfg = {**hf_cfg, **special_ids(tokenizer)}

  def write(tmp: Path):
    write_sharded(tmp, tensors, max_shard_bytes=max_shard_bytes)
    (tmp / "config.json").write_text(json.dumps(hf_cfg, indent=2))
    if tokenizer is not None:
      write_tokenizer(tmp, tokenizer)

  return atomic_dir(path, write)
