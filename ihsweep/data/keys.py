"""Which PRNG key draws which batch: the one rule every data path shares."""

import jax
import jax.numpy as jnp


def step_keys(data_key: jax.Array, first_step, n_steps: int) -> jax.Array:
  """Keys of updates ``first_step … first_step + n_steps − 1`` of one model, uint32
  ``[n_steps, 2]``: update t uses ``fold_in(data_key, t)``, so a resumed run, a different
  ``steps_per_call`` and the host loader all draw the same batches."""
  steps_K = first_step + jnp.arange(n_steps, dtype=jnp.int32)
  return jax.vmap(lambda t: jax.random.fold_in(data_key, t))(steps_K)
