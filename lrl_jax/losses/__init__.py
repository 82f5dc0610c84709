"""lrl_jax.losses (in progress)."""
