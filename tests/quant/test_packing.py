"""Byte layouts: nibble packing (element 2i low), compressed-tensors int32 packing, E2M1 bit patterns."""

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lrl_jax import quant
from lrl_jax.quant import packing
from tests.quant import reference as ref


def test_nibble_layout_low_first():
  codes = jnp.array([[0x1, 0x2, 0x3, 0x4, 0xE, 0xF]], jnp.uint8)
  np.testing.assert_array_equal(np.asarray(packing.pack_nibbles(codes)), [[0x21, 0x43, 0xFE]])
  # Along axis 0 the pairs are rows 2i, 2i+1.
  np.testing.assert_array_equal(np.asarray(packing.pack_nibbles(codes.T, axis=0)), [[0x21], [0x43], [0xFE]])


@settings(max_examples=25, deadline=None)
@given(hnp.arrays(np.uint8, (4, 6), elements=st.integers(0, 15)), st.sampled_from([0, 1]))
def test_nibble_round_trip(codes, axis):
  packed = _pack(jnp.asarray(codes), axis=axis)
  assert packed.shape[axis] == codes.shape[axis] // 2
  np.testing.assert_array_equal(np.asarray(_unpack(packed, axis=axis)), codes)


_pack = jax.jit(packing.pack_nibbles, static_argnames=("axis",))
_unpack = jax.jit(packing.unpack_nibbles, static_argnames=("axis",))


def test_nibbles_match_bitcast_to_uint4():
  packed = jnp.arange(256, dtype=jnp.uint8)
  via_bitcast = np.asarray(__import__("jax").lax.bitcast_convert_type(packed, jnp.uint4).astype(jnp.uint8)).reshape(-1)
  np.testing.assert_array_equal(np.asarray(packing.unpack_nibbles(packed)), via_bitcast)


def test_compressed_tensors_int32_layout():
  # code i at bits 4i, +8 offset: [-8, -7, ..., -1] -> nibbles 0..7 -> 0x76543210
  q = np.arange(-8, 8, dtype=np.int8).reshape(1, 16)
  packed = packing.pack_int4_compressed_tensors(q)
  expected = [sum(int(q[0, 8 * w + i] + 8) << (4 * i) for i in range(8)) for w in range(2)]
  np.testing.assert_array_equal(packed.view(np.uint32)[0], np.array(expected, np.uint64).astype(np.uint32))
  assert packed.dtype == np.int32 and packed.shape == (1, 2)
  assert packed.view(np.uint32)[0, 0] == 0x76543210


@settings(max_examples=25, deadline=None)
@given(
  hnp.arrays(np.int8, st.tuples(st.integers(1, 3), st.integers(1, 4).map(lambda n: 8 * n)), elements=st.integers(-8, 7))
)
def test_compressed_tensors_round_trip(q):
  np.testing.assert_array_equal(packing.unpack_int4_compressed_tensors(packing.pack_int4_compressed_tensors(q)), q)
  qt = q.T.copy()
  back = packing.unpack_int4_compressed_tensors(packing.pack_int4_compressed_tensors(qt, axis=0), axis=0)
  np.testing.assert_array_equal(back, qt)


def test_compressed_tensors_bad_input():
  with pytest.raises(ValueError, match="multiple of 8"):
    packing.pack_int4_compressed_tensors(np.zeros((2, 12), np.int8))
  with pytest.raises(ValueError, match=r"\[-8, 7\]"):
    packing.pack_int4_compressed_tensors(np.full((1, 8), 9, np.int8))
  with pytest.raises(ValueError, match="int32"):
    packing.unpack_int4_compressed_tensors(np.zeros((1, 1), np.int64))


def test_int4_qarray_codes_are_offset_nibbles():
  # w = [7s, -7s, 3s, 0, ...] with s exact: codes q+8 = [15, 1, 11, 8], packed pairwise low-first.
  s = 0.5
  w = np.zeros((32, 1), np.float32)
  w[:4, 0] = [7 * s, -7 * s, 3 * s, 0]
  q = quant.quantize(jnp.asarray(w), quant.Int4(group_size=32), axis=0)
  assert q.codes.shape == (16, 1) and q.codes.dtype == jnp.uint8
  np.testing.assert_array_equal(np.asarray(q.codes)[:2, 0], [15 | (1 << 4), 11 | (8 << 4)])
  assert float(q.scale[0, 0]) == s


def test_nvfp4_codes_are_e2m1_bit_patterns():
  # One block with amax 6: enc = 2688/6 = 448, s_b = 448, so x / (s_b·dec) lands on the E2M1 grid.
  vals = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.5, -1, -1.5, -2, -3, -4, -6, 0], np.float32)
  x = vals.reshape(16, 1)
  q = quant.quantize(jnp.asarray(x), quant.NVFP4(), axis=0)
  nib = np.asarray(packing.unpack_nibbles(q.codes, axis=0))[:, 0]
  np.testing.assert_array_equal(nib, ref.e2m1_nibble(vals))
  np.testing.assert_array_equal(nib[:8], np.arange(8))  # 0, 0.5, ..., 6 -> 0b0000..0b0111
  assert nib[8] == 0b1001  # -0.5: sign bit 3
  np.testing.assert_array_equal(np.asarray(quant.dequantize(q)), ref.nvfp4(x, axis=0)[3])
  np.testing.assert_allclose(np.asarray(quant.dequantize(q))[:, 0], vals, rtol=1e-6)  # s_b·dec = 448·(1/448)
