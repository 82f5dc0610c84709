"""`learner.bench.matmul_flops` against a count made a different way: the matmuls read off the parameter tree's
kernel shapes, and the causal query-key pairs counted from explicit masks (a group's prompt once)."""

import jax
import numpy as np
import pytest

from lrl_jax import models
from lrl_jax.learner.bench import matmul_flops, step_matmuls


def _reference(mc, batch, seq, prompt, group, share):
  shapes = jax.eval_shape(lambda: models.init_params(mc, jax.random.PRNGKey(0)))
  per_token = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(shapes["layers"])[0]:
    if path[-1].key == "kernel":  # [L, in, out]: 2 · in · out flops per token per layer
      per_token += 2 * leaf.shape[1] * leaf.shape[2]
  L = shapes["layers"]["attn"]["q_proj"]["kernel"].shape[0]
  causal = np.tril(np.ones((seq, seq), bool))
  rows_p = batch // group if share else batch
  pairs = rows_p * causal[:prompt, :prompt].sum() + batch * causal[prompt:, :].sum()
  tokens = rows_p * prompt + batch * (seq - prompt)
  qdim = shapes["layers"]["attn"]["q_proj"]["kernel"].shape[2]  # heads · head_dim
  v, d = shapes["embed"]["embedding"].shape
  forward = L * (per_token * tokens + 4 * qdim * pairs) + 2 * d * v * batch * (seq - prompt)
  return 3 * forward


@pytest.mark.parametrize("share", [True, False])
def test_matmul_flops_matches_the_parameter_tree_and_the_causal_mask(share):
  mc = models.SMOLLM2_135M.replace(num_layers=3, vocab_size=1000)
  got = matmul_flops(mc, 16, 40, 24, 8, share_prompt=share)
  assert got == _reference(mc, 16, 40, 24, 8, share)  # integer counts: exact
  full = matmul_flops(mc, 16, 40, 24, 8, share_prompt=share, remat="full")
  head = 2 * mc.hidden_size * mc.vocab_size * 16 * 16
  assert full - got == (got / 3 - head)  # full remat: the trunk's forward once more


@pytest.mark.parametrize("share", [True, False])
def test_step_matmuls_count_the_same_products_with_attention_whole(share):
  """`step_matmuls`' products (forward, and the two of each in the backward) hold the flops of `_reference` with the
  attention counted whole instead of causal: every query against every key of its pass."""
  mc = models.SMOLLM2_135M.replace(num_layers=3, vocab_size=1000)
  batch, seq, prompt, group = 16, 40, 24, 8
  got = sum(
    2 * b * m * k * n * c for (b, m, k, n), c in step_matmuls(mc, batch, seq, prompt, group, share_prompt=share).items()
  )
  rows_p = batch // group if share else batch
  causal = np.tril(np.ones((seq, seq), bool))
  half = rows_p * causal[:prompt, :prompt].sum() + batch * causal[prompt:, :].sum()
  whole = rows_p * prompt * prompt + batch * (seq - prompt) * seq
  qdim = mc.num_heads * mc.head_dim
  assert got == _reference(mc, batch, seq, prompt, group, share) + 3 * 3 * 4 * qdim * (whole - half)
