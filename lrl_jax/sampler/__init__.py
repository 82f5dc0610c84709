"""lrl_jax.sampler — KV-cache generation on real low-bit weights, returning its own log-probs (mu).

`serve_params(params, rules_or_spec)` builds the served tree (the RL weight sync);
`generate(served, prompts_BP, prompt_valid_BP, cfg, sampling, key, group_size=G)` returns a `Rollout`
(`lrl_jax.rollout`: the one pytree of a batch of completions from the sampler to the learner);
`shard_params(served, mesh)` places it on the sampler's own mesh.

From a loaded model the defaults follow from it: `served = serve_params(model, quant.Int4())` (a `LoadedModel`
computing in the loader's compute_dtype), `generate(served, [ids, ...])` (padded on the left, greedy, stops at the
tokenizer's EOS, KV cache in the compute dtype). `pad_prompts` pads token lists into (prompts, valid).
"""

from lrl_jax.rollout import Rollout, pad_prompts, predictor_index
from lrl_jax.sampler.generate import generate, row_keys
from lrl_jax.sampler.sampling import SamplingConfig, sample_tokens, sampling_logprobs
from lrl_jax.sampler.serve import as_rules, serve_params
from lrl_jax.sampler.sharding import SAMPLER_RULES, param_shardings, partition_spec, shard_batch, shard_params

__all__ = [
  "Rollout",
  "generate",
  "pad_prompts",
  "predictor_index",
  "row_keys",
  "SamplingConfig",
  "sample_tokens",
  "sampling_logprobs",
  "as_rules",
  "serve_params",
  "SAMPLER_RULES",
  "param_shardings",
  "partition_spec",
  "shard_batch",
  "shard_params",
]
