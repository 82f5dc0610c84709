"""The decoder: one functional forward pass for Llama, Qwen2 and Qwen3 checkpoints.

Architecture (transformers' `LlamaForCausalLM`, `Qwen2ForCausalLM`, `Qwen3ForCausalLM`):
pre-norm blocks h += Attn(RMSNorm(h)); h += MLP(RMSNorm(h)); RMSNorm (Zhang & Sennrich 2019)
y = x / sqrt(mean(x²) + ε) · g; rotary position embeddings (Su et al. 2021, "RoFormer") in the
"rotate_half" layout (the two halves of a head are the real and imaginary parts);
grouped-query attention (Ainslie et al. 2023); SwiGLU MLP down(silu(gate(x)) · up(x))
(Shazeer 2020); Qwen2's q/k/v biases; Qwen3's RMSNorm on each query/key head before RoPE.

Parameter tree (nested dicts; layers stacked along a leading L axis and run with `lax.scan`;
kernels follow Flax `Dense`: [K, N], used as `x @ kernel`):

| path                           | shape            | when                     |
|--------------------------------|------------------|--------------------------|
| embed/embedding                | [V, D]           | always                   |
| layers/input_norm/scale        | [L, D]           | always                   |
| layers/attn/q_proj/kernel      | [L, D, H·Dh]     | always                   |
| layers/attn/q_proj/bias        | [L, H·Dh]        | cfg.attention_bias       |
| layers/attn/k_proj/kernel      | [L, D, Hkv·Dh]   | always                   |
| layers/attn/k_proj/bias        | [L, Hkv·Dh]      | cfg.attention_bias       |
| layers/attn/v_proj/kernel      | [L, D, Hkv·Dh]   | always                   |
| layers/attn/v_proj/bias        | [L, Hkv·Dh]      | cfg.attention_bias       |
| layers/attn/o_proj/kernel      | [L, H·Dh, D]     | always                   |
| layers/attn/q_norm/scale       | [L, Dh]          | cfg.qk_norm              |
| layers/attn/k_norm/scale       | [L, Dh]          | cfg.qk_norm              |
| layers/post_attn_norm/scale    | [L, D]           | always                   |
| layers/mlp/gate_proj/kernel    | [L, D, F]        | always                   |
| layers/mlp/up_proj/kernel      | [L, D, F]        | always                   |
| layers/mlp/down_proj/kernel    | [L, F, D]        | always                   |
| final_norm/scale               | [D]              | always                   |
| lm_head/kernel                 | [D, V]           | not cfg.tie_word_embeddings (tied: logits = h @ embedding.T) |

`QuantRules.default(spec)` (axis=-2, the contraction axis) selects exactly the `*_proj/kernel`
leaves. A kernel may be a float array (learner; with `Numerics.qat_rules` its matmul is fake-quantized
through `quant.dot_general_for`) or a `quant.QArray` (sampler; matmul through
`lrl_jax.kernels.qmatmul`). A served QArray may also be in the nn.Linear layout [.., N, K] quantized along
its last axis (`sampler.serve_params(..., layout="linear")`, `kernels.linear_layout`): its matmul goes
through `kernels.qlinear`, whose Hopper kernel decodes the weights in registers. The architecture code is
the same for all.

Numerics: activations and matmul inputs in `cfg.dtype`, matmuls accumulate in float32; RMSNorm
statistics, RoPE angles, attention scores/softmax and the logits are float32.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
from jax import lax

from lrl_jax import kernels, quant
from lrl_jax.models.config import ModelConfig

__all__ = [
  "KVCache",
  "Numerics",
  "init_cache",
  "init_params",
  "forward",
  "forward_hidden",
  "forward_hidden_grouped",
  "logits_from_hidden",
  "remat_policy",
  "REMAT_POLICIES",
  "param_shapes",
  "check_params",
  "param_logical_axes",
  "ACTIVATION_AXES",
]

_NEG = float(jnp.finfo(jnp.float32).min)  # masked score: finite, so a fully masked row gives no NaN


# --------------------------------------------------------------------------- parameters


def param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
  """'/'-joined path -> shape of every parameter `cfg` implies (the table in the module docstring)."""
  L, D, F, V, Dh = cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_dim
  s = {
    "embed/embedding": (V, D),
    "layers/input_norm/scale": (L, D),
    "layers/attn/q_proj/kernel": (L, D, cfg.q_dim),
    "layers/attn/k_proj/kernel": (L, D, cfg.kv_dim),
    "layers/attn/v_proj/kernel": (L, D, cfg.kv_dim),
    "layers/attn/o_proj/kernel": (L, cfg.q_dim, D),
    "layers/post_attn_norm/scale": (L, D),
    "layers/mlp/gate_proj/kernel": (L, D, F),
    "layers/mlp/up_proj/kernel": (L, D, F),
    "layers/mlp/down_proj/kernel": (L, F, D),
    "final_norm/scale": (D,),
  }
  if cfg.attention_bias:
    s["layers/attn/q_proj/bias"] = (L, cfg.q_dim)
    s["layers/attn/k_proj/bias"] = (L, cfg.kv_dim)
    s["layers/attn/v_proj/bias"] = (L, cfg.kv_dim)
  if cfg.qk_norm:
    s["layers/attn/q_norm/scale"] = (L, Dh)
    s["layers/attn/k_norm/scale"] = (L, Dh)
  if not cfg.tie_word_embeddings:
    s["lm_head/kernel"] = (D, V)
  return s


# Logical axis names of every parameter (the learner and the sampler map them to mesh axes).
_PARAM_AXES = {
  "embed/embedding": ("vocab", "embed"),
  "layers/input_norm/scale": ("layers", "embed"),
  "layers/attn/q_proj/kernel": ("layers", "embed", "heads"),
  "layers/attn/q_proj/bias": ("layers", "heads"),
  "layers/attn/k_proj/kernel": ("layers", "embed", "kv_heads"),
  "layers/attn/k_proj/bias": ("layers", "kv_heads"),
  "layers/attn/v_proj/kernel": ("layers", "embed", "kv_heads"),
  "layers/attn/v_proj/bias": ("layers", "kv_heads"),
  "layers/attn/o_proj/kernel": ("layers", "heads", "embed"),
  "layers/attn/q_norm/scale": ("layers", "head_dim"),
  "layers/attn/k_norm/scale": ("layers", "head_dim"),
  "layers/post_attn_norm/scale": ("layers", "embed"),
  "layers/mlp/gate_proj/kernel": ("layers", "embed", "mlp"),
  "layers/mlp/up_proj/kernel": ("layers", "embed", "mlp"),
  "layers/mlp/down_proj/kernel": ("layers", "mlp", "embed"),
  "final_norm/scale": ("embed",),
  "lm_head/kernel": ("embed", "vocab"),
}

# Logical axis names of the activations `forward` constrains (active only inside
# `flax.linen.logical_axis_rules(...)`; a no-op otherwise).
ACTIVATION_AXES = {
  "hidden_BTD": ("batch", "length", "embed"),
  "q_BTHD": ("batch", "length", "heads", "head_dim"),
  "kv_BTHD": ("batch", "length", "kv_heads", "head_dim"),
  "mlp_BTF": ("batch", "length", "mlp"),
  "logits_BTV": ("batch", "length", "vocab"),
  "cache_LBSHD": ("layers", "batch", "cache_length", "kv_heads", "head_dim"),
}


def param_logical_axes(params_or_cfg) -> Any:
  """Logical axis names for each parameter: a tree like the params with tuples of names as leaves.

  Args:
    params_or_cfg: a `ModelConfig` (gives the tree of `init_params(cfg)`), a param tree, or a
      served tree (a QArray leaf gets a QArray of names: codes and scale take the kernel's names,
      the NVFP4 `global_scale` [L] or [] the leading ones).

  Raises:
    ValueError naming a path that is not in the parameter table.
  """
  if isinstance(params_or_cfg, ModelConfig):
    return _unflatten({p: _PARAM_AXES[p] for p in param_shapes(params_or_cfg)})

  def visit(kp, leaf):
    p = quant.path_str(kp)
    names = _axes_for_path(p)
    if isinstance(leaf, quant.QArray):
      if leaf.axis == -1:  # the nn.Linear layout (`kernels.linear_layout`): [.., N, K]
        names = (*names[:-2], names[-1], names[-2])
      gs = None if leaf.global_scale is None else names[: leaf.global_scale.ndim]
      zp = None if leaf.zero_point is None else names
      return dataclasses.replace(leaf, codes=names, scale=names, global_scale=gs, zero_point=zp)
    return names

  return jax.tree_util.tree_map_with_path(visit, params_or_cfg, is_leaf=lambda x: isinstance(x, quant.QArray))


def _learned_kernel(p: str) -> str | None:
  """'layers/attn/q_proj/kernel_scale' -> 'layers/attn/q_proj/kernel' (a learned INT4 scale / zero point)."""
  for suffix in (quant.SCALE_SUFFIX, quant.ZERO_SUFFIX):
    if p.endswith("kernel" + suffix):
      return p[: -len(suffix)]
  return None


def _axes_for_path(p: str) -> tuple[str, ...]:
  if p in _PARAM_AXES:
    return _PARAM_AXES[p]
  if _learned_kernel(p) in _PARAM_AXES:  # group scales [.., K/G, N] take the kernel's names
    return _PARAM_AXES[_learned_kernel(p)]
  raise ValueError(f"no logical axes for parameter path {p!r}; known: {sorted(_PARAM_AXES)}")


def _unflatten(flat: dict[str, Any]) -> dict:
  tree: dict = {}
  for p, v in flat.items():
    *parents, leaf = p.split("/")
    node = tree
    for k in parents:
      node = node.setdefault(k, {})
    node[leaf] = v
  return tree


@functools.partial(jax.jit, static_argnames=("cfg", "std"))
def init_params(cfg: ModelConfig, key: jax.Array, *, std: float = 0.02) -> dict:
  """Random parameters: kernels and embedding ~ N(0, std²) (transformers' `initializer_range`),
  norm scales 1, biases 0; dtype `cfg.param_dtype`."""
  shapes = param_shapes(cfg)
  dt = jnp.dtype(cfg.param_dtype)
  keys = dict(zip(sorted(shapes), jax.random.split(key, len(shapes))))
  flat = {}
  for p, shape in shapes.items():
    if p.endswith("/scale"):
      flat[p] = jnp.ones(shape, dt)
    elif p.endswith("/bias"):
      flat[p] = jnp.zeros(shape, dt)
    else:
      flat[p] = (std * jax.random.normal(keys[p], shape, jnp.float32)).astype(dt)
  return _unflatten(flat)


def check_params(params, cfg: ModelConfig) -> None:
  """Raises ValueError naming the path (and both shapes) of any missing, extra or misshapen parameter.

  QArray leaves are checked by their logical shape.
  """
  want = param_shapes(cfg)
  got = {
    quant.path_str(kp): tuple(leaf.shape)
    for kp, leaf in jax.tree_util.tree_leaves_with_path(params, is_leaf=lambda x: isinstance(x, quant.QArray))
  }
  for p in [p for p in got if _learned_kernel(p) in want]:  # learned INT4 scales: [.., K/G, N] next to the kernel
    k_shape, g_shape = want[_learned_kernel(p)], got.pop(p)
    if len(g_shape) != len(k_shape) or g_shape[-1] != k_shape[-1] or not g_shape[-2] or k_shape[-2] % g_shape[-2]:
      raise ValueError(
        f"parameter {p}: expected group scales [.., K/G, {k_shape[-1]}] of the kernel {k_shape}, got {g_shape}"
      )
  missing = sorted(set(want) - set(got))
  extra = sorted(set(got) - set(want))
  if missing or extra:
    raise ValueError(f"parameter tree does not match {cfg.arch} config: missing {missing}, unexpected {extra}")
  for p, shape in want.items():
    if got[p] != shape:
      raise ValueError(f"parameter {p}: expected shape {shape}, got {got[p]}")


# --------------------------------------------------------------------------- KV cache


@functools.partial(
  jax.tree_util.register_dataclass,
  data_fields=["k", "v", "valid_BS", "k_scale", "v_scale"],
  meta_fields=[],
)
@dataclasses.dataclass(frozen=True)
class KVCache:
  """Preallocated keys/values of every layer. Slot s of every row holds the token written at s.

  Attributes:
    k, v: [L, B, S, Hkv, Dh], bfloat16 / float32, or float8_e4m3fn (then with scales).
    valid_BS: [B, S] bool, slots holding a real token (padding and unwritten slots are False).
    k_scale, v_scale: FP8 cache only: float32 [L, B, S, Hkv], one scale per (token, head):
      s = amax / 448 over Dh; k̂ = f32(k) · s. None otherwise.
  """

  k: jax.Array
  v: jax.Array
  valid_BS: jax.Array
  k_scale: jax.Array | None = None
  v_scale: jax.Array | None = None

  @property
  def max_len(self) -> int:
    return self.valid_BS.shape[1]


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype=jnp.bfloat16) -> KVCache:
  """An empty cache of `max_len` slots per row; dtype bfloat16 / float16 / float32, or
  float8_e4m3fn (per-(token, head) float32 scales)."""
  dtype = jnp.dtype(dtype)
  if dtype not in (
    jnp.dtype(jnp.bfloat16),
    jnp.dtype(jnp.float16),
    jnp.dtype(jnp.float32),
    jnp.dtype(jnp.float8_e4m3fn),
  ):
    raise ValueError(f"init_cache: dtype must be bfloat16, float16, float32 or float8_e4m3fn; got {dtype}")
  shape = (cfg.num_layers, batch, max_len, cfg.num_kv_heads, cfg.head_dim)
  fp8 = dtype == jnp.dtype(jnp.float8_e4m3fn)
  scale = jnp.ones(shape[:-1], jnp.float32) if fp8 else None
  return KVCache(
    k=jnp.zeros(shape, dtype),
    v=jnp.zeros(shape, dtype),
    valid_BS=jnp.zeros((batch, max_len), bool),
    k_scale=scale,
    v_scale=scale,
  )


def _fp8_encode(x):
  """[.., Dh] -> e4m3 codes, f32 scale per vector (s = amax/448; clipped: a plain cast overflows to NaN)."""
  x = x.astype(jnp.float32)
  s = jnp.maximum(jnp.max(jnp.abs(x), axis=-1) / 448.0, jnp.finfo(jnp.float32).tiny)
  c = jnp.clip(x / s[..., None], -448.0, 448.0).astype(jnp.float8_e4m3fn)
  return c, s


# --------------------------------------------------------------------------- building blocks


def _constrain(x, name: str):
  return nn.with_logical_constraint(x, ACTIVATION_AXES[name])


def _rms_norm(x, scale, eps, dtype):
  """x / sqrt(mean(x²) + ε) · g, statistics in f32; the scale multiplies in `dtype` (as transformers)."""
  xf = x.astype(jnp.float32)
  y = xf * lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
  return y.astype(dtype) * _lead(scale.astype(dtype), y.ndim)


def _lead(v, ndim):
  """v [.., N] with leading singleton axes up to rank `ndim` (explicit broadcasting)."""
  return v.reshape((1,) * (ndim - v.ndim) + v.shape)


def _rope(x_BTHD, positions_BT, theta):
  """Rotary embedding, rotate_half layout: x·cos + rotate_half(x)·sin, angles p·θ^(-2i/Dh) in f32."""
  dh = x_BTHD.shape[-1]
  inv_freq = 1.0 / (theta ** (jnp.arange(0, dh, 2, dtype=jnp.float32) / dh))  # [Dh/2]
  ang = positions_BT.astype(jnp.float32)[..., None] * inv_freq[None, None, :]  # [B, T, Dh/2]
  ang = jnp.concatenate([ang, ang], axis=-1)[:, :, None, :]  # [B, T, 1, Dh]
  xf = x_BTHD.astype(jnp.float32)
  x1, x2 = xf[..., : dh // 2], xf[..., dh // 2 :]
  rot = jnp.concatenate([-x2, x1], axis=-1)
  return (xf * jnp.cos(ang) + rot * jnp.sin(ang)).astype(x_BTHD.dtype)


def _act_quant(x, act_spec):
  """The activations a served matmul sees: (x', post) with y = (x' ⋅ ŵ) · post. FP8 per token: x' = x̂, post = None.
  NVFP4 (W4A4): x' = e2m1 · s_b (exact in x.dtype; 1x16 along K, one per-tensor scale over all the tokens, as the
  learner's `quant.nvfp4_wag_matmul`), post = its dec, applied after the K sum as the learner does; an `NVFP4WAG`
  act_spec: its forward's activations (`act_scale` "token": one scale per token)."""
  if act_spec is None:
    return x, None
  if isinstance(act_spec, (quant.NVFP4, quant.NVFP4WAG)):
    scale = act_spec.act_scale if isinstance(act_spec, quant.NVFP4WAG) else "tensor"
    xm, dec = quant.nvfp4_activations(x.reshape(-1, x.shape[-1]), scale)
    dec = dec if scale == "tensor" else dec.reshape(x.shape[:-1] + (1,))
    return xm.astype(x.dtype).reshape(x.shape), dec
  return quant.fake_quant(x, act_spec, axis=-1), None


def _post(y, post, dtype):
  return (y if post is None else y.astype(jnp.float32) * post).astype(dtype)


def _matmul(x, w, spec, act_spec=None, qparams=None, alpha=None, wag=None):
  """x [.., K] @ w [K, N] -> [.., N] in x.dtype, f32 accumulation.

  w: a QArray (sampler: `kernels.qmatmul`; in the nn.Linear layout [N, K], axis=-1: `kernels.qlinear`)
    or a float array (learner). A float w without a spec is a plain dot (`kernels.dense_dot`: its weight
    gradient contracts x's rows flattened, one axis, which XLA:CPU lays out without a slow transposed copy).
  A float w with a spec is fake-quantized along K with a straight-through gradient through `quant.dot_general_for(spec)`
  (AQT for INT4 / FP8, `fake_quant` for MXFP8; a barrier there keeps XLA from fusing the
  dequantization into the dot, so the QAT forward equals the forward on `fake_quant_params`). NVFP4
  computes the sampler's dot, `quant.qdot` (its per-matrix scale after the K sum): the QAT forward equals
  the forward on the served QArrays, and the one on `fake_quant_params` up to rounding ŵ to x.dtype. (A forward
  fake-quantizes the kernels its QAT selects once, before the layer scan, where it can: `_hoist_operands`; they
  reach here as `kernels.Predecoded`, the same operand and the same dot.)
  act_spec: FP8(granularity="token") fake-quantizes x per token first (W8A8); NVFP4() quantizes it 1x16 along K
    (W4A4 on served NVFP4 weights: `_act_quant`, the XLA dot `quant.qdot`, then the activations' dec); or None.
  qparams: (scale, zero point or None) of a learned INT4 spec (`kernel_scale` / `kernel_zero`).
  alpha: QAT warm-up weight in [0, 1] (a scalar array) or None (QAT fully on).
  wag: `quant.NVFP4WAG` only: (PRNG key of this kernel, layer on: a bool scalar or None) -> `quant.nvfp4_wag_matmul`,
    or a plain dot where the layer is off (`QuantRules.keep_last_layers`).
  """
  if isinstance(w, kernels.Predecoded):  # a weight decoded once (`kernels.predecode`, `_qat_operand`): the same dot
    x, post = _act_quant(x, act_spec)
    if post is None:  # the product's output in x.dtype: its backward dots in x.dtype too (`kernels.dense_dot`)
      return kernels.predecoded_dot(x, w, x.dtype)
    return _post(kernels.predecoded_dot(x, w), post, x.dtype)
  if isinstance(w, quant.QArray):
    x, post = _act_quant(x, act_spec)
    if post is not None:  # W4A4: f32 until the activations' scale (the Pallas kernels round to x.dtype first)
      return _post(quant.qdot(x, w, materialize=True), post, x.dtype)
    if w.axis == -1:  # served as [N, K] (`kernels.linear_layout`)
      return kernels.qlinear(x, w).astype(x.dtype)
    return kernels.qmatmul(x, w).astype(x.dtype)
  w = w.astype(x.dtype)  # quantize the array the matmul sees (the sampler quantizes the same cast)
  if isinstance(spec, quant.NVFP4WAG):
    if qparams is not None or alpha is not None or act_spec is not None:
      raise ValueError(f"{spec}: no QAT warm-up (qat_start_step / qat_warmup_steps) or act_spec with W/A/G")
    key, on = (None, None) if wag is None else wag
    dn = (((x.ndim - 1,), (0,)), ((), ()))
    mm = lambda: quant.dot_general_for(spec, key=key)(x, w, dn, preferred_element_type=jnp.float32)  # noqa: E731
    if on is None:
      return mm().astype(x.dtype)
    plain = lambda: lax.dot_general(x, w, dn, preferred_element_type=jnp.float32)  # noqa: E731
    return lax.cond(on, mm, plain).astype(x.dtype)
  dn = (((x.ndim - 1,), (0,)), ((), ()))
  if spec is not None and (qparams is not None or alpha is not None):
    # Explicit ŵ: learned INT4 scales (LSQ), and/or QAT fading in: w + α·(ŵ − w), exactly ŵ once α >= 1.
    if qparams is not None:
      s, z = qparams
      w_hat = quant.learned_fake_quant(
        w, s.astype(jnp.float32), None if z is None else z.astype(jnp.float32), spec, axis=0
      )
    else:
      w_hat = quant.fake_quant(w, spec, axis=0)
    if alpha is not None:
      a = jnp.asarray(alpha, jnp.float32)
      w_hat = jnp.where(a >= 1.0, w_hat, (w.astype(jnp.float32) + a * (w_hat - w).astype(jnp.float32)).astype(w.dtype))
    w_hat = lax.optimization_barrier(w_hat)  # same dot as the sampler's on dequantized weights
    if act_spec is not None:
      x = lax.optimization_barrier(quant.fake_quant(x, act_spec, axis=-1))
    blend = lambda: lax.dot_general(x, w_hat, dn, preferred_element_type=jnp.float32)  # noqa: E731
    if isinstance(spec, quant.NVFP4) and qparams is None:
      # Once faded in, NVFP4 computes the sampler's dot, dec · (x @ e2m1·s_b) (`quant.qdot`), not x @ round(ŵ).
      served = lambda: quant.dot_general_for(spec)(x, w, dn, preferred_element_type=jnp.float32)  # noqa: E731
      return lax.cond(a >= 1.0, served, blend).astype(x.dtype)
    return blend().astype(x.dtype)
  if spec is None and act_spec is None:
    return kernels.dense_dot(x, w, out_dtype=x.dtype)  # the plain dot, its weight gradient over flattened rows
  y = quant.dot_general_for(spec, act_spec=act_spec)(x, w, dn, preferred_element_type=jnp.float32)
  return y.astype(x.dtype)


def _dense(x, p: dict, name: str, specs: dict, lora_p: dict | None, lora_scale: float):
  """One linear layer: x @ kernel (+ bias) (+ (α/r)·(x @ A) @ B).

  specs: layer name -> weight spec of the QAT rules, and "act" -> the activation spec, which applies
  to the matmuls with a quantized weight (a QArray, or a float kernel the rules select).
  """
  w, spec = p["kernel"], specs.get(name)
  act = specs.get("act") if (spec is not None or isinstance(w, (quant.QArray, kernels.Predecoded))) else None
  qparams = None
  if spec is not None and getattr(spec, "learned", False):
    s_key, z_key = "kernel" + quant.SCALE_SUFFIX, "kernel" + quant.ZERO_SUFFIX
    if s_key not in p:
      raise ValueError(
        f"layers/{name}/kernel: {spec} needs its learned scale 'kernel{quant.SCALE_SUFFIX}' "
        "(quant.init_learned(params, rules))"
      )
    qparams = (p[s_key], p.get(z_key) if spec.learn_zero_point else None)
  wag = None
  if isinstance(spec, quant.NVFP4WAG):
    wag = (jax.random.fold_in(specs["key"], _LAYER_KERNELS.index(name)), specs.get("on"))
  y = _matmul(x, w, spec, act, qparams, specs.get("alpha"), wag)
  if "bias" in p:
    y = y + _lead(p["bias"].astype(y.dtype), y.ndim)
  if lora_p is not None:
    a, b = lora_p["a"].astype(x.dtype), lora_p["b"].astype(x.dtype)
    xa = jnp.dot(x, a, preferred_element_type=jnp.float32).astype(x.dtype)
    y = y + (lora_scale * jnp.dot(xa, b, preferred_element_type=jnp.float32)).astype(y.dtype)
  return y


def _attention(q_BTHD, k_BSKD, v_BSKD, mask_BTS, dtype):
  """Grouped-query softmax attention; scores and softmax in f32. mask_BTS: True = attend."""
  B, T, H, Dh = q_BTHD.shape
  Hkv = k_BSKD.shape[2]
  q = q_BTHD.reshape(B, T, Hkv, H // Hkv, Dh)
  s = jnp.einsum("btkgd,bskd->bkgts", q, k_BSKD.astype(dtype), preferred_element_type=jnp.float32)
  s = s * (1.0 / math.sqrt(Dh))
  s = jnp.where(mask_BTS[:, None, None, :, :], s, _NEG)
  p = jax.nn.softmax(s, axis=-1).astype(dtype)
  o = jnp.einsum("bkgts,bskd->btkgd", p, v_BSKD.astype(dtype), preferred_element_type=jnp.float32)
  return o.astype(dtype).reshape(B, T, H * Dh)


# --------------------------------------------------------------------------- forward

_LAYER_KERNELS = (
  "attn/q_proj",
  "attn/k_proj",
  "attn/v_proj",
  "attn/o_proj",
  "mlp/gate_proj",
  "mlp/up_proj",
  "mlp/down_proj",
)


@flax.struct.dataclass
class Numerics:
  """How the matmuls of a forward compute beyond `cfg.dtype` (a pytree: `qat_alpha` may be traced).

  Attributes:
    qat_rules: `quant.QuantRules` (static) of the learner's QAT: float layer kernels whose stacked path (e.g.
      'layers/attn/q_proj/kernel') it selects are fake-quantized in the matmul (`quant.dot_general_for`,
      straight-through gradient; a learned Int4 spec uses the `kernel_scale` / `kernel_zero` next to the kernel,
      with LSQ gradients). QArray kernels (a served tree) ignore it.
    qat_alpha: QAT warm-up (f32 scalar in [0, 1]): the selected kernels enter the matmul as w + α·(ŵ − w);
      exactly ŵ when α >= 1. None: ŵ (QAT fully on). Ignored without qat_rules.
    act_spec: `quant.FP8(granularity="token")` (static) for W8A8: the input of every matmul with a quantized
      weight (QArray, or selected by qat_rules) is fake-quantized per token. `quant.NVFP4()`: served NVFP4 weights
      with NVFP4 activations, 1x16 along K (W4A4, the forward of `quant.NVFP4WAG`); a `quant.NVFP4WAG` spec: the
      activations of its forward (`act_scale`). None: W*A16.
    key: PRNG key of `quant.NVFP4WAG` kernels (stochastic rounding, RHT: their backward only); the layer index and
      the kernel's index are folded in per matmul. None: `PRNGKey(0)`. The learner folds in its step.
  """

  qat_rules: quant.QuantRules | None = flax.struct.field(pytree_node=False, default=None)
  qat_alpha: jax.Array | None = None
  act_spec: quant.FP8 | quant.NVFP4 | quant.NVFP4WAG | None = flax.struct.field(pytree_node=False, default=None)
  key: jax.Array | None = None


def _qat_specs(qat_rules, params, act_spec=None, key=None) -> dict:
  """'attn/q_proj' -> spec for the float layer kernels the rules select (decided on stacked paths);
  'act' -> the activation spec; with `quant.NVFP4WAG` kernels 'key' (`Numerics.key`) and 'keep_last'."""
  if act_spec is not None and not (
    (isinstance(act_spec, quant.FP8) and act_spec.granularity == "token")
    or isinstance(act_spec, (quant.NVFP4, quant.NVFP4WAG))
  ):
    raise ValueError(f"act_spec must be FP8(granularity='token'), NVFP4(), NVFP4WAG() or None; got {act_spec!r}")
  if qat_rules is None:
    return {} if act_spec is None else {"act": act_spec}
  if qat_rules.axis != -2:
    raise ValueError(f"qat_rules.axis must be -2 (the kernel's contraction axis); got {qat_rules.axis}")
  out = {}
  for name in _LAYER_KERNELS:
    path = f"layers/{name}/kernel"
    spec = qat_rules.spec_for(path)
    if spec is not None:
      out[name] = spec
  for path in ("embed/embedding", "lm_head/kernel"):
    if qat_rules.spec_for(path) is not None and _get(params, path) is not None:
      raise ValueError(f"qat_rules select {path!r}: fake-quantized embeddings / lm_head are not supported")
  if act_spec is not None:
    out["act"] = act_spec
  if any(isinstance(s, quant.NVFP4WAG) for s in out.values()):
    out["key"] = jax.random.PRNGKey(0) if key is None else key
    out["keep_last"] = qat_rules.keep_last_layers
  elif qat_rules.keep_last_layers:
    raise ValueError(f"QuantRules.keep_last_layers applies to NVFP4WAG kernels; the rules select {out}")
  return out


def _hoistable(spec) -> bool:
  """A weight spec whose QAT operand is the same for every matmul of a forward: a fake quant, not learned."""
  if isinstance(spec, quant.Int4):
    return not spec.learned
  return isinstance(spec, (quant.FP8, quant.MXFP8, quant.NVFP4))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _qat_operand(w, spec):
  """The QAT operand of a stacked kernel w [.., K, N] in the compute dtype, as a `kernels.Predecoded`: ŵ =
  dequantize(quantize(w, spec, axis=-2), w.dtype) (NVFP4: e2m1 · s_b, its per-matrix `dec` applied after the K sum),
  the operand `quant.dot_general_for(spec)` and the sampler's predecoded path dot with: computed by Google AQT
  where `dot_general_for` uses it (absmax INT4, FP8), by `quant.nvfp4_operand` for NVFP4 (no codes packed), else by
  `quant.quantize`. Straight-through. Its operations
  carry the name scope "qat_operand" (how a test finds where a program fake-quantizes)."""
  with jax.named_scope("qat_operand"):
    if isinstance(spec, quant.FP8) or (isinstance(spec, quant.Int4) and spec.scheme == "absmax"):
      w_hat = lax.optimization_barrier(quant.aqt_fake_quant(w, spec, axis=-2))
      return kernels.Predecoded(w=w_hat, dec=None, axis=-2)
    if isinstance(spec, quant.NVFP4):  # kernels.predecode(quant.quantize(w)) bit for bit, without packing the codes
      w_b, dec = lax.optimization_barrier(quant.nvfp4_operand(w, spec, axis=-2))
      return kernels.Predecoded(w=w_b.astype(w.dtype), dec=dec, axis=-2)
    q = lax.optimization_barrier(quant.quantize(w, spec, axis=-2))
    return kernels.predecode(q, w.dtype)


def _qat_operand_fwd(w, spec):
  p = _qat_operand(w, spec)
  return p, p.dec


def _qat_operand_bwd(spec, dec, g):
  # Straight-through to ŵ: for NVFP4 ŵ = w_b · dec, so dL/dŵ = dL/dw_b / dec (dec's own cotangent is dropped:
  # the scales are not differentiated, as in every other QAT path here).
  if dec is None:
    return (g.w,)
  return ((g.w.astype(jnp.float32) / dec.reshape(dec.shape + (1, 1))).astype(g.w.dtype),)


_qat_operand.defvjp(_qat_operand_fwd, _qat_operand_bwd)


def _hoist_operands(params, specs: dict, dtype):
  """(params, specs) with each float layer kernel that QAT selects fake-quantized once for the whole forward, outside
  the layer scan (a `kernels.Predecoded` of the stacked [L, K, N] kernel cast to the compute dtype, `_qat_operand`),
  instead of at every matmul inside it: the grouped forward runs two matmuls per kernel and layer, and NVFP4's
  backward quantized once more. The same operand and the same dot as `quant.dot_general_for(spec)`, so the forward's
  numbers do not change (tested bit for bit). A float kernel that QAT does not select, in another dtype than the
  compute dtype (f32 masters, bf16 compute), is cast to it once the same way (a `Predecoded` of the cast stack: the
  same operand and dot as the cast at each matmul). The gradients of a kernel's matmuls within one forward now add in
  the compute dtype, on the operand, before reaching the f32 master (as a cached autocast weight's do in torch): one
  more rounding (2^-9 relative in bf16) where a forward uses a kernel twice (the grouped forward's prompt and
  completions). Kept per matmul (nothing hoisted): QAT fading in (`qat_alpha`), NVFP4 W/A/G, quantized activations;
  and learned scales' kernels."""
  if "alpha" in specs or "act" in specs or "key" in specs:
    return params, specs
  layers = jax.tree_util.tree_map(lambda x: x, params["layers"], is_leaf=lambda x: not isinstance(x, dict))
  specs = dict(specs)
  for name in _LAYER_KERNELS:
    group, proj = name.split("/")
    w, spec = layers[group][proj]["kernel"], specs.get(name)
    if isinstance(w, (quant.QArray, kernels.Predecoded)):
      continue
    if spec is None:  # a float kernel: cast to the compute dtype once for the forward, not at each matmul
      if w.dtype != dtype:
        layers[group][proj] = dict(layers[group][proj], kernel=kernels.Predecoded(w=w.astype(dtype), dec=None))
      continue
    if not _hoistable(spec):
      continue
    layers[group][proj] = dict(layers[group][proj], kernel=_qat_operand(w.astype(dtype), specs.pop(name)))
  return dict(params, layers=layers), specs


def _forward_specs(params, numerics: Numerics) -> dict:
  """The specs of a forward under `numerics` (`_qat_specs`, and 'alpha' while QAT fades in)."""
  specs = _qat_specs(numerics.qat_rules, params, numerics.act_spec, numerics.key)
  if numerics.qat_alpha is not None and numerics.qat_rules is not None:
    specs["alpha"] = jnp.asarray(numerics.qat_alpha, jnp.float32)
  return specs


def hoist_qat_operands(params, numerics: Numerics | None, dtype):
  """params with the layer kernels a forward under `numerics` would fake-quantize (or cast) once (`_hoist_operands`)
  replaced by their operands (`kernels.Predecoded` in `dtype`, straight-through to the float kernels), so that several
  forwards of one step share one fake-quant pass (the learner's micro-batches). A forward given these params skips
  the pass and computes the same numbers bit for bit; its gradient reaches the float kernels through this
  function's vjp. params unchanged (the same tree) where nothing is hoisted: no QAT, QAT fading in, learned scales,
  NVFP4 W/A/G, quantized activations."""
  if numerics is None or numerics.qat_rules is None:
    return params
  return _hoist_operands(params, _forward_specs(params, numerics), jnp.dtype(dtype))[0]


def _layer_specs(specs: dict, i, num_layers: int, part: int = 0) -> dict:
  """The specs of layer i of the scan: NVFP4WAG's key folded with (i, part) and 'on' = i < L − keep_last."""
  if "key" not in specs:
    return specs
  out = dict(specs, key=jax.random.fold_in(jax.random.fold_in(specs["key"], i), part))
  if specs["keep_last"]:
    out["on"] = i < num_layers - specs["keep_last"]
  return out


def _get(tree, path):
  node = tree
  for k in path.split("/"):
    if not isinstance(node, dict) or k not in node:
      return None
    node = node[k]
  return node


def _layer(cfg: ModelConfig, specs, lora_scale, x, lp, lora_lp, positions_BT, kv_fn):
  """One decoder block. kv_fn(k_new, v_new) -> (keys, values, mask_BTS) abstracts cache vs no cache."""
  dt = cfg.compute_dtype
  B, T, _ = x.shape
  H, Hkv, Dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  ap = lp["attn"]
  lo = (lambda n: None) if lora_lp is None else (lambda n: _get(lora_lp, n))

  h = _rms_norm(x, lp["input_norm"]["scale"], cfg.rms_norm_eps, dt)
  q = _dense(h, ap["q_proj"], "attn/q_proj", specs, lo("attn/q_proj"), lora_scale).reshape(B, T, H, Dh)
  k = _dense(h, ap["k_proj"], "attn/k_proj", specs, lo("attn/k_proj"), lora_scale).reshape(B, T, Hkv, Dh)
  v = _dense(h, ap["v_proj"], "attn/v_proj", specs, lo("attn/v_proj"), lora_scale).reshape(B, T, Hkv, Dh)
  if cfg.qk_norm:
    q = _rms_norm(q, ap["q_norm"]["scale"], cfg.rms_norm_eps, dt)
    k = _rms_norm(k, ap["k_norm"]["scale"], cfg.rms_norm_eps, dt)
  q = _constrain(_rope(q, positions_BT, cfg.rope_theta), "q_BTHD")
  k = _constrain(_rope(k, positions_BT, cfg.rope_theta), "kv_BTHD")
  keys, values, mask_BTS = kv_fn(k, v)
  o = _attention(q, keys, values, mask_BTS, dt)
  x = x + _dense(o, ap["o_proj"], "attn/o_proj", specs, lo("attn/o_proj"), lora_scale)
  x = _constrain(x, "hidden_BTD")

  mp = lp["mlp"]
  h = _rms_norm(x, lp["post_attn_norm"]["scale"], cfg.rms_norm_eps, dt)
  g = _dense(h, mp["gate_proj"], "mlp/gate_proj", specs, lo("mlp/gate_proj"), lora_scale)
  u = _dense(h, mp["up_proj"], "mlp/up_proj", specs, lo("mlp/up_proj"), lora_scale)
  a = _constrain((jax.nn.silu(g.astype(jnp.float32)) * u.astype(jnp.float32)).astype(dt), "mlp_BTF")
  x = x + _dense(a, mp["down_proj"], "mlp/down_proj", specs, lo("mlp/down_proj"), lora_scale)
  return _constrain(x, "hidden_BTD")


REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch", "offload")


def remat_policy(remat):
  """(wrap, policy) of a `remat` setting: whether each decoder block is rematerialized in the backward pass, and
  what it keeps (`jax.checkpoint_policies`).

  False / "none": nothing recomputed (every activation kept). True / "full": nothing saved, the whole block
  recomputed (`nothing_saveable`). "dots": matmul outputs kept, elementwise work recomputed (`dots_saveable`).
  "dots_no_batch": only matmuls without batch dimensions kept, i.e. the projections, not attention's score and
  value products (`dots_with_no_batch_dims_saveable`). "offload": those kept in host memory instead of the
  device's (`offload_dot_with_no_batch_dims`; a backend with a host memory space: GPU / TPU).
  """
  if remat in (False, None, "none"):
    return False, None
  if remat in (True, "full"):
    return True, jax.checkpoint_policies.nothing_saveable
  if remat == "dots":
    return True, jax.checkpoint_policies.dots_saveable
  if remat == "dots_no_batch":
    return True, jax.checkpoint_policies.dots_with_no_batch_dims_saveable
  if remat == "offload":
    return True, jax.checkpoint_policies.offload_dot_with_no_batch_dims("device", "pinned_host")
  raise ValueError(f"remat must be a bool or one of {REMAT_POLICIES}; got {remat!r}")


def _remat(body, remat):
  wrap, policy = remat_policy(remat)
  return jax.checkpoint(body, policy=policy) if wrap else body


def _default_positions(valid_BT, cache: KVCache | None):
  """RoPE position of each token: the number of valid tokens before it in its row (cache included)."""
  before = jnp.cumsum(valid_BT.astype(jnp.int32), axis=1) - valid_BT.astype(jnp.int32)
  if cache is not None:
    before = before + jnp.sum(cache.valid_BS, axis=1, dtype=jnp.int32)[:, None]
  return before


def forward_hidden(
  params,
  tokens_BT,
  cfg: ModelConfig,
  *,
  positions_BT=None,
  valid_BT=None,
  cache=None,
  cache_index=None,
  attn_window: int | None = None,
  causal_cache: bool = True,
  numerics: Numerics | None = None,
  lora=None,
  remat: bool | str = False,
  unroll: bool = False,
):
  """Runs the decoder up to (and including) the final norm: returns (hidden_BTD in cfg.dtype, cache).

  Same arguments as `forward`; `unroll`: the layer loop (without a cache) as straight-line code instead of a
  `lax.scan` (the same computation, up to the order XLA adds in; `LearnerConfig.unroll_layers` says when it pays).
  """
  numerics = Numerics() if numerics is None else numerics
  tokens_BT = jnp.asarray(tokens_BT)
  if tokens_BT.ndim != 2 or not jnp.issubdtype(tokens_BT.dtype, jnp.integer):
    raise ValueError(f"tokens_BT must be an integer array [B, T]; got {tokens_BT.dtype} {tokens_BT.shape}")
  B, T = tokens_BT.shape
  dt = cfg.compute_dtype
  if valid_BT is None:
    valid_BT = jnp.ones((B, T), bool)
  valid_BT = jnp.asarray(valid_BT).astype(bool)
  if valid_BT.shape != (B, T):
    raise ValueError(f"valid_BT shape {valid_BT.shape} != tokens_BT shape {(B, T)}")
  if cache is not None:
    if cache_index is None:
      raise ValueError("forward with a cache needs cache_index (the slot of the first new token)")
    if cache.valid_BS.shape[0] != B:
      raise ValueError(f"cache batch {cache.valid_BS.shape[0]} != tokens batch {B}")
    if T > cache.max_len:
      raise ValueError(f"{T} tokens do not fit a cache of {cache.max_len} slots")
    if isinstance(cache_index, int) and not 0 <= cache_index <= cache.max_len - T:
      raise ValueError(f"cache_index {cache_index} + {T} tokens overruns a cache of {cache.max_len} slots")
    if jnp.ndim(cache_index) != 0:
      raise ValueError(
        f"cache_index must be an int scalar (one slot for every row); got shape {jnp.shape(cache_index)}"
      )
    if not causal_cache and T != 1:
      raise ValueError(f"causal_cache=False is a one-token decode step; got T = {T}")
    if attn_window is not None and not (isinstance(attn_window, int) and T <= attn_window <= cache.max_len):
      raise ValueError(f"attn_window={attn_window!r} must be an int in [{T}, {cache.max_len}] (the cache's slots)")
  elif attn_window is not None:
    raise ValueError("attn_window needs a cache")
  if positions_BT is None:
    positions_BT = _default_positions(valid_BT, cache)
  positions_BT = jnp.asarray(positions_BT)
  if positions_BT.shape != (B, T):
    raise ValueError(f"positions_BT shape {positions_BT.shape} != tokens_BT shape {(B, T)}")

  params, specs = _hoist_operands(params, _forward_specs(params, numerics), dt)
  lora_params, lora_scale = (None, 0.0) if lora is None else (lora.layer_params(), lora.scale)

  x = jnp.take(params["embed"]["embedding"], tokens_BT, axis=0, mode="clip").astype(dt)
  x = _constrain(x, "hidden_BTD")
  layers = params["layers"]

  if cache is None:
    causal = jnp.tril(jnp.ones((T, T), bool))
    mask_BTS = causal[None] & valid_BT[:, None, :]

    def body(x, xs):
      lp, llp, i = xs
      sp = _layer_specs(specs, i, cfg.num_layers)
      return _layer(cfg, sp, lora_scale, x, lp, llp, positions_BT, lambda k, v: (k, v, mask_BTS)), None

    body = _remat(body, remat)
    x, _ = lax.scan(body, x, (layers, lora_params, jnp.arange(cfg.num_layers, dtype=jnp.int32)), unroll=unroll)
    new_cache = None
  else:
    idx = jnp.asarray(cache_index, jnp.int32)
    valid_BS = lax.dynamic_update_slice(cache.valid_BS, valid_BT, (jnp.int32(0), idx))
    W = cache.max_len if attn_window is None else attn_window  # attend to slots [0, W) only
    mask_BTS = valid_BS[:, None, :W]
    if causal_cache:  # the token at slot j sees the slots <= j
      slot_T = idx + jnp.arange(T, dtype=jnp.int32)
      mask_BTS = mask_BTS & (jnp.arange(W, dtype=jnp.int32)[None, None, :] <= slot_T[None, :, None])
    fp8 = cache.k_scale is not None
    zero = jnp.int32(0)

    def put(c, new, i):  # write the new tokens' entries of layer i at their slots (in place)
      return lax.dynamic_update_slice(c, new.astype(c.dtype)[None], (i, zero, idx) + (zero,) * (c.ndim - 3))

    def body(carry, xs):
      x, kc, vc, ks, vs = carry
      lp, llp, i = xs

      def kv_fn(k, v):
        nonlocal kc, vc, ks, vs
        if fp8:
          kq, k_s = _fp8_encode(k)
          vq, v_s = _fp8_encode(v)
          kc, vc, ks, vs = put(kc, kq, i), put(vc, vq, i), put(ks, k_s, i), put(vs, v_s, i)
          keys = (kc[i, :, :W].astype(jnp.float32) * ks[i, :, :W][..., None]).astype(dt)
          values = (vc[i, :, :W].astype(jnp.float32) * vs[i, :, :W][..., None]).astype(dt)
        else:
          kc, vc = put(kc, k, i), put(vc, v, i)
          keys, values = kc[i, :, :W], vc[i, :, :W]
        return keys, values, mask_BTS

      x = _layer(cfg, _layer_specs(specs, i, L), lora_scale, x, lp, llp, positions_BT, kv_fn)
      return (x, kc, vc, ks, vs), None

    L = cfg.num_layers
    carry = (x, cache.k, cache.v, cache.k_scale, cache.v_scale)
    (x, kc, vc, ks, vs), _ = lax.scan(body, carry, (layers, lora_params, jnp.arange(L, dtype=jnp.int32)))
    new_cache = KVCache(
      k=_constrain(kc, "cache_LBSHD"), v=_constrain(vc, "cache_LBSHD"), valid_BS=valid_BS, k_scale=ks, v_scale=vs
    )

  h = _rms_norm(x, params["final_norm"]["scale"], cfg.rms_norm_eps, dt)
  return h, new_cache


def forward_hidden_grouped(
  params,
  tokens_BT,
  cfg: ModelConfig,
  *,
  group_size: int,
  prompt_len: int,
  positions_BT=None,
  valid_BT=None,
  numerics: Numerics | None = None,
  lora=None,
  remat: bool | str = False,
  unroll: bool = False,
):
  """`forward_hidden` (no cache) of rows whose groups share a prompt, running each prompt once: (hidden_BTD, None).

  Rows r·G … r·G + G − 1 (G = `group_size`) must hold the same tokens, validity and positions in their first P =
  `prompt_len` slots (the sampler's rollouts do: G completions of one prompt). Per layer, the B/G prompts run as
  [B/G, P] rows, then the B completions as [B, T − P] rows that attend to their prompt's keys and values (repeated
  G times) and to their own causally; the prompt part of the result is repeated back to [B, P, D]. Every term of
  every sum is the one `forward_hidden` computes (a prompt token's attention sees only its prompt), so the result
  equals it up to the order XLA adds in; the gradient through the repeat sums the G rows' contributions. The
  matmuls see B/G·P + B·(T − P) rows instead of B·T: for GRPO's G = 8 and a prompt as long as its completions,
  about 1.8x fewer.
  """
  numerics = Numerics() if numerics is None else numerics
  tokens_BT = jnp.asarray(tokens_BT)
  B, T = tokens_BT.shape
  G, P = int(group_size), int(prompt_len)
  if G < 1 or B % G:
    raise ValueError(f"forward_hidden_grouped: group_size={group_size} must divide the batch B={B}")
  if not 0 < P < T:
    raise ValueError(f"forward_hidden_grouped: prompt_len={prompt_len} must be in [1, T) with T={T}")
  dt = cfg.compute_dtype
  valid_BT = jnp.ones((B, T), bool) if valid_BT is None else jnp.asarray(valid_BT).astype(bool)
  if positions_BT is None:
    positions_BT = _default_positions(valid_BT, None)
  positions_BT = jnp.asarray(positions_BT)
  for name, x in (("valid_BT", valid_BT), ("positions_BT", positions_BT)):
    if x.shape != (B, T):
      raise ValueError(f"forward_hidden_grouped: {name} shape {x.shape} != tokens_BT shape {(B, T)}")
  params, specs = _hoist_operands(params, _forward_specs(params, numerics), dt)
  lora_params, lora_scale = (None, 0.0) if lora is None else (lora.layer_params(), lora.scale)

  first = lambda x: x[::G, :P]  # the prompt of each group: its first row's slots [0, P)
  valid_p, valid_c = first(valid_BT), valid_BT[:, P:]
  pos_p, pos_c = first(positions_BT), positions_BT[:, P:]
  N = T - P
  mask_p = jnp.tril(jnp.ones((P, P), bool))[None] & valid_p[:, None, :]
  mask_c = jnp.concatenate(
    [
      jnp.broadcast_to(jnp.repeat(valid_p, G, axis=0)[:, None, :], (B, N, P)),
      jnp.tril(jnp.ones((N, N), bool))[None] & valid_c[:, None, :],
    ],
    axis=-1,
  )
  embed = lambda t: _constrain(jnp.take(params["embed"]["embedding"], t, axis=0, mode="clip").astype(dt), "hidden_BTD")
  x_p, x_c = embed(first(tokens_BT)), embed(tokens_BT[:, P:])

  def body(carry, xs):
    x_p, x_c = carry
    lp, llp, i = xs
    kv_p = {}

    def prompt_kv(k, v):
      kv_p["k"], kv_p["v"] = k, v
      return k, v, mask_p

    def completion_kv(k, v):
      keys = jnp.concatenate([jnp.repeat(kv_p["k"], G, axis=0), k], axis=1)
      values = jnp.concatenate([jnp.repeat(kv_p["v"], G, axis=0), v], axis=1)
      return keys, values, mask_c

    x_p = _layer(cfg, _layer_specs(specs, i, cfg.num_layers, 0), lora_scale, x_p, lp, llp, pos_p, prompt_kv)
    x_c = _layer(cfg, _layer_specs(specs, i, cfg.num_layers, 1), lora_scale, x_c, lp, llp, pos_c, completion_kv)
    return (x_p, x_c), None

  body = _remat(body, remat)
  xs = (params["layers"], lora_params, jnp.arange(cfg.num_layers, dtype=jnp.int32))
  (x_p, x_c), _ = lax.scan(body, (x_p, x_c), xs, unroll=unroll)
  x = jnp.concatenate([jnp.repeat(x_p, G, axis=0), x_c], axis=1)
  return _rms_norm(x, params["final_norm"]["scale"], cfg.rms_norm_eps, dt), None


def logits_from_hidden(params, h_BTD, cfg: ModelConfig):
  """h @ lm_head (or h @ embedding.T when tied) -> float32 logits [.., V] (f32 accumulation)."""
  dt = cfg.compute_dtype
  h = h_BTD.astype(dt)
  if cfg.tie_word_embeddings:
    w = params["embed"]["embedding"]
    return kernels.dense_dot(h, w.astype(dt), 1)
  w = params["lm_head"]["kernel"]
  if isinstance(w, kernels.Predecoded):
    return kernels.predecoded_dot(h, w)
  if isinstance(w, quant.QArray):
    mm = kernels.qlinear if w.axis == -1 else kernels.qmatmul  # [V, D] in the nn.Linear layout, else [D, V]
    return mm(h, w).astype(jnp.float32)
  return kernels.dense_dot(h, w.astype(dt))


def forward(
  params,
  tokens_BT,
  cfg: ModelConfig,
  *,
  positions_BT=None,
  valid_BT=None,
  cache: KVCache | None = None,
  cache_index=None,
  attn_window: int | None = None,
  causal_cache: bool = True,
  numerics: Numerics | None = None,
  lora=None,
  remat: bool | str = False,
):
  """Decoder forward pass.

  Args:
    params: the parameter tree (module docstring); kernels float arrays or QArrays.
    tokens_BT: int [B, T] token ids.
    cfg: the model config (static under jit).
    positions_BT: int [B, T] RoPE positions. Default: the number of valid tokens before each
      token in its row (cache included), so left- and right-padded prompts get 0, 1, 2, ...
    valid_BT: bool [B, T]; False marks padding, which no token attends to. Default all True.
    cache: a `KVCache`. The T new tokens are written at slots [cache_index, cache_index + T)
      (marked valid where valid_BT), and the token at slot j attends to the valid slots ≤ j.
      Without a cache, token t attends to the valid tokens ≤ t of this call.
    cache_index: the slot of the first new token (required with a cache), an int scalar: the same for every row.
    attn_window: attend to the cache's slots [0, attn_window) only (static; every valid slot and every write must
      lie below it): decode over the filled part of a preallocated cache. None: every slot.
    causal_cache: False (a one-token decode step only): the new token attends to every valid slot of the cache,
      wherever it lies, instead of the valid slots <= cache_index. The rollout engine writes all its rows at one
      shared ring column (rows at different lengths, an in-place update), so a row's past lies on both sides of it;
      a slot is excluded by its valid bit alone (a freed row's slots are invalidated when it is reused).
    numerics: a `Numerics` (the learner's QAT rules and warm-up α, the sampler's FP8 activations), or None:
      the matmuls in `cfg.dtype` on the kernels as they are (float, or served QArrays).
    lora: a `models.lora.Lora` (adapters added to the selected layer kernels), or None.
    remat: rematerialize each layer in the backward pass (`jax.checkpoint`): a bool or a policy name
      (`remat_policy`: "none", "full", "dots", "dots_no_batch", "offload").

  Returns:
    (logits_BTV float32 [B, T, V], the updated cache or None).
  """
  h, cache = forward_hidden(
    params,
    tokens_BT,
    cfg,
    positions_BT=positions_BT,
    valid_BT=valid_BT,
    cache=cache,
    cache_index=cache_index,
    attn_window=attn_window,
    causal_cache=causal_cache,
    numerics=numerics,
    lora=lora,
    remat=remat,
  )
  return _constrain(logits_from_hidden(params, h, cfg), "logits_BTV"), cache


@functools.partial(jax.jit, static_argnames=("cfg",))
def logits(params, tokens_BT, cfg: ModelConfig, *, valid_BT=None, positions_BT=None, numerics=None, lora=None):
  """The forward pass as most research code wants it: jitted (`cfg` static), no cache, the logits only.

  `forward(params, tokens_BT, cfg, ...)[0]` compiled once per (cfg, shapes): f32 [B, T, V], position t the
  distribution of token t + 1. Padding (`valid_BT` False) is attended by no token; positions count valid tokens
  (`forward`). For the learner's log π of a rollout's tokens use `learner.logprobs`.
  """
  return forward(params, tokens_BT, cfg, valid_BT=valid_BT, positions_BT=positions_BT, numerics=numerics, lora=lora)[0]
