"""Byte layouts of 4-bit codes.

In memory (QArray.codes) two 4-bit codes share a byte along the quantized axis:
element 2i in the low nibble, element 2i+1 in the high nibble. This is the NVFP4
layout of compressed-tensors / ModelOpt, and what `lax.bitcast_convert_type(uint8 -> uint4)`
unpacks to (low nibble first).

For export, compressed-tensors `pack-quantized` INT4 stores eight codes per int32
along the input dimension: code i at bits 4i..4i+3, each code offset by +8 so that
[-8, 7] maps to [0, 15].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = [
  "pack_nibbles",
  "unpack_nibbles",
  "pack_int4_compressed_tensors",
  "unpack_int4_compressed_tensors",
]


def _check_even(x, axis: int, what: str):
  if x.ndim == 0 or x.shape[axis] % 2:
    raise ValueError(f"{what}: axis {axis} of shape {tuple(x.shape)} must have even length")


def pack_nibbles(codes: jax.Array, axis: int = -1) -> jax.Array:
  """[.., 2n, ..] uint8 codes in [0, 15] -> [.., n, ..] uint8; element 2i in the low nibble."""
  _check_even(codes, axis, "pack_nibbles")
  ax = axis % codes.ndim
  pairs = codes.astype(jnp.uint8).reshape(codes.shape[:ax] + (codes.shape[ax] // 2, 2) + codes.shape[ax + 1 :])
  lo = lax.index_in_dim(pairs, 0, ax + 1, keepdims=False)
  hi = lax.index_in_dim(pairs, 1, ax + 1, keepdims=False)
  return ((lo & 0xF) | ((hi & 0xF) << 4)).astype(jnp.uint8)


def unpack_nibbles(packed: jax.Array, axis: int = -1) -> jax.Array:
  """[.., n, ..] uint8 -> [.., 2n, ..] uint8 codes in [0, 15] (inverse of `pack_nibbles`)."""
  ax = axis % packed.ndim
  codes = jnp.stack([packed & 0xF, packed >> 4], axis=ax + 1)
  return codes.reshape(packed.shape[:ax] + (2 * packed.shape[ax],) + packed.shape[ax + 1 :])


def pack_int4_compressed_tensors(q: np.ndarray | jax.Array, axis: int = -1) -> np.ndarray:
  """Signed INT4 codes [.., 8n, ..] (values in [-8, 7]) -> int32 [.., n, ..], compressed-tensors layout.

  Runs on the host (NumPy): this is an export format, not a compute format.
  """
  q = np.asarray(q)
  if q.ndim == 0 or q.shape[axis] % 8:
    raise ValueError(f"pack_int4_compressed_tensors: axis {axis} of shape {q.shape} must be a multiple of 8")
  if q.size and (q.min() < -8 or q.max() > 7):
    raise ValueError(f"pack_int4_compressed_tensors: codes must lie in [-8, 7], got [{q.min()}, {q.max()}]")
  u = np.moveaxis(q.astype(np.int64) + 8, axis, -1).astype(np.uint32)
  u = u.reshape(*u.shape[:-1], u.shape[-1] // 8, 8)
  shifts = 4 * np.arange(8, dtype=np.uint32)
  packed = np.bitwise_or.reduce(u << shifts, axis=-1).astype(np.uint32)
  return np.moveaxis(packed.view(np.int32), -1, axis)


def unpack_int4_compressed_tensors(packed: np.ndarray | jax.Array, axis: int = -1) -> np.ndarray:
  """int32 [.., n, ..] -> signed INT4 codes int8 [.., 8n, ..] (inverse of the above)."""
  packed = np.asarray(packed)
  if packed.dtype != np.int32:
    raise ValueError(f"unpack_int4_compressed_tensors: expected int32, got {packed.dtype}")
  u = np.moveaxis(packed, axis, -1).view(np.uint32)
  shifts = 4 * np.arange(8, dtype=np.uint32)
  codes = ((u[..., None] >> shifts) & 0xF).astype(np.int8) - 8
  codes = codes.reshape(*u.shape[:-1], u.shape[-1] * 8)
  return np.moveaxis(codes, -1, axis)
