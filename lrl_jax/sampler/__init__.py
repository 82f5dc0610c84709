"""lrl_jax.sampler (in progress)."""
