"""lrl_jax.models (in progress)."""
