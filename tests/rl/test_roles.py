"""`rl.roles`' messages in one process: what `encode` / `decode` carry between the learner's and the sampler's
processes, and the unsigned views the collective adds zeros to (the 2-process run: test_multiprocess_train.py)."""

import json

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from lrl_jax.rl import roles
from lrl_jax.rollout import Rollout


def test_a_message_round_trips_with_its_arrays_bit_for_bit():
  rng = np.random.default_rng(0)
  f32 = np.array([-0.0, 0.0, np.nan, np.inf, -np.inf, 1e-45, 3.5], np.float32)  # signed zero, NaN, subnormal
  bf16 = rng.standard_normal((3, 5)).astype(ml_dtypes.bfloat16)
  roll = Rollout(
    tokens=np.arange(12, dtype=np.int32).reshape(2, 6),
    loss_mask=np.array([[0, 0, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]], bool),
    sampler_logp=rng.standard_normal((2, 6)).astype(np.float32),
    rewards=jnp.asarray([1.0, 0.5]),
    group_size=2,
    prompt_len=2,
  )
  msg = {"op": "step", "k": 3, "x": np.float32(0.25), "nested": [{"a": f32}, (bf16, None)], "roll": roll, "s": "ü"}
  header, arrays = roles.encode(msg)
  # the header is JSON (the coordination service carries it) and names each array's shape and dtype
  header = json.loads(json.dumps(header))
  assert header["arrays"][:2] == [[[7], "float32"], [[3, 5], "bfloat16"]]
  # what the collective carries: each array as unsigned integers of its width, back to its dtype on arrival
  bits = [roles._bits(a) for a in arrays]
  assert [b.dtype for b in bits] == [np.dtype(f"u{a.dtype.itemsize}") for a in arrays]
  back = [b.view(a.dtype).reshape(a.shape) for b, a in zip(bits, arrays)]
  got = roles.decode(header, back)
  assert got["op"] == "step" and got["k"] == 3 and got["x"] == 0.25 and got["s"] == "ü"
  assert got["nested"][0]["a"].tobytes() == f32.tobytes()  # -0.0 and NaN's bits too
  assert got["nested"][1][0].dtype == bf16.dtype and got["nested"][1][0].tobytes() == bf16.tobytes()
  assert got["nested"][1][1] is None
  r = got["roll"]
  assert isinstance(r, Rollout) and (r.group_size, r.prompt_len) == (2, 2) and r.valid is None
  for name in ("tokens", "loss_mask", "sampler_logp", "rewards"):
    np.testing.assert_array_equal(np.asarray(getattr(r, name)), np.asarray(getattr(roll, name)))
    assert np.asarray(getattr(r, name)).dtype == np.asarray(getattr(roll, name)).dtype


def test_a_message_refuses_what_it_cannot_carry():
  with pytest.raises(TypeError, match="cannot carry a set"):
    roles.encode({"x": {1, 2}})


def test_the_served_tree_must_match_the_sampler_s():
  like = {"a": np.zeros((2, 3), np.float32), "b": np.zeros(4, np.uint8)}
  part = {"leaves": [np.ones((2, 3), np.float32), np.ones(4, np.uint8)], "bytes": 28}
  got = roles.tree_from_message(part, like)
  assert got["a"].shape == (2, 3) and got["b"].dtype == np.uint8
  with pytest.raises(ValueError, match="do not match the tree this sampler serves"):
    roles.tree_from_message({"leaves": [np.ones((2, 3), np.float32)], "bytes": 24}, like)
