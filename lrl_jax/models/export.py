"""compressed-tensors checkpoints (what vLLM and SGLang serve): INT4 `pack-quantized`, NVFP4.

The quantized Linear layers are stored the way compressed-tensors' compressors write
them (vllm-project/compressed-tensors, `compressors/quantized_compressors/
pack_quantized.py` and `fp4_quantized.py`), for a torch weight W [N, K]:

* INT4, format "pack-quantized", strategy "group", symmetric:
    weight_packed int32 [N, K/8]: eight codes per int32 along K, code i at bits 4i..4i+3,
      each stored as q + 8 (`quant.pack_int4_compressed_tensors`);
    weight_scale [N, K/G] (the Int4 spec's scale dtype, bf16 by default);
    weight_shape int64 [2] = (N, K).      Ŵ = q · s.
  Asymmetric (`Int4(scheme="minmax")`, or learned with a zero point), "symmetric": false:
    weight_zero_point int32 [N/8, K/G]: the signed zero points z [N, K/G] packed eight per
      int32 along N (compressed-tensors packs them along dim 0), Ŵ = (q − z) · s.
  Learned scales (`Int4(scheme="learned")`) are written as they are (`kernel_scale`, and
  `kernel_zero` rounded), never recomputed from the weights; the file does not record that they
  were learned, so it reads back as absmax (symmetric) or minmax (asymmetric) — the same Ŵ.
* NVFP4, format "nvfp4-pack-quantized", strategy "tensor_group", group 16:
    weight_packed uint8 [N, K/2]: E2M1 bit patterns, element 2j in the low nibble;
    weight_scale float8_e4m3fn [N, K/16];
    weight_global_scale float32 [1]: the *encode* scale 448·6 / amax, as compressed-tensors'
      `generate_gparam` computes it (quantization/utils/helpers.py); it dequantizes with
      Ŵ = e2m1 · s_b / global_scale (`quantization/lifecycle/forward.py`), and vLLM inverts it
      once (`CompressedTensorsW4A16Fp4.process_weights_after_loading`: 1 / global_scale.max()).

vLLM fuses q/k/v into one qkv_proj and gate/up into one gate_up_proj and keeps one global
scale per fused layer (the max over its parts). With NVFP4, the parts must therefore share
their global scale, or every part but one dequantizes wrongly. `fuse_global_scales=True`
(the default) quantizes each fused group as one matrix, concatenated along N (blocks run
along K, so only the global scale changes): this is `quant.quantize` of the concatenated
kernel, bit for bit, and what llm-compressor writes for these layers.

Only the kernels the rules select are quantized; the other linear layers stay dense
(bf16) and are listed in `ignore`, as is lm_head.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from lrl_jax import quant
from lrl_jax.models import _checkpoint as ckpt
from lrl_jax.models._tokenizer import load_tokenizer
from lrl_jax.models.bundle import LoadedModel, resolve_dtypes
from lrl_jax.models.config import ModelConfig
from lrl_jax.quant import NVFP4, NVFP4WAG, Int4, QArray, QuantRules

__all__ = ["export_compressed_tensors", "load_compressed_tensors", "quantization_config"]

_FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
_FORMATS = {Int4: "pack-quantized", NVFP4: "nvfp4-pack-quantized"}


def quantization_config(spec, ignore: list[str]) -> dict:
  """The `quantization_config` block of config.json (compressed-tensors schema, weight-only).

  Only fields every compressed-tensors release accepts are written (its QuantizationArgs
  forbids unknown keys, and `scale_dtype` / `zp_dtype` are recent).
  """
  fmt = _FORMATS.get(type(spec))
  if fmt is None:
    raise ValueError(f"export_compressed_tensors supports Int4 and NVFP4 specs, got {spec}")
  if isinstance(spec, Int4):
    weights = {
      "num_bits": 4,
      "type": "int",
      "symmetric": not spec.asymmetric,
      "strategy": "group",
      "group_size": spec.group_size,
    }
  else:
    weights = {
      "num_bits": 4,
      "type": "float",
      "symmetric": True,
      "strategy": "tensor_group",
      "group_size": spec.block_size,
    }
  weights.update(
    {"dynamic": False, "actorder": None, "block_structure": None, "observer": "minmax", "observer_kwargs": {}}
  )
  return {
    "quant_method": "compressed-tensors",
    "format": fmt,
    "quantization_status": "compressed",
    "config_groups": {
      "group_0": {
        "targets": ["Linear"],
        "weights": weights,
        "input_activations": None,
        "output_activations": None,
        "format": fmt,
      }
    },
    "ignore": ignore,
    "kv_cache_scheme": None,
    "global_compression_ratio": None,
  }


def _encode_scale(dec: np.ndarray) -> np.ndarray:
  """f32 encode scales g with f32(1 / g) == dec exactly (g is within 2 ulp of 1 / dec).

  The QArray keeps dec = f32(1 / enc); the file keeps enc. Searching the neighbours of
  f32(1 / dec) finds enc itself (or an equivalent), so import recovers dec bit for bit.
  """
  dec = np.asarray(dec, np.float32)
  g0 = (np.float32(1) / dec).astype(np.float32)
  out = g0.copy()
  found = np.float32(1) / g0 == dec
  cand_lo, cand_hi = g0.copy(), g0.copy()
  for _ in range(4):
    cand_lo = np.nextafter(cand_lo, np.float32(0))
    cand_hi = np.nextafter(cand_hi, np.float32(np.inf))
    for cand in (cand_lo, cand_hi):
      ok = ~found & (np.float32(1) / cand == dec)
      out = np.where(ok, cand, out)
      found |= ok
  if not found.all():
    raise ValueError(f"NVFP4 export: no float32 encode scale inverts to dec={dec[~found][:4]}")
  return out.astype(np.float32)


# One compiled program per kernel shape (op-by-op dispatch would compile every primitive).
_quantize = jax.jit(quant.quantize, static_argnames=("spec", "axis"))  # scale / zero_point: traced
_pack_nibbles = jax.jit(quant.pack_nibbles, static_argnames=("axis",))
_unpack_nibbles = jax.jit(quant.unpack_nibbles, static_argnames=("axis",))


def _linear_module(ent: ckpt.Entry) -> str:
  return ent.hf[: -len(".weight")]


def _quantize_kernels(cfg: ModelConfig, params, rules: QuantRules, fuse: bool, dtype) -> dict[tuple[str, ...], QArray]:
  """path -> stacked QArray [L, ...] of every selected kernel, quantized from its cast to `dtype`
  (fused groups share NVFP4 scales)."""
  kernels = [e for e in ckpt.layout(cfg) if e.transpose]
  selected = {e.path: rules.spec_for(e.path_str) for e in kernels}
  out: dict[tuple[str, ...], QArray] = {}
  done = set()
  for group in _FUSED:
    paths = [e.path for e in kernels if e.path[-2] in group]
    specs = {selected[p] for p in paths}
    if len(specs) > 1:
      raise ValueError(
        f"export_compressed_tensors: vLLM fuses {group} into one layer, so they need one "
        f"quantization scheme; the rules give {[str(selected[p]) for p in paths]}"
      )
    spec = specs.pop()
    if spec is None or not (fuse and isinstance(spec, (NVFP4, NVFP4WAG))):
      continue
    ws = [jnp.asarray(ckpt.get_path(params, p)).astype(dtype) for p in paths]
    q = _quantize(jnp.concatenate(ws, axis=-1), spec, axis=rules.axis)
    start = 0
    for p, w in zip(paths, ws):
      n = w.shape[-1]
      out[p] = QArray(
        codes=q.codes[..., start : start + n],
        scale=q.scale[..., start : start + n],
        global_scale=q.global_scale,
        spec=q.spec,
        axis=q.axis,
      )
      start += n
      done.add(p)
  for p, spec in selected.items():
    if spec is not None and p not in done:
      s, z = _learned(params, p, spec)
      out[p] = _quantize(
        jnp.asarray(ckpt.get_path(params, p)).astype(dtype), spec, axis=rules.axis, scale=s, zero_point=z
      )
  return out


def _learned(params, path: tuple[str, ...], spec):
  """The learned INT4 scale / zero point next to the kernel at `path` (None, None when not learned)."""
  node = ckpt.get_path(params, path[:-1])
  s, z = node.get(path[-1] + quant.SCALE_SUFFIX), node.get(path[-1] + quant.ZERO_SUFFIX)
  if getattr(spec, "learned", False) and s is None:
    raise ValueError(
      f"export_compressed_tensors: {'/'.join(path)} is {spec} but has no learned scale "
      f"'{path[-1]}{quant.SCALE_SUFFIX}' next to it"
    )
  if not getattr(spec, "learned", False):
    return None, None
  return s, (z if spec.learn_zero_point else None)


def _without_learned(params):
  """params without the learned INT4 scale / zero-point leaves (for the layout check)."""
  if not isinstance(params, dict):
    return params
  return {
    k: _without_learned(v)
    for k, v in params.items()
    if not (isinstance(k, str) and k.endswith(("kernel" + quant.SCALE_SUFFIX, "kernel" + quant.ZERO_SUFFIX)))
  }


def export_compressed_tensors(
  path: str | os.PathLike,
  cfg: ModelConfig,
  params,
  spec,
  *,
  rules: QuantRules | None = None,
  dtype=jnp.bfloat16,
  fuse_global_scales: bool = True,
  tokenizer=None,
  max_shard_bytes: int | None = None,
) -> Path:
  """Writes a compressed-tensors checkpoint of the float `params`, quantized to `spec`.

  Args:
    path: output directory (written to a temporary sibling, then renamed).
    cfg: the model config.
    params: float parameter tree (the learner's master weights).
    spec: `quant.Int4(...)` or `quant.NVFP4()`.
    rules: which kernels to quantize (default `QuantRules.default(spec)`; axis must be -2).
    dtype: the served compute dtype: everything left dense (embeddings, norms, biases, unselected
      layers) is stored in it, and kernels are quantized from their cast to it, as
      `sampler.serve_params(params, rules, dtype=dtype)` does (quantize what the matmul sees).
    fuse_global_scales: NVFP4 only: q/k/v and gate/up share their global scale (see the
      module docstring; required for vLLM).
    tokenizer: a `Tokenizer` to write alongside.
    max_shard_bytes: shard the safetensors above this size.

  Returns:
    The directory.
  """
  rules = QuantRules.default(spec) if rules is None else rules
  spec = NVFP4() if isinstance(spec, NVFP4WAG) else spec  # W/A/G's weights: NVFP4 with 16x16-tiled scales
  if type(spec) not in _FORMATS:
    raise ValueError(f"export_compressed_tensors supports Int4 and NVFP4 specs, got {spec}")
  if rules.axis != -2:
    raise ValueError(f"export_compressed_tensors needs rules.axis == -2 (groups along K), got {rules.axis}")
  ckpt.check_tree(cfg, _without_learned(params))
  qs = _quantize_kernels(cfg, params, rules, fuse_global_scales, jnp.dtype(dtype))
  for p, q in qs.items():
    if type(q.spec) is not type(spec) or q.spec != spec:
      raise ValueError(
        f"export_compressed_tensors: rule for {'/'.join(p)} gives {q.spec}, but one "
        f"checkpoint holds one scheme ({spec})"
      )
  np_dtype = jnp.dtype(dtype)
  tensors: dict[str, np.ndarray] = {}
  ignore = [] if not cfg.tie_word_embeddings else ["lm_head"]
  for ent in ckpt.layout(cfg):
    layers = range(cfg.num_layers) if ent.per_layer else [None]
    q = qs.get(ent.path)
    if q is None:
      a = np.asarray(ckpt.get_path(params, ent.path)).astype(np_dtype)
      for i in layers:
        x = a[i] if i is not None else a
        tensors[ent.hf_name(i)] = np.ascontiguousarray(x.T if ent.transpose else x)
        if ent.transpose:
          ignore.append(_linear_module(ent).format(i=i) if i is not None else _linear_module(ent))
      continue
    codes, scale = np.asarray(q.codes), np.asarray(q.scale)
    gs = None if q.global_scale is None else _encode_scale(np.asarray(q.global_scale))
    if isinstance(spec, Int4):
      signed = np.asarray(_unpack_nibbles(q.codes, axis=-2)).astype(np.int8) - np.int8(8)  # [L, K, N]
    k, n = ent.shape
    for i in layers:
      mod = _linear_module(ent).format(i=i)
      if isinstance(spec, Int4):
        tensors[mod + ".weight_packed"] = quant.pack_int4_compressed_tensors(signed[i].T, axis=-1)
        tensors[mod + ".weight_shape"] = np.array([n, k], np.int64)
        if q.zero_point is not None:
          if n % 8:
            raise ValueError(
              f"export_compressed_tensors: {mod} has N={n} outputs; asymmetric INT4 packs zero "
              "points eight per int32 along N, so N must be a multiple of 8"
            )
          zp = np.asarray(q.zero_point)[i].T  # [N, K/G] signed
          tensors[mod + ".weight_zero_point"] = quant.pack_int4_compressed_tensors(zp, axis=0)
      else:
        tensors[mod + ".weight_packed"] = np.ascontiguousarray(codes[i].T)
        tensors[mod + ".weight_global_scale"] = gs[i].reshape(1)
      tensors[mod + ".weight_scale"] = np.ascontiguousarray(scale[i].T)
  hf_cfg = cfg.to_hf()
  hf_cfg["dtype"] = hf_cfg["torch_dtype"] = np_dtype.name
  hf_cfg["quantization_config"] = quantization_config(spec, ignore)
  return ckpt.write_checkpoint(path, tensors, hf_cfg, tokenizer=tokenizer, max_shard_bytes=max_shard_bytes)


def _spec_from_config(qc: dict, where: Path):
  if not isinstance(qc, dict) or qc.get("quant_method") != "compressed-tensors":
    raise ValueError(
      f"{where}: quantization_config.quant_method is {(qc or {}).get('quant_method')!r}, expected 'compressed-tensors'"
    )
  groups = qc.get("config_groups") or {}
  if len(groups) != 1:
    raise ValueError(f"{where}: expected one config group, got {sorted(groups)}")
  (group,) = groups.values()
  w = group.get("weights") or {}
  if group.get("input_activations") is not None:
    raise ValueError(f"{where}: activation quantization is not supported (weight-only checkpoints)")
  fmt = group.get("format") or qc.get("format")
  if fmt == "pack-quantized" and w.get("type") == "int" and w.get("num_bits") == 4 and w.get("strategy") == "group":
    return Int4(group_size=int(w["group_size"]), scheme="absmax" if w.get("symmetric", True) else "minmax")
  if (
    fmt == "nvfp4-pack-quantized"
    and w.get("type") == "float"
    and w.get("num_bits") == 4
    and w.get("strategy") == "tensor_group"
    and w.get("group_size") == 16
  ):
    return NVFP4()
  raise ValueError(f"{where}: unsupported compressed-tensors scheme: format {fmt!r}, weights {w}")


def load_compressed_tensors(
  path: str | os.PathLike, *, dtype=jnp.float32, compute_dtype=None, tokenizer: bool = True
) -> LoadedModel:
  """Reads a checkpoint written by `export_compressed_tensors` (or llm-compressor, same scheme).

  Args:
    path: the checkpoint directory.
    dtype: the dtype of the dense (not quantized) parameters: embeddings, norms, biases, head.
    compute_dtype: `cfg.dtype`, the dtype the served model computes in (the quantized kernels decode to it);
      None: `dtype`. Serve as the learner's sampler did: both the sampler's compute dtype (e.g. bfloat16).
    tokenizer: also read tokenizer.json when the directory has one.

  Returns:
    `LoadedModel(cfg, served params, tokenizer or None)`: quantized kernels as stacked QArrays (axis -2, groups
    along K), the rest as arrays.

  Raises:
    FileNotFoundError / ValueError naming the file and tensor (missing, unexpected, wrong shape
    or dtype, unsupported scheme).
  """
  d = Path(path)
  if not d.is_dir():
    raise FileNotFoundError(f"checkpoint directory not found: {d}")
  raw = ckpt.read_json(d / "config.json", "config.json")
  spec = _spec_from_config(raw.get("quantization_config"), d / "config.json")
  param_dtype, compute = resolve_dtypes(dtype, compute_dtype)
  try:
    cfg = ModelConfig.from_hf(
      {k: v for k, v in raw.items() if k != "quantization_config"}, param_dtype=param_dtype, dtype=compute
    )
  except ValueError as err:
    raise ValueError(f"{d / 'config.json'}: {err}") from None
  sources = ckpt.open_checkpoint(d)
  used: set[str] = set()

  def get(name, shape, dt=None):
    if name not in sources:
      raise ValueError(f"{d}: missing tensor {name!r}")
    s = sources[name]
    if tuple(s.shape) != tuple(shape):
      raise ValueError(f"tensor {name!r} in {s.where} has shape {tuple(s.shape)}, expected {tuple(shape)}")
    a = np.asarray(s.load())
    if dt is not None and a.dtype != np.dtype(dt):
      raise ValueError(f"tensor {name!r} in {s.where} has dtype {a.dtype}, expected {np.dtype(dt)}")
    used.add(name)
    return a

  params: dict = {}
  for ent in ckpt.layout(cfg):
    layers = list(range(cfg.num_layers)) if ent.per_layer else [None]
    mod0 = _linear_module(ent).format(i=layers[0]) if ent.transpose else None
    if ent.transpose and mod0 + ".weight_packed" in sources:
      k, n = ent.shape
      codes, scales, gscales, zeros = [], [], [], []
      for i in layers:
        mod = _linear_module(ent).format(i=i)
        if isinstance(spec, Int4):
          packed = get(mod + ".weight_packed", (n, k // 8), np.int32)
          shp = get(mod + ".weight_shape", (2,))
          if tuple(int(x) for x in shp) != (n, k):
            raise ValueError(f"tensor {mod}.weight_shape is {shp.tolist()}, expected {[n, k]}")
          signed = quant.unpack_int4_compressed_tensors(packed, axis=-1)  # [N, K] int8
          codes.append((signed.astype(np.int16) + 8).astype(np.uint8).T)  # q + 8, [K, N]
          scales.append(get(mod + ".weight_scale", (n, k // spec.group_size)).T)
          if spec.asymmetric:
            if n % 8:
              raise ValueError(f"{d}: {mod} has N={n}; packed zero points need N to be a multiple of 8")
            zp = get(mod + ".weight_zero_point", (n // 8, k // spec.group_size), np.int32)
            zeros.append(quant.unpack_int4_compressed_tensors(zp, axis=0).T)  # [K/G, N] int8
        else:
          codes.append(get(mod + ".weight_packed", (n, k // 2), np.uint8).T)
          scales.append(get(mod + ".weight_scale", (n, k // 16), jnp.float8_e4m3fn).T)
          g = get(mod + ".weight_global_scale", (1,), np.float32)
          gscales.append((np.float32(1) / g[0]).astype(np.float32))
      sdt = scales[0].dtype
      if isinstance(spec, Int4):
        spec_i = Int4(group_size=spec.group_size, scale_dtype=np.dtype(sdt).name, scheme=spec.scheme)
        stacked = _pack_nibbles(np.stack(codes), axis=-2)  # [L, K/2, N], element 2i low
      else:
        spec_i, stacked = spec, np.stack(codes)
      q = QArray(
        codes=jnp.asarray(stacked),
        scale=jnp.asarray(np.stack(scales)),
        global_scale=jnp.asarray(np.stack(gscales)) if gscales else None,
        spec=spec_i,
        axis=-2,
        zero_point=jnp.asarray(np.stack(zeros)) if zeros else None,
      )
      ckpt._set(params, ent.path, q)
      continue
    parts = []
    for i in layers:
      a = get(ent.hf_name(i), ent.hf_shape)
      parts.append(a.T if ent.transpose else a)
    arr = np.stack(parts) if ent.per_layer else parts[0]
    ckpt._set(params, ent.path, jnp.asarray(arr.astype(jnp.dtype(param_dtype))))
  extra = set(sources) - used
  if extra:
    raise ValueError(f"{d}: unexpected tensors: " + ckpt._fmt(f"{n} ({sources[n].where})" for n in extra))
  tok = load_tokenizer(d) if tokenizer and (d / "tokenizer.json").is_file() else None
  return LoadedModel(cfg, params, tok)
