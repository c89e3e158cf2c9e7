"""Workers: processes that take groups from the run directory, meshes and jax.distributed, the
compilation cache."""
