"""Tests of lrl_jax.losses."""
