"""NumPy references for the control tests (written from the formulas, not from the library)."""

import ml_dtypes
import numpy as np


def int4_fake_quant_np(w, group_size):
  """ŵ of symmetric group-wise INT4 along K (axis 0) of w [K, N] (DESIGN.md contract), float64.

  s = max(amax / 7, 1e-5) in f32, rounded to bf16 (nearest even); q = clip(round_half_even(w / s), -7, 7).
  """
  w = np.asarray(w, np.float32)
  k, n = w.shape
  wg = w.reshape(k // group_size, group_size, n)
  amax = np.abs(wg).max(axis=1, keepdims=True)
  s = np.maximum(amax / np.float32(7), np.float32(1e-5)).astype(np.float32)
  s = s.astype(ml_dtypes.bfloat16).astype(np.float32)
  q = np.clip(np.round(wg / s), -7, 7)  # np.round is half-to-even; f32 division as the contract
  return (q.astype(np.float64) * s.astype(np.float64)).reshape(k, n)


def mlp_np(params, x, *, group_size=None, activation="tanh"):
  """float64 forward of {"dense_i": {"kernel", "bias"}}; kernels fake-quantized when group_size is set."""
  act = np.tanh if activation == "tanh" else (lambda h: np.maximum(h, 0.0))
  names = sorted(params, key=lambda s: int(s.split("_")[-1]))
  h = np.asarray(x, np.float64)
  for i, name in enumerate(names):
    w = np.asarray(params[name]["kernel"], np.float32)
    w = int4_fake_quant_np(w, group_size) if group_size else w.astype(np.float64)
    h = h @ w + np.asarray(params[name]["bias"], np.float64)
    if i < len(names) - 1:
      h = act(h)
  return h


def dequant_mlp_np(served, x, *, activation="tanh"):
  """float64 forward of a served tree whose kernels are given as dequantized float arrays."""
  return mlp_np(served, x, group_size=None, activation=activation)
